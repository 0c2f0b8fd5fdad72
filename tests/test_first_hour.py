"""A new user's first hour, in the checkout (issue 48): the command line starts without torch, a missing
optional package is one line naming its extra, samples are found by name, reports are strict JSON,
``ctbench info`` times nothing unless asked, ``Projector.backend`` names the backend that runs, and the
``gui`` extra carries everything the docked widgets import.  The same from an installed wheel, outside the
checkout: tests/test_first_hour_wheel.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ctbench import json_report
from ctbench.cli import main
from ctbench.samples import SAMPLES, describe_samples, sample_data_dir, sample_path

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for an environment without some packages: a sitecustomize that makes their imports fail the way a
# missing package does (ModuleNotFoundError with .name), whatever else is installed.
BLOCKER = textwrap.dedent("""
    import os, sys
    _BLOCK = set(filter(None, os.environ.get("CTBENCH_TEST_BLOCK", "").split(",")))
    class _Missing:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in _BLOCK):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _Missing())
""")


def strict_loads(text: str):
    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "plugins")]))
    env.update(extra)
    return env


def _ctbench(args, tmp_path, block=(), timeout=300, **env):
    pp = _env(**env)
    if block:
        (tmp_path / "blocker").mkdir(exist_ok=True)
        (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
        pp["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "blocker"), pp["PYTHONPATH"]])
        pp["CTBENCH_TEST_BLOCK"] = ",".join(block)
    return subprocess.run([sys.executable, "-m", "ctbench.cli", *args], cwd=tmp_path, env=pp, capture_output=True,
                          text=True, timeout=timeout)


# ------------------------------------------------------------------------------------------- fast start
PROBE = textwrap.dedent("""
    import sys
    from ctbench.cli import main
    try:
        rc = main(sys.argv[1:])
    except SystemExit as e:
        rc = e.code
    heavy = sorted(m for m in ("torch", "ctbench.engine", "ctbench.projector", "scipy") if m in sys.modules)
    print("HEAVY=" + ",".join(heavy), "RC=" + str(rc), file=sys.stderr)
