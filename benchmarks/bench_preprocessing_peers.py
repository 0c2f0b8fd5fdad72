"""Corrections and centre finding side by side with algotom (an optional peer), on the same simulated data.

Accuracy, not speed: every figure is an error against the truth the data was
made from (exact analytic line integrals of the Shepp-Logan phantom, planted
offsets, stripes and zingers, the textbook Paganin formula).

1. ``centre``: detector offset found by ctbench's ``find_centre`` (conjugate
   rays, with the sharpness sweep as cross-check) and by algotom's
   ``find_center_vo`` on 360-degree parallel-beam scans and on the mid-plane
   of 360-degree cone-beam scans (algotom gets the first 180 degrees, the
   input its method is made for; ctbench's conjugate rays need the pairs
   180 degrees apart), and on 180-degree parallel-beam scans with both end
   views (0 and 180 degrees; both finders get the same 181 views), with
   known non-integer offsets and Poisson noise.  Error in pixels.
2. ``rings``: stripes planted in a sinogram; the part of each stripe left
   (mean planted amplitude over mean residual: the reduction factor) and the
   change elsewhere (mean and max |change| off the stripes, relative to the
   largest line integral) for ctbench's median, sorting and wavelet-Fourier
   filters and algotom's sorting (and wavelet-FFT) ones.
3. ``zingers``: hits planted in noisy transmission images; found, missed,
   false positives and the error left, for ctbench's ``remove_outliers`` and
   algotom's ``remove_zinger``.
4. ``paganin``: ctbench's ``paganin`` against the textbook formula (written
   out in this file) and against algotom's ``fresnel_filter`` (algotom 1.7 has
   no Paganin function; its Fresnel window ``1 + ratio (u^2 + v^2)``, applied
   to the intensity without its log, is Paganin's divisor for
   ``ratio = (2 pi)^2 z lambda (delta/beta) / (4 pi pixel^2)``).

    pip install algotom     # the `peers` extra; never a runtime dependency
    python benchmarks/bench_preprocessing_peers.py [--quick] [--out benchmarks/results/bench_preprocessing_peers.jsonl]

JSON lines on stdout, appended to ``--out``; every line carries the CPU model.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import cpu_model  # noqa: E402

from ctbench.geometry import circular_trajectory_2d_parallel, circular_trajectory_3d  # noqa: E402
from ctbench.io.scan import sinogram_to_images  # noqa: E402
from ctbench.phantoms import shepp_logan_line_integrals  # noqa: E402
from ctbench.preprocessing import (OutlierReport, find_centre, mid_plane_sinogram, paganin,  # noqa: E402
                                   remove_outliers, remove_stripes, remove_stripes_sorting, remove_stripes_wavelet,
                                   wavelength_mm)

RUN_ID = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


CPU = cpu_model()


def emit(out, **rec):
    rec = {"bench": "preprocessing_peers", "run_id": RUN_ID, "cpu": CPU} | rec
    line = json.dumps(rec)
    print(line, flush=True)
    if out is not None:
        with open(out, "a") as f:
            f.write(line + "\n")


def _r(x, d=4):
    return None if x is None else float(f"{x:.{d}g}")


def _noisy(p, photons, rng):
    """Poisson counts around ``photons`` for line integrals ``p``, back to line integrals."""
    counts = rng.poisson(photons * np.exp(-p)).astype(np.float64)
    return -np.log(np.clip(counts, 1, None) / photons)


# ------------------------------------------------------------------ 1. centre
def bench_centre(out, quick, rng):
    from algotom.prep.calculation import find_center_vo

    offsets = [-7.3, -2.6, 3.3, 8.8] if not quick else [-2.6, 3.3]
    U = 256
    for geometry in ("parallel-360", "cone-360", "parallel-180"):
        for off in offsets:
            for photons in (2e4, 2e3):
                if geometry == "parallel-360":
                    # ctbench's conjugate-ray method pairs views 180 degrees apart, so it gets the full turn;
                    # algotom's find_center_vo is made for 180 degrees and gets the first half
                    n = 360
                    ang = torch.linspace(0, 2 * math.pi, n + 1, dtype=torch.float64)[:-1]
                    traj = circular_trajectory_2d_parallel(angles=ang, detector_offset=off * 1.0, dtype=torch.float64)
                    sino = shepp_logan_line_integrals(traj, U, 1.0, scale=100.0).numpy()
                    sino = _noisy(sino * 0.02, photons, rng)         # line integrals up to ~1.5
                    res = find_centre(sino, ang.numpy(), 1.0)
                    half = sino[: n // 2]
                elif geometry == "parallel-180":
                    # a half turn with both end views, as beamlines write it: the same data for both finders
                    n = 181
                    ang = torch.linspace(0, math.pi, n, dtype=torch.float64)
                    traj = circular_trajectory_2d_parallel(angles=ang, detector_offset=off * 1.0, dtype=torch.float64)
                    sino = shepp_logan_line_integrals(traj, U, 1.0, scale=100.0).numpy()
                    sino = _noisy(sino * 0.02, photons, rng)
                    res = find_centre(sino, ang.numpy(), 1.0)
                    half = sino
                else:
                    n = 360
                    ang = torch.linspace(0, 2 * math.pi, n + 1, dtype=torch.float64)[:-1]
                    traj = circular_trajectory_3d(angles=ang, sid=200.0, sdd=400.0, detector_offset=(off * 1.0, 0.0),
                                                  dtype=torch.float64)
                    sino3 = shepp_logan_line_integrals(traj, (U, 6), 1.0, scale=50.0).numpy()
                    images = _noisy(sinogram_to_images(sino3) * 0.04, photons, rng)
                    res = find_centre(images, ang.numpy(), 1.0, sid=200.0, sdd=400.0)
                    half = mid_plane_sinogram(images, half_rows=2)[: n // 2]
                c = find_center_vo(half.astype(np.float32), ncore=1)
                algotom_px = (U - 1) / 2 - c                 # axis at column (U-1)/2 - offset
                emit(out, case="centre", geometry=geometry, true_offset_px=off, photons=photons, detector_cols=U,
                     n_views=n, ctbench_px=_r(res.offset_px, 6), ctbench_error_px=_r(abs(res.offset_px - off)),
                     ctbench_cross_check_px=_r(res.cross_check_px, 6),
                     ctbench_cross_check_error_px=_r(abs(res.cross_check_px - off)),
                     algotom_px=_r(algotom_px, 6), algotom_error_px=_r(abs(algotom_px - off)),
                     ctbench_at_least_as_accurate=bool(abs(res.offset_px - off) <= abs(algotom_px - off) + 1e-9))


# ------------------------------------------------------------------ 2. rings
def _striped(rng, n_views, U):
    ang = torch.linspace(0, math.pi, n_views + 1, dtype=torch.float64)[:-1]
    traj = circular_trajectory_2d_parallel(angles=ang, dtype=torch.float64)
    clean = shepp_logan_line_integrals(traj, U, 1.0, scale=0.4 * U).numpy()
    clean = 2.0 * clean / clean.max()
    cols = np.sort(rng.choice(np.arange(U // 8, U - U // 8), 12, replace=False))
    amp = rng.choice([-1, 1], cols.size) * rng.uniform(0.01, 0.04, cols.size)
    stripes = np.zeros(U)
    stripes[cols] = amp
    return clean, clean + stripes[None], cols, amp


def bench_rings(out, quick, rng):
    from algotom.prep.removal import remove_stripe_based_sorting, remove_stripe_based_wavelet_fft

    n_views, U = (720, 512) if not quick else (360, 256)
    clean, dirty, cols, amp = _striped(rng, n_views, U)
    others = np.ones(U, bool)
    others[cols] = False
    methods = {
        "ctbench median (size 9)": lambda s: remove_stripes(s[:, None, :], 9)[:, 0],
        "ctbench sorting (size 11)": lambda s: remove_stripes_sorting(s, 11),
        "ctbench sorting (size 21)": lambda s: remove_stripes_sorting(s, 21),
        "ctbench wavelet-Fourier (db5, level 3, sigma 1)": lambda s: remove_stripes_wavelet(s, 3, 1.0, "db5"),
        "algotom sorting (size 11)": lambda s: remove_stripe_based_sorting(s, 11),
        "algotom sorting (size 21)": lambda s: remove_stripe_based_sorting(s, 21),
        "algotom wavelet-FFT (db5, level 3, size 1)": lambda s: remove_stripe_based_wavelet_fft(s, 3, 1, "db5"),
    }
    results = {}
    for name, f in methods.items():
        fixed = np.asarray(f(dirty.astype(np.float32)), dtype=np.float64)
        results[name] = fixed
        residual = (fixed - clean)[:, cols].mean(axis=0)
        change = np.abs(fixed - clean)[:, others]
        emit(out, case="rings", method=name, n_views=n_views, detector_cols=U, n_stripes=int(cols.size),
             stripe_amplitude_mean=_r(np.abs(amp).mean()),
             reduction_factor_mean=_r(np.abs(amp).mean() / np.abs(residual).mean()),
             reduction_factor_worst=_r(np.min(np.abs(amp) / np.maximum(np.abs(residual), 1e-12))),
             object_change_mean_rel=_r(change.mean() / clean.max()),
             object_change_max_rel=_r(change.max() / clean.max()))
    for size in (11, 21):
        d = np.abs(results[f"ctbench sorting (size {size})"] - results[f"algotom sorting (size {size})"]).max()
        emit(out, case="rings", method=f"ctbench vs algotom sorting (size {size})", max_abs_difference=_r(d))


# ------------------------------------------------------------------ 3. zingers
def bench_zingers(out, quick, rng):
    from algotom.prep.removal import remove_zinger

    n, rows, cols = (24, 128, 160) if not quick else (6, 64, 80)
    r, c = np.mgrid[0:rows, 0:cols].astype(np.float64)
    clean = np.stack([np.exp(-(0.9 * np.exp(-((r - rows / 2) ** 2 + (c - cols / 2 - 20 * math.cos(2 * math.pi * k / n)) ** 2)
                                           / (2 * (rows / 6) ** 2))
                               + 0.4 * np.exp(-((r - rows / 3) ** 2 + (c - cols / 3) ** 2) / (2 * (rows / 10) ** 2))))
                      for k in range(n)])
    noisy = clean + rng.normal(0, 2e-3, clean.shape)
    n_hits = clean.size // 500
    hits = np.unravel_index(rng.choice(clean.size, n_hits, replace=False), clean.shape)
    planted = np.zeros(clean.shape, bool)
    planted[hits] = True
    dirty = noisy.copy()
    dirty[hits] += rng.uniform(0.1, 0.6, n_hits)
    rep = OutlierReport()
    ours = remove_outliers(dirty, 0.05, 3, sign="bright", report=rep)
    theirs = np.stack([remove_zinger(d.astype(np.float32), 0.05, size=1) for d in dirty])
    for name, fixed, note in (("ctbench remove_outliers (threshold 0.05 absolute, 3x3 median)", ours, None),
                              ("algotom remove_zinger (threshold 0.05 relative, 3x3 mean)", theirs, None)):
        changed = np.asarray(fixed, np.float32) != dirty.astype(np.float32)
        err = np.abs(np.asarray(fixed, np.float64) - clean)
        emit(out, case="zingers", method=name, n_values=int(clean.size), n_planted=int(n_hits),
             found=int((changed & planted).sum()), missed=int((~changed & planted).sum()),
             false_positives=int((changed & ~planted).sum()),
             error_at_hits_max=_r(err[planted].max()), error_at_hits_mean=_r(err[planted].mean()),
             rmse_vs_clean=_r(np.sqrt((err ** 2).mean())), rmse_noisy_vs_clean=_r(np.sqrt(((noisy - clean) ** 2).mean())),
             reported_replaced=rep.n_replaced if name.startswith("ctbench") else None)


# ------------------------------------------------------------------ 4. Paganin
def _textbook(t, pixel, db, energy, z):
    lam = 12.398419843320026e-7 / energy
    rows, cols = t.shape
    fy = np.array([(i if i < (rows + 1) // 2 else i - rows) for i in range(rows)]) / (rows * pixel)
    fx = np.array([(j if j < (cols + 1) // 2 else j - cols) for j in range(cols)]) / (cols * pixel)
    k2 = 4 * math.pi ** 2 * (fy[:, None] ** 2 + fx[None, :] ** 2)
    return -np.log(np.real(np.fft.ifft2(np.fft.fft2(t) / (1 + z * lam * db / (4 * math.pi) * k2))))


def bench_paganin(out, quick, rng):
    from algotom.prep.filtering import fresnel_filter

    rows, cols = (256, 320) if not quick else (96, 128)
    pixel, energy, z, db = 1.5e-3, 25.0, 60.0, 400.0
    y, x = np.mgrid[0:rows, 0:cols].astype(np.float64)
    muT = (0.6 * np.exp(-((y - rows / 2) ** 2 + (x - cols / 2) ** 2) / (2 * (rows / 8) ** 2))
           + 0.3 * np.exp(-((y - rows / 3) ** 2 + (x - 2 * cols / 3) ** 2) / (2 * (rows / 24) ** 2)))
    a = z * wavelength_mm(energy) * db / (4 * math.pi)
    ratio = (2 * math.pi) ** 2 * a / pixel ** 2
    # the image the TIE predicts for this single-material object (Paganin's Eq. 7, applied in Fourier space),
    # with 1% noise: Paganin's retrieval should undo the phase contrast, -log should not
    ky = 2 * math.pi * np.fft.fftfreq(rows, d=pixel)
    kx = 2 * math.pi * np.fft.fftfreq(cols, d=pixel)
    tie = np.real(np.fft.ifft2(np.fft.fft2(np.exp(-muT)) * (1 + a * (ky[:, None] ** 2 + kx[None, :] ** 2))))
    t = np.clip(tie + rng.normal(0, 0.01, muT.shape), 0.05, None)
    ours = paganin(t, pixel, delta_beta=db, energy_kev=energy, distance_mm=z, pad=0).astype(np.float64)
    book = _textbook(t, pixel, db, energy, z)
    theirs = -np.log(np.asarray(fresnel_filter(t, ratio, dim=2, pad=0, apply_log=False), np.float64))
    scale = np.abs(book).max()
    emit(out, case="paganin", comparison="ctbench vs textbook formula (pad 0)", image=[rows, cols],
         filter_px2=_r(a / pixel ** 2), max_rel_difference=_r(np.abs(ours - book).max() / scale),
         within_1e_3=bool(np.abs(ours - book).max() <= 1e-3 * scale))
    emit(out, case="paganin", comparison="ctbench vs algotom fresnel_filter(apply_log=False) (pad 0)",
         image=[rows, cols], ratio=_r(ratio), max_rel_difference=_r(np.abs(ours - theirs).max() / scale),
         within_1e_3=bool(np.abs(ours - theirs).max() <= 1e-3 * scale))
    ours_p = paganin(t, pixel, delta_beta=db, energy_kev=energy, distance_mm=z, pad=64).astype(np.float64)
    book_p = _textbook(np.pad(t, 64, mode="edge"), pixel, db, energy, z)[64:-64, 64:-64]
    theirs_p = -np.log(np.asarray(fresnel_filter(t, ratio, dim=2, pad=64, apply_log=False), np.float64))
    emit(out, case="paganin", comparison="ctbench vs textbook formula on the edge-padded image (pad 64)",
         image=[rows, cols], max_rel_difference=_r(np.abs(ours_p - book_p).max() / scale),
         within_1e_3=bool(np.abs(ours_p - book_p).max() <= 1e-3 * scale))
    emit(out, case="paganin", comparison="ctbench vs algotom fresnel_filter(apply_log=False) (pad 64; algotom "
         "edge-pads its window instead of recomputing it on the padded grid)", image=[rows, cols],
         max_rel_difference=_r(np.abs(ours_p - theirs_p).max() / scale),
         within_1e_3=bool(np.abs(ours_p - theirs_p).max() <= 1e-3 * scale))
    emit(out, case="paganin", comparison="retrieved mu*T vs the true mu*T of a TIE image (noise 1% in I)",
         image=[rows, cols], filter_px2=_r(a / pixel ** 2),
         rmse_paganin=_r(np.sqrt(((ours_p - muT) ** 2).mean())),
         rmse_minus_log=_r(np.sqrt(((-np.log(t) - muT) ** 2).mean())))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller data, fewer offsets (a smoke run)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_preprocessing_peers.jsonl"))
    ap.add_argument("--only", choices=["centre", "rings", "zingers", "paganin"], action="append")
    args = ap.parse_args(argv)
    if _version("algotom") is None:
        print("bench_preprocessing_peers: algotom is not installed (pip install algotom, the `peers` extra)",
              file=sys.stderr)
        return 2
    out = None if args.quick else args.out
    emit(out, case="header", algotom=_version("algotom"), ctbench=_version("ctbench"), numpy=np.__version__,
         loadavg=os.getloadavg(), quick=args.quick)
    rng = np.random.default_rng(2018)
    for name, fn in (("centre", bench_centre), ("rings", bench_rings), ("zingers", bench_zingers),
                     ("paganin", bench_paganin)):
        if args.only is None or name in args.only:
            fn(out, args.quick, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
