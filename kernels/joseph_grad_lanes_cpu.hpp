// Host-only SIMD geometry VJP (float32): the rays of a group of neighbouring
// detector pixels run in the lanes of one vector, as in the forward
// (joseph_forward_cpu.hpp: the same set-up, lane groups and 64-bit gathers of
// the (b, b+1) pairs of rows c and c+1).  Per plane a lane adds the five sums of
// RaySums (joseph_grad.cuh) for its ray; edge planes of each lane go through
// the checked scalar stencil_terms, interior planes through the vector loop.
//
// In pair layout (floats 2g, 2g+1 of ray g hold the b and b+1 neighbours),
// with v = (1 - xc) * row_c + xc * row_c+1 and wb = (1 - xb, xb):
//   s = sum wb * v,   db = v[1] - v[0],   dc = sum wb * (row_c+1 - row_c),
// so five pair accumulators (v, t*v, wb*v, wb*dc, t*wb*dc, t = n - n_ref with
// n_ref the group's first interior plane, small in float) give all five sums;
// t * sums are moved to n - fo_a afterwards (tb = tb_rel + (n_ref - fo_a) * hb).
#pragma once

#include "joseph_forward_cpu.hpp"
#include "joseph_grad.cuh"

namespace ct {
namespace gradl {

constexpr int kGradLanes = fwd::kForwardLanes;

// Interior sums of the lanes of a group, t relative to G.lo.
struct LaneSums {
  float s[16], hb[16], tb[16], hc[16], tc[16];
};

#if defined(__AVX512F__)

template <bool MASKED>
inline void planes_avx512(const float* vol, const fwd::LaneGroup& G, int n_begin, int n_end, __m512* A) {
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
  __m512 v_l = A[0], tv_l = A[1], s_l = A[2], c_l = A[3], tcc_l = A[4];
  __m512 v_h = A[5], tv_h = A[6], s_h = A[7], c_h = A[8], tcc_h = A[9];
  const float* plane = vol + ((i64)n_begin * sa - G.offset);
  for (int n = n_begin; n < n_end; ++n, plane += sa) {
    const __m512 fn = _mm512_set1_ps((float)n);
    const __m512 t = _mm512_set1_ps((float)(n - G.lo));
    __mmask16 m = part;
    if (MASKED) {
      const __m512i nv = _mm512_set1_epi32(n);
      m = _mm512_mask_cmple_epi32_mask(m, i0, nv);
      m = _mm512_mask_cmpgt_epi32_mask(m, i1, nv);
    }
    const __m512 fb = _mm512_fmadd_ps(fn, Bb, Ab);
    const __m512 fc = _mm512_fmadd_ps(fn, Bc, Ac);
    const __m512i ib = _mm512_cvttps_epi32(fb), ic = _mm512_cvttps_epi32(fc);
    const __m512 xb = _mm512_sub_ps(fb, _mm512_cvtepi32_ps(ib));
    const __m512 xc = _mm512_sub_ps(fc, _mm512_cvtepi32_ps(ic));
    const __m512i idx = _mm512_add_epi32(ib, _mm512_mullo_epi32(ic, scv));
    const __m256i idx_lo = _mm512_castsi512_si256(idx);
    const __m256i idx_hi = _mm512_extracti64x4_epi64(idx, 1);
    const __mmask8 mlo = (__mmask8)(m & 0xff), mhi = (__mmask8)(m >> 8);
    const __m512 r0l = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mlo, idx_lo, plane, 4));
    const __m512 r1l = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mlo, idx_lo, plane + sc, 4));
    const __m512 r0h = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mhi, idx_hi, plane, 4));
    const __m512 r1h = _mm512_castsi512_ps(_mm512_mask_i32gather_epi64(zero, mhi, idx_hi, plane + sc, 4));
    const __m512 xbl = _mm512_permutexvar_ps(dup_lo, xb), xcl = _mm512_permutexvar_ps(dup_lo, xc);
    const __m512 xbh = _mm512_permutexvar_ps(dup_hi, xb), xch = _mm512_permutexvar_ps(dup_hi, xc);
    const __m512 wbl = _mm512_mask_sub_ps(xbl, 0x5555, one, xbl);
    const __m512 wbh = _mm512_mask_sub_ps(xbh, 0x5555, one, xbh);
    const __m512 dl = _mm512_sub_ps(r1l, r0l), dh = _mm512_sub_ps(r1h, r0h);
    const __m512 vl = _mm512_fmadd_ps(xcl, dl, r0l);
    const __m512 vh = _mm512_fmadd_ps(xch, dh, r0h);
    const __m512 wdl = _mm512_mul_ps(wbl, dl), wdh = _mm512_mul_ps(wbh, dh);
    v_l = _mm512_add_ps(v_l, vl); v_h = _mm512_add_ps(v_h, vh);
    tv_l = _mm512_fmadd_ps(t, vl, tv_l); tv_h = _mm512_fmadd_ps(t, vh, tv_h);
    s_l = _mm512_fmadd_ps(wbl, vl, s_l); s_h = _mm512_fmadd_ps(wbh, vh, s_h);
    c_l = _mm512_add_ps(c_l, wdl); c_h = _mm512_add_ps(c_h, wdh);
    tcc_l = _mm512_fmadd_ps(t, wdl, tcc_l); tcc_h = _mm512_fmadd_ps(t, wdh, tcc_h);
  }
  A[0] = v_l; A[1] = tv_l; A[2] = s_l; A[3] = c_l; A[4] = tcc_l;
  A[5] = v_h; A[6] = tv_h; A[7] = s_h; A[8] = c_h; A[9] = tcc_h;
}

