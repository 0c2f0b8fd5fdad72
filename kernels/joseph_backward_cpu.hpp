// CPU backprojection of the Joseph family: the exact transpose of the forward
// in joseph_cpu.cpp, with the same per-ray set-up (joseph.cuh).  Threads own
// z-chunks of the output, or parts of the detector rows scattered into
// accumulators of their own (RowSplit); no atomics.  float32: rays are set up 16 at a time
// by the forward's vectorised fwd::setup_lanes, and a sample's four voxels are
// updated as two (b, b+1) pairs, x-dominant rays going into an x/y-swapped
// accumulator so that b is contiguous for every ray.  See docs/INTERNALS.md,
// "Backprojection layout".
#pragma once
#include <omp.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include <type_traits>

#include "cpu_helpers.hpp"
#include "joseph.cuh"
#include "joseph_forward_cpu.hpp"

namespace ct {

// The interior planes of a ray are scattered in blocks of kScatterBlock: first
// the stencils of all planes of the block (offsets and four weights) in a loop
// without stores, which the compiler vectorises, then the read-modify-writes,
// which are all that is left in the scalar loop.  A ray touches each voxel at
// most once (one plane per sample, four distinct neighbours per plane), so
// splitting the work this way does not change the order of the additions into
// any voxel.
// Run-time options of the backprojection (its paths, joseph_cpu.cpp):
// pairs: float32 samples as two (b, b+1) pair updates, with the x/y-swapped
// accumulator for x-dominant rays (SSE2 builds); else four scalar updates.
// block_bytes > 0: each thread walks its z-chunk in sub-chunks of about that
// many bytes of output (all views per sub-chunk), so that the read-modify-
// writes of a view stay in the core's L2 instead of sweeping the whole chunk;
// rays crossing several sub-chunks are set up once per sub-chunk.
// rows: with pairs, each row's pair on its own (block_scatter_rows).
// padded: rays into private accumulators with padded rows (see padded_length).
// seamless: with block_bytes, a sample belongs to the sub-chunk holding the
// lower z row of its stencil and is scattered whole there (see ZOwnership).
// depth_div > 0: with block_bytes, a sub-chunk has at least max(H, W) /
// depth_div planes (rounded up).  Byte-sized sub-chunks of large planes are
// thin (4 MiB is 10 planes at N = 320) while a cone ray's z travel grows with
// the volume's width, so the rays of the outer detector rows cross ever more
// sub-chunks and are set up once in each (the reading the measurements fit:
// N = 320 ran 18% faster with 20-plane sub-chunks, Xeon, 1 thread; docs/INTERNALS.md,
// "The path table").
// simd: with pairs, the stencils by block_stencils_simd (AVX-512 builds, AVX2 with FMA); else ignored.
// dup: with padded and seamless, float32 accumulators of z-row pair slots (DupLayout).
// band_rows > 0: each (sub-)chunk's detector rows in bands of that many rows, every view per band
// (band, view, row order), so that the accumulator rows a band's rays touch stay in cache across the
// views instead of the whole chunk streaming through once per view.
// row_split: with padded and band_rows, several threads split the detector rows (whole bands) instead
// of the slab's z-chunks, each into private accumulators of only the z rows its rays can touch
// (RowSplit), summed plane by plane in thread order after the join.  A circular cone scan's rows
// below the source's plane send their rays below it, so the parts overlap by a plane or two, and no
// ray is clipped by a chunk edge (the central rows' nearly level rays ran whole through the checked
// edge stencil there, set up in both chunks).
// tile_planes > 0 (with band_rows, padded), where a band's accumulator planes (R + 2 of them) exceed
// back_tile_min_band_bytes (2 MiB, or the L2 where larger): view tiles.  A band's views are taken in runs of tile_views, each run's rays set up once and
// kept, then scattered tile by tile of tile_planes planes of their dominant axis, so that within a tile
// the run's rays touch the same few planes, which stay in the L2 across the run (the forward's
// -fused-tiles, fwd::fused_forward_tiled, for the back).  tile_planes is the tile depth for an L2 of 1 MiB
// or more, scaled down below that (back_tile_planes).  A voxel lies in one tile of its rays' axis,
// so its additions keep their order (bitwise the untiled result where no ray is z-dominant).
struct BackOptions {
  bool pairs = true;
  i64 block_bytes = 0;
  bool rows = false;
  bool padded = false;
  bool seamless = false;
  int depth_div = 0;
  bool simd = false;
  bool dup = false;
  int band_rows = 0;
  bool row_split = false;
  int tile_planes = 0;
  int tile_views = 0;
};

// DupLayout: accumulator plane ("slot") z holds rows z and z + 1 side by side: voxel (x, y) of slot z
// is the pair (row z, row z + 1), rows of 2 W (or 2 H) floats.  A sample whose stencil's lower z row
// is c then updates 16 contiguous bytes of slot c: (b, c), (b, c+1), (b+1, c), (b+1, c+1), one
// read-modify-write on one cache line (two lines for one sample of eight) instead of two 64-bit ones
// on lines a plane apart.  Any single voxel (edge planes, z-dominant and planar rays) is written as
// the first half of its own row's slot.  Output row z = first halves of slot z + second halves of
// slot z - 1.  The slots double the accumulators, so they are taken only while a slot plane is at
// most kDupMaxSlotPlane bytes: a band's slots then stay in cache (W1's planes, 128 KiB slots: 0.57
// against 0.60 CPU-s for pairs-padded-b8; N = 192, 288 KiB: 2.31 against 2.12 s, N = 256: 5.9 against
// 5.2 s, 1 thread, Xeon; docs/INTERNALS.md "Back: bands and pair slots").  Measured again on a 1 MiB L2
// (Zen 4), where the same limit fits: N = 128 0.54 against 0.57 CPU-s without slots, N = 192 with
// slots 2.41 against 2.12, so it is no share of the L2 (which would halve it there and drop N = 128's).
constexpr i64 kDupMaxSlotPlane = i64(192) << 10;

// Where the view tiles (BackOptions::tile_planes) start and how deep they are, measured on two L2 sizes
// (ct::l2_cache_bytes; in-process A/B, 1 thread, CPU-s; docs/INTERNALS.md "Back: view tiles"):
// - Zen 4, 1 MiB L2: N = 192 (band planes 1.5 MiB) 2.5 tiled against 2.1 untiled, N = 256
//   (2.5 MiB) 5.4 against 5.3, N = 320 (3.9 MiB) 10.9 (64 planes) against 12.2 (128) and 13.2 untiled.
// - Xeon, 2 MiB L2: N = 192 1.80 tiled (128 planes) against 1.75; N = 256 4.08 (128 planes) and 4.04 (64)
//   against 4.63 untiled; N = 320 8.36 (64 planes) against 8.79 (128) and 9.61 (32).
// So tiles start above 2 MiB of band planes, or above the L2 where that is larger (the Xeon's slower L3 makes
// the untiled passes cost more there than on Zen 4, where N = 256 is about even), and 64 planes deep on both
// L2 sizes: a tile's set-up per ray (about 50 cycles) is what shallower tiles lose, more L2 traffic what
// deeper ones lose.  Below 1 MiB of L2 (not measured) the depth keeps Zen 4's share of it, at least 16.
constexpr i64 kTileMinBandBytes = i64(2) << 20;
inline i64 back_tile_min_band_bytes() { return std::max(kTileMinBandBytes, (i64)l2_cache_bytes()); }
// the view tiles' depth in planes: BackOptions::tile_planes where the L2 holds 1 MiB or more, else in
// proportion to the L2, at least 16
inline int back_tile_planes(int planes) {
  const i64 l2 = l2_cache_bytes();
  return l2 >= (i64(1) << 20) ? planes : (int)std::max<i64>(16, (i64)planes * l2 / (i64(1) << 20));
}

// How scatter_ray spreads a ray: the pair options, and which samples it owns.
// A thread's sub-chunks [zlo, zhi) all lie in its own z-chunk, so a sample
// whose stencil straddles two of them may write both: each sample is scattered
// whole by the sub-chunk holding the lower z row of its stencil (z in [lo, hi);
// the ray set up against [zlo, zhi + 1) so that row zhi is inside its window).
// Without this the straddling samples ran through the checked edge stencil in
// both sub-chunks (20% of all samples at N = 320 with 4 MiB sub-chunks).
// lo = INT_MIN, hi = INT_MAX: every sample of the ray's window.
struct ZOwnership {
  int lo, hi;
};
struct ScatterMode {
  bool pairs, rows;
  ZOwnership own;
  bool simd = false;  // pair stencils by block_stencils_simd where the build has it
  bool dup = false;   // the accumulators hold z-row pair slots (DupLayout)
};

// The lower z row of sample n's stencil (z plane n for z-dominant rays), by
// the arithmetic of edge_stencil (joseph.cuh).  Interior samples of a window
// [zlo, zhi + 1) have it in [zlo, zhi) with margin (interior_planes), so only
// edge samples and z-dominant rays need the test.
template <typename real>
inline int z_row(const Ray<real>& r, int n) {
  if (r.a == 2) return n;
  if (r.c == 2) return r.planar ? r.pc : (int)CT_FLOOR(r.Ac + real(n) * r.Bc);
  return (int)CT_FLOOR(r.Ab + real(n) * r.Bb);  // b is z (a planar ray whose axes were swapped)
}

constexpr int kScatterBlock = 64;  // 16 and 32 were 12% and 5% slower (W1, 1 thread)
constexpr int kStencilLanes = 16;  // the vectorised loop's trip count

template <typename real>
struct ScatterBlock {
  alignas(64) unsigned off[kScatterBlock];  // voxel index relative to the block's first plane (mod 2^32)
  alignas(64) real w[4][kScatterBlock];     // value * weight of (b, c), (b+1, c), (b, c+1), (b+1, c+1)
  alignas(64) real w4[kScatterBlock][4];    // the same, sample by sample (pair path, b contiguous)
};

// Stencils of planes n .. n + m - 1 (m <= kScatterBlock), computed in groups of
// kStencilLanes planes (lanes past m are computed and never dereferenced).  The
// arithmetic is the forward's (ray_forward) term by term.  Offsets wrap modulo
// 2^32, exact for slabs of fewer than 2^31 voxels (the caller checks).
template <bool AOS, typename real, bool DUP = false>
inline void block_stencils(const Ray<real>& r, int n, int m, real v, ScatterBlock<real>& s) {
  const unsigned sa = (unsigned)r.sa, sb = (unsigned)r.sb, sc = (unsigned)r.sc;
  const real Ab = r.Ab, Bb = r.Bb, Ac = r.Ac, Bc = r.Bc;
  for (int j0 = 0; j0 < m; j0 += kStencilLanes) {
    for (int l = 0; l < kStencilLanes; ++l) {
      const int j = j0 + l;
      const real fn = real(n + j);
      const real fb = Ab + fn * Bb;
      const real fc = Ac + fn * Bc;
      const int ib = (int)fb, ic = (int)fc;  // interior: positive, truncation is floor
      const real tb = fb - real(ib), tc = fc - real(ic);
      s.off[j] = (unsigned)j * sa + (unsigned)ib * sb + (unsigned)ic * sc;
      const real vb = (real(1) - tc) * v, vc = tc * v;
      const real w0 = (real(1) - tb) * vb, w1 = tb * vb, w2 = (real(1) - tb) * vc, w3 = tb * vc;
      if (DUP) {  // the order of the voxels in a z-row-pair accumulator: (b, c), (b, c+1), (b+1, c), (b+1, c+1)
        s.w4[j][0] = w0; s.w4[j][1] = w2; s.w4[j][2] = w1; s.w4[j][3] = w3;
      } else if (AOS) {
        s.w4[j][0] = w0; s.w4[j][1] = w1; s.w4[j][2] = w2; s.w4[j][3] = w3;
      } else {
        s.w[0][j] = w0; s.w[1][j] = w1; s.w[2][j] = w2; s.w[3][j] = w3;
      }
    }
  }
}

// block_stencils<true> (the pair path: sb == 1, float32) written out in SIMD lanes, once for both instruction
// sets (block_stencils_simd, with one struct of lane operations per set): the same terms, with fb and fc as
// fused multiply-adds (as GCC contracts the scalar form: W1 bitwise the same), and the four weights of the
// lanes' planes transposed to sample order straight into w4 (StencilLanes*::store_samples).  GCC vectorised
// the scalar loop in 8-lane halves with a permute per weight and sample.  Alone it did not shorten W1 beyond
// the noise (the pair loop waits on memory and hides the stencils); the pair-slot paths need it (their scalar
// stencils were 1.7x slower: on Zen 3, W1, 1 thread, dup-padded-rs-b8 ran 0.725 against 0.82 CPU-s for
// pairs-padded-rs-b8 once it had them, docs/INTERNALS.md "Back: bands and pair slots").  Lanes past m
// are computed and never dereferenced.
// DUP: the z-row-pair layout (sb == 2, weights in DupLayout's order).
#if defined(__AVX512F__)
// 16 lanes; the transpose: eight two-source permutes per 16 samples
struct StencilLanes512 {
  static constexpr int N = 16;
  using F = __m512;
  using I = __m512i;
  static F iota() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  static I iotai() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static I set1i(int x) { return _mm512_set1_epi32(x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static I trunc(F x) { return _mm512_cvttps_epi32(x); }
  static F to_float(I x) { return _mm512_cvtepi32_ps(x); }
  static I addi(I a, I b) { return _mm512_add_epi32(a, b); }
  static I mulloi(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static void store(unsigned* p, I x) { _mm512_store_si512((void*)p, x); }
  // samples j = 0..15 as w[4 j .. 4 j + 3] = (p0, p1, p2, p3)[j]
  static void store_samples(float* w, F p0, F p1, F p2, F p3) {
    // (p0, p1) pairs of samples 0-7 / 8-15, then 64-bit (pair) picks of samples 0-3, 4-7 (of each half)
    const __m512i pair_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i pair_hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512i quad_lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
    const __m512i quad_hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    const __m512d a_lo = _mm512_castps_pd(_mm512_permutex2var_ps(p0, pair_lo, p1));
    const __m512d a_hi = _mm512_castps_pd(_mm512_permutex2var_ps(p0, pair_hi, p1));
    const __m512d c_lo = _mm512_castps_pd(_mm512_permutex2var_ps(p2, pair_lo, p3));
    const __m512d c_hi = _mm512_castps_pd(_mm512_permutex2var_ps(p2, pair_hi, p3));
    _mm512_store_pd((double*)w, _mm512_permutex2var_pd(a_lo, quad_lo, c_lo));
    _mm512_store_pd((double*)(w + 16), _mm512_permutex2var_pd(a_lo, quad_hi, c_lo));
    _mm512_store_pd((double*)(w + 32), _mm512_permutex2var_pd(a_hi, quad_lo, c_hi));
    _mm512_store_pd((double*)(w + 48), _mm512_permutex2var_pd(a_hi, quad_hi, c_hi));
  }
};
using StencilLanes = StencilLanes512;
#elif defined(CT_SIMD_LANES)
// 8 lanes; the transpose: two unpack stages within 128-bit lanes and one lane exchange per two samples
struct StencilLanes256 {
  static constexpr int N = 8;
  using F = __m256;
  using I = __m256i;
  static F iota() { return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7); }
  static I iotai() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static I set1i(int x) { return _mm256_set1_epi32(x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static I trunc(F x) { return _mm256_cvttps_epi32(x); }
  static F to_float(I x) { return _mm256_cvtepi32_ps(x); }
  static I addi(I a, I b) { return _mm256_add_epi32(a, b); }
  static I mulloi(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static void store(unsigned* p, I x) { _mm256_store_si256((__m256i*)p, x); }
  static void store_samples(float* w, F p0, F p1, F p2, F p3) {
    const __m256d t0 = _mm256_castps_pd(_mm256_unpacklo_ps(p0, p1));  // pairs of samples 0, 1 | 4, 5
    const __m256d t1 = _mm256_castps_pd(_mm256_unpackhi_ps(p0, p1));  // 2, 3 | 6, 7
    const __m256d t2 = _mm256_castps_pd(_mm256_unpacklo_ps(p2, p3));
    const __m256d t3 = _mm256_castps_pd(_mm256_unpackhi_ps(p2, p3));
    const __m256 u0 = _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t2));  // sample 0 | sample 4
    const __m256 u1 = _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t2));  // 1 | 5
    const __m256 u2 = _mm256_castpd_ps(_mm256_unpacklo_pd(t1, t3));  // 2 | 6
    const __m256 u3 = _mm256_castpd_ps(_mm256_unpackhi_pd(t1, t3));  // 3 | 7
    _mm256_store_ps(w, _mm256_permute2f128_ps(u0, u1, 0x20));
    _mm256_store_ps(w + 8, _mm256_permute2f128_ps(u2, u3, 0x20));
    _mm256_store_ps(w + 16, _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm256_store_ps(w + 24, _mm256_permute2f128_ps(u2, u3, 0x31));
  }
};
using StencilLanes = StencilLanes256;
#endif

#if defined(CT_SIMD_LANES)
template <bool DUP = false, class V = StencilLanes>
inline void block_stencils_simd(const Ray<float>& r, int n, int m, float v, ScatterBlock<float>& s) {
  static_assert(kScatterBlock % V::N == 0, "a block is a whole number of lane groups");
  const auto iota = V::iota();
  const auto Ab = V::set1(r.Ab), Bb = V::set1(r.Bb), Ac = V::set1(r.Ac), Bc = V::set1(r.Bc), vv = V::set1(v);
  const auto one = V::set1(1.0f);
  // offsets modulo 2^32 as in block_stencils (32-bit lane products wrap the same way)
  const auto sc = V::set1i((int)(unsigned)r.sc);
  const auto saN = V::set1i((int)((unsigned)r.sa * (unsigned)V::N));
  auto jsa = V::mulloi(V::iotai(), V::set1i((int)(unsigned)r.sa));
  for (int j0 = 0; j0 < m; j0 += V::N) {
    const auto fn = V::add(V::set1((float)(n + j0)), iota);
    const auto fb = V::fmadd(fn, Bb, Ab), fc = V::fmadd(fn, Bc, Ac);
    const auto ib = V::trunc(fb), ic = V::trunc(fc);  // interior: truncation is floor
    const auto tb = V::sub(fb, V::to_float(ib)), tc = V::sub(fc, V::to_float(ic));
    const auto bo = DUP ? V::addi(ib, ib) : ib;
    V::store(s.off + j0, V::addi(V::addi(jsa, bo), V::mulloi(ic, sc)));
    jsa = V::addi(jsa, saN);
    const auto vb = V::mul(V::sub(one, tc), vv), vc = V::mul(tc, vv);
    const auto ub = V::sub(one, tb);
    const auto w0 = V::mul(ub, vb), w1 = V::mul(tb, vb), w2 = V::mul(ub, vc), w3 = V::mul(tb, vc);
    // pairs (w0, w1) and (w2, w3); DUP: (w0, w2) and (w1, w3)
    V::store_samples(&s.w4[j0][0], w0, DUP ? w2 : w1, DUP ? w1 : w2, w3);
  }
}
#endif

// The read-modify-writes of the first m planes of a block.
template <typename real>
inline void block_scatter(real* CT_RESTRICT plane, i64 sb, i64 sc, const ScatterBlock<real>& s, int m) {
#pragma GCC unroll 4
  for (int j = 0; j < m; ++j) {
    real* p = plane + (i64)(int)s.off[j];
    const real x0 = p[0], x1 = p[sb], x2 = p[sc], x3 = p[sb + sc];
    p[0] = x0 + s.w[0][j];
    p[sb] = x1 + s.w[1][j];
    p[sc] = x2 + s.w[2][j];
    p[sb + sc] = x3 + s.w[3][j];
  }
}

#if defined(__SSE2__)
constexpr bool kPairScatter = true;
#else
constexpr bool kPairScatter = false;
#endif

#if defined(__SSE2__)
// b contiguous (sb == 1), float32: the four voxels of a sample are two pairs,
// (b, b+1) of rows c and c+1; one 128-bit add updates them (same additions).
inline void block_scatter_pairs(float* CT_RESTRICT plane, i64 sc, const ScatterBlock<float>& s, int m) {
#pragma GCC unroll 4
  for (int j = 0; j < m; ++j) {
    float* p = plane + (i64)(int)s.off[j];
    const __m128d lo = _mm_load_sd((const double*)p);
    const __m128 x = _mm_castpd_ps(_mm_loadh_pd(lo, (const double*)(p + sc)));
    const __m128 y = _mm_add_ps(x, _mm_load_ps(s.w4[j]));
    _mm_storel_pd((double*)p, _mm_castps_pd(y));
    _mm_storeh_pd((double*)(p + sc), _mm_castps_pd(y));
  }
}
// The z-row-pair layout (DupLayout): a sample's four voxels are 16 contiguous bytes, one unaligned
// 128-bit read-modify-write on one cache line (two in one sample of eight) instead of two 64-bit
// ones on two lines.
inline void block_scatter_dup(float* CT_RESTRICT plane, const ScatterBlock<float>& s, int m) {
#pragma GCC unroll 4
  for (int j = 0; j < m; ++j) {
    float* p = plane + (i64)(int)s.off[j];
    _mm_storeu_ps(p, _mm_add_ps(_mm_loadu_ps(p), _mm_load_ps(s.w4[j])));
  }
}
// The same updates with each row's pair read, added and written on its own
// (64-bit loads and stores): no shuffle uops for the high halves, which
// compete with the stencil arithmetic for the shuffle port on some cores.
inline void block_scatter_rows(float* CT_RESTRICT plane, i64 sc, const ScatterBlock<float>& s, int m) {
#pragma GCC unroll 4
  for (int j = 0; j < m; ++j) {
    float* p = plane + (i64)(int)s.off[j];
    const __m128 w = _mm_load_ps(s.w4[j]);
    const __m128 x0 = _mm_castpd_ps(_mm_load_sd((const double*)p));
    const __m128 x1 = _mm_castpd_ps(_mm_load_sd((const double*)(p + sc)));
    _mm_store_sd((double*)p, _mm_castps_pd(_mm_add_ps(x0, w)));
    _mm_store_sd((double*)(p + sc), _mm_castps_pd(_mm_add_ps(x1, _mm_movehl_ps(w, w))));
  }
}
#endif

// Spread value * w along one ray into a slab array of fewer than 2^31 voxels:
// checked edge planes, interior planes in blocks.  The same additions, in the
// same order per voxel, as ray_backward<real, false> (joseph.cuh); the weights
// may differ from it in the last bit where the compiler contracts the
// vectorised arithmetic differently (W1: 3e-7 relative, a float32 rounding).
template <typename real>
// t0, t1: only the planes [t0, t1) of the ray (a view tile's part of it, BackOptions::tile_planes).
inline void scatter_ray(real* CT_RESTRICT vol, const Ray<real>& r, real value, const ScatterMode& mode,
                        int t0 = INT_MIN, int t1 = INT_MAX) {
  const real v = value * r.w;
  const bool pairs = mode.pairs, rows = mode.rows;
  const int zlo = mode.own.lo, zhi = mode.own.hi;
  const bool all = zlo == INT_MIN && zhi == INT_MAX;
  int i0 = r.i0, i1 = r.i1;
  if (!all) {
    if (r.planar && r.c == 2 && (r.pc < zlo || r.pc >= zhi)) return;  // its one z row is another's
    if (r.a == 2) { i0 = std::max(i0, zlo); i1 = std::max(i0, std::min(i1, zhi)); }
  }
  const int n0 = std::max(r.n0, t0), n1 = std::min(r.n1, t1);  // the edge planes' range
  const int e0 = std::min(i0, n1);
  for (int n = n0; n < e0; ++n)
    if (all || (z_row(r, n) >= zlo && z_row(r, n) < zhi)) scatter_checked<real, false>(vol, r, n, v);
  const int tail = std::max(std::max(i1, i0), n0);  // the first plane after the interior ones
  i0 = std::max(i0, t0);
  i1 = std::min(i1, t1);
  const i64 sa = r.sa, sb = r.sb, sc = r.sc;
  if (r.planar) {
    real* plane = vol + ((i64)r.pc * sc + (i64)i0 * sa - r.offset);
    for (int n = i0; n < i1; ++n, plane += sa) {
      const real fb = r.Ab + real(n) * r.Bb;
      const int ib = (int)fb;
      const real tb = fb - real(ib);
      real* p = plane + (i64)ib * sb;
      const real x0 = p[0], x1 = p[sb];
      p[0] = x0 + (real(1) - tb) * v;
      p[sb] = x1 + tb * v;
    }
  } else {
    ScatterBlock<real> s;
    for (int n = i0; n < i1; n += kScatterBlock) {
      const int m = std::min(kScatterBlock, i1 - n);
#if defined(__SSE2__)
      if constexpr (std::is_same<real, float>::value) {
        if (mode.dup && sb == 2 && r.c == 2) {
#if defined(CT_SIMD_LANES)
          if (mode.simd) block_stencils_simd<true>(r, n, m, v, s);
          else
#endif
            block_stencils<true, float, true>(r, n, m, v, s);
          block_scatter_dup(vol + ((i64)n * sa - r.offset), s, m);
          continue;
        }
        if (sb == 1 && pairs) {
#if defined(CT_SIMD_LANES)
          if (mode.simd) block_stencils_simd(r, n, m, v, s);
          else
#endif
            block_stencils<true>(r, n, m, v, s);
          if (rows) block_scatter_rows(vol + ((i64)n * sa - r.offset), sc, s, m);
          else block_scatter_pairs(vol + ((i64)n * sa - r.offset), sc, s, m);
          continue;
        }
      }
#endif
      block_stencils<false>(r, n, m, v, s);
      block_scatter(vol + ((i64)n * sa - r.offset), sb, sc, s, m);
    }
  }
  for (int n = tail; n < n1; ++n)
    if (all || (z_row(r, n) >= zlo && z_row(r, n) < zhi)) scatter_checked<real, false>(vol, r, n, v);
}

// Where a ray's samples go: the output itself, or an accumulator of our own
// whose strides for world x, y, z (and global-z offset) replace the output's.
template <typename real>
struct Target {
  real* base;
  i64 batch_stride;
  bool restride;
  i64 sx, sy, sz, offset;
};

// x-dominant rays, and the others (y- or z-dominant).
template <typename real>
struct Targets {
  Target<real> x, yz;
};

template <typename real>
inline void retarget(Ray<real>& r, const Target<real>& t) {
  const i64 st[3] = {t.sx, t.sy, t.sz};
  r.sa = st[r.a]; r.sb = st[r.b]; r.sc = st[r.c];
  r.offset = t.offset;
}

// Row and plane lengths for the backprojection's accumulators.  A length whose
// byte size is a multiple of 256 (rows of 64 floats: W1's 128, and 192, 256,
// 320) is padded to an odd number of 64-byte lines; a plane whose byte size is
// a multiple of 4 KiB likewise.  A walk whose consecutive samples sit a row
// apart then spreads over all the L1's sets (512-byte rows use only 8 of 64,
// and a ray's 256 lines compete for 96 of them, evicting what the next ray,
// one pixel over, reuses), and the stencil's rows c and c+1 (a plane apart)
// and every eighth plane no longer sit a multiple of 4 KiB from an earlier
// store (4K aliasing).  Other lengths are kept.
template <typename real>
inline i64 padded_length(i64 n, i64 align_bytes) {
  const i64 per_line = 64 / (i64)sizeof(real);
  if ((n * (i64)sizeof(real)) % align_bytes != 0) return n;
  i64 r = (n + per_line - 1) / per_line * per_line;
  if ((r / per_line) % 2 == 0) r += per_line;
  return r;
}

// The rays of a view run kept by scatter_row for the view tiles (BackOptions::tile_planes).  Each tile
// pass reads every kept ray again, so the records are compact: what differs from ray to ray (the four
// coefficients, the weight, the plane ranges, the sinogram index: 36 bytes for float32) apart from what
// the rays of a run share (axes, strides, window bounds: a few layouts per run).  A whole Ray (104
// bytes, 120 with its index) streamed through the L2 once per tile and view evicted the tile's
// accumulator planes it was meant to keep there (W1 at N = 320: a view's 2560 rays, 307 KiB, beside
// 64 planes x 10 rows x 320 floats, 819 KiB, in a 1 MiB L2).  The ray rebuilt from a record and its
// layout is the one kept, field for field (bitwise the same scatter).  Zen 4, N = 320, in-process
// A/B, medians of 4: 1 thread 10.13 -> 9.60 CPU-s, 2 threads 10.72 -> 10.10; with the records, 48- and
// 80-plane tiles were no faster than 64, and tiles at N = 256 still lost (5.42 against 5.27 untiled).
template <typename real>
struct KeptRays {
  struct Record {
    real Ab, Bb, Ac, Bc, w;
    int16_t n0, n1, i0, i1;  // planes below 2^15 (KeptRays::fits)
    unsigned layout;         // index into layouts
  };
  std::vector<Record> rays;
  // the rays' sinogram values, ray by ray (batch items of a ray together): read in the order of the records.
  // Read from the sinogram at each tile pass instead, a run's values (rays a detector column apart, nv floats)
  // sat on one cache line per ray or per band's column of rays, up to 1.3 MB of lines per pass at N = 320 beside
  // the tile's 819 KB of planes in a 1 MiB L2.
  std::vector<real> vals;
  std::vector<Ray<real>> layouts;  // a, b, c, strides, offset, window bounds, planar, pc (coefficients unset)
  std::vector<unsigned char> to_x;  // per layout: the x-dominant target
  unsigned last = 0;

  // whether a call's rays can be kept in records: plane indices and window bounds below 2^15
  static bool fits(int n_planes) { return n_planes < 32767; }
  void clear() { rays.clear(); vals.clear(); layouts.clear(); to_x.clear(); last = 0; }
  static bool same_layout(const Ray<real>& a, const Ray<real>& b) {
    return a.a == b.a && a.b == b.b && a.c == b.c && a.sa == b.sa && a.sb == b.sb && a.sc == b.sc &&
           a.offset == b.offset && a.lob == b.lob && a.hib == b.hib && a.loc == b.loc && a.hic == b.hic &&
           a.planar == b.planar && a.pc == b.pc;
  }
  // ray r with the sinogram values value[q * stride], q < batch
  void add(const Ray<real>& r, const real* value, int batch, i64 stride, bool x) {
    unsigned li = last;
    if (li >= layouts.size() || !same_layout(layouts[li], r) || (bool)to_x[li] != x) {
      li = 0;
      while (li < layouts.size() && !(same_layout(layouts[li], r) && (bool)to_x[li] == x)) ++li;
      if (li == layouts.size()) { layouts.push_back(r); to_x.push_back(x ? 1 : 0); }
      last = li;
    }
    rays.push_back(Record{r.Ab, r.Bb, r.Ac, r.Bc, r.w, (int16_t)r.n0, (int16_t)r.n1, (int16_t)r.i0,
                          (int16_t)r.i1, li});
    for (int q = 0; q < batch; ++q) vals.push_back(value[q * stride]);
  }
  // the kept ray of record k, whole
  Ray<real> ray(const Record& k) const {
    Ray<real> r = layouts[k.layout];
    r.Ab = k.Ab; r.Bb = k.Bb; r.Ac = k.Ac; r.Bc = k.Bc; r.w = k.w;
    r.n0 = k.n0; r.n1 = k.n1; r.i0 = k.i0; r.i1 = k.i1;
    return r;
  }
};

// Backproject the pixels [inner_lo, inner_hi) of detector row `outer` (a row
// of u when u_inner, else a column of v) of view k into the z-range
// [zlo, zhi) of the targets `tg` (batch items batch_stride apart).  A pixel that is zero
// in every item is skipped; its ray is set up once for all items.  `small`:
// the slab array has fewer than 2^31 voxels (32-bit offsets in scatter_ray).
// keep (small slabs): the rays, retargeted, are appended there instead of scattered (view tiles).
// flatten (make_ray and the scatter inlined here) ran 6% faster on W1.
template <typename real>
__attribute__((flatten)) inline void scatter_row(const real* sino, int batch, const VolumeWindow<real>& vw,
                                                 const real* src, const real* ctr, const real* ustep,
                                                 const real* vstep, int cone, const DetectorWindow& dw, int k,
                                                 bool u_inner, int outer, int inner_lo, int inner_hi, int zlo,
                                                 int zhi, const Targets<real>& tg, bool small,
                                                 const ScatterMode& mode, KeptRays<real>* keep = nullptr) {
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  const i64 sino_batch_stride = (i64)dw.n_views * nu * nv;
  const VolumeWindow<real> vwl = vw;  // a local copy: the scatter's stores cannot alias it
  // Set the rays of a group of pixels up first, then scatter them: the set-ups
  // (divisions and a square root in double) of independent rays overlap.
  constexpr int kGroup = 16;
  // float32 with SIMD lanes: the forward's vectorised set-up of 16 rays at once
  // (fwd::setup_lanes, the same quantities as make_ray); lanes it declines
  // fall back to make_ray.
  constexpr bool lanes = std::is_same<real, float>::value && fwd::kForwardLanes > 0;
  for (int g0 = inner_lo; g0 < inner_hi; g0 += kGroup) {
    const int g1 = std::min(inner_hi, g0 + kGroup);
    int np = 0;  // pixels of the group with a nonzero value in some item
    int ius[kGroup], ivs[kGroup];
    i64 pis[kGroup];
    for (int inner = g0; inner < g1; ++inner) {
      const int iu = u_inner ? inner : outer, iv = u_inner ? outer : inner;
      const i64 si = ((i64)k * nu + (iu - dw.u0)) * nv + (iv - dw.v0);
      bool any = false;
      for (int q = 0; q < batch; ++q) any |= sino[q * sino_batch_stride + si] != real(0);
      if (!any) continue;
      ius[np] = iu; ivs[np] = iv; pis[np++] = si;
    }
    Ray<real> pr[kGroup];
    bool hit[kGroup];
    unsigned ready = 0;
    if constexpr (lanes) {
      if (small && np > 0) ready = fwd::setup_lanes(vwl, src, ctr, ustep, vstep, cone, k, ius, ivs, dw.U, dw.V, np,
                                                    zlo, zhi, pr, hit);
    }
    for (int p = 0; p < np; ++p) {
      if ((ready >> p) & 1u) continue;
      double o[3], d[3];
      pixel_ray(src, ctr, ustep, vstep, cone, k, ius[p], ivs[p], dw.U, dw.V, o, d);
      pr[p] = Ray<real>{};
      hit[p] = make_ray(vwl, o, d, zlo, zhi, pr[p]);
    }
    for (int p = 0; p < np; ++p) {
      if (!hit[p]) continue;
      const Target<real>& t = pr[p].a == 0 ? tg.x : tg.yz;
      if (t.restride) retarget(pr[p], t);
      if (keep && small) {  // traced later, tile by tile
        keep->add(pr[p], sino + pis[p], batch, sino_batch_stride, pr[p].a == 0);
        continue;
      }
      for (int q = 0; q < batch; ++q) {
        const real val = sino[q * sino_batch_stride + pis[p]];
        if (small) scatter_ray(t.base + q * t.batch_stride, pr[p], val, mode);
        else ray_backward<real, false>(t.base + q * t.batch_stride, pr[p], val);
      }
    }
  }
}

// Split the slab's planes [z0, z1) into `parts` contiguous z-chunks of about
// equal work, one per thread.  The work of plane z is estimated by the number
// of detector pixels (within the window) whose rays can touch it, summed over
// up to 32 evenly spaced views.  One chunk per thread: a ray that crosses
// several chunks is set up (make_ray, in double) once per chunk, and with 4
// chunks per thread that cost 40% more CPU time on W1 than 1 per thread.
template <typename real>
inline std::vector<int> balanced_chunks(const VolumeWindow<real>& vw, const real* src, const real* ctr,
                                        const real* ustep, const real* vstep, int cone, const DetectorWindow& dw,
                                        int parts) {
  const int nz = vw.z1 - vw.z0;
  parts = std::max(1, std::min(parts, nz));
  std::vector<int> edge(parts + 1);
  edge[0] = vw.z0;
  edge[parts] = vw.z1;
  if (parts == 1) return edge;
  std::vector<double> cum(nz + 1, 0.0);
  const int step = std::max(1, dw.n_views / 32);
  for (int z = 0; z < nz; ++z) {
    double wz = 0.0;
    for (int k = 0; k < dw.n_views; k += step) {
      int ulo, uhi, vlo, vhi;
      slab_pixel_bounds(vw, src, ctr, ustep, vstep, cone, k, vw.z0 + z, vw.z0 + z + 1, dw.U, dw.V, ulo, uhi, vlo,
                        vhi);
      const int nu = std::min(uhi, dw.u1) - std::max(ulo, dw.u0), nv = std::min(vhi, dw.v1) - std::max(vlo, dw.v0);
      if (nu > 0 && nv > 0) wz += (double)nu * nv;
    }
    cum[z + 1] = cum[z] + wz + 1.0;  // + 1: planes that no ray touches still split evenly
  }
  int z = 0;
  for (int t = 1; t < parts; ++t) {
    const double goal = cum[nz] * t / parts;
    while (z < nz && cum[z + 1] <= goal) ++z;
    // at least one plane per chunk, and room for the chunks after this one
    const int lo = edge[t - 1] - vw.z0 + 1, hi = nz - (parts - t);
    edge[t] = vw.z0 + std::max(lo, std::min(hi, z));
  }
  return edge;
}

// BackOptions::row_split: part t of the detector's outer rows [rlo[t], rlo[t + 1]) (whole bands of R
// from the first row any ray of the slab reaches, balanced by pixel count over all views) scatters into
// accumulator planes for the z rows [zlo[t], zhi[t]) that its rays can touch.  Those come from
// slab_pixel_bounds, which is conservative: the largest z prefix (and suffix) of the slab whose box no
// pixel of the part's rows reaches in any view is left out (a larger box's pixel range holds a smaller
// one's, so a bisection finds it in log2(depth) rounds of one bound per view).  The part's rays are set
// up against [zlo, zhi), so they cannot write outside its planes even if the bounds were loose.
struct RowSplit {
  std::vector<int> rlo, zlo, zhi;
};

// The plan of BackOptions::row_split for `parts` threads, or false where it does not fit: fewer bands
// than parts, or parts whose z ranges together exceed the slab's depth by more than an eighth of it or
// 8 planes, whichever is more (W1 at 2 threads: 5 planes; at 3, 37, and the z-chunks are taken; their
// accumulators and the final sum would then cost what the split saves; e.g. a detector whose outer
// index is u, or a tilted orbit).
template <typename real>
inline bool row_split_plan(const VolumeWindow<real>& vw, const real* src, const real* ctr, const real* ustep,
                           const real* vstep, int cone, const DetectorWindow& dw, bool u_inner, int parts, int R,
                           RowSplit& rs) {
  const int nz = vw.z1 - vw.z0;
  if (parts < 2 || R < 1 || nz < 2) return false;
  // the outer rows' [lo, hi) and inner counts per view, for the slab [zlo, zhi); returns whether any
  // pixel of the outer rows [r0, r1) is among them in some view
  auto reached = [&](int zlo, int zhi, int r0, int r1, std::vector<double>* weight, int base) {
    bool any = false;
    for (int k = 0; k < dw.n_views; ++k) {
      int ulo, uhi, vlo, vhi;
      slab_pixel_bounds(vw, src, ctr, ustep, vstep, cone, k, zlo, zhi, dw.U, dw.V, ulo, uhi, vlo, vhi);
      ulo = std::max(ulo, dw.u0); uhi = std::min(uhi, dw.u1);
      vlo = std::max(vlo, dw.v0); vhi = std::min(vhi, dw.v1);
      const int o0 = std::max(r0, u_inner ? vlo : ulo), o1 = std::min(r1, u_inner ? vhi : uhi);
      const int ni = u_inner ? uhi - ulo : vhi - vlo;
      if (o0 >= o1 || ni <= 0) continue;
      any = true;
      if (weight)
        for (int o = o0; o < o1; ++o) (*weight)[o - base] += ni;
    }
    return any;
  };
  const int olo = u_inner ? dw.v0 : dw.u0, ohi = u_inner ? dw.v1 : dw.u1;
  std::vector<double> w(std::max(0, ohi - olo), 0.0);
  if (!reached(vw.z0, vw.z1, olo, ohi, &w, olo)) return false;
  int first = 0, last = (int)w.size();
  while (first < last && w[first] == 0.0) ++first;
  while (last > first && w[last - 1] == 0.0) --last;
  const int bands = (last - first + R - 1) / R;
  if (bands < parts) return false;
  std::vector<double> cum(bands + 1, 0.0);  // work of the bands before band b
  for (int b = 0; b < bands; ++b) {
    cum[b + 1] = cum[b];
    for (int o = first + b * R; o < std::min(last, first + (b + 1) * R); ++o) cum[b + 1] += w[o];
  }
  rs.rlo.assign(parts + 1, 0);
  rs.rlo[0] = olo + first;
  rs.rlo[parts] = olo + last;
  int b = 0;
  for (int t = 1; t < parts; ++t) {
    const double goal = cum[bands] * t / parts;
    while (b < bands && cum[b + 1] <= goal) ++b;
    // the nearer band edge, at least one band per part and room for the parts after this one
    int e = (b < bands && goal - cum[b] > cum[b + 1] - goal) ? b + 1 : b;
    e = std::max(e, (rs.rlo[t - 1] - olo - first) / R + 1);
    e = std::min(e, bands - (parts - t));
    rs.rlo[t] = olo + first + e * R;
  }
  rs.zlo.assign(parts, vw.z0);
  rs.zhi.assign(parts, vw.z0);
  i64 planes = 0;
  for (int t = 0; t < parts; ++t) {
    const int r0 = rs.rlo[t], r1 = rs.rlo[t + 1];
    int lo = 0, hi = nz;  // the largest untouched prefix: [z0, z0 + lo) untouched, [z0, z0 + hi + 1) touched
    while (lo < hi) {
      const int m = (lo + hi + 1) / 2;
      if (reached(vw.z0, vw.z0 + m, r0, r1, nullptr, 0)) hi = m - 1; else lo = m;
    }
    int a = lo, c = nz;  // the smallest untouched suffix start in [a, nz]
    while (a < c) {
      const int m = (a + c) / 2;
      if (reached(vw.z0 + m, vw.z1, r0, r1, nullptr, 0)) a = m + 1; else c = m;
    }
    rs.zlo[t] = vw.z0 + lo;
    rs.zhi[t] = vw.z0 + std::max(lo, c);
    planes += rs.zhi[t] - rs.zlo[t];
  }
  return planes <= (i64)nz + std::max(8, nz / 8);
}

// Backward without atomics: each thread owns a z-chunk of the output slab and,
// per view, visits only the detector pixels whose rays cross that chunk.  The
// order of the additions into a voxel is fixed (views, rows, pixels; with the
// swapped accumulator the x-dominant rays' sum is added last), so repeated and
// batched calls agree bitwise.
template <typename real>
void joseph_backward_cpu(const real* sino, int batch, VolumeWindow<real> vw, const real* src, const real* ctr,
                         const real* ustep, const real* vstep, int cone, DetectorWindow dw, real* vol,
                         i64 vol_batch_stride, int nthreads, BackOptions opt = BackOptions{}) {
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  const int nz = vw.z1 - vw.z0;
  if (nz <= 0 || nu <= 0 || nv <= 0) return;
  const i64 slab = (i64)nz * vw.H * vw.W;
  const bool small = slab < (i64(1) << 31);
  const bool u_inner = inner_is_u(ustep, vstep, dw.n_views);
  // A thin slab (2D scans) cannot feed every thread with z-chunks: then threads
  // take views instead and each accumulates into a private copy of the slab,
  // summed at the end (still no atomics).
  const ScatterMode whole{opt.pairs, opt.rows, {INT_MIN, INT_MAX}, opt.simd};
  const bool thin = nz < 2 * nthreads && nthreads > 1 &&
                    (double)slab * batch * nthreads * sizeof(real) < 512.0 * (1 << 20);
  if (thin) {
    std::vector<std::vector<real>> priv(nthreads);
#pragma omp parallel num_threads(nthreads)
    {
      const int tid = omp_get_thread_num();
      std::vector<real>& acc = priv[tid];
      acc.assign((size_t)(slab * batch), real(0));
      const Target<real> own{acc.data(), slab, false, 0, 0, 0, 0};
      const Targets<real> direct{own, own};
      // static: a fixed view -> thread map keeps the summation order, so repeated
      // and batched calls agree bitwise (gradcheck reentrancy, batch == per item).
#pragma omp for schedule(static, 1)
      for (int k = 0; k < dw.n_views; ++k) {
        const int o0 = u_inner ? dw.v0 : dw.u0, o1 = u_inner ? dw.v1 : dw.u1;
        const int i0 = u_inner ? dw.u0 : dw.v0, i1 = u_inner ? dw.u1 : dw.v1;
        for (int outer = o0; outer < o1; ++outer)
          scatter_row(sino, batch, vw, src, ctr, ustep, vstep, cone, dw, k, u_inner, outer, i0, i1, vw.z0, vw.z1,
                      direct, small, whole);
      }
      // implicit barrier of omp for; then reduce the private slabs
#pragma omp for schedule(static)
      for (i64 i = 0; i < slab * batch; ++i) {
        real sum = real(0);
        for (int t = 0; t < nthreads; ++t)
          if (!priv[t].empty()) sum += priv[t][i];
        const i64 q = i / slab;
        vol[q * vol_batch_stride + (i % slab)] += sum;
      }
    }
    return;
  }
  const bool many_rays = (i64)dw.n_views * nu * nv >= slab / 4;  // the forward's rule for its copy
  // row_split (RowSplit): parts of the detector rows instead of z-chunks; needs the padded accumulators
  // (checked below; without them the z-chunks are taken)
  RowSplit rs;
  bool row_split = opt.row_split && opt.padded && opt.band_rows > 0 && small && many_rays && nthreads > 1 &&
                   row_split_plan(vw, src, ctr, ustep, vstep, cone, dw, u_inner, nthreads, opt.band_rows, rs);
  const std::vector<int> edge =
      row_split ? std::vector<int>{} : balanced_chunks(vw, src, ctr, ustep, vstep, cone, dw, nthreads);
  const int nchunks = row_split ? (int)rs.zlo.size() : (int)edge.size() - 1;
  // chunk ch: the z rows [czlo[ch], czhi[ch]) of the detector's outer rows [crlo[ch], crhi[ch]), its
  // accumulator plane of row z at z - z0 + cpo[ch] (z-chunks: one halo plane per chunk before it)
  std::vector<int> czlo(nchunks), czhi(nchunks), crlo(nchunks, INT_MIN), crhi(nchunks, INT_MAX);
  std::vector<i64> cpo(nchunks, 0);
  i64 acc_planes = 0;  // accumulator planes of all chunks (halo planes included)
  for (int ch = 0; ch < nchunks; ++ch) {
    czlo[ch] = row_split ? rs.zlo[ch] : edge[ch];
    czhi[ch] = row_split ? rs.zhi[ch] : edge[ch + 1];
    if (row_split) { crlo[ch] = rs.rlo[ch]; crhi[ch] = rs.rlo[ch + 1]; }
    cpo[ch] = acc_planes - (czlo[ch] - vw.z0);
    acc_planes += czhi[ch] - czlo[ch];
  }
  // padded: rays scatter into zeroed accumulators of our own with padded rows
  // and planes (padded_length): (z, y, x) for y- and z-dominant rays (the
  // output itself where nothing needs padding), (z, x, y) for x-dominant ones
  // (b = y contiguous, as the swapped accumulator below); each thread adds its
  // chunk of them into the output.
  // Where no length needs padding, the y/z accumulator is the output itself.
  // dup (DupLayout): rows of 2 W (A) or 2 H (B) floats.  Seamless only: slot z - 1's second halves
  // belong to output row z, which the next sub-chunk or (through the halo) z-chunk adds in after
  // this one's; clipped sub-chunks would share slots between threads.
  const bool dup = opt.dup && opt.padded && opt.seamless && kPairScatter && std::is_same<real, float>::value &&
                   2 * (i64)vw.H * vw.W * (i64)sizeof(float) <= kDupMaxSlotPlane;
  const i64 per = dup ? 2 : 1;  // floats per voxel of a row
  const i64 rowA = padded_length<real>(per * vw.W, 256), planeA = padded_length<real>((i64)vw.H * rowA, 4096);
  const i64 rowB = padded_length<real>(per * vw.H, 256), planeB = padded_length<real>((i64)vw.W * rowB, 4096);
  // seamless across threads too (halo): each z-chunk's accumulators get one plane more, the first
  // plane of the next chunk, so that a thread scatters its boundary samples whole as between its own
  // sub-chunks; the halo planes are added into the output after all threads.  Needs both
  // accumulators private (an unpadded y/z one then too).
  const bool halo_wanted = opt.seamless && nchunks > 1 && !row_split;
  const bool ownA = rowA != vw.W || planeA != (i64)vw.H * vw.W || halo_wanted || dup || row_split;
  const i64 halo_planes = halo_wanted ? nchunks : 0;
  if (halo_wanted)
    for (int ch = 0; ch < nchunks; ++ch) cpo[ch] = ch;
  acc_planes += halo_planes;
  const i64 slabA = ownA ? acc_planes * planeA : 0, slabB = acc_planes * planeB;
  const bool padded = opt.padded && small && vw.H > 1 && vw.W > 1 && many_rays &&
                      slabA < (i64(1) << 31) && slabB < (i64(1) << 31) &&
                      (double)(slabA + slabB) * batch * sizeof(real) <= 1024.0 * (1 << 20);
  // float32 pairs: x-dominant rays (b = y, strided in the output) scatter into a
  // zeroed accumulator with x and y swapped, so that every ray's b-neighbours
  // are adjacent and a sample is two 64-bit pairs (block_scatter_pairs); each
  // thread adds its chunk of it back, transposed, after its views.
  const bool swap_acc = !padded && kPairScatter && opt.pairs && std::is_same<real, float>::value && small &&
                        vw.H > 1 && vw.W > 1 && many_rays &&
                        (double)slab * batch * sizeof(real) <= 1024.0 * (1 << 20);
  // 2 MiB aligned, huge pages advised (fewer TLB misses on the plane-strided walk); zeroed by their threads
  SlabBuffer<real> accA(padded ? (size_t)(slabA * batch) : 0, kKeptBackA), accB(padded ? (size_t)(slabB * batch) : 0, kKeptBackB);
  real* const bufA = accA.data;
  real* const bufB = accB.data;
  std::vector<real> swapped(swap_acc ? (size_t)(slab * batch) : 0);
  const i64 plane = (i64)vw.H * vw.W;
  const Target<real> out_t{vol, vol_batch_stride, false, 0, 0, 0, 0};
  Targets<real> tg{out_t, out_t};
  const bool halo = padded && halo_wanted;  // chunk ch's plane z at accumulator plane z - z0 + ch
  if (!padded && row_split) {  // z-chunks after all (the unpadded targets are the output's planes)
    row_split = false;
    const std::vector<int> e = balanced_chunks(vw, src, ctr, ustep, vstep, cone, dw, nthreads);
    czlo.assign(e.begin(), e.end() - 1);
    czhi.assign(e.begin() + 1, e.end());
    crlo.assign(czlo.size(), INT_MIN);
    crhi.assign(czlo.size(), INT_MAX);
    cpo.assign(czlo.size(), 0);
  }
  const int nrun = (int)czlo.size();
  // view tiles (BackOptions::tile_planes): banded, padded, and only where a band's accumulator planes
  // (with two for the cone's spread) exceed back_tile_min_band_bytes
  const int n_planes = std::max({vw.W, vw.H, vw.z1});  // every axis' plane index lies in [0, n_planes)
  const int tiles = opt.tile_planes > 0 && opt.band_rows > 0 && padded && small && KeptRays<real>::fits(n_planes) &&
                            (i64)(opt.band_rows + 2) * std::max(planeA, planeB) * (i64)sizeof(real) > back_tile_min_band_bytes()
                        ? back_tile_planes(opt.tile_planes)
                        : 0;
  const int tile_run = std::max(1, opt.tile_views);
  if (padded) {
    if (ownA) tg.yz = Target<real>{bufA, slabA, true, per, rowA, planeA, (i64)vw.z0 * planeA};
    tg.x = Target<real>{bufB, slabB, true, rowB, per, planeB, (i64)vw.z0 * planeB};
  } else if (swap_acc) {
    tg.x = Target<real>{swapped.data(), slab, true, (i64)vw.H, 1, plane, (i64)vw.z0 * plane};
  }
  // Sub-chunk height: planes of about opt.block_bytes of one item's output, at least 4.  Not
  // of all items: a ray's set-up depends on the sub-chunk edges (its entry plane, in the last
  // bit), so they must not move with the batch size (batched == per-item calls, bitwise).
  const i64 plane_bytes = plane * (i64)sizeof(real);
  const int min_planes = opt.depth_div > 0 ? (std::max(vw.H, vw.W) + opt.depth_div - 1) / opt.depth_div : 0;
  const int sub = opt.block_bytes > 0
                      ? (int)std::max<i64>(std::max(4, min_planes), opt.block_bytes / std::max<i64>(1, plane_bytes))
                      : nz;
  const bool seamless = opt.seamless && small;  // scatter_ray's ownership test (ray_backward has none)
  // Add accumulator plane p (of item q) into output plane z; dup: the first halves of slot p and, where
  // `below`, the second halves of slot p - 1 (row z of the samples whose lower row is z - 1).
  auto add_planes = [&](int q, int z, i64 p, bool below) {
    real* o = vol + q * vol_batch_stride + (i64)(z - vw.z0) * plane;  // (y, x)
    if (padded && dup) {
      const real* a = bufA + q * slabA + p * planeA;  // (y, x, pair)
      const real* b = bufB + q * slabB + p * planeB;  // (x, y, pair)
      // one half of every pair of an accumulator plane whose voxel (x, y) sits at x * sx + y * sy
      auto add_half = [&](const real* h, i64 sx, i64 sy) {
        for (int y = 0; y < vw.H; ++y)
          for (int x = 0; x < vw.W; ++x) o[(i64)y * vw.W + x] += h[x * sx + y * sy];
      };
      add_half(a, 2, rowA);
      add_half(b, rowB, 2);
      if (below) {
        add_half(a - planeA + 1, 2, rowA);
        add_half(b - planeB + 1, rowB, 2);
      }
    } else if (padded) {
      const real* a = ownA ? bufA + q * slabA + p * planeA : nullptr;  // (y, x), padded
      const real* b = bufB + q * slabB + p * planeB;                   // (x, y), padded rows
      if (ownA)
        for (int y = 0; y < vw.H; ++y)
          for (int x = 0; x < vw.W; ++x) o[(i64)y * vw.W + x] += a[(i64)y * rowA + x];
      for (int y = 0; y < vw.H; ++y)
        for (int x = 0; x < vw.W; ++x) o[(i64)y * vw.W + x] += b[(i64)x * rowB + y];
    } else if (swap_acc) {
      const real* t = swapped.data() + q * slab + p * plane;  // (x, y)
      for (int y = 0; y < vw.H; ++y)
        for (int x = 0; x < vw.W; ++x) o[(i64)y * vw.W + x] += t[(i64)x * vw.H + y];
    }
  };
#pragma omp parallel num_threads(nthreads)
  {
#pragma omp for schedule(static, 1)
    for (int ch = 0; ch < nrun; ++ch) {
      const i64 hp = cpo[ch];  // z-chunks: the halo planes of the chunks before this one
      const int zc0 = czlo[ch], zc1 = czhi[ch];
      if (zc0 >= zc1) continue;  // a row part whose rays miss the slab
      Targets<real> tgc = tg;
      tgc.yz.offset -= hp * planeA;
      tgc.x.offset -= hp * planeB;
      const int hz = halo ? 1 : 0;
      if (padded)  // this thread's planes of both accumulators, its halo plane too (first touch by their user)
        for (int q = 0; q < batch; ++q) {
          if (ownA) std::fill_n(bufA + q * slabA + (zc0 - vw.z0 + hp) * planeA, (size_t)((zc1 - zc0 + hz) * planeA), real(0));
          std::fill_n(bufB + q * slabB + (zc0 - vw.z0 + hp) * planeB, (size_t)((zc1 - zc0 + hz) * planeB), real(0));
        }
      const bool halo_below = halo && ch > 0, halo_above = halo && ch + 1 < nrun;
      KeptRays<real> kept;
      const int step_z = row_split ? zc1 - zc0 : sub;  // a row part: its whole z range, every sample its own
      for (int zlo = zc0; zlo < zc1; zlo += step_z) {
        const int zhi = std::min(zc1, zlo + step_z);
        // seamless: rays set up against [zlo, zhi + 1) inside the chunk (or into its halo plane), each
        // sample scattered by one sub-chunk
        const int olo = seamless && (zlo > zc0 || halo_below) ? zlo : INT_MIN;
        const int ohi = seamless && (zhi < zc1 || halo_above) ? zhi : INT_MAX;
        const int zwin = ohi != INT_MAX ? zhi + 1 : zhi;
        const ScatterMode mode{opt.pairs, opt.rows, ZOwnership{olo, ohi}, opt.simd, padded && dup};
        // band_rows: the detector rows in bands of R, every view per band (G views a group; G = 1:
        // view by view).  The rays and each ray's additions are the same; only the order of views
        // and rows changes, fixed for a call (repeated and batched calls stay bitwise equal).
        const int G = opt.band_rows > 0 ? dw.n_views : 1, R = std::max(1, opt.band_rows);
        std::vector<int> bo0(G), bo1(G), bi0(G), bi1(G);
        for (int k0 = 0; k0 < dw.n_views; k0 += G) {
          const int k1 = std::min(dw.n_views, k0 + G);
          int omin = INT_MAX, omax = INT_MIN;
          for (int k = k0; k < k1; ++k) {
            int ulo, uhi, vlo, vhi;
            slab_pixel_bounds(vw, src, ctr, ustep, vstep, cone, k, zlo, zwin, dw.U, dw.V, ulo, uhi, vlo, vhi);
            ulo = std::max(ulo, dw.u0); uhi = std::min(uhi, dw.u1);
            vlo = std::max(vlo, dw.v0); vhi = std::min(vhi, dw.v1);
            const int j = k - k0;
            bo0[j] = std::max(crlo[ch], u_inner ? vlo : ulo); bo1[j] = std::min(crhi[ch], u_inner ? vhi : uhi);
            bi0[j] = u_inner ? ulo : vlo; bi1[j] = u_inner ? uhi : vhi;
            if (bo0[j] < bo1[j]) { omin = std::min(omin, bo0[j]); omax = std::max(omax, bo1[j]); }
          }
          // a row part's bands start at its first row (a band edge of the whole detector's bands)
          if (row_split && omin < omax) omin = crlo[ch];
          const int step = G == 1 ? std::max(1, omax - omin) : R;
          if (tiles > 0) {
            // view tiles: a band's views in runs, each run's rays set up once and kept, then scattered tile by
            // tile of `tiles` planes of their dominant axis, so that the run's rays touch the same few planes
            // of the accumulators, which stay in the L2 across the run
            for (int b0 = omin; b0 < omax; b0 += step)
              for (int r0 = k0; r0 < k1; r0 += tile_run) {
                kept.clear();
                for (int k = r0; k < std::min(k1, r0 + tile_run); ++k) {
                  const int j = k - k0;
                  const int e0 = std::max(b0, bo0[j]), e1 = std::min(b0 + step, bo1[j]);
                  for (int outer = e0; outer < e1; ++outer)
                    scatter_row(sino, batch, vw, src, ctr, ustep, vstep, cone, dw, k, u_inner, outer, bi0[j],
                                bi1[j], zlo, zwin, tgc, small, mode, &kept);
                }
                for (int t0 = 0; t0 < n_planes; t0 += tiles)
                  for (size_t i = 0; i < kept.rays.size(); ++i) {
                    const auto& k = kept.rays[i];
                    if (k.n1 <= t0 || k.n0 >= t0 + tiles) continue;
                    const Target<real>& t = kept.to_x[k.layout] ? tgc.x : tgc.yz;
                    const Ray<real> r = kept.ray(k);
                    const real* val = kept.vals.data() + i * (size_t)batch;
                    for (int q = 0; q < batch; ++q)
                      scatter_ray(t.base + q * t.batch_stride, r, val[q], mode, t0, t0 + tiles);
                  }
              }
            continue;
          }
          for (int b0 = omin; b0 < omax; b0 += step)
            for (int k = k0; k < k1; ++k) {
              const int j = k - k0;
              const int e0 = std::max(b0, bo0[j]), e1 = std::min(b0 + step, bo1[j]);
              for (int outer = e0; outer < e1; ++outer)
                scatter_row(sino, batch, vw, src, ctr, ustep, vstep, cone, dw, k, u_inner, outer, bi0[j], bi1[j],
                            zlo, zwin, tgc, small, mode);
            }
        }
        // add the sub-chunk's accumulators into the output while they are in cache (a row part's planes
        // may be another's too: summed after the join)
        if (!row_split)
          for (int q = 0; q < batch; ++q)
            for (int z = zlo; z < zhi; ++z) add_planes(q, z, z - vw.z0 + hp, z > zc0);
      }
    }
    // row parts: each output plane gets the parts holding it in part order (implicit barrier above)
    if (row_split) {
#pragma omp for schedule(static)
      for (int z = vw.z0; z < vw.z1; ++z)
        for (int ch = 0; ch < nrun; ++ch)
          if (z >= czlo[ch] && z < czhi[ch])
            for (int q = 0; q < batch; ++q) add_planes(q, z, z - vw.z0 + cpo[ch], z > czlo[ch]);
    }
  }
  // the halo planes, after every thread's own: chunk ch's is the first plane of chunk ch + 1
  if (halo)
    for (int ch = 0; ch + 1 < nrun; ++ch)
      for (int q = 0; q < batch; ++q) add_planes(q, czhi[ch], (i64)czhi[ch] - vw.z0 + ch, true);
}

}  // namespace ct
