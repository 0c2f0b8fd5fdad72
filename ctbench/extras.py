"""Which ``pip install "ctbench[EXTRA]"`` brings an optional package, and the one line that says so.

The core install (``pip install ctbench``) is the engine, the solvers, the zarr stores and the command line.
The rest comes with extras (pyproject.toml): ``io`` (TIFF, HDF5/NeXus, vendor formats), ``jobs`` (the job
bridge and its client), ``gui`` (napari with PyQt5, and io and jobs), ``gui-qt6`` / ``gui-pyside6`` (the same
with PyQt6 or PySide6), ``gpu`` (CuPy).  A command that reaches for a package that is not installed prints
:func:`missing_extra_message` instead of a traceback (ctbench/cli.py).
"""

from __future__ import annotations

__all__ = ["EXTRA_OF", "extra_for", "missing_extra_message"]

# top-level import name -> the extra that installs it
EXTRA_OF = {
    "tifffile": "io", "h5py": "io", "dask": "io", "olefile": "io",
    "fastapi": "jobs", "uvicorn": "jobs", "httpx": "jobs", "starlette": "jobs",
    "napari": "gui", "magicgui": "gui", "qtpy": "gui", "napari_ome_zarr": "gui", "superqt": "gui",
    "PyQt5": "gui", "PyQt6": "gui-qt6", "PySide6": "gui-pyside6",
    "cupy": "gpu", "cupy_backends": "gpu",
}


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name is looked up by its top level), or None."""
    if not module:
        return None
    return EXTRA_OF.get(module.split(".")[0])


def _causes(exc: BaseException):
    """``exc`` and the exceptions it was raised from (napari re-raises Qt's import errors with a message of
    its own and no module name)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def missing_extra_message(exc: BaseException, what: str = "ctbench") -> str | None:
    """One line for an ImportError of an optional package (None for anything else)::

        ctbench gui: napari is not installed; it comes with pip install "ctbench[gui]"
    """
    for e in _causes(exc):
        if type(e).__name__ == "QtBindingsNotFoundError":    # qtpy found napari but no Qt binding
            return (f'{what}: no Qt binding is installed; pip install "ctbench[gui]" (PyQt5), "ctbench[gui-qt6]" '
                    '(PyQt6) or "ctbench[gui-pyside6]" (PySide6)')
        if isinstance(e, ModuleNotFoundError) and extra_for(e.name) is not None:
            return (f'{what}: {e.name.split(".")[0]} is not installed; it comes with pip install '
                    f'"ctbench[{extra_for(e.name)}]"')
    return None
