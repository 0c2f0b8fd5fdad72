"""The display model of the workbench (see docs/GUI.md, "What the canvas shows").

Two coordinate frames never share the canvas:

- the **volume frame**, world millimetres ``(z, y, x)``: phantoms,
  reconstructions, the trajectory preview and the completeness map;
- the **sinogram frame**, ``(view, v, u)`` in detector pixels (v scaled by
  the pixel aspect dv/du, so the image has the detector's true shape); raw
  projection stacks and line integrals of the Scan import share it.

Showing a layer of one frame hides the layers of the other, labels the axes
of that frame, switches to a 2D slice view where the frame is an image
(sinograms, new results), fits the camera to what is shown and sets a
contrast window from the data (0.5/99.5 percentiles, or a reference's
window when comparing).  The trajectory designer shows its 3D preview with
an oblique camera, so helices and saddles read at a glance.
"""

from __future__ import annotations

import weakref

import numpy as np

from ctbench.workbench.metrics import percentile_window

from .._layers import kind_of
from .per_viewer import viewer_state

# Named by what they are; a slider's position in mm is written beside it (units.py): napari's slider counts slices.
VOLUME_AXES = ("z", "y", "x")
SINOGRAM_AXES = ("view", "v (px)", "u (px)")
SINOGRAM_AXES_2D = ("view", "u (px)")
# The designer's 3D line of sight in (z, y, x): 65 degrees from the rotation axis, from above and aside.
OBLIQUE_VIEW = (-0.42, 0.64, 0.64)
SINOGRAM_FRAME = "sinogram"
VOLUME_FRAME = "volume"


# Layers in detector pixels: sinograms, raw projection stacks and their line integrals (scan import).
PIXEL_KINDS = ("sinogram", "projections", "line_integrals")


def frame_of(layer) -> str:
    """``"sinogram"`` (the pixel frame) for sinograms and projection stacks, ``"volume"`` for everything in mm."""
    return SINOGRAM_FRAME if kind_of(layer) in PIXEL_KINDS else VOLUME_FRAME


def set_visible(layer, visible: bool) -> bool:
    """Show or hide ``layer`` only when that changes anything; True when it changed.

    napari's ``visible`` setter does not compare: every assignment, even of the value the layer already
    has, makes its canvas rebuild the whole scene graph (every layer's node and overlays, then a draw),
    so hiding the ten layers of another frame cost ten rebuilds where the hidden ones needed none.
    """
    visible = bool(visible)
    if layer.visible == visible:
        return False
    layer.visible = visible
    return True


def label_axes(viewer, labels) -> None:
    """Name the frame's axes (the last ones); axes the frame does not use (a 2D image in a 3D viewer) get
    plain numbers, never another frame's name (("view", "view", "u (px)") was the HTC2022 scan's)."""
    n = viewer.dims.ndim
    labels = list(labels)[-n:]
    current = [str(i) for i in range(n - len(labels))] + labels
    if tuple(current) != tuple(viewer.dims.axis_labels):
        viewer.dims.axis_labels = tuple(current)


def show_frame(viewer, layers, *, ndisplay: int = 2) -> None:
    """Show only ``layers`` (all of one frame), with that frame's axis labels, a slice through their centre,
    and the camera fitted to them."""
    for step in show_frame_steps(viewer, layers, ndisplay=ndisplay):
        step()


def show_frame_steps(viewer, layers, *, ndisplay: int = 2, before=()) -> list:
    """``show_frame`` as three steps, for ``common.Steps`` to run one per event-loop turn: the visibility of
    the layers (after the callables ``before``, e.g. a contrast), then the 2D/3D switch and the frame's axis
    labels, then the sliders' range, the central slice, the camera and the scale bar.

    Each step is one napari update with a draw of its own: switching 3D -> 2D shows the slider, resizes the
    canvas and paints it inside the assignment; together with the visibility changes and the camera fit
    that was one turn of 0.15-0.3 s under software OpenGL (the quick preview's result)."""
    layers = list(layers)
    if not layers:
        return []
    frame = frame_of(layers[0])

    def visibility():
        for f in before:
            f()
        for layer in viewer.layers:
            if frame_of(layer) != frame:
                set_visible(layer, False)
        for layer in layers:
            set_visible(layer, True)

    def dimensions():
        viewer.dims.ndisplay = ndisplay
        if frame == SINOGRAM_FRAME:
            label_axes(viewer, SINOGRAM_AXES_2D if layers[0].ndim == 2 else SINOGRAM_AXES)
        else:
            label_axes(viewer, VOLUME_AXES[-max(x.ndim for x in layers):])

    def placement():
        _keep_frame_ranges(viewer)
        apply_frame_range(viewer)
        n = viewer.dims.ndim
        viewer.dims.order = tuple(range(n))      # projection view (a sinogram view transposes; undone here)
        centre_slice(viewer, layers)
        fit_camera(viewer, layers)
        _scale_bar(viewer, frame, layers)

    return [visibility, dimensions, placement]


