"""Sample data for napari's File > Open Sample (and the sample builders the tests share).

- ``phantom``: the 3D modified Shepp-Logan head, 64^3 voxels of 1 mm, in
  attenuation per mm (1.0 in the classic table is 0.02 /mm, close to bone).
- ``phantom_scan``: the phantom and its simulated circular cone-beam scan
  (120 views, SID 200 mm, SDD 400 mm, 96x96 detector of 1.5 mm pixels),
  with the geometry in the sinogram layer's metadata.
- ``htc2022``: the real fan-beam scan of the HTC2022 "ta" disc
  (sample_data/htc2022_ta_full.mat, CC BY 4.0) with its geometry.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np

from ctbench.workbench.design import ScanGeometry, TrajectoryDesign

from ._layers import LayerData, sinogram_layer, volume_layer

PHANTOM_SHAPE = (64, 64, 64)
PHANTOM_SPACING = 1.0
ATTENUATION = 0.02          # attenuation per mm of a unit value of the Shepp-Logan table
PHANTOM_CONTRAST = (0.0, 0.4 * ATTENUATION)   # shows the soft-tissue ellipses inside the skull

PHANTOM_SCAN = TrajectoryDesign(kind="circular", n_views=120, sid=200.0, sdd=400.0, angle_range=360.0,
                                detector_u=96, detector_v=96, pixel_u=1.5, pixel_v=1.5,
                                volume_d=64, volume_h=64, volume_w=64, voxel_size=PHANTOM_SPACING)


@lru_cache(maxsize=2)
def _phantom_array(shape=PHANTOM_SHAPE, spacing=PHANTOM_SPACING) -> np.ndarray:
    from ctbench.phantoms import shepp_logan_3d
    vol = shepp_logan_3d(shape, spacing, modified=True) * ATTENUATION
    out = vol.numpy()
    out.setflags(write=False)   # shared by the cache: layers get copies
    return out


def phantom_volume(shape=PHANTOM_SHAPE, spacing=PHANTOM_SPACING) -> np.ndarray:
    """The Shepp-Logan phantom in attenuation per mm (a fresh, writable copy)."""
    return _phantom_array(tuple(shape), float(spacing)).copy()


def phantom_layer(shape=PHANTOM_SHAPE, spacing=PHANTOM_SPACING) -> LayerData:
    vol = phantom_volume(shape, spacing)
    return volume_layer(vol, (spacing,) * len(shape), "Shepp-Logan phantom", contrast_limits=PHANTOM_CONTRAST,
                        extra={"source": "ctbench.phantoms.shepp_logan_3d", "units": "1/mm"})


def phantom_scan_geometry(design: TrajectoryDesign = PHANTOM_SCAN) -> ScanGeometry:
    return design.build()


def phantom_sinogram(geometry: ScanGeometry | None = None) -> tuple[ScanGeometry, np.ndarray]:
    """The phantom projected along the sample scan (Joseph projector, CPU)."""
    from ctbench.workbench.workflow import simulate
    import torch

    geo = geometry or phantom_scan_geometry()
    vol = torch.from_numpy(phantom_volume(geo.volume_shape, geo.voxel_spacing[0]))
    return geo, simulate(geo, vol).numpy()


def make_phantom() -> list[LayerData]:
    """Sample: the 3D Shepp-Logan phantom."""
    return _deferred("phantom", make_phantom) or [phantom_layer()]


@lru_cache(maxsize=1)
def _sample_sinogram() -> tuple[ScanGeometry, np.ndarray]:
    geo, sino = phantom_sinogram()
    sino.setflags(write=False)   # shared by the cache: layers get copies
    return geo, sino


@lru_cache(maxsize=1)
def _lab_scan_layer() -> LayerData:
    from ctbench.io.sample_scan import sample_scan_path

    from ._scan_io import scan_layer

    return scan_layer(sample_scan_path(), name="lab scan (raw counts)")


_READY: set = set()     # samples warm_up has computed
_WARMING = threading.Event()      # set while warm_up runs (the workbench's start-up thread)


def warm_up() -> None:
    """Compute the samples once (the workbench calls it in a background thread at start), so that
    File > Open Sample later only hands over arrays instead of projecting or reading on the GUI thread."""
    _WARMING.set()
    try:
        _phantom_array()
        _READY.add("phantom")
        _sample_sinogram()
        _READY.add("phantom_scan")
        _lab_scan_layer()
        _READY.add("lab_scan")
        _htc2022_sample()
        _READY.add("htc2022")
    finally:
        _WARMING.clear()


def is_ready(sample: str) -> bool:
    """Whether ``sample`` is computed (opening it then only copies arrays); False for samples the warm-up
    does not compute."""
    return sample in _READY


# The layers a sample makes before it is computed: (name, ctbench kind, number of dimensions).
_PLACEHOLDERS = {
    "phantom": [("Shepp-Logan phantom", "volume", 3)],
    "phantom_scan": [("Shepp-Logan phantom", "volume", 3), ("Shepp-Logan cone-beam scan", "sinogram", 3)],
    "lab_scan": [("lab scan (raw counts)", "projections", 3)],
    "htc2022": [("HTC2022 ta (fan beam)", "sinogram", 2)],
}


def _deferred(sample: str, make):
    """Placeholders now and the sample once the warm-up has computed it, when the warm-up is still on it
    (None otherwise: the caller computes the sample itself, as outside the workbench)."""
    if not _WARMING.is_set() or is_ready(sample):
        return None
    try:
        import napari

        from ._qt.deferred_samples import fill_when_ready, placeholders

        viewer = napari.current_viewer()
        if viewer is None:
            return None
        fill_when_ready(viewer, lambda: is_ready(sample) or not _WARMING.is_set(), make)
    except (ImportError, RuntimeError):
        return None
    return placeholders(_PLACEHOLDERS[sample])


def make_phantom_scan() -> list[LayerData]:
    """Sample: the phantom and its simulated circular cone-beam scan."""
    later = _deferred("phantom_scan", _phantom_scan_layers)
    return later if later is not None else _staged(_phantom_scan_layers())


def _phantom_scan_layers() -> list[LayerData]:
    geo, sino = _sample_sinogram()
    return [phantom_layer(),
            sinogram_layer(sino.copy(), geo, "Shepp-Logan cone-beam scan",
                           extra={"source": "simulated: Joseph projector, no noise", "units": "line integral"})]


def _staged(layers: list) -> list:
    """In the workbench's viewer: the first layer now, hidden, and shown in the next event-loop turn, the
    others one per turn in the same way (elsewhere, e.g. a script's viewer, all at once as napari adds them)."""
    try:
        import napari

        viewer = napari.current_viewer()
        if viewer is None or not getattr(viewer.window._qt_window, "_ctbench_workbench", False):
            return layers
        from ._qt.deferred_samples import add_in_later_turns
    except (ImportError, AttributeError, RuntimeError):
        return layers
    data, kwargs, ltype = layers[0]
    add_in_later_turns(viewer, layers[1:], first=kwargs["name"])
    return [(data, {**kwargs, "visible": False}, ltype)]     # shown a turn later (add_in_later_turns)


def make_htc2022() -> list[LayerData]:
    """Sample: the measured HTC2022 fan-beam scan of an acrylic disc (721 views x 560 pixels)."""
    later = _deferred("htc2022", make_htc2022)
    if later is not None:
        return later
    geo, sino = _htc2022_sample()
    return [sinogram_layer(sino.copy(), geo, "HTC2022 ta (fan beam)",
                           extra={"source": "HTC2022, doi:10.5281/zenodo.6984868, CC BY 4.0",
                                  "units": "line integral"})]


@lru_cache(maxsize=1)
def _htc2022_sample() -> tuple[ScanGeometry, np.ndarray]:
    from ctbench.datasets import load_htc2022

    geo, sino = htc2022_geometry(load_htc2022())
    sino.setflags(write=False)   # shared by the cache: layers get copies
    return geo, sino


def htc2022_geometry(data) -> tuple[ScanGeometry, np.ndarray]:
    """ScanGeometry and sinogram of a :class:`ctbench.datasets.ScanData` (the HTC2022 loader's result)."""
    kw = data.projector_kwargs
    geo = ScanGeometry(data.trajectory, kw["detector_shape"], kw["detector_spacing"], kw["volume_shape"],
                       kw["voxel_spacing"])
    return geo, data.sinogram.detach().cpu().numpy().astype(np.float32)


def make_lab_scan() -> list[LayerData]:
    """Sample: a simulated lab cone-beam scan in raw counts (TIFF files + scan.json; flats, darks, an offset)."""
    import copy

    later = _deferred("lab_scan", make_lab_scan)
    if later is not None:
        return later
    data, kw, kind = _lab_scan_layer()
    return _staged([(data, copy.deepcopy(kw), kind)])     # the lazy stack is shared; each layer owns its metadata
