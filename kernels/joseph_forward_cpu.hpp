// Host-only SIMD tracing of the CPU forward projection (float32): the rays of a
// group of neighbouring detector pixels run in the lanes of one vector, with
// their state in structure-of-arrays form, and each plane's bilinear stencil is
// fetched with gathers of 64-bit (b, b+1) pairs (the b axis is contiguous, see
// docs/INTERNALS.md "Forward: memory order").
//
// Compiled in: AVX-512 (16 lanes) and AVX2 (8 lanes) where the build targets
// them (an AVX-512 build has both), otherwise none (kForwardLanes == 0:
// joseph_cpu.cpp keeps its scalar beams).  Each width fetches a plane's pairs
// either with gathers or with scalar 64-bit loads (slow-gather cores); which
// one runs is chosen at run time (LaneKind, joseph_cpu.cpp's path table).  The lane code
// computes the same samples as ray_forward in joseph.cuh: edge planes of each
// lane go through the checked scalar stencil, interior planes [i0, i1) of each
// lane through the vector loop (a lane is masked off outside its own interior).
#pragma once

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_helpers.hpp"  // l2_cache_bytes: the bands and tiles are sized to this core's L2
#include "joseph.cuh"

namespace ct {
namespace fwd {

// How a lane group fetches its stencil pairs (the run-time forward paths).
enum class LaneKind { Avx512Gather, Avx512Loads, Avx2Gather, Avx2Loads };

#if defined(__AVX512F__)
constexpr int kForwardLanes = 16;
#elif defined(__AVX2__)
constexpr int kForwardLanes = 8;
#else
constexpr int kForwardLanes = 0;
#endif

// Software prefetch of the outer lanes' stencil rows this many planes ahead
// (0: none).  It helped the 4-ray scalar beams; with 16 lanes the gathers keep
// enough loads in flight and it cost 3-5% on W1 (AVX-512, interleaved), so it
// is off unless a build asks for it (-DCT_SIMD_PREFETCH=16).
#ifndef CT_SIMD_PREFETCH
#define CT_SIMD_PREFETCH 0
#endif

// Detector rows per band of the -bands paths: about one L2 (ct::l2_cache_bytes(), measured: 2 MiB on the
// Xeon these were tuned on, 1 MiB on Zen 4) of volume planes, 4 to 8 rows (1 thread, W1's geometry scaled,
// 2 MiB L2, load 12-14: 8 rows best at N = 128-256, 4-5 at N = 320; 1 or 2 rows lose 10-25%, 32 rows 5-10%
// at N = 128).
#ifndef CT_FORWARD_BAND_ROWS
#define CT_FORWARD_BAND_ROWS 0  // > 0: that many rows per band (for measurements; 0: the rule below)
#endif
inline int forward_band_rows(i64 plane_bytes, int n_outer) {
  if (CT_FORWARD_BAND_ROWS > 0) return std::max(1, std::min(CT_FORWARD_BAND_ROWS, std::max(1, n_outer)));
  const i64 target = l2_cache_bytes();
  const i64 rows = plane_bytes > 0 ? target / plane_bytes : 8;
  return (int)std::max<i64>(1, std::min<i64>({i64(8), std::max<i64>(4, rows), (i64)std::max(1, n_outer)}));
}

// Row `row` of the forward's loop as (view k, outer detector index): view-major when band <= 0, else
// band-major (rows [b*band, (b+1)*band) of every view, then the next band; the last band may be short).
inline void row_view_and_outer(i64 row, int n_views, int n_outer, int band, int& k, int& outer) {
  if (band <= 0) {
    k = (int)(row / n_outer);
    outer = (int)(row % n_outer);
    return;
  }
  const i64 per_band = (i64)n_views * band;
  const i64 b = row / per_band, rem = row % per_band;
  const int rows = (int)std::min<i64>(band, (i64)n_outer - b * band);
  k = (int)(rem / rows);
  outer = (int)(b * band + rem % rows);
}

// Ray state of one lane group (structure of arrays) and the strides it shares.
struct LaneGroup {
  alignas(64) float Ab[16], Bb[16], Ac[16], Bc[16];
  alignas(64) int i0[16], i1[16];
  unsigned part = 0;  // lanes with interior planes, traced in the vector loop (bit g: lane g)
  int lo = 0, hi = 0;  // union of the lanes' interiors
  int c0 = 0, c1 = 0;  // intersection of the lanes' interiors (empty if c0 >= c1)
  i64 sa = 0, sc = 0, offset = 0;
  int pf_first = 0, pf_last = 0;  // lanes whose stencil rows are prefetched
};

// Whether ray g can run in a lane next to `first` (the group's first ray).
// Stencil rows of the group's outer lanes CT_SIMD_PREFETCH planes ahead of
// plane n (oblique walks defeat the hardware prefetcher); compiled out when
// the prefetch is off (the default).
inline void prefetch_ahead(const LaneGroup& G, const float* plane, int n) {
  if (CT_SIMD_PREFETCH <= 0) return;
  const int pd = CT_SIMD_PREFETCH;
  const float fa = (float)n + (float)pd;
  const i64 sa = G.sa, sc = G.sc;
  for (int lane : {G.pf_first, G.pf_last}) {
    const float* q = plane + (i64)pd * sa + ((i64)(G.Ab[lane] + fa * G.Bb[lane]) + (i64)(G.Ac[lane] + fa * G.Bc[lane]) * sc);
    __builtin_prefetch(q);
    __builtin_prefetch(q + sc);
  }
}

template <typename real>
inline bool lane_compatible(const Ray<real>& r, const Ray<real>& first) {
  return !r.planar && r.sb == 1 && r.a == first.a && r.sa == first.sa && r.sc == first.sc &&
         r.offset == first.offset;
}

// Fill the lane group from rays r[g] of the lanes in `part` (all compatible).
inline void load_group(const Ray<float>* r, int n, unsigned part, LaneGroup& G) {
  G.part = 0;
  G.lo = 1 << 30; G.hi = -(1 << 30);
  G.c0 = -(1 << 30); G.c1 = 1 << 30;
  int first = -1, last = -1;
  for (int g = 0; g < 16; ++g) {
    const bool on = g < n && ((part >> g) & 1u);
    G.Ab[g] = on ? r[g].Ab : 0.f; G.Bb[g] = on ? r[g].Bb : 0.f;
    G.Ac[g] = on ? r[g].Ac : 0.f; G.Bc[g] = on ? r[g].Bc : 0.f;
    G.i0[g] = on ? r[g].i0 : 0; G.i1[g] = on ? r[g].i1 : 0;
    if (!on) continue;
    G.sa = r[g].sa; G.sc = r[g].sc; G.offset = r[g].offset;
    if (r[g].i0 >= r[g].i1) continue;  // no interior: all its planes are edge planes
    G.part |= 1u << g;
    if (first < 0) first = g;
    last = g;
    G.lo = std::min(G.lo, r[g].i0); G.hi = std::max(G.hi, r[g].i1);
    G.c0 = std::max(G.c0, r[g].i0); G.c1 = std::min(G.c1, r[g].i1);
  }
  if (G.part == 0) { G.lo = G.hi = G.c0 = G.c1 = 0; }  // no lane has interior planes
  G.pf_first = first < 0 ? 0 : first;
  G.pf_last = last < 0 ? 0 : last;
}

#if defined(__AVX512F__)

// A lane group's coefficients in registers (the pair loop's constants).
struct PairLanes {
  __m512 Ab, Bb, Ac, Bc;
  __m512i i0, i1, scv;
  __mmask16 part;
  i64 sc;
  explicit PairLanes(const LaneGroup& G)
      : Ab(_mm512_load_ps(G.Ab)), Bb(_mm512_load_ps(G.Bb)), Ac(_mm512_load_ps(G.Ac)), Bc(_mm512_load_ps(G.Bc)),
        i0(_mm512_load_si512(G.i0)), i1(_mm512_load_si512(G.i1)), scv(_mm512_set1_epi32((int)G.sc)),
        part((__mmask16)G.part), sc(G.sc) {}
};

// Add the bilinear samples of 16 rays, given as (b, b+1) pairs of rows c (r0) and c+1 (r1) in pair layout
// (lanes 0-7 in the lo vectors, 8-15 in the hi ones), to the pair accumulators.
inline void pair_accumulate(__m512 tb, __m512 tc, __m512 r0l, __m512 r1l, __m512 r0h, __m512 r1h, __m512& acc_lo,
                            __m512& acc_hi) {
  const __m512i dup_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i dup_hi = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  const __m512 one = _mm512_set1_ps(1.f);
  // weights in pair layout: (1 - tb, tb) per ray, tc duplicated
  const __m512 tbl = _mm512_permutexvar_ps(dup_lo, tb), tcl = _mm512_permutexvar_ps(dup_lo, tc);
  const __m512 tbh = _mm512_permutexvar_ps(dup_hi, tb), tch = _mm512_permutexvar_ps(dup_hi, tc);
  const __m512 wbl = _mm512_mask_sub_ps(tbl, 0x5555, one, tbl);
  const __m512 wbh = _mm512_mask_sub_ps(tbh, 0x5555, one, tbh);
  const __m512 vl = _mm512_fmadd_ps(tcl, _mm512_sub_ps(r1l, r0l), r0l);
  const __m512 vh = _mm512_fmadd_ps(tch, _mm512_sub_ps(r1h, r0h), r0h);
  acc_lo = _mm512_fmadd_ps(wbl, vl, acc_lo);
  acc_hi = _mm512_fmadd_ps(wbh, vh, acc_hi);
}

#ifndef CT_PAIR_HALF_SKIP
#define CT_PAIR_HALF_SKIP 1
#endif
// The lanes of `m` in plane n (at `plane`) by the unchecked stencil, added to the pair accumulators.
template <bool GATHER>
inline void pair_plane(const PairLanes& L, const float* plane, int n, __mmask16 m, int safe, __m512& acc_lo,
                       __m512& acc_hi) {
  const __m512i zero = _mm512_setzero_si512();
  const i64 sc = L.sc;
  const __m512 fn = _mm512_set1_ps((float)n);
  const __m512 fb = _mm512_fmadd_ps(fn, L.Bb, L.Ab);
  const __m512 fc = _mm512_fmadd_ps(fn, L.Bc, L.Ac);
  // interior: coordinates are positive, so truncation is floor
  const __m512i ib = _mm512_cvttps_epi32(fb), ic = _mm512_cvttps_epi32(fc);
  const __m512 tb = _mm512_sub_ps(fb, _mm512_cvtepi32_ps(ib));
  const __m512 tc = _mm512_sub_ps(fc, _mm512_cvtepi32_ps(ic));
  const __m512i idx = _mm512_add_epi32(ib, _mm512_mullo_epi32(ic, L.scv));
  const __m256i idx_lo = _mm512_castsi512_si256(idx);
  const __m256i idx_hi = _mm512_extracti64x4_epi64(idx, 1);
  const __mmask8 mlo = (__mmask8)(m & 0xff), mhi = (__mmask8)(m >> 8);
  // (b, b+1) pairs of rows c and c+1: 8 rays per vector, ray g in floats 2g, 2g+1
  __m512 r0l, r1l, r0h, r1h;
  if (GATHER) {
    // a half with no lane in the mask skips its gathers (their cost does not fall with the mask) and holds
    // the zeros they would give: lanes enter and leave a group one after another, so ragged planes often
    // have one half empty
    r0l = r1l = r0h = r1h = _mm512_setzero_ps();
    if (!CT_PAIR_HALF_SKIP || mlo) {
      r0l = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mlo, idx_lo, plane, 4));
      r1l = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mlo, idx_lo, plane + sc, 4));
    }
    if (!CT_PAIR_HALF_SKIP || mhi) {
      r0h = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mhi, idx_hi, plane, 4));
      r1h = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mhi, idx_hi, plane + sc, 4));
    }
  } else {
    // scalar loads: masked-off lanes read the slab's first voxels (`safe`: the slab's start relative to
    // `plane`) and are zeroed afterwards.  Not offset 0 of the plane: in a z-window that is a global row
    // outside the slab when z is the plane's c axis.
    alignas(64) int ix[16];
    _mm512_store_si512(ix, _mm512_mask_mov_epi32(_mm512_set1_epi32(safe), m, idx));
    alignas(64) long long q0[16], q1[16];
    for (int g = 0; g < 16; ++g) {
      std::memcpy(&q0[g], plane + ix[g], 8);
      std::memcpy(&q1[g], plane + sc + ix[g], 8);
    }
    r0l = _mm512_castsi512_ps(_mm512_maskz_mov_epi64(mlo, _mm512_load_si512(q0)));
    r1l = _mm512_castsi512_ps(_mm512_maskz_mov_epi64(mlo, _mm512_load_si512(q1)));
    r0h = _mm512_castsi512_ps(_mm512_maskz_mov_epi64(mhi, _mm512_load_si512(q0 + 8)));
    r1h = _mm512_castsi512_ps(_mm512_maskz_mov_epi64(mhi, _mm512_load_si512(q1 + 8)));
  }
  pair_accumulate(tb, tc, r0l, r1l, r0h, r1h, acc_lo, acc_hi);
}

// Lanes of `L` inside their interior at plane n.
inline __mmask16 interior_mask(const PairLanes& L, int n) {
  const __m512i nv = _mm512_set1_epi32(n);
  return _mm512_mask_cmpgt_epi32_mask(_mm512_mask_cmple_epi32_mask(L.part, L.i0, nv), L.i1, nv);
}

// Planes [n_begin, n_end) of the group; MASKED: lanes are switched off outside
// their own interior (else every lane of `part` is inside it).
template <bool MASKED, bool GATHER>
inline void planes_avx512(const float* vol, const LaneGroup& G, int n_begin, int n_end, __m512& acc_lo,
                          __m512& acc_hi) {
  if (n_begin >= n_end) return;
  const PairLanes L(G);
  const i64 sa = G.sa;
  const float* plane = vol + ((i64)n_begin * sa - G.offset);
  int safe = (int)(G.offset - (i64)n_begin * sa);  // vol - plane: 32 bits (use_lanes, joseph_cpu.cpp)
  for (int n = n_begin; n < n_end; ++n, plane += sa, safe -= (int)sa) {
    prefetch_ahead(G, plane, n);
    pair_plane<GATHER>(L, plane, n, MASKED ? interior_mask(L, n) : L.part, safe, acc_lo, acc_hi);
  }
}

