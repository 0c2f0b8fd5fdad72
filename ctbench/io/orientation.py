"""Image orientation and rotation direction of a scan, as data (docs/SCANS.md, "Orientation").

Four fields say how a file's images and angles map onto ctbench's frame
(docs/GEOMETRY.md):

``seen_from``  "source": the image is the detector as seen from the source
               (the camera convention of most scanners and of ASTRA), or
               "detector": as seen from behind the detector, looking back at
               the source (ctbench's own images).  "auto": not stated.
``columns``    "right" or "left": the way the column index grows, for that viewer.
``rows``       "down" or "up": the way the row index grows (world +z is up).
``rotation``   "ccw" or "cw": the way the source turns about the object seen
               from above (+z), view after view, i.e. the sense of the file's
               angles (a stage that turns the object clockwise seen from
               above makes a "ccw" scan).  "auto": not stated.

ctbench's frame is ``seen_from="detector", columns="right", rows="down",
rotation="ccw"``: columns run along +u, rows along -v, angles as in the
generators.  Seen from the source, +u points to the *left* (u x v points
along the rays, from source to detector), so a camera-convention image has
its columns reversed relative to ctbench's.

A mirror image cannot be known from the data: ("source", "ccw") and
("detector", "cw") describe the same data as two objects that are mirror
images of each other (:meth:`Orientation.mirror`); so do ("source", "cw")
and ("detector", "ccw").  What the data do show is the *handedness class*:
the wrong class (e.g. reading a camera image as if it were ctbench's, with
the right rotation) is an inconsistent scan (:mod:`ctbench.io.handedness`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

SEEN_FROM = ("source", "detector", "auto")
COLUMNS = ("right", "left")
ROWS = ("down", "up")
ROTATION = ("ccw", "cw", "auto")

# Names of the fields in scan.json ("geometry" section) and in the recon config ("geometry" section).
FILE_KEYS = {"seen_from": "image_seen_from", "columns": "image_columns", "rows": "image_rows",
             "rotation": "rotation_direction"}


def _check(name: str, value, allowed, where: str = "") -> str:
    if value not in allowed:
        pre = f"{where}: " if where else ""
        raise ValueError(f"{pre}{name} must be one of {list(allowed)}, got {value!r}")
    return value


@dataclass(frozen=True)
class Orientation:
    """How a file's images and angles map onto ctbench's frame (module doc)."""

    seen_from: str = "auto"
    columns: str = "right"
    rows: str = "down"
    rotation: str = "auto"

    def __post_init__(self) -> None:
        _check("seen_from", self.seen_from, SEEN_FROM)
        _check("columns", self.columns, COLUMNS)
        _check("rows", self.rows, ROWS)
        _check("rotation", self.rotation, ROTATION)

    @property
    def resolved(self) -> bool:
        return self.seen_from != "auto" and self.rotation != "auto"

    @property
    def flip_columns(self) -> bool:
        """Whether the columns must be reversed to run along ctbench's +u (needs ``seen_from``)."""
        if self.seen_from == "auto":
            raise ValueError("the image orientation is not known (seen_from='auto'); resolve it first")
        return (self.seen_from == "source") != (self.columns == "left")

    @property
    def flip_rows(self) -> bool:
        """Whether the rows must be reversed to run along ctbench's -v (row 0 at the top)."""
        return self.rows == "up"

    def mirror(self) -> "Orientation":
        """The other reading of the same data: it reconstructs the mirror image (module doc)."""
        if not self.resolved:
            raise ValueError("only a resolved orientation has a mirror reading")
        return replace(self, seen_from="detector" if self.seen_from == "source" else "source",
                       rotation="cw" if self.rotation == "ccw" else "ccw")

    def replace(self, **changes) -> "Orientation":
        """A copy with the fields given (``None`` keeps a field)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        """The fields under their file/config names (``image_seen_from``, ..., ``rotation_direction``)."""
        return {FILE_KEYS[k]: v for k, v in asdict(self).items()}

    def text(self) -> str:
        return (f"images seen from the {self.seen_from}, columns {self.columns}, rows {self.rows}, "
                f"rotation {self.rotation}")

    @classmethod
    def from_dict(cls, doc: dict, where: str = "", *, defaults: "Orientation | None" = None) -> "Orientation":
        """Read the fields by their file names from ``doc``; missing ones come from ``defaults`` (or "auto")."""
        base = defaults or cls()
        vals = {}
        for field_name, key in FILE_KEYS.items():
            allowed = {"seen_from": SEEN_FROM, "columns": COLUMNS, "rows": ROWS, "rotation": ROTATION}[field_name]
            vals[field_name] = _check(key, doc[key], allowed, where) if doc.get(key) is not None \
                else getattr(base, field_name)
        return cls(**vals)


CTBENCH = Orientation("detector", "right", "down", "ccw")


def to_ctbench_images(images, orientation: Orientation) -> np.ndarray:
    """``(view, row, col)`` images of ``orientation`` reordered to ctbench's (columns +u, rows -v)."""
    a = np.asarray(images)
    if orientation.flip_columns:
        a = a[..., ::-1]
    if orientation.flip_rows:
        a = a[..., ::-1, :]
    return np.ascontiguousarray(a)


