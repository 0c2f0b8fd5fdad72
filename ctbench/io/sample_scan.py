"""A simulated lab cone-beam scan in raw counts, stored the way lab scanners deliver one.

The Shepp-Logan head (exact analytic line integrals, so no projector is
involved in making the data) is scanned on a circular orbit whose detector
sits :data:`SAMPLE_OFFSET_PX` pixels off centre, as real detectors do.
Counts follow Poisson statistics around a beam of ``i0`` photons per pixel
shaped by a smooth fall-off and a fixed per-pixel gain pattern (so a scan
without flat-field correction shows rings), plus a dark current with its
own fixed pattern and Gaussian read noise.  Flats and darks are taken with
the same detector.  The files: ``projections/proj_NNNN.tif``,
``flats/flat_NN.tif``, ``darks/dark_NN.tif`` (uint16, zlib) and ``scan.json``
(:mod:`ctbench.io.scanner`).  The offset is *not* in ``scan.json``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .orientation import Orientation
from .scan import sinogram_to_images
from .scanner import SCANNER_JSON, scanner_json

SAMPLE_OFFSET_PX = 3.3


@dataclass(frozen=True)
class LabScanSpec:
    """Parameters of the simulated scan (mm, degrees, photons)."""

    n_views: int = 120
    detector_u: int = 96            # columns
    detector_v: int = 72            # rows
    pitch: float = 1.5
    sid: float = 200.0
    sdd: float = 400.0
    offset_px: float = SAMPLE_OFFSET_PX
    offset_v_px: float = 0.0        # vertical detector offset (rows), as the u offset not in scan.json
    volume: int = 64                # phantom grid (voxels per axis) for the truth
    voxel: float = 1.0
    attenuation: float = 0.03       # per mm, of a unit value of the Shepp-Logan table
    i0: float = 12000.0             # photons per pixel in the open beam centre
    dark_level: float = 100.0
    read_noise: float = 3.0
    n_flats: int = 8
    n_darks: int = 8
    seed: int = 13
    phantom_name: str = "shepp-logan"   # or "chiral" (ctbench.phantoms.chiral_phantom)
    rotation: str = "ccw"           # how the scanner turned (docs/SCANS.md, "Orientation")
    seen_from: str = "detector"     # how it writes images: "detector" (ctbench's) or "source" (camera)
    beam: str = "cone"              # or "parallel" (sid/sdd unused): a beamline scan

    def __post_init__(self) -> None:
        if self.phantom_name not in ("shepp-logan", "chiral"):
            raise ValueError(f"phantom_name must be 'shepp-logan' or 'chiral', got {self.phantom_name!r}")
        Orientation(seen_from=self.seen_from, rotation=self.rotation)      # validates both
        if self.beam not in ("cone", "parallel"):
            raise ValueError(f"beam must be 'cone' or 'parallel', got {self.beam!r}")

    @property
    def orientation(self) -> Orientation:
        return Orientation(self.seen_from, "right", "down", self.rotation)

    @property
    def angles(self) -> np.ndarray:
        """ctbench angles of the views (decreasing for a clockwise scan)."""
        a = 2 * np.pi * np.arange(self.n_views) / self.n_views
        return a if self.rotation == "ccw" else -a

    def phantom_scale(self) -> float:
        from ..phantoms import default_scale
        return float(default_scale((self.volume,) * 3, self.voxel))

    def trajectory(self, offset_px: float | None = None):
        import torch

        from ..geometry import circular_trajectory_3d, circular_trajectory_3d_parallel
        o = self.offset_px if offset_px is None else offset_px
        if self.beam == "parallel":
            return circular_trajectory_3d_parallel(angles=torch.from_numpy(self.angles),
                                                   detector_offset=(o * self.pitch, self.offset_v_px * self.pitch),
                                                   dtype=torch.float64)
        return circular_trajectory_3d(sid=self.sid, sdd=self.sdd, angles=torch.from_numpy(self.angles),
                                      detector_offset=(o * self.pitch, self.offset_v_px * self.pitch),
                                      dtype=torch.float64)

    def phantom(self) -> np.ndarray:
        """The true attenuation (per mm) on the ``volume``^3 grid."""
        return self.truth()

    def truth(self, shape=None, voxel=None) -> np.ndarray:
        """The true attenuation (per mm) on the ``volume``^3 grid, or on ``shape`` with ``voxel`` (mm)."""
        from ..phantoms import chiral_phantom, shepp_logan_3d
        shape = (self.volume,) * 3 if shape is None else tuple(shape)
        voxel = self.voxel if voxel is None else voxel
        if self.phantom_name == "chiral":
            vol = chiral_phantom(shape, voxel, scale=self.phantom_scale())
        else:
            vol = shepp_logan_3d(shape, voxel, modified=True, scale=self.phantom_scale())
        return (vol * self.attenuation).numpy()

    def line_integrals(self, trajectory=None):
        """Exact ``(view, U, V)`` line integrals (per mm x mm) of the phantom for the scan (or ``trajectory``)."""
        from ..phantoms import chiral_line_integrals, shepp_logan_line_integrals
        traj = self.trajectory() if trajectory is None else trajectory
        det = (self.detector_u, self.detector_v)
        if self.phantom_name == "chiral":
            sino = chiral_line_integrals(traj, det, self.pitch, scale=self.phantom_scale())
        else:
            sino = shepp_logan_line_integrals(traj, det, self.pitch, modified=True, scale=self.phantom_scale())
        return sino.numpy() * self.attenuation


def simulate_counts(spec: LabScanSpec = LabScanSpec(), trajectory=None):
    """(projections, flats, darks) as uint16 ``(n, rows, cols)`` stacks and the exact line integrals.

    ``trajectory``: scan that one instead of the spec's circular orbit (e.g. with per-view detector shifts).
    """
    rng = np.random.default_rng(spec.seed)
    U, V = spec.detector_u, spec.detector_v
    sino = spec.line_integrals(trajectory)
    line = sinogram_to_images(sino)                                        # (n, rows, cols), ctbench's images
    if spec.seen_from == "source":
        line = line[:, :, ::-1]                                            # seen from the source, +u is left
    r, c = np.mgrid[:V, :U]
    rr = ((r - (V - 1) / 2) / V) ** 2 + ((c - (U - 1) / 2) / U) ** 2
    beam = spec.i0 * (1 - 0.3 * rr) * rng.normal(1.0, 0.02, (V, U))          # fall-off x fixed gain pattern
    dark = spec.dark_level * rng.normal(1.0, 0.05, (V, U))                   # fixed dark-current pattern

    def frames(mean_photons, n=None):
        shape = mean_photons.shape if n is None else (n, *mean_photons.shape)
        counts = rng.poisson(np.broadcast_to(mean_photons, shape)).astype(np.float64)
        counts += dark + rng.normal(0.0, spec.read_noise, shape)
        return np.clip(np.rint(counts), 0, 65535).astype(np.uint16)

    proj = frames(beam[None] * np.exp(-line))
    flats = frames(beam, spec.n_flats)
    darks = frames(np.zeros_like(beam), spec.n_darks)
    return proj, flats, darks, sino


def write_lab_scan(folder, spec: LabScanSpec = LabScanSpec(), *, overwrite: bool = False,
                   state_orientation: bool = True) -> Path:
    """Simulate the scan and write it as a lab-scanner folder (written aside, then renamed into place).

    ``state_orientation=False`` leaves the image orientation and rotation direction out of ``scan.json``.
    """
    folder = Path(folder)
    if folder.exists() and not overwrite:
        raise FileExistsError(f"{folder} exists; pass overwrite=True to replace it")
    proj, flats, darks, _ = simulate_counts(spec)
    doc = scanner_json(sid=spec.sid, sdd=spec.sdd, pixel_size=(spec.pitch, spec.pitch), n_projections=spec.n_views,
                       scanner="ctbench simulated lab micro-CT",
                       orientation=spec.orientation if state_orientation else None,
                       acquisition={"tube_voltage_kv": 90, "exposure_ms": 500, "n_flats": spec.n_flats,
                                    "n_darks": spec.n_darks})
    return write_scan_folder(folder, proj, flats, darks, doc)


def write_scan_folder(folder: Path, proj, flats, darks, doc: dict, extra: dict[str, str] | None = None) -> Path:
    """Write uint16 projection, flat and dark stacks as TIFFs, ``doc`` as the scanner JSON and each of
    ``extra`` (file name -> text) into a folder beside ``folder``, then rename it into place (replacing
    ``folder``)."""
    import tifffile

    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for sub, stack, stem, width in (("projections", proj, "proj", 4), ("flats", flats, "flat", 2),
                                    ("darks", darks, "dark", 2)):
        (tmp / sub).mkdir(parents=True)
        for i, img in enumerate(stack):
            tifffile.imwrite(tmp / sub / f"{stem}_{i:0{width}d}.tif", img, compression="zlib")
    (tmp / SCANNER_JSON).write_text(json.dumps(doc, indent=2))
    for name, text in (extra or {}).items():
        (tmp / name).write_text(text)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def sample_scan_path() -> Path:
    """The bundled sample (``sample_data/lab_scan``), or a copy generated once into the user's cache."""
    from importlib import resources

    try:
        shipped = Path(str(resources.files("ctbench.sample_data") / "lab_scan"))
    except ModuleNotFoundError:
        shipped = Path(__file__).resolve().parents[2] / "sample_data" / "lab_scan"
    if (shipped / SCANNER_JSON).is_file():
        return shipped
    cache = Path(os.environ.get("CTBENCH_CACHE", Path.home() / ".cache" / "ctbench")) / "lab_scan"
    if not (cache / SCANNER_JSON).is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_lab_scan(cache, overwrite=True)
    return cache


def spec_dict(spec: LabScanSpec = LabScanSpec()) -> dict:
    return asdict(spec)