// Interior sums of the group's lanes into s[16] (pair halves added).
template <bool GATHER>
inline void interior_sums_avx512(const float* vol, const LaneGroup& G, float* s) {
  __m512 acc_lo = _mm512_setzero_ps(), acc_hi = _mm512_setzero_ps();
  if (G.c0 < G.c1) {
    planes_avx512<true, GATHER>(vol, G, G.lo, G.c0, acc_lo, acc_hi);
    planes_avx512<false, GATHER>(vol, G, G.c0, G.c1, acc_lo, acc_hi);
    planes_avx512<true, GATHER>(vol, G, G.c1, G.hi, acc_lo, acc_hi);
  } else {
    planes_avx512<true, GATHER>(vol, G, G.lo, G.hi, acc_lo, acc_hi);
  }
  alignas(64) float a[32];
  _mm512_store_ps(a, acc_lo);
  _mm512_store_ps(a + 16, acc_hi);
  for (int g = 0; g < 16; ++g) s[g] = a[2 * g] + a[2 * g + 1];
}

#endif

#if defined(__AVX2__)

// The 8-lane loop (lanes 0..7 of the group).  An AVX-512 build has it too, so
// that the AVX2 paths can be forced there (not the speed of an AVX2-only core).
template <bool MASKED, bool GATHER>
inline void planes_avx2(const float* vol, const LaneGroup& G, int n_begin, int n_end, __m256& acc_lo,
                        __m256& acc_hi) {
  if (n_begin >= n_end) return;
  const __m256 Ab = _mm256_load_ps(G.Ab), Bb = _mm256_load_ps(G.Bb);
  const __m256 Ac = _mm256_load_ps(G.Ac), Bc = _mm256_load_ps(G.Bc);
  const __m256i i0 = _mm256_load_si256((const __m256i*)G.i0), i1 = _mm256_load_si256((const __m256i*)G.i1);
  const __m256i scv = _mm256_set1_epi32((int)G.sc);
  const __m256i dup_lo = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0);
  const __m256i dup_hi = _mm256_set_epi32(7, 7, 6, 6, 5, 5, 4, 4);
  const __m256 one = _mm256_set1_ps(1.f);
  alignas(32) int pm[8];
  for (int g = 0; g < 8; ++g) pm[g] = ((G.part >> g) & 1u) ? -1 : 0;
  const __m256i part = _mm256_load_si256((const __m256i*)pm);
  const i64 sa = G.sa, sc = G.sc;
  const float* plane = vol + ((i64)n_begin * sa - G.offset);
  int safe = (int)(G.offset - (i64)n_begin * sa);  // vol - plane (pair_plane)
  for (int n = n_begin; n < n_end; ++n, plane += sa, safe -= (int)sa) {
    const float fnf = (float)n;
    prefetch_ahead(G, plane, n);
    const __m256 fn = _mm256_set1_ps(fnf);
    __m256i m = part;
    if (MASKED) {
      const __m256i nv = _mm256_set1_epi32(n);
      // i0 <= n < i1
      m = _mm256_andnot_si256(_mm256_cmpgt_epi32(i0, nv), m);
      m = _mm256_and_si256(_mm256_cmpgt_epi32(i1, nv), m);
    }
    const __m256 fb = _mm256_fmadd_ps(fn, Bb, Ab);
    const __m256 fc = _mm256_fmadd_ps(fn, Bc, Ac);
    const __m256i ib = _mm256_cvttps_epi32(fb), ic = _mm256_cvttps_epi32(fc);
    const __m256 tb = _mm256_sub_ps(fb, _mm256_cvtepi32_ps(ib));
    const __m256 tc = _mm256_sub_ps(fc, _mm256_cvtepi32_ps(ic));
    const __m256i idx = _mm256_add_epi32(ib, _mm256_mullo_epi32(ic, scv));
    const __m128i idx_lo = _mm256_castsi256_si128(idx), idx_hi = _mm256_extracti128_si256(idx, 1);
    const __m256i mlo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(m));
    const __m256i mhi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1));
    const __m256i z = _mm256_setzero_si256();
    const long long* p0 = (const long long*)plane;
    const long long* p1 = (const long long*)(plane + sc);
    __m256 r0l, r1l, r0h, r1h;
    if (GATHER) {
      r0l = _mm256_castsi256_ps(_mm256_mask_i32gather_epi64(z, p0, idx_lo, mlo, 4));
      r1l = _mm256_castsi256_ps(_mm256_mask_i32gather_epi64(z, p1, idx_lo, mlo, 4));
      r0h = _mm256_castsi256_ps(_mm256_mask_i32gather_epi64(z, p0, idx_hi, mhi, 4));
      r1h = _mm256_castsi256_ps(_mm256_mask_i32gather_epi64(z, p1, idx_hi, mhi, 4));
    } else {
      // scalar loads (see pair_plane): masked-off lanes read the slab's first voxels, then are zeroed
      alignas(32) int ix[8];
      _mm256_store_si256((__m256i*)ix, _mm256_blendv_epi8(_mm256_set1_epi32(safe), idx, m));
      alignas(32) long long q0[8], q1[8];
      for (int g = 0; g < 8; ++g) {
        std::memcpy(&q0[g], plane + ix[g], 8);
        std::memcpy(&q1[g], plane + sc + ix[g], 8);
      }
      r0l = _mm256_castsi256_ps(_mm256_and_si256(mlo, _mm256_load_si256((const __m256i*)q0)));
      r1l = _mm256_castsi256_ps(_mm256_and_si256(mlo, _mm256_load_si256((const __m256i*)q1)));
      r0h = _mm256_castsi256_ps(_mm256_and_si256(mhi, _mm256_load_si256((const __m256i*)(q0 + 4))));
      r1h = _mm256_castsi256_ps(_mm256_and_si256(mhi, _mm256_load_si256((const __m256i*)(q1 + 4))));
    }
    const __m256 tbl = _mm256_permutevar8x32_ps(tb, dup_lo), tcl = _mm256_permutevar8x32_ps(tc, dup_lo);
    const __m256 tbh = _mm256_permutevar8x32_ps(tb, dup_hi), tch = _mm256_permutevar8x32_ps(tc, dup_hi);
    const __m256 wbl = _mm256_blend_ps(tbl, _mm256_sub_ps(one, tbl), 0x55);
    const __m256 wbh = _mm256_blend_ps(tbh, _mm256_sub_ps(one, tbh), 0x55);
    const __m256 vl = _mm256_fmadd_ps(tcl, _mm256_sub_ps(r1l, r0l), r0l);
    const __m256 vh = _mm256_fmadd_ps(tch, _mm256_sub_ps(r1h, r0h), r0h);
    acc_lo = _mm256_fmadd_ps(wbl, vl, acc_lo);
    acc_hi = _mm256_fmadd_ps(wbh, vh, acc_hi);
  }
}

template <bool GATHER>
inline void interior_sums_avx2(const float* vol, const LaneGroup& G, float* s) {
  __m256 acc_lo = _mm256_setzero_ps(), acc_hi = _mm256_setzero_ps();
  if (G.c0 < G.c1) {
    planes_avx2<true, GATHER>(vol, G, G.lo, G.c0, acc_lo, acc_hi);
    planes_avx2<false, GATHER>(vol, G, G.c0, G.c1, acc_lo, acc_hi);
    planes_avx2<true, GATHER>(vol, G, G.c1, G.hi, acc_lo, acc_hi);
  } else {
    planes_avx2<true, GATHER>(vol, G, G.lo, G.hi, acc_lo, acc_hi);
  }
  alignas(32) float a[16];
  _mm256_store_ps(a, acc_lo);
  _mm256_store_ps(a + 8, acc_hi);
  for (int g = 0; g < 8; ++g) s[g] = a[2 * g] + a[2 * g + 1];
}

#endif

// Double lanes for setup_lanes' per-lane loop, one struct per instruction set, so that the loop is written
// once (setup_lanes_simd): AVX-512 (8 lanes, compare masks in mask registers) and AVX2 with FMA (4 lanes,
// masks as all-ones lanes, masked moves as blends).  GCC leaves the scalar loop unvectorised (control flow,
// mixed types); on an AVX2 core it took about a sixth of W1's backprojection (perf, Zen 3, 1 thread).
#if defined(__AVX512F__)
struct SetupLanes512 {
  static constexpr int N = 8;
  using D = __m512d;
  using M = __mmask8;
  using F = __m256;
  static D set1(double x) { return _mm512_set1_pd(x); }
  static D load(const double* p) { return _mm512_load_pd(p); }
  static D abs(D x) { return _mm512_abs_pd(x); }
  template <int P>
  static M cmp(D x, D y) { return _mm512_cmp_pd_mask(x, y, P); }
  static M both(M a, M b) { return a & b; }
  static M all() { return (M)0xFF; }
  static M none() { return (M)0; }
  static D add(D a, D b) { return _mm512_add_pd(a, b); }
  static D sub(D a, D b) { return _mm512_sub_pd(a, b); }
  static D mul(D a, D b) { return _mm512_mul_pd(a, b); }
  static D div(D a, D b) { return _mm512_div_pd(a, b); }
  static D sqrt(D x) { return _mm512_sqrt_pd(x); }
  static D fnmadd(D a, D b, D c) { return _mm512_fnmadd_pd(a, b, c); }
  static D min(D a, D b) { return _mm512_min_pd(a, b); }
  static D max(D a, D b) { return _mm512_max_pd(a, b); }
  static D floor(D x) { return _mm512_roundscale_pd(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static F narrow(D x) { return _mm512_cvtpd_ps(x); }
  static D widen(F x) { return _mm512_cvtps_pd(x); }
  static D zero_unless(M m, D x) { return _mm512_maskz_mov_pd(m, x); }
  static D pick(M m, D if_not, D if_set) { return _mm512_mask_mov_pd(if_not, m, if_set); }
  static void store(float* p, F x) { _mm256_store_ps(p, x); }
  static void store_int(int* p, D x) { _mm256_store_si256((__m256i*)p, _mm512_cvtpd_epi32(x)); }
  static unsigned bits(M m) { return (unsigned)m; }
};
using SetupLanes = SetupLanes512;
#elif defined(CT_SIMD_LANES)
struct SetupLanes256 {
  static constexpr int N = 4;
  using D = __m256d;
  using M = __m256d;
  using F = __m128;
  static D set1(double x) { return _mm256_set1_pd(x); }
  static D load(const double* p) { return _mm256_load_pd(p); }
  static D abs(D x) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), x); }
  template <int P>
  static M cmp(D x, D y) { return _mm256_cmp_pd(x, y, P); }
  static M both(M a, M b) { return _mm256_and_pd(a, b); }
  static M all() { return _mm256_castsi256_pd(_mm256_set1_epi64x(-1)); }
  static M none() { return _mm256_setzero_pd(); }
  static D add(D a, D b) { return _mm256_add_pd(a, b); }
  static D sub(D a, D b) { return _mm256_sub_pd(a, b); }
  static D mul(D a, D b) { return _mm256_mul_pd(a, b); }
  static D div(D a, D b) { return _mm256_div_pd(a, b); }
  static D sqrt(D x) { return _mm256_sqrt_pd(x); }
  static D fnmadd(D a, D b, D c) { return _mm256_fnmadd_pd(a, b, c); }
  static D min(D a, D b) { return _mm256_min_pd(a, b); }
  static D max(D a, D b) { return _mm256_max_pd(a, b); }
  static D floor(D x) { return _mm256_floor_pd(x); }
  static F narrow(D x) { return _mm256_cvtpd_ps(x); }
  static D widen(F x) { return _mm256_cvtps_pd(x); }
  static D zero_unless(M m, D x) { return _mm256_and_pd(m, x); }
  static D pick(M m, D if_not, D if_set) { return _mm256_blendv_pd(if_not, if_set, m); }
  static void store(float* p, F x) { _mm_store_ps(p, x); }
  static void store_int(int* p, D x) { _mm_store_si128((__m128i*)p, _mm256_cvtpd_epi32(x)); }
  static unsigned bits(M m) { return (unsigned)_mm256_movemask_pd(m); }
};
using SetupLanes = SetupLanes256;
#endif

