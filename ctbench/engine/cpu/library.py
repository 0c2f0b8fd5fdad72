"""Compile the single-source kernels for the CPU at first use, and load them safely.

A wheel carries the kernels compiled for several instruction sets
(``prebuilt``: chosen at run time from the CPU's features).  Elsewhere
(a checkout, ``CTBENCH_CPU_BUILD=native``, or a CPU the wheel has no
library for) the C++ entry file of a kernel family
(``kernels/<family>_cpu.cpp``) is compiled with the host compiler (``-O3 -fopenmp`` and the host's best
``-march``) into a per-user cache and loaded with ctypes (calls release the
GIL).  What the cache promises (docs/RELIABILITY.md, "Kernel library cache"):

- Trust: the cache directories are created 0700; a directory or file that is
  not owned by the current user, is writable by group or others, or is a
  symbolic link is refused, and the library is then built in a private
  temporary directory instead (with a warning).
- Integrity: every build writes a record (JSON) of the library's size and
  SHA-256; a library is loaded only when the bytes read match its record
  (a truncated, emptied or replaced file is rebuilt).  On Linux the verified
  open file itself is loaded (``/proc/self/fd``), so the file cannot be
  swapped between the check and ``dlopen``.
- Key: the cache folder is named by a hash of the sources, the flags, the
  requested ``-march`` and the CPU it resolves to (the host's CPU feature
  flags), so nodes of different CPU generations sharing a home directory
  never load each other's code; the file name adds the compiler's identity.
- Builds write to a temporary file named after the host and process and
  rename it into place; a failed build removes it, and leftovers of killed
  builders (dead process on this host, or older than a day) are removed by
  the next build.  A warm cache loads without a compiler.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import re
import shlex
import socket
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from functools import lru_cache
from pathlib import Path

from ...atomic_files import atomic_write_bytes, pid_alive
from ..kernel_sources import find_compiler, kernel_dir  # noqa: F401 (re-exported)
from . import prebuilt
from ..library_trust import CorruptLibrary, UntrustedCache, load_verified  # noqa: F401 (re-exported)
from ..library_trust import read_json_quietly, read_trusted_json
from ..library_trust import check_owned as _check_owned

_LOCK = threading.Lock()
BASE_FLAGS = ("-O3", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
_STALE_SECONDS = 24 * 3600
_RECORD_FORMAT = "ctbench.kernel-library"
_LOADED: dict[str, dict] = {}  # family -> what load_cpu_library loaded (ctbench info shows it)


def cache_dir() -> Path:
    """The configured cache folder (``CTBENCH_CACHE_DIR`` or ``$XDG_CACHE_HOME/ctbench``, then ``kernels``)."""
    root = os.environ.get("CTBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ctbench")
    return Path(root) / "kernels"


# ------------------------------------------------------------------ the key
@lru_cache(maxsize=None)
def _compiler_id(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return cxx


def requested_march() -> str | None:
    """The ``-march`` to ask for: ``CTBENCH_MARCH`` (default ``native``; ``none`` asks for none)."""
    want = os.environ.get("CTBENCH_MARCH", "native")
    return None if want == "none" else want


@lru_cache(maxsize=None)
def cpu_signature() -> str:
    """What ``-march=native`` resolves to on this host, read from the OS (no compiler needed).

    The machine type and the CPU feature flags (``/proc/cpuinfo``: ``flags`` on
    x86, ``Features`` on ARM; ``sysctl machdep.cpu`` on macOS).  Two hosts with
    the same flags run the same native code; any difference changes the key.
    """
    parts = [platform.machine()]
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
        m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
        if m:
            parts.append(" ".join(sorted(m.group(1).split())))
        else:
            parts.append(platform.processor())
    except OSError:
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string", "machdep.cpu.features",
                                  "machdep.cpu.leaf7_features"], capture_output=True, text=True, timeout=10).stdout
            parts.append(" ".join(out.split()))
        except (OSError, subprocess.SubprocessError):
            parts.append(platform.processor())
    return "|".join(parts)


@lru_cache(maxsize=None)
def _arch_flags(cxx: str) -> tuple[str, ...]:
    """The requested -march if the compiler accepts it."""
    want = requested_march()
    if want is None:
        return ()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "t.cpp"
        src.write_text("int main(){return 0;}\n")
        ok = subprocess.run([cxx, f"-march={want}", str(src), "-o", str(Path(tmp) / "t")],
                            capture_output=True).returncode == 0
    return (f"-march={want}",) if ok else ()


def extra_flags() -> list[str]:
    """``CTBENCH_CXXFLAGS``: flags appended to every build (part of the key), e.g.
    ``-fsanitize=address`` for a sanitizer run (then preload libasan into Python)."""
    return shlex.split(os.environ.get("CTBENCH_CXXFLAGS", ""))


def compile_flags(cxx: str) -> list[str]:
    return [*BASE_FLAGS, *_arch_flags(cxx), *extra_flags()]


def _source_files(src_dir: Path, family: str) -> list[Path]:
    return sorted(src_dir.glob("*.cuh")) + sorted(src_dir.glob("*.hpp")) + [src_dir / f"{family}_cpu.cpp"]


def cache_key(family: str, src_dir: Path | None = None) -> str:
    """Name of the cache folder of ``family``: sources, flags, requested -march and the resolved CPU."""
    src_dir = kernel_dir() if src_dir is None else src_dir
    h = hashlib.sha256()
    for p in _source_files(src_dir, family):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join([*BASE_FLAGS, *extra_flags()]).encode())
    march = requested_march()
    h.update(f"march={march}".encode())
    if march == "native":
        h.update(cpu_signature().encode())
    return h.hexdigest()[:16]


def _compiler_tag(cxx: str) -> str:
    return hashlib.sha256((os.path.realpath(cxx) + "\n" + _compiler_id(cxx)).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- the trust
def private_dir(path: Path, levels: int = 1) -> Path:
    """Create ``path`` (0700) if missing and check that its last ``levels`` components are ours.

    Each of those components must be a real folder (not a link), owned by the
    current user and not writable by group or others.  Raises UntrustedCache.
    """
    path = Path(path)
    for p in reversed(path.parents):
        if not p.exists():
            try:
                os.mkdir(p, 0o700)
            except FileExistsError:
                pass
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    chain = [path, *list(path.parents)[:levels - 1]]
    for p in chain:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise UntrustedCache(f"cache folder {p} is not a plain folder")
        _check_owned(st, f"cache folder {p}")
    return path


# --------------------------------------------------------- build and load
def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"


def clean_stale_temps(out_dir: Path, family: str) -> list[Path]:
    """Remove temporary files of builders that died (this host, dead pid) or are older than a day."""
    removed = []
    host, now = _host(), time.time()
    leftovers = [*out_dir.glob(f".{family}.*.tmp*"), *out_dir.glob(f".lib{family}-*.json.*.tmp")]
    for p in leftovers:
        m = re.match(rf"^\.{re.escape(family)}\.(.+)\.(\d+)\.[^.]+\.tmp", p.name)
        try:
            old = now - p.lstat().st_mtime > _STALE_SECONDS
        except OSError:
            continue
        dead = m is not None and m.group(1) == host and not pid_alive(int(m.group(2)))
        if old or dead:
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


def _build(family: str, src_dir: Path, out_dir: Path, cxx: str, tag: str) -> Path:
    """Compile the family into ``out_dir``; returns its record's path."""
    clean_stale_temps(out_dir, family)
    src = src_dir / f"{family}_cpu.cpp"
    flags = compile_flags(cxx)
    fd, tmp = tempfile.mkstemp(prefix=f".{family}.{_host()}.{os.getpid()}.", suffix=".tmp.so", dir=out_dir)
    os.close(fd)
    try:
        cmd = [cxx, *flags, f"-I{src_dir}", str(src), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling the CPU kernels failed:\n$ {' '.join(cmd)}\n{proc.stderr}")
        os.chmod(tmp, 0o700)
        with open(tmp, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        # Content-addressed name: a record always points at complete bytes, even
        # when processes race to build (each renames its own file).
        lib = out_dir / f"lib{family}-{tag}-{digest[:16]}.so"
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    record = {"format": _RECORD_FORMAT, "family": family, "file": lib.name, "size": len(data), "sha256": digest,
              "compiler": os.path.realpath(cxx), "compiler_version": _compiler_id(cxx).splitlines()[:1],
              "flags": flags, "cpu": cpu_signature(), "built": time.time()}
    rec = out_dir / f"lib{family}-{tag}.json"
    atomic_write_bytes(rec, json.dumps(record, indent=1).encode(), fsync=True, suffix=".tmp")
    return rec


def _verified_load(rec_path: Path, family: str) -> ctypes.CDLL:
    """Load the library a record names, after checking owner, mode, size and SHA-256.

    Raises UntrustedCache (owner/mode), ValueError (unusable record), CorruptLibrary (bytes do not match).
    """
    record = read_trusted_json(rec_path, "kernel library record")
    if not isinstance(record, dict) or record.get("format") != _RECORD_FORMAT or record.get("family") != family:
        raise ValueError(f"{rec_path} is not a {family} kernel library record")
    name = str(record.get("file", ""))
    if "/" in name or not name.startswith(f"lib{family}-"):
        raise ValueError(f"kernel library record {rec_path} names an unexpected file {name!r}")
    lib = load_verified(rec_path.parent / name, record.get("size"), record.get("sha256"), record_name=name)
    # what this very library is, for the path choice cached beside it (joseph_paths)
    lib._ctbench_origin = {"source": "jit", "dir": str(rec_path.parent), "sha256": record.get("sha256")}
    return lib


def _record_file(rec_path: Path) -> str:
    record = read_json_quietly(rec_path)       # bounded, never blocks on a FIFO
    name = str(record.get("file", "")) if isinstance(record, dict) else ""
    return name if "/" not in name else ""


def _discard(rec_path: Path, name: str) -> None:
    """Remove a record that failed verification and the library it named (both checked to be ours).

    The record goes only if it still names ``name``: a concurrent process may
    have just rebuilt and recorded a good library.
    """
    try:
        if name and (rec_path.parent / name).exists():
            (rec_path.parent / name).unlink()
        if _record_file(rec_path) in (name, ""):
            rec_path.unlink()
    except OSError:
        pass


def _fallback_dir(reason: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix="ctbench-kernels-"))
    warnings.warn(f"ctbench: not using the kernel cache ({reason}); building in the private folder {d} "
                  "instead (fix the cache folder's owner/permissions, or set CTBENCH_CACHE_DIR)", RuntimeWarning,
                  stacklevel=3)
    return d


def load_library(family: str, src_dir: Path, cache_root: Path) -> ctypes.CDLL:
    """Build (if needed) and load ``<src_dir>/<family>_cpu.cpp`` through the cache at ``cache_root``."""
    src = src_dir / f"{family}_cpu.cpp"
    if not src.exists():
        raise FileNotFoundError(f"no CPU entry file for kernel family {family!r}: {src}")
    key = cache_key(family, src_dir)
    with _LOCK:
        try:
            out_dir = private_dir(Path(cache_root) / key, levels=2)
        except (UntrustedCache, OSError) as e:
            out_dir = private_dir(_fallback_dir(str(e)))
        try:
            cxx = find_compiler()
        except RuntimeError:
            cxx = None
        if cxx is not None:
            candidates = [out_dir / f"lib{family}-{_compiler_tag(cxx)}.json"]
        else:  # a warm cache works without a compiler: any verified build for this key
            candidates = sorted(out_dir.glob(f"lib{family}-*.json"), key=lambda p: -p.stat().st_mtime)
        problems = []
        for rec in candidates:
            if not rec.exists():
                continue
            try:
                return _verified_load(rec, family)
            except UntrustedCache as e:
                problems.append(str(e))
                if cxx is not None:  # never overwrite someone else's file: build privately
                    out_dir = private_dir(_fallback_dir(str(e)))
                    candidates = []
                break
            except (ValueError, OSError) as e:
                problems.append(str(e))
                _discard(rec, getattr(e, "file", ""))
        if cxx is None:
            detail = "; ".join(problems) or f"no cached build in {out_dir}"
            raise RuntimeError(f"no usable cached {family} kernel library ({detail}) and no C++ compiler to build "
                               "one: install one (e.g. `apt-get install g++`) or set CXX; backend='reference' "
                               "works without a compiler (slowly)")
        if problems:
            warnings.warn(f"ctbench: rebuilding the {family} kernels: {'; '.join(problems)}", RuntimeWarning,
                          stacklevel=3)
        rec = _build(family, src_dir, out_dir, cxx, _compiler_tag(cxx))
        return _verified_load(rec, family)


BUILD_ENV = "CTBENCH_CPU_BUILD"
_BUILD_MODES = ("auto", "prebuilt", "native")


def build_mode() -> str:
    """``CTBENCH_CPU_BUILD``: ``auto`` (default: the wheel's prebuilt library for this CPU, else the JIT
    build), ``prebuilt`` (only the prebuilt one) or ``native`` (always the JIT build, ``-march=native``
    unless ``CTBENCH_MARCH`` says otherwise)."""
    mode = os.environ.get(BUILD_ENV, "").strip().lower() or "auto"
    if mode not in _BUILD_MODES:
        raise ValueError(f"{BUILD_ENV}={mode!r}: expected one of {', '.join(_BUILD_MODES)}")
    return mode


def loaded_libraries() -> dict[str, dict]:
    """What ``load_cpu_library`` loaded so far, per family (source, variant, file)."""
    return {k: dict(v) for k, v in _LOADED.items()}


@lru_cache(maxsize=None)
def load_cpu_library(family: str) -> ctypes.CDLL:
    """Load ``kernels/<family>_cpu.cpp``: prebuilt for this CPU (in a wheel) or built into the per-user cache."""
    mode = build_mode()
    src_dir = kernel_dir()
    # An explicit -march or extra flags ask for a build of their own: auto honours them.
    explicit = "CTBENCH_MARCH" in os.environ or bool(extra_flags())
    reason = ""
    if mode == "prebuilt" or (mode == "auto" and not explicit):
        try:
            lib, info = prebuilt.load(family, _source_files(src_dir, family))
            _LOADED[family] = info
            return lib
        except prebuilt.NoPrebuilt as e:
            reason = str(e)
        except (UntrustedCache, ValueError, OSError) as e:
            reason = str(e)
            warnings.warn(f"ctbench: not using the prebuilt {family} kernels ({e}); building them instead",
                          RuntimeWarning, stacklevel=2)
        if mode == "prebuilt":
            raise RuntimeError(f"{BUILD_ENV}=prebuilt but {reason}; unset {BUILD_ENV} to build the kernels "
                               "with the host compiler")
    lib = load_library(family, src_dir, cache_dir())
    _LOADED[family] = {"source": "jit", "variant": f"march={requested_march() or 'none'}",
                       "flags": [*BASE_FLAGS, *extra_flags()], "prebuilt_unused": reason,
                       **{k: v for k, v in getattr(lib, "_ctbench_origin", {}).items() if k != "source"}}
    return lib


# ctypes argument types of the kernels' extern "C" entries, and the dtype suffix
# every entry carries (<name>_f32, <name>_f64).
PTR, INT, I64, F64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_double
DTYPE_SUFFIX = {"torch.float32": "f32", "torch.float64": "f64"}


_INT_RANGE = (-2**31, 2**31 - 1)


def cpu_function(family: str, name: str, dtype, argtypes):
    """The entry ``<name>_<f32|f64>`` of kernel family ``family`` for ``dtype``, with its ctypes signature.

    ctypes wraps an int argument outside 32 bits silently (2**31 becomes
    -2**31, 2**33 + 8 becomes 8); the returned callable refuses it instead.
    """
    f = getattr(load_cpu_library(family), f"{name}_{DTYPE_SUFFIX[str(dtype)]}")
    f.argtypes = argtypes
    f.restype = None
    ints = [i for i, t in enumerate(argtypes) if t is INT]
    lo, hi = _INT_RANGE

    def call(*args):
        for i in ints:
            if not lo <= args[i] <= hi:
                raise ValueError(f"{name}: argument {i} is {args[i]}, outside the 32-bit range the kernel takes")
        return f(*args)

    call.raw = f  # the bare ctypes entry (tests call it directly, bypassing every check)
    return call