# Viewers whose scale bar already follows 2D/3D switches.  Module state, not an attribute on the viewer:
# plugin widgets see napari's public-only proxy, which warns (FutureWarning) on private attributes; a
# weak set lets a closed viewer go.
_BAR_FOLLOWS: weakref.WeakSet = weakref.WeakSet()


def _scale_bar(viewer, frame: str, layers) -> None:
    """napari's scale bar on 2D slices of volumes (world unit: the millimetre); none on pixel frames or in 3D.

    In 3D a length on screen depends on the direction (the designer's oblique camera foreshortens), and
    under software OpenGL the bar's text and box made every 3D frame of the designer's preview about
    twice as slow, so the bar is shown on 2D slices only and follows 2D/3D switches.
    """
    bar = scale_bar(viewer)
    if bar is None:
        return
    # Not layer.units = "mm": napari then warns (a toast) about the unit-less layers of the other frame;
    # the bar's length is in world units, which are mm for volumes.
    real = getattr(viewer, "__wrapped__", viewer)
    if real not in _BAR_FOLLOWS:     # connected once per viewer
        ref = weakref.ref(real)      # the callback lives on the viewer's dims: it must not hold the viewer
        real.dims.events.ndisplay.connect(lambda e: _follow_ndisplay(ref()) if ref() is not None else None)
        _BAR_FOLLOWS.add(real)
    bar.visible = frame == VOLUME_FRAME and viewer.dims.ndisplay == 2


def show_scale_bar(viewer) -> None:
    """The scale bar as the frame rule has it (volume slices in 2D only), for layers that arrive by themselves."""
    shown = [x for x in viewer.layers if x.visible]
    if shown:
        _scale_bar(viewer, frame_of(shown[-1]), shown)


def _follow_ndisplay(viewer) -> None:
    """2D/3D switch (the designer, napari's 2D/3D button): the bar on 2D slices of volumes only."""
    bar = scale_bar(viewer)
    if bar is None:
        return
    shown = [x for x in viewer.layers if x.visible]
    bar.visible = viewer.dims.ndisplay == 2 and bool(shown) and all(frame_of(x) == VOLUME_FRAME for x in shown)


def scale_bar(viewer):
    """napari's scale-bar overlay (``viewer.canvas.overlays`` since 0.9, ``viewer.scale_bar`` before)."""
    canvas = getattr(viewer, "canvas", None)
    overlays = getattr(canvas, "overlays", None)
    if overlays is not None and "scale_bar" in overlays:
        return overlays["scale_bar"]
    return getattr(viewer, "scale_bar", None)


def sinogram_view(viewer, layer, row: int | None = None) -> None:
    """The sinogram proper: one detector row (the slider, default the middle row) against the view angle.

    The layer is the same ``(view, v, u)`` stack; only the viewer's axis order changes, so the image
    shows ``view`` down and ``u`` across and the slider moves through the detector rows.
    """
    if layer.ndim != 3:
        show_sinogram(viewer, layer)     # a 2D sinogram already is one row against the angle
        return
    show_sinogram(viewer, layer)
    n = viewer.dims.ndim
    order = list(range(n))
    order[n - 3], order[n - 2] = n - 2, n - 3          # slider: v (rows); shown: view x u
    viewer.dims.order = tuple(order)
    v_axis = n - 2
    rows = layer.data.shape[1]
    k = rows // 2 if row is None else int(min(max(row, 0), rows - 1))
    lo = float(np.asarray(layer.extent.world)[0, 1])
    viewer.dims.set_point(v_axis, lo + k * float(layer.scale[1]))
    fit_camera(viewer, [layer])

# napari gives the sliders the range of *all* layers, hidden ones included, so a view index and z in mm
# would share one slider. The sliders are set to the extent of the visible frame instead, and set again
# whenever napari recomputes them (a layer added, its data replaced).
_KEEPERS: dict = {}


