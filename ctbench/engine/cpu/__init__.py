"""The cpu backend: the compiled C++/OpenMP kernels, how they are built or found, and which inner loop runs.

- ``backend``: ``CpuBackend``, the Backend that calls the kernels through ctypes (windows, threads).
- ``geometry_vjp``: the geometry-gradient kernel's call.
- ``library``: ``load_cpu_library``: the wheel's prebuilt library or a JIT build cached per user.
- ``prebuilt``: which of the wheel's per-instruction-set builds this CPU runs.
- ``path_choice``: ``CTBENCH_CPU_PATH``, the cached choice files and the rule that picks the fastest path.
- ``joseph_paths``, ``fdk_paths``: the run-time paths of the Joseph and FDK kernels, measured at first use.
- ``path_cache``: a measured choice kept beside the library it was measured on.

docs/ARCHITECTURE.md ("Kernels") tells how the pieces fit.
"""

from __future__ import annotations

from .backend import CpuBackend, num_threads

__all__ = ["CpuBackend", "num_threads"]
