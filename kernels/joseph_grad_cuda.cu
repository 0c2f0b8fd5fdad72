// CUDA entry point of the Joseph geometry gradient: one thread per ray.
// The grid is (pixel blocks, views): every block lies inside one view, so a
// block reduces its rays' 12 gradient values (warp shuffles, then shared
// memory) and one thread adds them to the view's accumulators with 12 atomics.
// Compiled by NVRTC through CuPy (ctbench/engine/geometry_grad.py) with the
// name expression "joseph_geometry_vjp<float>" / "<double>".
#include "joseph_grad.cuh"

using ct::i64;

#define CT_GRAD_BLOCK 256

template <typename real>
__global__ void __launch_bounds__(CT_GRAD_BLOCK)
joseph_geometry_vjp(const real* __restrict__ vol, i64 vol_batch_stride, int batch, int D, int H, int W, int z0,
                    int z1, double dx, double dy, double dz, const real* __restrict__ src,
                    const real* __restrict__ ctr, const real* __restrict__ ustep, const real* __restrict__ vstep,
                    int cone, int n_views, int U, int V, int u0, int u1, int v0, int v1, int k0,
                    const real* __restrict__ grad, double* __restrict__ out) {
  const int nu = u1 - u0, nv = v1 - v0;
  const i64 npix = (i64)nu * nv;
  const int k = k0 + (int)blockIdx.y;
  const i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  double acc[ct::GEO_N];
  for (int q = 0; q < ct::GEO_N; ++q) acc[q] = 0.0;
  if (p < npix && k < n_views) {
    const int iv = v0 + (int)(p % nv);
    const int iu = u0 + (int)(p / nv);
    ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};
    ct::ray_geometry_vjp<real, double>(vol, vol_batch_stride, batch, vw, src, ctr, ustep, vstep, cone, k, iu, iv,
                                       U, V, grad + (i64)k * npix + p, (i64)n_views * npix, acc);
  }
  // Every thread of the block takes part in the reduction (no early return above).
  __shared__ double warp_sums[CT_GRAD_BLOCK / 32][ct::GEO_N];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int q = 0; q < ct::GEO_N; ++q) {
    double v = acc[q];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) warp_sums[warp][q] = v;
  }
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    for (int q = 0; q < ct::GEO_N; ++q) {
      double v = lane < nwarps ? warp_sums[lane][q] : 0.0;
      for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
      if (lane == 0 && k < n_views && v != 0.0) atomicAdd(out + (i64)k * ct::GEO_N + q, v);
    }
  }
}

// Explicit instantiations so an offline nvcc -ptx check sees the entry points
// (NVRTC instantiates them on demand through name_expressions).
template __global__ void joseph_geometry_vjp<float>(const float*, i64, int, int, int, int, int, int, double,
                                                    double, double, const float*, const float*, const float*,
                                                    const float*, int, int, int, int, int, int, int, int, int,
                                                    const float*, double*);
template __global__ void joseph_geometry_vjp<double>(const double*, i64, int, int, int, int, int, int, double,
                                                     double, double, const double*, const double*, const double*,
                                                     const double*, int, int, int, int, int, int, int, int, int,
                                                     const double*, double*);
