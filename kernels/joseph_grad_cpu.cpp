// CPU entry point of the Joseph geometry gradient: the per-ray functions of
// joseph_grad.cuh in an OpenMP loop.  Built at first use by
// ctbench/engine/cpu_build.py and called through ctypes.
//
// Threads take (view, detector row) blocks as the forward projector does.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "cpu_helpers.hpp"
#include "joseph_grad.cuh"

namespace {

using ct::i64;

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
