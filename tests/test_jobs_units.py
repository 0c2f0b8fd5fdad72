"""Pieces of the job bridge on their own: the event index, the job table's transitions, the spec."""

from __future__ import annotations

import threading

import pytest
from pydantic import ValidationError

from ctbench.jobs.events import EventIndex, EventWriter, read_events
from ctbench.jobs.spec import JobSpec
from ctbench.jobs.store import JobStore


def test_event_index_reads_from_any_offset_and_never_half_a_line(tmp_path):
    path = tmp_path / "events.jsonl"
    w, idx = EventWriter(path), EventIndex(path)
    assert idx.read() == []
    for i in range(5):
        w.write("progress", iteration=i + 1)
    assert [e["seq"] for e in idx.read()] == [0, 1, 2, 3, 4]
    assert [e["seq"] for e in idx.read(2)] == [3, 4]
    assert [e["seq"] for e in idx.read(0, limit=2)] == [1, 2]
    with open(path, "ab") as f:           # a line being written: not an event yet
        f.write(b'{"seq":5,"type":"fin')
    assert [e["seq"] for e in idx.read(3)] == [4]
    with open(path, "ab") as f:
        f.write(b'ished"}\n')
    assert [e["seq"] for e in idx.read(3)] == [4, 5]
    assert idx.last_of("progress")["iteration"] == 5
    assert read_events(path, 1) == idx.read(1)
    assert EventWriter(path).seq == 6     # a resumed job continues the numbering


def test_a_job_is_claimed_once_and_a_finished_job_never_changes(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    ids = [store.add(store.new_id(), {"n": i}, tmp_path / str(i)).id for i in range(40)]
    claimed, lock = [], threading.Lock()

    def claimer():
        own = JobStore(tmp_path / "jobs.db")   # its own connection, as a second process would have
        while (rec := own.claim_next()) is not None:
            with lock:
                claimed.append(rec.id)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(ids)                  # every job once, none twice
    assert store.finish(ids[0], "succeeded")
    assert not store.finish(ids[0], "failed")              # terminal states are final
    assert store.request_cancel(ids[0]).state == "succeeded"
    assert store.get(ids[0]).state == "succeeded"
    q = store.add(store.new_id(), {}, tmp_path / "q")
    assert store.request_cancel(q.id).state == "cancelled"  # a queued job is cancelled at once
    assert store.claim_next() is None
    assert not store.delete(ids[1]) and store.delete(ids[0])  # only finished jobs are deleted


@pytest.mark.parametrize("kw, field", [
    ({"nproc": 0}, "nproc"),
    ({"devices": ["gpu0", "cuda:1"], "nproc": 2}, "devices"),
    ({"devices": ["cuda:0"], "nproc": 2}, "devices"),
    ({"partition": "hybrid", "nproc": 4, "partition_grid": (3, 2)}, "partition_grid"),
    ({"memory_budget": "lots"}, "memory_budget"),
    ({"checkpoint_every": 2, "request": {"algorithm": "sirt"}}, "checkpoint_every"),
    ({"request": {"algorithm": "tv", "params": {"lam": -1}}}, "lam"),
])
def test_spec_errors_name_the_field(kw, field):
    base = {"request": {"algorithm": "cgls"}, "dataset": "x.zarr"}
    with pytest.raises(ValidationError, match=field):
        JobSpec(**{**base, **kw})


def test_spec_fills_algorithm_defaults():
    s = JobSpec(request={"algorithm": "sirt"}, dataset="x.zarr")
    assert s.request.params == {"n_iter": 50, "nonneg": True}
