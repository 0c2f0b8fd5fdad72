"""A diffct user's script: simulate a circular cone-beam scan of two Gaussian blobs and reconstruct it with FDK.

Written against diffct 2.5; the only change for ctbench is the import line
(`from diffct import ...` -> `from ctbench import ...`).  tests/test_diffct_compat.py runs it
with both libraries and compares the printed figures.
"""

import math

import torch

from ctbench import Projector, circular_trajectory_3d, fdk

device = "cuda" if torch.cuda.is_available() else "cpu"
n_views, sid, sdd = 48, 60.0, 120.0
volume_shape, detector_shape, du = (12, 18, 18), (40, 28), 1.0


def blobs(shape):
    """Two Gaussian blobs (attenuation per mm) on a 1 mm grid centred on the origin."""
    z, y, x = torch.meshgrid(*[torch.arange(n, device=device) - (n - 1) / 2 for n in shape], indexing="ij")
    a = torch.exp(-((x - 3) ** 2 + (y + 2) ** 2 + (z - 1) ** 2) / (2 * 2.5 ** 2))
    b = 0.5 * torch.exp(-((x + 4) ** 2 + (y - 3) ** 2 + z ** 2) / (2 * 1.5 ** 2))
    return (a + b).float()


truth = blobs(volume_shape)
src, det_center, det_u, det_v = circular_trajectory_3d(n_views, sid, sdd, device=device)
trajectory = (src, det_center, det_u, det_v)
projector = Projector(trajectory, volume_shape, detector_shape, detector_spacing=du, voxel_spacing=1.0)
sinogram = projector.project(truth)
angles = torch.arange(n_views, device=device, dtype=torch.float32) * (2 * math.pi / n_views)
recon = fdk(sinogram, trajectory, volume_shape, angles, detector_spacing=du, voxel_spacing=1.0)

centre = volume_shape[0] // 2
error = (recon[centre] - truth[centre]).norm() / truth[centre].norm()
print(f"sinogram sum: {sinogram.sum().item():.6g}")
print(f"peak: {recon.max().item():.4f} (truth {truth.max().item():.4f})")
print(f"central-slice relative error: {error.item():.4f}")
