// The column path of the voxel-driven FDK backprojection (fdk_cpu.cpp).
//
// For a detector whose u axis and normal are horizontal (circular and helical
// orbits about z, parallel beams about z), the index matrix M of a view has no
// z terms in a = i*w and w: along a voxel column (fixed x, y) the detector
// column fi, its bilinear u weights and the magnification are constant, and
// the row index fj = (b0 + M6*iz)/w advances by a constant step.  Per
// (view, column) the u interpolation is therefore done once, into a short
// buffer c[j] = wi0*q[i0, j] + wi1*q[i0+1, j] over the v-range the column's
// z-chunk touches (zero off the detector, which is the bilinear boundary rule
// of fdk_bilinear), and the z loop is a 1D linear interpolation of c in
// SIMD lanes: several z-voxels per vector, their c[j0] and c[j0+1] taken by
// in-register permutes of a window of c (no gathers; slow on many cores).
// Views whose matrix has z terms (tilted detectors) take the general
// per-voxel stencil.  Lanes are chosen at compile time: AVX-512 (16 float /
// 8 double), AVX2 (8 float), otherwise (and for AVX2 double) the scalar z loop.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "fdk.cuh"

namespace ct {

template <typename real>
struct FdkLanes {
  static constexpr int n = 0;
};
#if defined(__AVX512F__)
template <>
struct FdkLanes<float> {
  static constexpr int n = 16;
};
template <>
struct FdkLanes<double> {
  static constexpr int n = 8;
};
#elif defined(__AVX2__)
template <>
struct FdkLanes<float> {
  static constexpr int n = 8;
};
#endif

// Lanes of the z loop in this build (0: scalar only).
template <typename real>
constexpr int fdk_lanes() {
  return FdkLanes<real>::n;
}

// The window of c a lane group reads by permutes: two vectors.
template <typename real>
constexpr int fdk_window() {
  return 2 * FdkLanes<real>::n;
}

// One view's constants of a column path call, hoisted out of the voxel loops.
struct FdkColumnView {
  double M[12];
  bool columnar;    // no z terms in a and w: the column fast path applies
  double kR = 0.0;  // cylindrical detector (cone == 2): column index per radian
};

// Scalar z loop: acc[z] += scale * lerp(c, j(z)) for z in [0, nz), j(z) = jb + dj*(zb + z);
// c holds indices [base, base + len) with zeros outside [0, V).
template <typename real>
inline void fdk_column_scalar(const real* CT_RESTRICT c, int base, int V, real jb, real dj, int zb, int nz,
                              real scale, real* CT_RESTRICT acc) {
#pragma omp simd
  for (int z = 0; z < nz; ++z) {
    // Clamp as fdk_bilinear does (shift by 2: truncation is floor on [0, V+3]).
    const real fj = tmin(tmax(jb + dj * (real)(zb + z) + real(2), real(0)), real(V + 3));
    const int j0 = (int)fj - 2;
    const real tj = fj - real(j0 + 2);
    const int o = j0 - base;
    acc[z] += scale * ((real(1) - tj) * c[o] + tj * c[o + 1]);
  }
}

#if defined(__AVX512F__)
// 16 z-voxels per vector, float.  Returns false (nothing done) when a group's
// v-span would not fit the 32-value window.
inline bool fdk_column_lanes(const float* CT_RESTRICT c, int base, int V, float jb, float dj, int zb, int nz,
                             float scale, float* CT_RESTRICT acc) {
  if (!(std::fabs(dj) * 15.0f + 3.0f < 32.0f)) return false;
  const __m512 lane = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 vdj = _mm512_set1_ps(dj), vjb = _mm512_set1_ps(jb), vs = _mm512_set1_ps(scale);
  const __m512 two = _mm512_set1_ps(2.0f), zero = _mm512_setzero_ps(), hi = _mm512_set1_ps((float)(V + 3));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i ione = _mm512_set1_epi32(1), itwo = _mm512_set1_epi32(2);
  int z = 0;
  for (; z < nz; z += 16) {
    const __mmask16 m = nz - z >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nz - z)) - 1u);
    const __m512 zf = _mm512_add_ps(_mm512_set1_ps((float)(zb + z)), lane);
    __m512 fj = _mm512_add_ps(_mm512_fmadd_ps(vdj, zf, vjb), two);
    fj = _mm512_min_ps(_mm512_max_ps(fj, zero), hi);
    const __m512i i2 = _mm512_cvttps_epi32(fj);  // floor: fj >= 0
    const __m512 tj = _mm512_sub_ps(fj, _mm512_cvtepi32_ps(i2));
    const __m512i j0 = _mm512_sub_epi32(i2, itwo);
    // The group's lowest index: lane 0 for a rising j, the last active lane for a falling one.
    // (No store and reload of j0: a scalar load from a vector store at an offset stalls forwarding.)
    const int last = std::min(nz - z, 16) - 1;
    const int g0 = dj >= 0.0f ? _mm_cvtsi128_si32(_mm512_castsi512_si128(j0))
                              : _mm_cvtsi128_si32(_mm512_castsi512_si128(
                                    _mm512_permutexvar_epi32(_mm512_set1_epi32(last), j0)));
    const __m512i idx = _mm512_sub_epi32(j0, _mm512_set1_epi32(g0));
    const float* w = c + (g0 - base);
    const __m512 c0 = _mm512_loadu_ps(w), c1 = _mm512_loadu_ps(w + 16);
    const __m512 v0 = _mm512_permutex2var_ps(c0, idx, c1);
    const __m512 v1 = _mm512_permutex2var_ps(c0, _mm512_add_epi32(idx, ione), c1);
    const __m512 val = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(one, tj), v0), _mm512_mul_ps(tj, v1));
    const __m512 a = _mm512_maskz_loadu_ps(m, acc + z);
    _mm512_mask_storeu_ps(acc + z, m, _mm512_fmadd_ps(vs, val, a));
  }
  return true;
}

