"""Layers <-> ctbench objects: metadata, placement, display order (numpy only, no Qt).

Every layer the plugin makes carries ``metadata["ctbench"]``, a JSON-able
dict with at least ``"kind"``:

- ``"volume"``      an image of attenuation; optional ``"geometry"`` and
                    ``"recon"`` (how it was reconstructed)
- ``"sinogram"``    an image of line integrals with ``"geometry"`` (a
                    :class:`~ctbench.workbench.design.ScanGeometry` dict) and
                    ``"axes"``, the display order of its data
- ``"trajectory"``  the source-path layer of a trajectory preview, with ``"geometry"``
- ``"trajectory_part"`` the other preview layers (detector frames, volume box)
- ``"completeness"`` a data-completeness map (views per voxel)

Volumes are placed in world coordinates (mm): data axes (z, y, x), scale =
voxel pitch, translate = centre of voxel 0, so that the grid is centred on
the origin as in ctbench and every layer lines up with the trajectory
preview.  Sinograms are displayed as ``(view, v, u)`` in detector pixels with
+v (world +z) up, so the view index is the slider and the detector rows run
vertically; they live in their own frame (``_qt/display.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctbench.workbench.design import ScanGeometry

KEY = "ctbench"
LayerData = tuple[Any, dict, str]
# napari's world units of every layer the plugin makes: ctbench's world frame is in millimetres, and the scale
# bar takes its unit from the layers (pixel-frame layers carry it too, so that the units agree; the bar is
# only shown on volume slices, see _qt/units.py).
UNITS = "mm"

# display order of sinogram data, by ndim: napari shows the last two axes
SINOGRAM_AXES_3D = ["view", "-v", "u"]
SINOGRAM_AXES_2D = ["view", "u"]


class LayerError(ValueError):
    """A layer cannot serve the requested purpose; the message says why and what to pick instead."""


def info(layer) -> dict:
    """The layer's ctbench metadata (empty dict if none)."""
    meta = getattr(layer, "metadata", None) or {}
    d = meta.get(KEY)
    return d if isinstance(d, dict) else {}


def kind_of(layer) -> str | None:
    return info(layer).get("kind")


def has_geometry(layer) -> bool:
    return isinstance(info(layer).get("geometry"), dict)


def is_sinogram(layer) -> bool:
    return kind_of(layer) == "sinogram"


def is_trajectory_source(layer) -> bool:
    """Layers that can provide a scan: trajectory previews and sinograms."""
    return kind_of(layer) in ("trajectory", "sinogram") and has_geometry(layer)


def is_volume_candidate(layer) -> bool:
    """Image layers that could be projected (not sinograms, maps or RGB images)."""
    if layer.__class__.__name__ != "Image" or getattr(layer, "rgb", False) or getattr(layer, "multiscale", False):
        return False
    return kind_of(layer) not in ("sinogram", "completeness") and layer.data.ndim in (2, 3)


def geometry_of(layer) -> ScanGeometry:
    """The scan geometry stored in a layer; :class:`LayerError` if it has none."""
    g = info(layer).get("geometry")
    if not isinstance(g, dict):
        raise LayerError(f"layer '{layer.name}' has no ctbench geometry; pick a sinogram made by the "
                         "projection widget or opened from a ctbench dataset")
    try:
        return ScanGeometry.from_dict(g)
    except (ValueError, TypeError, KeyError) as e:
        raise LayerError(f"layer '{layer.name}' has an invalid ctbench geometry: {e}") from None


# ------------------------------------------------------------- placement
def placement(shape, voxel_spacing, origin=None) -> dict:
    """``scale`` and ``translate`` that put a (z, y, x) grid at its world position (mm)."""
    spacing = [float(s) for s in voxel_spacing]
    if origin is None:
        origin = [-(n - 1) / 2 * d for n, d in zip(shape, spacing)]
    return {"scale": spacing, "translate": [float(o) for o in origin]}


def volume_layer_kwargs(shape, voxel_spacing, name: str, *, origin=None, geometry: ScanGeometry | None = None,
                        extra: dict | None = None, **kwargs) -> dict:
    """The image layer keywords of a ``shape`` volume placed in world mm (for lazy data: no array is read)."""
    meta = {"kind": "volume", "voxel_spacing": [float(s) for s in voxel_spacing]}
    if geometry is not None:
        meta["geometry"] = geometry.to_dict()
    meta.update(extra or {})
    kw = {"name": name, "metadata": {KEY: meta}, "colormap": "gray", "units": UNITS,
          **placement(shape, voxel_spacing, origin)}
    kw.update(kwargs)
    return kw


def volume_layer(volume, voxel_spacing, name: str, *, origin=None, geometry: ScanGeometry | None = None,
                 extra: dict | None = None, **kwargs) -> LayerData:
    """An image LayerDataTuple of a volume, placed in world mm."""
    vol = _numpy(volume)
    return vol, volume_layer_kwargs(vol.shape, voxel_spacing, name, origin=origin, geometry=geometry, extra=extra,
                                    **kwargs), "image"


