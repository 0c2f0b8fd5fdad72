// Voxel-driven weighted backprojection: the backprojector of FDK and FBP.
//
// Every view is described by the same general vectors as the Joseph family
// (source or ray direction, detector centre, u*du, v*dv), so one kernel
// serves circular cone beam, helical orbits, fan 2D (D=1) and parallel beams.
//
// Per view, a 3x4 projective matrix P maps a world point x (mm) to
//     (i*w, j*w, w) = P [x; 1]
// where (i, j) are the continuous detector pixel indices hit by the ray
// through x (pixel centres at integers, as in the projector) and, for a cone
// beam, w = ((x - s).n) / ((c - s).n): the depth of x along the detector
// normal relative to the detector's own depth.  1/w is the magnification and
// 1/w^2 the FDK distance weight.  For parallel beams w = 1.
//
// Composed with the voxel-index -> world map, the matrix is affine in the
// voxel indices, so along a voxel row (x) the three numerators are
// start + ix * step: the incremental update that makes the inner loop cheap.
//
// A cylindrical detector centred on the source (``cone == 2``: the cylinder's
// axis along v through the source, radius R the distance from the source to the
// detector centre, u the arc length along the cylinder) uses the same affine
// rows for the voxel's coordinates in the view's frame, a = (x - s).u/R,
// b = (x - s).v/dv and w = (x - s).n/R; its pixel is then
// (i, j) = (R/du atan2(a, w) + (U-1)/2, b/rho + (V-1)/2) with rho = |(a, w)|, and
// its FDK distance weight (R/rho_mm)^2 = 1/rho^2 (the fan-beam formula for an
// equiangular detector: the in-plane distance to the source).
#pragma once
#include "common.cuh"