// 8 z-voxels per vector, double.
inline bool fdk_column_lanes(const double* CT_RESTRICT c, int base, int V, double jb, double dj, int zb, int nz,
                             double scale, double* CT_RESTRICT acc) {
  if (!(std::fabs(dj) * 7.0 + 3.0 < 16.0)) return false;
  const __m512d lane = _mm512_setr_pd(0, 1, 2, 3, 4, 5, 6, 7);
  const __m512d vdj = _mm512_set1_pd(dj), vjb = _mm512_set1_pd(jb), vs = _mm512_set1_pd(scale);
  const __m512d two = _mm512_set1_pd(2.0), zero = _mm512_setzero_pd(), hi = _mm512_set1_pd((double)(V + 3));
  const __m512d one = _mm512_set1_pd(1.0);
  const __m256i ione = _mm256_set1_epi32(1), itwo = _mm256_set1_epi32(2);
  for (int z = 0; z < nz; z += 8) {
    const __mmask8 m = nz - z >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (nz - z)) - 1u);
    const __m512d zf = _mm512_add_pd(_mm512_set1_pd((double)(zb + z)), lane);
    __m512d fj = _mm512_add_pd(_mm512_fmadd_pd(vdj, zf, vjb), two);
    fj = _mm512_min_pd(_mm512_max_pd(fj, zero), hi);
    const __m256i i2 = _mm512_cvttpd_epi32(fj);
    const __m512d tj = _mm512_sub_pd(fj, _mm512_cvtepi32_pd(i2));
    const __m256i j0 = _mm256_sub_epi32(i2, itwo);
    const int last = std::min(nz - z, 8) - 1;
    const int g0 = dj >= 0.0 ? _mm_cvtsi128_si32(_mm256_castsi256_si128(j0))
                             : _mm_cvtsi128_si32(_mm256_castsi256_si128(
                                   _mm256_permutevar8x32_epi32(j0, _mm256_set1_epi32(last))));
    const __m256i idx = _mm256_sub_epi32(j0, _mm256_set1_epi32(g0));
    const double* w = c + (g0 - base);
    const __m512d c0 = _mm512_loadu_pd(w), c1 = _mm512_loadu_pd(w + 8);
    const __m512d v0 = _mm512_permutex2var_pd(c0, _mm512_cvtepi32_epi64(idx), c1);
    const __m512d v1 = _mm512_permutex2var_pd(c0, _mm512_cvtepi32_epi64(_mm256_add_epi32(idx, ione)), c1);
    const __m512d val = _mm512_add_pd(_mm512_mul_pd(_mm512_sub_pd(one, tj), v0), _mm512_mul_pd(tj, v1));
    const __m512d a = _mm512_maskz_loadu_pd(m, acc + z);
    _mm512_mask_storeu_pd(acc + z, m, _mm512_fmadd_pd(vs, val, a));
  }
  return true;
}
#elif defined(__AVX2__)
// 8 z-voxels per vector, float: the 16-value window as two vectors, each
// permuted within itself and blended by the index's high bit.
inline bool fdk_column_lanes(const float* CT_RESTRICT c, int base, int V, float jb, float dj, int zb, int nz,
                             float scale, float* CT_RESTRICT acc) {
  if (!(std::fabs(dj) * 7.0f + 3.0f < 16.0f)) return false;
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 vdj = _mm256_set1_ps(dj), vjb = _mm256_set1_ps(jb), vs = _mm256_set1_ps(scale);
  const __m256 two = _mm256_set1_ps(2.0f), zero = _mm256_setzero_ps(), hi = _mm256_set1_ps((float)(V + 3));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256i ione = _mm256_set1_epi32(1), itwo = _mm256_set1_epi32(2), seven = _mm256_set1_epi32(7);
  alignas(32) float tail[8];
  for (int z = 0; z < nz; z += 8) {
    const int left = std::min(nz - z, 8);
    const __m256 zf = _mm256_add_ps(_mm256_set1_ps((float)(zb + z)), lane);
    __m256 fj = _mm256_add_ps(_mm256_fmadd_ps(vdj, zf, vjb), two);
    fj = _mm256_min_ps(_mm256_max_ps(fj, zero), hi);
    const __m256i i2 = _mm256_cvttps_epi32(fj);
    const __m256 tj = _mm256_sub_ps(fj, _mm256_cvtepi32_ps(i2));
    const __m256i j0 = _mm256_sub_epi32(i2, itwo);
    const int g0 = dj >= 0.0f ? _mm_cvtsi128_si32(_mm256_castsi256_si128(j0))
                              : _mm_cvtsi128_si32(_mm256_castsi256_si128(
                                    _mm256_permutevar8x32_epi32(j0, _mm256_set1_epi32(left - 1))));
    const __m256i idx = _mm256_sub_epi32(j0, _mm256_set1_epi32(g0));
    const __m256i idx1 = _mm256_add_epi32(idx, ione);
    const float* w = c + (g0 - base);
    const __m256 c0 = _mm256_loadu_ps(w), c1 = _mm256_loadu_ps(w + 8);
    // Lanes with index >= 8 take the second vector (blendv reads the sign bit of idx - 8... use compare).
    const __m256 s0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, seven));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx1, seven));
    const __m256 v0 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(c0, idx), _mm256_permutevar8x32_ps(c1, idx), s0);
    const __m256 v1 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(c0, idx1), _mm256_permutevar8x32_ps(c1, idx1), s1);
    const __m256 val = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(one, tj), v0), _mm256_mul_ps(tj, v1));
    if (left == 8) {
      _mm256_storeu_ps(acc + z, _mm256_fmadd_ps(vs, val, _mm256_loadu_ps(acc + z)));
    } else {
      _mm256_store_ps(tail, _mm256_mul_ps(vs, val));
      for (int t = 0; t < left; ++t) acc[z + t] += tail[t];
    }
  }
  return true;
}
#endif

