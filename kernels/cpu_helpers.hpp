// Host-only helpers shared by the CPU entry files (OpenMP loops).
#pragma once
#include <omp.h>

#if !defined(_WIN32)
#include <sys/mman.h>  // madvise (huge pages); Windows builds go without it
#include <unistd.h>    // sysconf (the L2 size)
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#if defined(_WIN32)
// windows.h otherwise defines min and max as macros, which break every std::min/std::max of the
// kernels that include this header; the lean set is all the L2 query needs.
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>   // GetLogicalProcessorInformation (the L2 size)
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "common.cuh"

// Builds with hand-written SIMD lanes (the lane-operation structs of joseph_forward_cpu.hpp and
// joseph_backward_cpu.hpp, and what is written once over them): AVX-512, or AVX2 with FMA.
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define CT_SIMD_LANES 1
#endif

namespace ct {

// Which detector axis the inner pixel loop walks: the one whose pixel step
// moves least along z, so that neighbouring rays read neighbouring rows of the
// (z, y, x) volume instead of planes H*W elements apart (1.45x measured on a
// circular scan, where v runs along z).
template <typename real>
inline bool inner_is_u(const real* ustep, const real* vstep, int n_views) {
  double zu = 0, zv = 0;
  for (int k = 0; k < n_views; ++k) {
    zu += std::fabs((double)ustep[3 * k + 2]);
    zv += std::fabs((double)vstep[3 * k + 2]);
  }
  return zu < zv;
}

// The size of one core's L2 cache in bytes, which the blocking of the forward's bands and the
// backprojection's accumulators is sized to (Zen 4 has 1 MiB, current Intel server cores 2 MiB, Zen 3
// 512 KiB: one constant fits none of them).  CTBENCH_L2_BYTES overrides it (for measurements); when the
// system does not say, 1 MiB.  Read once per process.
inline long long l2_cache_bytes_uncached() {
  if (const char* env = std::getenv("CTBENCH_L2_BYTES")) {
    const long long v = std::atoll(env);
    if (v >= (64 << 10) && v <= (1ll << 30)) return v;
  }
  long long bytes = 0;
#if defined(_WIN32)
  DWORD len = 0;
  GetLogicalProcessorInformation(nullptr, &len);
  if (len > 0) {
    auto* info = static_cast<SYSTEM_LOGICAL_PROCESSOR_INFORMATION*>(std::malloc(len));
    if (info != nullptr && GetLogicalProcessorInformation(info, &len)) {
      for (DWORD i = 0; i < len / sizeof(*info); ++i)
        if (info[i].Relationship == RelationCache && info[i].Cache.Level == 2)
          bytes = std::max<long long>(bytes, info[i].Cache.Size);
    }
    std::free(info);
  }
#elif defined(__APPLE__)
  long long v = 0;
  size_t n = sizeof(v);
  if (sysctlbyname("hw.perflevel0.l2cachesize", &v, &n, nullptr, 0) == 0 ||
      (n = sizeof(v), sysctlbyname("hw.l2cachesize", &v, &n, nullptr, 0) == 0))
    bytes = v;
#elif defined(_SC_LEVEL2_CACHE_SIZE)
  bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return bytes >= (64 << 10) ? bytes : (1ll << 20);
}

inline long long l2_cache_bytes() {
  static const long long bytes = l2_cache_bytes_uncached();
  return bytes;
}

// 2 MiB aligned memory marked for transparent huge pages: one TLB entry covers 2 MiB of the walk instead of
// 4 KiB, and the first touch faults once per 2 MiB instead of 512 times.  Not zero-initialised.
inline void* slab_alloc(size_t bytes) {
  void* p = nullptr;
#if defined(_WIN32)
  p = _aligned_malloc(bytes, size_t(2) << 20);  // no posix_memalign there; freed with _aligned_free
  if (p == nullptr) throw std::bad_alloc();
#else
  if (posix_memalign(&p, size_t(2) << 20, bytes) != 0) throw std::bad_alloc();
#endif
#ifdef MADV_HUGEPAGE
  const size_t page = 4096;
  madvise(p, (bytes + page - 1) / page * page, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  return p;
}
inline void slab_free(void* p) {
#if defined(_WIN32)
  _aligned_free(p);
#else
  std::free(p);
#endif
}

// Small buffers kept between calls, per calling thread, one per slot (KeptSlot): a buffer of this size is
// fresh memory at every call otherwise (glibc maps and unmaps it), whose pages the kernel faults in and clears
// before the call writes them again.  At N = 64 (W1's geometry, 2 threads) that was about 6% of the forward's
// CPU time (docs/INTERNALS.md "Memory: huge pages and kept buffers").  A thread keeps at most one block of up to
// kKeptBlockBytes per slot, freed when the thread ends; larger buffers are allocated and freed per call (their
// faults are a small part of a call that size).
constexpr size_t kKeptBlockBytes = size_t(8) << 20;
enum KeptSlot : int { kNotKept = -1, kKeptForwardCopy = 0, kKeptBackA = 1, kKeptBackB = 2, kKeptSlots = 3 };
struct KeptBlocks {
  void* data[kKeptSlots] = {};
  size_t bytes[kKeptSlots] = {};
  KeptBlocks() = default;
  KeptBlocks(const KeptBlocks&) = delete;
  KeptBlocks& operator=(const KeptBlocks&) = delete;
  ~KeptBlocks() {
    for (void* p : data) slab_free(p);
  }
  // a block of at least `want` bytes in `slot`, the kept one where it is large enough
  void* take(int slot, size_t want) {
    if (bytes[slot] < want) {
      slab_free(data[slot]);
      data[slot] = nullptr;  // empty, not dangling, should slab_alloc throw
      bytes[slot] = 0;
      data[slot] = slab_alloc(want);
      bytes[slot] = want;
    }
    return data[slot];
  }
};
inline KeptBlocks& kept_blocks() {
  static thread_local KeptBlocks blocks;
  return blocks;
}

// A buffer of n elements (the forward's slab copy, the backprojection's accumulators), from slab_alloc; with a
// slot and at most kKeptBlockBytes, the calling thread's kept block of that slot (a call must not hold two
// buffers of one slot).  Not zero-initialised (the copy writes every element; the accumulators are zeroed
// where they are used).
template <typename real>
struct SlabBuffer {
  real* data = nullptr;
  bool kept = false;
  explicit SlabBuffer(size_t n, int slot = kNotKept) {
    if (n == 0) return;
    const size_t bytes = n * sizeof(real);
    kept = slot >= 0 && slot < kKeptSlots && bytes <= kKeptBlockBytes;
    data = static_cast<real*>(kept ? kept_blocks().take(slot, bytes) : slab_alloc(bytes));
  }
  ~SlabBuffer() {
    if (!kept) slab_free(data);
  }
  SlabBuffer(const SlabBuffer&) = delete;
  SlabBuffer& operator=(const SlabBuffer&) = delete;
};

// Copy a batch of (nz, H, W) slabs into (nz, W, H) order (x and y swapped).
template <typename real>
inline void swap_xy(const real* src, real* dst, i64 batch_stride, int batch, int nz, int H, int W, int nthreads) {
  const int tile = 32;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads)
  for (i64 qz = 0; qz < (i64)batch * nz; ++qz) {
    for (int y0 = 0; y0 < H; y0 += tile) {
      const int q = (int)(qz / nz), z = (int)(qz % nz);
      const real* s = src + q * batch_stride + (i64)z * H * W;
      real* d = dst + q * batch_stride + (i64)z * H * W;
      for (int x0 = 0; x0 < W; x0 += tile)
        for (int y = y0; y < std::min(H, y0 + tile); ++y)
          for (int x = x0; x < std::min(W, x0 + tile); ++x) d[(i64)x * H + y] = s[(i64)y * W + x];
    }
  }
}

}  // namespace ct
