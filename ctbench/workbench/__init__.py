"""Qt-free workbench logic shared by the napari plugin, the job bridge and the command line.

- :mod:`.design`: scan geometry forms and their trajectories
- :mod:`.workflow`: reconstruction requests and the event stream a run produces
- :mod:`.preview`: quick previews (central slice, binned problems)
- :mod:`.completeness`: data-completeness maps of a trajectory
- :mod:`.dataset`: the ctbench zarr dataset format (arrays + geometry)
"""
