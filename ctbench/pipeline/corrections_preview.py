"""Before/after previews of the corrections on one view and one detector row of a scan (Qt-free).

The Scan import widget shows these; they run the pipeline's own
:func:`~ctbench.pipeline.prepare` on a one-view (or one-row) slice of the
scan, once without the corrections and once with them, so that the preview
is exactly what ``ctbench recon`` will do to that view.  Ring filters need
every view of a row (a stripe is what all views share), Paganin's filter a
whole view: the view preview leaves the rings out and the row preview the
phase retrieval.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import PreprocessConfig
from .steps import prepare
from ..io.scan import RawScan

_OFF = {"zingers": None, "rings": None, "phase": None, "beam_hardening": None, "ring_filter": 0}


@dataclass
class CorrectionPreview:
    """``view_*``: ``(rows, cols)`` line integrals of one view; ``sinogram_*``: ``(views, cols)`` of one row or None."""

    view: int
    view_before: np.ndarray
    view_after: np.ndarray
    row: int | None = None
    sinogram_before: np.ndarray | None = None
    sinogram_after: np.ndarray | None = None
    report: dict = field(default_factory=dict)

    def side_by_side(self, which: str = "view") -> np.ndarray:
        """Before | after in one image, separated by a 2-pixel gap at the before image's minimum."""
        a, b = (self.view_before, self.view_after) if which == "view" else (self.sinogram_before, self.sinogram_after)
        if a is None:
            raise ValueError("this preview has no ring correction, so no sinogram")
        gap = np.full((a.shape[0], 2), float(min(a.min(), b.min())), np.float32)
        return np.concatenate([a, gap, b], axis=1)


def _slice(scan: RawScan, views=slice(None), rows=slice(None)) -> RawScan:
    def cut(a):
        return None if a is None else a[:, rows, :]

    return RawScan(scan.projections[views, rows, :], cut(scan.flats), cut(scan.darks),
                   None if scan.angles is None else np.asarray(scan.angles)[views], scan.pixel_size, scan.values,
                   dict(scan.scanner), scan.source, scan.format)


def correction_preview(scan: RawScan, pre: PreprocessConfig, *, view: int = 0, row: int | None = None,
                       pixel_size=None) -> CorrectionPreview:
    """Line integrals of ``view`` (and of detector ``row`` over all views when a ring method is on) without and
    with the corrections of ``pre``; ``row`` defaults to the middle of the (cropped) detector."""
    n, rows, _ = scan.projections.shape
    if isinstance(view, bool) or int(view) != view or not 0 <= int(view) < n:
        raise ValueError(f"view must be an index in 0..{n - 1}, got {view!r}")
    view = int(view)
    one = _slice(scan, slice(view, view + 1))
    keep = {"every": 1, "angle_range_deg": None}
    before = prepare(one, pre.model_copy(update=_OFF | keep), pixel_size)
    after = prepare(one, pre.model_copy(update={"rings": None, "ring_filter": 0} | keep), pixel_size)
    out = CorrectionPreview(view, before.images[0], after.images[0], report=after.correction)
    if pre.rings is not None or pre.ring_filter:
        r0, r1 = pre.rows if pre.rows is not None else (0, rows)
        r = (r0 + min(r1, rows)) // 2 if row is None else row
        if isinstance(r, bool) or int(r) != r or not 0 <= int(r) < rows:
            raise ValueError(f"row must be an index in 0..{rows - 1}, got {row!r}")
        r = int(r)
        h = pre.zingers.size // 2 if pre.zingers is not None else 0     # the rows the zinger median sees
        lo, hi = max(0, r - h), min(rows, r + h + 1)
        band = _slice(scan, rows=slice(lo, hi))
        flat = {"rows": None, "bin": 1, "phase": None}
        s0 = prepare(band, pre.model_copy(update=_OFF | flat), pixel_size)
        s1 = prepare(band, pre.model_copy(update=flat), pixel_size)
        out.row, out.sinogram_before, out.sinogram_after = r, s0.images[:, r - lo, :], s1.images[:, r - lo, :]
        out.report = out.report | {k: v for k, v in s1.correction.items() if k == "rings"}
    return out