#if defined(CT_SIMD_LANES)
// setup_lanes' per-lane loop for lanes h..h+V::N-1, op for op as the scalar loop there (the comparisons and
// min/max keep its order of operands, so NaN and ties select the same side: the rays are bitwise the scalar
// loop's); the plane numbers stay in double (exact integers, |x| <= 1e8 + 2) until they are stored.
template <class V>
inline void setup_lanes_simd(const double (*fo)[16], const double (*fd)[16], const double* dd, int h, int a, int b,
                             int c, bool thin, double m, double big, int lob, int hib, int loc, int hic, int loa,
                             int hia, float* Ab, float* Bb, float* Ac, float* Bc, float* w, int* n0, int* n1, int* i0,
                             int* i1, int* ok, int* hits) {
  using D = typename V::D;
  using M = typename V::M;
  const D zero = V::set1(0.0), one = V::set1(1.0);
  const D f0 = V::abs(V::load(fd[0] + h)), f1 = V::abs(V::load(fd[1] + h)), f2 = V::abs(V::load(fd[2] + h));
  M own;
  if (a == 0) own = V::both(V::template cmp<_CMP_GE_OQ>(f0, f1), V::template cmp<_CMP_GE_OQ>(f0, f2));
  else if (a == 1) own = V::both(V::template cmp<_CMP_GT_OQ>(f1, f0), V::template cmp<_CMP_GE_OQ>(f1, f2));
  else own = V::both(V::template cmp<_CMP_GT_OQ>(f2, f0), V::template cmp<_CMP_GT_OQ>(f2, f1));
  const D fa = V::load(fd[a] + h), foa = V::load(fo[a] + h);
  const D ifa = V::div(one, fa);
  const D dBb = V::mul(V::load(fd[b] + h), ifa), dBc = V::mul(V::load(fd[c] + h), ifa);
  const D dw = V::mul(V::sqrt(V::load(dd + h)), V::abs(ifa));
  const D dAb = V::fnmadd(foa, dBb, V::load(fo[b] + h)), dAc = V::fnmadd(foa, dBc, V::load(fo[c] + h));
  const auto fAb = V::narrow(dAb), fBb = V::narrow(dBb), fAc = V::narrow(dAc), fBc = V::narrow(dBc);
  const auto fw = V::narrow(dw);
  // the float values widened back (exact), for the finite tests and restrict_planes
  const D gAb = V::widen(fAb), gBb = V::widen(fBb), gAc = V::widen(fAc), gBc = V::widen(fBc), gw = V::widen(fw);
  // finite: x - x == 0 (a float is finite iff its double widening is)
  auto finite = [&](D x) { return V::template cmp<_CMP_EQ_OQ>(V::sub(x, x), zero); };
  M fin = V::all();
  for (int q = 0; q < 3; ++q) fin = V::both(fin, V::both(finite(V::load(fo[q] + h)), finite(V::load(fd[q] + h))));
  fin = V::both(fin, V::both(V::both(finite(dAb), finite(dBb)), V::both(finite(dAc), finite(dBc))));
  fin = V::both(fin, V::both(finite(dw), V::both(finite(gAb), finite(gBb))));
  fin = V::both(fin, V::both(V::both(finite(gAc), finite(gBc)), finite(gw)));
  const M good = V::both(V::both(own, V::template cmp<_CMP_NEQ_UQ>(fa, zero)),
                         V::both(fin, V::both(V::template cmp<_CMP_NEQ_UQ>(gBb, zero),
                                              V::template cmp<_CMP_NEQ_UQ>(gBc, zero))));
  const D Ab_ = V::zero_unless(good, gAb), Bb_ = V::pick(good, one, gBb);
  const D Ac_ = V::zero_unless(good, gAc), Bc_ = V::pick(good, one, gBc);
  const D iBb = V::div(one, Bb_), iBc = V::div(one, Bc_);
  // tmax(x, y) = x > y ? x : y and tmin(x, y) = x < y ? x : y are max_pd / min_pd exactly
  auto narrow = [&](D& lo_, D& hi_, double eb0, double eb1, double ec0, double ec1) {
    D t1 = V::mul(V::sub(V::set1(eb0), Ab_), iBb), t2 = V::mul(V::sub(V::set1(eb1), Ab_), iBb);
    lo_ = V::max(lo_, V::min(t1, t2));
    hi_ = V::min(hi_, V::max(t1, t2));
    t1 = V::mul(V::sub(V::set1(ec0), Ac_), iBc);
    t2 = V::mul(V::sub(V::set1(ec1), Ac_), iBc);
    lo_ = V::max(lo_, V::min(t1, t2));
    hi_ = V::min(hi_, V::max(t1, t2));
  };
  // floor(clampd(x, -big, big)); the values are finite wherever they are used (good lanes)
  auto fl = [&](D x) { return V::floor(V::min(V::max(x, V::set1(-big)), V::set1(big))); };
  D nlo = V::set1(double(loa)), nhi = V::set1(double(hia - 1));
  narrow(nlo, nhi, double(lob - 1), double(hib), double(loc - 1), double(hic));
  M hit = V::template cmp<_CMP_LE_OQ>(nlo, V::add(nhi, one));
  const D a0 = V::max(fl(nlo), V::set1(double(loa)));
  const D a1 = V::min(V::add(fl(nhi), V::set1(2.0)), V::set1(double(hia)));
  hit = V::both(hit, V::template cmp<_CMP_LT_OQ>(a0, a1));
  D ilo = a0, ihi = V::sub(a1, one);
  narrow(ilo, ihi, double(lob) + m, double(hib - 1) - m, double(loc) + m, double(hic - 1) - m);
  const D b0 = V::max(V::sub(zero, fl(V::sub(zero, ilo))), a0);
  const D b1 = V::min(V::add(fl(ihi), one), a1);
  const M inner = thin ? V::none() : V::both(V::template cmp<_CMP_LE_OQ>(ilo, ihi), V::template cmp<_CMP_LT_OQ>(b0, b1));
  V::store(Ab + h, fAb); V::store(Bb + h, fBb); V::store(Ac + h, fAc); V::store(Bc + h, fBc); V::store(w + h, fw);
  V::store_int(n0 + h, a0);
  V::store_int(n1 + h, a1);
  V::store_int(i0 + h, V::pick(inner, a0, b0));
  V::store_int(i1 + h, V::pick(inner, a0, b1));
  const unsigned gm = V::bits(good), hm = V::bits(hit);
  for (int g = 0; g < V::N; ++g) {
    ok[h + g] = (gm >> g) & 1;
    hits[h + g] = (hm >> g) & 1;
  }
}
#endif

// Set-up of the rays of up to 16 pixels (iu[g], iv[g]) of view k at once, in
// double as make_ray, written as loops over the lanes that the compiler
// vectorises (the scalar make_ray took a quarter of the forward's time once
// the stencil ran in lanes).  It covers the common case: every lane's dominant
// axis is that of the middle lane, and no lane is parallel to a voxel plane
// (B == 0: the planar and swapped cases of make_ray_box).  Returns the lanes it
// set up: r[g] and hit[g] are then what make_ray gives (up to the rounding of
// contracted products); the caller sets up the other lanes with make_ray.
inline unsigned setup_lanes(const VolumeWindow<float>& vw, const float* src, const float* ctr, const float* ustep,
                            const float* vstep, int cone, int k, const int* iu, const int* iv, int U, int V, int n,
                            int zlo, int zhi, Ray<float>* r, bool* hit) {
  constexpr int L = 16;
  if (n <= 0 || n > L || zlo >= zhi || vw.W < 1 || vw.H < 1) return 0u;
  const double isp[3] = {1.0 / (double)vw.dx, 1.0 / (double)vw.dy, 1.0 / (double)vw.dz};
  const int nn[3] = {vw.W, vw.H, vw.D};
  alignas(64) double fo[3][L], fd[3][L], dd[L];
  alignas(64) double su[L], sv[L];
  for (int g = 0; g < L; ++g) {
    const int h = g < n ? g : 0;
    su[g] = double(iu[h]) - 0.5 * double(U - 1);
    sv[g] = double(iv[h]) - 0.5 * double(V - 1);
    dd[g] = 0.0;
  }
  for (int q = 0; q < 3; ++q) {
    const double s = (double)src[3 * k + q], c = (double)ctr[3 * k + q];
    const double us = (double)ustep[3 * k + q], vs = (double)vstep[3 * k + q];
    const double half = 0.5 * double(nn[q] - 1), is = isp[q];
#pragma omp simd
    for (int g = 0; g < L; ++g) {
      const double p = c + su[g] * us + sv[g] * vs;
      const double o = cone ? s : p, d = cone ? p - s : s;
      fo[q][g] = o * is + half;
      fd[q][g] = d * is;
      dd[g] += d * d;
    }
  }
  const int lead = (n - 1) / 2;
  const double l0 = CT_ABS(fd[0][lead]), l1 = CT_ABS(fd[1][lead]), l2 = CT_ABS(fd[2][lead]);
  int a = 0;
  if (l1 > l0) a = 1;
  if (l2 > (a == 1 ? l1 : l0)) a = 2;
  const int b = (a == 0) ? 1 : 0, c = (a == 2) ? 1 : 2;
  const int lo[3] = {0, 0, zlo}, hi[3] = {vw.W, vw.H, zhi};
  const i64 stride[3] = {1, (i64)vw.W, (i64)vw.W * vw.H};
  const double m = 1.0 / 64.0, big = 1.0e8;
  const int lob = lo[b], hib = hi[b], loc = lo[c], hic = hi[c], loa = lo[a], hia = hi[a];
  const bool thin = (hib - 1) - lob < 1 || (hic - 1) - loc < 1;  // interior_planes: window too thin
  alignas(64) float Ab[L], Bb[L], Ac[L], Bc[L], w[L];
  alignas(64) int n0[L], n1[L], i0[L], i1[L], ok[L], hits[L];
#if defined(CT_SIMD_LANES) && !defined(CT_SETUP_LANES_SCALAR)
  // GCC does not vectorise the loop below (control flow, mixed types), so the same arithmetic runs here in
  // double lanes: two halves of 8 on AVX-512, four quarters of 4 on AVX2.
  for (int h = 0; h < L; h += SetupLanes::N)
    setup_lanes_simd<SetupLanes>(fo, fd, dd, h, a, b, c, thin, m, big, lob, hib, loc, hic, loa, hia, Ab, Bb, Ac, Bc,
                                 w, n0, n1, i0, i1, ok, hits);
#else
#pragma omp simd
  for (int g = 0; g < L; ++g) {
    const double f0 = CT_ABS(fd[0][g]), f1 = CT_ABS(fd[1][g]), f2 = CT_ABS(fd[2][g]);
    // the lane's own dominant axis by make_ray's rule (the first of the largest)
    const bool own = a == 0 ? (f0 >= f1 && f0 >= f2) : (a == 1 ? (f1 > f0 && f1 >= f2) : (f2 > f0 && f2 > f1));
    const double fa = fd[a][g], foa = fo[a][g];
    const double ifa = 1.0 / fa;
    const double dBb = fd[b][g] * ifa, dBc = fd[c][g] * ifa;
    const double dw = CT_SQRT(dd[g]) * CT_ABS(ifa);
    const double dAb = fo[b][g] - foa * dBb, dAc = fo[c][g] - foa * dBc;
    const float fAb = (float)dAb, fBb = (float)dBb, fAc = (float)dAc, fBc = (float)dBc, fw = (float)dw;
    // finite: x - x == 0 is false for inf and NaN (and vectorises, unlike isfinite)
    const bool fin = (fo[0][g] - fo[0][g]) == 0.0 && (fo[1][g] - fo[1][g]) == 0.0 && (fo[2][g] - fo[2][g]) == 0.0 &&
                     (fd[0][g] - fd[0][g]) == 0.0 && (fd[1][g] - fd[1][g]) == 0.0 && (fd[2][g] - fd[2][g]) == 0.0 &&
                     (dAb - dAb) == 0.0 && (dBb - dBb) == 0.0 && (dAc - dAc) == 0.0 && (dBc - dBc) == 0.0 &&
                     (dw - dw) == 0.0 && (fAb - fAb) == 0.f && (fBb - fBb) == 0.f && (fAc - fAc) == 0.f &&
                     (fBc - fBc) == 0.f && (fw - fw) == 0.f;
    const bool good = own && fa != 0.0 && fin && fBb != 0.f && fBc != 0.f;
    // restrict_planes for b and c (B != 0 here), in double from the stored coefficients
    const double Ab_ = good ? (double)fAb : 0.0, Bb_ = good ? (double)fBb : 1.0;
    const double Ac_ = good ? (double)fAc : 0.0, Bc_ = good ? (double)fBc : 1.0;
    const double iBb = 1.0 / Bb_, iBc = 1.0 / Bc_;
    double nlo = double(loa), nhi = double(hia - 1);
    double t1 = (double(lob - 1) - Ab_) * iBb, t2 = (double(hib) - Ab_) * iBb;
    nlo = tmax(nlo, tmin(t1, t2));
    nhi = tmin(nhi, tmax(t1, t2));
    t1 = (double(loc - 1) - Ac_) * iBc;
    t2 = (double(hic) - Ac_) * iBc;
    nlo = tmax(nlo, tmin(t1, t2));
    nhi = tmin(nhi, tmax(t1, t2));
    bool h = nlo <= nhi + 1.0;
    int a0 = (int)CT_FLOOR(clampd(nlo, -big, big)), a1 = (int)CT_FLOOR(clampd(nhi, -big, big)) + 2;
    a0 = a0 > loa ? a0 : loa;
    a1 = a1 < hia ? a1 : hia;
    h = h && a0 < a1;
    // interior_planes for b (window [lob, hib - 1]) and c
    double ilo = double(a0), ihi = double(a1 - 1);
    t1 = (double(lob) + m - Ab_) * iBb;
    t2 = (double(hib - 1) - m - Ab_) * iBb;
    ilo = tmax(ilo, tmin(t1, t2));
    ihi = tmin(ihi, tmax(t1, t2));
    t1 = (double(loc) + m - Ac_) * iBc;
    t2 = (double(hic - 1) - m - Ac_) * iBc;
    ilo = tmax(ilo, tmin(t1, t2));
    ihi = tmin(ihi, tmax(t1, t2));
    int b0 = -(int)CT_FLOOR(clampd(-ilo, -big, big)), b1 = (int)CT_FLOOR(clampd(ihi, -big, big)) + 1;
    b0 = b0 > a0 ? b0 : a0;
    b1 = b1 < a1 ? b1 : a1;
    const bool inner = !thin && ilo <= ihi && b0 < b1;
    Ab[g] = fAb; Bb[g] = fBb; Ac[g] = fAc; Bc[g] = fBc; w[g] = fw;
    n0[g] = a0; n1[g] = a1;
    i0[g] = inner ? b0 : a0;
    i1[g] = inner ? b1 : a0;
    ok[g] = good ? 1 : 0;
    hits[g] = h ? 1 : 0;
  }
#endif
  unsigned done = 0;
  for (int g = 0; g < n; ++g) {
    if (!ok[g]) continue;
    done |= 1u << g;
    hit[g] = hits[g] != 0;
    Ray<float>& q = r[g];
    q.a = a; q.b = b; q.c = c;
    q.Ab = Ab[g]; q.Bb = Bb[g]; q.Ac = Ac[g]; q.Bc = Bc[g]; q.w = w[g];
    q.n0 = n0[g]; q.n1 = n1[g];
    q.lob = lob; q.hib = hib; q.loc = loc; q.hic = hic;
    q.sa = stride[a]; q.sb = stride[b]; q.sc = stride[c];
    q.offset = (i64)vw.z0 * stride[2];
    q.planar = 0; q.pc = 0;
    q.i0 = i0[g]; q.i1 = i1[g];
  }
  return done;
}

