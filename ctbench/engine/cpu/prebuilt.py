"""The CPU kernels compiled when the wheel was built: one library per kernel family and instruction set.

``CMakeLists.txt`` builds ``kernels/<family>_cpu.cpp`` for every level of
the machine (x86-64: baseline, v3 = AVX2+FMA, v4 = AVX-512; aarch64: ARMv8)
into ``ctbench/_prebuilt/`` with a manifest recording each library's size,
SHA-256 and flags and the SHA-256 of every kernel source it was built from.
At run time the best level this CPU can run is chosen with ``archspec``; a
wheel that lacks it falls back to the next lower level.  A library is loaded
only after the trust checks of ``library_trust`` (owner: the current user or
root, no group/other write, no links; bytes equal to the manifest), and only
if the sources it was built from are the sources this ctbench ships (a stale
build in a checkout is never used).  A checkout (``pip install -e .``) has no
prebuilt libraries: there the JIT build of ``library`` runs.
"""

from __future__ import annotations

import hashlib
import os
import platform
import stat
from functools import lru_cache
from pathlib import Path

from ..library_trust import CorruptLibrary, UntrustedCache, check_owned, euid, load_verified, read_trusted_json

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "ctbench.prebuilt-kernels"
# Highest level first: the order in which a wheel's variants are tried.
LEVELS = {"x86_64": ("x86_64_v4", "x86_64_v3", "x86_64"), "aarch64": ("aarch64",)}
_BASELINE = {"x86_64": "x86_64", "aarch64": "aarch64"}
VARIANT_ENV = "CTBENCH_CPU_VARIANT"


class NoPrebuilt(RuntimeError):
    """No prebuilt library can be used here; the message says why."""


def machine() -> str:
    """The machine name the variants are keyed by (``AMD64``/``x86_64`` -> x86_64, ``arm64`` -> aarch64)."""
    m = platform.machine().lower()
    return {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}.get(m, m)


def prebuilt_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "_prebuilt"


@lru_cache(maxsize=None)
def host_levels() -> tuple[str, ...]:
    """The instruction-set levels this CPU runs, best first (``archspec`` reads the CPU's features)."""
    m = machine()
    levels = LEVELS.get(m, ())
    if not levels:
        return ()
    try:
        import archspec.cpu
        host = archspec.cpu.host()
        targets = archspec.cpu.TARGETS
        ok = [lv for lv in levels if lv == _BASELINE[m] or (lv in targets and host >= targets[lv])]
    except Exception:  # an undetectable CPU still runs the baseline
        ok = [_BASELINE[m]]
    return tuple(ok)


def wanted_levels() -> tuple[str, ...]:
    """``host_levels()``, or from ``CTBENCH_CPU_VARIANT`` down when that names one this CPU runs."""
    levels = host_levels()
    want = os.environ.get(VARIANT_ENV, "").strip()
    if not want:
        return levels
    if want not in levels:
        raise ValueError(f"{VARIANT_ENV}={want!r}: this CPU ({machine()}) runs only {', '.join(levels) or 'none'} "
                         "of the prebuilt variants")
    return levels[levels.index(want):]


def _file_sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _owners() -> tuple[int, ...] | None:
    uid = euid()
    return None if uid is None else tuple(sorted({uid, 0}))  # installed by the user, or by root


def read_manifest(folder: Path) -> dict:
    """The verified manifest of ``folder`` (raises NoPrebuilt if absent, UntrustedCache/ValueError if unusable)."""
    if not (folder / MANIFEST).exists():
        raise NoPrebuilt(f"no prebuilt kernels in {folder} (a checkout or a source build: the JIT build is used)")
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UntrustedCache(f"prebuilt kernel folder {folder} is not a plain folder")
    check_owned(st, f"prebuilt kernel folder {folder}", _owners())
    m = read_trusted_json(folder / MANIFEST, "prebuilt kernel manifest", _owners())
    if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT or not isinstance(m.get("libraries"), list):
        raise ValueError(f"{folder / MANIFEST} is not a ctbench prebuilt kernel manifest")
    # Shapes checked here so that a damaged manifest is a reason to skip the prebuilt kernels, never a TypeError.
    sources = m.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise ValueError(f"{folder / MANIFEST}: 'sources' must map each kernel source to its SHA-256, got "
                         f"{type(sources).__name__}")
    for i, e in enumerate(m["libraries"]):
        if not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in ("family", "variant", "file")):
            raise ValueError(f"{folder / MANIFEST}: libraries[{i}] must be an object with 'family', 'variant' and "
                             "'file' strings")
    return m


def candidates(manifest: dict, family: str, levels: tuple[str, ...]) -> list[dict]:
    """The manifest's entries for ``family`` in the order of ``levels`` (missing levels skipped)."""
    by_variant = {e.get("variant"): e for e in manifest["libraries"]
                  if isinstance(e, dict) and e.get("family") == family}
    return [by_variant[lv] for lv in levels if lv in by_variant]


def load(family: str, sources: list[Path], folder: Path | None = None):
    """Load the best usable prebuilt ``family`` library: ``(CDLL, info)``.

    ``sources`` are the kernel sources this ctbench ships for the family; a
    library built from other bytes is not used.  Raises NoPrebuilt (with every
    reason) when none can be loaded.
    """
    folder = prebuilt_dir() if folder is None else Path(folder)
    manifest = read_manifest(folder)
    if manifest.get("machine") != machine():
        raise NoPrebuilt(f"the prebuilt kernels in {folder} are for {manifest.get('machine')}, not {machine()}")
    recorded = manifest.get("sources") or {}
    stale = [p.name for p in sources if recorded.get(p.name) != _file_sha(p)]
    if stale:
        raise NoPrebuilt(f"the prebuilt {family} kernels were built from other sources ({', '.join(stale)} differ)")
    levels = wanted_levels()
    entries = candidates(manifest, family, levels)
    if not entries:
        raise NoPrebuilt(f"no prebuilt {family} kernels for this CPU's levels ({', '.join(levels) or 'none'}) "
                         f"in {folder}")
    problems = []
    for e in entries:
        name = str(e.get("file", ""))
        if not name or "/" in name or "\\" in name or name.startswith("."):
            problems.append(f"manifest names an unexpected file {name!r}")
            continue
        try:
            lib = load_verified(folder / name, e.get("size"), e.get("sha256"), _owners())
        except (UntrustedCache, CorruptLibrary, OSError) as err:
            problems.append(str(err))  # try the next lower level
            continue
        lib._ctbench_origin = {"source": "prebuilt", "sha256": e.get("sha256")}  # for joseph_paths
        info = {"source": "prebuilt", "variant": e["variant"], "file": str(folder / name),
                "sha256": e.get("sha256"), "flags": e.get("flags"), "compiler": manifest.get("compiler"),
                "host_levels": list(host_levels()), "skipped": problems}
        return lib, info
    raise NoPrebuilt(f"no usable prebuilt {family} kernels: {'; '.join(problems)}")
