"""The corrections of a scan's views, split by the data they need: per view, or per detector row.

:class:`Corrections` is built once per scan (the view subset, the crop and
binning, the averaged flat and dark, the correction keys of the config) and
then applied in pieces:

- :meth:`Corrections.views` corrects any range of the kept views on its own:
  flat/dark (or the file's transmission / line-integral values with their
  non-finite values filled), zingers, binning, ``-log`` or Paganin, beam
  hardening.  Each of these looks at one view at a time, so a range gives the
  same numbers whatever the chunking;
- :meth:`Corrections.rows` applies what needs every view of a detector row
  (the ring filters); a band of rows gives the same numbers as the whole stack;
- :meth:`Corrections.shifts` gives the per-view shifts the file records (applied
  by whoever reads the corrected views, in the file's image frame).

The in-memory :func:`ctbench.pipeline.steps.prepare` and the streamed pipeline
(:mod:`ctbench.pipeline.streamed`) call the same three, so they agree.

Images are ``(view, row, col)`` in the file's own frame (row 0 at the top of
the file's image); the orientation is applied later.  Without flats, the flat
is the brightest finite count of up to :data:`FLAT_SAMPLE` evenly spaced
views (one value for the whole scan, so chunking does not change it).
"""

from __future__ import annotations

import numpy as np

FLAT_SAMPLE = 16


class Corrections:
    """A scan's corrections, ready to apply to any range of views (module doc)."""

    def __init__(self, scan, pre, pixel_size=None):
        from ..preprocessing import CorrectionReport, DetectorChange, average_frames, crop, view_subset

        pitch = tuple(pixel_size) if pixel_size is not None else scan.pixel_size
        if pitch is None:
            raise ValueError(f"{scan.source}: the file gives no pixel size; set geometry.pixel_size_mm")
        self.scan, self.pre, self.raw_pitch = scan, pre, tuple(float(p) for p in pitch)
        self.idx = view_subset(scan.n_views, scan.angles, every=pre.every, angle_range_deg=pre.angle_range_deg)
        self.report = CorrectionReport()
        self.extra: dict = {}                       # what zingers, phase, hardening and rings did
        self.change = DetectorChange()
        # the crop's geometry, and the cropped frame: crop() checks the ranges and names a bad one
        self._cropped = tuple(int(s) for s in crop(scan.projections[:1], pre.rows, pre.cols, pitch=self.raw_pitch,
                                                   change=self.change).shape[1:])
        if pre.bin > 1:
            from ..preprocessing import bin_pixels
            probe = np.zeros((1, *self._cropped_shape()), np.float32)
            bin_pixels(probe, pre.bin, pitch=self.raw_pitch, change=self.change)       # records the binning once
        self.pitch = tuple(p * f for p, f in zip(self.raw_pitch, self.change.pitch_factor))
        self.flat = self.dark = None
        self.gain_source = None
        if scan.values == "counts":
            if scan.flats is not None:
                self.flat = average_frames(crop(scan.flats, pre.rows, pre.cols), "flats", report=self.report)
            if scan.darks is not None:
                self.dark = average_frames(crop(scan.darks, pre.rows, pre.cols), "darks", report=self.report)
            if self.flat is None:
                self.flat, self.gain_source = self._brightest(), f"brightest count of {FLAT_SAMPLE} sampled views"
        if pre.beam_hardening is not None:
            self.hardening = pre.beam_hardening.resolved()
            self.extra["beam_hardening"] = {"coefficients": self.hardening}
        else:
            self.hardening = None
        if pre.rings is not None:
            self.extra["rings"] = pre.rings.model_dump()
        self._base = self.summary()        # what is known before any view is corrected (flats, darks, keys)

    # ------------------------------------------------------------ shapes
    @property
    def n_views(self) -> int:
        return int(self.idx.size)

    def _cropped_shape(self) -> tuple[int, int]:
        return self._cropped

    @property
    def frame(self) -> tuple[int, int]:
        """(rows, cols) of a corrected view."""
        r, c = self._cropped_shape()
        b = self.pre.bin
        return r // b, c // b

    @property
    def has_row_pass(self) -> bool:
        return bool(self.pre.ring_filter) or self.pre.rings is not None

    # ------------------------------------------------------------ views
    def _raw(self, i0: int, i1: int) -> np.ndarray:
        from ..preprocessing import crop
        from ..preprocessing.correction import _compute

        sel = self.idx[i0:i1]
        proj = self.scan.projections
        if sel.size and sel[-1] - sel[0] + 1 == sel.size:
            block = proj[int(sel[0]):int(sel[-1]) + 1]     # a contiguous range: one slice, one read
        else:
            block = proj[sel]
        return _compute(crop(block, self.pre.rows, self.pre.cols))

    def _brightest(self) -> np.ndarray:
        n = self.n_views
        pick = np.unique(np.linspace(0, n - 1, min(n, FLAT_SAMPLE)).round().astype(int))
        best = -np.inf
        for i in pick:
            v = self._raw(int(i), int(i) + 1).astype(np.float32)
            v = v[np.isfinite(v)]
            if v.size:
                best = max(best, float(v.max()))
        if not np.isfinite(best):
            raise ValueError(f"{self.scan.source}: the projections hold no finite value: nothing to correct")
        return np.full(self._cropped_shape(), best, np.float64)

    def views(self, i0: int, i1: int, raw: np.ndarray | None = None) -> np.ndarray:
        """Corrected line integrals of kept views ``[i0, i1)``, float32 ``(i1-i0, rows, cols)`` (file frame).

        ``raw``: the cropped raw views, when the caller read them already (:meth:`read_raw`)."""
        from ..preprocessing import DetectorChange, bin_pixels, flat_dark_correct, linearise
        from ..preprocessing.correction import replace_nonfinite
        from .corrections import clean_outliers, to_line_integrals

        pre, scan, rep, extra = self.pre, self.scan, self.report, self.extra
        data = self._raw(i0, i1) if raw is None else raw
        if scan.values == "counts":
            t = flat_dark_correct(data, self.flat, self.dark, min_transmission=pre.min_transmission, report=rep)
            t = clean_outliers(t, pre, extra)
            if pre.bin > 1:
                t = bin_pixels(t, pre.bin, pitch=self.raw_pitch, change=DetectorChange())
            out = to_line_integrals(t, pre, self.pitch, extra)
        else:
            d = np.asarray(data, dtype=np.float32)
            d = d.copy() if d is data else d
            # Same non-finite rule as for counts: neighbours' median, counted; none left for -log or the solver.
            d, n_bad, left = replace_nonfinite(d)
            d[left] = 1.0 if scan.values == "transmission" else 0.0
            rep.n_values += d.size
            rep.n_nonfinite_counts += n_bad
            rep.n_nonfinite_unfilled += int(left.sum())
            d = clean_outliers(d, pre, extra, line_integrals=scan.values != "transmission")
            if pre.bin > 1:
                d = bin_pixels(d, pre.bin, pitch=self.raw_pitch, change=DetectorChange())
            if scan.values == "transmission":
                out = to_line_integrals(np.clip(d, pre.min_transmission, None), pre, self.pitch, extra)
            elif pre.phase is not None:          # line integrals back to transmission for the phase filter
                out = to_line_integrals(np.exp(-np.asarray(d, np.float64)), pre, self.pitch, extra)
            else:
                out = d
        out = np.asarray(out, dtype=np.float32)
        if self.hardening is not None:
            out = linearise(out, self.hardening)
        return out

    def read_raw(self, i0: int, i1: int) -> np.ndarray:
        """The cropped raw views ``[i0, i1)`` (the I/O half of :meth:`views`, for reading ahead in a thread)."""
        return self._raw(i0, i1)

    # ------------------------------------------------------------ rows
    def rows(self, band: np.ndarray) -> np.ndarray:
        """The ring filters on ``(view, rows, cols)`` line integrals holding every kept view of some rows."""
        from ..preprocessing import remove_stripes, remove_stripes_sorting, remove_stripes_wavelet

        pre = self.pre
        out = band
        if pre.ring_filter:
            out = remove_stripes(out, pre.ring_filter)
        r = pre.rings
        if r is not None:
            if r.method == "sorting":
                out = remove_stripes_sorting(out, r.size)
            else:
                out = remove_stripes_wavelet(out, r.level, r.sigma, r.wavelet)
        return np.asarray(out, dtype=np.float32)

    # ------------------------------------------------------------ shifts
    def shifts(self) -> tuple[np.ndarray, np.ndarray, dict] | None:
        """Per-view shifts ``(x, y)`` in corrected pixels (file frame) of the kept views and their summary, or
        None (``preprocess.view_shifts`` off, or none recorded)."""
        from ..io.view_shifts import KEY

        entry = self.scan.scanner.get(KEY)
        if not self.pre.view_shifts or not entry:
            return None
        x = np.asarray(entry["x"], dtype=np.float64)[self.idx] / self.pre.bin
        y = np.asarray(entry["y"], dtype=np.float64)[self.idx] / self.pre.bin
        if not (np.any(x) or np.any(y)):
            return None
        summary = {"source": entry.get("source", ""), "n_views": int(x.size),
                   "max_abs_x_px": float(np.abs(x).max()), "max_abs_y_px": float(np.abs(y).max())}
        return x, y, summary

    def summary(self) -> dict:
        """The correction report so far (counts add up over every range corrected)."""
        d = self.report.to_dict() | self.extra
        if self.gain_source:
            d["flat_field"] = self.gain_source
        return d

    def summary_fields(self) -> dict:
        """The report as it stood before any view was corrected (the flats', darks' and keys' part)."""
        return self._base


