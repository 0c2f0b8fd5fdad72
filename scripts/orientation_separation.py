"""Measures how well the conjugate-ray mismatch and the FBP sharpness separate the two handedness readings.

Six simulated camera-convention scans in counts (chiral and Shepp-Logan, offsets 0, 2.37, -3.6 px): for each the
readings (source, ccw) [right] and (detector, ccw) [wrong] are tried; prints sharpness, offsets and mismatch.
Run: python scripts/orientation_separation.py  (docs/SCANS.md, "Orientation", quotes its output)
"""
import time
from ctbench.io.sample_scan import LabScanSpec, simulate_counts
from ctbench.io.scan import RawScan
from ctbench.io.orientation import Orientation
from ctbench.pipeline import prepare, PreprocessConfig
from ctbench.io.handedness import resolve_orientation
for ph in ("chiral", "shepp-logan"):
  for off in (0.0, 2.37, -3.6):
    s=LabScanSpec(n_views=96, detector_u=64, detector_v=48, offset_px=off, phantom_name=ph, seen_from="source", seed=5)
    p,f,d,_=simulate_counts(s)
    scan=RawScan(p,f,d,angles=s.angles,pixel_size=(s.pitch,s.pitch))
    prep=prepare(scan, PreprocessConfig())
    t=time.time()
    r=resolve_orientation(prep.images, s.angles, Orientation(rotation="ccw"), "ccw", pitch=s.pitch, pitch_v=s.pitch, sid=s.sid, sdd=s.sdd)
    print(ph, off, [(x.orientation.seen_from, round(x.sharpness,4), round(x.centre.offset_px,2), round(x.centre.cross_check_px,2), x.mismatch) for x in r.readings], round(time.time()-t,1))
