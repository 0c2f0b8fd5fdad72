"""Qt widgets of the ctbench napari plugin (thin: the logic lives in ctbench)."""
