"""Bad input to the solvers and the data loader gets a clear error naming the argument."""

from __future__ import annotations

import math

import pytest
import torch

from ctbench import (
    Projector,
    circular_trajectory_2d_fan,
    circular_trajectory_3d,
    circular_trajectory_3d_parallel,
    saddle_trajectory_3d,
    spiral_trajectory_3d,
)
from ctbench.datasets import load_htc2022
from ctbench.solvers import (
    cgls,
    cgls_iterations,
    fbp,
    fdk,
    helical_fdk,
    ramp_filter,
    sirt,
    sirt_iterations,
    total_variation,
    tv_iterations,
    tv_reconstruction,
)

F64 = torch.float64


@pytest.fixture
def fan():
    traj = circular_trajectory_2d_fan(20, 60.0, 120.0, dtype=F64)
    p = Projector(traj, (12, 12), 18, voxel_spacing=1.0, detector_spacing=1.5)
    return p, torch.rand(20, 18, dtype=F64)


@pytest.fixture
def cone():
    traj = circular_trajectory_3d(16, 60.0, 120.0, dtype=F64)
    p = Projector(traj, (6, 10, 10), (14, 8), voxel_spacing=1.0, detector_spacing=1.6)
    return p, torch.rand(16, 14, 8, dtype=F64)


ITERATIVE = [sirt, cgls, tv_reconstruction, sirt_iterations, cgls_iterations, tv_iterations]


@pytest.mark.parametrize("solver", ITERATIVE + [fbp])
def test_sinogram_trajectory_mismatch(fan, solver):
    p, s = fan
    with pytest.raises(ValueError, match=r"sinogram has shape \(19, 18\).*expects .*20, 18\)"):
        solver(p, s[:19])
    with pytest.raises(ValueError, match="sinogram has shape"):
        solver(p, s[:, :17])


def test_fdk_sinogram_mismatch(cone):
    p, s = cone
    with pytest.raises(ValueError, match=r"n_views=16"):
        fdk(p, s[:15])
    with pytest.raises(ValueError, match="sinogram has shape"):
        fdk(p, s.transpose(1, 2))


@pytest.mark.parametrize("solver", ITERATIVE + [fbp])
def test_nan_and_inf_in_data(fan, solver):
    p, s = fan
    bad = s.clone()
    bad[3, 4] = float("nan")
    with pytest.raises(ValueError, match=r"sinogram contains non-finite values \(1 NaN, 0 inf\)"):
        solver(p, bad)
    bad[3, 4] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        solver(p, bad)


@pytest.mark.parametrize("solver", ITERATIVE)
@pytest.mark.parametrize("n_iter", [-1, 2.5, "10", True])
def test_bad_iteration_counts(fan, solver, n_iter):
    p, s = fan
    with pytest.raises(ValueError, match="n_iter must be a non-negative integer"):
        solver(p, s, n_iter)


def test_fdk_on_non_circular_trajectories():
    helix = spiral_trajectory_3d(24, sid=60.0, sdd=120.0, z_range=10.0, dtype=F64)
    p = Projector(helix, (6, 10, 10), (14, 8), voxel_spacing=1.0, detector_spacing=1.6)
    with pytest.raises(ValueError, match="circular orbit.*helical_fdk"):
        fdk(p, torch.zeros(24, 14, 8, dtype=F64))
    saddle = saddle_trajectory_3d(24, sid=60.0, sdd=120.0, z_amplitude=5.0, radial_amplitude=0.0, dtype=F64)
    p = Projector(saddle, (6, 10, 10), (14, 8), voxel_spacing=1.0, detector_spacing=1.6)
    with pytest.raises(ValueError, match="circular orbit"):
        fdk(p, torch.zeros(24, 14, 8, dtype=F64))
    with pytest.raises(ValueError, match="helical orbit"):
        helical_fdk(p, torch.zeros(24, 14, 8, dtype=F64))


def test_fdk_and_fbp_refuse_the_other_beam(cone):
    p, s = cone
    with pytest.raises(ValueError, match="use fdk"):
        fbp(p, s)
    par = Projector(circular_trajectory_3d_parallel(10, dtype=F64), (4, 8, 8), (12, 6))
    with pytest.raises(ValueError, match="use fbp"):
        fdk(par, torch.zeros(10, 12, 6, dtype=F64))


