"""Centre of rotation (detector offset) of a circular scan, found from the data by two independent methods.

The offset ``o`` is how far (mm, along u) the detector centre sits from the
foot of the perpendicular from the source through the rotation axis; it is
the ``detector_offset[0]`` of :func:`ctbench.circular_trajectory_3d`.  Both
methods use the mid-plane (the detector rows through z = 0), where a
circular cone-beam scan is an exact fan-beam scan.

1. Conjugate rays (:func:`offset_by_conjugate_rays`): every ray of a full
   turn is measured twice, from opposite sides.  For a candidate ``o`` each
   measured pixel is mapped to the view and pixel of its conjugate ray
   (computed from the geometry, so fan and parallel beams are handled alike)
   and compared with the data interpolated there; the offset minimises the
   mean squared mismatch.  For parallel beams this is the registration of
   each view with the mirrored view 180 degrees away.  A parallel scan of
   (about) 180 degrees has few such pairs, typically only its two end views
   (0 and 180 degrees, the second one legitimate: it is the first one
   mirrored about the axis).  There :func:`find_centre` completes the
   half turn to a full one with its mirror about each candidate axis and
   takes the axis whose completion is most consistent (the least spectral
   energy outside the double wedge, :func:`offset_by_double_wedge`; the
   idea of Vo et al. 2014), and cross-checks it by registering the views
   180 degrees apart over all detector rows
   (:func:`offset_by_opposite_views`); the even and the odd views give the
   confidence.  (The sharpness of FBP slices does not peak at the centre of
   a half turn: a wrong axis leaves its edges sharp.)
2. Sharpness sweep (:func:`offset_by_sharpness`): quick FBP reconstructions
   of the mid-plane for a range of offsets; a wrong centre smears every edge
   into arcs and lowers the energy of the image gradient; the offset
   maximises it.

:func:`find_centre` runs the first and cross-checks it with the second.

It refuses input that holds no centre (a constant or all-zero sinogram, a
single view, NaN angles, a search range wider than the detector), fills
non-finite pixels from their neighbours along the row (counted in the
result) as long as they are isolated damage: more than
``MAX_NONFINITE_FRACTION`` (10%) of the mid-plane pixels, or more than half of
one view's, are refused (a centre read off interpolated values is a number
made up, not found), and reports a ``confidence`` in [0, 1] with every answer: the
agreement of two independent estimates, the conjugate-ray offsets of the
even and of the odd views (``split_px`` apart):
``confidence = 1 / (1 + (split_px / 0.5 px)**2)``.  Data with a centre give
the same answer from either half (confidence near 1); noise or data without
structure give two unrelated minima (near 0).  The depth of the mismatch
curve's minimum (``depth`` = 1 - min / median) is reported beside it.  Below
``LOW_CONFIDENCE`` the result's text says the answer is not to be trusted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class CentreResult:
    """The offset found (pixels and mm) and the cross-check by the second method."""

    offset_px: float
    pitch: float
    method: str
    cross_check_px: float | None = None
    cross_check_method: str = ""
    curve: dict = field(default_factory=dict)      # method -> (offsets_px, costs) for plots
    depth: float | None = None          # 1 - min/median of the conjugate mismatch curve (0: flat, 1: sharp)
    n_nonfinite: int = 0                # sinogram pixels that were NaN/inf and were filled along their row
    split_px: float | None = None       # |offset from the even views - offset from the odd views|

    @property
    def confidence(self) -> float | None:
        """Agreement of the even- and odd-view estimates (see the module doc); 0..1, None if not measured."""
        if self.split_px is None:
            return None
        return float(1.0 / (1.0 + (self.split_px / 0.5) ** 2))

    @property
    def low_confidence(self) -> bool:
        return self.confidence is not None and self.confidence < LOW_CONFIDENCE

    @property
    def offset_mm(self) -> float:
        return self.offset_px * self.pitch

    @property
    def agreement_px(self) -> float | None:
        return None if self.cross_check_px is None else abs(self.offset_px - self.cross_check_px)

    def text(self) -> str:
        s = f"detector offset {self.offset_px:+.2f} px = {self.offset_mm:+.3f} mm ({self.method})"
        if self.cross_check_px is not None:
            s += (f"; {self.cross_check_method}: {self.cross_check_px:+.2f} px "
                  f"(differ by {self.agreement_px:.2f} px)")
        if self.confidence is not None:
            s += f"; confidence {self.confidence:.2f}"
            if self.low_confidence:
                s += " (LOW: check the centre by eye before trusting it)"
        if self.n_nonfinite:
            s += f"; {self.n_nonfinite} non-finite pixels filled from their row"
        return s

    def to_dict(self) -> dict:
        return {"offset_px": self.offset_px, "offset_mm": self.offset_mm, "pitch_mm": self.pitch,
                "method": self.method, "cross_check_px": self.cross_check_px,
                "cross_check_method": self.cross_check_method, "agreement_px": self.agreement_px,
                "depth": self.depth, "split_px": self.split_px, "confidence": self.confidence, "low_confidence": self.low_confidence,
                "n_nonfinite": self.n_nonfinite}


LOW_CONFIDENCE = 0.5    # the two halves differ by more than 0.5 px
OPPOSITE_VIEWS = "registration of the views 180 degrees apart"


# ----------------------------------------------------------------- helpers
def mid_plane_sinogram(images, *, pitch_v: float = 1.0, offset_v: float = 0.0, half_rows: int = 1) -> np.ndarray:
    """``(view, col)`` sinogram of the rows through z = 0 of ``(view, row, col)`` line integrals (averaged)."""
    p = np.asarray(images, dtype=np.float64)
    if p.ndim == 2:
        return p
    if p.ndim != 3:
        raise ValueError(f"images must be (view, row, col) or a (view, col) sinogram, got shape {p.shape}")
    rows = p.shape[1]
    centre = (rows - 1) / 2 + offset_v / pitch_v          # row of v = 0 (rows run along -v)
    lo = int(math.floor(centre)) - (half_rows - 1)
    hi = int(math.ceil(centre)) + (half_rows - 1)
    if centre == int(centre):
        lo, hi = int(centre) - half_rows + 1, int(centre) + half_rows - 1
    lo, hi = max(lo, 0), min(hi, rows - 1)
    if lo > hi:
        raise ValueError(f"the mid-plane row {centre:.1f} is outside the detector (0..{rows - 1})")
    return p[:, lo:hi + 1, :].mean(axis=1)


def _check(sino, angles, pitch, sid, sdd):
    s = np.asarray(sino, dtype=np.float64)
    a = np.asarray(angles, dtype=np.float64).reshape(-1)
    if s.ndim != 2 or s.shape[0] != a.size:
        raise ValueError(f"sinogram must be (n_views, U) with one angle per view; got {s.shape} and {a.size} angles")
    if not np.isfinite(a).all():
        raise ValueError(f"angles must be finite (radians); {int((~np.isfinite(a)).sum())} are NaN or infinite")
    if a.size < 2:
        raise ValueError(f"the centre finder needs views from several angles, got {a.size} view")
    if s.shape[1] < 2:
        raise ValueError(f"the centre finder needs at least 2 detector columns, got {s.shape[1]}")
    if isinstance(pitch, bool) or not (np.isfinite(pitch) and pitch > 0):
        raise ValueError(f"pitch must be a positive finite length in mm, got {pitch!r}")
    if (sid is None) != (sdd is None):
        raise ValueError("give both sid and sdd (cone/fan beam) or neither (parallel beam)")
    if sid is not None and not (np.isfinite(sid) and np.isfinite(sdd) and 0 < sid <= sdd):
        raise ValueError(f"need 0 < sid <= sdd (finite mm), got sid={sid!r}, sdd={sdd!r}")
    return s, a


MAX_NONFINITE_FRACTION = 0.1


def _fill_rows(s: np.ndarray) -> tuple[np.ndarray, int]:
    """Non-finite sinogram pixels replaced by linear interpolation along their view's row; how many."""
    bad = ~np.isfinite(s)
    n = int(bad.sum())
    if not n:
        return s, 0
    if n > MAX_NONFINITE_FRACTION * s.size:
        raise ValueError(f"{n} of the {s.size} mid-plane sinogram values ({100 * n / s.size:.3g}%) are NaN or "
                         f"infinite, more than the {100 * MAX_NONFINITE_FRACTION:g}% the centre finder fills from "
                         "their neighbours: correct the data (flats, darks, dead pixels) or crop the damaged part")
    per_view = bad.sum(axis=1)
    worst = int(np.argmax(per_view))
    if 2 * per_view[worst] > s.shape[1]:
        raise ValueError(f"view {worst} of the mid-plane sinogram has {int(per_view[worst])} of its {s.shape[1]} "
                         "values NaN or infinite (more than half); drop the view or correct it before finding the "
                         "centre")
    s = s.copy()
    cols = np.arange(s.shape[1])
    for k in np.flatnonzero(bad.any(axis=1)):
        ok = ~bad[k]
        if not ok.any():
            raise ValueError(f"view {k} of the sinogram has no finite value; drop it before finding the centre")
        s[k, ~ok] = np.interp(cols[~ok], cols[ok], s[k, ok])
    return s, n


