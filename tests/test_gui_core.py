"""The Qt-free logic behind the workbench: scan design, layer conversions, preview problems, workflow."""

import math

import numpy as np
import pytest
import torch

from ctbench import circular_trajectory_3d_parallel, load_trajectory
from ctbench.workbench.design import TRAJECTORY_KINDS, DesignError, ScanGeometry, TrajectoryDesign, design_of
from ctbench.workbench.preview import (PreviewError, bin_sinogram, binned_geometry, binned_problem, choose_mode,
                             separable_rows, slice_problem)
from ctbench.workbench.workflow import ALGORITHMS, ReconRequest, simulate
from ctbench_napari._io import get_reader, read_dataset, read_trajectory, write_dataset
from ctbench_napari._layers import (display_to_sinogram, sinogram_layer, sinogram_to_display, trajectory_layers,
                                    volume_layer)


# ------------------------------------------------------------------ design
@pytest.mark.parametrize("kind", list(TRAJECTORY_KINDS))
def test_every_kind_builds_a_scan_the_projector_accepts(kind):
    g = TrajectoryDesign(kind=kind, n_views=7, detector_u=16, detector_v=8, volume_d=6, volume_h=8,
                         volume_w=8).build()
    assert g.n_views == 7 and g.is_2d == (kind in ("fan", "parallel_2d"))
    sino = g.projector("cpu").project(torch.ones(g.volume_shape))
    assert tuple(sino.shape) == g.sinogram_shape
    assert design_of(g.trajectory).kind == kind


def test_short_scan_spans_half_a_turn_plus_the_fan():
    d = TrajectoryDesign(kind="short_scan", n_views=100, sdd=400.0, detector_u=100, pixel_u=2.0)
    fan = 2 * math.degrees(math.atan(100.0 / 400.0))
    assert d.short_scan_range() == pytest.approx(180 + fan)
    angles = d.build().trajectory.meta["angles"]
    assert math.degrees(angles[-1] - angles[0]) * 100 / 99 == pytest.approx(180 + fan)


@pytest.mark.parametrize("changes, words", [
    ({"sdd": 150.0, "sid": 200.0}, "SDD (150 mm) must be at least SID (200 mm)"),
    ({"n_views": 0}, "Views must be at least 1"),
    ({"sid": 20.0, "sdd": 400.0}, "source would pass through the volume"),
    ({"pixel_u": 0.0}, "Pixel pitch u must be positive"),
    ({"kind": "zigzag"}, "trajectory kind must be one of"),
])
def test_bad_designs_are_explained(changes, words):
    with pytest.raises(DesignError, match=words.replace("(", r"\(").replace(")", r"\)")):
        TrajectoryDesign(**changes).build()


def test_parameters_a_kind_ignores_are_not_checked():
    # A parallel beam has no SID/SDD: nonsense there must not block it.
    g = TrajectoryDesign(kind="parallel", sid=10.0, sdd=1.0).build()
    assert g.beam == "parallel"


def test_saved_trajectory_json_reopens_the_design(tmp_path):
    d = TrajectoryDesign(kind="saddle", n_views=17, amplitude=12.5, detector_u=33)
    d.build().trajectory.save(tmp_path / "t.json")
    t = load_trajectory(tmp_path / "t.json")
    assert design_of(t) == d


# ------------------------------------------------------------ layer helpers
def test_sinogram_display_shows_rows_vertically_with_up_up():
    sino = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)   # (views, U, V)
    disp = sinogram_to_display(sino)
    assert disp.shape == (2, 4, 3)                                    # (views, V, U)
    assert disp[0, 0, 0] == sino[0, 0, 3] and disp[0, -1, 0] == sino[0, 0, 0]  # top row is the highest v
    np.testing.assert_array_equal(display_to_sinogram(disp), sino)
    flat = np.ones((5, 7))
    np.testing.assert_array_equal(display_to_sinogram(sinogram_to_display(flat)), flat)


def test_volume_layers_are_centred_in_world_mm():
    _, kw, _ = volume_layer(np.zeros((4, 5, 6)), (2.0, 1.0, 0.5), "v")
    assert kw["scale"] == [2.0, 1.0, 0.5]
    assert kw["translate"] == [-3.0, -2.0, -1.25]


