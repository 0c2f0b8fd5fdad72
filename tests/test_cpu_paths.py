"""The run-time paths of the CPU Joseph kernels (ctbench.engine.cpu.joseph_paths, path_choice).

Every forward and back path this machine's library offers, forced by CTBENCH_CPU_PATH, against
the reference backend (float32 and float64) and the exact-adjoint identity; the measured choice's
cache beside the library: written, reused, and ignored (re-measured) when damaged, foreign or
writable by others; a forced unknown path is a clear error, in-process and in a subprocess.
"""

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d
from ctbench.engine.cpu import library as cpu_library, joseph_paths, path_choice

F64 = torch.float64


@pytest.fixture(scope="module")
def lib():
    return cpu_library.load_cpu_library("joseph")


@pytest.fixture(scope="module")
def known(lib):
    return joseph_paths.known_paths(lib)


def _case(shape, det, n_views=8):
    """A circular cone scan at uneven angles (rays along x, y and diagonals)."""
    angles = torch.tensor([0.0, 0.3, math.pi / 4, 1.2, math.pi / 2, 2.0, 3 * math.pi / 4, 4.0], dtype=F64)[:n_views]
    sid = 60.0 if max(shape[1:]) < 100 else 200.0  # the source outside the larger volume
    traj = circular_trajectory_3d(angles.numel(), sid, 2 * sid, angles=angles, dtype=F64)
    kw = dict(voxel_spacing=(1.0, 1.1, 0.9), detector_spacing=(2.3, 1.9))
    return (Projector(traj, shape, det, backend="cpu", **kw), Projector(traj, shape, det, backend="reference", **kw))


# (14, 24, 22): odd sizes, tails of lane groups, the swapped accumulator unpadded; (6, 64, 64):
# 256-byte rows and 16 KiB planes with more rays than voxels (both accumulators padded); (20, 128, 128):
# 64 KiB planes, so the 1 MiB sub-chunk paths (pairs-z1m, pairs-padded-z1m) split each thread's z-chunk
# (rays crossing a sub-chunk edge set up once per sub-chunk)
CASES = [((14, 24, 22), (37, 21)), ((6, 64, 64), (72, 16)), ((20, 128, 128), (128, 96))]


def test_library_lists_its_paths(known):
    assert "beams" in known["forward"] and "beams-bands" in known["forward"] and "blocked" in known["back"]
    assert len(set(known["forward"])) == len(known["forward"]) and len(set(known["back"])) == len(known["back"])
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx512f" in flags and os.environ.get("CTBENCH_MARCH", "native") == "native":
        # an AVX-512 build also has the AVX2 lanes (forced AVX2 on an AVX-512 CPU)
        assert {"avx512-gather", "avx512-loads", "avx2-gather", "avx2-loads"} <= set(known["forward"])
        # the build's default: the fused lanes (set-up and edge planes in lanes), banded, view tiles beyond the L2
        # and zero-bordered copies of small slabs
        assert known["forward"][0] == "avx512-gather-fused-pad-tiles"
        assert {"avx512-gather-fused-tiles", "avx512-gather-fused-bands", "avx512-gather-fused", "avx512-gather-bands"} <= set(known["forward"])
    if " avx2" in flags:
        # the AVX2 lanes' fused set-up is in every AVX2 (and AVX-512) build
        assert {"avx2-gather-fused", "avx2-gather-fused-bands", "avx2-gather-fused-tiles",
                "avx2-gather-fused-pad-tiles"} <= set(known["forward"])


@pytest.mark.parametrize("shape,det", CASES)
@pytest.mark.slow
def test_every_forward_path_matches_reference(known, monkeypatch, shape, det):
    cpu, ref = _case(shape, det)
    x = torch.rand((2, *shape), generator=torch.Generator().manual_seed(1), dtype=F64)
    want = ref.project(x)
    assert bool((want > 0).any()) and bool((want == 0).any())
    for name in known["forward"]:
        monkeypatch.setenv(path_choice.PATH_ENV, f"forward={name}")
        p64, p32 = cpu.project(x), cpu.project(x.float())
        assert float((p64 - want).abs().max()) <= 1e-12 * float(want.abs().max()), name
        err = (p32.double() - want).abs()
        assert bool((err <= 1e-5 * want.abs() + 1e-6 * float(want.abs().max())).all()), name
        assert joseph_paths.active_paths(cpu_library.load_cpu_library("joseph"))["forward"] == name


