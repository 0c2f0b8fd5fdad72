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

// Forward: each thread walks JF_RAYS rays of one detector column, pixels
// (iu, iu + 1, ...) at the same iv: neighbouring rays cross neighbouring voxels,
// so the second ray's reads hit what the first brought into L1.  A warp still
// covers 32 neighbouring v of one u row (coalesced stores).  The volume is read
// through const __restrict__ pointers (the read-only data path).
#define JF_RAYS 2

template <typename real>
__global__ void joseph_forward(const real* __restrict__ vol, i64 vol_batch_stride, int batch, int D, int H, int W,
                               int z0, int z1, double dx, double dy, double dz, const real* __restrict__ src,
                               const real* __restrict__ ctr, const real* __restrict__ ustep,
                               const real* __restrict__ vstep, int cone, int n_views, int U, int V, int u0, int u1,
                               int v0, int v1, real* __restrict__ out, int accumulate) {
  const int nu = u1 - u0, nv = v1 - v0;
  const int nug = (nu + JF_RAYS - 1) / JF_RAYS;  // u groups
  const i64 n_rays = (i64)n_views * nu * nv;
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (tid >= (i64)n_views * nug * nv) return;
  const int jv = (int)(tid % nv);
  const int g = (int)((tid / nv) % nug);
  const int k = (int)(tid / ((i64)nv * nug));
  const ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};
  for (int j = 0; j < JF_RAYS; ++j) {
    const int ju = g * JF_RAYS + j;
    if (ju >= nu) break;
    double o[3], d[3];
    ct::pixel_ray(src, ctr, ustep, vstep, cone, k, u0 + ju, v0 + jv, U, V, o, d);
    ct::Ray<real> r{};
    const bool hit = ct::make_ray(vw, o, d, z0, z1, r);
    const i64 ray = ((i64)k * nu + ju) * nv + jv;
    for (int q = 0; q < batch; ++q) {
      const real val = hit ? ct::ray_forward(vol + q * vol_batch_stride, r) : real(0);
      real* dst = out + q * n_rays + ray;
      *dst = accumulate ? *dst + val : val;
    }
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

// The matched backprojection without global atomics: one block per box of
// JB_TZ x JB_TY x JB_TX voxels of the slab [z0, z1).  Per view, the block visits
// the detector pixels whose rays can touch its box (box_pixel_bounds), builds
// each ray against the box (make_ray_box: the same sample positions and weights
// as the forward, restricted to the box's voxels) and scatters into the box in
// shared memory (shared-memory atomics).  Each voxel belongs to one block, so
// the box is added to the output with plain stores.  Every thread takes part in
// every barrier (no early return).
#define JB_TX 32
#define JB_TY 16
#define JB_TZ 4
#define JB_THREADS 256

template <typename real>
__global__ void __launch_bounds__(JB_THREADS)
joseph_backward_tiled(const real* __restrict__ sino, int batch, int D, int H, int W, int z0, int z1, double dx,
                      double dy, double dz, const real* __restrict__ src, const real* __restrict__ ctr,
                      const real* __restrict__ ustep, const real* __restrict__ vstep, int cone, int n_views, int U,
                      int V, int u0, int u1, int v0, int v1, real* vol, i64 vol_batch_stride) {
  __shared__ real box[JB_TZ * JB_TY * JB_TX];
  __shared__ int bounds[4];
  const int ntx = (W + JB_TX - 1) / JB_TX, nty = (H + JB_TY - 1) / JB_TY;
  const int t = (int)blockIdx.x;
  const int blo[3] = {(t % ntx) * JB_TX, ((t / ntx) % nty) * JB_TY, z0 + (t / (ntx * nty)) * JB_TZ};
  const int bhi[3] = {blo[0] + JB_TX < W ? blo[0] + JB_TX : W, blo[1] + JB_TY < H ? blo[1] + JB_TY : H,
                      blo[2] + JB_TZ < z1 ? blo[2] + JB_TZ : z1};
  const i64 stride[3] = {1, JB_TX, (i64)JB_TX * JB_TY};
  const i64 offset = blo[0] + (i64)blo[1] * JB_TX + (i64)blo[2] * JB_TX * JB_TY;
  const ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};
  const int nu = u1 - u0, nv = v1 - v0;
  const i64 n_rays = (i64)n_views * nu * nv;
  for (int q = 0; q < batch; ++q) {
    for (int e = threadIdx.x; e < JB_TZ * JB_TY * JB_TX; e += blockDim.x) box[e] = real(0);
    for (int k = 0; k < n_views; ++k) {
      if (threadIdx.x == 0) {
        int a0, a1, b0, b1;
        ct::box_pixel_bounds(vw, src, ctr, ustep, vstep, cone, k, blo, bhi, U, V, a0, a1, b0, b1);
        bounds[0] = a0 > u0 ? a0 : u0; bounds[1] = a1 < u1 ? a1 : u1;
        bounds[2] = b0 > v0 ? b0 : v0; bounds[3] = b1 < v1 ? b1 : v1;
      }
      __syncthreads();
      const int iu_lo = bounds[0], iv_lo = bounds[2];
      const int fu = bounds[1] - iu_lo, fv = bounds[3] - iv_lo;
      const int n_pix = (fu > 0 && fv > 0) ? fu * fv : 0;
      for (int p = threadIdx.x; p < n_pix; p += blockDim.x) {
        const int iu = iu_lo + p / fv, iv = iv_lo + p % fv;
        const real val = sino[q * n_rays + ((i64)k * nu + (iu - u0)) * nv + (iv - v0)];
        if (val == real(0)) continue;
        double o[3], d[3];
        ct::pixel_ray(src, ctr, ustep, vstep, cone, k, iu, iv, U, V, o, d);
        ct::Ray<real> r{};
        if (ct::make_ray_box(vw, o, d, blo, bhi, stride, offset, r)) ct::ray_backward<real, true>(box, r, val);
      }
      __syncthreads();  // thread 0 rewrites bounds for the next view
    }
    real* out = vol + q * vol_batch_stride;
    const int bx = bhi[0] - blo[0], by = bhi[1] - blo[1], bz = bhi[2] - blo[2];
    for (int e = threadIdx.x; e < bx * by * bz; e += blockDim.x) {
      const int x = e % bx, y = (e / bx) % by, z = e / (bx * by);
      out[((i64)(blo[2] + z - z0) * H + blo[1] + y) * W + blo[0] + x] += box[(z * JB_TY + y) * JB_TX + x];
    }
    __syncthreads();  // the box is zeroed for the next batch item
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
template __global__ void joseph_backward_tiled<float>(const float*, int, int, int, int, int, int, double, double,
                                                      double, const float*, const float*, const float*, const float*,
                                                      int, int, int, int, int, int, int, int, float*, i64);
template __global__ void joseph_backward_tiled<double>(const double*, int, int, int, int, int, int, double, double,
                                                       double, const double*, const double*, const double*,
                                                       const double*, int, int, int, int, int, int, int, int, double*,
                                                       i64);
