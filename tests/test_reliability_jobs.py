"""Job uploads, downloads and fetches leave nothing behind when they fail, and never write through a planted
link (issue 47, "Still open"), against a real bridge process on 127.0.0.1.

Before: a continued upload chunk refused with 409 left ``PATH.part`` behind, a client whose upload failed
after its first chunk left ``PATH.part`` on the bridge, ``download`` wrote through a planted ``DEST.part``
link, ``fetch`` created and removed a fixed ``DEST.tmp-fetch`` and ``upload_file`` opened a FIFO and waited.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from jobs_support import http_client, running_bridge


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    with running_bridge(tmp_path_factory.mktemp("reljobs")) as b:
        yield b


@pytest.fixture(scope="module")
def http(bridge):
    with http_client(bridge) as c:
        yield c


def test_a_continued_chunk_that_cannot_be_written_drops_the_part(bridge, http):
    data = bridge.state_dir / "data"
    assert http.put("/data/up/a.bin", params={"offset": 0, "final": False}, content=b"abc").status_code == 200
    assert (data / "up" / "a.bin.part").exists()
    (data / "up" / "a.bin").mkdir()                             # the final name became a folder meanwhile
    r = http.put("/data/up/a.bin", params={"offset": 3, "final": True}, content=b"def")
    assert r.status_code == 409, r.text
    assert sorted(p.name for p in (data / "up").iterdir()) == ["a.bin"]   # no a.bin.part left behind
    assert http.put("/data/up/b.bin", params={"offset": 0, "final": False}, content=b"abc").status_code == 200
    r = http.put("/data/up/b.bin", params={"offset": 7, "final": True}, content=b"x")      # does not continue it
    assert r.status_code == 409 and "offset" in r.text
    assert not (data / "up" / "b.bin.part").exists()


def test_a_client_upload_that_fails_after_its_first_chunk_leaves_no_part(bridge, tmp_path):
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(3000))
    client = bridge.client()
    real = client._call
    calls = [0]

    def flaky(method, path, **kw):                   # the network drops after the first chunk reached the bridge
        if method == "PUT":
            calls[0] += 1
            if calls[0] == 2:
                raise httpx.ReadTimeout("connection dropped")
        return real(method, path, **kw)
    client._call = flaky
    with pytest.raises(httpx.ReadTimeout):
        client.upload_file(local, "u/big.bin", chunk=1000)
    data = bridge.state_dir / "data"
    assert calls[0] == 2 and sorted(p.name for p in (data / "u").iterdir()) == []
    client._call = real
    client.upload_file(local, "u/big.bin", chunk=1000)             # and a whole upload still works
    assert (data / "u" / "big.bin").read_bytes() == local.read_bytes()


def test_a_fifo_is_not_uploaded_and_does_not_block(bridge, tmp_path):
    os.mkfifo(tmp_path / "pipe")
    code = ("import sys; from ctbench.jobs.client import BridgeClient\n"
            "c = BridgeClient(sys.argv[1], sys.argv[2])\n"
            "try:\n    c.upload_file(sys.argv[3], 'p.bin')\n"
            "except ValueError as e:\n    print('REFUSED', e)\n")
    p = subprocess.run([sys.executable, "-c", code, bridge.url, bridge.token, str(tmp_path / "pipe")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "REFUSED" in p.stdout and "FIFO" in p.stdout, p.stdout + p.stderr


def test_download_never_writes_through_a_planted_part_link(bridge, http, tmp_path):
    assert http.put("/data/d/f.bin", content=b"served").status_code == 200
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    dest = tmp_path / "f.bin"
    os.symlink(victim, tmp_path / "f.bin.part")                  # the name download used to write through
    bridge.client().download("d/f.bin", dest)
    assert dest.read_bytes() == b"served" and victim.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin", "f.bin.part", "victim"]


def test_a_failed_fetch_leaves_no_staging_folder(bridge, tmp_path):
    from ctbench.jobs.client import BridgeError

    with pytest.raises(BridgeError):
        bridge.client().fetch("no-such-job", tmp_path / "res.zarr")
    assert list(tmp_path.iterdir()) == []
