// CPU entry point of the Joseph geometry gradient: the per-ray functions of
// joseph_grad.cuh in an OpenMP loop.  Built at first use by
// ctbench/engine/cpu/library.py and called through ctypes.
//
// Threads take (view, detector row) blocks as the forward projector does.
#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu_helpers.hpp"
#include "joseph_grad.cuh"
#include "joseph_grad_lanes_cpu.hpp"

namespace {

using ct::i64;

// The pixels inner0 .. inner0 + cnt - 1 of one row (float32 lanes): the same
// per-ray steps as ct::ray_geometry_vjp, with the rays' sums gathered in lanes.
// Memory order as the forward: x-dominant rays read the swapped copy, so that
// every ray's b axis is contiguous.
template <typename real>
void geometry_vjp_lanes(const real* vol, i64 vol_batch_stride, int batch, const ct::VolumeWindow<real>& vw,
                        const real* src, const real* ctr, const real* ustep, const real* vstep, int cone,
                        const ct::DetectorWindow& dw, const real* grad, i64 grad_batch_stride, const real* vol_xy,
                        i64 slab, int k, int outer, int inner0, int cnt, bool u_inner, double* acc) {
  constexpr int L = 16;
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  int ius[L], ivs[L];
  i64 gi[L];
  unsigned want = 0;  // pixels with a nonzero cotangent in some batch item
  for (int g = 0; g < cnt; ++g) {
    const int inner = inner0 + g;
    const int ju = u_inner ? inner : outer, jv = u_inner ? outer : inner;
    ius[g] = dw.u0 + ju;
    ivs[g] = dw.v0 + jv;
    gi[g] = ((i64)k * nu + ju) * nv + jv;
    bool any = false;
    for (int q = 0; q < batch; ++q) any |= grad[gi[g] + q * grad_batch_stride] != real(0);
    if (any) want |= 1u << g;
  }
  if (!want) return;
  ct::Ray<real> r[L];
  bool hit[L];
  const unsigned ready =
      ct::fwd::setup_lanes(vw, src, ctr, ustep, vstep, cone, k, ius, ivs, dw.U, dw.V, cnt, vw.z0, vw.z1, r, hit);
  double o[L][3], d[L][3], fo_a[L];
  const real* base[L];
  i64 bstride[L];
  unsigned laneable = 0, live = 0;
  for (int g = 0; g < cnt; ++g) {
    if (!((want >> g) & 1u)) continue;
    ct::pixel_ray(src, ctr, ustep, vstep, cone, k, ius[g], ivs[g], dw.U, dw.V, o[g], d[g]);
    if (!((ready >> g) & 1u)) {
      r[g] = ct::Ray<real>{};
      hit[g] = ct::make_ray(vw, o[g], d[g], vw.z0, vw.z1, r[g]);
    }
    if (!hit[g]) continue;
    live |= 1u << g;
    fo_a[g] = ct::origin_voxel_coord(vw, r[g].a, o[g]);
    base[g] = vol;
    bstride[g] = vol_batch_stride;
    if (vol_xy != nullptr && r[g].a == 0) {
      ct::ray_use_strides(r[g], (i64)vw.H, (i64)1, (i64)vw.H * vw.W);
      base[g] = vol_xy;
      bstride[g] = slab;
    }
    if (!r[g].planar && r[g].sb == 1) laneable |= 1u << g;
  }
  ct::RaySums<real> sums[L];
  for (int g = 0; g < cnt; ++g) sums[g] = ct::RaySums<real>{real(0), real(0), real(0), real(0), real(0)};
  for (int q = 0; q < batch; ++q) {
    real y[L];
    unsigned nz = 0;  // live rays with a nonzero cotangent in item q
    for (int g = 0; g < cnt; ++g) {
      y[g] = ((live >> g) & 1u) ? grad[gi[g] + q * grad_batch_stride] : real(0);
      if (y[g] != real(0)) nz |= 1u << g;
    }
    unsigned left = laneable & nz;
    while (left) {
      const int lead = __builtin_ctz(left);
      unsigned part = 0;
      for (int g = lead; g < cnt; ++g)
        if (((left >> g) & 1u) && base[g] == base[lead] && ct::fwd::lane_compatible(r[g], r[lead])) part |= 1u << g;
      ct::gradl::group_sums(base[lead] + q * bstride[lead], r, cnt, part, fo_a, y, sums);
      left &= ~part;
    }
    for (int g = 0; g < cnt; ++g)
      if (((nz >> g) & 1u) && !((laneable >> g) & 1u))
        ct::ray_stencil_sums(base[g] + q * bstride[g], r[g], fo_a[g], y[g], sums[g]);
  }
  for (int g = 0; g < cnt; ++g) {
    if (!((live >> g) & 1u)) continue;
    real go[3], gd[3];
    ct::ray_world_grad(vw, r[g], o[g], d[g], sums[g], go, gd);
    ct::pixel_geometry_grad<real, double>(cone, ius[g], ivs[g], dw.U, dw.V, go, gd, acc);
  }
}

template <typename real>
void geometry_vjp(const real* vol, i64 vol_batch_stride, int batch, ct::VolumeWindow<real> vw, const real* src,
                  const real* ctr, const real* ustep, const real* vstep, int cone, ct::DetectorWindow dw,
                  const real* grad, double* out, int nthreads) {
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  std::fill(out, out + (i64)dw.n_views * ct::GEO_N, 0.0);
  if (nu <= 0 || nv <= 0 || dw.n_views <= 0 || vw.z1 <= vw.z0) return;
  const i64 grad_batch_stride = (i64)dw.n_views * nu * nv;
  // Same memory-order choices as the forward projector (cpu_helpers.hpp):
  // the inner pixel loop walks the detector axis that moves least along z,
  // and y-dominant rays read a copy of the slab with x and y swapped.
  const bool u_inner = ct::inner_is_u(ustep, vstep, dw.n_views);
  const int n_outer = u_inner ? nv : nu, n_inner = u_inner ? nu : nv;
  const i64 rows = (i64)dw.n_views * n_outer;
  const int nz = vw.z1 - vw.z0;
  const i64 slab = (i64)nz * vw.H * vw.W;
  // float32 with AVX-512/AVX2: groups of kGradLanes rays in vector lanes
  // (joseph_grad_lanes_cpu.hpp, 32-bit plane offsets: slabs below 2^31
  // elements); otherwise one scalar ray_geometry_vjp per pixel.
  constexpr bool lanes = std::is_same<real, float>::value && ct::gradl::kGradLanes > 0;
  const bool use_lanes = lanes && slab < (i64(1) << 31) - 1;
  std::vector<real> swapped;
  if (vw.H > 1 && vw.W > 1 && rows * n_inner >= slab / 4) {
    swapped.resize((size_t)(slab * batch));
    ct::swap_xy(vol, swapped.data(), slab, batch, nz, vw.H, vw.W, nthreads);
  }
  const real* vol_xy = swapped.empty() ? nullptr : swapped.data();
  // One partial sum per pixel row (12 doubles), reduced per view in row
  // order afterwards: no atomics, and the result does not depend on the
  // thread count or schedule.
  std::vector<double> row_sums((size_t)rows * ct::GEO_N);
#pragma omp parallel num_threads(nthreads)
  {
#pragma omp for schedule(dynamic, 4)
    for (i64 row = 0; row < rows; ++row) {
      const int k = (int)(row / n_outer);
      const int outer = (int)(row % n_outer);
      double acc[ct::GEO_N] = {0};
      if constexpr (lanes) {
        if (use_lanes) {
          for (int inner0 = 0; inner0 < n_inner; inner0 += ct::gradl::kGradLanes) {
            const int cnt = std::min(ct::gradl::kGradLanes, n_inner - inner0);
            geometry_vjp_lanes(vol, vol_batch_stride, batch, vw, src, ctr, ustep, vstep, cone, dw, grad,
                               grad_batch_stride, vol_xy, slab, k, outer, inner0, cnt, u_inner, acc);
          }
          std::copy(acc, acc + ct::GEO_N, row_sums.data() + (size_t)row * ct::GEO_N);
          continue;
        }
      }
      for (int inner = 0; inner < n_inner; ++inner) {
        const int ju = u_inner ? inner : outer, jv = u_inner ? outer : inner;
        const i64 gi = ((i64)k * nu + ju) * nv + jv;
        ct::ray_geometry_vjp<real, double>(vol, vol_batch_stride, batch, vw, src, ctr, ustep, vstep, cone, k,
                                           dw.u0 + ju, dw.v0 + jv, dw.U, dw.V, grad + gi, grad_batch_stride, acc,
                                           vol_xy, slab);
      }
      std::copy(acc, acc + ct::GEO_N, row_sums.data() + (size_t)row * ct::GEO_N);
    }
#pragma omp for schedule(static)
    for (int k = 0; k < dw.n_views; ++k) {
      double* dst = out + (i64)k * ct::GEO_N;
      for (int r = 0; r < n_outer; ++r) {
        const double* src_row = row_sums.data() + ((size_t)k * n_outer + r) * ct::GEO_N;
        for (int q = 0; q < ct::GEO_N; ++q) dst[q] += src_row[q];
      }
    }
  }
}

}  // namespace

#define CT_EXPORT extern "C" __attribute__((visibility("default")))

// out: (n_views, 12) doubles = d/d(source, centre, ustep, vstep) per view.
#define CT_JOSEPH_GRAD_ENTRIES(real, suffix)                                                                      \
  CT_EXPORT void joseph_geometry_vjp_##suffix(const real* vol, i64 vol_batch_stride, int batch, int D, int H,      \
                                              int W, int z0, int z1, double dx, double dy, double dz,             \
                                              const real* src, const real* ctr, const real* ustep,                \
                                              const real* vstep, int cone, int n_views, int U, int V, int u0,     \
                                              int u1, int v0, int v1, const real* grad, double* out,              \
                                              int nthreads) {                                                     \
    ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};                                    \
    ct::DetectorWindow dw{n_views, U, V, u0, u1, v0, v1};                                                        \
    geometry_vjp<real>(vol, vol_batch_stride, batch, vw, src, ctr, ustep, vstep, cone, dw, grad, out, nthreads);  \
  }

CT_JOSEPH_GRAD_ENTRIES(float, f32)
CT_JOSEPH_GRAD_ENTRIES(double, f64)
