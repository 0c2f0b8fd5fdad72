"""Open the workbench: a napari viewer with the ctbench widgets docked and a sample loaded."""

from __future__ import annotations

# Short names the command line accepts (``ctbench gui --sample scan``).
SAMPLE_ALIASES = {"scan": "phantom_scan", "none": None}


def open_workbench(sample: str | None = "phantom", *, block: bool = True, viewer=None):
    """The viewer of :func:`ctbench_napari.launch`; its widgets are in ``viewer.window.dock_widgets``."""
    from . import PLUGIN, SAMPLES, WIDGETS

    sample = SAMPLE_ALIASES.get(sample, sample)
    if sample is not None and sample not in SAMPLES:
        raise ValueError(f"sample must be one of {SAMPLES} or None, got {sample!r}")
    import napari

    viewer = viewer or napari.Viewer(title="ctbench workbench")
    docks = [viewer.window.add_plugin_dock_widget(PLUGIN, name, tabify=True)[0] for name in WIDGETS]
    docks[0].raise_()   # tabbed together; a session starts in the designer
    if sample is not None:
        viewer.open_sample(PLUGIN, sample)
    if block:
        napari.run()
    return viewer
