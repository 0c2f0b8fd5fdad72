"""The bundled samples: their names, what they are, and where they are installed.

The files live in ``sample_data/`` at the top of a checkout and ship in the wheel as the package
``ctbench/sample_data`` (``[tool.scikit-build] wheel.packages``); :func:`sample_data_dir` finds
either layout, so code and configs name a sample instead of a path that exists only in a checkout::

    {"input": {"sample": "lab_scan"}, "output": {"path": "recon.tif"}}     # ctbench recon

``ctbench samples`` lists them with their paths.  Two of napari's four samples (``phantom``,
``phantom_scan``) are computed when opened and have no files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Sample", "SAMPLES", "sample_data_dir", "sample_path", "describe_samples"]


@dataclass(frozen=True)
class Sample:
    name: str
    title: str
    entry: str | None       # file or folder inside sample_data/; None: computed when opened
    use: str                # how to open it
    napari: bool            # offered by napari's File > Open Sample


SAMPLES: dict[str, Sample] = {s.name: s for s in (
    Sample("lab_scan", "simulated lab cone-beam scan in raw counts (TIFF folders + scan.json, 120 views)",
           "lab_scan", 'ctbench recon with {"input": {"sample": "lab_scan"}}', True),
    Sample("selfcal_scan", "simulated cone-beam scan with a known geometry error (truth.json), for calibration",
           "selfcal_scan", 'ctbench calibrate with {"input": {"sample": "selfcal_scan"}}', False),
    Sample("htc2022", "HTC2022 'ta' disc, a measured fan-beam scan (721 views, CC BY 4.0, see NOTICE.md)",
           "htc2022_ta_full.mat", "ctbench.datasets.load_htc2022()", True),
    Sample("phantom", "3D modified Shepp-Logan phantom, 64^3 voxels (computed)", None,
           "ctbench.phantoms.shepp_logan_3d()", True),
    Sample("phantom_scan", "the phantom and its simulated cone-beam scan (computed)", None,
           "napari: File > Open Sample > ctbench", True),
)}


def _candidates() -> list[Path]:
    """Where sample_data may be: the installed package (wheel, or an editable install's mapping), then a
    checkout's top-level folder (ctbench imported from the source tree through PYTHONPATH)."""
    found = []
    try:
        from importlib.resources import files
        found.append(Path(str(files("ctbench.sample_data"))))
    except (ModuleNotFoundError, TypeError, ValueError):   # not a package here (a plain checkout)
        pass
    here = Path(__file__).resolve().parent
    found += [here / "sample_data", here.parent / "sample_data"]
    return found


def sample_data_dir() -> Path:
    """The folder that holds the bundled samples (FileNotFoundError naming the places looked at)."""
    looked = _candidates()
    markers = [s.entry for s in SAMPLES.values() if s.entry]
    for p in looked:
        if any((p / m).exists() for m in markers):
            return p
    raise FileNotFoundError("the bundled samples are not installed: none of "
                            + ", ".join(str(p) for p in looked) + " holds them")


def sample_path(name: str) -> Path:
    """The installed file or folder of sample ``name``; ValueError for an unknown or computed sample."""
    s = SAMPLES.get(name) if isinstance(name, str) else None
    files = sorted(k for k, v in SAMPLES.items() if v.entry)
    if s is None:
        raise ValueError(f"unknown sample {name!r}; the bundled samples are {', '.join(files)} "
                         "(`ctbench samples` lists them with their paths)")
    if s.entry is None:
        raise ValueError(f"sample {name!r} is computed when opened and has no files; the samples with files are "
                         f"{', '.join(files)}")
    p = sample_data_dir() / s.entry
    if not p.exists():
        raise FileNotFoundError(f"sample {name!r} is missing from this installation: {p} does not exist")
    return p


def describe_samples() -> list[dict]:
    """One entry per sample: name, title, path (None where computed, or where not installed), whether it is
    computed, how to use it, and whether napari offers it."""
    try:
        base = sample_data_dir()
    except FileNotFoundError:
        base = None
    out = []
    for s in SAMPLES.values():
        path = base / s.entry if base is not None and s.entry else None
        out.append({"name": s.name, "title": s.title, "path": str(path) if path and path.exists() else None,
                    "computed": s.entry is None, "use": s.use, "napari": s.napari})
    return out
