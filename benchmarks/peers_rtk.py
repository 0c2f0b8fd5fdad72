"""RTK (itk-rtk) on ctbench's geometry: the axis map, the geometry check and RTK's Joseph filters.

Used by bench_projector.py (the Joseph pair), bench_recon.py (FDK) and bench_fdk_geometries.py (FDK on
per-view, displaced-detector and cylindrical geometries: ``rtk_geometry_vectors``, ``rtk_fdk``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ctbench import Projector


# ctbench world (x, y, z), rotation about z, maps to RTK's world (X, Y, Z) =
# (x, z, -y), rotation about Y: a rotation of the frame, so every line integral
# is preserved.  Then ctbench's source sid*(-sin t, cos t, 0) (diffct's frame,
# docs/GEOMETRY.md) becomes sid*(sin s, 0, cos s) with s = t + pi, which is RTK's
# source at gantry angle s; the detector u axis (cos t, sin t, 0) becomes
# (-cos s, 0, sin s), minus RTK's detector x axis, so RTK's columns run the other
# way (projections are reversed along u, and the u offset negated); v = +z becomes
# +Y, RTK's detector y axis.  The script checks this numerically.
def _to_rtk_world(p: np.ndarray) -> np.ndarray:
    return np.stack([p[..., 0], p[..., 2], -p[..., 1]], axis=-1)


def rtk_geometry(projector: Projector):
    """RTK circular geometry from the trajectory's generator parameters (angles in degrees)."""
    from itk import RTK as rtk

    meta = projector.trajectory.meta
    if meta.get("kind") != "circular":
        raise ValueError("the RTK comparison needs a circular trajectory")
    g = rtk.ThreeDCircularProjectionGeometry.New()
    off_u, off_v = meta.get("detector_offset", (0.0, 0.0))
    for t in meta["angles"]:
        g.AddProjection(float(meta["sid"]), float(meta["sdd"]), math.degrees(t) + 180.0, -float(off_u), float(off_v))
    return g


def rtk_geometry_deviation(g, projector: Projector) -> float:
    """Largest distance (mm) between RTK's and ctbench's source and corner-pixel positions over all views."""
    import itk

    U, V = projector.detector_shape
    du, dv = projector.detector_spacing
    src, ctr, u, v = (t.detach().to(torch.float64).numpy() for t in projector.trajectory.tensors())
    dev = 0.0
    for k in range(projector.n_views):
        s_rtk = np.asarray(g.GetSourcePosition(k), dtype=np.float64).ravel()[:3]
        dev = max(dev, float(np.abs(s_rtk - _to_rtk_world(src[k])).max()))
        M = np.asarray(itk.array_from_matrix(g.GetProjectionCoordinatesToFixedSystemMatrix(k)), dtype=np.float64)
        for iu, iv in ((0, 0), (U - 1, 0), (0, V - 1), (U - 1, V - 1)):
            a, b = (iu - (U - 1) / 2) * du, (iv - (V - 1) / 2) * dv
            p_rtk = (M @ np.array([a, b, 0.0, 1.0]))[:3]
            p_ct = ctr[k] - a * u[k] + b * v[k]  # RTK's detector x is -u
            dev = max(dev, float(np.abs(p_rtk - _to_rtk_world(p_ct)).max()))
    return dev


def _rtk_volume_image(vol_zyx: np.ndarray, spacing_zyx):
    """ctbench volume [z, y, x] as an ITK image on RTK's axes: array [Z, Y, X] = [-y, z, x]."""
    import itk

    D, H, W = vol_zyx.shape
    dz, dy, dx = spacing_zyx
    arr = np.ascontiguousarray(vol_zyx.transpose(1, 0, 2)[::-1], dtype=np.float32)  # (H, D, W)
    img = itk.image_from_array(arr)
    img.SetSpacing([dx, dz, dy])
    img.SetOrigin([-(W - 1) / 2 * dx, -(D - 1) / 2 * dz, -(H - 1) / 2 * dy])
    return img


def _from_rtk_volume(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr[::-1].transpose(1, 0, 2))


def _rtk_projection_image(sino_kuv: np.ndarray, detector_spacing):
    """ctbench sinogram [view, u, v] as RTK's projection stack: array [view, v, u], origin at the detector centre."""
    import itk

    n, U, V = sino_kuv.shape
    du, dv = detector_spacing
    # RTK's detector x runs along -u (see above): reverse the columns
    img = itk.image_from_array(np.ascontiguousarray(sino_kuv[:, ::-1].transpose(0, 2, 1), dtype=np.float32))
    img.SetSpacing([du, dv, 1.0])
    img.SetOrigin([-(U - 1) / 2 * du, -(V - 1) / 2 * dv, 0.0])
    return img