inline void interior_sums(const float* vol, const fwd::LaneGroup& G, LaneSums& S) {
  __m512 A[10];
  for (auto& x : A) x = _mm512_setzero_ps();
  if (G.c0 < G.c1) {
    planes_avx512<true>(vol, G, G.lo, G.c0, A);
    planes_avx512<false>(vol, G, G.c0, G.c1, A);
    planes_avx512<true>(vol, G, G.c1, G.hi, A);
  } else {
    planes_avx512<true>(vol, G, G.lo, G.hi, A);
  }
  alignas(64) float a[5][32];
  for (int j = 0; j < 5; ++j) {
    _mm512_store_ps(a[j], A[j]);
    _mm512_store_ps(a[j] + 16, A[5 + j]);
  }
  for (int g = 0; g < 16; ++g) {
    S.hb[g] = a[0][2 * g + 1] - a[0][2 * g];
    S.tb[g] = a[1][2 * g + 1] - a[1][2 * g];
    S.s[g] = a[2][2 * g] + a[2][2 * g + 1];
    S.hc[g] = a[3][2 * g] + a[3][2 * g + 1];
    S.tc[g] = a[4][2 * g] + a[4][2 * g + 1];
  }
}

#elif defined(__AVX2__)

template <bool MASKED>
inline void planes_avx2(const float* vol, const fwd::LaneGroup& G, int n_begin, int n_end, __m256* A) {
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
  __m256 v_l = A[0], tv_l = A[1], s_l = A[2], c_l = A[3], tcc_l = A[4];
  __m256 v_h = A[5], tv_h = A[6], s_h = A[7], c_h = A[8], tcc_h = A[9];
  const float* plane = vol + ((i64)n_begin * sa - G.offset);
  for (int n = n_begin; n < n_end; ++n, plane += sa) {
    const __m256 fn = _mm256_set1_ps((float)n);
    const __m256 t = _mm256_set1_ps((float)(n - G.lo));
    __m256i m = part;
    if (MASKED) {
      const __m256i nv = _mm256_set1_epi32(n);
      m = _mm256_andnot_si256(_mm256_cmpgt_epi32(i0, nv), m);
      m = _mm256_and_si256(_mm256_cmpgt_epi32(i1, nv), m);
    }
    const __m256 fb = _mm256_fmadd_ps(fn, Bb, Ab);
    const __m256 fc = _mm256_fmadd_ps(fn, Bc, Ac);
    const __m256i ib = _mm256_cvttps_epi32(fb), ic = _mm256_cvttps_epi32(fc);
    const __m256 xb = _mm256_sub_ps(fb, _mm256_cvtepi32_ps(ib));
    const __m256 xc = _mm256_sub_ps(fc, _mm256_cvtepi32_ps(ic));
    const __m256i idx = _mm256_add_epi32(ib, _mm256_mullo_epi32(ic, scv));
    const __m128i idx_lo = _mm256_castsi256_si128(idx), idx_hi = _mm256_extracti128_si256(idx, 1);
    const __m256i mlo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(m));
    const __m256i mhi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1));
    const __m256i z = _mm256_setzero_si256();
    const long long* p0 = (const long long*)plane;
    const long long* p1 = (const long long*)(plane + sc);
    const __m256 r0l = _mm256_castsi256_ps(_mm256_mask_i32gather_epi64(z, p0, idx_lo, mlo, 4));
    const __m256 r1l = _mm256_castsi256_ps(_mm256_mask_i32gather_epi64(z, p1, idx_lo, mlo, 4));
    const __m256 r0h = _mm256_castsi256_ps(_mm256_mask_i32gather_epi64(z, p0, idx_hi, mhi, 4));
    const __m256 r1h = _mm256_castsi256_ps(_mm256_mask_i32gather_epi64(z, p1, idx_hi, mhi, 4));
    const __m256 xbl = _mm256_permutevar8x32_ps(xb, dup_lo), xcl = _mm256_permutevar8x32_ps(xc, dup_lo);
    const __m256 xbh = _mm256_permutevar8x32_ps(xb, dup_hi), xch = _mm256_permutevar8x32_ps(xc, dup_hi);
    const __m256 wbl = _mm256_blend_ps(xbl, _mm256_sub_ps(one, xbl), 0x55);
    const __m256 wbh = _mm256_blend_ps(xbh, _mm256_sub_ps(one, xbh), 0x55);
    const __m256 dl = _mm256_sub_ps(r1l, r0l), dh = _mm256_sub_ps(r1h, r0h);
    const __m256 vl = _mm256_fmadd_ps(xcl, dl, r0l);
    const __m256 vh = _mm256_fmadd_ps(xch, dh, r0h);
    const __m256 wdl = _mm256_mul_ps(wbl, dl), wdh = _mm256_mul_ps(wbh, dh);
    v_l = _mm256_add_ps(v_l, vl); v_h = _mm256_add_ps(v_h, vh);
    tv_l = _mm256_fmadd_ps(t, vl, tv_l); tv_h = _mm256_fmadd_ps(t, vh, tv_h);
    s_l = _mm256_fmadd_ps(wbl, vl, s_l); s_h = _mm256_fmadd_ps(wbh, vh, s_h);
    c_l = _mm256_add_ps(c_l, wdl); c_h = _mm256_add_ps(c_h, wdh);
    tcc_l = _mm256_fmadd_ps(t, wdl, tcc_l); tcc_h = _mm256_fmadd_ps(t, wdh, tcc_h);
  }
  A[0] = v_l; A[1] = tv_l; A[2] = s_l; A[3] = c_l; A[4] = tcc_l;
  A[5] = v_h; A[6] = tv_h; A[7] = s_h; A[8] = c_h; A[9] = tcc_h;
}