# Counts that are the largest over the chunks, not their sum; values recomputed from the sums.
MAX_KEYS = {"n_dead_pixels", "n_nonfinite_field_pixels"}
RATIOS = {"clipped_fraction": ("n_clipped", "n_values"), "replaced_fraction": ("n_replaced", "n_values")}


def _is_count(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def diff_counts(after: dict, before: dict) -> dict:
    """What one chunk added to a correction report (:meth:`Corrections.summary` after minus before)."""
    out = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, dict):
            out[k] = diff_counts(v, b if isinstance(b, dict) else {})
        elif _is_count(v) and k not in MAX_KEYS and k not in RATIOS and _is_count(b):
            out[k] = v - b
        else:
            out[k] = v
    return out


def merge_counts(parts) -> dict:
    """The report of several chunks' :func:`diff_counts` (counts summed, maxima kept, ratios recomputed)."""
    out: dict = {}
    for part in parts:
        for k, v in part.items():
            old = out.get(k)
            if isinstance(v, dict):
                out[k] = merge_counts([old if isinstance(old, dict) else {}, v])
            elif _is_count(v) and _is_count(old) and k not in RATIOS:
                out[k] = max(old, v) if k in MAX_KEYS else old + v
            else:
                out[k] = v
    for k, (num, den) in RATIOS.items():
        if k in out and _is_count(out.get(num)) and _is_count(out.get(den)):
            out[k] = out[num] / out[den] if out[den] else 0.0
    return out
