"""Shared by the scan I/O tests: write an NXtomo file the way beamlines do (h5py, image_key)."""

from __future__ import annotations

import numpy as np


def write_nxtomo(path, proj, flats, darks, angles_deg, pixel_size_m, *, sample_detector_m=None):
    """darks, then flats, then projections, then a second flat series (as many beamlines record them)."""
    import h5py

    half = max(1, flats.shape[0] // 2)
    frames = np.concatenate([darks, flats[:half], proj, flats[half:]])
    keys = np.concatenate([np.full(len(darks), 2), np.full(half, 1), np.zeros(len(proj)),
                           np.full(len(flats) - half, 1)]).astype(np.int32)
    angles = np.concatenate([np.zeros(len(darks)), np.zeros(half), angles_deg,
                             np.full(len(flats) - half, angles_deg[-1])])
    with h5py.File(path, "w") as f:
        entry = f.create_group("entry")
        entry.attrs["NX_class"] = "NXentry"
        entry.create_dataset("definition", data=b"NXtomo")
        inst = entry.create_group("instrument")
        inst.attrs["NX_class"] = "NXinstrument"
        det = inst.create_group("detector")
        det.attrs["NX_class"] = "NXdetector"
        det.create_dataset("data", data=frames, chunks=(1, *frames.shape[1:]))
        det.create_dataset("image_key", data=keys)
        for name in ("x_pixel_size", "y_pixel_size"):
            ds = det.create_dataset(name, data=pixel_size_m)
            ds.attrs["units"] = "m"
        if sample_detector_m is not None:
            ds = det.create_dataset("distance", data=sample_detector_m)
            ds.attrs["units"] = "m"
        sample = entry.create_group("sample")
        sample.attrs["NX_class"] = "NXsample"
        ds = sample.create_dataset("rotation_angle", data=angles)
        ds.attrs["units"] = "degree"
        data = entry.create_group("data")
        data.attrs["NX_class"] = "NXdata"
        data["data"] = det["data"]                     # hard links, as NXtomo's NXdata does
        data["rotation_angle"] = sample["rotation_angle"]
        data["image_key"] = det["image_key"]
    return path
