#!/usr/bin/env python3
"""Run diffct 2.5.0's own public-API tests against ctbench (and against diffct, for the baseline).

An external check of ctbench's diffct face (docs/FROM_DIFFCT.md): nothing of diffct's is copied
into this repository. The script

1. downloads diffct 2.5.0's source distribution with pip (``pip download --no-deps
   --no-binary :all: diffct==2.5.0``) into a work folder and copies its ``tests/`` and
   ``pytest.ini`` out of it (without diffct's own package, so that it cannot shadow the shim);
2. writes a re-export shim: a ``diffct`` package in a temporary folder, first on ``sys.path``,
   whose modules forward to ``ctbench.compat`` (``diffct.X`` -> ``ctbench.compat.X``);
3. marks the tests that use diffct's private functions (the exclusion rule below) and runs the
   rest with pytest (no ``-x``, no ``-n``, a per-test timeout) once with real diffct (the
   installed package) and once with the shim;
4. prints the counts and writes a JSON summary: tests passing on diffct, how many of those pass on
   ctbench, and the failing ones grouped by file.

Exclusion rule (static, on the test sources): a test is out of scope when it, a fixture it asks
for, or a module-level helper it calls (followed across diffct's test modules) refers to a private
diffct name: a name with one leading underscore imported from a ``diffct`` module, any module
under ``diffct._*`` or ``diffct.kernels`` (diffct's numba kernels), an attribute ``._name`` of
anything but ``self``/``cls`` and a few third-party roots, or a patch target string naming one
(``"diffct...._name"`` or ``setattr(obj, "_name", ...)``). Module-level imports of private names
do not exclude a whole file: the shim answers them with a placeholder that raises when used, so
the file's public-API tests still run.

Usage::

    python scripts/diffct_suite.py [--against both|ctbench|diffct] [--workdir DIR]
                                   [--timeout 120] [--json out/diffct_suite.json] [-k EXPR] [FILES...]

The diffct run's results are cached in the work folder (``diffct_results.json``); ``--against
ctbench`` reuses them for the comparison.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

VERSION = "2.5.0"
# third-party roots whose private attributes are not diffct's
_FOREIGN_ROOTS = {"self", "cls", "torch", "np", "numpy", "sys", "os", "numba", "cuda", "pytest", "math",
                  "threading", "gc", "inspect", "types", "functools", "collections", "typing", "weakref",
                  "importlib", "multiprocessing", "mp", "ctypes", "warnings", "builtins", "logging"}

# --------------------------------------------------------------------------- exclusion rule


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "diffct" and (any(_private(p) for p in parts[1:]) or parts[1:2] == ["kernels"])


class _Refs(ast.NodeVisitor):
    """Names a definition uses, and whether it touches something private of diffct's."""

    def __init__(self, private_names):
        self.names: set[str] = set()
        self.private = False
        self._private_names = private_names

    def visit_Name(self, node):
        self.names.add(node.id)
        if node.id in self._private_names:
            self.private = True

    def visit_Attribute(self, node):
        if _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in _FOREIGN_ROOTS):
                self.private = True
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and node.value.startswith("diffct.") and _private_module(node.value):
            self.private = True

    def visit_Call(self, node):
        func = node.func
        fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if fname in {"setattr", "delattr", "object", "getattr", "hasattr"}:
            for arg in node.args[1:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _private(arg.value):
                    self.private = True
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        module = node.module or ""
        if module.split(".")[0] == "diffct":
            if _private_module(module) or any(_private(a.name) for a in node.names):
                self.private = True
        self.generic_visit(node)

    def visit_Import(self, node):
        if any(_private_module(a.name) for a in node.names):
            self.private = True


def _module_defs(path: Path, modname: str):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    private_names: set[str] = set()
    imported: dict[str, tuple[str, str]] = {}  # local name -> (tests module, name)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            for a in node.names:
                local = a.asname or a.name
                if top == "diffct" and (_private_module(node.module) or _private(a.name)):
                    private_names.add(local)
                elif top == "tests":
                    imported[local] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _private_module(a.name):
                    private_names.add(a.asname or a.name)
    defs: dict[str, tuple[bool, set[str]]] = {}
    module_refs = _Refs(private_names)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            refs = _Refs(private_names)
            refs.visit(node)
            args = set()
            if not isinstance(node, ast.ClassDef):
                args = {a.arg for a in node.args.args + node.args.kwonlyargs}
            defs[node.name] = (refs.private, refs.names | args)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            refs = _Refs(private_names)
            refs.visit(node)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        defs[n.id] = (refs.private, refs.names)
        elif isinstance(node, ast.Expr):
            module_refs.visit(node)
    # pytestmark, parametrize lists and usefixtures live in the names above
    return tree, defs, imported


def excluded_tests(tests_dir: Path) -> dict[str, list[str]]:
    """{file: [test or class names out of scope]} by the rule in the module docstring."""
    modules = {}
    for path in sorted(tests_dir.rglob("*.py")):
        rel = path.relative_to(tests_dir.parent)
        modname = ".".join(rel.with_suffix("").parts)
        try:
            modules[modname] = (rel, *_module_defs(path, modname))
        except SyntaxError:
            continue
    tainted: dict[tuple[str, str], bool] = {}
    for modname, (_, _, defs, _) in modules.items():
        for name, (private, _) in defs.items():
            tainted[(modname, name)] = private
    changed = True
    while changed:  # fixpoint over calls, fixtures and cross-module helper imports
        changed = False
        for modname, (_, _, defs, imported) in modules.items():
            for name, (_, refs) in defs.items():
                if tainted[(modname, name)]:
                    continue
                for ref in refs:
                    key = (modname, ref) if ref in defs else imported.get(ref)
                    if key is not None and tainted.get(key):
                        tainted[(modname, name)] = True
                        changed = True
                        break
    out: dict[str, list[str]] = {}
    for modname, (rel, _, defs, _) in modules.items():
        names = [n for n in defs if (n.startswith("test") or n.startswith("Test")) and tainted[(modname, n)]]
        if names and rel.name.startswith("test_"):
            out[rel.as_posix()] = sorted(names)
    return out


# --------------------------------------------------------------------------- shim and plugin

_SHIM = '''\
"""A diffct stand-in written by ctbench's scripts/diffct_suite.py: diffct.X is ctbench.compat.X."""
import importlib, importlib.abc, importlib.util, sys, types

_TARGET = "ctbench.compat"


class _PrivatePlaceholder:
    """A private diffct name ctbench does not provide; tests that use it are out of scope."""
    def __init__(self, name):
        self._name = name
    def _fail(self, *a, **k):
        raise NotImplementedError(f"diffct private {self._name} is not part of ctbench's diffct face")
    __call__ = _fail
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()


class _Forward(types.ModuleType):
    def __init__(self, name, target):
        super().__init__(name)
        object.__setattr__(self, "_target", target)
        self.__dict__["__path__"] = []
        self.__dict__["__file__"] = getattr(target, "__file__", None)
    def __getattr__(self, attr):
        try:
            return getattr(object.__getattribute__(self, "_target"), attr)
        except AttributeError:
            if attr.startswith("_") and not attr.startswith("__"):
                return _PrivatePlaceholder(f"{self.__name__}.{attr}")
            raise
    def __setattr__(self, attr, value):
        if attr.startswith("__") and attr.endswith("__"):
            # importlib sets __spec__/__package__/__loader__ on the shim's module: they must not reach
            # ctbench's (a __package__ of "diffct" breaks its relative imports)
            self.__dict__[attr] = value
            return
        setattr(object.__getattribute__(self, "_target"), attr, value)
    def __delattr__(self, attr):
        delattr(object.__getattribute__(self, "_target"), attr)
    def __dir__(self):
        return dir(object.__getattribute__(self, "_target"))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("diffct."):
            return importlib.util.spec_from_loader(fullname, self)
        return None
    def create_module(self, spec):
        sub = spec.name[len("diffct."):]
        try:
            target = importlib.import_module(f"{_TARGET}.{sub}")
        except ModuleNotFoundError as error:
            if error.name not in (f"{_TARGET}.{sub}", _TARGET):
                raise
            # a diffct module ctbench has no counterpart for: an empty one, whose private names
            # are placeholders (so that a file importing them still runs its public tests)
            target = types.ModuleType(f"{_TARGET}.{sub}")
        return _Forward(spec.name, target)
    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
_face = importlib.import_module(_TARGET)
if not hasattr(_face, "__path__"):  # an older ctbench without the compat package: the top level
    _face = importlib.import_module("ctbench")
__all__ = list(getattr(_face, "__all__", []))
__version__ = "2.5.0"
def __getattr__(attr):
    try:
        return getattr(_face, attr)
    except AttributeError:
        if attr.startswith("_") and not attr.startswith("__"):
            return _PrivatePlaceholder(f"diffct.{attr}")
        raise
for _n in __all__:
    globals()[_n] = getattr(_face, _n)
'''

_PLUGIN = '''\
"""Records every test's outcome and deselects the out-of-scope tests (scripts/diffct_suite.py)."""
import json, os

_EXCLUDED = json.loads(open(os.environ["DIFFCT_SUITE_EXCLUDED"]).read())
_RESULTS = {}
# every outcome is also appended at once, so that a run killed before its end keeps what it ran
_LINES = open(os.environ["DIFFCT_SUITE_RESULTS"] + "l", "w", buffering=1)


def _record(nodeid, outcome):
    _RESULTS[nodeid] = outcome
    _LINES.write(json.dumps([nodeid, outcome]) + "\\n")


def _out_of_scope(nodeid):
    path, _, rest = nodeid.partition("::")
    first = rest.split("::")[0].split("[")[0]
    return first in _EXCLUDED.get(path, ())


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        (drop if _out_of_scope(item.nodeid) else keep).append(item)
    for item in drop:
        _record(item.nodeid, "excluded")
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


def pytest_collectreport(report):
    if report.failed:
        _record(report.nodeid + "::<collection>", "collection-error")


def pytest_runtest_logreport(report):
    if report.when == "setup" and not report.passed:
        _record(report.nodeid, "skipped" if report.skipped else "error")
    elif report.when == "call":
        _record(report.nodeid, "passed" if report.passed else ("skipped" if report.skipped else "failed"))
    elif report.when == "teardown" and report.failed and _RESULTS.get(report.nodeid) == "passed":
        _record(report.nodeid, "error")


def pytest_sessionfinish(session, exitstatus):
    # also on Ctrl-C (pytest finishes the session): an interrupted run keeps what it ran
    _RESULTS["<session>"] = f"exit {int(exitstatus)}"
    with open(os.environ["DIFFCT_SUITE_RESULTS"], "w") as f:
        json.dump(_RESULTS, f, indent=0, sort_keys=True)
'''


def _fetch_tests(workdir: Path, python: str) -> Path:
    src = workdir / f"diffct-{VERSION}"
    if not (src / "tests").is_dir():
        workdir.mkdir(parents=True, exist_ok=True)
        sdist = workdir / f"diffct-{VERSION}.tar.gz"
        if not sdist.exists():
            subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            f"diffct=={VERSION}", "-d", str(workdir)], check=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(workdir, filter="data")
    suite = workdir / "suite"  # tests (and examples) without diffct's own package beside them
    if not suite.is_dir():
        suite.mkdir()
        shutil.copytree(src / "tests", suite / "tests")
        shutil.copytree(src / "examples", suite / "examples")  # tests import examples._common
        shutil.copy(src / "pytest.ini", suite / "pytest.ini")
    return suite