def test_fdk_views_out_of_order():
    angles = torch.tensor([0.0, 0.5, 0.2, 1.0, 1.5], dtype=F64)
    traj = circular_trajectory_3d(sid=60.0, sdd=120.0, angles=angles, dtype=F64)
    p = Projector(traj, (4, 8, 8), (12, 6), voxel_spacing=1.0, detector_spacing=1.6)
    with pytest.raises(ValueError, match="rotation order"):
        fdk(p, torch.zeros(5, 12, 6, dtype=F64))


def test_short_scan_too_short_warns():
    traj = circular_trajectory_3d(30, 60.0, 120.0, angle_range=math.pi / 2, dtype=F64)
    p = Projector(traj, (4, 8, 8), (12, 6), voxel_spacing=1.0, detector_spacing=1.6)
    with pytest.warns(RuntimeWarning, match="180 \\+ fan angle"):
        fdk(p, torch.zeros(30, 12, 6, dtype=F64))


@pytest.mark.parametrize("kw,match", [
    (dict(filter="gauss"), "filter must be one of"),
    (dict(filter=None), "filter must be one of"),
    (dict(cutoff=0.0), "cutoff must be in"),
    (dict(cutoff=1.5), "cutoff must be in"),
    (dict(padding=0.5), "padding must be >= 1"),
    (dict(oversample=0), "oversample must be a positive integer"),
    (dict(short_scan="yes"), "short_scan must be"),
])
def test_bad_filter_options(fan, kw, match):
    p, s = fan
    with pytest.raises(ValueError, match=match):
        fbp(p, s, **kw)


def test_ramp_filter_bad_spacing():
    with pytest.raises(ValueError, match="spacing must be a positive"):
        ramp_filter(torch.zeros(4, 8), -1.0)


def test_bad_solver_options(fan):
    p, s = fan
    with pytest.raises(ValueError, match=r"x0 has shape \(3, 3\).*\(12, 12\)"):
        sirt(p, s, 2, x0=torch.zeros(3, 3, dtype=F64))
    with pytest.raises(ValueError, match="x0 contains non-finite"):
        cgls(p, s, 2, x0=torch.full((12, 12), float("nan"), dtype=F64))
    with pytest.raises(ValueError, match=r"bounds lower \(1.0\) must not exceed upper \(0.0\)"):
        sirt(p, s, 2, bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match="bounds must be a pair"):
        sirt(p, s, 2, bounds=0.0)
    with pytest.raises(ValueError, match="tol must be a non-negative"):
        cgls(p, s, 2, tol=-1)
    with pytest.raises(ValueError, match="lam must be a non-negative"):
        tv_reconstruction(p, s, 2, lam=-0.1)
    with pytest.raises(TypeError, match="callback must be callable"):
        cgls(p, s, 2, callback=3)
    with pytest.raises(TypeError, match="cancel must be None"):
        sirt(p, s, 2, cancel="stop")
    with pytest.raises(TypeError, match="sinogram must be a torch.Tensor"):
        sirt(p, s.numpy(), 2)
    with pytest.raises(TypeError, match="sinogram must be float32 or float64"):
        cgls(p, s.to(torch.int32), 2)
    with pytest.raises(TypeError, match="projector must be a ctbench Projector"):
        sirt("projector", s, 2)


def test_generators_check_arguments_when_called(fan):
    """Errors surface at the call, not at the first next()."""
    p, s = fan
    with pytest.raises(ValueError, match="n_iter"):
        sirt_iterations(p, s, -3)
    with pytest.raises(ValueError, match="sinogram has shape"):
        tv_iterations(p, s[:5])


def test_total_variation_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        total_variation(torch.zeros(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="eps must be a non-negative"):
        total_variation(torch.zeros(3, 3), eps=-1.0)
    with pytest.raises(ValueError, match="ndim must be an integer"):
        total_variation(torch.zeros(3, 3), ndim=3)


def test_load_htc2022_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="kind must be one of"):
        load_htc2022("half")
    with pytest.raises(TypeError, match="dtype"):
        load_htc2022(dtype=torch.int32)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_htc2022(path=tmp_path / "missing.mat")
