"""FBP/FDK in batches of views (the GUI's progress) equals the solvers' one-shot result."""

import pytest


# ---------------------------------------------------------------- FBP/FDK in view batches (GUI progress)
@pytest.mark.parametrize("kind,extra", [("circular", {}), ("short_scan", {}), ("fan", {}),
                                        ("parallel", {"angle_range": 180.0})])
def test_view_batched_fbp_equals_the_solver(kind, extra):
    import torch

    from ctbench import solvers
    from ctbench.workbench.batched_fbp import filtered_backprojection_in_batches, splittable
    from ctbench.workbench.design import TrajectoryDesign

    geo = TrajectoryDesign(kind=kind, n_views=30, volume_d=12, volume_h=16, volume_w=16, detector_u=40,
                           detector_v=24, **extra).build()
    P = geo.projector()
    assert splittable(P, geo.kind)
    sino = P.project(torch.rand(geo.volume_shape, generator=torch.Generator().manual_seed(0)).contiguous())
    gen = filtered_backprojection_in_batches(P, sino, filter="hann", batch=7)
    steps = []
    while True:
        try:
            steps.append(next(gen))
        except StopIteration as stop:
            out = stop.value
            break
    assert steps == [(7, 30), (14, 30), (21, 30), (28, 30), (30, 30)]
    want = (solvers.fdk if geo.beam == "cone" and not geo.is_2d else solvers.fbp)(P, sino, filter="hann")
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_helical_scans_are_not_split():
    from ctbench.workbench.batched_fbp import splittable
    from ctbench.workbench.design import TrajectoryDesign

    geo = TrajectoryDesign(kind="helical", n_views=20, volume_d=8, volume_h=8, volume_w=8).build()
    assert not splittable(geo.projector(), geo.kind)
