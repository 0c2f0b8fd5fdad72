"""Issue 20 finding 4 against a real bridge process on 127.0.0.1: a planted ``PATH.part`` link cannot redirect
``PUT /data/PATH`` (with or without ``?offset=N``), and ``DELETE /data/alias`` removes the link, not the
folder it points at."""

from __future__ import annotations

import pytest

from jobs_support import http_client, running_bridge


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    with running_bridge(tmp_path_factory.mktemp("databridge"), "--max-upload", "64 KiB") as b:
        yield b


@pytest.fixture(scope="module")
def http(bridge):
    with http_client(bridge) as c:
        yield c


@pytest.mark.slow
def test_a_planted_part_link_does_not_redirect_a_put(bridge, http, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    data = bridge.state_dir / "data"
    (data / "up.bin.part").symlink_to(victim)
    r = http.put("/data/up.bin", content=b"uploaded")
    assert r.status_code == 200, r.text
    assert victim.read_bytes() == b"precious"
    assert (data / "up.bin").read_bytes() == b"uploaded" and not (data / "up.bin").is_symlink()
    assert not (data / "up.bin.part").exists() and not (data / "up.bin.part").is_symlink()


def test_a_planted_part_link_does_not_take_an_appended_chunk(bridge, http, tmp_path):
    victim = tmp_path / "victim.log"
    victim.write_bytes(b"12345")
    data = bridge.state_dir / "data"
    (data / "sub").mkdir()
    (data / "sub" / "f.bin.part").symlink_to(victim)
    r = http.put("/data/sub/f.bin", params={"offset": 5, "final": True}, content=b"appended")
    assert r.status_code == 409, r.text
    assert victim.read_bytes() == b"12345"
    assert not (data / "sub" / "f.bin").exists()


def test_a_chunked_upload_still_works(bridge, http):
    data = bridge.state_dir / "data"
    assert http.put("/data/c/x.bin", params={"offset": 0, "final": False}, content=b"abc").status_code == 200
    assert (data / "c" / "x.bin.part").read_bytes() == b"abc"
    assert http.put("/data/c/x.bin", params={"offset": 3, "final": True}, content=b"def").status_code == 200
    assert (data / "c" / "x.bin").read_bytes() == b"abcdef" and not (data / "c" / "x.bin.part").exists()
    r = http.put("/data/c/y.bin", params={"offset": 4, "final": True}, content=b"zz")
    assert r.status_code == 409 and "offset" in r.text


def test_a_link_to_a_folder_inside_the_data_directory_is_not_written_through(bridge, http):
    data = bridge.state_dir / "data"
    (data / "real").mkdir()
    (data / "via").symlink_to(data / "real")
    r = http.put("/data/via/new.bin", content=b"x")
    assert r.status_code == 409, r.text
    assert list((data / "real").iterdir()) == []


def test_delete_of_an_alias_removes_only_the_link(bridge, http):
    data = bridge.state_dir / "data"
    folder = data / "results"
    (folder / "deep").mkdir(parents=True)
    (folder / "deep" / "keep.bin").write_bytes(b"keep")
    (data / "alias").symlink_to(folder)
    (data / "file_alias").symlink_to(folder / "deep" / "keep.bin")
    assert http.delete("/data/alias").status_code == 204
    assert http.delete("/data/file_alias").status_code == 204
    assert not (data / "alias").is_symlink() and not (data / "file_alias").is_symlink()
    assert (folder / "deep" / "keep.bin").read_bytes() == b"keep"
    assert http.delete("/data/alias").status_code == 404
    assert http.delete("/data/results").status_code == 204      # a real folder is still deleted whole
    assert not folder.exists()
