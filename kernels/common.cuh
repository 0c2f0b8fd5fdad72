// Shared definitions for the single-source kernels.
//
// Every per-ray / per-voxel function in kernels/*.cuh is written once against
// these macros.  kernels/cuda_entry.cu wraps them in __global__ functions
// (NVRTC through CuPy); kernels/cpu_entry.cpp wraps the same functions in
// OpenMP loops (host C++ compiler).
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CT_HD __host__ __device__ __forceinline__
#define CT_DEVICE 1
#define CT_RESTRICT __restrict__
#define CT_ATOMIC_ADD(ptr, val) atomicAdd((ptr), (val))
#define CT_FLOOR(x) floor(x)
#define CT_SQRT(x) sqrt(x)
#define CT_ABS(x) fabs(x)
#define CT_ISFINITE(x) isfinite(x)
#else
#include <cmath>
#define CT_HD inline
#define CT_DEVICE 0
#define CT_RESTRICT __restrict__
#define CT_ATOMIC_ADD(ptr, val) (*(ptr) += (val))
#define CT_FLOOR(x) std::floor(x)
#define CT_SQRT(x) std::sqrt(x)
#define CT_ABS(x) std::fabs(x)
#define CT_ISFINITE(x) std::isfinite(x)
#endif

namespace ct {

typedef long long i64;

template <typename T>
struct Vec3 {
  T x, y, z;
  CT_HD T operator[](int i) const { return i == 0 ? x : (i == 1 ? y : z); }
};

template <typename T>
CT_HD Vec3<T> load3(const T* p) { return Vec3<T>{p[0], p[1], p[2]}; }

template <typename T>
CT_HD T clampd(T v, T lo, T hi) { return v < lo ? lo : (v > hi ? hi : v); }

template <typename T>
CT_HD T tmin(T a, T b) { return a < b ? a : b; }

template <typename T>
CT_HD T tmax(T a, T b) { return a > b ? a : b; }

// True when all n values are finite.  Every kernel rejects a ray or view whose
// set-up is not finite before any of it becomes an index: (int)NaN is
// undefined behaviour and would address arbitrary memory.
template <typename T>
CT_HD bool all_finite(const T* v, int n) {
  bool ok = true;
  for (int i = 0; i < n; ++i) ok = ok && CT_ISFINITE(v[i]);
  return ok;
}

// The volume window a kernel sees: the global grid (for coordinates) and the
// slab [z0, z1) whose voxels it reads or writes.  The slab's data is a dense
// (batch, z1-z0, H, W) array; global coordinates are preserved.
template <typename real>
struct VolumeWindow {
  int D, H, W;       // global grid
  int z0, z1;        // owned slab of the first axis (z)
  real dx, dy, dz;   // voxel spacing (mm)
};

// The detector window: views [0, n_views) of the arrays passed in (the caller
// slices the per-view geometry), pixel tile [u0,u1) x [v0,v1) of a (U,V) detector.
struct DetectorWindow {
  int n_views;
  int U, V;
  int u0, u1, v0, v1;
};

}  // namespace ct