def frame_range(viewer, extra=()):
    """Slider ranges for the visible layers (and ``extra`` ones, not yet added) when they all belong to one
    frame (None otherwise)."""
    visible = [x for x in viewer.layers if x.visible] + [x for x in extra if x.ndim <= viewer.dims.ndim]
    if not visible or len({frame_of(x) for x in visible}) != 1:
        return None
    ext = _extent(viewer, visible)
    if ext is None:
        return None
    lo, hi = ext
    n = viewer.dims.ndim
    ranges = list(viewer.dims.range)
    for axis in range(n):
        if not np.isfinite(lo[axis]):
            # No visible layer spans this axis (a 2D result or scan with 3D layers hidden): one step, so napari
            # hides its slider instead of offering the hidden layers' slices.
            ranges[axis] = (0.0, 0.0, 1.0)
            continue
        steps = [float(x.scale[axis - (n - x.ndim)]) for x in visible if axis - (n - x.ndim) >= 0]
        step = min(steps) if steps else ranges[axis][2]
        ranges[axis] = (float(lo[axis]), float(hi[axis]), float(step))
    return tuple(ranges)


def apply_frame_range(viewer, extra=()) -> None:
    ranges = frame_range(viewer, extra)
    state, _ = viewer_state(_KEEPERS, viewer, create=False)
    if ranges is None or tuple(viewer.dims.range) == ranges:
        return
    if state is not None:
        state["busy"] = True
    try:
        viewer.dims.range = ranges
    finally:
        if state is not None:
            state["busy"] = False


def prepare_sliders_for(viewer, layer) -> None:
    """Give the sliders now the range they will have once ``layer`` (made, not yet added) joins the visible
    layers.  A slider that appears (a volume after a single-slice preview) shrinks the canvas, which napari
    then paints inside the ``add_layer``: here that resize has a turn of its own, before the layer comes,
    and the add changes no geometry.  The visible layers stay as they are."""
    _keep_frame_ranges(viewer)
    apply_frame_range(viewer, extra=[layer])


def _keep_frame_ranges(viewer) -> None:
    state, new = viewer_state(_KEEPERS, viewer)
    if not new:
        return
    state["busy"] = False

    def reapply(_event=None):
        v = state["viewer"]()
        if v is not None and not state["busy"]:
            apply_frame_range(v)

    viewer.dims.events.range.connect(reapply)
    for e in ("inserted", "removed"):
        getattr(viewer.layers.events, e).connect(reapply)


def centre_slice(viewer, layers) -> None:
    """Move the sliders to the middle of the layers' extent (the central slice, the middle view)."""
    ext = _extent(viewer, layers)
    if ext is None:
        return
    lo, hi = ext
    point = list(viewer.dims.point)
    for axis in range(viewer.dims.ndim):
        if axis not in viewer.dims.displayed and np.isfinite(lo[axis]):
            point[axis] = float((lo[axis] + hi[axis]) / 2)
    viewer.dims.point = tuple(point)


def _extent(viewer, layers):
    n = viewer.dims.ndim
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    for layer in layers:
        # napari's world extent of an image spans its pixel edges; the data range is what we centre on.
        ext = np.asarray(layer.extent.world)
        k = n - ext.shape[1]
        lo[k:] = np.minimum(lo[k:], ext[0])
        hi[k:] = np.maximum(hi[k:], ext[1])
    return (lo, hi) if np.isfinite(lo).any() else None


def fit_camera(viewer, layers, margin: float = 0.05) -> None:
    """Centre the camera on ``layers`` and zoom so that they fill the canvas (hidden layers do not count).

    (napari's ``fit_to_view(layers=...)`` fails for layers with fewer dimensions than the viewer, e.g. a 2D
    sinogram next to 3D volumes, so the 2D fit is done here from the layers' world extents.)
    """
    layers = list(layers)
    _fit_now(viewer, layers, margin)
    _keep_fitted(viewer, layers, margin)


def _fit_now(viewer, layers, margin) -> None:
    if viewer.dims.ndisplay == 3:
        full = all(x.ndim == viewer.dims.ndim for x in layers)
        viewer.fit_to_view(layers=layers if full else None, margin=margin)
        return
    ext = _extent(viewer, layers)
    if ext is None:
        return
    lo, hi = ext
    shown = list(viewer.dims.displayed)
    size = np.array([hi[a] - lo[a] for a in shown], dtype=float)
    size[~(size > 0)] = 1.0
    box = np.asarray(viewer.canvas.viewbox_size(viewer.layers), dtype=float)   # one grid cell in grid mode
    cam = viewer.scene.camera
    centre = list(cam.center)
    centre[-2:] = [float((lo[a] + hi[a]) / 2) for a in shown]
    cam.center = tuple(centre)
    cam.zoom = float((1 - margin) * np.min(box / size))


