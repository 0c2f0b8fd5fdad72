// CPU entry points of the FDK family: the voxel-driven weighted backprojection
// of fdk.cuh in OpenMP loops.  Built at first use by ctbench/engine/cpu/library.py
// and called through ctypes (which releases the GIL).
//
// Two paths, equal within round-off (tests force each, CTBENCH_CPU_PATH=fdk=NAME):
// - rows: threads own voxel rows (z, y) of the output slab, so no atomics are
//   needed.  A thread accumulates one row over the views in a small buffer
//   that stays in L1, then adds it to the output once; along the row the three
//   projective numerators advance by a constant step per voxel (compiler
//   vectorised, with gathers).
// - columns: threads own tiles of voxel columns (z-chunk, y, x-tile); per
//   (view, column) the u interpolation is done once and the z loop runs in
//   SIMD lanes (fdk_columns_cpu.hpp); "columns-scalar" is the same with a
//   scalar z loop (the portable fallback of builds without lanes).
// Both serve flat and cylindrical detectors (cone == 2, fdk.cuh): only the
// voxel -> pixel map and the distance weight differ.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "fdk.cuh"
#include "fdk_columns_cpu.hpp"

namespace {

using ct::i64;


// Path codes of fdk_backproject_path_*: ctbench/engine/fdk_kernels.py FDK_PATHS.
enum FdkPath { kPathAuto = 0, kPathRows = 1, kPathColumnsScalar = 2, kPathColumns = 3 };

// Columns pay once a column has a few z-voxels to share the per-(view, column) set-up.
constexpr int kColumnsMinZ = 8;

template <typename real>
void backproject(const real* q, i64 q_view_stride, i64 q_u_stride, i64 q_v_stride, int U, int V, const real* src,
                 const real* ctr, const real* ustep, const real* vstep, const real* view_weight, int cone, int k0,
                 int k1, ct::VolumeWindow<real> vw, real* out, int accumulate, int nthreads, int path) {
  const int nz = vw.z1 - vw.z0;
  if (nz <= 0 || vw.H <= 0 || vw.W <= 0) return;
  const i64 plane = (i64)vw.H * vw.W;
  // Index matrices of the view range, once (double set-up, real in the loops).
  const int nv = std::max(0, k1 - k0);
  std::vector<double> mats((size_t)nv * 12, 0.0);
  std::vector<double> kr((size_t)nv, 0.0);  // cylinder: column index per radian
  std::vector<char> ok((size_t)nv, 0);
  const bool cylinder = cone == ct::kFdkCylinder;
  for (int k = 0; k < nv; ++k) {
    double P[12];
    const real wk = view_weight[k0 + k];
    const bool made = cylinder ? ct::fdk_view_matrix_cylinder(src, ctr, ustep, vstep, k0 + k, P, &kr[k])
                               : ct::fdk_view_matrix(src, ctr, ustep, vstep, cone, k0 + k, U, V, P);
    if (made && wk != real(0) && CT_ISFINITE(wk) && CT_ISFINITE((real)kr[k])) {
      ct::fdk_index_matrix(P, vw, &mats[(size_t)k * 12]);
      ok[k] = ct::fdk_index_matrix_ok<real>(&mats[(size_t)k * 12]) ? 1 : 0;
    }
  }
  if (path == kPathAuto)
    path = nz < kColumnsMinZ ? kPathRows : (ct::fdk_lanes<real>() > 0 ? kPathColumns : kPathColumnsScalar);
  if (path == kPathColumns || path == kPathColumnsScalar) {
    std::vector<ct::FdkColumnView> views;
    std::vector<int> ids;
    for (int k = 0; k < nv; ++k) {
      if (!ok[k]) continue;
      ct::FdkColumnView cv;
      std::copy(&mats[(size_t)k * 12], &mats[(size_t)k * 12] + 12, cv.M);
      cv.columnar = cv.M[2] == 0.0 && cv.M[10] == 0.0;
      cv.kR = kr[k];
      views.push_back(cv);
      ids.push_back(k0 + k);
    }
    ct::fdk_backproject_columns<real>(q, q_view_stride, (int)q_u_stride, (int)q_v_stride, U, V, views, ids,
                                      view_weight, cone, vw, out, accumulate, path == kPathColumns, nthreads);
    return;
  }
  const i64 rows = (i64)nz * vw.H;
  const int W = vw.W;
  const int su = (int)q_u_stride, sv = (int)q_v_stride;
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<real> acc((size_t)W);
#pragma omp for schedule(dynamic, 4)
    for (i64 row = 0; row < rows; ++row) {
      const int iz = vw.z0 + (int)(row / vw.H);
      const int iy = (int)(row % vw.H);
      std::fill(acc.begin(), acc.end(), real(0));
      for (int k = 0; k < nv; ++k) {
        if (!ok[k]) continue;
        const double* M = &mats[(size_t)k * 12];
        // Row start and per-voxel step of a = i*w, b = j*w and w.
        const real a0 = (real)(M[3] + M[1] * iy + M[2] * iz), da = (real)M[0];
        const real b0 = (real)(M[7] + M[5] * iy + M[6] * iz), db = (real)M[4];
        const real w0 = (real)(M[11] + M[9] * iy + M[10] * iz), dw = (real)M[8];
        const real wk = view_weight[k0 + k];
        const real* qk = q + (i64)(k0 + k) * q_view_stride;
        real* CT_RESTRICT a_ = acc.data();
        if (cylinder) {
          const real kR = (real)kr[k];
#pragma omp simd
          for (int ix = 0; ix < W; ++ix) {
            a_[ix] += wk * ct::fdk_contribution_cylinder(qk, su, sv, U, V, a0 + da * (real)ix, b0 + db * (real)ix,
                                                         w0 + dw * (real)ix, kR);
          }
        } else if (cone) {
#pragma omp simd
          for (int ix = 0; ix < W; ++ix) {
            const real w = w0 + dw * (real)ix;
            a_[ix] += wk * ct::fdk_contribution(qk, su, sv, U, V, a0 + da * (real)ix,
                                                b0 + db * (real)ix, w, 1);
          }
        } else {
#pragma omp simd
          for (int ix = 0; ix < W; ++ix) {
            a_[ix] += wk * ct::fdk_bilinear(qk, su, sv, U, V, a0 + da * (real)ix,
                                            b0 + db * (real)ix);
          }
        }
      }
      real* o = out + (i64)(iz - vw.z0) * plane + (i64)iy * W;
      if (accumulate) {
        for (int ix = 0; ix < W; ++ix) o[ix] += acc[ix];
      } else {
        for (int ix = 0; ix < W; ++ix) o[ix] = acc[ix];
      }
    }
  }
}

}  // namespace