def _refuse_degenerate(s: np.ndarray) -> None:
    """A sinogram without structure has no centre: refuse it rather than return a confident number."""
    finite = s[np.isfinite(s)]
    if finite.size == 0:
        raise ValueError("the sinogram holds no finite value; there is no centre to find")
    lo, hi = float(finite.min()), float(finite.max())
    if hi - lo <= 1e-12 * max(1.0, abs(hi), abs(lo)):
        raise ValueError(f"the sinogram is constant (every value {lo:.6g}): it holds no object, so no centre "
                         "can be found; check the flats/darks and the rows used")


class _AngleInterp:
    """Linear interpolation of a sinogram along the (periodic) angle axis, with gaps marked invalid."""

    def __init__(self, angles: np.ndarray):
        a = np.mod(angles, 2 * np.pi)
        order = np.argsort(a)
        sa = a[order]
        self.ext = np.concatenate([[sa[-1] - 2 * np.pi], sa, [sa[0] + 2 * np.pi]])
        self.idx = np.concatenate([[order[-1]], order, [order[0]]])
        steps = np.diff(self.ext)
        self.max_gap = 2.5 * float(np.median(steps[steps > 0])) if (steps > 0).any() else 0.0

    def weights(self, q: np.ndarray):
        q = np.mod(q, 2 * np.pi)
        k = np.clip(np.searchsorted(self.ext, q, side="right") - 1, 0, self.ext.size - 2)
        gap = self.ext[k + 1] - self.ext[k]
        ok = (gap > 0) & (gap <= self.max_gap)
        frac = np.where(ok, (q - self.ext[k]) / np.where(gap > 0, gap, 1.0), 0.0)
        return self.idx[k], self.idx[k + 1], frac, ok


