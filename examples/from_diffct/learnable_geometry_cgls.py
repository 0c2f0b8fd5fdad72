"""A diffct user's script: learn an unknown detector shift by gradient descent through the projector,
alternating with CGLS reconstructions (self-calibration of a 2D fan-beam scan).

Written against diffct 2.5; the only change for ctbench is the import line
(`from diffct import ...` -> `from ctbench import ...`).  tests/test_diffct_compat.py runs it
with both libraries and compares the printed figures.
"""

import torch

from ctbench import Projector, cgls, circular_trajectory_2d_fan

device = "cuda" if torch.cuda.is_available() else "cpu"
n_views, sid, sdd = 24, 60.0, 120.0
image_shape, n_det = (16, 16), 32
true_shift = 1.3  # mm along the detector u axis, unknown to the reconstruction


def phantom(shape):
    y, x = torch.meshgrid(*[torch.arange(n, device=device) - (n - 1) / 2 for n in shape], indexing="ij")
    return (torch.exp(-((x - 3) ** 2 + (y + 2) ** 2) / 8.0) + 0.6 * torch.exp(-((x + 4) ** 2 + (y - 3) ** 2) / 3.0)).float()


src, det_center, det_u = circular_trajectory_2d_fan(n_views, sid, sdd, device=device)


def shifted(shift):
    """The nominal trajectory with the detector moved by `shift` mm along u (differentiable)."""
    return (src, det_center + shift * det_u, det_u)


truth = phantom(image_shape)
measured = Projector(shifted(torch.tensor(true_shift, device=device)), image_shape, n_det, beam="fan").project(truth)

shift = torch.zeros((), device=device, requires_grad=True)
optimizer = torch.optim.Adam([shift], lr=0.25)
for outer in range(3):
    operator = Projector(shifted(shift.detach()), image_shape, n_det, beam="fan")
    image = cgls(operator, measured, 12).volume
    for _ in range(10):
        optimizer.zero_grad()
        prediction = operator.project(image, trajectory=shifted(shift))
        loss = (prediction - measured).square().mean()
        loss.backward()
        optimizer.step()
    print(f"round {outer}: shift {shift.item():.3f} mm, data loss {loss.item():.4g}")

final = cgls(Projector(shifted(shift.detach()), image_shape, n_det, beam="fan"), measured, 20)
error = (final.volume - truth).norm() / truth.norm()
print(f"learned shift: {shift.item():.3f} mm (true {true_shift} mm)")
print(f"relative image error: {error.item():.4f}")