def test_trajectory_layers_trace_the_sources_and_frames():
    g = TrajectoryDesign(kind="circular", n_views=10, sid=100.0, sdd=150.0, detector_u=20, detector_v=10,
                         pixel_u=1.0, pixel_v=1.0).build()
    (path, pkw, ptype), (frames, _, _), (box, _, _) = trajectory_layers(g, "t", n_frames=4)
    assert ptype == "vectors" and pkw["metadata"]["ctbench"]["kind"] == "trajectory"
    src = g.trajectory.source.double().numpy()[:, ::-1]               # napari order (z, y, x)
    np.testing.assert_allclose(path[:9, 0], src[:9], atol=1e-5)
    np.testing.assert_allclose(path[:9, 0] + path[:9, 1], src[1:], atol=1e-5)
    assert frames.shape == (16, 2, 3)                                  # 4 frames x 4 edges
    edge = np.linalg.norm(frames[:, 1], axis=1)
    assert sorted(set(np.round(edge, 4))) == [10.0, 20.0]               # V*dv and U*du
    assert box.shape == (12, 2, 3)
    np.testing.assert_allclose(np.abs(box[:, 0]).max(axis=0), [32.0, 32.0, 32.0])


# ---------------------------------------------------------- reader/writer
def test_reader_and_writer_round_trip(tmp_path):
    g = TrajectoryDesign(kind="circular", n_views=6, detector_u=8, detector_v=4, volume_d=3, volume_h=4,
                         volume_w=5).build()
    sino = np.random.default_rng(1).random(g.sinogram_shape).astype(np.float32)
    layers = [volume_layer(np.ones((3, 4, 5), np.float32), (0.5, 0.5, 0.5), "vol"),
              sinogram_layer(sino, g, "sino")]
    [path] = write_dataset(str(tmp_path / "out"), layers)
    assert path.endswith(".zarr")
    assert get_reader(path) is read_dataset
    back = read_dataset(path)
    (vdata, vkw, _), (sdata, skw, _) = back
    np.testing.assert_array_equal(vdata, layers[0][0])
    assert vkw["scale"] == [0.5, 0.5, 0.5]
    np.testing.assert_array_equal(sdata, layers[1][0])                 # same display order
    assert skw["metadata"]["ctbench"]["geometry"]["detector_shape"] == [8, 4]
    from ctbench_napari._io import DatasetWriteError
    with pytest.raises(DatasetWriteError, match="at most one sinogram"):      # not a ValueError: napari would hide it
        write_dataset(str(tmp_path / "two.zarr"), [layers[1], layers[1]])


def test_trajectory_json_reader(tmp_path):
    g = TrajectoryDesign(kind="helical", n_views=9).build()
    g.trajectory.save(tmp_path / "h.json")
    circular_trajectory_3d_parallel(5).save(tmp_path / "bare.json")
    (tmp_path / "other.json").write_text('{"format": "geojson"}')
    assert get_reader(str(tmp_path / "h.json")) is read_trajectory
    assert get_reader(str(tmp_path / "other.json")) is None
    assert get_reader(str(tmp_path / "nothing.tif")) is None
    layers = read_trajectory(str(tmp_path / "h.json"))
    assert [kw["name"] for _, kw, _ in layers] == ["h", "h: detector", "h: volume box"]
    geo = ScanGeometry.from_dict(layers[0][1]["metadata"]["ctbench"]["geometry"])
    assert geo.detector_shape == (96, 96)                               # the designer's, not a default
    bare = read_trajectory(str(tmp_path / "bare.json"))
    assert ScanGeometry.from_dict(bare[0][1]["metadata"]["ctbench"]["geometry"]).detector_shape == (64, 64)


# ------------------------------------------------------------------ preview
def _parallel(D=6, V=None, dv=1.0, offset=0.0):
    t = circular_trajectory_3d_parallel(20, detector_offset=(0.0, offset))
    return ScanGeometry(t, (16, V or D), (1.0, dv), (D, 12, 12), (1.0, 1.0, 1.0))


def test_separable_rows_need_rows_at_voxel_plane_heights():
    assert separable_rows(_parallel(6), 3) == (3, 4)
    assert separable_rows(_parallel(7), 3) == (3, 4)
    assert separable_rows(_parallel(6, offset=0.5), 3) is None          # rows between planes
    assert separable_rows(_parallel(6, V=3, dv=2.0), 3) is None
    cone = TrajectoryDesign(n_views=8).build()
    assert separable_rows(cone, 32) is None
    assert choose_mode(cone, "sirt") == "binned" and choose_mode(cone, "fbp") == "slice"
    assert choose_mode(_parallel(), "sirt") == "slice"
    with pytest.raises(PreviewError, match="2x-binned"):
        slice_problem(cone, torch.zeros(cone.sinogram_shape), "sirt")