// No lanes for this type in this build: the caller runs the scalar z loop.
template <typename real>
inline bool fdk_column_lanes(const real*, int, int, real, real, int, int, real, real*) {
  return false;
}

// z-chunk of the column path: the accumulator of a tile is kTileX * kChunkZ reals (16 KiB in float).
constexpr int kFdkTileX = 32;
constexpr int kFdkChunkZ = 128;
constexpr double kFdkBlockBytes = 1 << 20;
constexpr int kFdkCTail = 2 * 16 + 2;  // >= the widest window (32) + 2

// One column's constants in a view (phase 1 -> phase 2 of fdk_backproject_columns).
template <typename real>
struct FdkColumn {
  int ix, lo;
  size_t offset;  // of its c in the tile's buffer
  real jb, dj, scale;
};

// The column path over the slab [vw.z0, vw.z1) and the views `views` (ok ones only).
// lanes: use the SIMD z loop where it applies (else always the scalar one).
template <typename real>
void fdk_backproject_columns(const real* q, i64 q_view_stride, int su, int sv, int U, int V,
                             const std::vector<FdkColumnView>& views, const std::vector<int>& view_ids,
                             const real* view_weight, int cone, VolumeWindow<real> vw, real* out, int accumulate,
                             bool lanes, int nthreads) {
  const int nz = vw.z1 - vw.z0, H = vw.H, W = vw.W;
  const i64 plane = (i64)H * W;
  const int ntx = (W + kFdkTileX - 1) / kFdkTileX, nzc = (nz + kFdkChunkZ - 1) / kFdkChunkZ;
  const i64 items = (i64)nzc * H * ntx;
  const int nv = (int)views.size();
  if (nv == 0) {  // no usable view: the slab is zero (or unchanged when accumulating)
    if (!accumulate) std::fill(out, out + (i64)nz * plane, real(0));
    return;
  }
  // Views per block: about kFdkBlockBytes of projections (a view's whole detector, an upper bound
  // of what the block's columns read), 16 to 32.  Each block re-reads and re-writes the slab once,
  // so at least 16 views keep that under a byte per voxel and view on any detector size.
  const double view_bytes = (double)U * V * sizeof(real);
  const int vblock = (int)std::max(16.0, std::min(32.0, (double)kFdkBlockBytes / view_bytes));
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<real> acc((size_t)kFdkTileX * kFdkChunkZ);
    // c covers j in [lo, hi) (at most V + 7 values) plus a zero tail the permute window may read.
    std::vector<real> cbuf((size_t)kFdkTileX * ((size_t)V + 7 + kFdkCTail));
    FdkColumn<real> cols[kFdkTileX];
    // View blocks outermost: a block's projections stay in the core's L2 while the thread sweeps
    // its items, instead of every item streaming all views from L3.  The static schedule gives
    // each thread the same items in every block, so no barrier is needed between blocks.
    for (int kb = 0; kb < nv; kb += vblock) {
    const int kb1 = std::min(nv, kb + vblock);
    const bool add = accumulate || kb > 0;
#pragma omp for schedule(static, 1) nowait
    for (i64 item = 0; item < items; ++item) {
      const int tx = (int)(item % ntx);
      const int iy = (int)((item / ntx) % H);
      const int zc = (int)(item / ((i64)ntx * H));
      const int x0 = tx * kFdkTileX, x1 = std::min(W, x0 + kFdkTileX);
      const int za = vw.z0 + zc * kFdkChunkZ, zlen = std::min(kFdkChunkZ, vw.z1 - za);
      std::fill(acc.begin(), acc.end(), real(0));
      for (int kk = kb; kk < kb1; ++kk) {
        const double* M = views[kk].M;
        const int k = view_ids[kk];
        const real wk = view_weight[k];
        const real* qk = q + (i64)k * q_view_stride;
        if (!views[kk].columnar) {
          // General stencil per voxel (a detector with z terms in its matrix).
          for (int ix = x0; ix < x1; ++ix) {
            real* a_ = acc.data() + (size_t)(ix - x0) * kFdkChunkZ;
            for (int z = 0; z < zlen; ++z) {
              const int iz = za + z;
              const real a = (real)(M[3] + M[0] * ix + M[1] * iy + M[2] * iz);
              const real b = (real)(M[7] + M[4] * ix + M[5] * iy + M[6] * iz);
              const real w = (real)(M[11] + M[8] * ix + M[9] * iy + M[10] * iz);
              a_[z] += wk * fdk_contribution_any(qk, su, sv, U, V, a, b, w, cone, (real)views[kk].kR);
            }
          }
          continue;
        }
        // Phase 1: per column, in double, the magnification, the u stencil, the row index start and
        // step, and c.  Phase 2 reads the c of all columns: by then their stores have left the store
        // buffer (a vector load spanning several pending stores cannot be forwarded and stalls).
        int ncol = 0;
        size_t used = 0;
        // The row's constants of a, b and w (the view's matrix at this y and z-independent).
        const double a_y = M[3] + M[1] * iy, b_y = M[7] + M[5] * iy, w_y = M[11] + M[9] * iy;
        const bool cylinder = cone == kFdkCylinder;
        for (int ix = x0; ix < x1; ++ix) {
          const double wd = cone ? w_y + M[8] * ix : 1.0;
          if (!(wd > 0.0)) continue;  // at or behind the source plane: nothing (fdk_contribution)
          // flat: the projective divide; cylinder: 1/rho, the in-plane distance to the source (fdk.cuh)
          const double ad = a_y + M[0] * ix;
          const double invd = cylinder ? 1.0 / std::sqrt(ad * ad + wd * wd) : 1.0 / wd;
          const real inv = (real)invd;
          const real fi_r = cylinder ? (real)(views[kk].kR * std::atan2(ad, wd) + 0.5 * (U - 1))
                                     : (real)(ad * invd);
          const real fi = tmin(tmax(fi_r + real(2), real(0)), real(U + 3));
          const int i0 = (int)fi - 2;
          const real ti = fi - real(i0 + 2);
          const real wi0 = ((i0 >= 0) & (i0 < U)) ? real(1) - ti : real(0);
          const real wi1 = ((i0 >= -1) & (i0 < U - 1)) ? ti : real(0);
          if (wi0 == real(0) && wi1 == real(0)) continue;  // off the detector in u
          const real* r0 = qk + (i64)tmin(tmax(i0, 0), U - 1) * su;
          const real* r1 = qk + (i64)tmin(tmax(i0 + 1, 0), U - 1) * su;
          FdkColumn<real>& col = cols[ncol];
          col.ix = ix;
          col.jb = (real)((b_y + M[4] * ix) * invd + (cylinder ? 0.5 * (V - 1) : 0.0));
          col.dj = (real)(M[6] * invd);
          col.scale = cone ? wk * (inv * inv) : wk;
          // The v-range the chunk touches, as the clamped floor indices do, plus one for j0 + 1.
          const real ja = tmin(tmax(col.jb + col.dj * (real)za + real(2), real(0)), real(V + 3));
          const real je = tmin(tmax(col.jb + col.dj * (real)(za + zlen - 1) + real(2), real(0)), real(V + 3));
          const int lo = (int)tmin(ja, je) - 2 - 1, hi = (int)tmax(ja, je) - 2 + 3;
          col.lo = lo;
          col.offset = used;
          used += (size_t)(hi - lo) + kFdkCTail;
          if (used > cbuf.size()) cbuf.resize(used + (size_t)V + 7 + kFdkCTail);
          real* CT_RESTRICT c = cbuf.data() + col.offset;
          const int va = std::max(lo, 0), ve = std::min(hi, V);
          for (int j = lo; j < std::min(va, hi); ++j) c[j - lo] = real(0);
          if (sv == 1) {
#pragma omp simd
            for (int j = va; j < ve; ++j) c[j - lo] = wi0 * r0[j] + wi1 * r1[j];
          } else {
            for (int j = va; j < ve; ++j) c[j - lo] = wi0 * r0[(i64)j * sv] + wi1 * r1[(i64)j * sv];
          }
          std::fill(c + (std::max(ve, lo) - lo), c + (hi - lo) + kFdkCTail, real(0));
          ++ncol;
        }
        for (int t = 0; t < ncol; ++t) {
          const FdkColumn<real>& col = cols[t];
          const real* c = cbuf.data() + col.offset;
          real* a_ = acc.data() + (size_t)(col.ix - x0) * kFdkChunkZ;
          if (!(lanes && fdk_column_lanes(c, col.lo, V, col.jb, col.dj, za, zlen, col.scale, a_)))
            fdk_column_scalar(c, col.lo, V, col.jb, col.dj, za, zlen, col.scale, a_);
        }
      }
      for (int z = 0; z < zlen; ++z) {
        real* o = out + (i64)(za + z - vw.z0) * plane + (i64)iy * W;
        if (add) {
          for (int ix = x0; ix < x1; ++ix) o[ix] += acc[(size_t)(ix - x0) * kFdkChunkZ + z];
        } else {
          for (int ix = x0; ix < x1; ++ix) o[ix] = acc[(size_t)(ix - x0) * kFdkChunkZ + z];
        }
      }
    }
    }
  }
}

}  // namespace ct