""")


@pytest.mark.parametrize("args", [["--help"], ["recon", "--help"], ["jobs", "--help"], ["demo", "--size", "0"],
                                  ["nonsense"], ["recon"], ["info", "--bogus"]])
def test_help_and_argument_errors_do_not_import_torch(tmp_path, args):
    r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=120)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("HEAVY= RC="), r.stderr[-2000:]       # nothing heavy imported
    assert last.endswith("RC=0" if args[-1] == "--help" else "RC=2"), last
    if args[-1] != "--help":
        assert "Traceback" not in r.stderr and "usage: ctbench" in r.stderr


# ------------------------------------------------------------------------------- missing optional packages
@pytest.mark.parametrize("args, block, extra", [
    (["gui", "--sample", "none"], ["napari"], "gui"),
    (["gui", "--sample", "none"], ["qtpy", "PyQt5"], "gui"),
    (["bridge", "serve", "--port", "0"], ["fastapi", "uvicorn"], "jobs"),
    (["jobs", "list"], ["httpx"], "jobs"),
])
def test_a_missing_extra_is_one_line_naming_it(tmp_path, args, block, extra):
    r = _ctbench(args, tmp_path, block=block, timeout=120,
                 CTBENCH_BRIDGE_STATE_DIR=str(tmp_path / "bridge"), QT_QPA_PLATFORM="offscreen")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f'pip install "ctbench[{extra}]"' in lines[0], lines
    assert lines[0].startswith(f"ctbench {args[0]}: ")


def test_recon_of_a_tiff_scan_without_tifffile_names_the_io_extra(tmp_path):
    (tmp_path / "recon.json").write_text(json.dumps({"input": {"sample": "lab_scan"},
                                                     "output": {"path": str(tmp_path / "out.zarr")}}))
    r = _ctbench(["recon", "recon.json", "--quiet"], tmp_path, block=["tifffile"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert 'pip install "ctbench[io]"' in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out.zarr").exists()


def test_a_missing_module_that_no_extra_brings_is_not_hidden(tmp_path):
    # only optional packages become one line: a module ctbench itself lacks stays a loud error
    r = _ctbench(["samples"], tmp_path, block=["ctbench.samples"])
    assert r.returncode != 0 and "Traceback" in r.stderr and "ModuleNotFoundError" in r.stderr


# ------------------------------------------------------------------------------------------------ samples
def test_samples_lists_every_bundled_sample_with_its_installed_path(tmp_path):
    r = _ctbench(["samples", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in strict_loads(r.stdout)}
    assert set(rows) == set(SAMPLES)
    napari_keys = _napari_sample_keys()
    assert {n for n, row in rows.items() if row["napari"]} == napari_keys
    for name, row in rows.items():
        if SAMPLES[name].entry is None:
            assert row["path"] is None and row["computed"]
        else:
            assert Path(row["path"]).exists() and Path(row["path"]) == sample_path(name)
    assert (Path(rows["lab_scan"]["path"]) / "scan.json").is_file()
    assert Path(rows["htc2022"]["path"]).stat().st_size > 1_000_000
    text = _ctbench(["samples"], tmp_path)
    assert text.returncode == 0 and rows["lab_scan"]["path"] in text.stdout and "selfcal_scan" in text.stdout


def _napari_sample_keys() -> set[str]:
    import yaml

    doc = yaml.safe_load((ROOT / "plugins" / "ctbench_napari" / "napari.yaml").read_text())
    return {s["key"] for s in doc["contributions"]["sample_data"]}


def test_sample_data_is_found_in_the_installed_layout_too(tmp_path, monkeypatch):
    # a wheel puts the files in ctbench/sample_data; a fake package tree of that layout resolves there
    pkg = tmp_path / "site" / "ctbench"
    (pkg / "sample_data" / "lab_scan").mkdir(parents=True)
    (pkg / "sample_data" / "lab_scan" / "scan.json").write_text("{}")
    import ctbench.samples as samples

    monkeypatch.setattr(samples, "__file__", str(pkg / "samples.py"))
    monkeypatch.setattr(samples, "_candidates", lambda: [Path(samples.__file__).resolve().parent / "sample_data"])
    assert samples.sample_path("lab_scan") == pkg / "sample_data" / "lab_scan"
    with pytest.raises(FileNotFoundError, match="htc2022"):
        samples.sample_path("htc2022")      # missing from this installation: said, with the path


def test_a_config_names_a_sample_in_place_of_a_path(tmp_path):
    from ctbench.pipeline.config import load_config, parse_config, save_config

    cfg = parse_config({"input": {"sample": "lab_scan"}})
    assert Path(cfg.input.path) == sample_data_dir() / "lab_scan" and cfg.input.sample == "lab_scan"
    # saved by name (the installed path differs between machines) and loaded again from anywhere
    saved = save_config(cfg, tmp_path / "recon.json")
    doc = json.loads(saved.read_text())
    assert doc["input"]["sample"] == "lab_scan" and "path" not in doc["input"]
    again = load_config(saved)
    assert again.input.path == cfg.input.path
    # a path is still taken relative to the config
    (tmp_path / "c2.json").write_text(json.dumps({"input": {"path": "scan"}}))
    assert load_config(tmp_path / "c2.json").input.path == str(tmp_path / "scan")


@pytest.mark.parametrize("inp, message", [
    ({}, "give 'path'"),
    ({"path": None}, "give 'path'"),
    ({"path": "x", "sample": "lab_scan"}, "not both"),
    ({"sample": "lab-scan"}, "unknown sample 'lab-scan'"),
    ({"sample": "phantom"}, "computed when opened"),
    ({"sample": 3}, "input.sample"),
])
def test_a_bad_input_section_is_explained(inp, message):
    from ctbench.pipeline.config import parse_config

    with pytest.raises(ValueError, match=message) as e:
        parse_config({"input": inp})
    assert "input" in str(e.value)


def test_recon_with_an_unknown_sample_is_one_line(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"input": {"sample": "nope"}}))
    r = _ctbench(["recon", "r.json"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unknown sample 'nope'" in r.stderr and "lab_scan" in r.stderr


# ------------------------------------------------------------------------------------------ strict JSON
def test_strict_json_turns_non_finite_numbers_into_null_with_a_note():
    report = {"a": 1.5, "nan": math.nan, "inf": math.inf, "list": [1.0, -math.inf, [math.nan, 2]],
              "nested": {"x": math.nan, "x_note": "given"}, "tup": (math.inf,), "text": "NaN", "n": None,
              "ok": [1, 2]}
    text = json_report.dumps(report, notes={"nan": "not computed: no reason to"})
    doc = strict_loads(text)
    assert doc["a"] == 1.5 and doc["text"] == "NaN" and doc["n"] is None and doc["ok"] == [1, 2]
    assert doc["nan"] is None and doc["nan_note"] == "not computed: no reason to"
    assert doc["inf"] is None and doc["inf_note"] == "not finite (Infinity)"
    assert doc["list"] == [1.0, None, [None, 2]]
    assert doc["list_note"] == "not finite at [1] (-Infinity), [2][0] (NaN)"
    assert doc["nested"] == {"x": None, "x_note": "given; not finite (NaN)"}
    assert doc["tup"] == [None] and "ok_note" not in doc and "a_note" not in doc
    assert report["nan"] != report["nan"]          # the caller's report is left as it was
    assert json_report.loads(text) == doc
    with pytest.raises(ValueError, match="NaN"):
        json_report.loads('{"a": NaN}')


def test_recon_report_printed_is_strict_json(tmp_path, monkeypatch, capsys):
    """The report `ctbench recon` prints: the orientation readings' sharpness is NaN where it is not
    computed (the mirror reading) and becomes null with the reason."""
    import ctbench.pipeline.cli as pcli

    def fake_run_recon(cfg, **kw):
        return {"input": {"source": cfg.input.path}, "volume": None, "geometry_object": None, "warnings": [],
                "orientation": {"readings": [{"sharpness": 0.13, "split_px": 0.1},
                                             {"sharpness": math.nan, "split_px": math.inf}]},
                "algorithm": {"residuals": [1.0, math.nan]}}

    monkeypatch.setattr(pcli, "run_recon", fake_run_recon)
    (tmp_path / "r.json").write_text(json.dumps({"input": {"sample": "lab_scan"}}))
    for json_flag in ([], ["--json"]):
        assert main(["recon", str(tmp_path / "r.json"), "--quiet", *json_flag]) == 0
        doc = strict_loads(capsys.readouterr().out.strip().splitlines()[-1])
        second = doc["orientation"]["readings"][1]
        assert second["sharpness"] is None and second["sharpness_note"].startswith("not computed: ")
        assert second["split_px"] is None and second["split_px_note"].startswith("not computed: ")
        assert doc["orientation"]["readings"][0] == {"sharpness": 0.13, "split_px": 0.1}
        assert doc["algorithm"]["residuals"] == [1.0, None] and "[1] (NaN)" in doc["algorithm"]["residuals_note"]
        assert "volume" not in doc and (doc.get("event") == "report") == bool(json_flag)


@pytest.mark.slow
def test_the_streamed_recon_writes_its_report_into_the_outputs_as_strict_json(tmp_path, monkeypatch):
    """A real streamed recon of the bundled sample to OME-Zarr and TIFF, its report carrying a NaN residual
    and an infinite split (what a diverging solver or a reading without pairs gives): the report stored in
    the OME-Zarr's zarr.json and the TIFF's ctbench metadata is strict JSON, null with a note in their places."""
    import tifffile
    from ctbench.pipeline import parse_config, run_recon
    from ctbench.pipeline import streamed

    real = streamed.StreamedRecon._report

    def with_non_finite(self, *a, **kw):
        report = real(self, *a, **kw)
        report["algorithm"] = dict(report["algorithm"], residuals=[1.0, math.nan])
        report["centre"] = dict(report["centre"] or {}, split_px=math.inf)
        return report

    monkeypatch.setattr(streamed.StreamedRecon, "_report", with_non_finite)
    for out in ("v.ome.zarr", "v.tif"):
        rep = run_recon(parse_config({"input": {"sample": "lab_scan"}, "output": {"path": str(tmp_path / out)}}),
                        return_volume=False)
        assert math.isnan(rep["algorithm"]["residuals"][1])     # the Python report keeps its numbers
        if out.endswith(".ome.zarr"):
            doc = strict_loads((tmp_path / out / "zarr.json").read_text())["attributes"]["ctbench"]["recon"]
            assert doc["centre"]["split_px"] is None and doc["centre"]["split_px_note"] == "not finite (Infinity)"
            algo = doc["algorithm"]
        else:
            with tifffile.TiffFile(tmp_path / out) as tif:
                algo = strict_loads(tif.imagej_metadata["ctbench"])["recon"]
        assert algo["residuals"] == [1.0, None] and algo["residuals_note"] == "not finite at [1] (NaN)"


def test_job_events_are_strict_json(tmp_path):
    from ctbench.jobs.events import EventWriter, read_events, to_workflow_event

    w = EventWriter(tmp_path / "events.jsonl")
    w.write("progress", iteration=1, n_iter=2, residual=math.nan, elapsed=0.1, eta=math.inf)
    w.close()
    line = (tmp_path / "events.jsonl").read_text().splitlines()[0]
    ev = strict_loads(line)
    assert ev["residual"] is None and ev["residual_note"] == "not finite (NaN)" and ev["eta"] is None
    assert read_events(tmp_path / "events.jsonl")[0]["seq"] == 0
    fin = {"type": "finished", "residuals": [1.0, None], "n_iter": 2, "stopped": "completed", "elapsed": 1.0,
           "request": {"algorithm": "sirt", "params": {"n_iter": 2}}, "metadata": {"voxel_spacing": [1, 1, 1],
                                                                                  "origin": [0, 0, 0]}}
    res = to_workflow_event(fin).residuals
    assert res[0] == 1.0 and math.isnan(res[1])      # the widget's plot gets its NaN back


# ------------------------------------------------------------------------------------------ ctbench info
def test_info_times_no_kernel_path_unless_asked(monkeypatch, capsys):
    from ctbench.engine.cpu import joseph_paths as cpu_joseph_paths, path_cache as cpu_path_cache

    calls = []

    def fake_measure(lib, *a, **k):
        calls.append(1)
        return {op: {names[0]: 1.0} for op, names in cpu_joseph_paths.known_paths(lib).items()}

    # nothing cached anywhere, and the measurement recorded instead of run
    monkeypatch.setattr(cpu_path_cache, "_lookup", lambda *a, **k: (None, None, "", "no cache in this test"))
    monkeypatch.setattr(cpu_joseph_paths, "measure", fake_measure)
    monkeypatch.setattr(cpu_joseph_paths, "_STATE", {})
    monkeypatch.delenv("CTBENCH_CPU_PATH", raising=False)
    assert main(["info"]) == 0
    info = strict_loads(capsys.readouterr().out)
    assert info["cpu_backend"] == "ok" and calls == []
    paths = info["cpu_paths"]
    assert paths["measured"] is None and paths["source"].startswith("not measured yet")
    assert set(paths["known"]) >= {"forward", "back"}
    assert main(["info", "--measure-paths"]) == 0
    info = strict_loads(capsys.readouterr().out)
    assert calls == [1] and info["cpu_paths"]["source"].startswith("measured")
    assert set(info["cpu_paths"]["active"]) == set(paths["known"])


# ------------------------------------------------------------------------------------- Projector.backend
def test_projector_backend_names_the_backend_that_runs():
    import ctbench
    from ctbench import circular_trajectory_3d
    from ctbench.compat import Projector as DiffctProjector
    from ctbench.engine import get_backend

    traj = circular_trajectory_3d(6, 80.0, 128.0)
    p = ctbench.Projector(traj, (8, 8, 8), (12, 10))
    assert p.backend == "cpu"                               # not diffct's label 'torch'
    assert p._executor(torch.device("cpu")).backend is get_backend("cpu")
    sino = p.project(torch.ones(8, 8, 8))
    assert p.backend == "cpu" and p.model == "joseph"
    ref = ctbench.Projector(traj, (8, 8, 8), (12, 10), backend="reference")
    assert ref.backend == "reference"
    torch.testing.assert_close(ref.project(torch.ones(8, 8, 8)), sino, rtol=1e-4, atol=1e-4)
    cells = ctbench.Projector(traj, (8, 8, 8), (12, 10), backend="torch")
    assert cells.backend == "torch" and cells.model == "cells"   # diffct's model, asked for by its name
    assert ctbench.Projector(traj, (8, 8, 8), (12, 10), devices=["cpu", "cpu"]).backend == "cpu"
    # the diffct face keeps diffct's label ("auto" is diffct's portable backend off CUDA)
    assert DiffctProjector(traj, (8, 8, 8), (12, 10)).backend == ("numba" if torch.cuda.is_available() else "torch")


# ------------------------------------------------------------------------------------------------ extras
def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _closure(requirements: list[str], extras: dict[str, list[str]]) -> set[str]:
    """Canonical names of every distribution ``requirements`` install: ctbench's own extras expanded from
    pyproject, the others from their installed metadata (markers evaluated here)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen, todo = set(), [(r, "") for r in requirements]
    while todo:
        text, extra = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name == "ctbench":
            for e in req.extras:
                todo += [(r, "") for r in extras[e]]
            continue
        key = (name, tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            reqs = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [(r, e) for r in reqs for e in ("", *req.extras)]
    return {n for n, _ in seen}


def test_the_gui_extra_carries_every_package_the_docked_widgets_import(tmp_path):
    """Every third-party package the plugin's modules import, directly or through ctbench (function-level
    imports too: grimp), is installed by ``pip install "ctbench[gui]"``: httpx for the Jobs panel, the readers
    for Scan import, ..."""
    grimp = pytest.importorskip("grimp", reason="import-linter (dev extra) is not installed")
    from importlib import metadata

    from packaging.utils import canonicalize_name

    runner = textwrap.dedent("""
        import json, sys, grimp
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
        g = grimp.build_graph("ctbench_napari", "ctbench", include_external_packages=True, cache_dir=None)
        # everything the plugin's modules import, directly or not (upstream, in grimp's words)
        print(json.dumps(sorted({m.split(".")[0] for m in g.find_upstream_modules("ctbench_napari", as_package=True)})))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "plugins")]))
    r = subprocess.run([sys.executable, "-c", runner], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    imported = {m for m in json.loads(r.stdout) if m not in sys.stdlib_module_names
                and m not in ("ctbench", "ctbench_napari", "__future__")}
    assert "httpx" in imported and "napari" in imported          # the graph reaches the Jobs panel and napari
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    installs = _closure(project["dependencies"] + ["ctbench[gui]"], extras)
    owners = metadata.packages_distributions()
    # packages that are optional by design inside a docked widget's chain: CUDA, and diffct's compat face
    optional = {"cupy", "cupy_backends", "numba", "diffct", "cuda", "nvidia"}
    missing = {}
    for m in sorted(imported - optional):
        dists = {canonicalize_name(d) for d in owners.get(m, [])}
        assert dists, f"{m} is imported by the plugin's modules but is not installed here"
        if not dists & installs:
            missing[m] = sorted(dists)
    assert not missing, f'pip install "ctbench[gui]" does not install {missing}'


def _extra_names(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """The distributions an extra names, ctbench's own extras in it expanded."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    names = set()
    for r in extras[extra]:
        req = Requirement(r)
        if canonicalize_name(req.name) == "ctbench":
            for e in req.extras:
                names |= _extra_names(e, extras)
        else:
            names.add(canonicalize_name(req.name))
    return names


def test_every_extra_named_in_a_message_installs_that_package():
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from ctbench.extras import EXTRA_OF

    extras = _pyproject()["project"]["optional-dependencies"]
    # the Qt bindings come through napari's own extras, starlette and superqt through fastapi and napari
    through = {"PyQt5": ("napari", "pyqt5"), "PyQt6": ("napari", "pyqt6"), "PySide6": ("napari", "pyside6"),
               "starlette": ("fastapi", None), "superqt": ("napari", None)}
    dist_of = {"cupy": "cupy-cuda12x", "cupy_backends": "cupy-cuda12x"}
    for module, extra in EXTRA_OF.items():
        assert extra in extras, f"{module}: extra {extra!r} is not in pyproject.toml"
        names = _extra_names(extra, extras)
        if module in through:
            parent, napari_extra = through[module]
            assert parent in names, (module, extra)
            if napari_extra:
                assert any(canonicalize_name(Requirement(r).name) == "napari" and napari_extra in Requirement(r).extras
                           for r in extras[extra]), (module, extra)
            continue
        assert dist_of.get(module, canonicalize_name(module)) in names, \
            f"the message says {module} comes with {extra!r}, but that extra does not install it"
    for extra in ("gui", "gui-qt6", "gui-pyside6"):
        assert _extra_names("gui-base", extras) <= _extra_names(extra, extras)
    assert _extra_names("io", extras) | _extra_names("jobs", extras) <= _extra_names("gui", extras)


# ------------------------------------------------------------------------------------- a clean checkout
def test_a_test_that_writes_into_the_checkout_is_named_and_fails_ci(tmp_path):
    """tests/conftest.py compares git status before and after the session: a checkout with this conftest
    and one test that rewrites a tracked file and leaves a new one."""
    import shutil

    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", repo / "tests" / "conftest.py")
    (repo / "docs.png").write_text("old")
    (repo / ".gitignore").write_text("__pycache__/\n")
    (repo / "tests" / "test_dirty.py").write_text(textwrap.dedent("""
        from pathlib import Path
        ROOT = Path(__file__).resolve().parents[1]
        def test_rewrites_a_tracked_file():
            (ROOT / "docs.png").write_text("new")
            (ROOT / "left_behind.txt").write_text("x")
    """))
    run = lambda *a: subprocess.run([git, "-c", "user.email=t@example.org", "-c", "user.name=t", *a], cwd=repo,
                                    check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("add", "-A")
    run("commit", "-qm", "start")

    def pytest_run(**env):
        e = {k: v for k, v in os.environ.items() if k != "CTBENCH_TREE_MUST_STAY_CLEAN"} | env
        e["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"   # the inner run needs none of napari's or Qt's plugins
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=repo,
                              env=e, capture_output=True, text=True, timeout=300)

    r = pytest_run()
    assert r.returncode == 0 and "the tests changed the checkout" in r.stdout, r.stdout[-2000:]
    assert "docs.png" in r.stdout and "left_behind.txt" in r.stdout
    run("checkout", "docs.png")
    (repo / "left_behind.txt").unlink()
    r = pytest_run(CTBENCH_TREE_MUST_STAY_CLEAN="1")
    assert r.returncode == 1 and "docs.png" in r.stdout, r.stdout[-2000:]
    run("checkout", "docs.png")
    (repo / "left_behind.txt").unlink()
    (repo / "tests" / "test_dirty.py").write_text("def test_clean():\n    pass\n")
    run("commit", "-qam", "clean test")
    r = pytest_run(CTBENCH_TREE_MUST_STAY_CLEAN="1")
    assert r.returncode == 0 and "changed the checkout" not in r.stdout, r.stdout[-2000:]
