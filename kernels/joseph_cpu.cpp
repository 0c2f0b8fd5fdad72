// CPU entry points of the Joseph family: the per-ray functions of joseph.cuh
// in OpenMP loops.  Built at first use by ctbench/engine/cpu/library.py and
// called through ctypes (which releases the GIL).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <vector>

#include "cpu_helpers.hpp"
#include "joseph.cuh"
#include "joseph_backward_cpu.hpp"
#include "joseph_forward_cpu.hpp"

namespace {

using ct::i64;

// ---------------------------------------------------------------- paths
// The inner loops each operation can run, chosen at run time (by measurement in
// ctbench/engine/cpu/path_choice.py, or forced by CTBENCH_CPU_PATH).  Only the paths
// this build compiled are listed; -1 (the default) is the first listed.
struct ForwardPath {
  const char* name;
  bool lanes;               // SIMD lanes (else scalar beams)
  ct::fwd::LaneKind kind;   // which lane loop
  bool bands;               // detector rows in bands, all views per band (forward_band_rows)
  bool fused = false;       // ray set-up and edge planes in the lanes too (fwd::fused_group)
  bool tiles = false;       // fused, bands, and beyond the L2 view runs traced in plane tiles (fused_forward_tiled)
  bool pad = false;         // fused, rays through zero-bordered copies of small slabs (fwd::pad_slab)
};
// The -bands paths trace the same rays in another order (bitwise the same output); listed first so
// that they are each build's default: on volumes beyond the L2 they keep the rate flat (1 thread,
// load 12-14: N = 256 1028 M/s against 520 view by view, N = 320 885-923 M/s; docs/INTERNALS.md, "Forward: bands
// and view tiles").
// -fused-bands (what the defaults below build on): 1.2-1.5x avx512-gather-bands from N = 64 to 320 (W1's geometry,
// 1 thread), yet on the measurement's thin slab avx2-gather-bands ties with it (9.85 against 9.84 ms) while
// running 0.63-0.72x its rate at N = 64-192: as the default (in its -fused-pad-tiles form), a rival must beat it
// by path_choice.CHOICE_MARGIN (10%) to displace it.
// avx2-gather-fused-bands (the base of the AVX2-only builds' default): 1.47x avx2-gather-bands at N = 64, ahead
// at every N to 320 (CTBENCH_MARCH=haswell build on an AVX-512 Xeon, 1 thread; docs/INTERNALS.md, "Forward: fused
// set-up and edge planes").
// -fused-tiles: -fused-bands, and where a band's planes exceed the L2 (for W1's geometry from N ~ 230 on a 2 MiB
// L2, N ~ 165 on 1 MiB) runs of 32 views traced in plane tiles sized to the L2 (fwd::fused_forward_tiled): N = 320
// 1.14x, N = 256 1.05x with runs of 4 and 64-plane tiles (Xeon, 1 thread, load 2-3; docs/INTERNALS.md, "Forward:
// bands and view tiles"); below, the same loop.
// -fused-pad-tiles (each build's default): -fused-tiles, and for slabs up to 32 MiB rays through zero-bordered
// copies (fwd::pad_slab), so that nearly no plane needs the checked stencil: N = 64 1.05-1.1x.  Its float32
// rounding (same samples) once moved a known-object self-calibration; that was the solver's step acceptance,
// fixed (docs/INTERNALS.md, "Determinism and rounding").
constexpr ForwardPath kForwardPaths[] = {
#if defined(__AVX512F__)
    {"avx512-gather-fused-pad-tiles", true, ct::fwd::LaneKind::Avx512Gather, true, true, true, true},
    {"avx512-gather-fused-tiles", true, ct::fwd::LaneKind::Avx512Gather, true, true, true},
    {"avx512-gather-fused-bands", true, ct::fwd::LaneKind::Avx512Gather, true, true},
    {"avx512-gather-fused", true, ct::fwd::LaneKind::Avx512Gather, false, true},
    {"avx512-gather-bands", true, ct::fwd::LaneKind::Avx512Gather, true},
#endif
#if defined(__AVX2__)
    {"avx2-gather-fused-pad-tiles", true, ct::fwd::LaneKind::Avx2Gather, true, true, true, true},
    {"avx2-gather-fused-tiles", true, ct::fwd::LaneKind::Avx2Gather, true, true, true},
    {"avx2-gather-fused-bands", true, ct::fwd::LaneKind::Avx2Gather, true, true},
    {"avx2-gather-bands", true, ct::fwd::LaneKind::Avx2Gather, true},
    {"avx2-gather-fused", true, ct::fwd::LaneKind::Avx2Gather, false, true},
#endif
#if defined(__AVX512F__)
    {"avx512-gather", true, ct::fwd::LaneKind::Avx512Gather, false},
    {"avx512-loads-bands", true, ct::fwd::LaneKind::Avx512Loads, true},
    {"avx512-loads", true, ct::fwd::LaneKind::Avx512Loads, false},
#endif
#if defined(__AVX2__)
    {"avx2-gather", true, ct::fwd::LaneKind::Avx2Gather, false},
    {"avx2-loads-bands", true, ct::fwd::LaneKind::Avx2Loads, true},
    {"avx2-loads", true, ct::fwd::LaneKind::Avx2Loads, false},
#endif
    {"beams-bands", false, ct::fwd::LaneKind::Avx2Gather, true},
    {"beams", false, ct::fwd::LaneKind::Avx2Gather, false},
};
constexpr int kNumForwardPaths = (int)(sizeof(kForwardPaths) / sizeof(kForwardPaths[0]));

struct BackPath {
  const char* name;
  ct::BackOptions opt;
};
constexpr BackPath kBackPaths[] = {
#if defined(__SSE2__)
    // the defaults' loops (docs/INTERNALS.md "Back: bands and pair slots"): no z sub-chunks; each
    // thread's detector rows in bands of 8 (-b8), every view per band, so that a band's part of the
    // accumulators stays in cache across the views (W1, 1 thread, interleaved, load 3.9: 0.60 against
    // 0.76 CPU-s for pairs-padded-s4m-f16; N = 256: 5.2 against 7.5); dup-: the accumulators in z-row
    // pair slots (DupLayout: one 16-byte read-modify-write per sample; W1 0.57), taken for planes up
    // to kDupMaxSlotPlane and hand-vectorised stencils only (AVX-512, and AVX2 with FMA:
    // GCC's vectorisation of the scalar pair-slot stencils ran W1 1.7x slower; Zen 3, W1, 1 thread:
    // 0.725 against 0.82 CPU-s for pairs-padded-rs-b8)
    // -rs: at 2 threads and more, the threads split the detector rows' bands instead of the
    // slab's z-chunks, each into accumulators of the z rows its rays can reach (BackOptions::row_split;
    // the z-chunks where the parts would overlap by much); at 1 thread the same code as without -rs
    // (W1, 2 threads, interleaved: 0.566 against 0.612 CPU-s, one thread 0.564); and where a band's
    // accumulator planes exceed 2 MiB (or the L2; W1's shape from N = 229), view tiles: runs of 64 views set
    // up once and scattered tile by tile of 64 planes of their dominant axis (BackOptions::tile_planes,
    // back_tile_planes; Xeon, 2 MiB L2, 1 thread: N = 256 4.04 against 4.63 CPU-s untiled, N = 320 8.36
    // against 8.79 with 128 planes; 1 MiB, N = 320: 10.9 against 12.2 and 13.2 untiled); runs of 64 views
    // (Zen 4, 1 thread, N = 320, forced paths alternated: runs of 4/8/16/32 views 14.0/12.8/11.7/10.9
    // CPU-s; Xeon and Zen 4, 1 thread, builds alternated in one process: 64 against 32 views 0.975x the time
    // at N = 320 on both L2 sizes, 0.972x at N = 256 on 1 MiB, at 2 threads within noise; twice the kept rays'
    // memory, about 21 MB a thread at a 1024-column detector); docs/INTERNALS.md "Back: who owns which voxels"
    // and "Back: view tiles"
#if defined(CT_SIMD_LANES)  // the pair-slot paths need block_stencils_simd
    {"dup-padded-rs-b8", {true, 0, false, true, true, 0, true, true, 8, true, 64, 64}},
#endif
    {"pairs-padded-rs-b8", {true, 0, false, true, true, 0, true, false, 8, true, 64, 64}},
#if defined(CT_SIMD_LANES)  // the pair-slot paths need block_stencils_simd
    {"dup-padded-b8", {true, 0, false, true, true, 0, true, true, 8}},
#endif
    {"pairs-padded-b8", {true, 0, false, true, true, 0, true, false, 8}},
    // bands of 4 with the row split and view tiles too, the twin that the measurement ranks (it cannot see
    // what -rs pays for, so pairs-padded-b4 alone beside dup-padded-rs-b8 let load noise drop both the split
    // and the tiles; docs/INTERNALS.md "CPU paths and how one is chosen")
    {"pairs-padded-rs-b4", {true, 0, false, true, true, 0, true, false, 4, true, 64, 64}},
    {"pairs-padded-b4", {true, 0, false, true, true, 0, true, false, 4}},
    // the previous default: padded accumulators walked in z sub-chunks of ~4 MiB of output, all views per
    // sub-chunk, so the volume no longer streams from far cache once per view (-z4m against
    // pairs-padded, 1 thread, loads 3-6: N = 192 1.3x, N = 256 1.2x; N = 128 the same or better);
    // -sNm: seamless sub-chunks, each sample scattered whole by one sub-chunk (ZOwnership), not
    // clipped by both (W1: 0.731 vs 0.766 CPU-s for -z4m at load 10; docs/INTERNALS.md,
    // "The path table"); -fK: sub-chunks of at least max(H, W) / K planes
    // (BackOptions::depth_div), the same as -s4m up to N = 256 (N = 320, 1 thread, load 3.3:
    // 394 against 335 M samples per CPU-s; Xeon)
    {"pairs-padded-s4m-f16", {true, i64(4) << 20, false, true, true, 16}},
    {"pairs-padded-s4m", {true, i64(4) << 20, false, true, true}},
    {"pairs-padded-s4m-f13", {true, i64(4) << 20, false, true, true, 13}},
    {"pairs-padded-z4m", {true, i64(4) << 20, false, true}},
    {"pairs-padded-s2m", {true, i64(2) << 20, false, true, true}},
    {"pairs-padded-s1m", {true, i64(1) << 20, false, true, true}},
    {"pairs-padded-s8m", {true, i64(8) << 20, false, true, true}},
    {"pairs-padded-z8m", {true, i64(8) << 20, false, true}},
    {"pairs-padded", {true, 0, false, true}},
    {"rows-padded", {true, 0, true, true}},
    {"pairs", {true, 0, false, false}},
    {"rows", {true, 0, true, false}},
    {"pairs-z1m", {true, i64(1) << 20, false, false}},
    {"pairs-padded-z1m", {true, i64(1) << 20, false, true}},
#endif
    {"blocked-padded", {false, 0, false, true}},
    {"blocked", {false, 0, false, false}},
};
constexpr int kNumBackPaths = (int)(sizeof(kBackPaths) / sizeof(kBackPaths[0]));

// The chosen path of each operation (0 forward, 1 back); -1: the default.
std::atomic<int> g_path[2] = {{-1}, {-1}};

inline int path_count(int op) { return op == 0 ? kNumForwardPaths : op == 1 ? kNumBackPaths : 0; }

inline int current_path(int op) {
  const int p = g_path[op].load(std::memory_order_relaxed);
  return (p >= 0 && p < path_count(op)) ? p : 0;
}

// Rays traced together in lockstep over the planes they all cross (a beam).
constexpr int kBeam = 4;
#ifndef CT_PREFETCH
#define CT_PREFETCH 16
#endif
constexpr int kPrefetch = CT_PREFETCH;

// Line integrals of a beam of kBeam neighbouring rays that share the dominant
// axis, the array and its strides and are not planar: over the interior planes
// common to all of them the rays advance plane by plane together, so the
// stencils of one plane (neighbouring voxels, mostly the same cache lines) are
// loaded once for the beam, and the kBeam independent sums keep the core busy
// while a line is fetched.  Planes outside the common interior use the checked
// stencil of each ray.
template <typename real>
inline void beam_forward(const real* CT_RESTRICT vol, const ct::Ray<real>* r, real* acc) {
  int c0 = r[0].i0, c1 = r[0].i1;
  for (int g = 1; g < kBeam; ++g) { c0 = std::max(c0, r[g].i0); c1 = std::min(c1, r[g].i1); }
  if (c0 >= c1) {
    for (int g = 0; g < kBeam; ++g) acc[g] = ct::ray_forward(vol, r[g]);
    return;
  }
  real s[kBeam];
  for (int g = 0; g < kBeam; ++g) {
    real e = real(0);
    for (int n = r[g].n0; n < c0; ++n) e += ct::sample_checked(vol, r[g], n);
    s[g] = e;
  }
  const i64 sa = r[0].sa, sb = r[0].sb, sc = r[0].sc;
  real Ab[kBeam], Bb[kBeam], Ac[kBeam], Bc[kBeam];
  for (int g = 0; g < kBeam; ++g) { Ab[g] = r[g].Ab; Bb[g] = r[g].Bb; Ac[g] = r[g].Ac; Bc[g] = r[g].Bc; }
  const real* plane = vol + ((i64)c0 * sa - r[0].offset);
  const int pd = kPrefetch;
  for (int n = c0; n < c1; ++n, plane += sa) {
    const real fn = real(n);
    if (pd > 0) {
      // the first and last rays' stencil rows pd planes ahead (irregular strides defeat the hardware prefetcher)
      const real fb0 = Ab[0] + (fn + real(pd)) * Bb[0], fc0 = Ac[0] + (fn + real(pd)) * Bc[0];
      const real* q = plane + (i64)pd * sa + ((i64)fb0 * sb + (i64)fc0 * sc);
      __builtin_prefetch(q);
      __builtin_prefetch(q + sc);
    }
#pragma GCC unroll 4
    for (int g = 0; g < kBeam; ++g) {
      // interior: coordinates are positive, so truncation is floor
      const real fb = Ab[g] + fn * Bb[g];
      const real fc = Ac[g] + fn * Bc[g];
      const int ib = (int)fb, ic = (int)fc;
      const real tb = fb - real(ib), tc = fc - real(ic);
      const real* p = plane + ((i64)ib * sb + (i64)ic * sc);
      s[g] += (real(1) - tc) * ((real(1) - tb) * p[0] + tb * p[sb]) + tc * ((real(1) - tb) * p[sc] + tb * p[sb + sc]);
    }
  }
  for (int g = 0; g < kBeam; ++g) {
    real e = s[g];
    for (int n = c1; n < r[g].n1; ++n) e += ct::sample_checked(vol, r[g], n);
    acc[g] = e * r[g].w;
  }
}

// Forward: threads take (view, detector row) blocks; the inner loop walks
// neighbouring pixels of a row (the detector axis that moves least along z)
// in beams of kBeam rays, so consecutive rays share cache lines.
//
// Layout (docs/INTERNALS.md, "Forward: memory order"): a
// ray's bilinear stencil in plane n spans axes b and c; neighbouring rays of a
// row are spread along b.  With b the contiguous axis the two b-neighbours of
// the stencil share a cache line and so do neighbouring rays: 2 lines per
// sample instead of 4, measured 1.9x faster than walking the dominant axis a
// contiguously.  x-dominant rays (b = y) therefore read a copy of the slab with
// x and y swapped ((z, x, y) order); y- and z-dominant rays (b = x) read the
// slab itself.
template <typename real>
void forward(const real* vol, i64 vol_batch_stride, int batch, ct::VolumeWindow<real> vw, const real* src,
             const real* ctr, const real* ustep, const real* vstep, int cone, ct::DetectorWindow dw, real* out,
             int accumulate, int nthreads) {
  const int nu = dw.u1 - dw.u0, nv = dw.v1 - dw.v0;
  const i64 out_batch_stride = (i64)dw.n_views * nu * nv;
  const i64 rows = (i64)dw.n_views * nu;  // pixel rows, for the copy heuristic
  const int nz = vw.z1 - vw.z0;
  const i64 slab = (i64)nz * vw.H * vw.W;
  // Worth it when there are more rays than voxels to copy.
  const bool copy = slab > 0 && vw.H > 1 && vw.W > 1 && rows * nv >= slab / 4;
  // -pad paths: zero-bordered copies of a small slab (both orders, fwd::pad_slab) instead, so that the lanes'
  // interior planes reach past the window and the checked stencil almost never runs.  Only with at least as
  // many rays as voxels (the copies cost about what the edge planes save at a quarter of that: path
  // measurement slab, 0.375 rays per voxel, 10.4 against 9.2 ms) and both copies at most 64 MiB (a larger slab
  // spends little of its time on edge planes).
  const ForwardPath& path = kForwardPaths[current_path(0)];
#if defined(__AVX512F__) || defined(__AVX2__)
  const i64 pslab = ct::fwd::padded_slab(nz, vw.H, vw.W);
  const bool pad = std::is_same<real, float>::value && ct::fwd::kForwardLanes > 0 && path.pad && copy &&
                   rows * nv >= slab && slab < (i64(1) << 31) - 1 &&
                   2 * pslab * batch * (i64)sizeof(real) <= (i64(64) << 20);
#else
  const bool pad = false;
#endif
  ct::SlabBuffer<real> swapped(copy && !pad ? (size_t)(slab * batch) : 0, ct::kKeptForwardCopy);
  if (copy && !pad) ct::swap_xy(vol, swapped.data, slab, batch, nz, vw.H, vw.W, nthreads);
  // Rows of pixels: (view, u) with v inner, or (view, v) with u inner.
  const bool u_inner = ct::inner_is_u(ustep, vstep, dw.n_views);
  const int n_outer = u_inner ? nv : nu, n_inner = u_inner ? nu : nv;
  const i64 nrows = (i64)dw.n_views * n_outer;
  // float32 with AVX-512/AVX2: groups of kForwardLanes rays in vector lanes
  // (joseph_forward_cpu.hpp); otherwise beams of kBeam scalar rays.  The lane
  // code addresses a plane with 32-bit offsets from global voxel numbers: slabs below 2^31 elements, and
  // windows whose global voxel numbers fit 32 bits (the cpu backend moves a window past them to z0 = 0).
  constexpr bool lanes = std::is_same<real, float>::value && ct::fwd::kForwardLanes > 0;
  constexpr int kGroup = lanes ? ct::fwd::kForwardLanes : kBeam;
  const bool use_lanes = lanes && path.lanes && slab < (i64(1) << 31) - 1 &&
                         (i64)vw.z1 * vw.H * vw.W < (i64(1) << 31) - 1;
  const int group = use_lanes ? kGroup : kBeam;
  // Row order: view by view, or (bands) detector rows in bands of `band` rows, all views per band: a
  // band's rays stay in a z-range of the volume that the cache then keeps across the views, instead of
  // the whole volume streaming through it once per view.  Each ray is traced as before.
  const int band = path.bands ? ct::fwd::forward_band_rows((i64)vw.H * vw.W * (i64)sizeof(real), n_outer) : 0;
  // Chunks of 16 rows: neighbouring rows of one view write neighbouring floats of the output (rows run
  // along v, the output's last axis), so chunks of 4 put two threads on the same cache lines; 16 rows
  // cover a 64-byte line (2 threads, N = 64: 1.14x CPU-s against 4 rows, 1.17x for 64; N = 128 1.10x).
#ifndef CT_FORWARD_CHUNK
#define CT_FORWARD_CHUNK 16
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
  ct::SlabBuffer<real> padded(pad ? (size_t)(2 * pslab * batch) : 0, ct::kKeptForwardCopy);
  ct::fwd::PaddedSlab ps;
  if constexpr (lanes) {
    if (pad) {
      ct::fwd::pad_slab(vol, vol_batch_stride, batch, nz, vw.H, vw.W, padded.data, pslab, nthreads);
      ps = {padded.data, padded.data + pslab * batch, pslab};
    }
  }
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
  if constexpr (lanes) {
    const int tile = use_lanes && path.tiles ? ct::fwd::forward_tile_planes((i64)vw.H * vw.W * (i64)sizeof(real), band,
                                                                            (i64)std::max(vw.H, vw.W) * (i64)sizeof(real),
                                                                            n_outer)
                                             : 0;
    if (tile > 0) {
      const int tband = ct::fwd::tiled_band_rows(band, n_outer);
      const float* sw = copy ? swapped.data : nullptr;
#if defined(__AVX512F__)
      if (path.kind != ct::fwd::LaneKind::Avx2Gather) {
        ct::fwd::fused_forward_tiled<true, false>(vol, vol_batch_stride, sw, slab, batch, vw, src, ctr, ustep, vstep,
                                                  cone, dw, u_inner, tband, tile, out, out_batch_stride, accumulate,
                                                  nthreads, ps);
        return;
      }
#endif
      ct::fwd::fused_forward_tiled<true, true>(vol, vol_batch_stride, sw, slab, batch, vw, src, ctr, ustep, vstep, cone,
                                               dw, u_inner, tband, tile, out, out_batch_stride, accumulate, nthreads, ps);
      return;
    }
  }
#endif
#pragma omp parallel for schedule(dynamic, CT_FORWARD_CHUNK) num_threads(nthreads)
  for (i64 row = 0; row < nrows; ++row) {
    int k, outer;
    ct::fwd::row_view_and_outer(row, dw.n_views, n_outer, band, k, outer);
    for (int inner0 = 0; inner0 < n_inner; inner0 += group) {
      const int cnt = std::min(group, n_inner - inner0);
      ct::Ray<real> r[kGroup];
      bool hit[kGroup];
      const real* base[kGroup];
      i64 bstride[kGroup], oi[kGroup];
      bool beam = cnt == kBeam;
      int ius[kGroup], ivs[kGroup];
      for (int g = 0; g < cnt; ++g) {
        const int inner = inner0 + g;
        ius[g] = dw.u0 + (u_inner ? inner : outer);
        ivs[g] = dw.v0 + (u_inner ? outer : inner);
      }
#if defined(__AVX512F__) || defined(__AVX2__)
      if constexpr (lanes) {
        if (use_lanes && path.fused && path.kind == ct::fwd::LaneKind::Avx2Gather) {
          ct::fwd::fused_group<true, true>(vol, vol_batch_stride, copy ? swapped.data : nullptr, slab, batch, vw, src,
                                           ctr, ustep, vstep, cone, k, ius, ivs, dw, cnt, out, out_batch_stride,
                                           accumulate, ps);
          continue;
        }
        if (use_lanes && path.fused) {
          ct::fwd::fused_group<true>(vol, vol_batch_stride, copy ? swapped.data : nullptr, slab, batch, vw, src, ctr,
                                     ustep, vstep, cone, k, ius, ivs, dw, cnt, out, out_batch_stride, accumulate, ps);
          continue;
        }
      }
#endif
      unsigned ready = 0;  // lanes set up together (float32 lanes)
      if constexpr (lanes) {
        if (use_lanes)
          ready = ct::fwd::setup_lanes(vw, src, ctr, ustep, vstep, cone, k, ius, ivs, dw.U, dw.V, cnt, vw.z0, vw.z1,
                                       r, hit);
      }
      for (int g = 0; g < cnt; ++g) {
        const int ju = ius[g] - dw.u0, jv = ivs[g] - dw.v0;  // tile-local pixel
        if (!((ready >> g) & 1u)) {
          double o[3], d[3];
          ct::pixel_ray(src, ctr, ustep, vstep, cone, k, ius[g], ivs[g], dw.U, dw.V, o, d);
          r[g] = ct::Ray<real>{};
          hit[g] = ct::make_ray(vw, o, d, vw.z0, vw.z1, r[g]);
        }
        base[g] = vol;
        bstride[g] = vol_batch_stride;
        if (hit[g] && r[g].a == 0 && copy) {
          ct::ray_use_strides(r[g], (i64)vw.H, (i64)1, (i64)vw.H * vw.W);
          base[g] = swapped.data;
          bstride[g] = slab;
        }
        oi[g] = ((i64)k * nu + ju) * nv + jv;
        beam = beam && hit[g] && !r[g].planar && r[g].a == r[0].a && base[g] == base[0] &&
               r[g].sb == r[0].sb && r[g].sc == r[0].sc;
      }
      // Lanes: rays that can run in a lane (hit, not planar, b contiguous); each pass
      // traces the ones compatible with the first left (same axes, strides and array),
      // so a row where the dominant axis changes takes two passes.  The others (misses,
      // planar rays, b strided) are traced one by one.
      unsigned laneable = 0;
      if (use_lanes)
        for (int g = 0; g < cnt; ++g)
          if (hit[g] && !r[g].planar && r[g].sb == 1) laneable |= 1u << g;
      for (int q = 0; q < batch; ++q) {
        real val[kGroup];
        if (use_lanes) {
          if constexpr (lanes) {
            unsigned left = laneable;
            while (left) {
              const int lead = __builtin_ctz(left);
              unsigned part = 0;
              for (int g = lead; g < cnt; ++g)
                if (((left >> g) & 1u) && base[g] == base[lead] && ct::fwd::lane_compatible(r[g], r[lead]))
                  part |= 1u << g;
              ct::fwd::trace_group(base[lead] + q * bstride[lead], r, cnt, part, val, path.kind);
              left &= ~part;
            }
          }
          for (int g = 0; g < cnt; ++g)
            if (!((laneable >> g) & 1u)) val[g] = hit[g] ? ct::ray_forward(base[g] + q * bstride[g], r[g]) : real(0);
        } else if (beam) {
          beam_forward(base[0] + q * bstride[0], r, val);
        } else {
          for (int g = 0; g < cnt; ++g) val[g] = hit[g] ? ct::ray_forward(base[g] + q * bstride[g], r[g]) : real(0);
        }
        for (int g = 0; g < cnt; ++g) {
          real& dst = out[q * out_batch_stride + oi[g]];
          dst = accumulate ? dst + val[g] : val[g];
        }
      }
    }
  }
}

// Backward: kernels/joseph_backward_cpu.hpp.
template <typename real>
void backward(const real* sino, int batch, ct::VolumeWindow<real> vw, const real* src, const real* ctr,
              const real* ustep, const real* vstep, int cone, ct::DetectorWindow dw, real* vol,
              i64 vol_batch_stride, int nthreads) {
  ct::joseph_backward_cpu(sino, batch, vw, src, ctr, ustep, vstep, cone, dw, vol, vol_batch_stride, nthreads,
                          kBackPaths[current_path(1)].opt);
}

}  // namespace