def _fan_frame(t, sid: float, sdd: float):
    """Unit vector isocentre -> source and detector u of ctbench's circular fan frame at angles ``t`` (any shape),
    taken from the generator itself so that the conjugate geometry follows the library's convention."""
    from ..geometry import circular_trajectory_2d_fan

    t = np.asarray(t, dtype=np.float64)
    traj = circular_trajectory_2d_fan(angles=torch.as_tensor(t.ravel()), sid=float(sid), sdd=float(sdd))
    r = traj.source[:, :2].numpy() / float(sid)
    u = traj.detector_u[:, :2].numpy()
    return r.reshape(*t.shape, 2), u.reshape(*t.shape, 2)


def _conjugate_steps(w, sid, sdd):
    """For the rays of the view at angle 0 whose lateral detector coordinates (mm, relative to the axis) are
    ``w`` (1-D): the angle step to each one's conjugate and the conjugate's coordinate.  A circular orbit turns
    rigidly with the angle, so the view at angle t has its conjugates at t + step, the same coordinates."""
    w = np.asarray(w, dtype=np.float64)
    if sid is None:
        return np.full(w.shape, np.pi), -w
    r, u = _fan_frame(np.zeros(w.shape), sid, sdd)
    S = sid * r
    P = -(sdd - sid) * r + w[..., None] * u
    d = P - S
    tau = -2 * (S * d).sum(-1) / (d * d).sum(-1)
    S2 = S + tau[..., None] * d
    # The orbit turns the source direction counter-clockwise with the angle: measure S2's angle from r(0).
    r0 = r[0]
    t2 = np.arctan2(r0[0] * S2[..., 1] - r0[1] * S2[..., 0], (S2 * r0).sum(-1))
    r2, u2 = _fan_frame(t2, sid, sdd)
    C2 = -(sdd - sid) * r2
    denom = ((S - S2) * r2).sum(-1)
    lam = -((S2 - C2) * r2).sum(-1) / np.where(np.abs(denom) > 1e-12, denom, 1e-12)
    x = S2 + lam[..., None] * (S - S2)
    return t2, (x * u2).sum(-1)