def _run(suite: Path, against: str, python: str, timeout: int, extra: list[str], excluded_file: Path,
         results_file: Path, log_file: Path, ctbench_path: Path | None = None) -> dict:
    helpers = Path(tempfile.mkdtemp(prefix=f"diffct-suite-{against}-"))
    (helpers / "diffct_suite_plugin.py").write_text(_PLUGIN)
    if against == "ctbench":
        (helpers / "diffct").mkdir()
        (helpers / "diffct" / "__init__.py").write_text(_SHIM)
    path = [str(helpers)] + ([str(ctbench_path)] if ctbench_path is not None and against == "ctbench" else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), DIFFCT_SUITE_EXCLUDED=str(excluded_file),
               DIFFCT_SUITE_RESULTS=str(results_file), MESA_SHADER_CACHE_DISABLE="true",
               PYTHONDONTWRITEBYTECODE="1")
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "diffct_suite_plugin",
           f"--timeout={timeout}", "--continue-on-collection-errors", "-o", "addopts=--ignore=tests/benchmarks", *extra]
    start = time.time()
    with open(log_file, "w") as log:
        proc = subprocess.run(cmd, cwd=suite, env=env, stdout=log, stderr=subprocess.STDOUT)
    shutil.rmtree(helpers, ignore_errors=True)
    print(f"{against}: pytest exited {proc.returncode} after {time.time() - start:.0f} s (log {log_file})")
    return json.loads(results_file.read_text()) if results_file.exists() else {}