#define CT_EXPORT extern "C" __attribute__((visibility("default")))

#define CT_JOSEPH_ENTRIES(real, suffix)                                                                          \
  CT_EXPORT void joseph_forward_##suffix(const real* vol, i64 vol_batch_stride, int batch, int D, int H, int W,   \
                                         int z0, int z1, double dx, double dy, double dz, const real* src,        \
                                         const real* ctr, const real* ustep, const real* vstep, int cone,          \
                                         int n_views, int U, int V, int u0, int u1, int v0, int v1, real* out,     \
                                         int accumulate, int nthreads) {                                          \
    ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};                                    \
    ct::DetectorWindow dw{n_views, U, V, u0, u1, v0, v1};                                                        \
    forward<real>(vol, vol_batch_stride, batch, vw, src, ctr, ustep, vstep, cone, dw, out, accumulate, nthreads); \
  }                                                                                                              \
  CT_EXPORT void joseph_backward_##suffix(const real* sino, int batch, int D, int H, int W, int z0, int z1,       \
                                          double dx, double dy, double dz, const real* src, const real* ctr,      \
                                          const real* ustep, const real* vstep, int cone, int n_views, int U,     \
                                          int V, int u0, int u1, int v0, int v1, real* vol,                       \
                                          i64 vol_batch_stride, int nthreads) {                                   \
    ct::VolumeWindow<real> vw{D, H, W, z0, z1, (real)dx, (real)dy, (real)dz};                                    \
    ct::DetectorWindow dw{n_views, U, V, u0, u1, v0, v1};                                                        \
    backward<real>(sino, batch, vw, src, ctr, ustep, vstep, cone, dw, vol, vol_batch_stride, nthreads);           \
  }

CT_JOSEPH_ENTRIES(float, f32)
CT_JOSEPH_ENTRIES(double, f64)

// Run-time path choice (ctbench/engine/cpu/path_choice.py).  op: 0 forward, 1 back.
CT_EXPORT long long joseph_l2_cache_bytes() { return ct::l2_cache_bytes(); }

CT_EXPORT int joseph_path_count(int op) { return path_count(op); }

CT_EXPORT const char* joseph_path_name(int op, int i) {
  if (i < 0 || i >= path_count(op)) return nullptr;
  return op == 0 ? kForwardPaths[i].name : kBackPaths[i].name;
}

// Select path i of op for later calls (process-wide); returns 0, or -1 when
// op or i is out of range (then nothing changes).
CT_EXPORT int joseph_set_path(int op, int i) {
  if (i < -1 || i >= path_count(op)) return -1;
  g_path[op].store(i, std::memory_order_relaxed);
  return 0;
}

CT_EXPORT int joseph_get_path(int op) { return path_count(op) > 0 ? current_path(op) : -1; }
