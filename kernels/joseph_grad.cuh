// Geometry gradient of Joseph's method: the vector-Jacobian product of the
// forward projection with respect to each ray's origin and direction.
//
// It differentiates the very function that kernels/joseph.cuh evaluates: the
// same Ray set-up (make_ray), the same planes and the same bilinear stencil
// with zeros outside the window.  Writing the plane positions of a ray as
//     f_b(n) = fo_b + (n - fo_a) * B_b,   B_b = fd_b / fd_a     (same for c),
// with fo, fd the origin and direction in voxel units and a the dominant
// axis, and the weight w = |d| / |fd_a|, the projection is
//     P = w * sum_n S_n(f_b(n), f_c(n)).
// Its derivatives need five sums along the ray (RaySums); ray_world_grad then
// chains them to d/d(origin) and d/d(direction) in world units.  The model is
// piecewise smooth: these are the derivatives inside a smooth piece (at a
// kink, the one-sided derivative that floor() picks, as autograd does).
#pragma once
#include "joseph.cuh"

namespace ct {

// Sums along one ray, already multiplied by the cotangent of that ray:
//   s  = sum S_n,  hb = sum dS/dfb,  tb = sum (n - fo_a) dS/dfb,  hc, tc likewise for axis c.
template <typename real>
struct RaySums {
  real s, hb, tb, hc, tc;
};

// Origin coordinate along the dominant axis in voxel units, exactly as make_ray computes it.
// Kept in double: with a far source it is ~1e6-1e8 and n - fo_a cancels most of it.
template <typename real>
CT_HD double origin_voxel_coord(const VolumeWindow<real>& vw, int axis, const double o[3]) {
  const double sp = axis == 0 ? (double)vw.dx : (axis == 1 ? (double)vw.dy : (double)vw.dz);
  const int n = axis == 0 ? vw.W : (axis == 1 ? vw.H : vw.D);
  return o[axis] * (1.0 / sp) + 0.5 * double(n - 1);
}

// Add y * (the five sums of ray r through the slab array vol) to acc.  The
// stencil and its bounds checks mirror ray_forward line by line.
template <typename real>
CT_HD void stencil_terms(const real* CT_RESTRICT vol, const Ray<real>& r, int n, int ib, int ic, real xb, real xc,
                         bool interior, double fo_a, real& s, real& hb, real& tb, real& hc,
                         real& tc) {
  const i64 base = (i64)n * r.sa + (i64)ib * r.sb + (i64)ic * r.sc - r.offset;
  real v00, v10, v01, v11;
  if (interior) {
    const real* p = vol + base;
    v00 = p[0]; v10 = p[r.sb]; v01 = p[r.sc]; v11 = p[r.sb + r.sc];
  } else {
    const bool b0 = ib >= r.lob && ib < r.hib, b1 = ib + 1 >= r.lob && ib + 1 < r.hib;
    const bool c0 = ic >= r.loc && ic < r.hic, c1 = ic + 1 >= r.loc && ic + 1 < r.hic;
    v00 = (b0 && c0) ? vol[base] : real(0);
    v10 = (b1 && c0) ? vol[base + r.sb] : real(0);
    v01 = (b0 && c1) ? vol[base + r.sc] : real(0);
    v11 = (b1 && c1) ? vol[base + r.sb + r.sc] : real(0);
  }
  const real lo_c = (real(1) - xb) * v00 + xb * v10;  // interpolated along b at c = ic
  const real hi_c = (real(1) - xb) * v01 + xb * v11;  // ... at c = ic + 1
  const real db = (real(1) - xc) * (v10 - v00) + xc * (v11 - v01);
  const real dc = hi_c - lo_c;
  const real tn = real(double(n) - fo_a);
  s += (real(1) - xc) * lo_c + xc * hi_c;
  hb += db; tb += tn * db;
  hc += dc; tc += tn * dc;
}

// Add y * (the five sums of ray r through the slab array vol) to acc.  The
// stencil and its bounds checks mirror ray_forward: checked edge planes, and
// interior planes (all four neighbours present, coordinates positive so that
// truncation is floor) without checks.  Rays on one voxel plane (2D scans)
// keep the checked stencil: their c+1 neighbour may lie outside the window.
template <typename real>
CT_HD void ray_stencil_sums(const real* CT_RESTRICT vol, const Ray<real>& r, double fo_a, real y,
                            RaySums<real>& acc) {
  real s = real(0), hb = real(0), tb = real(0), hc = real(0), tc = real(0);
  const int i0 = r.planar ? r.n0 : r.i0, i1 = r.planar ? r.n0 : (r.i1 > r.i0 ? r.i1 : r.i0);
  for (int n = r.n0; n < i0; ++n) {
    const real fb = r.Ab + real(n) * r.Bb, fc = r.Ac + real(n) * r.Bc;
    const real flb = CT_FLOOR(fb), flc = CT_FLOOR(fc);
    stencil_terms(vol, r, n, (int)flb, (int)flc, fb - flb, fc - flc, false, fo_a, s, hb, tb, hc, tc);
  }
  for (int n = i0; n < i1; ++n) {
    const real fb = r.Ab + real(n) * r.Bb, fc = r.Ac + real(n) * r.Bc;
    const int ib = (int)fb, ic = (int)fc;
    stencil_terms(vol, r, n, ib, ic, fb - real(ib), fc - real(ic), true, fo_a, s, hb, tb, hc, tc);
  }
  for (int n = i1 > r.n0 ? i1 : r.n0; n < r.n1; ++n) {
    const real fb = r.Ab + real(n) * r.Bb, fc = r.Ac + real(n) * r.Bc;
    const real flb = CT_FLOOR(fb), flc = CT_FLOOR(fc);
    stencil_terms(vol, r, n, (int)flb, (int)flc, fb - flb, fc - flc, false, fo_a, s, hb, tb, hc, tc);
  }
  acc.s += y * s; acc.hb += y * hb; acc.tb += y * tb; acc.hc += y * hc; acc.tc += y * tc;
}

// Chain the sums of ray r (origin o, direction d in world mm) to the world
// gradients of the projection with respect to o and d.
template <typename real>
CT_HD void ray_world_grad(const VolumeWindow<real>& vw, const Ray<real>& r, const double o[3], const double d[3],
                          const RaySums<real>& g, real go[3], real gd[3]) {
  (void)o;
  const real sp[3] = {vw.dx, vw.dy, vw.dz};
  const real fd_a = real(d[r.a] / (double)sp[r.a]);
  real gfo[3], gfd[3];
  // Plane positions: d f/d fo_b = 1, d f/d fo_a = -B_b; d f/d B_b = n - fo_a.
  gfo[r.b] = r.w * g.hb;
  gfo[r.c] = r.w * g.hc;
  gfo[r.a] = -(r.Bb * gfo[r.b] + r.Bc * gfo[r.c]);
  const real gBb = r.w * g.tb, gBc = r.w * g.tc;
  // B_b = fd_b / fd_a and w = |d| / |fd_a|  (dw/dfd_a = -w / fd_a).
  gfd[r.b] = gBb / fd_a;
  gfd[r.c] = gBc / fd_a;
  gfd[r.a] = -(r.Bb * gBb + r.Bc * gBc + g.s * r.w) / fd_a;
  // d w / d d_q = w d_q / |d|^2 = w u_q / |d| with u = d / |d| (no overflow of |d|^2).
  const double dn = CT_SQRT(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
  for (int q = 0; q < 3; ++q) {
    go[q] = gfo[q] / sp[q];
    gd[q] = gfd[q] / sp[q] + real(double(g.s * r.w) * (d[q] / dn) / dn);
  }
}

// Per-view accumulator layout: source (3), detector centre (3), ustep (3), vstep (3).
enum { GEO_SRC = 0, GEO_CTR = 3, GEO_U = 6, GEO_V = 9, GEO_N = 12 };

// Gradient contribution of pixel (iu, iv) of view k, for the rays' origin and
// direction gradients go, gd: adds into acc[GEO_N] (any accumulator type).
template <typename real, typename acc_t>
CT_HD void pixel_geometry_grad(int cone, int iu, int iv, int U, int V, const real go[3], const real gd[3],
                               acc_t* acc) {
  const real su = real(iu) - real(0.5) * real(U - 1);
  const real sv = real(iv) - real(0.5) * real(V - 1);
  for (int q = 0; q < 3; ++q) {
    // cone: origin = source, direction = pixel - source; parallel: origin = pixel, direction = source.
    const real gpix = cone ? gd[q] : go[q];
    const real gsrc = cone ? go[q] - gd[q] : gd[q];
    acc[GEO_SRC + q] += acc_t(gsrc);
    acc[GEO_CTR + q] += acc_t(gpix);
    acc[GEO_U + q] += acc_t(su * gpix);
    acc[GEO_V + q] += acc_t(sv * gpix);
  }
}

// The whole per-ray step: build the ray of pixel (iu, iv) in view k against
// the slab [vw.z0, vw.z1), gather the batch's cotangent-weighted sums and add
// the ray's geometry gradient into acc.  grad points at the cotangent of this
// ray in batch item 0; items are grad_batch_stride apart.
// vol_xy (may be null) is a copy of the slab with x and y swapped (batch items
// swapped_stride apart): rays advancing along y read it contiguously.
template <typename real, typename acc_t>
CT_HD void ray_geometry_vjp(const real* CT_RESTRICT vol, i64 vol_batch_stride, int batch,
                            const VolumeWindow<real>& vw, const real* src, const real* ctr, const real* ustep,
                            const real* vstep, int cone, int k, int iu, int iv, int U, int V,
                            const real* grad, i64 grad_batch_stride, acc_t* acc,
                            const real* vol_xy = nullptr, i64 swapped_stride = 0) {
  bool any = false;
  for (int q = 0; q < batch; ++q) any |= grad[q * grad_batch_stride] != real(0);
  if (!any) return;
  double o[3], d[3];
  pixel_ray(src, ctr, ustep, vstep, cone, k, iu, iv, U, V, o, d);
  Ray<real> r{};
  if (!make_ray(vw, o, d, vw.z0, vw.z1, r)) return;
  const double fo_a = origin_voxel_coord(vw, r.a, o);
  if (vol_xy != nullptr && r.a == 1) {
    ray_use_strides(r, (i64)vw.H, (i64)1, (i64)vw.H * vw.W);
    vol = vol_xy;
    vol_batch_stride = swapped_stride;
  }
  RaySums<real> sums{real(0), real(0), real(0), real(0), real(0)};
  for (int q = 0; q < batch; ++q) {
    const real y = grad[q * grad_batch_stride];
    if (y != real(0)) ray_stencil_sums(vol + q * vol_batch_stride, r, fo_a, y, sums);
  }
  real go[3], gd[3];
  ray_world_grad(vw, r, o, d, sums, go, gd);
  pixel_geometry_grad<real, acc_t>(cone, iu, iv, U, V, go, gd, acc);
}

}  // namespace ct