def volume_of(layer) -> tuple[np.ndarray, tuple[float, ...]]:
    """A volume layer's data (float) and voxel pitch (its scale, mm); LayerError for unusable layers."""
    if layer.__class__.__name__ != "Image":
        raise LayerError(f"layer '{layer.name}' is a {layer.__class__.__name__} layer; pick an image layer as the volume")
    if getattr(layer, "rgb", False) or getattr(layer, "multiscale", False):
        raise LayerError(f"layer '{layer.name}' is an RGB or multiscale image; pick a single-channel volume")
    if kind_of(layer) == "sinogram":
        raise LayerError(f"layer '{layer.name}' is a sinogram; pick a volume to project")
    data = np.asarray(layer.data)
    if data.ndim not in (2, 3):
        raise LayerError(f"layer '{layer.name}' has {data.ndim} dimensions; a volume is (z, y, x) or a 2D (y, x) image")
    if data.dtype.kind not in "fiub":
        raise LayerError(f"layer '{layer.name}' holds {data.dtype} data, not numbers")
    scale = tuple(float(s) for s in layer.scale[-data.ndim:])
    return data.astype(np.float32, copy=False), scale


# ------------------------------------------------------------- sinograms
def sinogram_to_display(sino) -> np.ndarray:
    """(n_views, U, V) -> (n_views, V, U) with +v up; 2D (n_views, U) unchanged."""
    s = _numpy(sino)
    if s.ndim == 2:
        return s
    return np.ascontiguousarray(s.transpose(0, 2, 1)[:, ::-1, :])


def display_to_sinogram(data, axes=None) -> np.ndarray:
    """Inverse of :func:`sinogram_to_display` (given the layer's stored ``axes``)."""
    d = np.asarray(data)
    if d.ndim == 2:
        return d
    if axes is not None and list(axes) == ["view", "u", "v"]:
        return d
    return np.ascontiguousarray(d[:, ::-1, :].transpose(0, 2, 1))


def sinogram_layer(sino, geometry: ScanGeometry, name: str, *, extra: dict | None = None, **kwargs) -> LayerData:
    """An image LayerDataTuple of a sinogram with its geometry in metadata."""
    s = _numpy(sino)
    if tuple(s.shape) != geometry.sinogram_shape:
        raise ValueError(f"sinogram shape {s.shape} does not match the geometry's {geometry.sinogram_shape}")
    axes = SINOGRAM_AXES_2D if s.ndim == 2 else SINOGRAM_AXES_3D
    meta = {"kind": "sinogram", "geometry": geometry.to_dict(), "axes": axes}
    meta.update(extra or {})
    # The sinogram frame is (view, v, u) in detector pixels, never millimetres: a view index and a detector
    # length would otherwise share one axis with the volumes (see _qt/display.py). Rows are stretched by the
    # pixel aspect dv/du so that the image has the detector's true shape.
    if s.ndim == 2:
        scale = [1.0, 1.0]
    else:
        scale = [1.0, geometry.detector_spacing[1] / geometry.detector_spacing[0], 1.0]
    kw = {"name": name, "metadata": {KEY: meta}, "colormap": "gray", "scale": scale, "units": UNITS}
    kw.update(kwargs)
    return sinogram_to_display(s), kw, "image"


def sinogram_of(layer) -> tuple[ScanGeometry, np.ndarray]:
    """The geometry and the (n_views, U, V) sinogram of a sinogram layer; LayerError otherwise."""
    geo = geometry_of(layer)
    if not is_sinogram(layer):
        raise LayerError(f"layer '{layer.name}' is not a sinogram (its ctbench kind is {kind_of(layer)!r})")
    sino = display_to_sinogram(layer.data, info(layer).get("axes")).astype(np.float32, copy=False)
    if tuple(sino.shape) != geo.sinogram_shape:
        raise LayerError(f"layer '{layer.name}' has shape {sino.shape} but its geometry expects "
                         f"{geo.sinogram_shape}; was the data replaced?")
    return geo, sino


# ------------------------------------------------------ trajectory preview
def _zyx(p: np.ndarray, two_d: bool) -> np.ndarray:
    """World (x, y, z) rows -> napari (z, y, x), or (y, x) for 2D scans."""
    return p[:, [1, 0]] if two_d else p[:, [2, 1, 0]]


def _segments(a: np.ndarray, b: np.ndarray, two_d: bool) -> np.ndarray:
    """Vectors-layer data (N, 2, ndim): start points a, displacements b - a."""
    return np.stack([_zyx(a, two_d), _zyx(b - a, two_d)], axis=1)


def frame_views(n_views: int, n_frames: int = 6) -> list[int]:
    """Indices of the few views whose detector frames are drawn (evenly spread, first included)."""
    n = max(1, min(n_frames, n_views))
    return sorted({int(round(i * n_views / n)) % n_views for i in range(n)})


