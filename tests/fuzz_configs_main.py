"""Property-based fuzz of what a user hands ``ctbench recon``/``calibrate``: configs and trajectory JSON files.

Run as a script in a child process (tests/test_fuzz_configs.py) under an
address-space limit, so that an allocation nobody bounded fails the run
instead of the machine.  Usage::

    python tests/fuzz_configs_main.py WORKDIR N_CONFIGS N_TRAJECTORIES [SEED]

Hostile variants (hypothesis) of a valid config of a tiny real scan folder and
of a valid trajectory JSON: huge, tiny, non-finite and wrong-typed values at
any key, keys deleted or added, values nested 50000 deep, paths that name a
FIFO, a link to ``/dev/zero``, a 4 GiB sparse file, a folder, a missing file or
a hostile trajectory; whole files truncated at any byte.  The property, for
every example, within ``EXAMPLE_S`` seconds:

- the command line returns 0 (a correct result: the outputs exist and the
  trajectory it wrote loads back) or 2 with one line on stderr that starts
  with the command's name and carries none of the signatures of an internal
  error (a traceback, "Unable to allocate", a RecursionError, "math domain
  error", an AttributeError or TypeError of the code itself);
- ``Trajectory.load`` returns a trajectory with finite tensors or raises
  :class:`ctbench.guarded_open.InputError` naming the file.

Prints ``FUZZ OK <n> configs (<r> recon, <c> calibrate), <t> trajectories`` at the end.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import re
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLE_S = 60        # a tiny recon takes ~1 s; the margin is for a loaded machine
# What an error message of the code itself looks like (as opposed to a refusal of the input).
INTERNAL = re.compile(r"Traceback|Unable to allocate|can't allocate|[Rr]ecursion|math domain error|has no attribute|"
                      r"unhashable|not subscriptable|not iterable|positional argument|NoneType|unsupported operand|"
                      r"object is not callable|invalid literal for int|could not convert|cannot convert float")

HUGE = [1e308, -1e308, math.inf, -math.inf, math.nan, 2 ** 63, -(2 ** 63), 10 ** 30, 10 ** 400, 5e-324, -1, 0,
        0.5, 16.9, -0.0]
WRONG = [True, False, None, "", "x", "1e999", "NaN", [], {}, [1, 2, 3], [[1, 2], [3]], {"x": 1}, "a" * 5000]
DEEP = "__DEEP__"                       # replaced by 50000 nested brackets in the JSON text
DEPTH = 50000


class ExampleTimeout(BaseException):
    """An example ran past EXAMPLE_S (a BaseException: no handler of the code under test swallows it)."""


def _alarm(signum, frame):
    raise ExampleTimeout(f"the example ran longer than {EXAMPLE_S} s")


def dumps(doc) -> str:
    text = json.dumps(doc)             # NaN and Infinity as Python's json writes them (other tools do too)
    return text.replace(json.dumps(DEEP), "[" * DEPTH + "]" * DEPTH)


# ------------------------------------------------------------------ the world the examples live in
class World:
    def __init__(self, root: Path):
        from ctbench.geometry import circular_trajectory_3d
        from ctbench.io.selfcal_sample import SelfCalSpec, write_selfcal_sample

        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        spec = SelfCalSpec(n_views=12, detector_u=16, detector_v=12, pitch=4.0, offset_u_px=1.0, roll_deg=0.0,
                           drift_rms_px=0.0)
        self.scan = write_selfcal_sample(root / "scan", spec)
        self.n_views = spec.n_views
        self.out = root / "out"
        self.hostile = root / "hostile"
        self.paths = [str(self.hostile / n) for n in ("fifo.json", "zero.json", "sparse.json", "folder.json",
                                                       "deep.json", "not-json.json", "missing.json", "trajectory.json")]
        self.trajectory = self.hostile / "trajectory.json"   # a valid one, of the scan's number of views
        self.trajectory_doc = circular_trajectory_3d(n_views=self.n_views, sid=300.0, sdd=600.0).to_dict()
        self.reset_outputs()
        self.recon_bases = [self._recon_base(False), self._recon_base(True)]
        self.calibrate_base = {
            "input": {"path": str(self.scan)}, "geometry": {"detector_offset_u_mm": 0.0},
            "calibrate": {"free": ["offset_u"], "levels": [1], "n_outer": [1], "n_inner": 1,
                          "trajectory": str(self.out / "t.json"), "report": str(self.out / "r.json"),
                          "overwrite": True, "bounds": {"offset_u": [-5, 5]}, "smoothness": 0.05}}

    def _recon_base(self, corrections: bool) -> dict:
        doc = {"input": {"path": str(self.scan), "format": "auto"},
               "preprocess": {"bin": 1, "every": 1, "ring_filter": 0, "min_transmission": 1e-4},
               "geometry": {"detector_offset_u_mm": 0.0, "angle_range_deg": 360, "start_angle_deg": 0,
                            "volume_shape": [8, 16, 16]},
               "algorithm": {"name": "fdk", "params": {}},
               "output": {"path": str(self.out / "v.tif"), "overwrite": True},
               "resources": {"memory": "1GB", "threads": 1}}
        if corrections:
            doc["preprocess"].update(zingers={"threshold": 0.5, "size": 3}, rings={"method": "sorting", "size": 5},
                                     beam_hardening={"coefficients": [1.0, 0.05]})
        return doc

    def reset_outputs(self):
        """A fresh output folder and fresh hostile files (an example may name one as an output: a config may)."""
        import shutil

        for d in (self.out, self.hostile):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
        h = self.hostile
        os.mkfifo(h / "fifo.json")
        os.symlink("/dev/zero", h / "zero.json")
        with open(h / "sparse.json", "wb") as f:
            f.truncate(4 << 30)                   # 4 GiB of holes: only a bounded reader survives it
        (h / "folder.json").mkdir()
        (h / "deep.json").write_text("[" * 100000 + "]" * 100000)
        (h / "not-json.json").write_bytes(b"\xff\xfe\x00garbage")
        self.trajectory.write_text(json.dumps(self.trajectory_doc))


# ------------------------------------------------------------------ mutations
def _slots(doc, prefix=()):
    """(container, key) of every value in ``doc`` (the root's keys included)."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        yield doc, k
        if isinstance(v, (dict, list)) and len(prefix) < 6:
            yield from _slots(v, (*prefix, k))


def hostile_value(paths):
    # copies: a later mutation of the same example may write into a list or dict drawn here
    return st.one_of(st.sampled_from(HUGE), st.sampled_from(WRONG).map(copy.deepcopy), st.just(DEEP),
                     st.sampled_from(paths), st.floats(allow_nan=True, allow_infinity=True),
                     # small integers, or ones beyond every bound (a valid but large size is a long run, not hostile)
                     st.integers(-3, 40), st.integers(2 ** 31, 2 ** 70), st.integers(-2 ** 70, -2 ** 31),
                     st.text(max_size=20))


@st.composite
def mutated(draw, base, paths):
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        slots = list(_slots(doc))
        if not slots:
            break
        container, key = draw(st.sampled_from(slots))
        action = draw(st.sampled_from(["replace"] * 4 + ["delete", "add"]))
        if action == "delete" and isinstance(container, dict):
            del container[key]
        elif action == "add" and isinstance(container.get(key) if isinstance(container, dict) else None, dict):
            container[key][draw(st.sampled_from(["bogus", "path", "size", "trajectory", "known_object"]))] = \
                draw(hostile_value(paths))
        else:
            container[key] = draw(hostile_value(paths))
    return doc


# ------------------------------------------------------------------ running and checking
def run_cli(args) -> tuple[int, str]:
    from ctbench.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(args)
    return rc, err.getvalue()


def check_refusal(cmd: str, rc: int, err: str, doc_text: str) -> None:
    where = f"\nconfig: {doc_text[:1500]}\nstderr: {err[-3000:]}"
    assert rc in (0, 2), f"ctbench {cmd} returned {rc}{where}"
    assert not INTERNAL.search(err), f"ctbench {cmd} printed an internal error{where}"
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.startswith(f"ctbench {cmd}: ") and "warning:" not in ln]
        assert len(lines) == 1, f"ctbench {cmd} refused without one clear line{where}"