def rtk_calls(projector: Projector, volume, sino_ct, threads: int, n_calls: int):
    """RTK's Joseph pair on the same geometry: {op: [prebuilt filters]} (inputs built outside the
    timing, one filter per call) and a function turning a filter's output into ctbench's layout.
    Raises ImportError when itk-rtk is missing."""
    import itk
    from itk import RTK as rtk

    itk.MultiThreaderBase.SetGlobalDefaultNumberOfThreads(threads)
    g = rtk_geometry(projector)
    IT = itk.Image[itk.F, 3]
    vol_np = volume.numpy()
    n = projector.n_views
    U, V = projector.detector_shape
    vol_img = _rtk_volume_image(vol_np, projector.grid.spacing)
    sino_in = _rtk_projection_image(sino_ct.numpy(), projector.detector_spacing)

    def forward():
        zeros = _rtk_projection_image(np.zeros((n, U, V), np.float32), projector.detector_spacing)
        f = rtk.JosephForwardProjectionImageFilter[IT, IT].New()
        f.SetInput(0, zeros)
        f.SetInput(1, vol_img)
        f.SetGeometry(g)
        f.SetNumberOfWorkUnits(threads)
        return f

    def back():
        zeros = _rtk_volume_image(np.zeros_like(vol_np), projector.grid.spacing)
        f = rtk.JosephBackProjectionImageFilter[IT, IT].New()
        f.SetInput(0, zeros)
        f.SetInput(1, sino_in)
        f.SetGeometry(g)
        f.SetNumberOfWorkUnits(threads)
        return f

    def output(op, f):
        arr = itk.array_from_image(f.GetOutput())
        return arr.transpose(0, 2, 1)[:, ::-1] if op == "forward" else _from_rtk_volume(arr)

    filters = {"forward": [forward() for _ in range(n_calls)], "back": [back() for _ in range(n_calls)]}
    return g, filters, output


# ------------------------------------------------------------------ per-view geometry and FDK (bench_fdk_geometries)
def rtk_geometry_vectors(trajectory, detector_radius: float = 0.0):
    """RTK geometry view by view from the trajectory's own vectors (a calibrated, displaced or any per-view
    geometry): ``AddProjection(source, detector centre, row, column)`` in RTK's world, with RTK's row = -u
    (projections handed over reversed along u, as above) and column = v.  ``detector_radius`` > 0 asks for
    RTK's cylindrical detector of that radius.  Check the result with ``rtk_geometry_deviation``."""
    import itk
    from itk import RTK as rtk

    src, ctr, u, v = (t.detach().to(torch.float64).cpu().numpy() for t in trajectory.tensors())
    for name, axis in (("u", u), ("v", v)):
        norms = np.linalg.norm(axis, axis=1)
        if np.abs(norms - 1).max() > 1e-9:
            raise ValueError(f"rtk_geometry_vectors: the detector {name} axes must be unit vectors (RTK's pixel "
                             f"pitch is the projection image's spacing); their lengths run "
                             f"{norms.min():.6g} to {norms.max():.6g}")
    g = rtk.ThreeDCircularProjectionGeometry.New()
    if detector_radius:
        g.SetRadiusCylindricalDetector(float(detector_radius))

    def itk_of(kind, x):
        out = kind()
        for i in range(3):
            out[i] = float(x[i])
        return out

    P, Vec = itk.Point[itk.D, 3], itk.Vector[itk.D, 3]
    for k in range(trajectory.n_views):
        ok = g.AddProjection(itk_of(P, _to_rtk_world(src[k])), itk_of(P, _to_rtk_world(ctr[k])),
                             itk_of(Vec, _to_rtk_world(-u[k])), itk_of(Vec, _to_rtk_world(v[k])))
        if not ok:
            raise ValueError(f"rtk_geometry_vectors: RTK refused view {k} (its row and column vectors must be "
                             "orthonormal)")
    return g


def rtk_volume_source(shape_zyx, spacing_zyx):
    """An RTK ConstantImageSource of zeros laid out as ``_rtk_volume_image`` lays out ctbench's grid."""
    import itk
    from itk import RTK as rtk

    D, H, W = shape_zyx
    dz, dy, dx = spacing_zyx
    s = rtk.ConstantImageSource[itk.Image[itk.F, 3]].New()
    s.SetOrigin([-(W - 1) / 2 * dx, -(D - 1) / 2 * dz, -(H - 1) / 2 * dy])
    s.SetSpacing([dx, dz, dy])
    s.SetSize([W, D, H])
    s.SetConstant(0.0)
    s.Update()
    return s


def rtk_projections(sino_kuv, detector_spacing):
    """ctbench sinogram [view, u, v] (a tensor or array) as RTK's projection stack (``_rtk_projection_image``)."""
    arr = sino_kuv.detach().cpu().numpy() if isinstance(sino_kuv, torch.Tensor) else np.asarray(sino_kuv)
    return _rtk_projection_image(arr, detector_spacing)


def rtk_fdk(projections, geometry, volume, displaced: bool = False):
    """RTK's FDK (ramp, no window) of an RTK projection stack into ``volume`` (an ``rtk_volume_source``),
    after ``DisplacedDetectorImageFilter`` (Wang's weights, the truncated side padded) when ``displaced``.
    Returns RTK's output image; ``from_rtk_volume(itk.array_from_image(out))`` is ctbench's layout."""
    import itk
    from itk import RTK as rtk

    IT = itk.Image[itk.F, 3]
    proj = projections
    if displaced:
        ddf = rtk.DisplacedDetectorImageFilter[IT].New()
        ddf.SetInPlace(False)  # in place, it would consume the projections of the next call
        ddf.SetInput(projections)
        ddf.SetGeometry(geometry)
        ddf.Update()
        proj = ddf.GetOutput()
    f = rtk.FDKConeBeamReconstructionFilter[IT].New()
    f.SetInput(0, volume.GetOutput())
    f.SetInput(1, proj)
    f.SetGeometry(geometry)
    f.Update()
    out = f.GetOutput()
    out.DisconnectPipeline()
    return out


def from_rtk_volume(img) -> np.ndarray:
    """RTK volume image -> ctbench's [z, y, x] array."""
    import itk

    return _from_rtk_volume(np.asarray(itk.array_from_image(img)))
