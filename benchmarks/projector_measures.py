"""What the projector benchmarks measure besides time: ray/plane samples, memory bandwidth, differences.

- ``ray_plane_samples``: the samples a projector's rays take (float64, from the geometry; the same count
  for every implementation), so that a time becomes a rate;
- ``stream_bandwidth``: a plain memory-streaming loop (torch copy), the hardware figure a rate is set
  against (``throughput``);
- ``smooth_volume``: a test object positive everywhere, small at the borders, off-centre;
- ``rel_diff``: relative L2 and max differences against ctbench's output.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from harness import rounded

from ctbench import Projector


def rel_diff(a, b, volume: bool = False) -> dict:
    """Relative L2 and max differences of ``a`` against the reference ``b``.

    For volumes (``volume=True``) also the L2 difference without the outermost
    voxel layer: RTK's Joseph stops at the box faces half a voxel outside the
    border voxel centres, ctbench's stencil (like ASTRA's) reaches one voxel
    beyond, so border voxels legitimately differ between the models.
    """
    a = torch.as_tensor(np.ascontiguousarray(a)).to(torch.float64)
    b = torch.as_tensor(np.ascontiguousarray(b)).to(torch.float64)
    d = a - b
    out = {"rel_diff_vs_ctbench": rounded(float(d.norm() / b.norm())),
           "max_diff_vs_ctbench": rounded(float(d.abs().max() / b.abs().max()))}
    if volume:
        inner = tuple(slice(1, -1) if n > 2 else slice(None) for n in b.shape)
        out["rel_diff_interior_vs_ctbench"] = rounded(float(d[inner].norm() / b[inner].norm()))
    return out


# ------------------------------------------------------------------ bandwidth
def stream_bandwidth(n_bytes: int, repeats: int = 15) -> dict:
    """Best streaming rate of ``dst.copy_(src)`` on float32 arrays of ``n_bytes`` each, torch's threads.

    Counted as read + write (2 x n_bytes per copy), as STREAM does; the
    write-allocate traffic the hardware may add is not counted.  Many short
    timings, best kept: on a shared machine one descheduled thread stalls a
    whole parallel copy, and the best timing is the one that escaped that.
    """
    n = max(1, n_bytes // 4)
    src = torch.rand(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    inner = max(1, int(5e7 // n_bytes))  # keep each timed call >~ 5 ms for small arrays
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            dst.copy_(src)
        best = min(best, (time.perf_counter() - t0) / inner)
    return {"array_bytes": 4 * n, "seconds": best, "gb_per_s": 2 * 4 * n / best / 1e9}


# ------------------------------------------------------------------ sample count
def ray_plane_samples(projector: Projector, views_per_chunk: int = 8) -> dict:
    """Count the ray/plane samples of every ray of ``projector`` (float64, from the geometry).

    ``useful``: dominant-axis planes where the ray lies within one voxel of the
    box on the other two axes (the bilinear stencil touches a voxel).
    ``marched``: the planes the kernels iterate, which add up to two spare planes
    per ray (same rule as kernels/joseph.cuh make_ray).
    """
    D, H, W = projector.grid.shape
    dz, dy, dx = projector.grid.spacing
    size = torch.tensor([W, H, D], dtype=torch.float64)
    spacing = torch.tensor([dx, dy, dz], dtype=torch.float64)
    half = (size - 1) / 2
    du, dv = projector.detector_spacing
    U, V = projector.detector_shape
    src, ctr, uu, vv = (t.detach().to("cpu", torch.float64) for t in projector.trajectory.tensors())
    su = torch.arange(U, dtype=torch.float64) - (U - 1) / 2
    sv = torch.arange(V, dtype=torch.float64) - (V - 1) / 2
    cone = projector.beam == "cone"
    useful = marched = 0
    n_rays = 0
    for k0 in range(0, src.shape[0], views_per_chunk):
        sl = slice(k0, k0 + views_per_chunk)
        pix = (ctr[sl, None, None] + su[None, :, None, None] * du * uu[sl, None, None]
               + sv[None, None, :, None] * dv * vv[sl, None, None]).reshape(-1, 3)
        s = src[sl, None, None].expand(-1, U, V, 3).reshape(-1, 3)
        o, d = (s, pix - s) if cone else (pix, s)
        fo, fd = o / spacing + half, d / spacing
        a = fd.abs().argmax(dim=1)
        # parameter interval where each axis' coordinate lies in (-1, N)
        t1 = (-1 - fo) / fd  # +-inf or nan where fd == 0: replaced just below
        t2 = (size - fo) / fd
        tlo, thi = torch.minimum(t1, t2), torch.maximum(t1, t2)
        inside = (fo > -1) & (fo < size)
        zero = fd == 0
        tlo = torch.where(zero, torch.where(inside, -math.inf, math.inf), tlo)
        thi = torch.where(zero, torch.where(inside, math.inf, -math.inf), thi)
        own = torch.nn.functional.one_hot(a, 3).bool()
        tlo = torch.where(own, -math.inf, tlo).amax(dim=1)
        thi = torch.where(own, math.inf, thi).amin(dim=1)
        fa_o, fa_d = fo.gather(1, a[:, None])[:, 0], fd.gather(1, a[:, None])[:, 0]
        na, nb = fa_o + tlo.clamp(-1e12, 1e12) * fa_d, fa_o + thi.clamp(-1e12, 1e12) * fa_d
        nlo, nhi = torch.minimum(na, nb), torch.maximum(na, nb)
        nlo = torch.where(tlo <= thi, nlo, torch.full_like(nlo, math.inf))
        last = size[a] - 1
        lo_i = torch.clamp(torch.ceil(nlo), min=0)
        hi_i = torch.minimum(torch.floor(nhi), last)
        useful += int(torch.clamp(hi_i - lo_i + 1, min=0).sum())
        n0 = torch.clamp(torch.floor(torch.maximum(nlo, torch.zeros_like(nlo))), min=0)
        n1 = torch.minimum(torch.floor(torch.minimum(nhi, last)) + 2, size[a])
        marched += int(torch.where(nlo <= nhi + 1, torch.clamp(n1 - n0, min=0), torch.zeros_like(n0)).sum())
        n_rays += fo.shape[0]
    return {"samples": useful, "samples_marched": marched, "rays": n_rays}


def throughput(stats: dict, samples: dict, itemsize: int, op: str, bandwidth: dict) -> dict:
    """samples/s, bytes touched per second and the fractions of the measured streaming rates."""
    sps = samples["samples"] / stats["seconds"]
    per_sample = 4 * itemsize * (2 if op == "back" else 1)
    touched = sps * per_sample
    out = {"samples": samples["samples"], "samples_marched": samples["samples_marched"],
           "samples_per_s": rounded(sps), "bytes_per_sample": per_sample, "touched_gb_per_s": rounded(touched / 1e9)}
    for name, bw in bandwidth.items():
        out[f"bandwidth_fraction_{name}"] = rounded(touched / 1e9 / bw["gb_per_s"])
    return out


# ------------------------------------------------------------------ test data
def smooth_volume(shape, dtype=torch.float32) -> torch.Tensor:
    """An asymmetric smooth object, positive everywhere and small at the borders.

    Positive everywhere so every ray that meets the box carries a non-zero
    value (no implementation can skip work on zeros); small at the borders so
    the implementations' different edge handling hardly shows in the
    comparison; off-centre blobs so a mirrored or rotated geometry gives O(1).
    """
    axes = [torch.linspace(-1, 1, n, dtype=torch.float64) if n > 1 else torch.zeros(1, dtype=torch.float64)
            for n in shape]
    grids = torch.meshgrid(*axes, indexing="ij")
    if len(shape) == 3:
        z, y, x = grids
    else:
        (y, x), z = grids, torch.zeros_like(grids[0])
    f = torch.exp(-0.5 * (x * x + y * y + z * z) / 0.3 ** 2)
    f = f + 0.8 * torch.exp(-((x - 0.35) ** 2 + (y + 0.2) ** 2 + (z - 0.15) ** 2) / (2 * 0.12 ** 2))
    f = f + 0.5 * torch.exp(-((x + 0.3) ** 2 + (y - 0.4) ** 2 + (z + 0.25) ** 2) / (2 * 0.08 ** 2))
    return f.to(dtype).contiguous()
