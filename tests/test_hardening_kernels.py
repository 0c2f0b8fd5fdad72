"""Kernel and geometry hardening (issue 10, findings 2, 11, 12, 13).

- Non-finite geometry: the Python side raises at call time naming the tensor
  and the views; the kernels themselves (called directly, bypassing every
  Python check, in a subprocess) never index memory from a non-finite ray or
  view: such a ray/view contributes exactly nothing.
- float32 with far sources stays within 1e-5 of float64 on the same geometry.
- Degenerate geometry and silently wrong sizes are refused up front.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d, circular_trajectory_3d_parallel
from ctbench.solvers import fdk

REPO = Path(__file__).resolve().parents[1]


def _projector(dtype=torch.float64, **kw):
    traj = circular_trajectory_3d(8, 60.0, 120.0, dtype=dtype)
    return Projector(traj, (6, 7, 8), (9, 10), voxel_spacing=1.5, detector_spacing=2.5, backend="cpu", **kw)


# ------------------------------------------------ non-finite geometry: Python
@pytest.mark.parametrize("field", ["source", "detector_center", "detector_u", "detector_v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_geometry_edited_after_construction_is_refused_at_call_time(field, bad):
    P = _projector()
    vol = torch.rand(P.volume_shape, dtype=torch.float64)
    sino = P.project(vol)
    getattr(P.trajectory, field)[3, 1] = bad  # tensors are held by reference
    msg = rf"trajectory\.{field} has non-finite values at views \[3\]"
    with pytest.raises(ValueError, match=msg):
        P.project(vol)
    with pytest.raises(ValueError, match=msg):
        P.backproject(sino)
    with pytest.raises(ValueError, match=msg):
        fdk(P, sino)


def test_learnable_geometry_gone_nan_is_refused_before_any_kernel_runs():
    P = _projector()
    P.trajectory.source.requires_grad_(True)
    vol = torch.rand(P.volume_shape, dtype=torch.float64)
    P.project(vol).sum().backward()
    with torch.no_grad():
        P.trajectory.source[5] -= float("nan") * P.trajectory.source.grad[5]
    with pytest.raises(ValueError, match=r"trajectory\.source has non-finite values at views \[5\]"):
        P.project(vol)


def test_non_finite_override_is_refused():
    P = _projector()
    tr = P.trajectory.detach()
    bad = tr.replace(detector_center=tr.detector_center.clone())
    bad.detector_center[[1, 6], 0] = float("-inf")
    with pytest.raises(ValueError, match=r"trajectory\.detector_center has non-finite values at views \[1, 6\]"):
        P.project(torch.rand(P.volume_shape, dtype=torch.float64), trajectory=bad)


# ------------------------------------- non-finite geometry: the kernels directly
_KERNEL_SCRIPT = r"""
import sys, torch
sys.path.insert(0, REPO)
from ctbench import Projector, circular_trajectory_3d, circular_trajectory_3d_parallel
from ctbench.engine.base import Rays, Tile
from ctbench.engine.cpu import CpuBackend
from ctbench.engine.fdk_kernels import weighted_backproject

torch.manual_seed(0)
dev = torch.device(DEVICE)
if DEVICE == "cuda":
    from ctbench.engine.cuda import CudaBackend
    be = CudaBackend()
else:
    be = CpuBackend()
bad_views = [2, 5]
for beam in ("cone", "parallel"):
    for dtype in (torch.float32, torch.float64):
        if beam == "cone":
            tr = circular_trajectory_3d(8, 40.0, 80.0, dtype=dtype)
        else:
            tr = circular_trajectory_3d_parallel(8, dtype=dtype)
        P = Projector(tr, (9, 10, 11), (12, 13), voxel_spacing=1.3, detector_spacing=1.9, backend=DEVICE)
        good = P._rays(None, dtype, dev)
        tile = Tile.full(good.detector_shape)
        vol = torch.rand((1, 9, 10, 11), dtype=dtype, device=dev)
        sino = torch.rand((1, 8, 12, 13), dtype=dtype, device=dev)
        ones = lambda n: torch.ones(n, dtype=dtype, device=dev)
        keep = [k for k in range(8) if k not in bad_views]
        kept = Rays(*(t[keep] for t in good.tensors()), good.cone, good.detector_shape)
        ref_fwd = be.project(vol, P.grid, 0, kept, tile)
        ref_back = be.backproject(sino[:, keep], P.grid, 0, 9, kept, tile)
        ref_vjp = be.geometry_vjp(vol, P.grid, 0, sino[:, keep], kept, tile)
        ref_fdk = weighted_backproject(sino[0, keep], kept, P.grid, ones(len(keep)), backend=DEVICE)
        for field in range(4):
            for value in (float("nan"), float("inf"), -float("inf")):
                ts = [t.clone() for t in good.tensors()]
                ts[field][bad_views[0], 0] = value
                ts[field][bad_views[1]] = value
                rays = Rays(*ts, good.cone, good.detector_shape)
                fwd = be.project(vol, P.grid, 0, rays, tile)
                assert torch.all(fwd[:, bad_views] == 0), (beam, field, value)
                assert torch.allclose(fwd[:, keep], ref_fwd, rtol=1e-6, atol=0), (beam, field, value)
                back = be.backproject(sino, P.grid, 0, 9, rays, tile)
                assert torch.allclose(back, ref_back, rtol=1e-5, atol=1e-5), (beam, field, value)
                vjp = be.geometry_vjp(vol, P.grid, 0, sino, rays, tile)
                for g, r in zip(vjp, ref_vjp):
                    assert torch.all(g[bad_views] == 0), (beam, field, value)
                    assert torch.allclose(g[keep], r, rtol=1e-5, atol=1e-5), (beam, field, value)
                out = weighted_backproject(sino[0], rays, P.grid, ones(8), backend=DEVICE)
                assert torch.allclose(out, ref_fdk, rtol=1e-5, atol=1e-5), (beam, field, value)
        # a non-finite view weight in FDK contributes nothing either
        w = ones(8)
        w[bad_views] = float("nan")
        out = weighted_backproject(sino[0], good, P.grid, w, backend=DEVICE)
        assert torch.allclose(out, ref_fdk, rtol=1e-5, atol=1e-5)
