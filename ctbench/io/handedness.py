"""Resolve a scan's orientation against its data, and check it: the "auto" of docs/SCANS.md, "Orientation".

Reading a camera-convention image as if it were ctbench's (or stating the
wrong rotation direction) makes an *inconsistent* circular scan: the two
measurements of each ray over a full turn no longer agree, whatever the
detector offset, so the conjugate-ray registration of the centre finder
finds no good match.  The two centre methods may then disagree, but they
need not: the mismatch itself is the reliable sign.

:func:`resolve_orientation` tries the readings that the known fields allow
(one field "auto": both of its values; both "auto": the camera convention
with either rotation), registers conjugate rays on the mid-plane of each and
keeps the one whose rays match best.  Measured on six simulated camera-
convention scans in counts (chiral and Shepp-Logan phantoms, offsets 0,
2.37 and -3.6 px, 96 views of 64 x 48 pixels): the wrong class matched 4.7
to 26 times worse, while the sharpness of quick FBP slices separated them
by only 0.97 to 1.30 times, so sharpness only cross-checks the offset.  It
cannot tell an object from its mirror image: the two readings of one
handedness class reconstruct mirror images equally well
(:meth:`Orientation.mirror`), and the result says so.

A *stated* orientation (the file's, its reader's convention, or the
config's) is checked the same way against the other handedness class.  When
the data fit the other class by a wide margin (:data:`DATA_WIN_RATIO`), the
data win: the image view is kept (a vendor's image convention is the better
documented half) and the rotation reversed, with a warning that gives the
evidence (both readings' mismatch, centre and sharpness cross-check).  When
the user fixed the convention in the config (``fixed``: the config keys set),
it stops with :class:`OrientationConflict` naming the evidence and the keys
to change instead.  A smaller lean (:data:`AMBIGUOUS_RATIO`) is a warning only.
Whatever the orientation, centre methods that disagree by more than
:func:`disagreement_tolerance_px` give a warning.

The images may be a thin band of rows around the mid-plane (``offset_v_mm``
locating the mid-plane inside the band): only the mid-plane rows are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .orientation import Orientation, reverse_rotation

DISAGREEMENT_PX = 0.5      # the least disagreement that is a warning (detectors up to 96 columns)
AMBIGUOUS_RATIO = 1.5     # conjugate-ray mismatch of the other reading over the chosen one's
DATA_WIN_RATIO = 3.0      # ... above which the data overrule a stated orientation (the wrong class: 4.7 to 26x)
CLASS_KEYS = ("image_seen_from", "image_columns", "rotation_direction")   # what decides the handedness class


class OrientationConflict(ValueError):
    """The data contradict an orientation the user fixed in the config; ``evidence`` holds the measurements."""

    def __init__(self, message: str, evidence: dict):
        super().__init__(message)
        self.evidence = evidence


def fixed_fields(geometry) -> frozenset:
    """The class-deciding orientation keys a config (any object with the ``geometry`` section's attributes)
    sets to a value: null and "auto" leave the choice to the file and the data."""
    return frozenset(k for k in CLASS_KEYS if getattr(geometry, k, None) not in (None, "auto"))


@dataclass
class Reading:
    """One candidate orientation and how well the data fit it."""

    orientation: Orientation
    centre: object                    # CentreResult of the mid-plane
    sharpness: float                  # gradient energy of the sharpest quick FBP slice (higher = sharper)
    mismatch: float                   # smallest conjugate-ray mean squared mismatch (lower = more consistent)

    def to_dict(self) -> dict:
        return {**self.orientation.to_dict(), "offset_px": self.centre.offset_px,
                "cross_check_px": self.centre.cross_check_px, "agreement_px": self.centre.agreement_px,
                "sharpness": self.sharpness, "conjugate_mismatch": self.mismatch}


@dataclass
class Resolved:
    """The orientation taken, the readings tried, and what the report must say."""

    orientation: Orientation
    detected: bool                    # whether any field was chosen from the data
    readings: list = field(default_factory=list)
    centre: object = None             # CentreResult of the chosen reading (None when not searched)
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    decided_by: str = "file"          # "data" (auto, or the data overruled the file), "file", "config"
    evidence: dict | None = None      # the measurements when the data contradicted the stated orientation
    checked: bool = True              # whether the data could be checked at all

    def to_dict(self) -> dict:
        return {**self.orientation.to_dict(), "detected_from_data": self.detected, "decided_by": self.decided_by,
                "checked": self.checked, "evidence": self.evidence,
                "mirror_reading": self.orientation.mirror().to_dict(),
                "readings": [r.to_dict() for r in self.readings], "notes": list(self.notes)}


def candidate_orientations(o: Orientation) -> list[Orientation]:
    """The readings to try: the known fields kept, each "auto" over its values (camera convention when both)."""
    if o.resolved:
        return [o]
    if o.seen_from == "auto" and o.rotation == "auto":
        return [o.replace(seen_from="source", rotation=r) for r in ("ccw", "cw")]
    if o.seen_from == "auto":
        return [o.replace(seen_from=s) for s in ("source", "detector")]
    return [o.replace(rotation=r) for r in ("ccw", "cw")]


def ctbench_angles(angles: np.ndarray, file_rotation: str, rotation: str) -> np.ndarray:
    """The file's angles (computed for ``file_rotation``, "auto" counted as "ccw") for ``rotation``."""
    same = (file_rotation if file_rotation != "auto" else "ccw") == rotation
    return np.asarray(angles, dtype=np.float64) if same else reverse_rotation(angles)


def _evaluate(sino_file_cols: np.ndarray, angles, file_rotation, o: Orientation, pitch, sid, sdd,
              cross_check: bool) -> Reading:
    from ..preprocessing import find_centre

    sino = sino_file_cols[:, ::-1] if o.flip_columns else sino_file_cols
    a = ctbench_angles(angles, file_rotation, o.rotation)
    c = find_centre(np.ascontiguousarray(sino), a, pitch, sid=sid, sdd=sdd, cross_check=cross_check)
    sharp = float(-np.min(c.curve["sharpness"][1])) if "sharpness" in c.curve else float("nan")
    costs = np.asarray(next(iter(c.curve.values()))[1], dtype=np.float64)     # the first method's curve
    mis = float(np.min(costs[np.isfinite(costs)])) if np.isfinite(costs).any() else float("inf")
    return Reading(o, c, sharp, mis)


def _contrary(o: Orientation) -> Orientation:
    """The reading of the other handedness class with the same rotation (the image view swapped)."""
    return o.replace(seen_from="detector" if o.seen_from == "source" else "source")



def _opposite(rotation: str) -> str:
    return "cw" if rotation == "ccw" else "ccw"


def _cross_check(sino, angles, file_rotation, o: Orientation, pitch, sid, sdd):
    """The second centre method's offset (px) for reading ``o``, with its curve, or Nones when it cannot run."""
    from ..preprocessing.centre import cross_check_offset

    s = sino[:, ::-1] if o.flip_columns else sino
    try:
        return cross_check_offset(np.ascontiguousarray(s), ctbench_angles(angles, file_rotation, o.rotation),
                                  pitch, sid, sdd)
    except ValueError:
        return None, None, None, ""


def _describe(r: Reading, cross_px) -> dict:
    return {"orientation": r.orientation.to_dict(), "conjugate_mismatch": r.mismatch,
            "offset_px": r.centre.offset_px, "cross_check_px": cross_px,
            "sharpness": None if not np.isfinite(r.sharpness) else r.sharpness}


def _evidence_text(ev: dict) -> str:
    s, d = ev["stated"], ev["data"]

    def cx(x):
        return "n/a" if x is None else f"{x:+.2f}"
    return (f"conjugate-ray mismatch {s['conjugate_mismatch']:.3g} against {d['conjugate_mismatch']:.3g} "
            f"({ev['ratio']:.1f}x); centre by conjugate rays {s['offset_px']:+.2f} px and by sharpness "
            f"{cx(s['cross_check_px'])} px, against {d['offset_px']:+.2f} and {cx(d['cross_check_px'])} px")


def disagreement_tolerance_px(n_cols: int) -> float:
    """How far (detector pixels) the two centre methods may part without a warning: half a voxel of the
    sharpness sweep's quick FBP, which images the detector's width in ``SHARPNESS_PIXELS`` voxels (its steps
    and its resolution; a 1024-column detector's sweep lands within a few pixels), and at least
    :data:`DISAGREEMENT_PX`."""
    from ..preprocessing.centre import SHARPNESS_PIXELS
    return max(DISAGREEMENT_PX, 0.5 * int(n_cols) / SHARPNESS_PIXELS)


def resolve_orientation(images, angles, orientation: Orientation, file_rotation: str, *, pitch: float,
                        pitch_v: float, sid: float, sdd: float, offset_v_mm: float = 0.0,
                        search_centre: bool = True, fixed=()) -> Resolved:
    """Choose (when "auto") and check a scan's orientation from its ``(view, row, col)`` line integrals.

    ``images`` are in the file's column order with rows already in ctbench's
    order (row 0 at +v); they may be a band of rows around the mid-plane,
    which ``offset_v_mm`` locates.  ``angles`` (radians) as the file gives
    them, computed for ``file_rotation``.  The readings are ranked by the
    conjugate-ray mismatch at their best offset (a consistent scan pairs its
    rays far better than a wrong-handed one); the chosen one is cross-checked
    by the sharpness sweep.  A stated orientation is checked against the
    other handedness class the same way (module doc: the data win, or, for
    the config keys in ``fixed`` (:func:`fixed_fields`), an
    :class:`OrientationConflict`).  ``search_centre=False``: the offset is
    known; a stated orientation that the data cannot check (too few angles)
    is then taken as it is, with a note.
    """
    from ..preprocessing.centre import mid_plane_sinogram

    fixed = frozenset(fixed) & frozenset(CLASS_KEYS)
    cands = candidate_orientations(orientation)
    res = Resolved(cands[0], detected=len(cands) > 1, decided_by="data" if len(cands) > 1 else
                   ("config" if fixed else "file"))
    sino = mid_plane_sinogram(images, pitch_v=pitch_v, offset_v=offset_v_mm, half_rows=2)
    tried = cands if res.detected else [cands[0], _contrary(cands[0])]
    try:
        res.readings = [_evaluate(sino, angles, file_rotation, o, pitch, sid, sdd, cross_check=False)
                        for o in tried]
    except ValueError as e:
        if res.detected or search_centre:
            raise
        res.checked = False
        res.notes.append(f"the orientation ({cands[0].text()}) could not be checked against the data ({e}); "
                         "taken as stated")
        return res
    best = min(res.readings, key=lambda r: r.mismatch)
    other = [r for r in res.readings if r is not best][0]
    ratio = other.mismatch / best.mismatch if best.mismatch > 0 else float("inf")
    # Both classes fitting alike (a parallel beam always does): the first candidate, the convention, not the noise.
    chosen = (best if ratio >= AMBIGUOUS_RATIO else res.readings[0]) if res.detected else res.readings[0]
    if not res.detected and best is not chosen and ratio >= DATA_WIN_RATIO:
        chosen = _overrule(res, sino, angles, file_rotation, chosen, best, ratio, pitch, sid, sdd, fixed)
    # The cross-check (sharpness sweep; opposite views for a half-turn parallel scan) of the reading taken.
    y, ys, ds, how = _cross_check(sino, angles, file_rotation, chosen.orientation, pitch, sid, sdd)
    c = chosen.centre
    c.cross_check_px, c.cross_check_method = y, how
    if y is not None:
        c.curve["sharpness" if how.startswith("sharpness") else "opposite_views"] = (ys, ds)
    chosen.sharpness = float(-np.min(ds)) if y is not None and how.startswith("sharpness") else float("nan")
    res.orientation, res.centre = chosen.orientation, c
    if res.detected:
        alt = [r for r in res.readings if r is not chosen][0]
        res.notes.append(
            f"orientation not stated by the file: took {chosen.orientation.text()} (detected from the data: its "
            f"rays and their conjugates match {alt.mismatch / max(chosen.mismatch, 1e-300):.2f}x better than with "
            f"{alt.orientation.text()}). A mirror "
            f"image cannot be known from the data alone: {chosen.orientation.mirror().text()} fits equally well "
            f"and gives the mirror image; state the scanner's convention (geometry.image_seen_from, "
            f"geometry.rotation_direction) to be sure.")
        if ratio < AMBIGUOUS_RATIO:
            why = ("a parallel beam's data cannot tell the handedness" if sid is None else
                   f"conjugate-ray match only {ratio:.2f}x better")
            res.warnings.append(f"the orientation could not be told from the data ({why}); took "
                                f"{chosen.orientation.text()}, the camera convention: state it in the file or the "
                                f"config (geometry.image_seen_from, geometry.rotation_direction)")
    elif res.decided_by != "data" and best is not chosen and ratio >= AMBIGUOUS_RATIO:
        res.warnings.append(
            f"the data contradict the stated orientation ({chosen.orientation.text()}): their rays and conjugates "
            f"match {ratio:.1f}x better with {best.orientation.text()} (or its mirror reading "
            f"{best.orientation.mirror().text()}), short of the {DATA_WIN_RATIO:g}x that overrules it; check "
            f"geometry.image_seen_from and geometry.rotation_direction")
    agree = c.agreement_px
    if agree is not None and agree > disagreement_tolerance_px(np.shape(images)[-1]):
        res.warnings.append(
            f"the two centre methods disagree by {agree:.2f} px ({c.offset_px:+.2f} against "
            f"{c.cross_check_px:+.2f} px): the scan may be read with the wrong orientation or rotation "
            f"direction ({chosen.orientation.text()}), the object may have moved, or the offset is outside the "
            f"search range")
    if not search_centre:       # the offset is given: the centre found served the check only (res.readings)
        res.centre = None
    return res


def _overrule(res: Resolved, sino, angles, file_rotation, stated: Reading, best: Reading, ratio: float, pitch,
              sid, sdd, fixed) -> Reading:
    """The data fit the other handedness class by a wide margin: take it (image view kept, rotation reversed)
    with a warning, or raise :class:`OrientationConflict` when the user fixed the convention."""
    taken = stated.orientation.replace(rotation=_opposite(stated.orientation.rotation))
    sx = _cross_check(sino, angles, file_rotation, stated.orientation, pitch, sid, sdd)[0]
    bx = _cross_check(sino, angles, file_rotation, best.orientation, pitch, sid, sdd)[0]
    ev = {"ratio": ratio, "stated": _describe(stated, sx), "data": _describe(best, bx),
          "taken": taken.to_dict(), "mirror_of_taken": best.orientation.to_dict()}
    if fixed:
        o = stated.orientation
        keys = {"image_seen_from": o.seen_from, "image_columns": o.columns, "rotation_direction": o.rotation}
        fixes = []
        if "rotation_direction" in fixed:
            fixes.append(f"geometry.rotation_direction to {_opposite(o.rotation)!r}")
        if "image_seen_from" in fixed:
            fixes.append(f"geometry.image_seen_from to {_contrary(o).seen_from!r}")
        if "image_columns" in fixed:
            fixes.append(f"geometry.image_columns to {'left' if o.columns == 'right' else 'right'!r}")
        set_ = ", ".join(f"geometry.{k}={keys[k]!r}" for k in CLASS_KEYS if k in fixed)
        raise OrientationConflict(
            f"the data contradict the orientation set in the config ({set_}): the scan's rays and their conjugates "
            f"match {ratio:.1f}x better with the other handedness ({best.orientation.text()}, or its mirror "
            f"reading {taken.text()}); {_evidence_text(ev)}. Change {' or '.join(fixes)}, or leave "
            f"{'them' if len(fixed) > 1 else 'it'} null to let the file and the data decide", ev)
    chosen = _evaluate(sino, angles, file_rotation, taken, pitch, sid, sdd, cross_check=False)
    res.readings.append(chosen)
    res.decided_by, res.evidence = "data", ev
    res.warnings.append(
        f"the data contradict the orientation the file states (or its reader assumes): {stated.orientation.text()} "
        f"makes the scan's rays and their conjugates match {ratio:.1f}x worse than the other handedness; "
        f"{_evidence_text(ev)}. Took {taken.text()} (the image view kept, the rotation reversed; its mirror reading "
        f"{best.orientation.text()} fits as well): set geometry.rotation_direction and geometry.image_seen_from "
        f"to fix the convention")
    return chosen
