// CUDA entry points of the Joseph family: the per-ray functions of joseph.cuh
// as __global__ kernels, one thread per ray.  Compiled by NVRTC through CuPy's
// RawModule (ctbench/engine/cuda.py); templated names are requested with
// name_expressions, e.g. "joseph_forward<float>".
#include "joseph.cuh"

using ct::i64;

// The ray of thread `tid` in a (view, u, v) tile.  Fastest index: v, so a warp
// covers neighbouring pixels of one detector row.
template <typename real>
__device__ __forceinline__ void thread_ray(i64 tid, const real* src, const real* ctr, const real* ustep,
                                           const real* vstep, int cone, int U, int V, int u0, int u1, int v0, int v1,
                                           double o[3], double d[3]) {
  const int nu = u1 - u0, nv = v1 - v0;
  const int iv = v0 + (int)(tid % nv);
  const int iu = u0 + (int)((tid / nv) % nu);
  const int k = (int)(tid / ((i64)nv * nu));
  ct::pixel_ray(src, ctr, ustep, vstep, cone, k, iu, iv, U, V, o, d);
}

template <typename real>
__global__ void joseph_forward(const real* __restrict__ vol, i64 vol_batch_stride, int batch, int D, int H, int W,
                               int z0, int z1, double dx, double dy, double dz, const real* __restrict__ src,
                               const real* __restrict__ ctr, const real* __restrict__ ustep,
                               const real* __restrict__ vstep, int cone, int n_views, int U, int V, int u0, int u1,
                               int v0, int v1, real* __restrict__ out, int accumulate) {
  const i64 n_rays = (i64)n_views * (u1 - u0) * (v1 - v0);
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (tid >= n_rays) return;
  ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};
  double o[3], d[3];
  thread_ray(tid, src, ctr, ustep, vstep, cone, U, V, u0, u1, v0, v1, o, d);
  ct::Ray<real> r{};
  const bool hit = ct::make_ray(vw, o, d, z0, z1, r);
  for (int q = 0; q < batch; ++q) {
    const real val = hit ? ct::ray_forward(vol + q * vol_batch_stride, r) : real(0);
    real* dst = out + q * n_rays + tid;
    *dst = accumulate ? *dst + val : val;
  }
}

template <typename real>
__global__ void joseph_backward(const real* __restrict__ sino, int batch, int D, int H, int W, int z0, int z1,
                                double dx, double dy, double dz, const real* __restrict__ src,
                                const real* __restrict__ ctr, const real* __restrict__ ustep,
                                const real* __restrict__ vstep, int cone, int n_views, int U, int V, int u0, int u1,
                                int v0, int v1, real* vol, i64 vol_batch_stride) {
  const i64 n_rays = (i64)n_views * (u1 - u0) * (v1 - v0);
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (tid >= n_rays) return;
  ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};
  double o[3], d[3];
  thread_ray(tid, src, ctr, ustep, vstep, cone, U, V, u0, u1, v0, v1, o, d);
  ct::Ray<real> r{};
  if (!ct::make_ray(vw, o, d, z0, z1, r)) return;
  for (int q = 0; q < batch; ++q) {
    const real val = sino[q * n_rays + tid];
    if (val != real(0)) ct::ray_backward<real, true>(vol + q * vol_batch_stride, r, val);
  }
}

// Explicit instantiations so an offline nvcc -ptx check sees every entry point
// (NVRTC instantiates them on demand through name_expressions).
template __global__ void joseph_forward<float>(const float*, i64, int, int, int, int, int, int, double, double,
                                               double, const float*, const float*, const float*, const float*, int,
                                               int, int, int, int, int, int, int, float*, int);
template __global__ void joseph_forward<double>(const double*, i64, int, int, int, int, int, int, double, double,
                                                double, const double*, const double*, const double*, const double*,
                                                int, int, int, int, int, int, int, int, double*, int);
template __global__ void joseph_backward<float>(const float*, int, int, int, int, int, int, double, double, double,
                                                const float*, const float*, const float*, const float*, int, int, int,
                                                int, int, int, int, int, float*, i64);
template __global__ void joseph_backward<double>(const double*, int, int, int, int, int, int, double, double, double,
                                                 const double*, const double*, const double*, const double*, int,
                                                 int, int, int, int, int, int, int, double*, i64);