def test_slice_problem_is_the_slab_of_the_full_operator():
    g = _parallel(6)
    vol = torch.rand(g.volume_shape, dtype=torch.float64)
    sino = g.projector("cpu").project(vol)
    p = slice_problem(g, sino, "sirt")
    assert p.volume_shape == (1, 12, 12) and p.sinogram.shape == (20, 16, 1)
    # Rows kept see only the central plane: its projection alone explains them.
    torch.testing.assert_close(p.projector.project(vol[3:4].contiguous()), p.sinogram)
    assert p.origin[0] == pytest.approx(0.5)                             # plane 3 of 6 at z = +0.5 mm


def test_binned_geometry_puts_pixels_at_the_mean_of_their_centres():
    g = TrajectoryDesign(kind="circular", n_views=10, detector_u=9, detector_v=6, pixel_u=1.0, pixel_v=2.0,
                         volume_d=7, volume_h=8, volume_w=8).build(dtype=torch.float64)
    b = binned_geometry(g, 2, 2)
    assert b.detector_shape == (4, 3) and b.detector_spacing == (2.0, 4.0) and b.n_views == 5
    assert b.volume_shape == (3, 4, 4)
    np.testing.assert_allclose(np.multiply(b.volume_shape, b.voxel_spacing), [7.0, 8.0, 8.0])

    def centres(geo, view):
        t = geo.trajectory
        U, V = geo.detector_shape
        du, dv = geo.detector_spacing
        i = torch.arange(U, dtype=torch.float64) - (U - 1) / 2
        j = torch.arange(V, dtype=torch.float64) - (V - 1) / 2
        return (t.detector_center[view][None, None] + i[:, None, None] * du * t.detector_u[view]
                + j[None, :, None] * dv * t.detector_v[view])

    full = centres(g, 2)[:8]                                             # view 2 is binned view 1
    want = full.reshape(4, 2, 3, 2, 3).mean(dim=(1, 3))
    torch.testing.assert_close(centres(b, 1), want)
    s = torch.arange(10 * 9 * 6, dtype=torch.float64).reshape(10, 9, 6)
    torch.testing.assert_close(bin_sinogram(s)[1, 0, 0], s[2, :2, :2].mean())
    p = binned_problem(g, s)
    assert tuple(p.sinogram.shape) == p.geometry.sinogram_shape


# ---------------------------------------------------------------- workflow
def test_requests_validate_and_name_parameters():
    r = ReconRequest("sirt", {"n_iter": 20}).validated()
    assert r.params == {"n_iter": 20, "nonneg": True}
    assert r.title() == "SIRT n_iter=20 nonneg"
    assert ReconRequest("tv", {"lam": 0.5}, "slice").validated().title() == "TV n_iter=100 lam=0.5 nonneg [preview slice]"
    assert ReconRequest.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError, match=r"Iterations \(n_iter\) must be at least 1"):
        ReconRequest("sirt", {"n_iter": 0}).validated()
    with pytest.raises(ValueError, match="must be a whole number"):
        ReconRequest("cgls", {"n_iter": 2.5}).validated()
    with pytest.raises(ValueError, match="has no parameters"):
        ReconRequest("cgls", {"lam": 1.0}).validated()
    with pytest.raises(ValueError, match="algorithm must be one of"):
        ReconRequest("art").validated()
    with pytest.raises(ValueError, match="Filter"):
        ReconRequest("fbp", {"filter": "box"}).validated()
    assert set(ALGORITHMS) == {"fbp", "sirt", "cgls", "tv", "os_sirt", "os_tv", "fista_tv", "lsqr", "lsmr", "sart",
                               "mlem", "osem", "pwls", "tgv"}


def test_simulate_matches_the_projector_and_its_noise_has_poisson_statistics():
    g = TrajectoryDesign(kind="parallel", n_views=30, detector_u=24, detector_v=4, volume_d=4, volume_h=16,
                         volume_w=16).build()
    vol = torch.full(g.volume_shape, 0.02)
    clean = simulate(g, vol, backend="cpu")
    torch.testing.assert_close(clean, g.projector("cpu").project(vol))
    i0 = 1e4
    a = simulate(g, vol, i0=i0, seed=5, backend="cpu")
    b = simulate(g, vol, i0=i0, seed=5, backend="cpu")
    assert torch.equal(a, b)
    counts = i0 * torch.exp(-a.double())
    expected = i0 * torch.exp(-clean.double())
    z = (counts - expected) / expected.sqrt()
    assert abs(float(z.mean())) < 0.05 and float(z.std()) == pytest.approx(1.0, abs=0.05)
    with pytest.raises(ValueError, match="i0"):
        simulate(g, vol, i0=0)
    with pytest.raises(ValueError, match="grid is"):
        simulate(g, torch.zeros(3, 3, 3))