def reverse_rotation(angles: np.ndarray) -> np.ndarray:
    """The angles of the opposite rotation: the first view keeps its angle, every step changes sign."""
    a = np.asarray(angles, dtype=np.float64)
    return a if a.size == 0 else 2 * a[0] - a


def roll_detector(trajectory, roll_deg: float):
    """The trajectory with every detector turned by ``roll_deg`` in its own plane about its centre.

    Positive turns u towards v: anticlockwise as seen from behind the
    detector (ctbench's image view, u right and v up).  The detector centre,
    and so the offsets, stay where they are.
    """
    import math

    r = math.radians(float(roll_deg))
    c, s = math.cos(r), math.sin(r)
    u, v = trajectory.detector_u, trajectory.detector_v
    meta = {**trajectory.meta, "detector_roll_deg": float(roll_deg)}
    return trajectory.replace(detector_u=c * u + s * v, detector_v=-s * u + c * v, meta=meta)


def unroll_images(images, roll_deg: float, pitch, *, rows: tuple[int, int] | None = None, first_row: int = 0,
                  detector_rows: int | None = None) -> np.ndarray:
    """``(view, row, col)`` ctbench images of a detector rolled by ``roll_deg`` resampled onto the unrolled one.

    For FBP/FDK, which filter detector rows and so need rows perpendicular
    to the axis.  Bilinear; pixels that fall outside the rolled detector take
    the nearest edge value.  A band of rows: ``images`` holds detector rows
    ``[first_row, first_row + len)`` of a detector ``detector_rows`` tall, and the
    unrolled rows ``rows = (r0, r1)`` are returned (the band must hold every row
    they sample, which :func:`unroll_margin` bounds, or reach the detector's edge).
    """
    import math

    from scipy.ndimage import map_coordinates

    a = np.asarray(images, dtype=np.float32)
    n, nr, U = a.shape
    V = nr if detector_rows is None else int(detector_rows)
    r0, r1 = (first_row, first_row + nr) if rows is None else (int(rows[0]), int(rows[1]))
    du, dv = (float(p) for p in pitch)
    r = math.radians(float(roll_deg))
    c, s = math.cos(r), math.sin(r)
    rr, cols = np.mgrid[r0:r1, :U].astype(np.float64)
    ua, vb = (cols - (U - 1) / 2) * du, ((V - 1) / 2 - rr) * dv          # unrolled pixel centres (u, v)
    p, q = c * ua + s * vb, -s * ua + c * vb                              # the same points on the rolled detector
    coords = np.stack([(V - 1) / 2 - q / dv - first_row, p / du + (U - 1) / 2])
    out = np.empty((n, r1 - r0, U), np.float32)
    for k in range(n):
        out[k] = map_coordinates(a[k], coords, order=1, mode="nearest")
    return out


def unroll_margin(roll_deg: float, pitch, cols: int, rows: int) -> int:
    """Rows beyond a band that :func:`unroll_images` may sample for the band's unrolled rows (a detector of
    ``rows`` x ``cols``): the roll's sweep across half the width, and its turn of the rows far from the centre."""
    import math

    du, dv = (float(p) for p in pitch)
    r = math.radians(float(roll_deg))
    return int(math.ceil(abs(math.sin(r)) * (cols - 1) / 2 * du / dv + (1 - math.cos(r)) * (rows - 1) / 2)) + 2