@pytest.mark.parametrize("shape,det", CASES)
@pytest.mark.slow
def test_banded_forward_paths_trace_the_same_rays_bitwise(known, monkeypatch, shape, det):
    """The -bands paths change only the order of the detector rows (bands of rows, all views per band;
    the last band short where the rows do not divide): each ray's value is bitwise its view-by-view
    path's, in float32 and float64, at 1 and 2 threads, and for a detector tile."""
    banded = [n for n in known["forward"] if n.endswith("-bands")]
    assert banded and all(n.removesuffix("-bands") in known["forward"] for n in banded)
    cpu, _ = _case(shape, det)
    x = torch.rand((2, *shape), generator=torch.Generator().manual_seed(3), dtype=F64)
    try:
        for name in banded:
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for xx in (x, x.float()):
                    monkeypatch.setenv(path_choice.PATH_ENV, f"forward={name.removesuffix('-bands')}")
                    want = cpu.project(xx)
                    monkeypatch.setenv(path_choice.PATH_ENV, f"forward={name}")
                    got = cpu.project(xx)
                    assert bool((want != 0).any()) and torch.equal(got, want), (name, threads, xx.dtype)
                    # per item the same as in the batch
                    assert torch.equal(cpu.project(xx[1]), got[1]), (name, threads)
    finally:
        torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.mark.parametrize("shape,det", CASES)
@pytest.mark.slow
def test_every_back_path_matches_reference_and_is_the_adjoint(known, monkeypatch, shape, det):
    cpu, ref = _case(shape, det)
    g = torch.Generator().manual_seed(2)
    y = torch.rand((2, *cpu.projection_shape), generator=g, dtype=F64)
    x = torch.rand(shape, generator=g, dtype=F64)
    want = ref.backproject(y)
    for name in known["back"]:
        monkeypatch.setenv(path_choice.PATH_ENV, f"back={name}")
        for threads in (1, 2):
            torch.set_num_threads(threads)
            b64, b32 = cpu.backproject(y), cpu.backproject(y.float())
            assert float((b64 - want).abs().max()) <= 1e-12 * float(want.abs().max()), (name, threads)
            assert float((b32.double() - want).abs().max()) <= 1e-5 * float(want.abs().max()), (name, threads)
            # exact adjoint (float64) and bitwise determinism of repeated and per-item calls
            lhs = float((cpu.project(x) * y[0]).sum())
            rhs = float((x * cpu.backproject(y[0])).sum())
            assert abs(lhs - rhs) <= 1e-12 * abs(lhs), (name, threads)
            assert torch.equal(cpu.backproject(y.float())[1], b32[1])
            assert torch.equal(cpu.backproject(y[1].float()), b32[1])
    torch.set_num_threads(max(1, os.cpu_count() or 1))


def test_unknown_forced_path_is_an_error_listing_the_known_ones(monkeypatch, known):
    cpu, _ = _case(*CASES[0])
    monkeypatch.setenv(path_choice.PATH_ENV, "back=no-such-loop")
    with pytest.raises(ValueError, match="no-such-loop") as e:
        cpu.backproject(torch.zeros(cpu.projection_shape))
    assert all(name in str(e.value) for name in known["back"])
    monkeypatch.setenv(path_choice.PATH_ENV, "sideways=beams")
    with pytest.raises(ValueError, match="OP=NAME"):
        cpu.project(torch.zeros(cpu.volume_shape))


