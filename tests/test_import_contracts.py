"""docs/ARCHITECTURE.md's one-way arrows, checked with import-linter (contracts in pyproject.toml), and no
import circles anywhere in ctbench/ (function-level imports included)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="import-linter (dev extra) is not installed")

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


# Runs in a fresh interpreter on a plain copy of ctbench/: the scikit-build-core editable finder maps
# the package onto the repository root too (kernels/ and sample_data/ live there), which would make grimp
# read tests/ and scripts/ as ctbench modules, so the editable finders are dropped first.
RUNNER = """
import sys
src, mode = sys.argv.pop(1), sys.argv.pop(1)
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
sys.path.insert(0, src)
if mode == "lint":
    from importlinter.cli import lint_imports_command
    sys.exit(lint_imports_command())
import json, grimp
g = grimp.build_graph("ctbench", cache_dir=None)
print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))
"""


def _run(src: Path, mode: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", RUNNER, str(src), mode, *args], cwd=src, env=env,
                          capture_output=True, text=True, timeout=600)


def _lint(src: Path) -> subprocess.CompletedProcess:
    if not LINT.exists():
        pytest.skip("lint-imports (import-linter, dev extra) is not installed")
    return _run(src, "lint", "--no-cache", "--config", str(src / "pyproject.toml"))


def test_contracts_are_kept(tmp_path):
    r = _lint(_copy_package(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout and "KEPT" in r.stdout


def _copy_package(tmp_path: Path) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(ROOT / "ctbench", dst / "ctbench", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


@pytest.mark.parametrize("module, line, contract", [
    # an upward arrow: the engine reaching for the solvers
    ("engine/base.py", "from ctbench.solvers import cgls as _up\n", "layers"),
    # ctbench importing the GUI toolkit
    ("storage/base.py", "import napari as _gui\n", "Qt, napari"),
    # the diffct face leaning on the workbench stack
    ("compat/utils.py", "from ctbench.io import readers as _io\n", "diffct face"),
])
def test_an_arrow_against_the_design_breaks_the_build(tmp_path, module, line, contract):
    src = _copy_package(tmp_path)
    target = src / "ctbench" / module
    text = target.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    target.write_text(head + sep + line + rest if sep else line + text)
    r = _lint(src)
    assert r.returncode != 0, r.stdout
    assert "BROKEN" in r.stdout
    broken = r.stdout.split("Broken contracts")[-1]
    assert contract in broken and module.replace("/", ".").removesuffix(".py") in broken


def _cycles(graph) -> list[list[str]]:
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = 0
    for root in sorted(edges):  # iterative Tarjan: strongly connected components of the import graph
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


class _Graph:
    """The import graph as edges (from grimp in a subprocess, or given by a test)."""

    def __init__(self, edges: dict):
        self.e = {m: set(v) for m, v in edges.items()}
        self.modules = set(self.e)

    def find_modules_directly_imported_by(self, m):
        return self.e[m]


def test_no_import_circles_in_ctbench(tmp_path):
    import json

    r = _run(_copy_package(tmp_path), "edges")
    assert r.returncode == 0, r.stderr
    graph = _Graph(json.loads(r.stdout))
    assert "ctbench.compat.operators" in graph.modules and "ctbench.engine.cuda" in graph.modules
    assert not any(m.startswith(("ctbench.tests", "ctbench.scripts")) for m in graph.modules)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    # the checker itself: a two-module circle and a three-module one are found, a chain is not
    assert _cycles(_Graph({"a": {"b"}, "b": {"a"}, "c": {"a"}})) == [["a", "b"]]
    assert _cycles(_Graph({"a": {"b"}, "b": {"c"}, "c": {"a"}})) == [["a", "b", "c"]]
    assert _cycles(_Graph({"a": {"b"}, "b": {"c"}, "c": set()})) == []