// Line integrals of n (<= kForwardLanes) rays of one row: the lanes in `part`
// (compatible with each other, traced from `vol`) in the vector loop plus their
// checked edge planes; acc[g] is set for the lanes in `part` only.
// The interior sums of a group in the lanes of `kind` (one that this build has:
// kind_compiled); 8-lane kinds take a 16-ray group in two halves.
inline void group_sums(const float* vol, const Ray<float>* r, int n, unsigned part, LaneKind kind, float* s) {
  LaneGroup G;
  if (kind == LaneKind::Avx2Gather || kind == LaneKind::Avx2Loads) {
#if defined(__AVX2__)
    for (int h = 0; h < n; h += 8) {
      load_group(r + h, std::min(8, n - h), part >> h, G);
      if (kind == LaneKind::Avx2Gather) interior_sums_avx2<true>(vol, G, s + h);
      else interior_sums_avx2<false>(vol, G, s + h);
    }
#endif
    return;
  }
#if defined(__AVX512F__)
  load_group(r, n, part, G);
  if (kind == LaneKind::Avx512Gather) interior_sums_avx512<true>(vol, G, s);
  else interior_sums_avx512<false>(vol, G, s);
#else
  (void)vol; (void)r; (void)n; (void)part; (void)s;
#endif
}

// Whether this build has the lane loop of `kind`.
inline bool kind_compiled(LaneKind kind) {
#if defined(__AVX512F__)
  if (kind == LaneKind::Avx512Gather || kind == LaneKind::Avx512Loads) return true;
#endif
#if defined(__AVX2__)
  if (kind == LaneKind::Avx2Gather || kind == LaneKind::Avx2Loads) return true;
#endif
  (void)kind;
  return false;
}

inline void trace_group(const float* vol, const Ray<float>* r, int n, unsigned part, float* acc,
                        LaneKind kind) {
#if defined(__AVX512F__) || defined(__AVX2__)
  float s[16];
  group_sums(vol, r, n, part, kind, s);
  for (int g = 0; g < n; ++g) {
    if (!((part >> g) & 1u)) continue;
    const Ray<float>& q = r[g];
    float e = s[g];
    for (int k = q.n0; k < q.i0; ++k) e += sample_checked(vol, q, k);
    for (int k = q.i1 > q.i0 ? q.i1 : q.i0; k < q.n1; ++k) e += sample_checked(vol, q, k);
    acc[g] = e * q.w;
  }
#else
  (void)vol; (void)r; (void)n; (void)part; (void)acc; (void)kind;
#endif
}

#if defined(__AVX512F__) || defined(__AVX2__)

// ---------------------------------------------------------------- fused lanes
// The -fused paths (docs/INTERNALS.md, "Forward: fused set-up and edge planes"): at N = 64 a ray has only ~64
// samples, and the scalar per-ray work around the vector loop (setup_lanes' branchy double code, the
// Ray structs and their copy into a LaneGroup, the checked edge planes ray by ray) took 59% of the
// time.  Here a row group of up to 16 pixels is set up in AVX-512 double lanes straight into
// structure-of-arrays form, and its edge planes run in lanes too (the checked stencil as four masked
// 32-bit gathers).  Same samples as make_ray / ray_forward up to float32 rounding.

// Ray coefficients of the lanes of one group, one dominant axis (structure of arrays).
struct FusedRays {
  alignas(64) float Ab[16], Bb[16], Ac[16], Bc[16], w[16];
  alignas(64) int n0[16], n1[16], i0[16], i1[16];
  unsigned traced = 0;  // lanes set up with the group's axis that touch the window
  unsigned part = 0;    // traced lanes with interior planes
  int lob = 0, hib = 0, loc = 0, hic = 0;
  i64 sa = 0, sc = 0, offset = 0;  // strides of axes a and c (b is contiguous), global -> slab index
  bool padded = false;  // the array has a zero border of one voxel: interior planes may reach it
};

// What both set-up widths start from: the other two axes of dominant axis a, inverse spacings, sizes, the
// window's bounds (z: [zlo, zhi)), and whether the group has no interior planes; R's bounds set from it.
struct FusedFrame {
  int b, c;
  double isp[3];
  int nn[3], lo[3], hi[3];
  bool thin;
  double in_b[2], in_c[2];  // the b and c ranges of interior planes (the stencil read without checks)
  double sh[3];  // added to the b and c coordinates: a padded array's (so that they stay positive), else 0
};
// The zero border of the -pad paths' copies, in voxels: the planes a lane marches (restrict_planes' conservative
// integer bounds) reach up to about 2 voxels past the window, so with 3 they are all interior planes.
#ifndef CT_FORWARD_PAD
#define CT_FORWARD_PAD 3
#endif
constexpr int kPad = CT_FORWARD_PAD;
inline FusedFrame fused_frame(const VolumeWindow<float>& vw, int a, int zlo, int zhi, FusedRays& R) {
  const int b = (a == 0) ? 1 : 0, c = (a == 2) ? 1 : 2;
  FusedFrame f{b, c, {1.0 / (double)vw.dx, 1.0 / (double)vw.dy, 1.0 / (double)vw.dz}, {vw.W, vw.H, vw.D},
               {0, 0, zlo}, {vw.W, vw.H, zhi}, false, {0, 0}, {0, 0}, {0, 0, 0}};
  if (R.padded)  // b and c in the padded array's coordinates (x + P, y + P, z - zlo + P); a stays global
    for (int q : {b, c}) {
      const int s = q == 2 ? kPad - zlo : kPad;
      f.sh[q] = double(s); f.lo[q] += s; f.hi[q] += s;
    }
  R.lob = f.lo[b]; R.hib = f.hi[b]; R.loc = f.lo[c]; R.hic = f.hi[c];
  f.thin = (R.hib - 1) - R.lob < 1 || (R.hic - 1) - R.loc < 1;  // no interior planes
  // the margin m keeps float rounding of the coefficients from reaching past the range
  const double m = 1.0 / 64.0;
  if (R.padded) {  // the zero border stands for the checked stencil's zeros: the stencil may reach kPad voxels out
    f.thin = false;
    f.in_b[0] = double(R.lob - kPad) + m; f.in_b[1] = double(R.hib - 1 + kPad) - m;
    f.in_c[0] = double(R.loc - kPad) + m; f.in_c[1] = double(R.hic - 1 + kPad) - m;
  } else {
    f.in_b[0] = double(R.lob) + m; f.in_b[1] = double(R.hib - 1) - m;
    f.in_c[0] = double(R.loc) + m; f.in_c[1] = double(R.hic - 1) - m;
  }
  return f;
}

#ifndef CT_FUSED_SPAN_SCALAR
#define CT_FUSED_SPAN_SCALAR 0
#endif
#ifndef CT_FUSED_SCALAR_TAILS  // 1: the set-up's part mask and fused_sums' final sums lane by lane (measurements)
#define CT_FUSED_SCALAR_TAILS 0
#endif
// Lanes [o, o + w) of R restricted to planes [t0, t1) (the view tiles' segments; all planes by default):
// the traced lanes with planes there, those of them whose interior meets the range, the planes marched
// [lo, hi) and the common interior [c0, c1) of the latter.
struct FusedSpan {
  unsigned traced = 0, part = 0;  // bit g: lane o + g
  int lo = 1 << 30, hi = -(1 << 30), c0 = -(1 << 30), c1 = 1 << 30;
  FusedSpan(const FusedRays& R, int o, int w, int t0, int t1) {
#if defined(__AVX512F__) && !CT_FUSED_SPAN_SCALAR
    // in mask registers (the scalar loop's branches cost about 2% at N = 64)
    const __mmask16 lanes = (__mmask16)((((1u << w) - 1u) << o) & R.traced);
    const __m512i n0 = _mm512_load_si512(R.n0), n1 = _mm512_load_si512(R.n1);
    const __m512i i0 = _mm512_load_si512(R.i0), i1 = _mm512_load_si512(R.i1);
    const __m512i v0 = _mm512_set1_epi32(t0), v1 = _mm512_set1_epi32(t1);
    const __mmask16 tr = _mm512_mask_cmpgt_epi32_mask(_mm512_mask_cmplt_epi32_mask(lanes, n0, v1), n1, v0);
    const __mmask16 pt = _mm512_mask_cmpgt_epi32_mask(
        _mm512_mask_cmplt_epi32_mask(tr & (__mmask16)R.part, i0, v1), i1, v0);
    traced = (unsigned)tr >> o;
    part = (unsigned)pt >> o;
    if (tr) { lo = _mm512_mask_reduce_min_epi32(tr, n0); hi = _mm512_mask_reduce_max_epi32(tr, n1); }
    if (pt) { c0 = _mm512_mask_reduce_max_epi32(pt, i0); c1 = _mm512_mask_reduce_min_epi32(pt, i1); }
#else
    for (int g = 0; g < w; ++g) {
      const int l = o + g;
      if (!((R.traced >> l) & 1u) || R.n0[l] >= t1 || R.n1[l] <= t0) continue;
      traced |= 1u << g;
      lo = std::min(lo, R.n0[l]); hi = std::max(hi, R.n1[l]);
      if (((R.part >> l) & 1u) && R.i0[l] < t1 && R.i1[l] > t0) {
        part |= 1u << g;
        c0 = std::max(c0, R.i0[l]); c1 = std::min(c1, R.i1[l]);
      }
    }
#endif
    lo = std::max(lo, t0); hi = std::min(hi, t1); c0 = std::max(c0, t0); c1 = std::min(c1, t1);
  }
};

#endif

#if defined(__AVX512F__)

inline __mmask8 finite_pd(__m512d x) { return _mm512_cmp_pd_mask(_mm512_sub_pd(x, x), _mm512_setzero_pd(), _CMP_EQ_OQ); }

