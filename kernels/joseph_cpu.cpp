// CPU entry points of the Joseph family: the per-ray functions of joseph.cuh
// in OpenMP loops.  Built at first use by ctbench/engine/cpu_build.py and
// called through ctypes (which releases the GIL).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_helpers.hpp"
#include "joseph.cuh"

namespace {

using ct::i64;

// Forward: threads take (view, detector row) blocks; the inner loop walks
// neighbouring pixels of a row so consecutive rays share cache lines.
// Rays advancing along y would step W elements per plane; they read a copy
// of the slab with x and y swapped, so every x- or y-dominant ray walks
// memory contiguously (measured 2x faster on such rays).
template <typename real>
void forward(const real* vol, i64 vol_batch_stride, int batch, ct::VolumeWindow<real> vw, const real* src,
             const real* ctr, const real* ustep, const real* vstep, int cone, ct::DetectorWindow dw, real* out,
             int accumulate, int nthreads) {
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  const i64 out_batch_stride = (i64)dw.n_views * nu * nv;
  const i64 rows = (i64)dw.n_views * nu;  // pixel rows, for the copy heuristic
  const int nz = vw.z1 - vw.z0;
  const i64 slab = (i64)nz * vw.H * vw.W;
  std::vector<real> swapped;
  // Worth it when there are more rays than voxels to copy.
  if (slab > 0 && vw.H > 1 && vw.W > 1 && rows * nv >= slab / 4) {
    swapped.resize((size_t)(slab * batch));
    ct::swap_xy(vol, swapped.data(), slab, batch, nz, vw.H, vw.W, nthreads);
  }
  // Rows of pixels: (view, u) with v inner, or (view, v) with u inner.
  const bool u_inner = ct::inner_is_u(ustep, vstep, dw.n_views);
  const int n_outer = u_inner ? nv : nu, n_inner = u_inner ? nu : nv;
  const i64 nrows = (i64)dw.n_views * n_outer;
#pragma omp parallel for schedule(dynamic, 4) num_threads(nthreads)
  for (i64 row = 0; row < nrows; ++row) {
    const int k = (int)(row / n_outer);
    const int outer = (int)(row % n_outer);
    for (int inner = 0; inner < n_inner; ++inner) {
      const int ju = u_inner ? inner : outer, jv = u_inner ? outer : inner;  // tile-local pixel
      const int iu = dw.u0 + ju, iv = dw.v0 + jv;
      double o[3], d[3];
      ct::pixel_ray(src, ctr, ustep, vstep, cone, k, iu, iv, dw.U, dw.V, o, d);
      ct::Ray<real> r{};
      const bool hit = ct::make_ray(vw, o, d, vw.z0, vw.z1, r);
      const real* base = vol;
      i64 bstride = vol_batch_stride;
      if (hit && r.a == 1 && !swapped.empty()) {
        ct::ray_use_strides(r, (i64)vw.H, (i64)1, (i64)vw.H * vw.W);
        base = swapped.data();
        bstride = slab;
      }
      const i64 oi = ((i64)k * nu + ju) * nv + jv;
      for (int q = 0; q < batch; ++q) {
        const real val = hit ? ct::ray_forward(base + q * bstride, r) : real(0);
        real& dst = out[q * out_batch_stride + oi];
        dst = accumulate ? dst + val : val;
      }
    }
  }
}

// Backproject pixel (iu, iv) of view k into the z-range [zlo, zhi) of `out`
// (batch items `out_stride` apart); pixels that are zero in every item are skipped.
template <typename real>
inline void scatter_pixel(const real* sino, int batch, const ct::VolumeWindow<real>& vw, const real* src,
                          const real* ctr, const real* ustep, const real* vstep, int cone,
                          const ct::DetectorWindow& dw, int k, int iu, int iv, int zlo, int zhi, real* out,
                          i64 out_stride) {
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  const i64 sino_batch_stride = (i64)dw.n_views * nu * nv;
  const i64 si = ((i64)k * nu + (iu - dw.u0)) * nv + (iv - dw.v0);
  bool any = false;
  for (int q = 0; q < batch; ++q) any |= sino[q * sino_batch_stride + si] != real(0);
  if (!any) return;
  double o[3], d[3];
  ct::pixel_ray(src, ctr, ustep, vstep, cone, k, iu, iv, dw.U, dw.V, o, d);
  ct::Ray<real> r{};
  if (!ct::make_ray(vw, o, d, zlo, zhi, r)) return;
  for (int q = 0; q < batch; ++q) ct::ray_backward<real, false>(out + q * out_stride, r, sino[q * sino_batch_stride + si]);
}

// Backward without atomics: each thread owns a z-chunk of the output slab and,
// per view, visits only the detector pixels whose rays cross that chunk.
template <typename real>
void backward(const real* sino, int batch, ct::VolumeWindow<real> vw, const real* src, const real* ctr,
              const real* ustep, const real* vstep, int cone, ct::DetectorWindow dw, real* vol,
              i64 vol_batch_stride, int nthreads) {
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  const int nz = vw.z1 - vw.z0;
  if (nz <= 0 || nu <= 0 || nv <= 0) return;
  const i64 slab = (i64)nz * vw.H * vw.W;
  const bool u_inner = ct::inner_is_u(ustep, vstep, dw.n_views);
  // A thin slab (2D scans) cannot feed every thread with z-chunks: then threads
  // take views instead and each accumulates into a private copy of the slab,
  // summed at the end (still no atomics).
  const bool thin = nz < 2 * nthreads && nthreads > 1 &&
                    (double)slab * batch * nthreads * sizeof(real) < 512.0 * (1 << 20);
  if (thin) {
    std::vector<std::vector<real>> priv(nthreads);
#pragma omp parallel num_threads(nthreads)
    {
      const int tid = omp_get_thread_num();
      std::vector<real>& acc = priv[tid];
      acc.assign((size_t)(slab * batch), real(0));
      // static: a fixed view -> thread map keeps the summation order, so repeated
      // and batched calls agree bitwise (gradcheck reentrancy, batch == per item).
#pragma omp for schedule(static, 1)
      for (int k = 0; k < dw.n_views; ++k) {
        for (int iu = dw.u0; iu < dw.u1; ++iu) {
          for (int iv = dw.v0; iv < dw.v1; ++iv) {
            scatter_pixel(sino, batch, vw, src, ctr, ustep, vstep, cone, dw, k, iu, iv, vw.z0, vw.z1, acc.data(),
                          slab);
          }
        }
      }
      // implicit barrier of omp for; then reduce the private slabs
#pragma omp for schedule(static)
      for (i64 i = 0; i < slab * batch; ++i) {
        real sum = real(0);
        for (int t = 0; t < nthreads; ++t)
          if (!priv[t].empty()) sum += priv[t][i];
        const i64 q = i / slab;
        vol[q * vol_batch_stride + (i % slab)] += sum;
      }
    }
    return;
  }
  // Enough chunks for dynamic balance, few enough that rays rarely span many.
  const int target = std::max(1, 4 * nthreads);
  const int cz = std::max(1, (nz + target - 1) / target);
  const int nchunks = (nz + cz - 1) / cz;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int ch = 0; ch < nchunks; ++ch) {
    const int zlo = vw.z0 + ch * cz, zhi = std::min(vw.z1, zlo + cz);
    for (int k = 0; k < dw.n_views; ++k) {
      int ulo, uhi, vlo, vhi;
      ct::slab_pixel_bounds(vw, src, ctr, ustep, vstep, cone, k, zlo, zhi, dw.U, dw.V, ulo, uhi, vlo, vhi);
      ulo = std::max(ulo, dw.u0); uhi = std::min(uhi, dw.u1);
      vlo = std::max(vlo, dw.v0); vhi = std::min(vhi, dw.v1);
      const int n_outer = u_inner ? vhi - vlo : uhi - ulo, n_inner = u_inner ? uhi - ulo : vhi - vlo;
      for (int outer = 0; outer < n_outer; ++outer) {
        for (int inner = 0; inner < n_inner; ++inner) {
          const int iu = ulo + (u_inner ? inner : outer), iv = vlo + (u_inner ? outer : inner);
          scatter_pixel(sino, batch, vw, src, ctr, ustep, vstep, cone, dw, k, iu, iv, zlo, zhi, vol,
                        vol_batch_stride);
        }
      }
    }
  }
}

}  // namespace

