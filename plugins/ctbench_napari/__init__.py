"""napari plugin of ctbench: trajectory designer, projection, reconstruction."""
