"""The catalogue's solvers in the workbench: ALGORITHMS describes them (defaults, help), reconstruct() runs each
with the solver's own result, the estimate knows them, and bad parameters are refused by name."""

from __future__ import annotations

import pytest
import torch

from ctbench import solvers
from ctbench.workbench.design import TrajectoryDesign
from ctbench.workbench.estimate import CALLS, STATE
from ctbench.workbench.workflow import ALGORITHMS, Progress, ReconRequest, reconstruct, run, simulate

NEW = ("fista_tv", "lsqr", "lsmr", "sart", "mlem", "osem", "pwls", "tgv")


@pytest.fixture(scope="module")
def scan():
    g = TrajectoryDesign(kind="parallel", n_views=16, detector_u=16, detector_v=4, volume_d=4, volume_h=12,
                         volume_w=12).build()
    vol = torch.zeros(g.volume_shape)
    vol[1:3, 3:9, 4:8] = 0.2
    return g, simulate(g, vol, backend="cpu")


def test_every_new_algorithm_is_described_and_estimated():
    for name in NEW:
        a = ALGORITHMS[name]
        assert a.iterative and a.description
        assert name in STATE and name in CALLS
        for p in a.params:
            assert p.help or p.name in ("n_iter", "nonneg"), (name, p.name)
        ReconRequest(name).validated()          # the defaults are valid


@pytest.mark.parametrize("name", NEW)
def test_reconstruct_runs_the_solver(scan, name):
    g, sino = scan
    params = {"n_iter": 2}
    fin = run(g, sino, ReconRequest(name, params), backend="cpu")
    assert fin.n_iter == 2 and fin.stopped == "completed"
    P = g.projector("cpu")
    d = ReconRequest(name, params).validated().params
    if name == "fista_tv":
        ref = solvers.fista_tv(P, sino, 2, lam=d["lam"], prox_iter=d["prox_iter"])
    elif name == "lsqr":
        ref = solvers.lsqr(P, sino, 2)
    elif name == "tgv":
        ref = solvers.tgv(P, sino, 2, alpha1=d["alpha1"], alpha0=d["alpha0_ratio"] * d["alpha1"])
    elif name == "lsmr":
        ref = solvers.lsmr(P, sino, 2)
    elif name == "sart":
        ref = solvers.sart(P, sino, 2, bounds=(0.0, None))
    elif name == "mlem":
        ref = solvers.mlem(P, d["i0"] * torch.exp(-sino), d["i0"], 2)
    elif name == "osem":
        ref = solvers.osem(P, d["i0"] * torch.exp(-sino), d["i0"], 2)
    else:
        ref = solvers.pwls(P, d["i0"] * torch.exp(-sino), d["i0"], 2, lam=d["lam"], delta=d["delta"])
    torch.testing.assert_close(fin.volume, ref.volume.reshape(fin.volume.shape))


def test_previews_and_bad_parameters(scan):
    g, sino = scan
    events = list(reconstruct(g, sino, ReconRequest("osem", {"n_iter": 2, "n_subsets": 16}, "auto"), backend="cpu"))
    assert [e.iteration for e in events if isinstance(e, Progress)] == [1, 2]
    with pytest.raises(ValueError, match=r"Photons per pixel I0 \(i0\) must be at least 1"):
        ReconRequest("mlem", {"i0": 0.0}).validated()
    with pytest.raises(ValueError, match=r"Penalty \(penalty\) must be one of"):
        ReconRequest("pwls", {"penalty": "l1"}).validated()
    with pytest.raises(ValueError, match=r"Relaxation \(relax\) must be at most"):
        ReconRequest("sart", {"relax": 2.5}).validated()
    with pytest.raises(ValueError, match=r"Huber δ \(delta\) must be at least"):
        ReconRequest("pwls", {"delta": 0.0}).validated()
