// Joseph's method: per-ray forward projection and its exact transpose.
//
// A ray steps through the voxel-centre planes of its dominant axis (the axis
// along which it advances fastest in voxel units) and interpolates bilinearly
// in each plane; voxels outside the window count as zero.  The sample weight
// is the path length between consecutive planes.  Forward and backward use
// the very same Ray set-up and stencil, so the backprojector is the exact
// transpose of the projector.
#pragma once
#include "common.cuh"

namespace ct {

template <typename real>
struct Ray {
  // Continuous voxel index of the other two axes at plane n of the dominant
  // axis a:  f_b(n) = Ab + n * Bb,  f_c(n) = Ac + n * Bc.
  int a, b, c;
  real Ab, Bb, Ac, Bc;
  real w;                  // path length between consecutive planes (mm)
  int n0, n1;              // planes to march, [n0, n1)
  int lob, hib, loc, hic;  // index ranges of axes b and c that hold voxels
  i64 sa, sb, sc;          // strides of axes a, b, c in the slab array
  i64 offset;              // global -> slab-local index (z0 * H * W)
  int planar;              // the ray stays on voxel plane pc of axis c (2D scans,
  int pc;                  // axis-aligned rays): 1D interpolation along b only
  int i0, i1;              // interior planes: every stencil neighbour is in the window
};

// Restrict the plane interval (nlo, nhi) to planes where A + n*B lies in (lo-1, hi):
// outside it the bilinear stencil touches no voxel of [lo, hi).  Evaluated in
// double (per ray, not per sample) from the ray's stored coefficients.
// invB = 1 / B (one division per ray and axis, shared with interior_planes).
CT_HD void restrict_planes(double A, double B, double invB, int lo, int hi, double& nlo, double& nhi) {
  if (B == 0.0) {
    if (!(A > double(lo - 1) && A < double(hi))) { nlo = 1.0; nhi = -1.0; }
    return;
  }
  double t1 = (double(lo - 1) - A) * invB;
  double t2 = (double(hi) - A) * invB;
  if (t1 > t2) { double t = t1; t1 = t2; t2 = t; }
  nlo = tmax(nlo, t1);
  nhi = tmin(nhi, t2);
}

// Narrow (nlo, nhi) to planes where A + n*B lies in [lo + m, hi - m].  The
// margin m is far above the rounding of A + n*B, so in that range floor()
// cannot step outside [lo, hi] and the stencil needs no bounds checks.
CT_HD void interior_planes(double A, double B, double invB, int lo, int hi, double& nlo, double& nhi) {
  const double m = 1.0 / 64.0;
  if (hi - lo < 1) { nlo = 1.0; nhi = -1.0; return; }  // window too thin for a full stencil
  if (B == 0.0) {
    if (!(A >= double(lo) + m && A <= double(hi) - m)) { nlo = 1.0; nhi = -1.0; }
    return;
  }
  double t1 = (double(lo) + m - A) * invB;
  double t2 = (double(hi) - m - A) * invB;
  if (t1 > t2) { double t = t1; t1 = t2; t2 = t; }
  nlo = tmax(nlo, t1);
  nhi = tmin(nhi, t2);
}

// Build the ray with origin o and direction d (world, mm) against the volume
// window, restricted to voxels whose z index lies in [zlo, zhi).  Returns
// false when the ray touches no voxel there, or when its set-up is not finite
// (NaN/inf geometry, overflow): such a ray contributes nothing.
//
// The set-up runs in double: with a far source the origin sits ~1e6-1e8 voxels
// away and A = fo_b - fo_a * B cancels almost all of it; in float32 that
// cancellation alone cost 5% (source at 1e5 mm, 0.1 mm voxels).  The stored
// coefficients (A within a few grid sizes of the window for any ray that hits
// it, |B| <= 1) are then exact enough in the kernel's own precision.
template <typename real>
CT_HD bool make_ray(const VolumeWindow<real>& vw, const double o[3], const double d[3], int zlo, int zhi,
                    Ray<real>& r) {
  if (zlo >= zhi) return false;
  // Few divisions: the set-up runs once per ray and slab (the backprojector
  // sets a ray up once per z-chunk), so it shows in short rays' cost.
  const double isp[3] = {1.0 / (double)vw.dx, 1.0 / (double)vw.dy, 1.0 / (double)vw.dz};
  const int nn[3] = {vw.W, vw.H, vw.D};
  double fo[3], fd[3];
  for (int q = 0; q < 3; ++q) {
    fo[q] = o[q] * isp[q] + 0.5 * double(nn[q] - 1);
    fd[q] = d[q] * isp[q];
  }
  if (!all_finite(fo, 3) || !all_finite(fd, 3)) return false;
  int a = 0;
  if (CT_ABS(fd[1]) > CT_ABS(fd[a])) a = 1;
  if (CT_ABS(fd[2]) > CT_ABS(fd[a])) a = 2;
  if (fd[a] == 0.0) return false;
  int b = (a == 0) ? 1 : 0;
  int c = (a == 2) ? 1 : 2;
  int lo[3] = {0, 0, zlo};
  int hi[3] = {vw.W, vw.H, zhi};
  i64 stride[3] = {1, (i64)vw.W, (i64)vw.W * vw.H};
  r.a = a; r.b = b; r.c = c;
  const double ifa = 1.0 / fd[a];
  const double Bb = fd[b] * ifa, Bc = fd[c] * ifa;
  // w = |d| / |fd_a|; |d|^2 overflows only for |d| > 1e154 mm, then w = inf and the ray is rejected.
  const double w = CT_SQRT(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]) * CT_ABS(ifa);
  const double setup[5] = {fo[b] - fo[a] * Bb, Bb, fo[c] - fo[a] * Bc, Bc, w};
  r.Ab = (real)setup[0]; r.Bb = (real)setup[1];
  r.Ac = (real)setup[2]; r.Bc = (real)setup[3];
  r.w = (real)setup[4];
  const real stored[5] = {r.Ab, r.Bb, r.Ac, r.Bc, r.w};
  if (!all_finite(setup, 5) || !all_finite(stored, 5)) return false;
  r.lob = lo[b]; r.hib = hi[b]; r.loc = lo[c]; r.hic = hi[c];
  r.sa = stride[a]; r.sb = stride[b]; r.sc = stride[c];
  r.offset = (i64)vw.z0 * stride[2];
  // A ray that never leaves one voxel plane of b or c interpolates in 1D; put
  // that axis in c.  (Same values as the bilinear stencil with a zero weight.)
  if (r.Bb == real(0) && r.Ab == CT_FLOOR(r.Ab) && !(r.Bc == real(0) && r.Ac == CT_FLOOR(r.Ac))) {
    real tA = r.Ab, tB = r.Bb; r.Ab = r.Ac; r.Bb = r.Bc; r.Ac = tA; r.Bc = tB;
    int tl = r.lob, th = r.hib; r.lob = r.loc; r.hib = r.hic; r.loc = tl; r.hic = th;
    i64 ts = r.sb; r.sb = r.sc; r.sc = ts;
    int tx = r.b; r.b = r.c; r.c = tx;
  }
  r.planar = (r.Bc == real(0) && r.Ac == CT_FLOOR(r.Ac)) ? 1 : 0;
  r.pc = 0;
  if (r.planar) {
    // Range check before the conversion: Ac may be any finite value here.
    if (!(r.Ac >= real(r.loc) && r.Ac < real(r.hic))) return false;
    r.pc = (int)r.Ac;
  }
  const double Ab_ = (double)r.Ab, Bb_ = (double)r.Bb, Ac_ = (double)r.Ac, Bc_ = (double)r.Bc;
  const double iBb = 1.0 / Bb_, iBc = 1.0 / Bc_;  // inf for B == 0: that branch does not use it
  double nlo = double(lo[a]), nhi = double(hi[a] - 1);
  restrict_planes(Ab_, Bb_, iBb, r.lob, r.hib, nlo, nhi);
  restrict_planes(Ac_, Bc_, iBc, r.loc, r.hic, nlo, nhi);
  if (!(nlo <= nhi + 1.0)) return false;
  // Conservative integer bounds (one spare plane each side absorbs rounding;
  // the stencil's own bounds checks zero any sample outside the window).
  const double big = 1.0e8;
  int n0 = (int)CT_FLOOR(clampd(nlo, -big, big));
  int n1 = (int)CT_FLOOR(clampd(nhi, -big, big)) + 2;
  r.n0 = n0 > lo[a] ? n0 : lo[a];
  r.n1 = n1 < hi[a] ? n1 : hi[a];
  if (r.n0 >= r.n1) return false;
  // Interior planes [i0, i1): floor(f) in [lo, hi-2] for b (and c), so both
  // neighbours of the stencil exist.
  double ilo = double(r.n0), ihi = double(r.n1 - 1);
  interior_planes(Ab_, Bb_, iBb, r.lob, r.hib - 1, ilo, ihi);
  if (!r.planar) interior_planes(Ac_, Bc_, iBc, r.loc, r.hic - 1, ilo, ihi);
  r.i0 = r.n0; r.i1 = r.n0;
  if (ilo <= ihi) {
    const int c0 = -(int)CT_FLOOR(clampd(-ilo, -big, big));     // ceil(ilo)
    const int c1 = (int)CT_FLOOR(clampd(ihi, -big, big)) + 1;   // floor(ihi) + 1
    const int i0 = c0 > r.n0 ? c0 : r.n0;
    const int i1 = c1 < r.n1 ? c1 : r.n1;
    if (i0 < i1) { r.i0 = i0; r.i1 = i1; }
  }
  return true;
}