def test_measure_times_every_path(lib, known):
    t = joseph_paths.measure(lib, repeats=1)
    assert set(t) == {"forward", "back"}
    for op in t:
        assert list(t[op]) == joseph_paths.candidates(op, known[op]) and all(0 < s < 5 for s in t[op].values())
    # forward: only the -bands and -tiles paths are ranked (their view-by-view twins trace the same rays,
    # and the measurement's in-cache slab cannot show what the bands pay for; not the -fused-bands /
    # -fused-tiles paths with a -fused-pad-tiles twin: on the slab they run its loop); back: likewise only
    # the banded -bR paths
    twins = {n for n in known["forward"] if n.endswith(("-fused-bands", "-fused-tiles")) and
             n.rsplit("-fused-", 1)[0] + "-fused-pad-tiles" in known["forward"]}
    assert list(t["forward"]) == [n for n in known["forward"] if n.endswith(("-bands", "-tiles")) and n not in twins]
    if "avx512-gather-fused-pad-tiles" in known["forward"]:
        assert "avx512-gather-fused-bands" not in t["forward"] and "avx512-gather-fused-tiles" not in t["forward"]
        assert "avx512-gather-fused-pad-tiles" in t["forward"] and "avx512-gather-bands" in t["forward"]
    # back: not a z-chunk -bR path beside its -rs-bR twin (the same code on the measurement's 1-thread slab)
    back_twins = {n for n in known["back"] if "-rs-" not in n and re.sub(r"-b(\d+)$", r"-rs-b\1", n) in known["back"]}
    assert list(t["back"]) == ([n for n in known["back"] if re.search(r"-b\d+$", n) and n not in back_twins]
                               or known["back"])
    assert path_choice.fastest({"back": {"a": 2.0, "b": 1.0, "c": 1.0}}) == {"back": "b"}
    # within the margin of the first (default) path, the default stays
    assert path_choice.fastest({"back": {"a": 1.0, "b": 0.93}, "forward": {"x": 1.0, "y": 0.85}}) == \
        {"back": "a", "forward": "y"}
    assert path_choice.CHOICE_MARGIN >= 0.1     # load noise moved single measurements by 7-8%


def test_measure_times_each_candidate_under_its_own_name(lib, known, monkeypatch):
    """The candidates are a subset of the library's paths: each timing must be of the path it is filed
    under (the measurement once selected the candidate's position in its own list, so it timed another path
    under that name, and a forward path that runs real scans 2x slower was chosen), and a path that beat
    the default is timed again beside it."""
    real = path_choice.set_library_path
    selected = []

    def spy(lib_, family, op_index, path_index):
        if path_index >= 0:
            selected.append((op_index, path_index))
        return real(lib_, family, op_index, path_index)
    monkeypatch.setattr(path_choice, "set_library_path", spy)
    t = joseph_paths.measure(lib, repeats=1)
    for op, index in joseph_paths.OPS.items():
        ran = [known[op][i] for o, i in selected if o == index]
        names = joseph_paths.candidates(op, known[op])
        assert set(ran) == set(names) == set(t[op])
        # one warm-up and one timed round of every candidate, then, if another path was faster than the
        # default, a rematch of the two (on fresh arrays: a warm-up and REMATCH_ROUNDS timed rounds)
        rematch = {n for n in names if ran.count(n) == 3 + joseph_paths.REMATCH_ROUNDS}
        assert not rematch or (len(rematch) == 2 and names[0] in rematch)
        assert all(ran.count(n) == 2 for n in names if n not in rematch)


def _info(lib, folder):
    return {"source": "jit", "dir": str(folder), "sha256": cpu_library.loaded_libraries()["joseph"]["sha256"]}


@pytest.mark.slow
def test_choice_is_cached_beside_the_library_and_reused(lib, known, tmp_path):
    info = _info(lib, tmp_path)
    choice, source = joseph_paths.measured_choice(lib, info)
    assert source == "measured" and set(choice) == {"forward", "back"}
    files = list(tmp_path.glob("paths-joseph-*.json"))
    assert len(files) == 1 and oct(files[0].stat().st_mode & 0o777) == "0o600"
    doc = json.loads(files[0].read_text())
    assert doc["library_sha256"] == info["sha256"] and doc["paths"] == known and doc["choice"] == choice
    assert choice == path_choice.fastest(doc["timings_s"])
    # reused: a choice planted in the (trusted, matching) file is what comes back, unmeasured
    ranked = joseph_paths.candidates("forward", known["forward"])
    planted = {"forward": ranked[-1], "back": joseph_paths.candidates("back", known["back"])[-1]}
    doc["choice"] = planted
    files[0].write_text(json.dumps(doc))
    assert joseph_paths.measured_choice(lib, info) == (planted, "cache")
    # a cached forward choice the measurement no longer ranks (a view-by-view path, chosen before only
    # the -bands paths were ranked) is measured again and the file replaced
    stale = next(n for n in known["forward"] if n not in ranked)
    doc["choice"] = {**planted, "forward": stale}
    files[0].write_text(json.dumps(doc))
    choice, source = joseph_paths.measured_choice(lib, info)
    assert source == "measured" and choice["forward"] in ranked
    assert json.loads(files[0].read_text())["choice"] == choice