// floor / ceil of v clamped to [-1e8, 1e8], as int32 (make_ray_box's conservative integer bounds)
inline __m256i floor_clamped(__m512d v, int mode) {
  const __m512d big = _mm512_set1_pd(1.0e8);
  v = _mm512_min_pd(_mm512_max_pd(v, _mm512_sub_pd(_mm512_setzero_pd(), big)), big);
  return _mm512_cvttpd_epi32(mode == 0 ? _mm512_roundscale_pd(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
                                       : _mm512_roundscale_pd(v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
}

// nlo = max(nlo, min(t1, t2)), nhi = min(nhi, max(t1, t2)) for t = (edge - A) * invB at edges lo, hi
inline void clip_pd(__m512d A, __m512d iB, double lo, double hi, __m512d& nlo, __m512d& nhi) {
  const __m512d t1 = _mm512_mul_pd(_mm512_sub_pd(_mm512_set1_pd(lo), A), iB);
  const __m512d t2 = _mm512_mul_pd(_mm512_sub_pd(_mm512_set1_pd(hi), A), iB);
  nlo = _mm512_max_pd(nlo, _mm512_min_pd(t1, t2));
  nhi = _mm512_min_pd(nhi, _mm512_max_pd(t1, t2));
}

// Set up the lanes `want` (bit g: pixel offsets su[g], sv[g] from the detector centre) of view k with
// dominant axis a, in double as make_ray_box: the lanes whose own dominant axis is a (make_ray's rule),
// with finite coefficients and neither B zero (else planar or parallel: make_ray's cases).  Returns those
// lanes; R.traced is the subset that touches the window [0, W) x [0, H) x [zlo, zhi).
inline unsigned fused_setup(const VolumeWindow<float>& vw, const double* geo, int cone, const double* su,
                            const double* sv, unsigned want, int a, int zlo, int zhi, FusedRays& R) {
  const auto [b, c, isp, nn, lo, hi, thin, in_b, in_c, sh] = fused_frame(vw, a, zlo, zhi, R);
  const __m512d zero = _mm512_setzero_pd(), one = _mm512_set1_pd(1.0);
  unsigned done = 0, traced = 0;
  for (int h = 0; h < 2; ++h) {
    const __mmask8 wanted = (__mmask8)(want >> (8 * h));
    if (!wanted) continue;
    const __m512d u = _mm512_loadu_pd(su + 8 * h), v = _mm512_loadu_pd(sv + 8 * h);
    __m512d fo[3], fd[3], dd = zero;
    __mmask8 fin = wanted;
    for (int q = 0; q < 3; ++q) {
      // geo: source, centre, u step, v step of the view (x, y, z each)
      const __m512d s = _mm512_set1_pd(geo[q]);
      const __m512d p = _mm512_fmadd_pd(v, _mm512_set1_pd(geo[9 + q]),
                                        _mm512_fmadd_pd(u, _mm512_set1_pd(geo[6 + q]), _mm512_set1_pd(geo[3 + q])));
      const __m512d o = cone ? s : p, d = cone ? _mm512_sub_pd(p, s) : s;
      fo[q] = _mm512_fmadd_pd(o, _mm512_set1_pd(isp[q]), _mm512_set1_pd(0.5 * double(nn[q] - 1) + sh[q]));
      fd[q] = _mm512_mul_pd(d, _mm512_set1_pd(isp[q]));
      dd = _mm512_fmadd_pd(d, d, dd);
      fin &= finite_pd(fo[q]) & finite_pd(fd[q]);
    }
    const __m512d f0 = _mm512_abs_pd(fd[0]), f1 = _mm512_abs_pd(fd[1]), f2 = _mm512_abs_pd(fd[2]);
    // the lane's own dominant axis by make_ray's rule (the first of the largest)
    __mmask8 own;
    if (a == 0) own = _mm512_cmp_pd_mask(f0, f1, _CMP_GE_OQ) & _mm512_cmp_pd_mask(f0, f2, _CMP_GE_OQ);
    else if (a == 1) own = _mm512_cmp_pd_mask(f1, f0, _CMP_GT_OQ) & _mm512_cmp_pd_mask(f1, f2, _CMP_GE_OQ);
    else own = _mm512_cmp_pd_mask(f2, f0, _CMP_GT_OQ) & _mm512_cmp_pd_mask(f2, f1, _CMP_GT_OQ);
    const __m512d fa = fd[a];
    own &= _mm512_cmp_pd_mask(fa, zero, _CMP_NEQ_OQ);
    const __m512d ifa = _mm512_div_pd(one, fa);
    const __m512d dBb = _mm512_mul_pd(fd[b], ifa), dBc = _mm512_mul_pd(fd[c], ifa);
    const __m512d dw = _mm512_mul_pd(_mm512_sqrt_pd(dd), _mm512_abs_pd(ifa));
    const __m512d dAb = _mm512_fnmadd_pd(fo[a], dBb, fo[b]), dAc = _mm512_fnmadd_pd(fo[a], dBc, fo[c]);
    const __m256 fAb = _mm512_cvtpd_ps(dAb), fBb = _mm512_cvtpd_ps(dBb), fAc = _mm512_cvtpd_ps(dAc);
    const __m256 fBc = _mm512_cvtpd_ps(dBc), fw = _mm512_cvtpd_ps(dw);
    // the stored float coefficients, back in double (an overflow to inf shows here)
    const __m512d Ab = _mm512_cvtps_pd(fAb), Bb = _mm512_cvtps_pd(fBb), Ac = _mm512_cvtps_pd(fAc);
    const __m512d Bc = _mm512_cvtps_pd(fBc), w = _mm512_cvtps_pd(fw);
    fin &= finite_pd(Ab) & finite_pd(Bb) & finite_pd(Ac) & finite_pd(Bc) & finite_pd(w);
    const __mmask8 good = own & fin & _mm512_cmp_pd_mask(Bb, zero, _CMP_NEQ_OQ) &
                          _mm512_cmp_pd_mask(Bc, zero, _CMP_NEQ_OQ);
    if (!good) continue;
    const __m512d iBb = _mm512_div_pd(one, Bb), iBc = _mm512_div_pd(one, Bc);
    // restrict_planes for b and c
    __m512d nlo = _mm512_set1_pd(double(lo[a])), nhi = _mm512_set1_pd(double(hi[a] - 1));
    clip_pd(Ab, iBb, double(R.lob - 1), double(R.hib), nlo, nhi);
    clip_pd(Ac, iBc, double(R.loc - 1), double(R.hic), nlo, nhi);
    __mmask8 hit = good & _mm512_cmp_pd_mask(nlo, _mm512_add_pd(nhi, one), _CMP_LE_OQ);
    __m256i a0 = floor_clamped(nlo, 0), a1 = _mm256_add_epi32(floor_clamped(nhi, 0), _mm256_set1_epi32(2));
    a0 = _mm256_max_epi32(a0, _mm256_set1_epi32(lo[a]));
    a1 = _mm256_min_epi32(a1, _mm256_set1_epi32(hi[a]));
    hit &= (__mmask8)_mm256_cmpgt_epi32_mask(a1, a0);
    // interior_planes for b (window [lob, hib - 1]) and c
    __m512d ilo = _mm512_cvtepi32_pd(a0), ihi = _mm512_cvtepi32_pd(_mm256_sub_epi32(a1, _mm256_set1_epi32(1)));
    clip_pd(Ab, iBb, in_b[0], in_b[1], ilo, ihi);
    clip_pd(Ac, iBc, in_c[0], in_c[1], ilo, ihi);
    __m256i b0 = _mm256_max_epi32(floor_clamped(ilo, 1), a0);
    __m256i b1 = _mm256_min_epi32(_mm256_add_epi32(floor_clamped(ihi, 0), _mm256_set1_epi32(1)), a1);
    const __mmask8 inner = thin ? (__mmask8)0
                                : (__mmask8)(_mm512_cmp_pd_mask(ilo, ihi, _CMP_LE_OQ) & _mm256_cmpgt_epi32_mask(b1, b0));
    b0 = _mm256_mask_mov_epi32(a0, inner, b0);
    b1 = _mm256_mask_mov_epi32(a0, inner, b1);
    _mm256_store_ps(R.Ab + 8 * h, fAb); _mm256_store_ps(R.Bb + 8 * h, fBb);
    _mm256_store_ps(R.Ac + 8 * h, fAc); _mm256_store_ps(R.Bc + 8 * h, fBc);
    _mm256_store_ps(R.w + 8 * h, fw);
    _mm256_store_si256((__m256i*)(R.n0 + 8 * h), a0); _mm256_store_si256((__m256i*)(R.n1 + 8 * h), a1);
    _mm256_store_si256((__m256i*)(R.i0 + 8 * h), b0); _mm256_store_si256((__m256i*)(R.i1 + 8 * h), b1);
    done |= (unsigned)good << (8 * h);
    traced |= (unsigned)hit << (8 * h);
  }
  R.traced = traced;
#if CT_FUSED_SCALAR_TAILS
  R.part = 0;
  for (int g = 0; g < 16; ++g)
    if (((traced >> g) & 1u) && R.i0[g] < R.i1[g]) R.part |= 1u << g;
#else
  // lanes not set up hold stale i0, i1: the traced mask drops them
  R.part = (unsigned)_mm512_mask_cmplt_epi32_mask((__mmask16)traced, _mm512_load_si512(R.i0), _mm512_load_si512(R.i1));
#endif
  return done;
}

// The checked stencil's constants of a FusedRays group in registers.
struct CheckedLanes {
  __m512 Ab, Bb, Ac, Bc;
  __m512i n0, n1, lob, wb, loc, wc, scv;
  i64 sc;
  explicit CheckedLanes(const FusedRays& R)
      : Ab(_mm512_load_ps(R.Ab)), Bb(_mm512_load_ps(R.Bb)), Ac(_mm512_load_ps(R.Ac)), Bc(_mm512_load_ps(R.Bc)),
        n0(_mm512_load_si512(R.n0)), n1(_mm512_load_si512(R.n1)), lob(_mm512_set1_epi32(R.lob)),
        wb(_mm512_set1_epi32(R.hib - R.lob)), loc(_mm512_set1_epi32(R.loc)), wc(_mm512_set1_epi32(R.hic - R.loc)),
        scv(_mm512_set1_epi32((int)R.sc)), sc(R.sc) {}
};

// Lanes of `lanes` whose planes [n0, n1) hold plane n.
inline __mmask16 marched_mask(const CheckedLanes& C, unsigned lanes, int n) {
  const __m512i nv = _mm512_set1_epi32(n);
  return _mm512_mask_cmplt_epi32_mask(_mm512_mask_cmple_epi32_mask((__mmask16)lanes, C.n0, nv), nv, C.n1);
}

// The lanes of `m` in plane n (at `plane`) by the checked stencil (edge planes: any coordinate, neighbours
// outside the window count zero), added to acc.
inline void checked_plane(const CheckedLanes& C, const float* plane, int n, __mmask16 m, __m512& acc) {
  const __m512i ones = _mm512_set1_epi32(1);
  const __m512 zero = _mm512_setzero_ps();
  const i64 sc = C.sc;
  const __m512 fn = _mm512_set1_ps((float)n);
  const __m512 fb = _mm512_fmadd_ps(fn, C.Bb, C.Ab), fc = _mm512_fmadd_ps(fn, C.Bc, C.Ac);
  const __m512 flb = _mm512_roundscale_ps(fb, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 flc = _mm512_roundscale_ps(fc, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512i ib = _mm512_cvttps_epi32(flb), ic = _mm512_cvttps_epi32(flc);
  const __m512 tb = _mm512_sub_ps(fb, flb), tc = _mm512_sub_ps(fc, flc);
  // index in [lo, hi) as one unsigned compare of index - lo against hi - lo
  const __m512i rb = _mm512_sub_epi32(ib, C.lob), rc = _mm512_sub_epi32(ic, C.loc);
  const __mmask16 b0 = _mm512_cmplt_epu32_mask(rb, C.wb), b1 = _mm512_cmplt_epu32_mask(_mm512_add_epi32(rb, ones), C.wb);
  const __mmask16 c0 = _mm512_cmplt_epu32_mask(rc, C.wc), c1 = _mm512_cmplt_epu32_mask(_mm512_add_epi32(rc, ones), C.wc);
  const __m512i idx = _mm512_add_epi32(ib, _mm512_mullo_epi32(ic, C.scv));
  const __m512 v00 = _mm512_mask_i32gather_ps(zero, m & b0 & c0, idx, plane, 4);
  const __m512 v10 = _mm512_mask_i32gather_ps(zero, m & b1 & c0, idx, plane + 1, 4);
  const __m512 v01 = _mm512_mask_i32gather_ps(zero, m & b0 & c1, idx, plane + sc, 4);
  const __m512 v11 = _mm512_mask_i32gather_ps(zero, m & b1 & c1, idx, plane + sc + 1, 4);
  const __m512 r0 = _mm512_fmadd_ps(tb, _mm512_sub_ps(v10, v00), v00);
  const __m512 r1 = _mm512_fmadd_ps(tb, _mm512_sub_ps(v11, v01), v01);
  acc = _mm512_mask_add_ps(acc, m, acc, _mm512_fmadd_ps(tc, _mm512_sub_ps(r1, r0), r0));
}

// checked_plane with 64-bit pair gathers (half the elements of four 32-bit gathers; the gathers' cost
// does not fall with their mask here): each lane's pair is read at b index ib clamped to [lob, hib - 2]
// (inside its row, so never outside the array) and shifted back into (ib, ib + 1) with the neighbour
// outside the row zeroed; rows c and c + 1 are read only where they lie in the window.  Needs hib - lob >= 2.
inline void checked_pair_plane(const CheckedLanes& C, const float* plane, int n, __mmask16 m, __m512& acc_lo,
                               __m512& acc_hi) {
  const __m512i ones = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
  const __m512i dup_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i dup_hi = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i odd = _mm512_set_epi32(1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  const i64 sc = C.sc;
  const __m512 fn = _mm512_set1_ps((float)n);
  const __m512 fb = _mm512_fmadd_ps(fn, C.Bb, C.Ab), fc = _mm512_fmadd_ps(fn, C.Bc, C.Ac);
  const __m512 flb = _mm512_roundscale_ps(fb, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 flc = _mm512_roundscale_ps(fc, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512i ib = _mm512_cvttps_epi32(flb), ic = _mm512_cvttps_epi32(flc);
  const __m512 tb = _mm512_sub_ps(fb, flb), tc = _mm512_sub_ps(fc, flc);
  const __m512i rb = _mm512_sub_epi32(ib, C.lob), rc = _mm512_sub_epi32(ic, C.loc);
  // lanes with a b neighbour in the window (ib in [lob - 1, hib - 1]) and their rows c, c + 1 in it
  const __mmask16 mb = m & _mm512_cmplt_epu32_mask(_mm512_add_epi32(rb, ones), _mm512_add_epi32(C.wb, ones));
  const __mmask16 c0 = mb & _mm512_cmplt_epu32_mask(rc, C.wc);
  const __mmask16 c1 = mb & _mm512_cmplt_epu32_mask(_mm512_add_epi32(rc, ones), C.wc);
  const __m512i ibc = _mm512_min_epi32(_mm512_max_epi32(ib, C.lob), _mm512_sub_epi32(_mm512_add_epi32(C.lob, C.wb),
                                                                                      _mm512_set1_epi32(2)));
  const __m512i shift = _mm512_sub_epi32(ib, ibc);  // -1, 0 or 1 for the lanes of mb
  const __m512i idx = _mm512_add_epi32(ibc, _mm512_mullo_epi32(ic, C.scv));
  const __m256i idx_lo = _mm512_castsi512_si256(idx), idx_hi = _mm512_extracti64x4_epi64(idx, 1);
  __m512 r[4];
  for (int h = 0; h < 2; ++h) {
    const __m256i ix = h ? idx_hi : idx_lo;
    const __mmask8 k0 = (__mmask8)(h ? (c0 >> 8) : c0), k1 = (__mmask8)(h ? (c1 >> 8) : c1);
    const __m512 p0 = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, k0, ix, plane, 4));
    const __m512 p1 = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, k1, ix, plane + sc, 4));
    // float j of lane g's pair comes from float j + shift of the clamped pair; none where j + shift is not 0 or 1
    const __m512i dsh = _mm512_permutexvar_epi32(h ? dup_hi : dup_lo, shift);
    const __m512i js = _mm512_add_epi32(odd, dsh);
    const __mmask16 keep = _mm512_cmplt_epu32_mask(js, _mm512_set1_epi32(2));
    const __m512i from = _mm512_add_epi32(iota, dsh);
    r[2 * h] = _mm512_maskz_permutexvar_ps(keep, from, p0);
    r[2 * h + 1] = _mm512_maskz_permutexvar_ps(keep, from, p1);
  }
  pair_accumulate(tb, tc, r[0], r[1], r[2], r[3], acc_lo, acc_hi);
}

// Planes [n_begin, n_end) of the lanes `lanes` through the checked stencil, each lane only within its
// own [n0, n1).
inline void fused_checked(const float* vol, const FusedRays& R, unsigned lanes, int n_begin, int n_end, __m512& acc) {
  if (n_begin >= n_end || !lanes) return;
  const CheckedLanes C(R);
  const i64 sa = R.sa;
  const float* plane = vol + ((i64)n_begin * sa - R.offset);
  for (int n = n_begin; n < n_end; ++n, plane += sa) {
    const __mmask16 m = marched_mask(C, lanes, n);
    if (m) checked_plane(C, plane, n, m, acc);
  }
}

#ifndef CT_FUSED_PAIRS
#define CT_FUSED_PAIRS 1
#endif
// Planes [n_begin, n_end) where the lanes' interiors differ, plane by plane: the checked stencil for
// every marching lane where some lane is at an edge plane (outside its interior, within [n0, n1)), else
// the pair loop for the lanes inside their interior.
template <bool GATHER>
inline void fused_mixed(const float* vol, const FusedRays& R, unsigned traced, const LaneGroup& G, int n_begin,
                        int n_end, __m512& acc_lo, __m512& acc_hi, __m512& acc_e) {
  if (n_begin >= n_end) return;
  const CheckedLanes C(R);
  const PairLanes L(G);
  const bool pairs_ok = CT_FUSED_PAIRS && R.hib - R.lob >= 2;
  const i64 sa = R.sa;
  const float* plane = vol + ((i64)n_begin * sa - R.offset);
  for (int n = n_begin; n < n_end; ++n, plane += sa) {
    const __mmask16 marched = marched_mask(C, traced, n);
    const __mmask16 inside = G.part ? interior_mask(L, n) : (__mmask16)0;
    if (marched & ~inside) {
      if (pairs_ok) checked_pair_plane(C, plane, n, marched, acc_lo, acc_hi);
      else checked_plane(C, plane, n, marched, acc_e);
    }
    else if (inside) pair_plane<GATHER>(L, plane, n, inside, (int)(R.offset - (i64)n * sa), acc_lo, acc_hi);
  }
}

// Line integrals (times w) of the traced lanes of R through `vol` (the slab array) into s[g]; s[g] = 0
// for the other lanes: the unchecked pair loop over the planes where every lane with interior planes is
// inside ([c0, c1)), fused_mixed plane by plane outside them, and the lanes without interior planes
// through the checked stencil.  (Checking every plane outside [c0, c1) for all lanes cost 5-10% more at
// N = 64-256: a group at the volume's side enters it lane after lane over many planes; splitting the
// planes into runs of checked and pair planes cost 10% more at N = 64 in call overhead.)
template <bool GATHER>
inline void fused_sums(const float* vol, const FusedRays& R, float* s, int t0 = INT_MIN, int t1 = INT_MAX) {
  __m512 acc_lo = _mm512_setzero_ps(), acc_hi = _mm512_setzero_ps(), acc_e = _mm512_setzero_ps();
  const FusedSpan sp(R, 0, 16, t0, t1);
  const unsigned tr = sp.traced, pt = sp.part;
  if (tr) {
    LaneGroup G;
    std::memcpy(G.Ab, R.Ab, sizeof G.Ab); std::memcpy(G.Bb, R.Bb, sizeof G.Bb);
    std::memcpy(G.Ac, R.Ac, sizeof G.Ac); std::memcpy(G.Bc, R.Bc, sizeof G.Bc);
    std::memcpy(G.i0, R.i0, sizeof G.i0); std::memcpy(G.i1, R.i1, sizeof G.i1);
    G.part = pt; G.sa = R.sa; G.sc = R.sc; G.offset = R.offset;
    if (pt && sp.c0 < sp.c1) {
      fused_mixed<GATHER>(vol, R, tr, G, sp.lo, sp.c0, acc_lo, acc_hi, acc_e);
      planes_avx512<false, GATHER>(vol, G, sp.c0, sp.c1, acc_lo, acc_hi);
      fused_checked(vol, R, tr & ~pt, sp.c0, sp.c1, acc_e);
      fused_mixed<GATHER>(vol, R, tr, G, sp.c1, sp.hi, acc_lo, acc_hi, acc_e);
    } else {
      fused_mixed<GATHER>(vol, R, tr, G, sp.lo, sp.hi, acc_lo, acc_hi, acc_e);
    }
  }
#if CT_FUSED_SCALAR_TAILS
  alignas(64) float p[32], e[16];
  _mm512_store_ps(p, acc_lo);
  _mm512_store_ps(p + 16, acc_hi);
  _mm512_store_ps(e, acc_e);
  for (int g = 0; g < 16; ++g) s[g] = ((tr >> g) & 1u) ? ((p[2 * g] + p[2 * g + 1]) + e[g]) * R.w[g] : 0.f;
#else
  // lane g's pair sum p[2g] + p[2g + 1] (pair halves: lanes 0-7 in acc_lo, 8-15 in acc_hi), then as above
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512 pair = _mm512_add_ps(_mm512_permutex2var_ps(acc_lo, even, acc_hi), _mm512_permutex2var_ps(acc_lo, odd, acc_hi));
  _mm512_storeu_ps(s, _mm512_maskz_mul_ps((__mmask16)tr, _mm512_add_ps(pair, acc_e), _mm512_load_ps(R.w)));
#endif
}

#endif

#if defined(__AVX2__)

// ---------------------------------------------------------------- fused lanes, AVX2
// The -fused set-up and edge planes of the 8-lane paths (avx2-gather-fused(-bands)): the steps of
// fused_setup / fused_sums in 4-double set-up lanes (a 16-pixel group in four chunks) and 8-float tracing
// lanes (the group in two halves), with masks as vectors (AVX2 has no mask registers).  An AVX-512 build
// has them too, so that they can be forced there (not the speed of an AVX2-only core).

// bit g: lane g of x is finite (x - x == 0 is false for inf and NaN)
inline int finite4(__m256d x) {
  return _mm256_movemask_pd(_mm256_cmp_pd(_mm256_sub_pd(x, x), _mm256_setzero_pd(), _CMP_EQ_OQ));
}
template <int P>
inline int cmp4(__m256d x, __m256d y) { return _mm256_movemask_pd(_mm256_cmp_pd(x, y, P)); }
inline __m256d abs4(__m256d x) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), x); }
inline int bits4(__m128i m) { return _mm_movemask_ps(_mm_castsi128_ps(m)); }

// floor (up: ceil) of v clamped to [-1e8, 1e8], as int32 (as floor_clamped)
inline __m128i floor_clamped4(__m256d v, bool up) {
  v = _mm256_min_pd(_mm256_max_pd(v, _mm256_set1_pd(-1.0e8)), _mm256_set1_pd(1.0e8));
  return _mm256_cvttpd_epi32(up ? _mm256_ceil_pd(v) : _mm256_floor_pd(v));
}

// clip_pd in four double lanes
inline void clip4(__m256d A, __m256d iB, double lo, double hi, __m256d& nlo, __m256d& nhi) {
  const __m256d t1 = _mm256_mul_pd(_mm256_sub_pd(_mm256_set1_pd(lo), A), iB);
  const __m256d t2 = _mm256_mul_pd(_mm256_sub_pd(_mm256_set1_pd(hi), A), iB);
  nlo = _mm256_max_pd(nlo, _mm256_min_pd(t1, t2));
  nhi = _mm256_min_pd(nhi, _mm256_max_pd(t1, t2));
}

// fused_setup in AVX2 (same lanes, same result up to float32 rounding).
inline unsigned fused_setup_avx2(const VolumeWindow<float>& vw, const double* geo, int cone, const double* su,
                                 const double* sv, unsigned want, int a, int zlo, int zhi, FusedRays& R) {
  const auto [b, c, isp, nn, lo, hi, thin, in_b, in_c, sh] = fused_frame(vw, a, zlo, zhi, R);
  const __m256d zero = _mm256_setzero_pd(), one = _mm256_set1_pd(1.0);
  const __m128i ione = _mm_set1_epi32(1), lane_bits = _mm_set_epi32(8, 4, 2, 1);
  unsigned done = 0, traced = 0;
  for (int h = 0; h < 4; ++h) {
    const int wanted = (int)((want >> (4 * h)) & 15u);
    if (!wanted) continue;
    const __m256d u = _mm256_loadu_pd(su + 4 * h), v = _mm256_loadu_pd(sv + 4 * h);
    __m256d fo[3], fd[3], dd = zero;
    int fin = wanted;
    for (int q = 0; q < 3; ++q) {
      const __m256d s = _mm256_set1_pd(geo[q]);
      const __m256d p = _mm256_fmadd_pd(v, _mm256_set1_pd(geo[9 + q]),
                                        _mm256_fmadd_pd(u, _mm256_set1_pd(geo[6 + q]), _mm256_set1_pd(geo[3 + q])));
      const __m256d o = cone ? s : p, d = cone ? _mm256_sub_pd(p, s) : s;
      fo[q] = _mm256_fmadd_pd(o, _mm256_set1_pd(isp[q]), _mm256_set1_pd(0.5 * double(nn[q] - 1) + sh[q]));
      fd[q] = _mm256_mul_pd(d, _mm256_set1_pd(isp[q]));
      dd = _mm256_fmadd_pd(d, d, dd);
      fin &= finite4(fo[q]) & finite4(fd[q]);
    }
    const __m256d f0 = abs4(fd[0]), f1 = abs4(fd[1]), f2 = abs4(fd[2]);
    int own;  // make_ray's rule: the first of the largest
    if (a == 0) own = cmp4<_CMP_GE_OQ>(f0, f1) & cmp4<_CMP_GE_OQ>(f0, f2);
    else if (a == 1) own = cmp4<_CMP_GT_OQ>(f1, f0) & cmp4<_CMP_GE_OQ>(f1, f2);
    else own = cmp4<_CMP_GT_OQ>(f2, f0) & cmp4<_CMP_GT_OQ>(f2, f1);
    const __m256d fa = fd[a];
    own &= cmp4<_CMP_NEQ_OQ>(fa, zero);
    const __m256d ifa = _mm256_div_pd(one, fa);
    const __m256d dBb = _mm256_mul_pd(fd[b], ifa), dBc = _mm256_mul_pd(fd[c], ifa);
    const __m256d dw = _mm256_mul_pd(_mm256_sqrt_pd(dd), abs4(ifa));
    const __m256d dAb = _mm256_fnmadd_pd(fo[a], dBb, fo[b]), dAc = _mm256_fnmadd_pd(fo[a], dBc, fo[c]);
    const __m128 fAb = _mm256_cvtpd_ps(dAb), fBb = _mm256_cvtpd_ps(dBb), fAc = _mm256_cvtpd_ps(dAc);
    const __m128 fBc = _mm256_cvtpd_ps(dBc), fw = _mm256_cvtpd_ps(dw);
    const __m256d Ab = _mm256_cvtps_pd(fAb), Bb = _mm256_cvtps_pd(fBb), Ac = _mm256_cvtps_pd(fAc);
    const __m256d Bc = _mm256_cvtps_pd(fBc), w = _mm256_cvtps_pd(fw);
    fin &= finite4(Ab) & finite4(Bb) & finite4(Ac) & finite4(Bc) & finite4(w);
    const int good = own & fin & cmp4<_CMP_NEQ_OQ>(Bb, zero) & cmp4<_CMP_NEQ_OQ>(Bc, zero);
    if (!good) continue;
    const __m256d iBb = _mm256_div_pd(one, Bb), iBc = _mm256_div_pd(one, Bc);
    // restrict_planes for b and c
    __m256d nlo = _mm256_set1_pd(double(lo[a])), nhi = _mm256_set1_pd(double(hi[a] - 1));
    clip4(Ab, iBb, double(R.lob - 1), double(R.hib), nlo, nhi);
    clip4(Ac, iBc, double(R.loc - 1), double(R.hic), nlo, nhi);
    int hit = good & cmp4<_CMP_LE_OQ>(nlo, _mm256_add_pd(nhi, one));
    __m128i a0 = floor_clamped4(nlo, false), a1 = _mm_add_epi32(floor_clamped4(nhi, false), _mm_set1_epi32(2));
    a0 = _mm_max_epi32(a0, _mm_set1_epi32(lo[a]));
    a1 = _mm_min_epi32(a1, _mm_set1_epi32(hi[a]));
    hit &= bits4(_mm_cmpgt_epi32(a1, a0));
    // interior_planes for b (window [lob, hib - 1]) and c
    __m256d ilo = _mm256_cvtepi32_pd(a0), ihi = _mm256_cvtepi32_pd(_mm_sub_epi32(a1, ione));
    clip4(Ab, iBb, in_b[0], in_b[1], ilo, ihi);
    clip4(Ac, iBc, in_c[0], in_c[1], ilo, ihi);
    __m128i b0 = _mm_max_epi32(floor_clamped4(ilo, true), a0);
    __m128i b1 = _mm_min_epi32(_mm_add_epi32(floor_clamped4(ihi, false), ione), a1);
    const int inner = thin ? 0 : (cmp4<_CMP_LE_OQ>(ilo, ihi) & bits4(_mm_cmpgt_epi32(b1, b0)));
    const __m128i innerv = _mm_cmpeq_epi32(_mm_and_si128(_mm_set1_epi32(inner), lane_bits), lane_bits);
    b0 = _mm_blendv_epi8(a0, b0, innerv);
    b1 = _mm_blendv_epi8(a0, b1, innerv);
    _mm_store_ps(R.Ab + 4 * h, fAb); _mm_store_ps(R.Bb + 4 * h, fBb);
    _mm_store_ps(R.Ac + 4 * h, fAc); _mm_store_ps(R.Bc + 4 * h, fBc);
    _mm_store_ps(R.w + 4 * h, fw);
    _mm_store_si128((__m128i*)(R.n0 + 4 * h), a0); _mm_store_si128((__m128i*)(R.n1 + 4 * h), a1);
    _mm_store_si128((__m128i*)(R.i0 + 4 * h), b0); _mm_store_si128((__m128i*)(R.i1 + 4 * h), b1);
    done |= (unsigned)good << (4 * h);
    traced |= (unsigned)hit << (4 * h);
  }
  R.traced = traced;
  R.part = 0;
  for (int g = 0; g < 16; ++g)
    if (((traced >> g) & 1u) && R.i0[g] < R.i1[g]) R.part |= 1u << g;
  return done;
}

// lanes of bits (bit g: lane g of 8) as an all-ones / zero vector
inline __m256i lane_mask8(unsigned bits) {
  const __m256i lb = _mm256_set_epi32(128, 64, 32, 16, 8, 4, 2, 1);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), lb), lb);
}

