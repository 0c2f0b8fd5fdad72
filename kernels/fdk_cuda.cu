// CUDA entry points of the FDK family: the voxel-driven weighted backprojection
// of fdk.cuh, one thread per voxel of the output slab.  Compiled by NVRTC
// through CuPy's RawModule (ctbench/engine/fdk_kernels.py); templated names
// are requested with name_expressions, e.g. "fdk_backproject<float>".
#include "fdk.cuh"

using ct::i64;

// Per view: the 3x4 index matrix (12 values), the view weight (zero for a
// degenerate view) and, for a cylindrical detector (cone == 2), the column index
// per radian: FDK_MAT values per view in `mats`.
#define FDK_MAT 14
template <typename real>
__global__ void fdk_view_matrices(const real* __restrict__ src, const real* __restrict__ ctr,
                                  const real* __restrict__ ustep, const real* __restrict__ vstep,
                                  const real* __restrict__ view_weight, int cone, int n_views, int U, int V, int D,
                                  int H, int W, double dx, double dy, double dz, real* __restrict__ mats) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n_views) return;
  ct::VolumeWindow<real> vw{D, H, W, 0, D, (real)dx, (real)dy, (real)dz};
  double P[12], M[12], kR = 0.0;
  bool ok = (cone == ct::kFdkCylinder ? ct::fdk_view_matrix_cylinder(src, ctr, ustep, vstep, k, P, &kR)
                                      : ct::fdk_view_matrix(src, ctr, ustep, vstep, cone, k, U, V, P)) &&
            isfinite(view_weight[k]) && isfinite((real)kR);
  if (ok) {
    ct::fdk_index_matrix(P, vw, M);
    ok = ct::fdk_index_matrix_ok<real>(M);
  }
  for (int r = 0; r < 12; ++r) mats[FDK_MAT * k + r] = ok ? (real)M[r] : real(0);
  mats[FDK_MAT * k + 12] = ok ? view_weight[k] : real(0);
  mats[FDK_MAT * k + 13] = ok ? (real)kR : real(0);
}

// out[z - z0, y, x] (+)= sum over views k in [k0, k1) of weight_k * contribution.
//
// One thread per FDK_ZPT voxels stacked along z at one (x, y): the three
// numerators are affine in z, so the thread's voxels cost three adds each
// after the first.  The views' FDK_MAT constants are staged through shared memory
// FDK_VIEWS at a time (every thread of a block reads the same view at the same
// time).  Every thread takes part in the staging, so none returns early.
#define FDK_ZPT 4
#define FDK_VIEWS 32

template <typename real>
__global__ void __launch_bounds__(256)
fdk_backproject(const real* __restrict__ q, i64 q_view_stride, i64 q_u_stride, i64 q_v_stride, int U, int V,
                const real* __restrict__ mats, int cone, int k0, int k1, int H, int W, int z0, int z1,
                real* __restrict__ out, int accumulate) {
  __shared__ real view_mats[FDK_VIEWS * FDK_MAT];
  const int nz = z1 - z0;
  const int zgroups = (nz + FDK_ZPT - 1) / FDK_ZPT;
  const i64 n_items = (i64)zgroups * H * W;
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = tid < n_items;
  // x fastest: a warp covers neighbouring voxels of a row, whose rays hit
  // neighbouring detector pixels.
  const int ix = active ? (int)(tid % W) : 0;
  const int iy = active ? (int)((tid / W) % H) : 0;
  const int zl = active ? (int)(tid / ((i64)W * H)) * FDK_ZPT : 0;
  const int nzt = active ? (nz - zl < FDK_ZPT ? nz - zl : FDK_ZPT) : 0;
  const real fx = (real)ix, fy = (real)iy, fz = (real)(z0 + zl);
  real acc[FDK_ZPT];
  for (int t = 0; t < FDK_ZPT; ++t) acc[t] = real(0);
  for (int kc = k0; kc < k1; kc += FDK_VIEWS) {
    const int nk = (k1 - kc < FDK_VIEWS) ? k1 - kc : FDK_VIEWS;
    for (int e = threadIdx.x; e < nk * FDK_MAT; e += blockDim.x) view_mats[e] = mats[FDK_MAT * kc + e];
    __syncthreads();
    for (int j = 0; j < nk; ++j) {
      const real* M = view_mats + FDK_MAT * j;
      const real wk = M[12], kR = M[13];
      if (wk == real(0) || nzt == 0) continue;
      const real* qk = q + (i64)(kc + j) * q_view_stride;
      real a = M[3] + M[0] * fx + M[1] * fy + M[2] * fz;
      real b = M[7] + M[4] * fx + M[5] * fy + M[6] * fz;
      real w = M[11] + M[8] * fx + M[9] * fy + M[10] * fz;
      for (int t = 0; t < FDK_ZPT; ++t) {
        if (t < nzt)
          acc[t] += wk * ct::fdk_contribution_any(qk, (int)q_u_stride, (int)q_v_stride, U, V, a, b, w, cone, kR);
        a += M[2];
        b += M[6];
        w += M[10];
      }
    }
    __syncthreads();  // the next chunk overwrites view_mats
  }
  for (int t = 0; t < nzt; ++t) {
    const i64 o = ((i64)(zl + t) * H + iy) * W + ix;
    out[o] = accumulate ? out[o] + acc[t] : acc[t];
  }
}

// Explicit instantiations so an offline nvcc -ptx check sees every entry point
// (NVRTC instantiates them on demand through name_expressions).
template __global__ void fdk_view_matrices<float>(const float*, const float*, const float*, const float*,
                                                  const float*, int, int, int, int, int, int, int, double, double,
                                                  double, float*);
template __global__ void fdk_view_matrices<double>(const double*, const double*, const double*, const double*,
                                                   const double*, int, int, int, int, int, int, int, double, double,
                                                   double, double*);
template __global__ void fdk_backproject<float>(const float*, i64, i64, i64, int, int, const float*, int, int, int,
                                                int, int, int, int, float*, int);
template __global__ void fdk_backproject<double>(const double*, i64, i64, i64, int, int, const double*, int, int,
                                                 int, int, int, int, int, double*, int);
