// Host-only SIMD tracing of the CPU forward projection (float32): the rays of a
// group of neighbouring detector pixels run in the lanes of one vector, with
// their state in structure-of-arrays form, and each plane's bilinear stencil is
// fetched with gathers of 64-bit (b, b+1) pairs (the b axis is contiguous, see
// docs/INTERNALS.md "CPU kernel layout choices").
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
#include <cstring>

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

// Detector rows per band of the -bands paths: about 2 MiB (the L2 of current cores) of volume planes,
// 4 to 8 rows (1 thread, W1's geometry scaled, load 12-14: 8 rows best at N = 128-256, 4-5 at N = 320;
// 1 or 2 rows lose 10-25%, 32 rows 5-10% at N = 128).
inline int forward_band_rows(i64 plane_bytes, int n_outer) {
  const i64 target = i64(2) << 20;
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

// Planes [n_begin, n_end) of the group; MASKED: lanes are switched off outside
// their own interior (else every lane of `part` is inside it).
template <bool MASKED, bool GATHER>
inline void planes_avx512(const float* vol, const LaneGroup& G, int n_begin, int n_end, __m512& acc_lo,
                          __m512& acc_hi) {
  if (n_begin >= n_end) return;
  const __m512 Ab = _mm512_load_ps(G.Ab), Bb = _mm512_load_ps(G.Bb);
  const __m512 Ac = _mm512_load_ps(G.Ac), Bc = _mm512_load_ps(G.Bc);
  const __m512i i0 = _mm512_load_si512(G.i0), i1 = _mm512_load_si512(G.i1);
  const __m512i scv = _mm512_set1_epi32((int)G.sc);
  const __m512i dup_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i dup_hi = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512i zero = _mm512_setzero_si512();
  const __mmask16 part = (__mmask16)G.part;
  const i64 sa = G.sa, sc = G.sc;
  const float* plane = vol + ((i64)n_begin * sa - G.offset);
  for (int n = n_begin; n < n_end; ++n, plane += sa) {
    const float fnf = (float)n;
    prefetch_ahead(G, plane, n);
    const __m512 fn = _mm512_set1_ps(fnf);
    __mmask16 m = part;
    if (MASKED) {
      const __m512i nv = _mm512_set1_epi32(n);
      m = _mm512_mask_cmple_epi32_mask(m, i0, nv);
      m = _mm512_mask_cmpgt_epi32_mask(m, i1, nv);
    }
    const __m512 fb = _mm512_fmadd_ps(fn, Bb, Ab);
    const __m512 fc = _mm512_fmadd_ps(fn, Bc, Ac);
    // interior: coordinates are positive, so truncation is floor
    const __m512i ib = _mm512_cvttps_epi32(fb), ic = _mm512_cvttps_epi32(fc);
    const __m512 tb = _mm512_sub_ps(fb, _mm512_cvtepi32_ps(ib));
    const __m512 tc = _mm512_sub_ps(fc, _mm512_cvtepi32_ps(ic));
    const __m512i idx = _mm512_add_epi32(ib, _mm512_mullo_epi32(ic, scv));
    const __m256i idx_lo = _mm512_castsi512_si256(idx);
    const __m256i idx_hi = _mm512_extracti64x4_epi64(idx, 1);
    const __mmask8 mlo = (__mmask8)(m & 0xff), mhi = (__mmask8)(m >> 8);
    // (b, b+1) pairs of rows c and c+1: 8 rays per vector, ray g in floats 2g, 2g+1
    __m512 r0l, r1l, r0h, r1h;
    if (GATHER) {
      r0l = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mlo, idx_lo, plane, 4));
      r1l = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mlo, idx_lo, plane + sc, 4));
      r0h = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mhi, idx_hi, plane, 4));
      r1h = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mhi, idx_hi, plane + sc, 4));
    } else {
      // scalar loads: masked-off lanes read offset 0 of the plane (inside the
      // slab: n lies in some lane's interior) and are zeroed afterwards
      alignas(64) int ix[16];
      _mm512_store_si512(ix, _mm512_maskz_mov_epi32(m, idx));
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
  for (int n = n_begin; n < n_end; ++n, plane += sa) {
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
      // scalar loads (see planes_avx512): masked-off lanes read offset 0, then are zeroed
      alignas(32) int ix[8];
      _mm256_store_si256((__m256i*)ix, _mm256_and_si256(idx, m));
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

}  // namespace fwd
}  // namespace ct