#define CT_EXPORT extern "C" __attribute__((visibility("default")))

#define CT_JOSEPH_ENTRIES(real, suffix)                                                                          \
  CT_EXPORT void joseph_forward_##suffix(const real* vol, i64 vol_batch_stride, int batch, int D, int H, int W,   \
                                         int z0, int z1, double dx, double dy, double dz, const real* src,        \
                                         const real* ctr, const real* ustep, const real* vstep, int cone,          \
                                         int n_views, int U, int V, int u0, int u1, int v0, int v1, real* out,     \
                                         int accumulate, int nthreads) {                                          \
    ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};                                    \
    ct::DetectorWindow dw{n_views, U, V, u0, u1, v0, v1};                                                        \
    forward<real>(vol, vol_batch_stride, batch, vw, src, ctr, ustep, vstep, cone, dw, out, accumulate, nthreads); \
  }                                                                                                              \
  CT_EXPORT void joseph_backward_##suffix(const real* sino, int batch, int D, int H, int W, int z0, int z1,       \
                                          double dx, double dy, double dz, const real* src, const real* ctr,      \
                                          const real* ustep, const real* vstep, int cone, int n_views, int U,     \
                                          int V, int u0, int u1, int v0, int v1, real* vol,                       \
                                          i64 vol_batch_stride, int nthreads) {                                   \
    ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};                                    \
    ct::DetectorWindow dw{n_views, U, V, u0, u1, v0, v1};                                                        \
    backward<real>(sino, batch, vw, src, ctr, ustep, vstep, cone, dw, vol, vol_batch_stride, nthreads);           \
  }

CT_JOSEPH_ENTRIES(float, f32)
CT_JOSEPH_ENTRIES(double, f64)
