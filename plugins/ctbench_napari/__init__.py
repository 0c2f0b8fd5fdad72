"""napari plugin of ctbench: trajectory designer, projection, reconstruction, samples, reader and writer.

The widgets are thin: parameters in, ctbench calls out, results into layers.
Importing this package stays cheap (no Qt, no napari) so that npe2 can read
the manifest; the widgets live in :mod:`ctbench_napari._qt`.
"""

from __future__ import annotations

__version__ = "0.1.0"

PLUGIN = "ctbench"  # the npe2 plugin name must equal the distribution name
WIDGETS = ("Trajectory designer", "Projection", "Reconstruction", "Scan import", "Calibrate", "Jobs")
# The dock tabs' titles: six tabs fit a 480-pixel dock side by side (the full name is the tab's tooltip).
TAB_TITLES = {"Trajectory designer": "Designer", "Reconstruction": "Reconstruct"}
SAMPLES = ("phantom", "phantom_scan", "htc2022", "lab_scan")


def launch(sample: str | None = "phantom", *, block: bool = True):
    """Open napari with the ctbench widgets docked and a sample loaded; block in ``napari.run()``.

    ``sample`` is one of :data:`SAMPLES` or None.  With ``block=False`` the
    viewer is returned without entering the event loop (for tests and scripts).
    """
    from ._launch import open_workbench

    return open_workbench(sample, block=block)


__all__ = ["launch", "PLUGIN", "WIDGETS", "TAB_TITLES", "SAMPLES", "__version__"]