def check_example(world: World, cmd: str, doc: dict, text: str | None = None) -> int:
    world.reset_outputs()
    cfg = world.root / "config.json"
    text = dumps(doc) if text is None else text
    cfg.write_text(text)
    # --threads 1: a config may ask for 4096 kernel threads, whose stacks alone pass the address-space limit
    args = [cmd, str(cfg)] + (["--quiet", "--memory", "1GB", "--threads", "1"] if cmd == "recon" else [])
    signal.alarm(EXAMPLE_S)
    try:
        rc, err = run_cli(args)
    finally:
        signal.alarm(0)
    check_refusal(cmd, rc, err, text)
    if rc == 0 and cmd == "calibrate":
        from ctbench.geometry import load_trajectory
        cal = doc.get("calibrate") or {}
        t = Path(cal.get("trajectory", "calibrated_trajectory.json"))
        t = t if t.is_absolute() else world.root / t
        load_trajectory(t).validate_finite()
    return rc


def check_trajectory(world: World, text: str) -> None:
    from ctbench.geometry import load_trajectory
    from ctbench.guarded_open import InputError

    p = world.root / "fuzzed-trajectory.json"
    p.write_text(text)
    signal.alarm(EXAMPLE_S)
    try:
        traj = load_trajectory(p)
    except InputError as e:
        assert str(p) in str(e) and not INTERNAL.search(str(e)), f"unclear refusal: {e}\n{text[:1500]}"
        return
    finally:
        signal.alarm(0)
    traj.validate_finite()
    assert traj.n_views == len(traj.source)


