// CUDA entry points of the FDK family: the voxel-driven weighted backprojection
// of fdk.cuh, one thread per voxel of the output slab.  Compiled by NVRTC
// through CuPy's RawModule (ctbench/engine/fdk_kernels.py); templated names
// are requested with name_expressions, e.g. "fdk_backproject<float>".
#include "fdk.cuh"

using ct::i64;

// Per view: the 3x4 index matrix (12 values) and the view weight (zero for a
// degenerate view), 13 values per view in `mats`.
template <typename real>
__global__ void fdk_view_matrices(const real* __restrict__ src, const real* __restrict__ ctr,
                                  const real* __restrict__ ustep, const real* __restrict__ vstep,
                                  const real* __restrict__ view_weight, int cone, int n_views, int U, int V, int D,
                                  int H, int W, double dx, double dy, double dz, real* __restrict__ mats) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n_views) return;
  ct::VolumeWindow<real> vw{D, H, W, 0, D, (real)dx, (real)dy, (real)dz};
  double P[12], M[12];
  bool ok = ct::fdk_view_matrix(src, ctr, ustep, vstep, cone, k, U, V, P) && isfinite(view_weight[k]);
  if (ok) {
    ct::fdk_index_matrix(P, vw, M);
    ok = ct::fdk_index_matrix_ok<real>(M);
  }
  for (int r = 0; r < 12; ++r) mats[13 * k + r] = ok ? (real)M[r] : real(0);
  mats[13 * k + 12] = ok ? view_weight[k] : real(0);
}

// out[z - z0, y, x] (+)= sum over views k in [k0, k1) of weight_k * contribution.
template <typename real>
__global__ void fdk_backproject(const real* __restrict__ q, i64 q_view_stride, i64 q_u_stride, i64 q_v_stride,
                                int U, int V, const real* __restrict__ mats, int cone, int k0, int k1, int H, int W,
                                int z0, int z1, real* __restrict__ out, int accumulate) {
  const i64 n_vox = (i64)(z1 - z0) * H * W;
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (tid >= n_vox) return;
  // x fastest: a warp covers neighbouring voxels of a row, whose rays hit
  // neighbouring detector pixels.
  const int ix = (int)(tid % W);
  const int iy = (int)((tid / W) % H);
  const int iz = z0 + (int)(tid / ((i64)W * H));
  const real fx = (real)ix, fy = (real)iy, fz = (real)iz;
  real acc = real(0);
  for (int k = k0; k < k1; ++k) {
    const real* M = mats + 13 * k;
    const real wk = M[12];
    if (wk == real(0)) continue;
    const real a = M[3] + M[0] * fx + M[1] * fy + M[2] * fz;
    const real b = M[7] + M[4] * fx + M[5] * fy + M[6] * fz;
    const real w = M[11] + M[8] * fx + M[9] * fy + M[10] * fz;
    acc += wk * ct::fdk_contribution(q + (i64)k * q_view_stride, (int)q_u_stride, (int)q_v_stride, U, V, a, b, w, cone);
  }
  out[tid] = accumulate ? out[tid] + acc : acc;
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
