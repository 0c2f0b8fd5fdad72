"""Scanner files right the first time: each format's files, written the way the vendor writes them *as its
reference reader reads them* (tests/vendor_files.py: CIL for Nikon and Zeiss, TIGRE for SkyScan, the NXtomo
definition, dxchange), reconstructed by ``ctbench recon`` with nothing but the input path.

For each format two variants (the stage turning each way, and the format's other variants: measured angles,
radians, nested entries, float images, binning, an optical axis off the centre): the RMSE against the phantom is
within 5% of ctbench's FDK with the exact geometry on the same stored values, the volume is neither mirrored nor
upside down (the chiral phantom's lowest and highest balls sit where they belong, not at their mirror places),
and the centre found is within 0.1 px of the true offset.  The scans are small (72 views of 80 x 48 pixels).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ctbench.io.sample_scan import LabScanSpec, simulate_counts
from ctbench.io.scan import images_to_sinogram
from ctbench.pipeline import load_config, run_recon

from io_helpers import write_nxtomo
from vendor_files import (skyscan_images, skyscan_optical_axis, write_bruker, write_dxchange, write_nikon,
                          write_txrm, zeiss_angles_deg, zeiss_images)

N_VIEWS, COLS, ROWS = 72, 80, 48


def spec_of(rotation="ccw", offset=2.37, offset_v=0.0, beam="cone", seed=3) -> LabScanSpec:
    return LabScanSpec(n_views=N_VIEWS, detector_u=COLS, detector_v=ROWS, offset_px=offset, offset_v_px=offset_v,
                       phantom_name="chiral", rotation=rotation, beam=beam, i0=60000.0, seed=seed)


def transmission(spec):
    """Flat/dark-corrected transmission in ctbench's image frame (what the scanner's own correction makes)."""
    proj, flats, darks, _ = simulate_counts(spec)
    d, f = darks.mean(0), flats.mean(0)
    return (proj - d) / (f - d), (proj, flats, darks)


def exact_fdk(t, spec, shape, voxel):
    """ctbench's FDK (FBP for a parallel beam) with the exact geometry on line integrals from the same stored
    values (ctbench's frame)."""
    from ctbench.solvers import fbp, fdk
    from ctbench.workbench.design import ScanGeometry

    li = -np.log(np.clip(np.asarray(t, np.float64), 1e-4, None)).astype(np.float32)
    traj = spec.trajectory().to(dtype=torch.float32)
    geo = ScanGeometry(traj, (COLS, ROWS), (spec.pitch, spec.pitch), tuple(shape), (voxel,) * 3)
    projector = geo.projector()
    analytic = fdk if projector.beam == "cone" else fbp
    return analytic(projector, torch.from_numpy(np.ascontiguousarray(images_to_sinogram(li)))).numpy()


def recon_defaults(tmp_path, path) -> dict:
    cfg = tmp_path / "recon.json"
    cfg.write_text(json.dumps({"input": {"path": str(path)}}))
    return run_recon(load_config(cfg))


def rmse(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)))


def ball_positions(spec):
    """Normalised centres of the chiral phantom's lowest and highest balls (ctbench.phantoms.chiral_ellipsoids)."""
    out = []
    for k in (0, 4):
        t = math.radians(200.0 + 72.0 * k)
        out.append((0.56 * math.cos(t), 0.56 * math.sin(t), -0.42 + 0.21 * k))
    return out


def assert_upright_not_mirrored(vol, voxel, spec):
    """Each ball is brighter where it belongs than where a mirror in x, y or z (upside down) would put it."""
    scale = spec.phantom_scale()
    D, H, W = vol.shape

    def at(x, y, z):
        i, j, k = (round(c * scale / voxel + (n - 1) / 2) for c, n in ((x, W), (y, H), (z, D)))
        return float(vol[max(k - 1, 0):k + 2, max(j - 1, 0):j + 2, max(i - 1, 0):i + 2].mean())

    contrast = 0.6 * spec.attenuation          # a ball adds 0.6 of the table's unit
    for x, y, z in ball_positions(spec):
        here = at(x, y, z)
        for name, p in (("x", (-x, y, z)), ("y", (x, -y, z)), ("z (upside down)", (x, y, -z))):
            assert here - at(*p) > 0.3 * contrast, f"mirrored in {name}: {here:.4g} at the ball, {at(*p):.4g} there"


def check(tmp_path, path, spec, t_ctbench, *, offset_v_px=None):
    r = recon_defaults(tmp_path, path)
    vol = r["volume"].numpy()
    voxel = r["geometry"]["voxel_spacing"][0]
    truth = spec.truth(vol.shape, voxel)
    ref = exact_fdk(t_ctbench, spec, vol.shape, voxel)
    assert rmse(vol, truth) <= 1.05 * rmse(ref, truth), (rmse(vol, truth), rmse(ref, truth))
    assert_upright_not_mirrored(vol, voxel, spec)
    assert r["centre"]["offset_px"] == pytest.approx(spec.offset_px, abs=0.1)
    if offset_v_px is not None:
        assert r["detector_offset_mm"][1] == pytest.approx(offset_v_px * spec.pitch, abs=0.1 * spec.pitch)
    return r


# ------------------------------------------------------------------ Nikon XT H (CIL's reading)
WHITE = 60000.0