if DEVICE == "cuda":
    torch.cuda.synchronize()
print("KERNELS OK")
"""


def _has_cuda() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _has_cuda(), reason="needs a CUDA device and CuPy (the CUDA sources are compile-checked in "
                            "test_cuda_compile.py)"))])
@pytest.mark.slow
def test_kernels_called_directly_skip_non_finite_rays_and_views(device):
    """The defence in depth: no Python check in the way, every family, both dtypes, cone and parallel.

    Before the fix the first NaN source made joseph_forward read wild memory (SIGSEGV, rc -11)."""
    code = f"REPO = {str(REPO)!r}\nDEVICE = {device!r}\n" + _KERNEL_SCRIPT
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert "KERNELS OK" in proc.stdout


# ---------------------------------------------------------- far sources, float32
@pytest.mark.parametrize("sid", [1e5, 1e7])
def test_float32_far_source_matches_float64(sid):
    """Source at 1e5 / 1e7 mm, 0.1 mm voxels: float32 within 1e-5 relative of float64 (was 2.4% / 59%)."""
    torch.manual_seed(1)
    n = 24
    traj = circular_trajectory_3d(10, sid, sid + 8.0, dtype=torch.float64)
    # the same geometry for both precisions: the float32 values, widened exactly
    traj = traj.to(dtype=torch.float32).to(dtype=torch.float64)
    P = Projector(traj, (n, n, n), (30, 30), voxel_spacing=0.1, detector_spacing=0.1, backend="cpu")
    vol = torch.rand(n, n, n, dtype=torch.float64)
    p64 = P.project(vol)
    p32 = P.project(vol.float()).double()
    assert p64.abs().max() > 0
    assert (p32 - p64).abs().max() / p64.abs().max() < 1e-5
    b64 = P.backproject(p64)
    b32 = P.backproject(p64.float()).double()
    assert (b32 - b64).abs().max() / b64.abs().max() < 1e-5


def test_far_source_float64_kernels_agree_with_the_reference_backend():
    """The float64 baseline above is itself right: the independent torch oracle agrees."""
    torch.manual_seed(2)
    traj = circular_trajectory_3d(4, 1e5, 1e5 + 8.0, dtype=torch.float64)
    kw = dict(voxel_spacing=0.1, detector_spacing=0.1)
    vol = torch.rand(10, 10, 10, dtype=torch.float64)
    p = Projector(traj, (10, 10, 10), (14, 14), backend="cpu", **kw).project(vol)
    r = Projector(traj, (10, 10, 10), (14, 14), backend="reference", **kw).project(vol)
    assert torch.allclose(p, r, rtol=1e-9, atol=1e-9 * float(r.abs().max()))


# -------------------------------------------------------- degenerate geometry
def _cone(**changes):
    tr = circular_trajectory_3d(4, 100.0, 200.0, dtype=torch.float64)
    return tr.replace(**{k: v(tr) for k, v in changes.items()})


_VOL, _DET = (8, 8, 8), (10, 10)
DEGENERATE = [
    ("u parallel to v", dict(detector_v=lambda t: t.detector_u.clone()), r"detector_u is parallel to .*detector_v"),
    ("source on the detector", dict(source=lambda t: t.detector_center.clone()), r"source lies on the detector"),
    ("detector behind the source", dict(detector_center=lambda t: t.source * 1.5), r"detector is behind the source"),
    ("detector through the volume", dict(detector_center=lambda t: t.detector_center * 0.0),
     r"detector plane cuts through"),
    ("detector between source and volume", dict(detector_center=lambda t: t.source * 0.5),
     r"detector plane cuts through"),
]


@pytest.mark.parametrize("name,change,msg", DEGENERATE, ids=[d[0] for d in DEGENERATE])
def test_degenerate_geometry_is_refused_at_construction_and_on_override(name, change, msg):
    bad = _cone(**change)
    with pytest.raises(ValueError, match=msg):
        Projector(bad, _VOL, _DET)
    P = Projector(_cone(), _VOL, _DET, backend="cpu")
    vol = torch.rand(_VOL, dtype=torch.float64)
    with pytest.raises(ValueError, match=msg):
        P.project(vol, trajectory=bad)
    with pytest.raises(ValueError, match=msg):
        P.backproject(P.project(vol), trajectory=bad)


def test_parallel_rays_along_the_detector_plane_are_refused():
    tr = circular_trajectory_3d_parallel(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="lie in the detector plane in views"):
        Projector(tr.replace(source=tr.detector_u.clone()), _VOL, _DET)
    # a parallel detector through the volume is fine: the model integrates whole lines
    Projector(tr.replace(detector_center=tr.detector_center * 0), _VOL, _DET)


def test_geometry_too_far_for_the_voxel_size_is_refused():
    tr = circular_trajectory_3d(4, 1e9, 1e9 + 10.0, dtype=torch.float64)
    with pytest.raises(ValueError, match="voxels of 0.0001 mm"):
        Projector(tr, _VOL, _DET, voxel_spacing=1e-4)


# ------------------------------------------------------------ wrong sizes
def test_sizes_of_2_31_and_more_are_refused():
    tr = circular_trajectory_3d(4, 1e10, 2e10, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"volume_shape entries must be below 2\*\*31"):
        Projector(tr, (1, 1, 2**31), _DET)
    with pytest.raises(ValueError, match=r"detector_shape entries must be below 2\*\*31"):
        Projector(tr, _VOL, (2**33 + 8, 4))
    with pytest.raises(ValueError, match="pixels; at most 2"):
        Projector(tr, _VOL, (2**16, 2**16))


def test_ctypes_entries_refuse_ints_that_would_wrap():
    from ctbench.engine.cpu.backend import _FORWARD_ARGS
    from ctbench.engine.cpu.library import cpu_function

    f = cpu_function("joseph", "joseph_forward", torch.float32, _FORWARD_ARGS)
    args = [0, 0, 1, 8, 8, 2**31 + 8] + [0] * 20  # W = 2**31 + 8 would reach the kernel as 8
    with pytest.raises(ValueError, match="argument 5 is 2147483656"):
        f(*args)


def test_tiny_spacing_that_float32_would_flush_to_zero_is_refused():
    with pytest.raises(ValueError, match="voxel_spacing must lie in"):
        Projector(_cone(), _VOL, _DET, voxel_spacing=1e-300)
    with pytest.raises(ValueError, match="detector_spacing must lie in"):
        Projector(_cone(), _VOL, _DET, detector_spacing=(1.0, 1e300))


def test_fractional_shapes_are_refused_whole_floats_accepted():
    with pytest.raises(ValueError, match="16.7 is not whole"):
        Projector(_cone(), (16.7, 8, 8), _DET)
    with pytest.raises(ValueError, match="must contain integers"):
        Projector(_cone(), _VOL, (10, True))
    assert Projector(_cone(), (8.0, 8, 8), _DET).volume_shape == (8, 8, 8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_trajectory_is_refused(dtype):
    with pytest.raises(TypeError, match="must be float32 or float64"):
        _cone().to(dtype=dtype)


def test_trajectory_meta_must_be_a_dict():
    with pytest.raises(TypeError, match="meta must be a dict"):
        _cone().replace(meta="circular")


def test_fdk_padding_beyond_the_bound_fails_up_front():
    P = _projector()
    sino = torch.zeros(P.projection_shape, dtype=torch.float64)
    with pytest.raises(ValueError, match="padding must be at most 64"):
        fdk(P, sino, padding=1e7)
    assert torch.isfinite(fdk(P, sino, padding=64)).all()


def test_window_sizes_chunks_and_meta_are_checked_up_front(tmp_path):
    """Finding 13: a chunk of 0, a chunk that is not a number, a meta that is not a dict: clear errors
    when the object is made, before any work (not ZeroDivisionError/TypeError/AttributeError later)."""
    import torch

    from ctbench import Projector, circular_trajectory_3d
    from ctbench.storage import ZarrStore
    from ctbench.workbench.dataset import save_dataset

    t = circular_trajectory_3d(8, 100.0, 200.0)
    for kw, name in [(dict(view_chunk_size=0), "view_chunk_size"), (dict(detector_chunk_shape=(0, 4)),
                                                                    "detector_chunk_shape"),
                     (dict(volume_chunk_shape=0), "volume_chunk_shape")]:
        with pytest.raises(ValueError, match=name):
            Projector(t, (8, 8, 8), (8, 8), **kw)
    for chunks in (0, "a", (0, 4, 4)):
        with pytest.raises(ValueError, match="chunks must be 3 positive integers"):
            ZarrStore.create(tmp_path / "z.zarr", (4, 4, 4), torch.float32, chunks=chunks)
    assert not (tmp_path / "z.zarr").exists()
    with pytest.raises(TypeError, match="meta must be a dict"):
        save_dataset(tmp_path / "d.zarr", volume=torch.rand(4, 4, 4), meta="notes")
    assert not (tmp_path / "d.zarr").exists()
