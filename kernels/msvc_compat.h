// Forced include (/FI) of the MSVC builds of the CPU kernels (CMakeLists.txt):
// the GCC/Clang spellings the kernels use, mapped to MSVC's.  Never included by
// GCC or Clang builds, so the Linux and macOS code is unchanged.
#pragma once
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#include <malloc.h>
#include <xmmintrin.h>

#define __restrict__ __restrict
#define __attribute__(x)
#define __builtin_prefetch(p) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0)

// MSVC defines __AVX2__ / __AVX512F__ under /arch but never __SSE2__ (SSE2 is the x64 baseline).
#if defined(_M_X64) && !defined(__SSE2__)
#define __SSE2__ 1
#endif

static __forceinline int ct_msvc_ctz(unsigned int x) {
  unsigned long i;
  _BitScanForward(&i, x);
  return static_cast<int>(i);
}
#define __builtin_ctz(x) ct_msvc_ctz(static_cast<unsigned int>(x))
#endif