// The checked stencil's constants of half `o / 8` of a FusedRays group (lanes o .. o + 7); window widths
// with the sign bit flipped, for unsigned compares as signed ones.
struct CheckedLanes8 {
  __m256 Ab, Bb, Ac, Bc;
  __m256i n0, n1, lob, wbx, loc, wcx, scv;
  i64 sc;
  CheckedLanes8(const FusedRays& R, int o)
      : Ab(_mm256_load_ps(R.Ab + o)), Bb(_mm256_load_ps(R.Bb + o)), Ac(_mm256_load_ps(R.Ac + o)),
        Bc(_mm256_load_ps(R.Bc + o)), n0(_mm256_load_si256((const __m256i*)(R.n0 + o))),
        n1(_mm256_load_si256((const __m256i*)(R.n1 + o))), lob(_mm256_set1_epi32(R.lob)),
        wbx(_mm256_set1_epi32((int)((unsigned)(R.hib - R.lob) ^ 0x80000000u))), loc(_mm256_set1_epi32(R.loc)),
        wcx(_mm256_set1_epi32((int)((unsigned)(R.hic - R.loc) ^ 0x80000000u))), scv(_mm256_set1_epi32((int)R.sc)),
        sc(R.sc) {}
};

// x < w as unsigned, w given with its sign bit flipped
inline __m256i ltu8(__m256i x, __m256i wx) {
  return _mm256_cmpgt_epi32(wx, _mm256_xor_si256(x, _mm256_set1_epi32((int)0x80000000u)));
}

