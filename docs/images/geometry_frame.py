"""Draws docs/images/geometry_frame.png: ctbench's (diffct 2.5's) scan frame seen from +z.

Run: python docs/images/geometry_frame.py  (uses the generators, so the figure is the code's frame)
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ctbench import circular_trajectory_2d_parallel, circular_trajectory_3d  # noqa: E402

t = math.radians(30)
fig, axes = plt.subplots(1, 2, figsize=(11, 5.4))

ax = axes[0]
src, ctr, u, v = (x[0].tolist() for x in circular_trajectory_3d(angles=[t], sid=1.0, sdd=1.6).tensors())
ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, ls=":", color="grey"))
ax.plot(*src[:2], "o", color="tab:red", ms=10)
ax.annotate("source\nsid (-sin t, cos t, 0)", src[:2], xytext=(src[0] - 1.0, src[1] + 0.05), color="tab:red")
half = 0.45
a = [ctr[0] - half * u[0], ctr[1] - half * u[1]]
b = [ctr[0] + half * u[0], ctr[1] + half * u[1]]
ax.plot([a[0], b[0]], [a[1], b[1]], lw=5, color="tab:blue")
ax.annotate("detector centre\n(sdd - sid) (sin t, -cos t, 0)", ctr[:2], xytext=(ctr[0] - 0.5, ctr[1] - 0.5),
            color="tab:blue")
ax.arrow(ctr[0], ctr[1], 0.35 * u[0], 0.35 * u[1], width=0.012, color="k")
ax.text(ctr[0] + 0.4 * u[0], ctr[1] + 0.4 * u[1] + 0.05, "u = (cos t, sin t, 0)")
ax.plot(*ctr[:2], marker="$\\odot$", ms=14, color="k")
ax.text(ctr[0] + 0.1, ctr[1] - 0.12, "v = +z (out of the page)", fontsize=8)
for frac in (-0.8, 0.0, 0.8):
    p = [ctr[0] + frac * half * u[0], ctr[1] + frac * half * u[1]]
    ax.annotate("", p, src[:2], arrowprops=dict(arrowstyle="->", color="tab:orange", lw=0.8))
ax.annotate("", (0.35, 0.0), (0.0, 0.0), arrowprops=dict(arrowstyle="->"))
ax.annotate("", (0.0, 0.35), (0.0, 0.0), arrowprops=dict(arrowstyle="->"))
ax.text(0.37, -0.03, "x")
ax.text(-0.03, 0.38, "y")
arc = [math.radians(d) for d in range(0, 31)]
ax.plot([-1.15 * math.sin(s) for s in arc], [1.15 * math.cos(s) for s in arc], color="grey")
ax.text(-0.2, 1.25, "t (anticlockwise)", color="grey")
ax.set_title("cone / fan beam at angle t (seen from +z)")
ax.set_aspect("equal")
ax.set_xlim(-1.6, 1.6)
ax.set_ylim(-1.3, 1.5)
ax.axis("off")

ax = axes[1]
d, ctr, u, v = (x[0].tolist() for x in circular_trajectory_2d_parallel(angles=[t], detector_distance=0.0).tensors())
ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, ls=":", color="grey"))
for frac in (-0.6, -0.3, 0.0, 0.3, 0.6):
    o = [frac * u[0] - 1.1 * d[0], frac * u[1] - 1.1 * d[1]]
    ax.annotate("", (o[0] + 1.9 * d[0], o[1] + 1.9 * d[1]), o,
                arrowprops=dict(arrowstyle="->", color="tab:orange", lw=0.8))
far = [0.9 * d[0], 0.9 * d[1]]
a = [far[0] - 0.7 * u[0], far[1] - 0.7 * u[1]]
b = [far[0] + 0.7 * u[0], far[1] + 0.7 * u[1]]
ax.plot([a[0], b[0]], [a[1], b[1]], lw=5, color="tab:blue")
ax.arrow(far[0], far[1], 0.35 * u[0], 0.35 * u[1], width=0.012, color="k")
ax.text(far[0] + 0.4 * u[0] - 0.1, far[1] + 0.4 * u[1] + 0.08, "u = (-sin t, cos t, 0)")
ax.text(-1.6, -1.1 * d[1] - 0.45, "ray direction (cos t, sin t, 0)", color="tab:orange")
ax.text(0.1, -1.15, "detector centre = detector_distance * u; v = +z", fontsize=8)
ax.annotate("", (0.35, 0.0), (0.0, 0.0), arrowprops=dict(arrowstyle="->"))
ax.annotate("", (0.0, 0.35), (0.0, 0.0), arrowprops=dict(arrowstyle="->"))
ax.text(0.37, -0.03, "x")
ax.text(-0.03, 0.38, "y")
ax.set_title("parallel beam at angle t (seen from +z)")
ax.set_aspect("equal")
ax.set_xlim(-1.6, 1.6)
ax.set_ylim(-1.3, 1.5)
ax.axis("off")

fig.suptitle("ctbench = diffct 2.5 frame: u x v points along the rays; volume (D, H, W) = (z, y, x), centred")
fig.tight_layout()
fig.savefig(Path(__file__).with_name("geometry_frame.png"), dpi=110)