def conjugate_mismatch(sino, angles, offset_px: float, pitch: float, sid=None, sdd=None) -> float:
    """Mean squared difference between each ray and its conjugate for a candidate offset (pixels)."""
    s, a = _check(sino, angles, pitch, sid, sdd)
    return _mismatch(s, a, _AngleInterp(a), offset_px, pitch, sid, sdd)


def _mismatch(s, a, interp, offset_px: float, pitch: float, sid, sdd) -> float:
    n, U = s.shape
    o = offset_px * pitch
    step, w2 = _conjugate_steps((np.arange(U) - (U - 1) / 2) * pitch + o, sid, sdd)
    t2 = a[:, None] + step[None, :]
    col = np.broadcast_to((w2 - o) / pitch + (U - 1) / 2, (n, U))
    k0, k1, frac, ok = interp.weights(t2)
    ok = ok & (col >= 0) & (col <= U - 1)
    c0 = np.clip(np.floor(col).astype(int), 0, U - 2)
    fc = np.clip(col - c0, 0.0, 1.0)

    def at(k):
        return s[k, c0] * (1 - fc) + s[k, c0 + 1] * fc

    conj = at(k0) * (1 - frac) + at(k1) * frac
    if ok.sum() < 0.1 * ok.size:
        return float("inf")
    diff = (s - conj)[ok]
    return float(np.mean(diff * diff))


def _mismatch_cost(s, a, pitch, sid, sdd):
    """conjugate_mismatch as a function of the offset alone (the angle table built once)."""
    s, a = _check(s, a, pitch, sid, sdd)
    interp = _AngleInterp(a)
    return lambda o: _mismatch(s, a, interp, o, pitch, sid, sdd)


def _median_step(a: np.ndarray) -> float:
    """The median angular step between successive views (radians; 0 when all angles are equal)."""
    steps = np.abs(np.diff(a))
    return float(np.median(steps[steps > 0])) if (steps > 0).any() else 0.0


def _depth(cs: np.ndarray) -> float:
    """1 - min / median of a cost curve's finite values (0: flat, 1: a sharp minimum)."""
    fin = cs[np.isfinite(cs)]
    med = float(np.median(fin))
    return 0.0 if med <= 0 else float(np.clip(1.0 - fin.min() / med, 0.0, 1.0))


