"""Shared by the scan I/O tests: write an NXtomo file the way beamlines do (h5py, image_key)."""

from __future__ import annotations

import numpy as np


def write_nxtomo(path, proj, flats, darks, angles_deg, pixel_size_m, *, sample_detector_m=None, source_sample_m=None,
                 layout: str = "entry", detector: str = "detector", angle_units: str = "degree",
                 key_name: str = "image_key", with_angles: bool = True, alignment_frames: int = 0):
    """darks, then flats, then projections, then a second flat series (as many beamlines record them).

    ``layout``: "entry" (``/entry``, the NXtomo definition's names) or "diamond" (``/entry1/tomo_entry``, an
    NXsubentry holding the definition, as Diamond's files do); ``detector``: the NXdetector group's name (the
    definition says "detector"; writers use others, found by NX_class); ``angle_units``: "degree" or "rad";
    ``key_name``: "image_key", or "image_key_control" (nxtomomill: -1 marks ``alignment_frames`` projections
    taken at the end, which are not part of the scan); ``with_angles=False``: no rotation_angle (a damaged file).
    """
    import h5py

    half = max(1, flats.shape[0] // 2)
    extra = np.asarray(proj[:alignment_frames])
    frames = np.concatenate([darks, flats[:half], proj, flats[half:], extra])
    keys = np.concatenate([np.full(len(darks), 2), np.full(half, 1), np.zeros(len(proj)),
                           np.full(len(flats) - half, 1), np.full(len(extra), -1)]).astype(np.int32)
    angles = np.concatenate([np.zeros(len(darks)), np.zeros(half), angles_deg,
                             np.full(len(flats) - half, angles_deg[-1]), np.zeros(len(extra))])
    if angle_units == "rad":
        angles = np.radians(angles)
    with h5py.File(path, "w") as f:
        if layout == "diamond":
            top = f.create_group("entry1")
            top.attrs["NX_class"] = "NXentry"
            entry = top.create_group("tomo_entry")
            entry.attrs["NX_class"] = "NXsubentry"
        else:
            entry = f.create_group("entry")
            entry.attrs["NX_class"] = "NXentry"
        entry.create_dataset("definition", data=b"NXtomo")
        inst = entry.create_group("instrument")
        inst.attrs["NX_class"] = "NXinstrument"
        det = inst.create_group(detector)
        det.attrs["NX_class"] = "NXdetector"
        det.create_dataset("data", data=frames, chunks=(1, *frames.shape[1:]))
        det.create_dataset(key_name, data=keys if key_name == "image_key_control" else np.maximum(keys, 0))
        for name in ("x_pixel_size", "y_pixel_size"):
            ds = det.create_dataset(name, data=pixel_size_m)
            ds.attrs["units"] = "m"
        if sample_detector_m is not None:
            ds = det.create_dataset("distance", data=sample_detector_m)
            ds.attrs["units"] = "m"
        if source_sample_m is not None:
            src = inst.create_group("source")
            src.attrs["NX_class"] = "NXsource"
            src.create_dataset("type", data=b"Fixed Tube X-ray")
            ds = src.create_dataset("distance", data=-float(source_sample_m))     # upstream of the sample
            ds.attrs["units"] = "m"
        sample = entry.create_group("sample")
        sample.attrs["NX_class"] = "NXsample"
        data = entry.create_group("data")
        data.attrs["NX_class"] = "NXdata"
        data["data"] = det["data"]                     # hard links, as NXtomo's NXdata does
        if with_angles:
            ds = sample.create_dataset("rotation_angle", data=angles)
            ds.attrs["units"] = angle_units
            data["rotation_angle"] = sample["rotation_angle"]
        data["image_key"] = det[key_name]
    return path
