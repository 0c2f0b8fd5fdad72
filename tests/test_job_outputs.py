"""Job outputs reserved at submit and results bound to their job, against a real bridge on 127.0.0.1
(issue 20, finding 3)."""

from __future__ import annotations

import io
import tarfile

import pytest

from jobs_support import http_client, make_dataset, running_bridge, wait_for


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    with running_bridge(tmp_path_factory.mktemp("outbridge"), "--max-jobs", "2") as b:
        make_dataset(b.state_dir / "data" / "scan.zarr", n=12, n_views=12)
        yield b


@pytest.fixture(scope="module")
def http(bridge):
    with http_client(bridge) as c:
        yield c


def _spec(output):
    return {"request": {"algorithm": "fbp"}, "dataset": "scan.zarr", "output": output, "threads_per_rank": 1}


def _ended(http, job_id, timeout=240.0):
    return wait_for(lambda: (s := http.get(f"/jobs/{job_id}").json())["state"] in
                    ("succeeded", "failed", "cancelled") and s, timeout, f"job {job_id} to end", poll=0.2)


@pytest.mark.slow
def test_a_second_job_on_the_same_output_is_refused_while_the_first_is_active(http):
    a = http.post("/jobs", json=_spec("same.zarr"))
    assert a.status_code == 201, a.text
    a = a.json()
    assert a["output"].endswith("/data/same.zarr")
    b = http.post("/jobs", json=_spec("same.zarr"))
    assert b.status_code == 409 and a["id"] in b.json()["detail"], b.text
    # spelled another way (a "./" and a folder that leads back): the same resolved path, the same refusal
    assert http.post("/jobs", json=_spec("./sub/../same.zarr")).status_code == 409
    http.post(f"/jobs/{a['id']}/cancel", params={"wait": 60})
    assert _ended(http, a["id"])["state"] == "cancelled"
    # the reservation ends with the job: the path (still absent) may be named again
    c = http.post("/jobs", json=_spec("same.zarr"))
    assert c.status_code == 201, c.text
    http.post(f"/jobs/{c.json()['id']}/cancel", params={"wait": 60})


@pytest.mark.slow
def test_a_folder_created_at_the_output_after_submit_is_never_deleted(bridge, http):
    job = http.post("/jobs", json=_spec("theirs.zarr")).json()
    folder = bridge.state_dir / "data" / "theirs.zarr"
    folder.mkdir()                                   # someone else's, created after the submit
    (folder / "notes.txt").write_text("not a job result")
    end = _ended(http, job["id"])
    assert end["state"] == "failed" and "someone else" in end["reason"], end
    assert (folder / "notes.txt").read_text() == "not a job result"
    assert sorted(p.name for p in folder.parent.iterdir() if p.name.startswith("theirs")) == ["theirs.zarr"]


@pytest.mark.slow
def test_result_is_served_only_for_the_job_that_wrote_it(bridge, http):
    first = http.post("/jobs", json=_spec("shared.zarr")).json()
    assert _ended(http, first["id"])["state"] == "succeeded"
    r = http.get(f"/jobs/{first['id']}/result")
    assert r.status_code == 200
    names = tarfile.open(fileobj=io.BytesIO(r.content)).getnames()
    assert "result.zarr/zarr.json" in names and "result.zarr/volume/ctbench-chunk-crc32c" in names
    assert http.delete("/data/shared.zarr").status_code == 204
    second = http.post("/jobs", json=_spec("shared.zarr")).json()
    assert _ended(http, second["id"])["state"] == "succeeded"
    stale = http.get(f"/jobs/{first['id']}/result")
    assert stale.status_code == 410 and second["id"] in stale.json()["detail"], stale.text
    assert http.get(f"/jobs/{second['id']}/result").status_code == 200


def test_an_output_inside_the_dataset_or_existing_is_refused_at_submit(bridge, http):
    r = http.post("/jobs", json=_spec("scan.zarr/volume/out.zarr"))
    assert r.status_code == 422 and "inside the input" in r.json()["detail"], r.text
    (bridge.state_dir / "data" / "exists.zarr").mkdir()
    r = http.post("/jobs", json=_spec("exists.zarr"))
    assert r.status_code == 422 and "exists" in r.json()["detail"], r.text