// Re-point a ray at a copy of the slab stored with other strides for the
// world axes (x, y, z); the z stride (plane size) must stay the same.
template <typename real>
CT_HD void ray_use_strides(Ray<real>& r, i64 sx, i64 sy, i64 sz) {
  const i64 st[3] = {sx, sy, sz};
  r.sa = st[r.a]; r.sb = st[r.b]; r.sc = st[r.c];
}

// The bilinear stencil of plane n with its bounds checks (edge planes of a
// ray): neighbours (b, c), (b+1, c), (b, c+1), (b+1, c+1) at base + offset[q],
// their weights, and which of them lie inside the window.  Rays on one voxel
// plane (planar) use c = pc and only the first two.
template <typename real>
struct EdgeStencil {
  i64 base;
  i64 offset[4];
  real w[4];
  bool inside[4];
};

template <typename real>
CT_HD EdgeStencil<real> edge_stencil(const Ray<real>& r, int n) {
  EdgeStencil<real> e;
  const real fb = r.Ab + real(n) * r.Bb;
  const real flb = CT_FLOOR(fb);
  const int ib = (int)flb;
  const real tb = fb - flb;
  const bool b0 = ib >= r.lob && ib < r.hib, b1 = ib + 1 >= r.lob && ib + 1 < r.hib;
  int ic = r.pc;
  real tc = real(0);
  bool c0 = true, c1 = false;
  if (!r.planar) {
    const real fc = r.Ac + real(n) * r.Bc;
    const real flc = CT_FLOOR(fc);
    ic = (int)flc;
    tc = fc - flc;
    c0 = ic >= r.loc && ic < r.hic;
    c1 = ic + 1 >= r.loc && ic + 1 < r.hic;
  }
  e.base = (i64)n * r.sa + (i64)ib * r.sb + (i64)ic * r.sc - r.offset;
  e.offset[0] = 0; e.offset[1] = r.sb; e.offset[2] = r.sc; e.offset[3] = r.sb + r.sc;
  e.w[0] = (real(1) - tb) * (real(1) - tc); e.w[1] = tb * (real(1) - tc);
  e.w[2] = (real(1) - tb) * tc;             e.w[3] = tb * tc;
  e.inside[0] = b0 && c0; e.inside[1] = b1 && c0; e.inside[2] = b0 && c1; e.inside[3] = b1 && c1;
  return e;
}

