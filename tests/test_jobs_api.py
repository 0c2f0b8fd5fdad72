"""The bridge's HTTP API against a real bridge process on loopback: auth, paths, limits, validation, schema."""

from __future__ import annotations

import os

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, settings  # noqa: F401

from jobs_support import http_client, make_dataset, running_bridge

LIMIT = 4096   # --max-upload of this bridge


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    with running_bridge(tmp_path_factory.mktemp("apibridge"), "--max-upload", "4 KiB") as b:
        yield b


@pytest.fixture(scope="module")
def http(bridge):
    with http_client(bridge, timeout=30) as c:
        yield c


def _everything_under(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.slow
def test_token_file_is_user_only_and_every_endpoint_needs_the_token(bridge):
    assert os.stat(bridge.state_dir / "token").st_mode & 0o777 == 0o600
    data = bridge.state_dir / "data"
    before = _everything_under(data)
    calls = [("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/jobs/abc"), ("GET", "/jobs/abc/events"),
             ("POST", "/jobs/abc/cancel"), ("DELETE", "/jobs/abc"), ("GET", "/jobs/abc/result"),
             ("GET", "/jobs/abc/logs"), ("PUT", "/data/x.bin"), ("GET", "/data/x.bin")]
    with httpx.Client(base_url=bridge.url, trust_env=False) as c:
        for method, path in calls:
            assert c.request(method, path, content=b"abc").status_code == 401, (method, path)
            r = c.request(method, path, content=b"abc", headers={"Authorization": "Bearer not-the-token"})
            assert r.status_code == 403, (method, path)
        assert c.get("/health").status_code == 200
    assert _everything_under(data) == before


def test_paths_that_escape_the_data_directory_are_refused(bridge, http, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (bridge.state_dir / "data" / "link").symlink_to(outside)
    for path in ("/data/%2e%2e/escape.txt", "/data/..%2Fescape.txt", "/data/link/x.txt", "/data/%2Fetc%2Fx"):
        assert http.put(path, content=b"x").status_code == 403, path
    assert http.delete("/data/%2e%2e/token").status_code == 403
    assert http.delete("/data/link/..%2F..%2Ftoken").status_code == 403
    assert (bridge.state_dir / "token").exists()
    assert http.get("/data/%2e%2e/token").status_code == 403          # the token is not served
    assert not (bridge.state_dir / "escape.txt").exists()
    assert list(outside.iterdir()) == []
    r = http.post("/jobs", json={"request": {"algorithm": "fbp"}, "dataset": "../jobs.db"})
    assert r.status_code == 403


def test_oversized_uploads_are_413_and_leave_nothing(bridge, http):
    data = bridge.state_dir / "data"
    before = _everything_under(data)
    assert http.put("/data/big.bin", content=b"\0" * (LIMIT + 1)).status_code == 413
    assert _everything_under(data) == before
    # Chunked: a first chunk is kept as .part; a second that crosses the limit removes it.
    assert http.put("/data/big.bin", params={"offset": 0, "final": False}, content=b"a" * 3000).status_code == 200
    r = http.put("/data/big.bin", params={"offset": 3000, "final": True}, content=b"b" * 3000)
    assert r.status_code == 413
    assert _everything_under(data) == before


def test_chunked_upload_and_download_round_trip_a_dataset(bridge, tmp_path):
    from ctbench.workbench.dataset import load_dataset

    make_dataset(tmp_path / "small.zarr", n=4, n_views=3)
    with bridge.client() as c:
        remote = c.upload_dataset(tmp_path / "small.zarr", "up/small.zarr", chunk=1000)
        c.download(remote, tmp_path / "back.zarr")
    a, b = load_dataset(tmp_path / "small.zarr"), load_dataset(tmp_path / "back.zarr")
    np.testing.assert_array_equal(a.sinogram, b.sinogram)
    assert a.geometry.to_dict() == b.geometry.to_dict()
    with bridge.client() as c:
        c.delete_data("up/small.zarr")
    assert not (bridge.state_dir / "data" / "up" / "small.zarr").exists()


@pytest.mark.parametrize("spec, field", [
    ({"request": {"algorithm": "cgls", "params": {"n_iter": 0}}, "dataset": "x"}, "n_iter"),
    ({"request": {"algorithm": "cgls"}, "dataset": "x", "nproc": "many"}, "nproc"),
    ({"request": {"algorithm": "cgls"}, "dataset": "x", "nprocs": 2}, "nprocs"),
    ({"request": {"algorithm": "art"}, "dataset": "x"}, "algorithm"),
    ({"request": {"algorithm": "cgls"}}, "dataset"),
    ({"request": {"algorithm": "cgls"}, "dataset": "x", "partition": "hybrid", "nproc": 4}, "partition_grid"),
])
def test_malformed_spec_is_422_naming_the_field(http, spec, field):
    n = len(http.get("/jobs").json())
    r = http.post("/jobs", json=spec)
    assert r.status_code == 422
    assert field in r.json()["detail"], r.json()
    assert len(http.get("/jobs").json()) == n


def test_openapi_schema_is_served_with_every_endpoint(bridge):
    doc = httpx.get(bridge.url + "/openapi.json", trust_env=False).json()
    ops = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert {("POST", "/jobs"), ("GET", "/jobs"), ("GET", "/jobs/{job_id}"), ("GET", "/jobs/{job_id}/events"),
            ("GET", "/jobs/{job_id}/events/stream"), ("GET", "/jobs/{job_id}/logs"),
            ("POST", "/jobs/{job_id}/cancel"), ("GET", "/jobs/{job_id}/result"), ("DELETE", "/jobs/{job_id}"),
            ("PUT", "/data/{path}"), ("GET", "/data/{path}"), ("DELETE", "/data/{path}")} <= ops
    assert "JobSpec" in doc["components"]["schemas"]


@pytest.mark.slow
def test_every_endpoint_with_generated_input_never_answers_5xx(bridge):
    """Schemathesis generates requests for every operation of the served schema; none may be a server error."""
    from hypothesis import given

    schema = schemathesis.openapi.from_url(bridge.url + "/openapi.json")
    seen = []
    for result in schema.get_all_operations():
        op = result.ok()
        seen.append(op.label)

        @given(case=op.as_strategy())
        @settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case):
            q = case.query or {}
            for key in ("timeout", "wait"):          # long-polls: keep the generated waits short
                if key in q:
                    try:
                        q[key] = min(float(q[key]), 0.2)
                    except (TypeError, ValueError):
                        pass
            r = case.call(headers={"Authorization": f"Bearer {bridge.token}"}, timeout=30)
            assert r.status_code < 500, (case.operation.label, r.status_code, r.text[:500])

        check()
    assert len(seen) >= 12, seen