@pytest.mark.parametrize("damage", ["truncated", "not json", "other library", "other cpu", "unknown path",
                                    "other paths", "group writable", "a link"])
@pytest.mark.slow
def test_damaged_or_foreign_choice_is_ignored_and_remeasured(lib, known, tmp_path, damage):
    info = _info(lib, tmp_path)
    joseph_paths.measured_choice(lib, info)
    path = next(tmp_path.glob("paths-joseph-*.json"))
    doc = json.loads(path.read_text())
    text = json.dumps(doc)
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "not json":
        path.write_bytes(b"\x00\xff" * 10)
    elif damage == "other library":
        path.write_text(json.dumps({**doc, "library_sha256": "0" * 64}))
    elif damage == "other cpu":
        path.write_text(json.dumps({**doc, "cpu": "x86_64|sse2"}))
    elif damage == "unknown path":
        path.write_text(json.dumps({**doc, "choice": {"forward": "warp-drive", "back": known["back"][0]}}))
    elif damage == "other paths":
        path.write_text(json.dumps({**doc, "paths": {"forward": ["beams"], "back": ["blocked"]}}))
    elif damage == "group writable":
        os.chmod(path, 0o666)
    elif damage == "a link":
        real = tmp_path / "elsewhere.json"
        real.write_text(text)
        path.unlink()
        path.symlink_to(real)
    choice, problem = path_choice.read_choice(path, "joseph", info["sha256"], cpu_library.cpu_signature(), known)
    assert choice is None and problem
    choice, source = joseph_paths.measured_choice(lib, info)
    assert source == "measured" and all(choice[op] in known[op] for op in known)
    # re-measured and rewritten: a plain private file that is trusted again
    assert not path.is_symlink() and oct(path.stat().st_mode & 0o777) == "0o600"
    assert joseph_paths.measured_choice(lib, info)[1] == "cache"


@pytest.mark.slow
def test_forced_paths_in_a_subprocess(tmp_path, known):
    code = ("import json, torch; from ctbench.engine.cpu import library as cpu_library, joseph_paths as j; "
            "from ctbench import Projector, circular_trajectory_3d; "
            "P = Projector(circular_trajectory_3d(4, 60.0, 120.0), (8, 8, 8), (8, 8), backend='cpu'); "
            "P.project(torch.ones(8, 8, 8)); print(json.dumps(j.describe(cpu_library.load_cpu_library('joseph'))))")
    env = {**os.environ, path_choice.PATH_ENV: f"forward={known['forward'][-1]},back={known['back'][-1]}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["active"] == {"forward": known["forward"][-1], "back": known["back"][-1]}
    env[path_choice.PATH_ENV] = "forward=bogus"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "bogus" in out.stderr and "known forward paths" in out.stderr


def test_a_library_without_paths_runs_its_own_loops():
    """A build from before the paths (a benchmark's baseline library) has none to choose: nothing is set."""
    class OldLibrary:
        pass

    old = OldLibrary()
    assert joseph_paths.known_paths(old) == {}
    assert joseph_paths.apply(old) == {}
    assert joseph_paths.describe(old)["source"] == "no run-time paths in this library"


def test_a_lucky_call_does_not_win_the_rematch():
    """The challenger's figure after the rematch is the larger of its least time and the default's least time
    times the median paired ratio: one fast call (least 0.85 of the default's) with rounds that ran even keeps
    the default; a challenger faster in every round still wins."""
    lucky = joseph_paths.rematch_time(1.0, 0.85, [1.02, 0.99, 0.85, 1.01, 0.98, 1.0])
    assert lucky == pytest.approx(0.995)
    assert path_choice.fastest({"back": {"default": 1.0, "challenger": lucky}}) == {"back": "default"}
    steady = joseph_paths.rematch_time(1.0, 0.70, [0.72, 0.74, 0.71, 0.75, 0.73, 0.72])
    assert steady == pytest.approx(0.725)
    assert path_choice.fastest({"back": {"default": 1.0, "challenger": steady}}) == {"back": "challenger"}
    assert joseph_paths.rematch_time(1.0, 0.9, []) == 0.9