inline void interior_sums(const float* vol, const fwd::LaneGroup& G, LaneSums& S) {
  __m256 A[10];
  for (auto& x : A) x = _mm256_setzero_ps();
  if (G.c0 < G.c1) {
    planes_avx2<true>(vol, G, G.lo, G.c0, A);
    planes_avx2<false>(vol, G, G.c0, G.c1, A);
    planes_avx2<true>(vol, G, G.c1, G.hi, A);
  } else {
    planes_avx2<true>(vol, G, G.lo, G.hi, A);
  }
  alignas(32) float a[5][16];
  for (int j = 0; j < 5; ++j) {
    _mm256_store_ps(a[j], A[j]);
    _mm256_store_ps(a[j] + 8, A[5 + j]);
  }
  for (int g = 0; g < 8; ++g) {
    S.hb[g] = a[0][2 * g + 1] - a[0][2 * g];
    S.tb[g] = a[1][2 * g + 1] - a[1][2 * g];
    S.s[g] = a[2][2 * g] + a[2][2 * g + 1];
    S.hc[g] = a[3][2 * g] + a[3][2 * g + 1];
    S.tc[g] = a[4][2 * g] + a[4][2 * g + 1];
  }
}

#endif

// Adds y[g] * (the five sums of ray r[g]) to acc[g] for the lanes in `part`
// (compatible with each other, traced from vol): the vector loop over their
// interiors plus their checked edge planes.  fo_a[g]: as origin_voxel_coord.
inline void group_sums(const float* vol, const Ray<float>* r, int n, unsigned part, const double* fo_a,
                       const float* y, RaySums<float>* acc) {
#if defined(__AVX512F__) || defined(__AVX2__)
  fwd::LaneGroup G;
  fwd::load_group(r, n, part, G);
  LaneSums S;
  interior_sums(vol, G, S);
  for (int g = 0; g < n; ++g) {
    if (!((part >> g) & 1u)) continue;
    const Ray<float>& q = r[g];
    float s = 0.f, hb = 0.f, tb = 0.f, hc = 0.f, tc = 0.f;
    if (q.i0 < q.i1) {
      const float shift = (float)(double(G.lo) - fo_a[g]);
      s = S.s[g]; hb = S.hb[g]; hc = S.hc[g];
      tb = S.tb[g] + shift * S.hb[g];
      tc = S.tc[g] + shift * S.hc[g];
    }
    for (int k = q.n0; k < q.i0; ++k) {
      const float fb = q.Ab + float(k) * q.Bb, fc = q.Ac + float(k) * q.Bc;
      const float flb = CT_FLOOR(fb), flc = CT_FLOOR(fc);
      stencil_terms(vol, q, k, (int)flb, (int)flc, fb - flb, fc - flc, false, fo_a[g], s, hb, tb, hc, tc);
    }
    for (int k = q.i1 > q.i0 ? q.i1 : q.i0; k < q.n1; ++k) {
      const float fb = q.Ab + float(k) * q.Bb, fc = q.Ac + float(k) * q.Bc;
      const float flb = CT_FLOOR(fb), flc = CT_FLOOR(fc);
      stencil_terms(vol, q, k, (int)flb, (int)flc, fb - flb, fc - flc, false, fo_a[g], s, hb, tb, hc, tc);
    }
    const float w = y[g];
    acc[g].s += w * s; acc[g].hb += w * hb; acc[g].tb += w * tb; acc[g].hc += w * hc; acc[g].tc += w * tc;
  }
#else
  (void)vol; (void)r; (void)n; (void)part; (void)fo_a; (void)y; (void)acc;
#endif
}

}  // namespace gradl
}  // namespace ct