def main(argv) -> int:
    root, n_configs, n_traj = Path(argv[1]), int(argv[2]), int(argv[3])
    seed = int(argv[4]) if len(argv) > 4 else 0
    signal.signal(signal.SIGALRM, _alarm)
    # The recon plans within --memory; the calibration within 80% of what the machine says is available: the
    # child runs under an address-space limit, so the machine's answer is made to match it.
    from ctbench.pipeline import budget
    budget.default_budget = lambda: 1 << 30
    world = World(root)
    counts = {"recon": 0, "calibrate": 0, "refused": 0, "ran": 0, "trajectories": 0}
    common = dict(deadline=None, derandomize=seed == 0, database=None,
                  suppress_health_check=list(HealthCheck))

    @settings(max_examples=n_configs // 2, **common)
    @given(st.integers(0, 1).flatmap(lambda i: mutated(world.recon_bases[i], world.paths)))
    def recon_configs(doc):
        rc = check_example(world, "recon", doc)
        counts["recon"] += 1
        counts["ran" if rc == 0 else "refused"] += 1

    @settings(max_examples=n_configs - n_configs // 2, **common)
    @given(mutated(world.calibrate_base, world.paths))
    def calibrate_configs(doc):
        rc = check_example(world, "calibrate", doc)
        counts["calibrate"] += 1
        counts["ran" if rc == 0 else "refused"] += 1

    @settings(max_examples=max(1, n_traj // 4), **common)
    @given(st.sampled_from(["recon", "calibrate"]), st.sampled_from(world.paths), st.booleans())
    def whole_files(cmd, hostile, as_config):
        # a hostile file as the config itself, or as the trajectory/known object a valid config names
        if as_config:
            world.reset_outputs()
            rc, err = run_cli([cmd, hostile])
            check_refusal(cmd, rc, err, f"<the config is {hostile}>")
            assert rc == 2, f"{hostile} accepted as a config"
            return
        doc = copy.deepcopy(world.recon_bases[0] if cmd == "recon" else world.calibrate_base)
        if cmd == "recon":
            doc["geometry"]["trajectory"] = hostile
        else:
            doc["calibrate"]["known_object"] = hostile
        rc = check_example(world, cmd, doc)
        assert rc == 2 or (cmd == "recon" and hostile == str(world.trajectory)), f"{hostile} was accepted"

    @settings(max_examples=n_traj, **common)
    @given(st.one_of(mutated(world.trajectory_doc, world.paths).map(dumps),
                     st.tuples(st.just(json.dumps(world.trajectory_doc)), st.floats(0, 1)).map(
                         lambda t: t[0][:int(len(t[0]) * t[1])])))
    def trajectories(text):
        check_trajectory(world, text)
        counts["trajectories"] += 1

    for prop in (recon_configs, calibrate_configs, whole_files, trajectories):
        prop()
    n = counts["recon"] + counts["calibrate"]
    print(f"FUZZ OK {n} configs ({counts['recon']} recon, {counts['calibrate']} calibrate; {counts['ran']} ran, "
          f"{counts['refused']} refused), {counts['trajectories']} trajectories", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