// One stencil sample with bounds checks.
template <typename real>
CT_HD real sample_checked(const real* CT_RESTRICT vol, const Ray<real>& r, int n) {
  const EdgeStencil<real> e = edge_stencil(r, n);
  real s = real(0);
  for (int q = 0; q < 4; ++q)
    if (e.inside[q]) s += e.w[q] * vol[e.base + e.offset[q]];
  return s;
}

// Line integral of one ray through a slab array (global indices minus offset):
// checked edge planes, then the interior planes without any bounds checks.
template <typename real>
CT_HD real ray_forward(const real* CT_RESTRICT vol, const Ray<real>& r) {
  real acc = real(0);
  for (int n = r.n0; n < r.i0; ++n) acc += sample_checked(vol, r, n);
  const i64 sa = r.sa, sb = r.sb, sc = r.sc;
  if (r.planar) {
    const real* plane = vol + ((i64)r.pc * sc + (i64)r.i0 * sa - r.offset);
    for (int n = r.i0; n < r.i1; ++n, plane += sa) {
      const real fb = r.Ab + real(n) * r.Bb;
      const int ib = (int)fb;
      const real tb = fb - real(ib);
      const real* p = plane + (i64)ib * sb;
      acc += (real(1) - tb) * p[0] + tb * p[sb];
    }
  } else {
    // Interior coordinates are positive, so truncation is floor; the plane
    // pointer advances by one stride per plane.
    const real* plane = vol + ((i64)r.i0 * sa - r.offset);
    for (int n = r.i0; n < r.i1; ++n, plane += sa) {
      const real fb = r.Ab + real(n) * r.Bb;
      const real fc = r.Ac + real(n) * r.Bc;
      const int ib = (int)fb, ic = (int)fc;
      const real tb = fb - real(ib), tc = fc - real(ic);
      const real* p = plane + ((i64)ib * sb + (i64)ic * sc);
      acc += (real(1) - tc) * ((real(1) - tb) * p[0] + tb * p[sb]) + tc * ((real(1) - tb) * p[sc] + tb * p[sb + sc]);
    }
  }
  for (int n = r.i1 > r.i0 ? r.i1 : r.i0; n < r.n1; ++n) acc += sample_checked(vol, r, n);
  return acc * r.w;
}

