"""The measured choice of a kernel family's cpu paths, cached beside its library.

One rule for every family (the Joseph projector's forward/back paths, FDK's backprojection): the
choice is read from ``paths-FAMILY-SHA.json`` when that file is trusted (library_trust's rules) and
names this very library, CPU and list of paths; otherwise the paths are measured, the fastest is
kept unless it beats the first listed by less than 10 % (``path_choice.CHOICE_MARGIN``), and the choice
is written atomically.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable

from . import library, path_choice


def choice_location(lib_info: dict) -> tuple[Path | None, str]:
    """(folder for the choice file, library SHA-256) of the loaded library, or (None, "") if unknown."""
    sha = lib_info.get("sha256") or ""
    if not sha:
        return None, ""
    if lib_info.get("source") == "jit" and lib_info.get("dir"):
        return Path(lib_info["dir"]), sha
    return library.private_dir(library.cache_dir() / "paths", levels=2), sha


def _lookup(lib_info: dict, family: str, known: dict[str, list[str]], accept) -> tuple:
    """(cached choice or None, choice file or None, library SHA-256, why there is no file)."""
    why = "the library's SHA-256 is unknown"
    try:
        folder, sha = choice_location(lib_info)
    except (library.UntrustedCache, OSError) as e:
        folder, sha, why = None, "", str(e)
    path = path_choice.choice_file(folder, family, sha) if folder is not None else None
    if path is not None:
        choice, _problem = path_choice.read_choice(path, family, sha, library.cpu_signature(), known)
        if choice is not None and (accept is None or accept(choice)):
            return choice, path, sha, ""
    return None, path, sha, why


def cached_choice(lib_info: dict, family: str, known: dict[str, list[str]],
                  accept: Callable[[dict[str, str]], bool] | None = None) -> dict[str, str] | None:
    """The cached choice for this library and CPU, read without measuring anything (None: none cached)."""
    return _lookup(lib_info, family, known, accept)[0]


def cached_or_measured(lib_info: dict, family: str, known: dict[str, list[str]],
                       measure: Callable[[], dict[str, dict[str, float]]], problem: str,
                       accept: Callable[[dict[str, str]], bool] | None = None) -> tuple[dict[str, str], str]:
    """``(choice, where from)``: the cached choice for this library and CPU, or ``measure()``'s
    (seconds by operation and path) fastest, then cached.  ``where from`` is ``"cache"``,
    ``"measured"`` or ``"measured (not cached: why)"``.  ``accept``: whether a cached choice is one the
    measurement can still make (a choice made under older rules is then measured again and replaced)."""
    choice, path, sha, why = _lookup(lib_info, family, known, accept)
    if choice is not None:
        return choice, "cache"
    timings = measure()
    choice = path_choice.fastest(timings)
    if path is None:
        return choice, f"measured (not cached: {why})"
    try:
        path_choice.write_choice(path, family, sha, library.cpu_signature(), known, choice, timings, problem)
    except OSError as e:
        warnings.warn(f"ctbench: could not cache the measured {family} cpu paths in {path}: {e}", RuntimeWarning,
                      stacklevel=3)
        return choice, f"measured (not cached: {e})"
    return choice, "measured"