// Lanes of `lanes` whose planes [n0, n1) hold plane n.
inline __m256i marched_mask8(const CheckedLanes8& C, __m256i lanes, int n) {
  const __m256i nv = _mm256_set1_epi32(n);
  return _mm256_and_si256(_mm256_andnot_si256(_mm256_cmpgt_epi32(C.n0, nv), lanes), _mm256_cmpgt_epi32(C.n1, nv));
}

// checked_plane in 8 lanes: four masked 32-bit gathers, neighbours outside the window count zero.
inline void checked_plane8(const CheckedLanes8& C, const float* plane, int n, __m256i m, __m256& acc) {
  const __m256i ones = _mm256_set1_epi32(1);
  const __m256 zero = _mm256_setzero_ps();
  const i64 sc = C.sc;
  const __m256 fn = _mm256_set1_ps((float)n);
  const __m256 fb = _mm256_fmadd_ps(fn, C.Bb, C.Ab), fc = _mm256_fmadd_ps(fn, C.Bc, C.Ac);
  const __m256 flb = _mm256_floor_ps(fb), flc = _mm256_floor_ps(fc);
  const __m256i ib = _mm256_cvttps_epi32(flb), ic = _mm256_cvttps_epi32(flc);
  const __m256 tb = _mm256_sub_ps(fb, flb), tc = _mm256_sub_ps(fc, flc);
  const __m256i rb = _mm256_sub_epi32(ib, C.lob), rc = _mm256_sub_epi32(ic, C.loc);
  const __m256i b0 = ltu8(rb, C.wbx), b1 = ltu8(_mm256_add_epi32(rb, ones), C.wbx);
  const __m256i c0 = _mm256_and_si256(m, ltu8(rc, C.wcx));
  const __m256i c1 = _mm256_and_si256(m, ltu8(_mm256_add_epi32(rc, ones), C.wcx));
  const __m256i idx = _mm256_add_epi32(ib, _mm256_mullo_epi32(ic, C.scv));
  const __m256 v00 = _mm256_mask_i32gather_ps(zero, plane, idx, _mm256_castsi256_ps(_mm256_and_si256(b0, c0)), 4);
  const __m256 v10 = _mm256_mask_i32gather_ps(zero, plane + 1, idx, _mm256_castsi256_ps(_mm256_and_si256(b1, c0)), 4);
  const __m256 v01 = _mm256_mask_i32gather_ps(zero, plane + sc, idx, _mm256_castsi256_ps(_mm256_and_si256(b0, c1)), 4);
  const __m256 v11 =
      _mm256_mask_i32gather_ps(zero, plane + sc + 1, idx, _mm256_castsi256_ps(_mm256_and_si256(b1, c1)), 4);
  const __m256 r0 = _mm256_fmadd_ps(tb, _mm256_sub_ps(v10, v00), v00);
  const __m256 r1 = _mm256_fmadd_ps(tb, _mm256_sub_ps(v11, v01), v01);
  acc = _mm256_add_ps(acc, _mm256_and_ps(_mm256_castsi256_ps(m), _mm256_fmadd_ps(tc, _mm256_sub_ps(r1, r0), r0)));
}

// fused_mixed in 8 lanes: the checked stencil for every marching lane where some lane is at an edge
// plane, else the pair loop for the lanes inside their interior.
template <bool GATHER>
inline void fused_mixed8(const float* vol, const FusedRays& R, const CheckedLanes8& C, const LaneGroup& G,
                         __m256i traced, int n_begin, int n_end, __m256& acc_lo, __m256& acc_hi, __m256& acc_e) {
  const __m256i i0 = _mm256_load_si256((const __m256i*)G.i0), i1 = _mm256_load_si256((const __m256i*)G.i1);
  const __m256i part = lane_mask8(G.part);
  const i64 sa = R.sa;
  const float* plane = vol + ((i64)n_begin * sa - R.offset);
  for (int n = n_begin; n < n_end; ++n, plane += sa) {
    const __m256i nv = _mm256_set1_epi32(n);
    const __m256i marched = marched_mask8(C, traced, n);
    const __m256i inside =
        _mm256_and_si256(_mm256_andnot_si256(_mm256_cmpgt_epi32(i0, nv), part), _mm256_cmpgt_epi32(i1, nv));
    if (!_mm256_testz_si256(marched, _mm256_xor_si256(marched, inside)))
      checked_plane8(C, plane, n, marched, acc_e);
    else if (!_mm256_testz_si256(inside, inside))
      planes_avx2<true, GATHER>(vol, G, n, n + 1, acc_lo, acc_hi);
  }
}

// fused_sums in 8 lanes, the group's two halves one after the other.
template <bool GATHER>
inline void fused_sums_avx2(const float* vol, const FusedRays& R, float* s, int t0 = INT_MIN, int t1 = INT_MAX) {
  for (int o = 0; o < 16; o += 8) {
    const FusedSpan sp(R, o, 8, t0, t1);
    const unsigned tr = sp.traced, pt = sp.part;
    if (!tr) {
      for (int g = 0; g < 8; ++g) s[o + g] = 0.f;
      continue;
    }
    const int lo = sp.lo, hi = sp.hi, c0 = sp.c0, c1 = sp.c1;
    LaneGroup G;
    std::memcpy(G.Ab, R.Ab + o, 8 * sizeof(float)); std::memcpy(G.Bb, R.Bb + o, 8 * sizeof(float));
    std::memcpy(G.Ac, R.Ac + o, 8 * sizeof(float)); std::memcpy(G.Bc, R.Bc + o, 8 * sizeof(float));
    std::memcpy(G.i0, R.i0 + o, 8 * sizeof(int)); std::memcpy(G.i1, R.i1 + o, 8 * sizeof(int));
    G.part = pt; G.sa = R.sa; G.sc = R.sc; G.offset = R.offset;
    const CheckedLanes8 C(R, o);
    const __m256i trv = lane_mask8(tr);
    __m256 acc_lo = _mm256_setzero_ps(), acc_hi = _mm256_setzero_ps(), acc_e = _mm256_setzero_ps();
    if (pt && c0 < c1) {
      fused_mixed8<GATHER>(vol, R, C, G, trv, lo, c0, acc_lo, acc_hi, acc_e);
      planes_avx2<false, GATHER>(vol, G, c0, c1, acc_lo, acc_hi);
      if (tr & ~pt) {  // lanes without interior planes: checked stencil over [c0, c1)
        const __m256i rest = lane_mask8(tr & ~pt);
        const float* plane = vol + ((i64)c0 * R.sa - R.offset);
        for (int n = c0; n < c1; ++n, plane += R.sa) {
          const __m256i mk = marched_mask8(C, rest, n);
          if (!_mm256_testz_si256(mk, mk)) checked_plane8(C, plane, n, mk, acc_e);
        }
      }
      fused_mixed8<GATHER>(vol, R, C, G, trv, c1, hi, acc_lo, acc_hi, acc_e);
    } else {
      fused_mixed8<GATHER>(vol, R, C, G, trv, lo, hi, acc_lo, acc_hi, acc_e);
    }
    alignas(32) float p[16], e[8];
    _mm256_store_ps(p, acc_lo);
    _mm256_store_ps(p + 8, acc_hi);
    _mm256_store_ps(e, acc_e);
    for (int g = 0; g < 8; ++g) s[o + g] = ((tr >> g) & 1u) ? ((p[2 * g] + p[2 * g + 1]) + e[g]) * R.w[o + g] : 0.f;
  }
}

#endif

#if defined(__AVX512F__) || defined(__AVX2__)

// make_ray's dominant axis of the ray through pixel offsets (su, sv) of view geo (see fused_setup).
inline int fused_axis(const VolumeWindow<float>& vw, const double* geo, int cone, double su, double sv) {
  double f[3];
  const double sp[3] = {(double)vw.dx, (double)vw.dy, (double)vw.dz};
  for (int q = 0; q < 3; ++q) {
    const double p = geo[3 + q] + su * geo[6 + q] + sv * geo[9 + q];
    f[q] = CT_ABS((cone ? p - geo[q] : geo[q]) / sp[q]);
  }
  int a = 0;
  if (f[1] > f[a]) a = 1;
  if (f[2] > f[a]) a = 2;
  return a;
}

// The set-up of one group of cnt (<= 16) neighbouring pixels (ius[g], ivs[g]) of view k: the lanes set up
// in lanes once (one pass per dominant axis present, at most 3; pass p traces array base[p], items
// bstride[p] apart), and the lanes `left` that the lanes do not take (planar or parallel rays, a
// non-finite set-up, x-dominant rays without the swapped copy), for make_ray and ray_forward one by one.
// `swapped` is the (z, x, y) copy of the slab (nullptr: none), each item `slab` elements.
struct FusedPlan {
  FusedRays R[3];
  const float* base[3];
  i64 bstride[3];
  int passes = 0;
  unsigned left = 0;
};
// The slab (items src_stride apart, nz x H x W) into dst with a zero border of kPad voxels on every side, items
// dst_stride apart: (nz + 2P, H + 2P, W + 2P), or with swap (nz + 2P, W + 2P, H + 2P) indexed [z][x][y].
inline i64 padded_slab(int nz, int H, int W) { return (i64)(nz + 2 * kPad) * (H + 2 * kPad) * (W + 2 * kPad); }
// One plane qz (item q, padded plane z) of pad_slab's copy, x/y swapped or not.
inline void pad_plane(const float* src, i64 src_stride, int nz, int H, int W, bool swap, float* dst, i64 dst_stride,
                      i64 qz) {
  const int P = kPad, R = swap ? W + 2 * P : H + 2 * P, C = swap ? H + 2 * P : W + 2 * P;  // rows, row length
  const i64 plane = (i64)R * C;
  const int nzp = nz + 2 * P;
  const int q = (int)(qz / nzp), z = (int)(qz % nzp);
  float* d = dst + q * dst_stride + (i64)z * plane;
  std::memset(d, 0, sizeof(float) * (size_t)plane);
  if (z < P || z >= nz + P) return;
  const float* s = src + q * src_stride + (i64)(z - P) * H * W;
  if (!swap) {
    for (int y = 0; y < H; ++y) std::memcpy(d + (i64)(y + P) * C + P, s + (i64)y * W, sizeof(float) * (size_t)W);
    return;
  }
  const int t = 32;  // transposed in tiles
  for (int y0 = 0; y0 < H; y0 += t)
    for (int x0 = 0; x0 < W; x0 += t)
      for (int y = y0; y < std::min(H, y0 + t); ++y)
        for (int x = x0; x < std::min(W, x0 + t); ++x) d[(i64)(x + P) * C + (y + P)] = s[(i64)y * W + x];
}
// Both copies in one parallel region (the planes of the two alternating, so that a static split gives each
// thread as many transposed planes as straight ones): one fork and join fewer per call than one region per
// copy (no gain beyond the noise measured at N = 64, Xeon; docs/INTERNALS.md, "Forward: zero-bordered copies").
// `dst` holds the (z, y, x) copy, `dst + batch * dst_stride` the (z, x, y) one.
inline void pad_slab(const float* src, i64 src_stride, int batch, int nz, int H, int W, float* dst, i64 dst_stride,
                     int nthreads) {
  const i64 items = (i64)batch * (nz + 2 * kPad);
  float* swapped = dst + (i64)batch * dst_stride;
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (i64 i = 0; i < 2 * items; ++i) {
    const bool swap = (i & 1) != 0;
    pad_plane(src, src_stride, nz, H, W, swap, swap ? swapped : dst, dst_stride, i >> 1);
  }
}

// Zero-bordered copies of the slab (the -pad paths, pad_slab): `zyx` and `zxy` (x/y swapped), each item `slab`
// elements apart; nullptr: none.
struct PaddedSlab {
  const float* zyx = nullptr;
  const float* zxy = nullptr;
  i64 slab = 0;
};
template <bool AVX2>
inline void fused_plan(const float* vol, i64 vol_batch_stride, const float* swapped, i64 slab,
                       const VolumeWindow<float>& vw, const float* src, const float* ctr, const float* ustep,
                       const float* vstep, int cone, int k, const int* ius, const int* ivs, const DetectorWindow& dw,
                       int cnt, double* geo, double* su, double* sv, FusedPlan& P, const PaddedSlab& pad = {}) {
  for (int q = 0; q < 3; ++q) {
    geo[q] = (double)src[3 * k + q]; geo[3 + q] = (double)ctr[3 * k + q];
    geo[6 + q] = (double)ustep[3 * k + q]; geo[9 + q] = (double)vstep[3 * k + q];
  }
  for (int g = 0; g < 16; ++g) {
    const int h = g < cnt ? g : 0;
    su[g] = double(ius[h]) - 0.5 * double(dw.U - 1);
    sv[g] = double(ivs[h]) - 0.5 * double(dw.V - 1);
  }
  P.passes = 0;
  P.left = cnt >= 16 ? 0xffffu : ((1u << cnt) - 1u);  // lanes not yet set up
  int a = fused_axis(vw, geo, cone, su[(cnt - 1) / 2], sv[(cnt - 1) / 2]);
  bool tried[3] = {false, false, false};
  while (P.left && P.passes < 3 && !tried[a]) {
    tried[a] = true;
    FusedRays& R = P.R[P.passes];
    const i64 HW = (i64)vw.H * vw.W;
    R.offset = (i64)vw.z0 * HW;
    unsigned done = 0;
    R.padded = pad.zyx != nullptr;
    if (R.padded) {
      // (x, y, z) of the window at padded (x + P, y + P, z - z0 + P), the set-up's b and c coordinates
      // already shifted so (fused_frame), axis a's plane n by the offset; strides of x, y, z in the array
      const i64 W2 = vw.W + 2 * kPad, H2 = vw.H + 2 * kPad;
      const i64 st[3] = {a == 0 ? H2 : 1, a == 0 ? 1 : W2, H2 * W2};
      const int c = (a == 2) ? 1 : 2;
      R.sa = st[a];
      R.sc = st[c];
      R.offset = -(i64)(a == 2 ? kPad - vw.z0 : kPad) * st[a];
      P.base[P.passes] = a == 0 ? pad.zxy : pad.zyx;
      P.bstride[P.passes] = pad.slab;
    }
    if (R.padded || a != 0 || swapped) {
      if (!R.padded) {
        R.sa = a == 0 ? vw.H : (a == 1 ? vw.W : HW);
        R.sc = a == 2 ? vw.W : HW;
        P.base[P.passes] = a == 0 ? swapped : vol;
        P.bstride[P.passes] = a == 0 ? slab : vol_batch_stride;
      }
#if defined(__AVX512F__)
      if (!AVX2) done = fused_setup(vw, geo, cone, su, sv, P.left, a, vw.z0, vw.z1, R);
#endif
#if defined(__AVX2__)
      if (AVX2) done = fused_setup_avx2(vw, geo, cone, su, sv, P.left, a, vw.z0, vw.z1, R);
#endif
    }
    if (done) ++P.passes;
    P.left &= ~done;
    if (!P.left) break;
    // the next axis: that of the first lane left (if already tried, the lanes left go one by one)
    const int g = __builtin_ctz(P.left);
    a = fused_axis(vw, geo, cone, su[g], sv[g]);
  }
}

