"""The 2D section of the projector benchmark: ctbench's 2D projectors and ASTRA's CPU projectors
(parallel ``linear`` = Joseph and ``line``; fan ``line_fanflat``) on the same geometry."""

from __future__ import annotations

import numpy as np
import torch

from harness import best_of, timing_fields
from projector_measures import rel_diff, throughput

from ctbench import Projector, circular_trajectory_2d_fan, circular_trajectory_2d_parallel


def projector_2d(kind: str, size: int, n_views: int, n_det: int) -> Projector:
    """2D workloads: 1 mm pixels; the detector covers the image diagonal at the isocentre."""
    if kind == "parallel":
        tr = circular_trajectory_2d_parallel(n_views)
        du = 1.0
    else:
        tr = circular_trajectory_2d_fan(n_views, 1000.0, 1500.0)
        du = 1.5
    return Projector(tr, (size, size), n_det, detector_spacing=du, voxel_spacing=1.0, backend="cpu")


def astra_vectors(projector: Projector) -> np.ndarray:
    """ASTRA parallel_vec / fanflat_vec rows (ray or source, detector centre, pixel step) from the trajectory."""
    src, ctr, u = (t.detach().to(torch.float64).numpy() for t in projector.trajectory.tensors()[:3])
    du = projector.detector_spacing[0]
    return np.concatenate([src[:, :2], ctr[:, :2], u[:, :2] * du], axis=1)


def run_astra(emit, projector: Projector, kind: str, volume, ct_results, workload: str, repeats: int,
              samples: dict, bandwidth: dict):
    try:
        import astra
    except ImportError as e:
        emit(workload=workload, impl="astra", skipped="not installed", error=str(e))
        return {}
    H, W = projector.volume_shape
    U = projector.detector_shape[0]
    geom = "parallel_vec" if kind == "parallel" else "fanflat_vec"
    pg = astra.create_proj_geom(geom, U, astra_vectors(projector))
    # ASTRA's row 0 is the top of the image (largest y), ctbench's the smallest y: flip rows.
    vg = astra.create_vol_geom(H, W)
    vol_np = np.ascontiguousarray(volume.numpy()[::-1], dtype=np.float32)
    sino_ct = ct_results["forward"][1].numpy()
    types = ("linear", "line") if kind == "parallel" else ("line_fanflat",)
    results = {}
    for ptype in types:
        impl = f"astra-{ptype}"
        pid = astra.create_projector(ptype, pg, vg)
        vid = astra.data2d.create("-vol", vg, vol_np)
        sid = astra.data2d.create("-sino", pg, 0)
        bid = astra.data2d.create("-vol", vg, 0)
        sin_in = astra.data2d.create("-sino", pg, np.ascontiguousarray(sino_ct, dtype=np.float32))
        fp = astra.algorithm.create({"type": "FP", "ProjectorId": pid, "ProjectionDataId": sid,
                                     "VolumeDataId": vid})
        bp = astra.algorithm.create({"type": "BP", "ProjectorId": pid, "ProjectionDataId": sin_in,
                                     "ReconstructionDataId": bid})
        try:
            for op, alg, out_id in (("forward", fp, sid), ("back", bp, bid)):
                def call(alg=alg, out_id=out_id):
                    astra.data2d.store(out_id, 0)
                    astra.algorithm.run(alg)
                stats, _ = best_of(call, repeats)
                out = astra.data2d.get(out_id)
                if op == "back":
                    out = out[::-1]
                emit(workload=workload, op=op, impl=impl, threads=1, dtype="float32", **timing_fields(stats),
                     **throughput(stats, samples, 4, op, bandwidth),
                     **rel_diff(out, ct_results[op][1].numpy(), op == "back"),
                     model={"linear": "Joseph (linear interpolation)", "line": "line length (Siddon-like)",
                            "line_fanflat": "line length (Siddon-like)"}[ptype])
                results[(impl, op)] = stats
        finally:
            astra.algorithm.delete([fp, bp])
            astra.data2d.delete([vid, sid, bid, sin_in])
            astra.projector.delete(pid)
    return results