// Transpose: spread value * w along the ray into the slab array.  ATOMIC is
// true on the GPU (threads share voxels) and false on the CPU, where a thread
// owns the z-range the ray was built for.
template <typename real, bool ATOMIC>
CT_HD void add_voxel(real* p, real v) {
  if (ATOMIC) CT_ATOMIC_ADD(p, v);
  else *p += v;
}

template <typename real, bool ATOMIC>
CT_HD void scatter_checked(real* CT_RESTRICT vol, const Ray<real>& r, int n, real v) {
  const EdgeStencil<real> e = edge_stencil(r, n);
  for (int q = 0; q < 4; ++q)
    if (e.inside[q]) add_voxel<real, ATOMIC>(vol + e.base + e.offset[q], e.w[q] * v);
}

template <typename real, bool ATOMIC>
CT_HD void ray_backward(real* CT_RESTRICT vol, const Ray<real>& r, real value) {
  const real v = value * r.w;
  for (int n = r.n0; n < r.i0; ++n) scatter_checked<real, ATOMIC>(vol, r, n, v);
  const i64 sa = r.sa, sb = r.sb, sc = r.sc;
  if (r.planar) {
    real* plane = vol + ((i64)r.pc * sc + (i64)r.i0 * sa - r.offset);
    for (int n = r.i0; n < r.i1; ++n, plane += sa) {
      const real fb = r.Ab + real(n) * r.Bb;
      const int ib = (int)fb;  // interior: positive, truncation is floor
      const real tb = fb - real(ib);
      real* p = plane + (i64)ib * sb;
      add_voxel<real, ATOMIC>(p, (real(1) - tb) * v);
      add_voxel<real, ATOMIC>(p + sb, tb * v);
    }
  } else {
    real* plane = vol + ((i64)r.i0 * sa - r.offset);
    for (int n = r.i0; n < r.i1; ++n, plane += sa) {
      const real fb = r.Ab + real(n) * r.Bb;
      const real fc = r.Ac + real(n) * r.Bc;
      const int ib = (int)fb, ic = (int)fc;  // interior: positive, truncation is floor
      const real tb = fb - real(ib), tc = fc - real(ic);
      real* p = plane + ((i64)ib * sb + (i64)ic * sc);
      const real vb = (real(1) - tc) * v, vc = tc * v;
      add_voxel<real, ATOMIC>(p, (real(1) - tb) * vb);
      add_voxel<real, ATOMIC>(p + sb, tb * vb);
      add_voxel<real, ATOMIC>(p + sc, (real(1) - tb) * vc);
      add_voxel<real, ATOMIC>(p + sb + sc, tb * vc);
    }
  }
  for (int n = r.i1 > r.i0 ? r.i1 : r.i0; n < r.n1; ++n) scatter_checked<real, ATOMIC>(vol, r, n, v);
}