// Line integrals of the lanes of P.left (make_ray / ray_forward), item q, into val[g] (0 for a miss).
inline void fused_leftovers(const float* vol, i64 vol_batch_stride, const float* swapped, i64 slab, int batch,
                            const VolumeWindow<float>& vw, const float* src, const float* ctr, const float* ustep,
                            const float* vstep, int cone, int k, const int* ius, const int* ivs,
                            const DetectorWindow& dw, int cnt, unsigned left, float* val, int val_batch_stride) {
  for (int g = 0; g < cnt; ++g) {
    if (!((left >> g) & 1u)) continue;
    double o[3], d[3];
    pixel_ray(src, ctr, ustep, vstep, cone, k, ius[g], ivs[g], dw.U, dw.V, o, d);
    Ray<float> r{};
    const bool hit = make_ray(vw, o, d, vw.z0, vw.z1, r);
    const float* sbase = vol;
    i64 sstride = vol_batch_stride;
    if (hit && r.a == 0 && swapped) {
      ray_use_strides(r, (i64)vw.H, (i64)1, (i64)vw.H * vw.W);
      sbase = swapped;
      sstride = slab;
    }
    for (int q = 0; q < batch; ++q) val[q * val_batch_stride + g] = hit ? ray_forward(sbase + q * sstride, r) : 0.f;
  }
}

// fused_sums of the AVX-512 (or AVX2) lanes.
template <bool GATHER, bool AVX2>
inline void fused_trace(const float* vol, const FusedRays& R, float* s, int t0 = INT_MIN, int t1 = INT_MAX) {
#if defined(__AVX512F__)
  if (!AVX2) fused_sums<GATHER>(vol, R, s, t0, t1);
#endif
#if defined(__AVX2__)
  if (AVX2) fused_sums_avx2<GATHER>(vol, R, s, t0, t1);
#endif
}

// One group of cnt (<= 16) neighbouring pixels (ius[g], ivs[g]) of view k, all batch items: set up once
// (fused_plan), traced per item with fused_sums, the lanes left one by one (fused_leftovers).
template <bool GATHER, bool AVX2 = false>
inline void fused_group(const float* vol, i64 vol_batch_stride, const float* swapped, i64 slab, int batch,
                        const VolumeWindow<float>& vw, const float* src, const float* ctr, const float* ustep,
                        const float* vstep, int cone, int k, const int* ius, const int* ivs,
                        const DetectorWindow& dw, int cnt, float* out, i64 out_batch_stride, int accumulate,
                        const PaddedSlab& pad = {}) {
  double geo[12];
  alignas(64) double su[16], sv[16];
  FusedPlan P;
  fused_plan<AVX2>(vol, vol_batch_stride, swapped, slab, vw, src, ctr, ustep, vstep, cone, k, ius, ivs, dw, cnt, geo,
                   su, sv, P, pad);
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  for (int q = 0; q < batch; ++q) {
    alignas(64) float val[16] = {};
    for (int p = 0; p < P.passes; ++p) {
      alignas(64) float s[16];
      fused_trace<GATHER, AVX2>(P.base[p] + q * P.bstride[p], P.R[p], s);
      for (int g = 0; g < cnt; ++g)
        if ((P.R[p].traced >> g) & 1u) val[g] = s[g];
    }
    if (P.left)
      fused_leftovers(vol + q * vol_batch_stride, vol_batch_stride, swapped ? swapped + q * slab : nullptr, slab, 1,
                      vw, src, ctr, ustep, vstep, cone, k, ius, ivs, dw, cnt, P.left, val, 16);
    for (int g = 0; g < cnt; ++g) {
      const i64 oi = ((i64)k * nu + (ius[g] - dw.u0)) * nv + (ivs[g] - dw.v0);
      float& dst = out[q * out_batch_stride + oi];
      dst = accumulate ? dst + val[g] : val[g];
    }
  }
}

// ---------------------------------------------------------------- view tiles
// The -fused-tiles paths (docs/INTERNALS.md, "Forward: bands and view tiles"): beyond N ~ 256 a band's
// rays of one view touch more of the volume than the L2 holds (at N = 320 a band of 5 rows covers about
// 6 z rows of every (x, y) line: ~2.4 MiB), and the views turn the sheets by up to ~2 planes each, so each
// view fetched most of its band again from L3.  Here a band's views are taken in runs of
// CT_FORWARD_TILE_VIEWS (32); each run's groups are set up once (fused_plan, kept), then traced tile by tile of
// CT_FORWARD_TILE_PLANES planes of their dominant axis: within a tile all the run's rays touch the same
// few planes, which stay in the L2 across the run.  Each lane's value is the sum of its segments' sums
// (float32 rounding differs from -fused-bands; the same samples).
#ifndef CT_FORWARD_TILE_PLANES
#define CT_FORWARD_TILE_PLANES 0  // > 0: that many planes per tile (for measurements); 0: sized to the L2; < 0: no tiles
#endif
// Runs of 32 views, not 4 (Zen 4, 1 MiB L2, in-process A/B of builds, CPU-s medians, bitwise the
// same output): N = 320, 1 thread, 4 -> 8 -> 16 -> 32 views 1.16x, 1.06x, 1.07x faster at each step (64 within
// noise of 32); runs of 32 against 4: N = 256 1 thread 7.39 -> 6.48, N = 320 2 threads 14.6 -> 11.8, N = 192
// (tiled too) the same.  A tile's planes are read once per run, so longer runs read them fewer times; the
// run's kept groups (about 640 bytes per 16 rays: 3.3 MB at N = 320) stream past them once per tile.
#ifndef CT_FORWARD_TILE_VIEWS
#define CT_FORWARD_TILE_VIEWS 32
#endif
// Rows per band where the view tiles run: 8 (the 2 MiB rule's 5 rows at N = 320 left 5% on the table: within
// a tile more rows share each z row, and the tile bounds what the run touches; 1 thread, load 2.8-3.4:
// N = 320 933 -> 981 M samples/CPU-s, 12 rows 934).
inline int tiled_band_rows(int band, int n_outer) {
  if (CT_FORWARD_BAND_ROWS > 0) return band;
  return std::max(1, std::min(8, n_outer));
}

// Planes per tile (0: no tiles) for bands of `band` rows (forward_band_rows) over planes of `plane_bytes`,
// whose b rows (the contiguous axis the lanes' pairs lie along) are `row_bytes` long.  Tiles only where a
// band's planes (with a margin of two for the cone's spread) exceed the L2.  A tile's run then touches about
// (tiled rows + 2) b rows of each of its planes; the tile takes as many planes as fill half the L2 (the
// other half for the run's ray state, sums and what the cone's spread adds), a power of two in [16, 128]:
// 64 at N = 256-320 with the 2 MiB L2 the constant 64 was tuned on.
inline int forward_tile_planes(i64 plane_bytes, int band, i64 row_bytes, int n_outer) {
  if (CT_FORWARD_TILE_PLANES < 0 || band <= 0) return 0;
  const i64 l2 = l2_cache_bytes();
  if ((i64)(band + 2) * plane_bytes <= l2) return 0;
  if (CT_FORWARD_TILE_PLANES > 0) return CT_FORWARD_TILE_PLANES;
  const i64 per_plane = (i64)(tiled_band_rows(band, n_outer) + 2) * std::max<i64>(1, row_bytes);
  const i64 fit = l2 / (2 * per_plane);
  int tile = 16;
  while (tile < 128 && 2 * tile <= fit) tile *= 2;
  return tile;
}

// The whole forward of the -fused-tiles paths where forward_tile_planes gives tiles: work items are (band of
// `band` detector rows, run of views), taken by the threads dynamically.
template <bool GATHER, bool AVX2>
inline void fused_forward_tiled(const float* vol, i64 vol_batch_stride, const float* swapped, i64 slab, int batch,
                                const VolumeWindow<float>& vw, const float* src, const float* ctr, const float* ustep,
                                const float* vstep, int cone, const DetectorWindow& dw, bool u_inner, int band,
                                int tile, float* out, i64 out_batch_stride, int accumulate, int nthreads,
                                const PaddedSlab& pad = {}) {
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  const int n_outer = u_inner ? nv : nu, n_inner = u_inner ? nu : nv;
  const int run = std::max(1, CT_FORWARD_TILE_VIEWS);
  const int n_bands = (n_outer + band - 1) / band, n_runs = (dw.n_views + run - 1) / run;
  const int per_row = (n_inner + 15) / 16;
  const int n_planes = std::max({vw.W, vw.H, vw.z1});  // every axis' plane index n lies in [0, n_planes)
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (i64 item = 0; item < (i64)n_bands * n_runs; ++item) {
    const int k0 = (int)(item % n_runs) * run, k1 = std::min(dw.n_views, k0 + run);
    const int o0 = (int)(item / n_runs) * band, o1 = std::min(n_outer, o0 + band);
    const int ng = (k1 - k0) * (o1 - o0) * per_row;
    std::vector<FusedRays> rays;
    rays.reserve((size_t)ng + 8);
    std::vector<int> first((size_t)ng + 1, 0), lo, hi;
    std::vector<const float*> base;
    std::vector<i64> bstride;
    std::vector<float> val((size_t)batch * ng * 16, 0.f);
    const i64 vstride = (i64)ng * 16;
    // set up every group of the run once; the lanes the set-up does not take are traced whole here
    for (int gi = 0; gi < ng; ++gi) {
      const int k = k0 + gi / ((o1 - o0) * per_row), outer = o0 + (gi / per_row) % (o1 - o0);
      const int inner0 = (gi % per_row) * 16, cnt = std::min(16, n_inner - inner0);
      int ius[16], ivs[16];
      for (int g = 0; g < cnt; ++g) {
        ius[g] = dw.u0 + (u_inner ? inner0 + g : outer);
        ivs[g] = dw.v0 + (u_inner ? outer : inner0 + g);
      }
      double geo[12];
      alignas(64) double su[16], sv[16];
      FusedPlan P;
      fused_plan<AVX2>(vol, vol_batch_stride, swapped, slab, vw, src, ctr, ustep, vstep, cone, k, ius, ivs, dw, cnt,
                       geo, su, sv, P, pad);
      for (int p = 0; p < P.passes; ++p) {
        if (!P.R[p].traced) continue;
        int l = 1 << 30, h = -(1 << 30);
        for (int g = 0; g < 16; ++g)
          if ((P.R[p].traced >> g) & 1u) { l = std::min(l, P.R[p].n0[g]); h = std::max(h, P.R[p].n1[g]); }
        rays.push_back(P.R[p]);
        lo.push_back(l); hi.push_back(h);
        base.push_back(P.base[p]); bstride.push_back(P.bstride[p]);
      }
      first[gi + 1] = (int)rays.size();
      if (P.left)
        fused_leftovers(vol, vol_batch_stride, swapped, slab, batch, vw, src, ctr, ustep, vstep, cone, k, ius, ivs, dw,
                        cnt, P.left, val.data() + (i64)gi * 16, (int)vstride);
    }
    for (int t0 = 0; t0 < n_planes; t0 += tile) {
      const int t1 = std::min(n_planes, t0 + tile);
      for (int gi = 0; gi < ng; ++gi)
        for (int p = first[gi]; p < first[gi + 1]; ++p) {
          if (hi[p] <= t0 || lo[p] >= t1) continue;
          for (int q = 0; q < batch; ++q) {
            alignas(64) float s[16];
            fused_trace<GATHER, AVX2>(base[p] + q * bstride[p], rays[p], s, t0, t1);
            float* v = val.data() + q * vstride + (i64)gi * 16;
            for (int g = 0; g < 16; ++g) v[g] += s[g];  // 0 for the lanes not traced in [t0, t1)
          }
        }
    }
    for (int gi = 0; gi < ng; ++gi) {
      const int k = k0 + gi / ((o1 - o0) * per_row), outer = o0 + (gi / per_row) % (o1 - o0);
      const int inner0 = (gi % per_row) * 16, cnt = std::min(16, n_inner - inner0);
      for (int g = 0; g < cnt; ++g) {
        const int ju = u_inner ? inner0 + g : outer, jv = u_inner ? outer : inner0 + g;
        const i64 oi = ((i64)k * nu + ju) * nv + jv;
        for (int q = 0; q < batch; ++q) {
          float& dst = out[q * out_batch_stride + oi];
          const float x = val[q * vstride + (i64)gi * 16 + g];
          dst = accumulate ? dst + x : x;
        }
      }
    }
  }
}

#endif

}  // namespace fwd
}  // namespace ct