def opposite_view_pairs(angles, *, tol_steps: float = 0.05) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)`` of views 180 degrees apart (within ``tol_steps`` of the median angular step)."""
    a = np.asarray(angles, dtype=np.float64).reshape(-1)
    step = _median_step(a)
    if step == 0.0:
        return []
    tol = tol_steps * step
    pairs = []
    for i in range(a.size):
        d = np.abs(np.angle(np.exp(1j * (a - a[i] - np.pi))))      # distance of a_j from a_i + pi, wrapped
        d[: i + 1] = np.inf                                        # each pair once, i < j
        j = int(np.argmin(d))
        if d[j] <= tol:
            pairs.append((i, j))
    return pairs


def _lerp(rows: np.ndarray, col: np.ndarray) -> np.ndarray:
    """``rows`` (r, U) linearly interpolated at fractional columns ``col`` (inside [0, U-1])."""
    c0 = np.clip(np.floor(col).astype(int), 0, rows.shape[1] - 2)
    f = col - c0
    return rows[:, c0] * (1 - f) + rows[:, c0 + 1] * f


def _pairs_cost(p, pairs):
    """Mean squared mismatch of each view of ``pairs`` with the other one mirrored about a candidate axis.

    Both views are sampled at points mirror-symmetric about the candidate
    axis with the same fractional column, so both are smoothed alike by the
    interpolation (no bias towards whole-pixel offsets).
    """
    U = p.shape[2]

    def cost(o: float) -> float:
        h = (-o) % 1.0
        col_a = np.arange(U - 1) + h
        col_b = (U - 1) - 2 * o - col_a                 # the mirror of col_a about the axis at offset o
        ok = (col_b >= 0) & (col_b <= U - 1)
        if ok.sum() < max(2, U // 4):
            return float("inf")
        ca, cb = col_a[ok], col_b[ok]
        d = [(_lerp(p[i], ca) - _lerp(p[j], cb)) for i, j in pairs]
        return float(np.mean(np.square(d)))
    return cost


def offset_by_opposite_views(images, angles, pitch: float, *, search_px=None):
    """Offset (pixels) of a parallel scan from its views 180 degrees apart, registered over all rows.

    For parallel scans that do not pair every ray with a conjugate (about
    180 degrees, both end views included).  ``images``: ``(view, row, col)``
    line integrals (or a ``(view, col)`` sinogram).  Returns ``(offset,
    offsets, costs, split)``: ``split`` is the distance between the offsets
    of the even and of the odd rows (None with fewer than two rows).
    """
    p = np.asarray(images, dtype=np.float64)
    p = p[:, None, :] if p.ndim == 2 else p
    a = np.asarray(angles, dtype=np.float64).reshape(-1)
    pairs = opposite_view_pairs(a)
    if not pairs:
        raise ValueError("the scan does not cover enough angles to pair each ray with its conjugate (needs a full "
                         "turn for fan/cone beams, 180 degrees for parallel beams: both end views, 0 and 180)")
    lo, hi = _search_range(p.shape[2], search_px)
    x, xs, cs = _minimise(_pairs_cost(p, pairs), lo, hi, 1.0, 0.1)
    split = None
    if p.shape[1] >= 2:
        lo2, hi2 = max(lo, x - 4.0), min(hi, x + 4.0)
        halves = [_minimise(_pairs_cost(p[:, k::2], pairs), lo2, hi2, 1.0, 0.1)[0]
                  for k in (0, 1)]
        split = float(abs(halves[0] - halves[1]))
    return x, xs, cs, split


def _half_turn(angles) -> np.ndarray:
    """Indices of the views of the first half turn (angles below the first one + 180 degrees, less a margin)."""
    a = np.asarray(angles, dtype=np.float64).reshape(-1)
    return np.flatnonzero(np.abs(a - a[0]) < np.pi - 0.5 * _median_step(a))


def _double_wedge_cost(sino, angles):
    """Energy outside the double wedge of the 2D spectrum of the 360-degree sinogram made of a half turn and its
    mirror about a candidate axis (the idea of Vo et al. 2014, Opt. Express 22:19078; written for ctbench).

    A consistent sinogram of an object inside the field of view has its
    spectrum inside ``|k| <= 2 pi |nu| R`` (``k`` cycles per turn, ``nu``
    cycles per pixel, ``R`` the field's radius in pixels); a wrong axis makes
    the mirrored half jump at the seams and spills energy outside.
    """
    s = np.asarray(sino, dtype=np.float64)[_half_turn(angles)]
    n, U = s.shape
    W = 2 * U                                               # zero padding: the sub-pixel shift does not wrap
    nu = np.fft.rfftfreq(W)
    k = np.fft.fftfreq(2 * n, d=1.0 / (2 * n))             # cycles per turn
    R = U / 2
    outside = np.abs(k)[:, None] > 2 * np.pi * nu[None, :] * R + 1.0
    outside[:, 0] = False                                   # the mean of each view carries no centre
    mirrored = np.fft.rfft(s[:, ::-1], n=W, axis=1)

    def cost(offset_px: float) -> float:
        # the mirror of column c about the axis at offset o is column (U-1) - c - 2o: shift the reversed views by -2o
        shifted = mirrored * np.exp(-2j * np.pi * nu * (-2.0 * offset_px))[None, :]
        full = np.concatenate([np.fft.rfft(s, n=W, axis=1), shifted])
        spec = np.abs(np.fft.fft(full, axis=0)) ** 2
        return float(spec[outside].mean() / max(spec.mean(), 1e-300))
    return cost


def offset_by_double_wedge(sino, angles, pitch: float, *, search_px=None):
    """Offset (pixels) of a parallel scan of (at least) a half turn whose mirrored completion to a full turn is
    most consistent (:func:`_double_wedge_cost`), and the cost curve: :func:`find_centre`'s method for half-turn
    parallel scans, where few rays have a measured conjugate and the sharpness of FBP slices does not peak at
    the centre."""
    s, a = _check(sino, angles, pitch, None, None)
    lo, hi = _search_range(s.shape[1], search_px)
    return _minimise(_double_wedge_cost(s, a), lo, hi, 1.0, 0.1)


def half_turn_parallel(angles, sid=None) -> bool:
    """Whether a scan is a parallel one of a half turn or a little more, too little to pair most rays with their
    conjugates (the double-wedge path of :func:`find_centre`)."""
    a = np.asarray(angles, dtype=np.float64).reshape(-1)
    if sid is not None or a.size < 4 or _pairs_most_rays(a):
        return False
    step = _median_step(a)
    return step > 0 and float(np.abs(a - a[0]).max()) >= np.pi - 1.5 * step    # a half turn, end view or not


def cross_check_offset(sino, angles, pitch: float, sid=None, sdd=None, *, search_px=None):
    """The second, independent centre estimate: ``(offset_px, offsets, costs, method)``.

    The sharpness sweep, except for half-turn parallel scans: the views 180 degrees apart (none without them)."""
    if half_turn_parallel(angles, sid):
        if not opposite_view_pairs(angles):       # a half turn without its end view: no independent second method
            return None, None, None, ""
        y, ys, ds, _ = offset_by_opposite_views(sino, angles, pitch, search_px=search_px)
        return y, ys, ds, OPPOSITE_VIEWS
    y, ys, ds = offset_by_sharpness(sino, angles, pitch, sid, sdd, search_px=search_px)
    return y, ys, ds, "sharpness sweep of FBP slices"


def _pairs_most_rays(angles) -> bool:
    """Whether the angle 180 degrees on lies within the scanned angles for most views (about a full turn)."""
    a = np.asarray(angles, dtype=np.float64).reshape(-1)
    return bool(_AngleInterp(a).weights(a + np.pi)[3].mean() >= 0.5)


def _minimise(cost, lo: float, hi: float, coarse: float, fine: float) -> tuple[float, np.ndarray, np.ndarray]:
    """Grid search on [lo, hi] with step ``coarse``, then ``fine`` steps around the best, then a parabola."""
    xs = np.arange(lo, hi + coarse / 2, coarse)
    cs = np.array([cost(x) for x in xs])
    best = xs[int(np.argmin(cs))]
    xf = np.arange(best - 1.5 * coarse, best + 1.5 * coarse + fine / 2, fine)
    cf = np.array([cost(x) for x in xf])
    i = int(np.argmin(cf))
    x = xf[i]
    if 0 < i < xf.size - 1 and np.isfinite(cf[i - 1:i + 2]).all():
        c_, b_, a_ = cf[i - 1], cf[i], cf[i + 1]
        den = c_ - 2 * b_ + a_
        if den > 0:
            x = x + 0.5 * fine * (c_ - a_) / den
    allx = np.concatenate([xs, xf])
    order = np.argsort(allx)
    return float(x), allx[order], np.concatenate([cs, cf])[order]


def _search_range(U: int, search_px) -> tuple[float, float]:
    if search_px is None:
        half = max(2.0, U / 6)
        return -half, half
    try:
        lo, hi = (float(v) for v in search_px)
    except (TypeError, ValueError):
        raise ValueError(f"search_px must be (low, high) offsets in pixels, got {search_px!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"search_px must be (low, high) finite offsets with low < high, got {search_px!r}")
    # Beyond the detector's width no ray meets its conjugate: a wider range only allocates.
    if max(abs(lo), abs(hi)) > U:
        raise ValueError(f"search_px must lie within +-{U} px (the detector width), got {search_px!r}")
    return lo, hi


def offset_by_conjugate_rays(sino, angles, pitch: float, sid=None, sdd=None, *, search_px=None):
    """Offset (pixels) minimising the conjugate-ray mismatch, and the cost curve; needs ~a full turn (fan)
    or 180 degrees (parallel)."""
    s, a = _check(sino, angles, pitch, sid, sdd)
    lo, hi = _search_range(s.shape[1], search_px)
    x, xs, cs = _minimise(_mismatch_cost(s, a, pitch, sid, sdd), lo, hi, 1.0, 0.1)
    if not np.isfinite(cs).any():
        raise ValueError("the scan does not cover enough angles to pair each ray with its conjugate "
                         "(needs a full turn for fan/cone beams, 180 degrees for parallel beams)")
    return x, xs, cs


def _sharpness_cost(sino, angles, pitch, sid, sdd, n_pix, vox):
    import torch

    from ..geometry import circular_trajectory_2d_fan, circular_trajectory_2d_parallel
    from ..projector import Projector
    from ..solvers import fbp

    s = torch.from_numpy(np.ascontiguousarray(sino, dtype=np.float32))
    ang = torch.from_numpy(np.asarray(angles, dtype=np.float32))
    U = s.shape[1]

    def cost(offset_px: float) -> float:
        o = float(offset_px) * pitch
        if sid is None:
            traj = circular_trajectory_2d_parallel(angles=ang, detector_offset=o)
        else:
            traj = circular_trajectory_2d_fan(angles=ang, sid=sid, sdd=sdd, detector_offset=o)
        op = Projector(traj, (n_pix, n_pix), (U, 1), detector_spacing=(pitch, pitch), voxel_spacing=vox)
        # displaced=False: a trial offset is not a half-fan detector; Wang's weights at the far trials would
        # hide their blur and pull the sweep to the end of its range.
        img = fbp(op, s, filter="shepp-logan", displaced=False).double().numpy()
        yy, xx = np.mgrid[:n_pix, :n_pix] - (n_pix - 1) / 2
        disc = (xx * xx + yy * yy) <= (0.45 * n_pix) ** 2     # inside the field of view
        gx, gy = np.diff(img, axis=1)[:-1, :], np.diff(img, axis=0)[:, :-1]
        # Sharp edges concentrate the gradient: its energy peaks at the right centre (negated: minimised).
        return -float((gx * gx + gy * gy)[disc[:-1, :-1]].sum())

    return cost


SHARPNESS_PIXELS = 96        # the quick FBP's image width
SHARPNESS_VIEWS = 360        # at most about this many views go into it (every k-th)


def offset_by_sharpness(sino, angles, pitch: float, sid=None, sdd=None, *, search_px=None):
    """Offset (pixels) whose quick FBP of the mid-plane is sharpest (largest gradient energy), and the curve."""
    s, a = _check(sino, angles, pitch, sid, sdd)
    U = s.shape[1]
    mag = 1.0 if sid is None else sdd / sid
    n_pix = min(U, SHARPNESS_PIXELS)
    vox = U * pitch / mag / n_pix
    lo, hi = _search_range(U, search_px)
    # The quick FBP resolves n_pix voxels across the detector: its sharpness varies over offsets of about a
    # voxel (U / n_pix detector pixels), so the grid steps by half of one (1 px up to 2 * n_pix pixels wide),
    # and about pi/2 * n_pix views sample it fully: more only cost time (scanners record 1500-3000).
    coarse = max(1.0, U / (2 * n_pix))
    keep = np.arange(0, a.size, max(1, a.size // SHARPNESS_VIEWS))
    cost = _sharpness_cost(s[keep], a[keep], pitch, sid, sdd, n_pix, vox)
    return _minimise(cost, lo, hi, coarse, max(0.1, coarse / 10))


def find_centre(images, angles, pitch, *, sid=None, sdd=None, pitch_v: float | None = None,
                offset_v: float = 0.0, half_rows: int = 2, search_px=None, cross_check: bool = True) -> CentreResult:
    """Detector offset of a circular scan from ``(view, row, col)`` line integrals (or a ``(view, col)`` sinogram).

    ``angles`` in radians, ``pitch`` the column pitch (mm), ``sid``/``sdd``
    for cone/fan beams (omit both for parallel beams).  The mid-plane rows
    are averaged (``half_rows`` on each side of z = 0).  ``search_px``
    bounds the search (default: a sixth of the detector width each way).
    """
    sino = mid_plane_sinogram(images, pitch_v=pitch_v or pitch, offset_v=offset_v, half_rows=half_rows)
    _check(sino, angles, pitch, sid, sdd)
    _refuse_degenerate(sino)
    sino, n_bad = _fill_rows(sino)
    _refuse_degenerate(sino)
    a_all = np.asarray(angles, dtype=np.float64).reshape(-1)
    if half_turn_parallel(a_all, sid):
        return _centre_of_half_turn(images, sino, a_all, pitch, n_bad, search_px, cross_check)
    x, xs, cs = offset_by_conjugate_rays(sino, angles, pitch, sid, sdd, search_px=search_px)
    depth = _depth(cs)
    split = float("inf")
    if sino.shape[0] >= 4:
        # The halves search +-4 px around the answer (the same grids as the full search): cheaper, and still wide
        # enough that data without a centre give two unrelated minima (a typical split of ~2.7 px).
        lo, hi = _search_range(sino.shape[1], search_px)
        lo, hi = max(lo, x - 4.0), min(hi, x + 4.0)
        halves = []
        for k in (0, 1):
            sk, ak = sino[k::2], a_all[k::2]
            xk, _, ck = _minimise(_mismatch_cost(sk, ak, pitch, sid, sdd), lo, hi, 1.0, 0.1)
            halves.append(xk if np.isfinite(ck).any() else np.inf)   # a half may not pair up: confidence 0
        if np.isfinite(halves).all():
            split = float(abs(halves[0] - halves[1]))
    res = CentreResult(x, float(pitch), "conjugate-ray registration", curve={"conjugate": (xs, cs)}, depth=depth,
                       n_nonfinite=n_bad, split_px=split)
    if cross_check:
        y, ys, ds = offset_by_sharpness(sino, angles, pitch, sid, sdd, search_px=search_px)
        res.cross_check_px, res.cross_check_method = y, "sharpness sweep of FBP slices"
        res.curve["sharpness"] = (ys, ds)
    return res


def _centre_of_half_turn(images, sino, angles, pitch, n_bad, search_px, cross_check) -> CentreResult:
    """find_centre for a parallel scan of about a half turn: the double wedge of the mirrored completion (all
    views), the even and the odd views for the confidence, the opposite views as the cross-check."""
    x, xs, cs = offset_by_double_wedge(sino, angles, pitch, search_px=search_px)
    depth = _depth(cs)
    split = float("inf")
    if sino.shape[0] >= 8:
        lo, hi = _search_range(sino.shape[1], search_px)
        lo, hi = max(lo, x - 4.0), min(hi, x + 4.0)
        halves = [offset_by_double_wedge(sino[k::2], angles[k::2], pitch, search_px=(lo, hi))[0] for k in (0, 1)]
        split = float(abs(halves[0] - halves[1]))
    res = CentreResult(x, float(pitch), "double-wedge consistency of the mirrored half turn",
                       curve={"double_wedge": (xs, cs)}, depth=depth, n_nonfinite=n_bad, split_px=split)
    if cross_check and opposite_view_pairs(angles):
        p = np.asarray(images, dtype=np.float64)
        if p.ndim == 3:     # every row of a parallel beam is a slice with the same centre: register them all
            p = np.stack([_fill_rows(p[:, r])[0] for r in range(p.shape[1])], axis=1)
        else:
            p = sino
        y, ys, ds, _ = offset_by_opposite_views(p, angles, pitch, search_px=search_px)
        res.cross_check_px, res.cross_check_method = y, OPPOSITE_VIEWS
        res.curve["opposite_views"] = (ys, ds)
    return res