namespace ct {

// Detector kinds of the ``cone`` argument: 0 parallel beam, 1 flat cone/fan beam, 2 cylindrical cone/fan beam.
enum FdkBeam { kFdkParallel = 0, kFdkFlat = 1, kFdkCylinder = 2 };

template <typename real>
CT_HD real fdk_atan2(real y, real x) {
#if CT_DEVICE && !defined(CT_CUDA_EMULATION)
  return atan2(y, x);
#else
  return std::atan2(y, x);
#endif
}

// Cross product helper on plain arrays (double precision for the set-up).
CT_HD void cross3(const double a[3], const double b[3], double out[3]) {
  out[0] = a[1] * b[2] - a[2] * b[1];
  out[1] = a[2] * b[0] - a[0] * b[2];
  out[2] = a[0] * b[1] - a[1] * b[0];
}

CT_HD double dot3(const double a[3], const double b[3]) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

// The projective matrix of view k (row-major 3x4, world mm -> pixel indices).
// Returns false for a degenerate view (detector axes parallel, or a cone-beam
// source lying in the detector plane, or rays parallel to the detector) and for
// a view whose geometry or matrix is not finite: such a view contributes nothing.
template <typename real>
CT_HD bool fdk_view_matrix(const real* src, const real* ctr, const real* ustep, const real* vstep, int cone, int k,
                           int U, int V, double P[12]) {
  double s[3], c[3], u[3], v[3];
  for (int q = 0; q < 3; ++q) {
    s[q] = (double)src[3 * k + q];
    c[q] = (double)ctr[3 * k + q];
    u[q] = (double)ustep[3 * k + q];
    v[q] = (double)vstep[3 * k + q];
  }
  if (!all_finite(s, 3) || !all_finite(c, 3) || !all_finite(u, 3) || !all_finite(v, 3)) return false;
  double n[3], au[3], av[3];
  cross3(u, v, n);
  const double nn = dot3(n, n);
  if (!(nn > 0.0)) return false;
  // Dual basis of the detector plane: au.u = 1, au.v = 0, au.n = 0 (and alike for av),
  // so a point h on the plane has pixel offsets ((h - c).au, (h - c).av).
  cross3(v, n, au);
  cross3(n, u, av);
  for (int q = 0; q < 3; ++q) { au[q] /= nn; av[q] /= nn; }
  const double ou = 0.5 * (double)(U - 1), ov = 0.5 * (double)(V - 1);
  if (cone) {
    double cs[3] = {c[0] - s[0], c[1] - s[1], c[2] - s[2]};
    const double depth = dot3(cs, n);
    if (depth == 0.0) return false;
    // w(x) = g.x - g.s with g = n / ((c - s).n); the hit point's offsets times w are
    // au.(x - s) + w * au.(s - c), affine in x.
    double g[3] = {n[0] / depth, n[1] / depth, n[2] / depth};
    const double gs = dot3(g, s);
    const double us = -dot3(au, cs), vs = -dot3(av, cs);  // au.(s - c), av.(s - c)
    for (int q = 0; q < 3; ++q) {
      P[8 + q] = g[q];
      P[q] = au[q] + us * g[q] + ou * g[q];
      P[4 + q] = av[q] + vs * g[q] + ov * g[q];
    }
    P[11] = -gs;
    P[3] = -dot3(au, s) - us * gs - ou * gs;
    P[7] = -dot3(av, s) - vs * gs - ov * gs;
  } else {
    // Parallel: x moves along d to the plane, t = (c - x).n / (d.n); the offset is
    // au.(x - c) + t au.d, affine in x; w = 1.
    const double dn = dot3(s, n);
    if (dn == 0.0) return false;
    const double ud = dot3(au, s) / dn, vd = dot3(av, s) / dn;
    const double cn = dot3(c, n);
    for (int q = 0; q < 3; ++q) {
      P[q] = au[q] - ud * n[q];
      P[4 + q] = av[q] - vd * n[q];
      P[8 + q] = 0.0;
    }
    P[3] = -dot3(au, c) + ud * cn + ou;
    P[7] = -dot3(av, c) + vd * cn + ov;
    P[11] = 1.0;
  }
  return all_finite(P, 12);
}

// The rows of a cylindrical detector's view (module comment): P x = (a, b, w) for a world point x, and
// kR = R/du, the column index per radian.  False for a degenerate or non-finite view.
template <typename real>
CT_HD bool fdk_view_matrix_cylinder(const real* src, const real* ctr, const real* ustep, const real* vstep, int k,
                                    double P[12], double* kR) {
  double s[3], c[3], u[3], v[3];
  for (int q = 0; q < 3; ++q) {
    s[q] = (double)src[3 * k + q];
    c[q] = (double)ctr[3 * k + q];
    u[q] = (double)ustep[3 * k + q];
    v[q] = (double)vstep[3 * k + q];
  }
  if (!all_finite(s, 3) || !all_finite(c, 3) || !all_finite(u, 3) || !all_finite(v, 3)) return false;
  const double du = CT_SQRT(dot3(u, u)), dv = CT_SQRT(dot3(v, v));
  if (!(du > 0.0) || !(dv > 0.0)) return false;
  double n[3];
  cross3(u, v, n);
  const double nn = CT_SQRT(dot3(n, n));
  if (!(nn > 0.0)) return false;
  double cs[3] = {c[0] - s[0], c[1] - s[1], c[2] - s[2]};
  double R = dot3(cs, n) / nn;
  const double sign = R < 0.0 ? -1.0 : 1.0;
  R *= sign;
  if (!(R > 0.0)) return false;
  for (int q = 0; q < 3; ++q) {
    P[q] = u[q] / (du * R);
    P[4 + q] = v[q] / (dv * dv);
    P[8 + q] = sign * n[q] / (nn * R);
  }
  P[3] = -dot3(P, s);
  P[7] = -dot3(P + 4, s);
  P[11] = -dot3(P + 8, s);
  *kR = R / du;
  return all_finite(P, 12) && CT_ISFINITE(*kR);
}

// Compose the view matrix with the voxel grid: M [ix, iy, iz, 1] = P [x; 1] for
// the voxel of global indices (ix, iy, iz) (centred grid, spacing dx, dy, dz).
template <typename real>
CT_HD void fdk_index_matrix(const double P[12], const VolumeWindow<real>& vw, double M[12]) {
  const double hx = 0.5 * (double)(vw.W - 1), hy = 0.5 * (double)(vw.H - 1), hz = 0.5 * (double)(vw.D - 1);
  const double dx = (double)vw.dx, dy = (double)vw.dy, dz = (double)vw.dz;
  for (int r = 0; r < 3; ++r) {
    const double* p = P + 4 * r;
    M[4 * r + 0] = p[0] * dx;
    M[4 * r + 1] = p[1] * dy;
    M[4 * r + 2] = p[2] * dz;
    M[4 * r + 3] = p[3] - p[0] * dx * hx - p[1] * dy * hy - p[2] * dz * hz;
  }
}

// The index matrix is usable in the kernel's precision: every entry finite
// once rounded to real (a float32 kernel would otherwise see inf).
template <typename real>
CT_HD bool fdk_index_matrix_ok(const double M[12]) {
  bool ok = all_finite(M, 12);
  for (int i = 0; i < 12; ++i) ok = ok && CT_ISFINITE((real)M[i]);
  return ok;
}

// Bilinear sample of a filtered projection at continuous pixel indices (fi, fj),
// zero outside the detector.  ``su``/``sv`` are the element strides of u and v
// within one projection (32-bit: a single projection is far below 2^31 values).
// Written without branches (clamped indices, validity factors chosen by
// selects, 32-bit offsets) so the CPU loop vectorises with gathers.
template <typename real>
CT_HD real fdk_bilinear(const real* CT_RESTRICT q, int su, int sv, int U, int V, real fi, real fj) {
  // Shift by 2 so that truncation is floor on the clamped range [0, U+3].
  fi = tmin(tmax(fi + real(2), real(0)), real(U + 3));
  fj = tmin(tmax(fj + real(2), real(0)), real(V + 3));
  const int i0 = (int)fi - 2, j0 = (int)fj - 2;
  const real ti = fi - real(i0 + 2), tj = fj - real(j0 + 2);
  const real wi0 = ((i0 >= 0) & (i0 < U)) ? real(1) - ti : real(0);
  const real wi1 = ((i0 >= -1) & (i0 < U - 1)) ? ti : real(0);
  const real wj0 = ((j0 >= 0) & (j0 < V)) ? real(1) - tj : real(0);
  const real wj1 = ((j0 >= -1) & (j0 < V - 1)) ? tj : real(0);
  const int c0 = tmin(tmax(i0, 0), U - 1) * su, c1 = tmin(tmax(i0 + 1, 0), U - 1) * su;
  const int r0 = tmin(tmax(j0, 0), V - 1) * sv, r1 = tmin(tmax(j0 + 1, 0), V - 1) * sv;
  return wj0 * (wi0 * q[r0 + c0] + wi1 * q[r0 + c1]) + wj1 * (wi0 * q[r1 + c0] + wi1 * q[r1 + c1]);
}

// Contribution of one view to one voxel, given the three numerators
// a = i*w, b = j*w and w.  Cone beams weight by 1/w^2; points at or behind the
// source plane (w <= 0) receive nothing.  The division runs on a safe operand
// so that the compiler may evaluate it unconditionally (vectorisation).
template <typename real>
CT_HD real fdk_contribution(const real* CT_RESTRICT q, int su, int sv, int U, int V, real a, real b, real w,
                            int cone) {
  if (!cone) return fdk_bilinear(q, su, sv, U, V, a, b);
  const bool front = w > real(0);
  const real inv = real(1) / (front ? w : real(1));
  const real val = fdk_bilinear(q, su, sv, U, V, a * inv, b * inv);
  return front ? val * inv * inv : real(0);
}

// Contribution of one view to one voxel on a cylindrical detector, given its rows a, b, w and kR (module
// comment).  Points at or behind the source's plane parallel to the detector's centre (w <= 0) receive
// nothing.
template <typename real>
CT_HD real fdk_contribution_cylinder(const real* CT_RESTRICT q, int su, int sv, int U, int V, real a, real b,
                                     real w, real kR) {
  const bool front = w > real(0);
  const real rho2 = front ? a * a + w * w : real(1);
  const real inv = real(1) / CT_SQRT(rho2);
  const real fi = kR * fdk_atan2(a, front ? w : real(1)) + real(0.5) * real(U - 1);
  const real fj = b * inv + real(0.5) * real(V - 1);
  const real val = fdk_bilinear(q, su, sv, U, V, fi, fj);
  return front ? val * inv * inv : real(0);
}

// Any beam: parallel (0), flat cone (1) or cylindrical cone (2, with kR).
template <typename real>
CT_HD real fdk_contribution_any(const real* CT_RESTRICT q, int su, int sv, int U, int V, real a, real b, real w,
                                int cone, real kR) {
  if (cone == kFdkCylinder) return fdk_contribution_cylinder(q, su, sv, U, V, a, b, w, kR);
  return fdk_contribution(q, su, sv, U, V, a, b, w, cone);
}

}  // namespace ct