_LETTERS = {".": "passed", "s": "skipped", "F": "failed", "E": "error", "x": "skipped", "X": "passed"}


def _from_progress(log: Path, order: Path) -> dict:
    """Outcomes from pytest's -q progress lines and the collected node ids (same order).  Exact while
    no test errors in teardown (that prints a second letter); the caller reports it as such."""
    import re

    letters = []
    for line in log.read_text().splitlines():
        m = re.match(r"^([.sFExX]+)\s*(\[\s*\d+%\])?$", line.strip())
        if m:
            letters.extend(m.group(1))
    ids = [x for x in order.read_text().splitlines() if "::" in x]
    out = {i: _LETTERS[c] for i, c in zip(ids, letters)}
    out["<session>"] = f"reconstructed from {len(letters)} progress letters of {len(ids)} collected tests"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", choices=("both", "ctbench", "diffct"), default="both")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ctbench-diffct-suite")
    ap.add_argument("--timeout", type=int, default=120, help="per-test timeout in seconds")
    ap.add_argument("--json", type=Path, default=Path("out/diffct_suite.json"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--ctbench-path", type=Path, default=None,
                    help="a folder holding a ctbench checkout to test instead of the installed one "
                         "(e.g. a `git archive` of another commit)")
    ap.add_argument("--tag", default="", help="suffix of the result and log files in the work folder")
    ap.add_argument("--merge", nargs="*", default=[],
                    help="with --summarize: tags of partial ctbench runs (FILES given) whose results join --tag's "
                         "(runs of different files, started side by side)")
    ap.add_argument("--summarize", action="store_true",
                    help="run nothing: compare the result files already in the work folder (of --tag); "
                         "a run stopped with Ctrl-C is compared on the tests it reached")
    ap.add_argument("-k", dest="keyword")
    ap.add_argument("files", nargs="*", help="test files (relative to the suite, e.g. tests/test_weights.py)")
    args = ap.parse_args(argv)
    if args.timeout <= 0:
        ap.error("--timeout must be a positive number of seconds")

    workdir = args.workdir.resolve()
    suite = _fetch_tests(workdir, args.python)
    excluded = excluded_tests(suite / "tests")
    excluded_file = workdir / "excluded.json"
    excluded_file.write_text(json.dumps(excluded, indent=1, sort_keys=True))
    extra = (["-k", args.keyword] if args.keyword else []) + (args.files or ["tests"])

    results = {}
    for against in (("diffct", "ctbench") if args.against == "both" else (args.against,)):
        if args.summarize:
            tag = f"_{args.tag}" if args.tag and against == "ctbench" else ""
            f = workdir / f"{against}_results{tag}.json"
            lines = f.with_suffix(".jsonl")
            if f.exists():
                results[against] = json.loads(f.read_text())
            elif lines.exists():  # a run that was killed: what it recorded
                results[against] = dict(json.loads(line) for line in lines.read_text().splitlines() if line.strip())
            elif (workdir / f"{against}_order.txt").exists() and (workdir / f"{against}{tag}.log").exists():
                # a run started before line-by-line records: its -q progress letters, in collection order
                # (``pytest --collect-only -q`` with the plugin, saved as <against>_order.txt)
                results[against] = _from_progress(workdir / f"{against}{tag}.log", workdir / f"{against}_order.txt")
            else:
                print(f"no results in {f}", file=sys.stderr)
                return 2
            continue
        tag = ("" if not (args.files or args.keyword) else "_partial") + (f"_{args.tag}" if args.tag else "")
        if against == "diffct":
            tag = tag if args.files or args.keyword else ""
        results[against] = _run(suite, against, args.python, args.timeout, extra, excluded_file,
                                workdir / f"{against}_results{tag}.json", workdir / f"{against}{tag}.log",
                                args.ctbench_path.resolve() if args.ctbench_path else None)
    for extra_tag in args.merge if args.summarize else ():
        for name in (f"ctbench_results_partial_{extra_tag}.json", f"ctbench_results_partial_{extra_tag}.jsonl"):
            f = workdir / name
            if f.exists():
                text = f.read_text()
                part = json.loads(text) if name.endswith(".json") else dict(
                    json.loads(line) for line in text.splitlines() if line.strip())
                part.pop("<session>", None)
                results.setdefault("ctbench", {}).update({k: v for k, v in part.items() if v != "excluded"})
                break
    if "diffct" not in results:
        cached = workdir / "diffct_results.json"
        if not cached.exists():
            print("no diffct baseline yet: run with --against diffct (or both) first", file=sys.stderr)
            return 2
        results["diffct"] = json.loads(cached.read_text())

    def count(res, outcome):
        return sum(1 for v in res.values() if v == outcome)

    base = {k for k, v in results["diffct"].items() if v == "passed"}
    if "ctbench" in results:
        # the tests the ctbench run reached: recorded ones, and those of files it could not import
        ct = results["ctbench"]
        broken_files = {k.split("::")[0] for k, v in ct.items() if v == "collection-error"}
        base = {k for k in base if k in ct or k.split("::")[0] in broken_files}
    sessions = {a: r.get("<session>", "no session record (killed?)") for a, r in results.items()}
    summary = {"diffct_version": VERSION, "timeout_s": args.timeout, "workdir": str(workdir), "sessions": sessions,
               "diffct_passed_recorded": sum(1 for v in results["diffct"].values() if v == "passed"),
               "excluded_tests_rule": "see scripts/diffct_suite.py docstring",
               "excluded_definitions": sum(len(v) for v in excluded.values())}
    for against, res in results.items():
        summary[against] = {o: count(res, o) for o in
                            ("passed", "failed", "error", "skipped", "excluded", "collection-error")}
    if "ctbench" in results:
        ct = results["ctbench"]
        ok = sorted(k for k in base if ct.get(k) == "passed")
        missing = sorted(k for k in base if ct.get(k) != "passed")
        by_file: dict[str, dict] = {}
        for k in missing:
            f = k.split("::")[0]
            by_file.setdefault(f, {"count": 0, "outcomes": {}})
            by_file[f]["count"] += 1
            o = ct.get(k, "not-run")
            by_file[f]["outcomes"][o] = by_file[f]["outcomes"].get(o, 0) + 1
        summary["pass_on_diffct_reached_by_ctbench_run"] = len(base)
        summary["of_those_pass_on_ctbench"] = len(ok)
        summary["fraction"] = round(len(ok) / len(base), 4) if base else None
        summary["not_passing_by_file"] = dict(sorted(by_file.items(), key=lambda kv: -kv[1]["count"]))
        summary["not_passing"] = missing
        print(f"pass on diffct: {len(base)}; of those pass on ctbench: {len(ok)}"
              + (f" ({100 * len(ok) / len(base):.1f}%)" if base else ""))
    for against in results:
        print(f"{against}: " + ", ".join(f"{k} {v}" for k, v in summary[against].items()))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, args.json)
    print(f"summary: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