def trajectory_layers(geometry: ScanGeometry, name: str = "trajectory", *, n_frames: int = 6) -> list[LayerData]:
    """Vectors layers previewing a scan: source path (+ central rays), detector frames, volume box."""
    t = geometry.trajectory
    two_d = geometry.is_2d
    # Pixel (i, j) sits at ctr + i du u + j dv v with u, v as stored (normally unit): draw exactly that.
    src, ctr, u, v = (x.detach().cpu().double().numpy() for x in t.tensors())
    ext = geometry.volume_extent()
    half = np.array(ext[::-1] if not two_d else (ext[1], ext[0], 0.0)) / 2  # (x, y, z)
    reach = float(np.linalg.norm(half)) * 1.3
    views = frame_views(t.n_views, n_frames)
    if t.beam == "parallel":
        d = src / np.linalg.norm(src, axis=1, keepdims=True)
        # Rays are lines: draw the sources upstream and the detector downstream of the volume.
        perp = ctr - (ctr * d).sum(1, keepdims=True) * d
        source_pts = perp - reach * d
        ctr = perp + reach * d
    else:
        source_pts = src
    geo = geometry.to_dict()
    # Source path: consecutive positions joined, then the central ray of each framed view.
    path = _segments(source_pts[:-1], source_pts[1:], two_d) if t.n_views > 1 else np.zeros((0, 2, 2 if two_d else 3))
    rays = _segments(source_pts[views], ctr[views], two_d)
    path_colors = ["#ffd23f"] * len(path) + ["#ff7f50"] * len(rays)
    data_path = np.concatenate([path, rays]) if len(path) else rays
    du = geometry.detector_spacing[0]
    hu = geometry.detector_shape[0] * du / 2
    frames = []
    for i in views:
        c, a = ctr[i], u[i] * hu
        if two_d:
            frames.append(_segments((c - a)[None], (c + a)[None], True))
            continue
        b = v[i] * geometry.detector_shape[1] * geometry.detector_spacing[1] / 2
        corners = np.stack([c - a - b, c + a - b, c + a + b, c - a + b])
        frames.append(_segments(corners, np.roll(corners, -1, axis=0), False))
    data_frames = np.concatenate(frames)
    # Volume box: 12 edges (4 in 2D).
    if two_d:
        hx, hy = half[0], half[1]
        sq = np.array([[-hx, -hy, 0], [hx, -hy, 0], [hx, hy, 0], [-hx, hy, 0]])
        box = _segments(sq, np.roll(sq, -1, axis=0), True)
    else:
        corners = np.array([[sx * half[0], sy * half[1], sz * half[2]]
                            for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
        edges = [(a, b) for a in range(8) for b in range(a + 1, 8) if bin(a ^ b).count("1") == 1]
        box = _segments(corners[[a for a, _ in edges]], corners[[b for _, b in edges]], False)
    common = {"vector_style": "line", "length": 1.0, "units": UNITS}
    meta_src = {KEY: {"kind": "trajectory", "geometry": geo, "frame_views": views}}
    meta_part = {KEY: {"kind": "trajectory_part"}}
    width = max(reach / 80, 0.3)
    return [
        (data_path, {"name": name, "metadata": meta_src, "edge_color": path_colors, "edge_width": width,
                     **common}, "vectors"),
        (data_frames, {"name": f"{name}: detector", "metadata": meta_part, "edge_color": "#4fc3f7",
                       "edge_width": width, **common}, "vectors"),
        (box, {"name": f"{name}: volume box", "metadata": meta_part, "edge_color": "#b0ff57",
               "edge_width": width, **common}, "vectors"),
    ]


def completeness_layer(counts, n_views: int, voxel_spacing, name: str = "trajectory: completeness") -> LayerData:
    """An image LayerDataTuple of views-per-voxel counts.

    Colours run from red (no view: nothing reconstructable) through yellow
    to transparent-dark at every view seen; in 3D the minimum-intensity
    rendering shows the least-seen voxel along each line of sight, so
    incomplete and unreached regions stand out at a glance.
    """
    c = _numpy(counts).astype(np.float32)
    meta = {KEY: {"kind": "completeness", "n_views": int(n_views), "voxel_spacing": [float(s) for s in voxel_spacing],
                  "full": float((c >= n_views).mean()), "unreached": float((c == 0).mean())}}
    kw = {"name": name, "metadata": meta, "colormap": COMPLETENESS_COLORMAP, "contrast_limits": (0.0, float(max(n_views, 1))),
          "opacity": 0.6, "rendering": "minip", "blending": "translucent", "units": UNITS,
          **placement(c.shape, voxel_spacing)}
    return c, kw, "image"


COMPLETENESS_COLORMAP = {
    "name": "ctbench completeness",
    "colors": [[0.85, 0.05, 0.05, 1.0], [1.0, 0.85, 0.1, 1.0], [0.1, 0.6, 0.3, 0.25]],
}


def _numpy(x) -> np.ndarray:
    try:
        x = x.detach().cpu().numpy()
    except AttributeError:
        pass
    return np.asarray(x)

