"""Ranks built with different configurations fail together at construction, naming the field and the ranks.

Real torchrun ranks with Gloo: on rank 1 only, one of sid, n_views, detector
shape, detector spacing, volume grid, voxel spacing, partition or dtype
differs; before the check every rank exited 0 with wrong results (views mode).
The comparison itself (which field, which ranks) is also tested in-process
on gathered hash tables.
"""

from __future__ import annotations

import json

import pytest
import torch

from test_distributed import SCRIPTS, torchrun

from ctbench import Projector, circular_trajectory_3d
from ctbench.distributed.fingerprint import FIELDS, config_hashes, mismatch_message

# The field the check names for each perturbation (sid moves the sources; the detector centres stay at sdd).
NAMED = {"sid": "source", "n_views": "n_views", "detector_shape": "detector_shape",
         "detector_spacing": "detector_spacing", "volume_shape": "volume_shape", "voxel_spacing": "voxel_spacing",
         "partition": "partition", "dtype": "dtype"}


@pytest.mark.distributed
def test_mismatched_ranks_all_raise_naming_the_field_and_the_ranks(tmp_path):
    proc = torchrun(2, SCRIPTS / "mismatched_config.py", tmp_path, timeout=150)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for field, name in NAMED.items():
        for r, got in enumerate(ranks):
            msg = got[field]
            assert msg.startswith("ConfigurationMismatchError"), (field, r, msg)
            assert f"rank {r}:" in msg and f"{name} (" in msg and "differs from rank 0 on ranks [1]" in msg, msg
        # Every rank names the same fields.
        assert ranks[0][field].split(":", 2)[2] == ranks[1][field].split(":", 2)[2]
    assert ranks[0]["none"].startswith("ok") and ranks[0]["none"] == ranks[1]["none"]


def _projector(**kw):
    p = Projector(circular_trajectory_3d(5, 40.0, 80.0), (4, 6, 6), (6, 4), **kw)
    p.partition, p.partition_grid = "views", (3, 1)
    return p


def test_the_message_names_every_differing_field_and_rank():
    a = config_hashes(_projector())
    b = config_hashes(_projector(detector_spacing=2.0))
    assert mismatch_message(torch.stack([a, a, a])) is None
    msg = mismatch_message(torch.stack([a, b, a, b]))
    assert "detector_spacing (detector pixel spacing) differs from rank 0 on ranks [1, 3]" in msg
    assert sum(f"{name} (" in msg for name, _ in FIELDS) == 1
    p = _projector()
    p.trajectory.source[0, 1] += 1e-3   # one coordinate of one view
    msg = mismatch_message(torch.stack([a, config_hashes(p)]))
    assert "source (" in msg and sum(f"{name} (" in msg for name, _ in FIELDS) == 1