# ------------------------------------------------- previews against full runs
def _phantomish(g):
    """Two nested off-centre boxes filling the middle of any grid."""
    vol = torch.zeros(g.volume_shape)
    D, H, W = (1, *g.volume_shape) if g.is_2d else g.volume_shape
    v = vol.reshape(D, H, W)
    v[D // 4: D - D // 4, H // 4: H - H // 5, W // 5: W - W // 4] = 0.02
    v[D // 3: D - D // 3, H // 3: H - H // 3, W // 3: W - W // 4] = 0.03
    assert vol.sum() > 0
    return vol


@pytest.mark.parametrize("index", [0, 5, 8, 15])
def test_fdk_slice_preview_is_exactly_that_plane_of_the_full_fdk(index):
    from ctbench.workbench.workflow import _direct, run

    g = TrajectoryDesign(kind="circular", n_views=24, sid=120.0, sdd=240.0, detector_u=40, detector_v=40,
                         pixel_u=1.5, pixel_v=1.5, volume_d=16, volume_h=24, volume_w=24).build()
    sino = simulate(g, _phantomish(g), backend="cpu")
    full = run(g, sino, ReconRequest("fbp", {"filter": "hann"})).volume
    p = slice_problem(g, sino, "fbp", index=index)
    assert p.sinogram.shape[2] < 40                              # only the rows the plane projects onto
    plane = _direct(p, {"filter": "hann"})
    torch.testing.assert_close(plane[0], full[index], rtol=0, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["sirt", "fbp"])
def test_slice_preview_equals_the_full_central_slice_on_a_parallel_beam(algorithm):
    from ctbench.workbench.workflow import run

    g = _parallel(8)
    sino = simulate(g, _phantomish(g), backend="cpu")
    params = {"n_iter": 12} if algorithm == "sirt" else {}
    full = run(g, sino, ReconRequest(algorithm, params)).volume
    prev = run(g, sino, ReconRequest(algorithm, params, "auto"))
    assert prev.request.mode == "auto" and prev.volume.shape == (1, 12, 12)
    torch.testing.assert_close(prev.volume[0], full[4], rtol=1e-4, atol=1e-7)


def test_reconstruct_events_previews_and_cancel():
    import threading

    from ctbench.workbench.workflow import Finished, Progress, Started, reconstruct

    g = _parallel(4)
    sino = simulate(g, _phantomish(g), backend="cpu")
    events = list(reconstruct(g, sino, ReconRequest("cgls", {"n_iter": 7}), preview_every=3))
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    progress = [e for e in events if isinstance(e, Progress)]
    assert [e.iteration for e in progress] == list(range(1, 8))
    assert [e.iteration for e in progress if e.preview is not None] == [3, 6, 7]
    assert events[-1].stopped == "completed" and len(events[-1].residuals) == 7
    cancel = threading.Event()
    seen = []
    for e in reconstruct(g, sino, ReconRequest("sirt", {"n_iter": 50}), cancel=cancel):
        seen.append(e)
        if isinstance(e, Progress) and e.iteration == 3:
            cancel.set()
    assert seen[-1].stopped == "cancelled" and seen[-1].n_iter == 3
    with pytest.raises(ValueError, match="sinogram has shape"):
        next(reconstruct(g, sino[:3], ReconRequest("sirt")))
    saddle = TrajectoryDesign(kind="saddle", n_views=8, detector_u=16, detector_v=8, volume_d=4, volume_h=8,
                              volume_w=8).build()
    with pytest.raises(ValueError, match="circular orbit"):
        list(reconstruct(saddle, torch.zeros(saddle.sinogram_shape), ReconRequest("fbp")))


def test_large_2d_scans_preview_iterative_methods_binned():
    big = TrajectoryDesign(kind="fan", n_views=721, detector_u=560, pixel_u=0.2, sid=410.0, sdd=550.0,
                           volume_h=512, volume_w=512, voxel_size=0.15).build()
    small = big.with_volume((64, 64), (1.0, 1.0))
    assert choose_mode(big, "sirt") == "binned" and choose_mode(big, "fbp") == "slice"
    assert choose_mode(small, "sirt") == "slice"


@pytest.mark.slow
def test_the_manifest_validates_with_npe2_and_imports():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "npe2", "validate", "ctbench", "--imports"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid" in proc.stdout