# A fit can come before the window has laid out a new dock or a changed panel: the canvas then resizes a
# moment later and the image no longer fills it.  Until the user moves the camera, a resize refits.
_FITTED: dict = {}


def _camera_state(viewer) -> tuple:
    cam = viewer.scene.camera
    return (viewer.dims.ndisplay, float(cam.zoom), tuple(float(c) for c in cam.center))


def _keep_fitted(viewer, layers, margin) -> None:
    state, new = viewer_state(_FITTED, viewer)
    if new:
        def refit(_event=None):
            v = state["viewer"]()
            fitted = [x() for x in state.get("layers", ())]
            if v is None or not fitted or any(x is None or x not in v.layers for x in fitted):
                return
            if _camera_state(v) != state["camera"]:      # the user has zoomed or panned since: leave it
                return
            _fit_now(v, fitted, state["margin"])
            state["camera"] = _camera_state(v)

        viewer.canvas.events.size.connect(refit)
    state.update(layers=[weakref.ref(x) for x in layers], margin=margin, camera=_camera_state(viewer))


def filled_fraction(viewer, layer) -> float:
    """How much of the canvas the layer spans along its most filling displayed axis (1 = edge to edge)."""
    ext = np.asarray(layer.extent.world)
    k = viewer.dims.ndim - ext.shape[1]
    shown = [a - k for a in viewer.dims.displayed[-2:]]
    size = ext[1, shown] - ext[0, shown]
    canvas = np.asarray(viewer.canvas.size, dtype=float)        # (height, width) in screen pixels
    return float(np.max(viewer.scene.camera.zoom * size / canvas))


def set_contrast(layer, limits=None) -> tuple[float, float]:
    """Contrast limits from ``limits`` or from the layer's data percentiles; returns what was set."""
    lo, hi = limits if limits is not None else percentile_window(np.asarray(layer.data))
    rng = layer.contrast_limits_range
    layer.contrast_limits_range = (min(float(rng[0]), lo), max(float(rng[1]), hi))
    layer.contrast_limits = (float(lo), float(hi))
    return float(lo), float(hi)


def show_sinogram(viewer, layer) -> None:
    """A sinogram in its own frame, alone (sinograms of other scans do not line up): 2D, middle view, fitted,
    percentile contrast."""
    set_contrast(layer)
    for other in viewer.layers:
        if other != layer and frame_of(other) == SINOGRAM_FRAME:
            set_visible(other, False)
    show_frame(viewer, [layer], ndisplay=2)


def show_result(viewer, layer, *, keep=(), limits=None) -> None:
    """A new reconstruction: 2D central slice, fitted, percentile contrast (``limits`` when computed already,
    e.g. in a worker thread); ``keep`` stays visible with it."""
    for step in show_result_steps(viewer, layer, keep=keep, limits=limits):
        step()


def show_result_steps(viewer, layer, *, keep=(), limits=None) -> list:
    """``show_result`` as the steps of ``show_frame_steps`` (one per event-loop turn): its contrast and the
    other volumes hidden go with the visibility step, before the sliders' range is taken from what is shown."""
    keep = list(keep)

    def contrast_and_others():
        set_contrast(layer, limits)
        for other in viewer.layers:
            if other != layer and other not in keep and frame_of(other) == VOLUME_FRAME:
                set_visible(other, False)

    return show_frame_steps(viewer, [layer, *keep], ndisplay=2, before=[contrast_and_others])


def oblique_3d(viewer, layers=()) -> None:
    """The designer's 3D view: oblique camera, fitted to the preview."""
    viewer.dims.ndisplay = 3
    label_axes(viewer, VOLUME_AXES)
    # Looking down on the orbit from 25 degrees above its plane, z (the rotation axis) up on the screen.
    viewer.scene.camera.set_view_direction(OBLIQUE_VIEW, up_direction=(1.0, 0.0, 0.0))
    if layers:
        fit_camera(viewer, layers, margin=0.1)


def view_direction_angle_to_z(viewer) -> float:
    """Angle (degrees) between the 3D camera's line of sight and the rotation (z) axis."""
    d = np.asarray(viewer.scene.camera.view_direction, dtype=float)
    d = d / np.linalg.norm(d)
    return float(np.degrees(np.arccos(min(1.0, abs(d[0])))))