#define CT_EXPORT extern "C" __attribute__((visibility("default")))

#define CT_FDK_ENTRIES(real, suffix)                                                                              \
  CT_EXPORT void fdk_backproject_##suffix(const real* q, i64 q_view_stride, i64 q_u_stride, i64 q_v_stride,      \
                                          int U, int V, const real* src, const real* ctr, const real* ustep,     \
                                          const real* vstep, const real* view_weight, int cone, int k0, int k1,  \
                                          int D, int H, int W, int z0, int z1, double dx, double dy, double dz,  \
                                          real* out, int accumulate, int nthreads) {                             \
    ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};                                    \
    backproject<real>(q, q_view_stride, q_u_stride, q_v_stride, U, V, src, ctr, ustep, vstep, view_weight, cone,  \
                      k0, k1, vw, out, accumulate, nthreads, kPathAuto);                                          \
  }                                                                                                              \
  CT_EXPORT void fdk_backproject_path_##suffix(const real* q, i64 q_view_stride, i64 q_u_stride, i64 q_v_stride, \
                                               int U, int V, const real* src, const real* ctr,                   \
                                               const real* ustep, const real* vstep, const real* view_weight,    \
                                               int cone, int k0, int k1, int D, int H, int W, int z0, int z1,    \
                                               double dx, double dy, double dz, real* out, int accumulate,       \
                                               int nthreads, int path) {                                         \
    ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};                                    \
    backproject<real>(q, q_view_stride, q_u_stride, q_v_stride, U, V, src, ctr, ustep, vstep, view_weight, cone,  \
                      k0, k1, vw, out, accumulate, nthreads, path);                                               \
  }                                                                                                              \
  CT_EXPORT int fdk_lanes_##suffix() { return ct::fdk_lanes<real>(); }                                           \
  CT_EXPORT int fdk_view_matrix_##suffix(const real* src, const real* ctr, const real* ustep, const real* vstep,  \
                                         int cone, int k, int U, int V, double* P) {                             \
    return ct::fdk_view_matrix(src, ctr, ustep, vstep, cone, k, U, V, P) ? 1 : 0;                                 \
  }

CT_FDK_ENTRIES(float, f32)
CT_FDK_ENTRIES(double, f64)