@pytest.mark.parametrize("variant", ["ccw", "cw-measured-angles"])
def test_nikon_as_cil_reads_it(tmp_path, variant):
    spec = spec_of("ccw" if variant == "ccw" else "cw", seed=11)
    t, _ = transmission(spec)
    stored = np.clip(np.rint(t * WHITE), 1, 65535).astype(np.uint16)        # shading corrected, ctbench's frame
    deg = np.degrees(spec.angles)
    xt = write_nikon(tmp_path / "nk", "part", stored, pitch=spec.pitch, sid=spec.sid, sdd=spec.sdd, angles_deg=deg,
                     white_level=WHITE, ctdata_deg=deg if variant != "ccw" else None)
    r = check(tmp_path, xt, spec, stored / WHITE)
    assert r["orientation"]["rotation_direction"] == spec.rotation and r["warnings"] == []


# ------------------------------------------------------------------ SkyScan (TIGRE's reading)
@pytest.mark.parametrize("variant", ["CC", "CW-binned-float"])
def test_skyscan_as_tigre_reads_it(tmp_path, variant):
    ccw = variant == "CC"
    offset_v = 1.5 if ccw else -2.25
    spec = spec_of("ccw" if ccw else "cw", offset=-1.63, offset_v=offset_v, seed=12)
    t, _ = transmission(spec)
    if ccw:       # 16-bit, open beam at the log's Reference Intensity
        ref = 58000.0
        stored = np.clip(np.rint(t * ref), 1, 65535).astype(np.uint16)
        kw = {"reference_intensity": ref}
        back = stored / ref
    else:         # 32-bit float transmission, camera binning 2x2 (the log's pixel size is the binned one)
        stored = t.astype(np.float32)
        kw = {"binning": 2}
        back = stored
    log = write_bruker(tmp_path / "sky", "scan_", skyscan_images(stored), sid=spec.sid, sdd=spec.sdd,
                       pitch=spec.pitch, step_deg=360.0 / N_VIEWS, direction=variant[:2],
                       optical_axis=skyscan_optical_axis(ROWS, offset_v), **kw)
    r = check(tmp_path, log, spec, back, offset_v_px=offset_v)
    assert r["orientation"]["image_seen_from"] == "source" and r["orientation"]["rotation_direction"] == spec.rotation
    assert r["warnings"] == []


# ------------------------------------------------------------------ Zeiss Xradia (CIL's reading)
@pytest.mark.parametrize("variant", ["angles-falling", "angles-rising-float"])
def test_zeiss_as_cil_reads_it(tmp_path, variant):
    spec = spec_of("ccw" if variant == "angles-falling" else "cw", offset=3.1, seed=13)
    _, (proj, flats, darks) = transmission(spec)
    counts = proj.astype(np.float64) - darks.mean(0)                       # Xradia: dark-subtracted counts
    ref = (flats.mean(0) - darks.mean(0)).astype(np.float32)
    stored = counts.astype(np.float32) if "float" in variant else np.clip(np.rint(counts), 1, 65535).astype(np.uint16)
    path = write_txrm(tmp_path / "scan.txrm", zeiss_images(stored), zeiss_images(ref[None])[0],
                      angles_deg=zeiss_angles_deg(spec.angles), sid=spec.sid, sdd=spec.sdd,
                      pixel_um=spec.pitch * 1e3 * spec.sid / spec.sdd)
    r = check(tmp_path, path, spec, np.asarray(stored, np.float64) / ref)
    o = r["orientation"]
    assert (o["image_seen_from"], o["image_rows"], o["rotation_direction"]) == ("source", "up", spec.rotation)
    assert r["warnings"] == []


# ------------------------------------------------------------------ NeXus NXtomo (camera convention; data decide)
@pytest.mark.parametrize("variant", ["entry-degrees", "diamond-radians"])
def test_nxtomo_cone_beam(tmp_path, variant):
    spec = spec_of("ccw" if variant.startswith("entry") else "cw", offset=-2.9, seed=14)
    t, (proj, flats, darks) = transmission(spec)
    cam = lambda a: np.ascontiguousarray(a[..., ::-1])     # noqa: E731 - camera images, the convention assumed
    diamond = variant.startswith("diamond")
    path = write_nxtomo(tmp_path / "scan.nxs", cam(proj), cam(flats), cam(darks), np.degrees(spec.angles),
                        spec.pitch * 1e-3, sample_detector_m=(spec.sdd - spec.sid) * 1e-3,
                        source_sample_m=spec.sid * 1e-3, layout="diamond" if diamond else "entry",
                        detector="pco_edge" if diamond else "detector", angle_units="rad" if diamond else "degree",
                        key_name="image_key_control" if diamond else "image_key",
                        alignment_frames=3 if diamond else 0)
    r = check(tmp_path, path, spec, t)
    o = r["orientation"]
    assert o["detected_from_data"] is True and o["image_seen_from"] == "source"
    # NXtomo's rotation_angle is signed (a right-handed turn about the axis): a stage that turned the other
    # way stores falling angles, read as they are, so the reading's sense is ccw for both turns.
    assert o["rotation_direction"] == "ccw"


# ------------------------------------------------------------------ DXchange (parallel beam)
@pytest.mark.parametrize("variant", ["degrees", "radians-no-units"])
def test_dxchange_parallel_beam(tmp_path, variant):
    spec = spec_of("ccw", offset=1.7, beam="parallel", seed=15)
    t, (proj, flats, darks) = transmission(spec)
    cam = lambda a: np.ascontiguousarray(a[..., ::-1])     # noqa: E731
    path = write_dxchange(tmp_path / "scan.h5", cam(proj), cam(flats), cam(darks), np.degrees(spec.angles),
                          resolution_um=spec.pitch * 1e3, theta=variant)
    r = check(tmp_path, path, spec, t)
    # A parallel beam's data cannot tell the handedness: the camera convention is taken, and the report says so.
    assert any("parallel beam's data cannot tell the handedness" in w for w in r["warnings"])
    if variant == "radians-no-units":
        assert any("read as radians" in w for w in r["warnings"])

