"""Per-subset progress of ordered-subset runs and the memory/time estimate before a run (issue 23), Qt-free."""

import pytest
import torch

from ctbench.phantoms import shepp_logan_3d
from ctbench.workbench import estimate
from ctbench.workbench.design import TrajectoryDesign
from ctbench.workbench.workflow import Finished, ReconRequest, SubsetProgress, reconstruct

DESIGN = TrajectoryDesign(kind="circular", n_views=20, sid=150.0, sdd=300.0, detector_u=24, detector_v=24,
                          pixel_u=1.5, pixel_v=1.5, volume_d=16, volume_h=16, volume_w=16, voxel_size=1.0)


@pytest.fixture(scope="module")
def scan():
    geo = DESIGN.build()
    vol = shepp_logan_3d(geo.volume_shape, 1.0, modified=True).float() * 0.02
    return geo, geo.projector().project(vol)


def _finished(events):
    return next(e for e in events if isinstance(e, Finished))


@pytest.mark.parametrize("algorithm, extra", [("os_sirt", {"nonneg": True}), ("os_tv", {"lam": 1e-4})])
@pytest.mark.slow
def test_ordered_subsets_report_every_subset_of_every_pass_in_order(scan, algorithm, extra):
    geo, sino = scan
    req = ReconRequest(algorithm, {"n_iter": 3, "n_subsets": 4, **extra})
    seen = []
    with_hook = list(reconstruct(geo, sino, req, on_subset=seen.append))
    assert all(isinstance(s, SubsetProgress) for s in seen)
    assert [(s.iteration, s.subset) for s in seen] == [(p, k) for p in (1, 2, 3) for k in (1, 2, 3, 4)]
    assert {(s.n_iter, s.n_subsets) for s in seen} == {(3, 4)}
    assert [s.done_fraction for s in seen][-1] == 1.0 and seen[0].done_fraction == 1 / 12
    assert all(b.elapsed >= a.elapsed for a, b in zip(seen, seen[1:]))
    # Reporting changes nothing in the result.
    plain = _finished(list(reconstruct(geo, sino, req)))
    assert torch.equal(_finished(with_hook).volume, plain.volume)


def test_subset_events_arrive_before_the_pass_that_contains_them(scan):
    geo, sino = scan
    order = []
    req = ReconRequest("os_sirt", {"n_iter": 2, "n_subsets": 2})
    for ev in reconstruct(geo, sino, req, on_subset=lambda s: order.append(("subset", s.iteration, s.subset))):
        if ev.__class__.__name__ == "Progress":
            order.append(("pass", ev.iteration))
    assert order == [("subset", 1, 1), ("subset", 1, 2), ("pass", 1), ("subset", 2, 1), ("subset", 2, 2),
                     ("pass", 2)]


def test_bad_subset_hook_is_named(scan):
    geo, sino = scan
    with pytest.raises(TypeError, match="on_subset"):
        list(reconstruct(geo, sino, ReconRequest("os_sirt", {"n_iter": 1}), on_subset=3))


def test_memory_estimate_is_the_data_the_solver_arrays_and_the_planners_window(scan):
    geo, _ = scan
    P = geo.projector()
    vol, sino = 4 * 16 ** 3, 4 * 20 * 24 * 24
    for algorithm in estimate.STATE:
        data, state, kernel = estimate.memory_of(geo, algorithm)
        n_vol, n_sino = estimate.STATE[algorithm]
        assert data == vol + sino and state == n_vol * vol + n_sino * sino
        kinds = ["backproject"] if algorithm == "fbp" else ["project", "backproject"]
        assert kernel == max(P.plan(k, torch.float32).peak_bytes for k in kinds) > 0


def test_time_estimate_scales_the_measured_projection_pair_by_the_calls_of_the_run(scan):
    geo, _ = scan
    e10 = estimate.estimate_run(geo, ReconRequest("sirt", {"n_iter": 10}))
    e30 = estimate.estimate_run(geo, ReconRequest("sirt", {"n_iter": 30}))
    assert e10.pair_seconds == e30.pair_seconds > 0          # measured once per problem shape
    assert e30.seconds - e10.seconds == pytest.approx(20 * e10.pair_seconds)
    assert e10.seconds == pytest.approx((estimate.CALLS["sirt"][0] + 10) * e10.pair_seconds)
    # Ordered subsets: one call per subset, so a pass pays the fixed cost of a call S times.
    fixed, per_view, _ = estimate.call_costs(geo)
    os5 = estimate.estimate_run(geo, ReconRequest("os_sirt", {"n_iter": 5, "n_subsets": 4}))
    assert os5.seconds == pytest.approx((1 + 5) * (4 * fixed + per_view * geo.n_views))
    # FBP/FDK is timed as itself (filter, weights, its own backprojection kernel), not as half a projection pair.
    fbp = estimate.estimate_run(geo, ReconRequest("fbp", {}))
    f_fixed, f_per_view, _ = estimate.fbp_costs(geo, ReconRequest("fbp", {}))
    assert fbp.seconds == pytest.approx(f_fixed + f_per_view * geo.n_views) and fbp.n_iter == 1
    assert "FBP" in fbp.summary() and "timed as itself" in fbp.summary()
    text = e10.summary()
    assert "MiB of memory" in text or "KiB of memory" in text
    assert "10 iteration(s)" in text


def test_estimate_rejects_what_is_not_a_scan():
    with pytest.raises(TypeError, match="geometry"):
        estimate.estimate_run("scan", ReconRequest("sirt", {}))
    with pytest.raises(ValueError, match="algorithm"):
        estimate.memory_of(DESIGN.build(), "art")


def test_fbp_estimate_is_near_a_real_fbp_and_a_finished_run_replaces_the_model(scan):
    """The estimate of a one-pass run is within a factor of 10 of the run it estimates (min of 3 runs; the old
    model, half a projection pair, was 240 times too low here); after ``record_run`` the next estimate of that
    algorithm and shape is the run's measured set-up plus its time per iteration."""
    import time

    from ctbench.workbench.workflow import run

    geo, sino = scan
    request = ReconRequest("fbp", {})
    est = estimate.estimate_run(geo, request).seconds
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        run(geo, sino, request)
        times.append(time.perf_counter() - t0)
    assert est / 10 <= min(times) <= est * 10, (est, times)   # loose: a shared machine; the old model was 240x off
    estimate.record_run(geo, "cgls", [(1, 0.5), (2, 0.6), (3, 0.7)], 0.7)
    e = estimate.estimate_run(geo, ReconRequest("cgls", {"n_iter": 50}))
    assert e.seconds == pytest.approx(0.4 + 0.1 * 50) and "last CGLS run" in e.summary()