// World-space origin and direction of the ray through pixel (iu, iv) of view k,
// in double (see make_ray).  Geometry arrays are (n_views, 3): src holds the
// source (cone) or the ray direction (parallel); ustep/vstep are the detector
// axes times pixel pitch.
template <typename real>
CT_HD void pixel_ray(const real* src, const real* ctr, const real* ustep, const real* vstep, int cone,
                     int k, int iu, int iv, int U, int V, double o[3], double d[3]) {
  const double su = double(iu) - 0.5 * double(U - 1);
  const double sv = double(iv) - 0.5 * double(V - 1);
  for (int q = 0; q < 3; ++q) {
    const double s = (double)src[3 * k + q];
    const double p = (double)ctr[3 * k + q] + su * (double)ustep[3 * k + q] + sv * (double)vstep[3 * k + q];
    if (cone) { o[q] = s; d[q] = p - s; }
    else { o[q] = p; d[q] = s; }
  }
}

// Detector pixel ranges [iu_lo, iu_hi) x [iv_lo, iv_hi) whose rays can touch
// voxels of the z-range [zlo, zhi) in view k: the box (widened by the one-voxel
// stencil support) is projected corner by corner onto the detector plane.  A
// perspective map sends the box to the convex hull of its corner images as
// long as the box lies on one side of the plane through the source parallel to
// the detector; otherwise the whole detector is returned.
template <typename real>
CT_HD void slab_pixel_bounds(const VolumeWindow<real>& vw, const real* src, const real* ctr, const real* ustep,
                             const real* vstep, int cone, int k, int zlo, int zhi, int U, int V,
                             int& iu_lo, int& iu_hi, int& iv_lo, int& iv_hi) {
  iu_lo = 0; iu_hi = U; iv_lo = 0; iv_hi = V;
  const double eu[3] = {ustep[3 * k], ustep[3 * k + 1], ustep[3 * k + 2]};
  const double ev[3] = {vstep[3 * k], vstep[3 * k + 1], vstep[3 * k + 2]};
  const double c[3] = {ctr[3 * k], ctr[3 * k + 1], ctr[3 * k + 2]};
  const double s[3] = {src[3 * k], src[3 * k + 1], src[3 * k + 2]};
  // Non-finite geometry: keep the whole detector (make_ray then rejects every ray).
  if (!all_finite(eu, 3) || !all_finite(ev, 3) || !all_finite(c, 3) || !all_finite(s, 3)) return;
  const double nrm[3] = {eu[1] * ev[2] - eu[2] * ev[1], eu[2] * ev[0] - eu[0] * ev[2], eu[0] * ev[1] - eu[1] * ev[0]};
  const double guu = eu[0] * eu[0] + eu[1] * eu[1] + eu[2] * eu[2];
  const double gvv = ev[0] * ev[0] + ev[1] * ev[1] + ev[2] * ev[2];
  const double guv = eu[0] * ev[0] + eu[1] * ev[1] + eu[2] * ev[2];
  const double det = guu * gvv - guv * guv;
  if (!(det > 1e-30 * guu * gvv)) return;
  const double lo[3] = {(-1.0 - 0.5 * (vw.W - 1)) * vw.dx, (-1.0 - 0.5 * (vw.H - 1)) * vw.dy,
                        (zlo - 1.0 - 0.5 * (vw.D - 1)) * vw.dz};
  const double hi[3] = {(vw.W - 0.5 * (vw.W - 1)) * vw.dx, (vw.H - 0.5 * (vw.H - 1)) * vw.dy,
                        (zhi - 0.5 * (vw.D - 1)) * vw.dz};
  double amin = 1e300, amax = -1e300, bmin = 1e300, bmax = -1e300;
  int side = 0;
  for (int corner = 0; corner < 8; ++corner) {
    const double X[3] = {(corner & 1) ? hi[0] : lo[0], (corner & 2) ? hi[1] : lo[1], (corner & 4) ? hi[2] : lo[2]};
    double P[3];
    if (cone) {
      const double dX[3] = {X[0] - s[0], X[1] - s[1], X[2] - s[2]};
      const double den = nrm[0] * dX[0] + nrm[1] * dX[1] + nrm[2] * dX[2];
      const double num = nrm[0] * (c[0] - s[0]) + nrm[1] * (c[1] - s[1]) + nrm[2] * (c[2] - s[2]);
      const int sg = den > 0 ? 1 : (den < 0 ? -1 : 0);
      if (sg == 0 || (side != 0 && sg != side)) return;
      side = sg;
      const double t = num / den;
      for (int q = 0; q < 3; ++q) P[q] = s[q] + t * dX[q];
    } else {
      const double den = nrm[0] * s[0] + nrm[1] * s[1] + nrm[2] * s[2];
      if (den == 0) return;
      const double t = (nrm[0] * (c[0] - X[0]) + nrm[1] * (c[1] - X[1]) + nrm[2] * (c[2] - X[2])) / den;
      for (int q = 0; q < 3; ++q) P[q] = X[q] + t * s[q];
    }
    const double r[3] = {P[0] - c[0], P[1] - c[1], P[2] - c[2]};
    const double ru = r[0] * eu[0] + r[1] * eu[1] + r[2] * eu[2];
    const double rv = r[0] * ev[0] + r[1] * ev[1] + r[2] * ev[2];
    const double A = (gvv * ru - guv * rv) / det + 0.5 * (U - 1);
    const double B = (guu * rv - guv * ru) / det + 0.5 * (V - 1);
    amin = A < amin ? A : amin; amax = A > amax ? A : amax;
    bmin = B < bmin ? B : bmin; bmax = B > bmax ? B : bmax;
  }
  const double big = 1e9;
  const int a0 = (int)CT_FLOOR(clampd(amin, -big, big)) - 1, a1 = (int)CT_FLOOR(clampd(amax, -big, big)) + 2;
  const int b0 = (int)CT_FLOOR(clampd(bmin, -big, big)) - 1, b1 = (int)CT_FLOOR(clampd(bmax, -big, big)) + 2;
  iu_lo = a0 > 0 ? a0 : 0; iu_hi = a1 < U ? a1 : U;
  iv_lo = b0 > 0 ? b0 : 0; iv_hi = b1 < V ? b1 : V;
}

}  // namespace ct
