"""DESIGN.md's one-way arrows, checked with import-linter (contracts in pyproject.toml), and no
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


def _lint(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    if not LINT.exists():
        pytest.skip("lint-imports (import-linter, dev extra) is not installed")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([str(LINT), "--no-cache", "--config", str(cwd / "pyproject.toml")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_contracts_are_kept():
    r = _lint(ROOT)
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
    r = _lint(src, pythonpath=src)
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


def test_no_import_circles_in_ctbench():
    graph = grimp.build_graph("ctbench", cache_dir=None)
    assert "ctbench.compat.operators" in graph.modules and "ctbench.engine.cuda" in graph.modules
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    # the checker itself: a two-module circle and a three-module one are found, a chain is not
    class G:
        def __init__(self, e):
            self.e = e
            self.modules = set(e)

        def find_modules_directly_imported_by(self, m):
            return self.e[m]

    assert _cycles(G({"a": {"b"}, "b": {"a"}, "c": {"a"}})) == [["a", "b"]]
    assert _cycles(G({"a": {"b"}, "b": {"c"}, "c": {"a"}})) == [["a", "b", "c"]]
    assert _cycles(G({"a": {"b"}, "b": {"c"}, "c": set()})) == []
