"""Draws docs/images/orientation.png: what "seen from the source" and "seen from behind the detector" mean.

Run: python docs/images/orientation_frame.py  (the scan is ctbench's generator and the images are exact
projections of ctbench.phantoms.chiral_phantom, so the figure is the code's convention)
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from ctbench import circular_trajectory_3d  # noqa: E402
from ctbench.io.orientation import CTBENCH, Orientation, to_ctbench_images  # noqa: E402
from ctbench.io.scan import sinogram_to_images  # noqa: E402
from ctbench.phantoms import chiral_line_integrals  # noqa: E402

sid, sdd = 1.0, 1.6
traj = circular_trajectory_3d(sid=sid, sdd=sdd, angles=torch.tensor([0.0], dtype=torch.float64),
                              dtype=torch.float64)
src, ctr, u, v = (x[0].tolist() for x in traj.tensors())
fig, axes = plt.subplots(1, 3, figsize=(14, 5.0), gridspec_kw={"width_ratios": [1.25, 1, 1]})

ax = axes[0]
ax.add_patch(plt.Circle((0, 0), sid, fill=False, ls=":", color="grey"))
ax.plot(*src[:2], "o", color="tab:red", ms=10)
ax.text(src[0] + 0.08, src[1] + 0.08, "source (t = 0)", color="tab:red")
ax.plot([ctr[0] - 0.5, ctr[0] + 0.5], [ctr[1], ctr[1]], lw=6, color="tab:blue")
ax.text(ctr[0] - 0.5, ctr[1] - 0.17, "detector", color="tab:blue")
ax.arrow(ctr[0], ctr[1], 0.3 * u[0], 0.3 * u[1], width=0.012, color="k")
ax.text(ctr[0] + 0.33, ctr[1] + 0.04, "+u")
ax.text(ctr[0] - 0.5, ctr[1] + 0.06, "v = +z, out of the page", fontsize=7)
for x in (-0.35, 0.0, 0.35):
    ax.annotate("", (x, ctr[1] + 0.03), src[:2], arrowprops=dict(arrowstyle="->", color="tab:orange", lw=0.7))
ax.add_patch(plt.Rectangle((-0.28, -0.1), 0.12, 0.45, color="0.4"))        # the F's stem at -x (schematic)
ax.text(-0.26, 0.38, "F", fontsize=14, weight="bold")
# the two viewers and their right hands
ax.text(src[0] + 0.3, src[1] - 0.35, "camera at the source,\nlooking at the detector:\nits right is -u",
        fontsize=8, color="tab:red")
ax.annotate("", (src[0] - 0.45, src[1] - 0.12), (src[0] - 0.1, src[1] - 0.12),
            arrowprops=dict(arrowstyle="->", color="tab:red"))
ax.text(ctr[0] + 0.15, ctr[1] - 0.42, "viewer behind the detector,\nlooking back at the source:\nits right is +u",
        fontsize=8, color="tab:green")
ax.annotate("", (ctr[0] + 0.55, ctr[1] - 0.1), (ctr[0] + 0.2, ctr[1] - 0.1),
            arrowprops=dict(arrowstyle="->", color="tab:green"))
arc = [math.radians(d) for d in range(0, 41)]
ax.plot([-1.12 * math.sin(s) for s in arc], [1.12 * math.cos(s) for s in arc], color="grey")
ax.text(-1.3, 1.22, "rotation_direction \"ccw\":\nthe source turns anticlockwise\n(angles grow)", color="grey",
        fontsize=8)
ax.annotate("", (0.3, 0.0), (0.0, 0.0), arrowprops=dict(arrowstyle="->"))
ax.annotate("", (0.0, 0.3), (0.0, 0.0), arrowprops=dict(arrowstyle="->"))
ax.text(0.32, -0.03, "x")
ax.text(-0.03, 0.33, "y")
ax.set_title("seen from +z (above), view 0", pad=18)
ax.set_aspect("equal")
ax.set_xlim(-1.3, 1.3)
ax.set_ylim(-1.25, 1.55)
ax.axis("off")

# Exact projection of the chiral phantom at t = 0, as each convention stores it.
U, V, pitch = 96, 72, 1.5
big = circular_trajectory_3d(sid=200.0, sdd=400.0, angles=torch.tensor([0.0], dtype=torch.float64),
                             dtype=torch.float64)
img = sinogram_to_images(chiral_line_integrals(big, (U, V), pitch, scale=32.0).numpy())[0]   # ctbench's images
camera = img[:, ::-1]
assert np.array_equal(to_ctbench_images(camera[None], Orientation("source", "right", "down", "ccw"))[0], img)
for ax, im, title, right in ((axes[1], camera, 'image_seen_from = "source" (camera, ASTRA, most scanners)', "-u"),
                             (axes[2], img, 'image_seen_from = "detector" (ctbench\'s own images)', "+u")):
    ax.imshow(im, cmap="gray")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(f"column index grows to the right = {right}   (image_columns = \"right\")", fontsize=8)
    ax.set_ylabel("row index grows downwards = -v = world -z   (image_rows = \"down\")", fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(2, 6, "the F's stem (at -x) is the bright band", color="yellow", fontsize=7)
fig.suptitle(f"orientation of a scan's images: ctbench's frame is {CTBENCH.text()}; u x v points from the "
             "source to the detector", fontsize=10)
fig.tight_layout()
fig.savefig(Path(__file__).with_name("orientation.png"), dpi=100)
