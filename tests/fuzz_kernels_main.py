"""Fuzz every kernel family with random geometry, finite or not (run as a script, in a subprocess).

Called by tests/test_fuzz_kernels.py; also the script of the AddressSanitizer
run (docs/RELIABILITY.md):

    CTBENCH_CXXFLAGS="-fsanitize=address -fno-omit-frame-pointer" \
    CTBENCH_CACHE_DIR=/tmp/ctbench-asan ASAN_OPTIONS=detect_leaks=0 \
    LD_PRELOAD=$(g++ -print-file-name=libasan.so) python tests/fuzz_kernels_main.py 300

The kernels are called directly (no Python geometry checks in the way):
joseph forward and backprojection, the joseph_grad geometry VJP, the FDK
weighted backprojection, and the reference backend.  Geometry values mix
ordinary numbers with NaN, +-inf, 0, huge, tiny and integer-valued (rays on
voxel planes) ones; windows, tiles, spacings and sizes vary too.  Passing
means: every call returns (no crash, no sanitizer report) with outputs of the
right shape, and a view whose geometry is not finite contributes exactly 0
to the forward projection.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ctbench.engine.base import Rays, Tile, VolumeGrid  # noqa: E402
from ctbench.engine.cpu import CpuBackend  # noqa: E402
from ctbench.engine.fdk_kernels import weighted_backproject  # noqa: E402
from ctbench.engine.reference import ReferenceBackend  # noqa: E402

SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30, 1e-30, 3e38, -1e300, 5e-324, 1.0, 2.0, -3.0]
value = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf]), st.sampled_from(SPECIAL),
                  st.floats(-300.0, 300.0, allow_nan=False, allow_infinity=False), st.integers(-20, 20).map(float))
# Directions: axis-aligned ones (rays on voxel planes: the planar paths) and arbitrary ones.
angle = st.one_of(st.sampled_from([0.0, math.pi / 2, math.pi, -math.pi / 2, math.pi / 4]),
                  st.floats(-math.pi, math.pi, allow_nan=False))


def _unit(theta, phi):
    return [math.cos(theta) * math.cos(phi), math.sin(theta) * math.cos(phi), math.sin(phi)]


@st.composite
def cases(draw):
    """A scan whose rays mostly cross the volume (so the unchecked interior loops run), then
    0-4 geometry values replaced by NaN, inf, huge, tiny or arbitrary numbers."""
    n_views = draw(st.integers(1, 3))
    D, H, W = (draw(st.integers(1, 8)) for _ in range(3))
    U, V = draw(st.integers(1, 20)), draw(st.integers(1, 20))  # up to 20: full SIMD lane groups (16) and tails
    spacing = tuple(draw(st.sampled_from([1.0, 1.0, 0.7, 2.5, 1e-3, 1e3, 1e-30, 1e30])) for _ in range(3))
    extent = max(n * s for n, s in zip((W, H, D), spacing[::-1]))
    cone = draw(st.booleans())
    geo = [[], [], [], []]
    for _ in range(n_views):
        theta, phi = draw(angle), draw(st.one_of(st.just(0.0), st.floats(-1.2, 1.2)))
        d = _unit(theta, phi)
        e1 = [-math.sin(theta), math.cos(theta), 0.0]
        e2 = [-math.cos(theta) * math.sin(phi), -math.sin(theta) * math.sin(phi), math.cos(phi)]
        sid = extent * draw(st.floats(0.6, 20.0))
        sdd = sid + extent * draw(st.floats(0.6, 20.0))
        pitch = extent * draw(st.floats(0.05, 2.0)) * (sdd / sid if cone else 1.0) / max(U, V)
        geo[0].append([sid * x for x in d] if cone else [-x for x in d])
        geo[1].append([(sid - sdd) * x for x in d] if cone else [-extent * x for x in d])
        geo[2].append([pitch * x for x in e1])
        geo[3].append([pitch * x for x in e2])
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 4]))):
        f, k, q = draw(st.integers(0, 3)), draw(st.integers(0, n_views - 1)), draw(st.integers(0, 2))
        geo[f][k][q] = draw(value)
    z0, z1, u0, u1, v0, v1 = 0, D, 0, U, 0, V
    if draw(st.integers(0, 2)) == 0:  # a window: a z-slab and a detector tile (may be empty)
        z0 = draw(st.integers(0, D))
        z1 = draw(st.integers(z0, D))
        u0 = draw(st.integers(0, U))
        u1 = draw(st.integers(u0, U))
        v0 = draw(st.integers(0, V))
        v1 = draw(st.integers(v0, V))
    return dict(geo=geo, shape=(D, H, W), det=(U, V), spacing=spacing, z=(z0, z1), tile=Tile(u0, u1, v0, v1),
                cone=cone, dtype=draw(st.sampled_from([torch.float32, torch.float64])),
                batch=draw(st.integers(1, 2)))


# The case of the issue (a NaN source coordinate on the axis the ray's stencil
# interpolates along): before the fix, joseph_forward indexed memory with
# (int)NaN in its unchecked interior loop and died with SIGSEGV.
ISSUE_CASE = dict(geo=[[[50.0, math.nan, 0.0]], [[-50.0, 0.0, 0.0]], [[0.0, 2.0, 0.0]], [[0.0, 0.0, 2.0]]],
                  shape=(4, 4, 4), det=(4, 4), spacing=(1.0, 1.0, 1.0), z=(0, 4), tile=Tile(0, 4, 0, 4), cone=True,
                  dtype=torch.float32, batch=1)
CPU, REF = CpuBackend(), ReferenceBackend()


def run_case(c) -> None:
    dtype = c["dtype"]
    src, ctr, u, v = (torch.tensor(g, dtype=torch.float64).to(dtype) for g in c["geo"])
    rays = Rays(src, ctr, u, v, c["cone"], c["det"])
    grid = VolumeGrid(c["shape"], c["spacing"])
    (z0, z1), tile, B = c["z"], c["tile"], c["batch"]
    nz = z1 - z0
    nu, nv = tile.shape
    vol = torch.rand((B, nz, grid.H, grid.W), dtype=dtype)
    sino = torch.rand((B, rays.n_views, nu, nv), dtype=dtype)
    fwd = CPU.project(vol, grid, z0, rays, tile)
    assert fwd.shape == (B, rays.n_views, nu, nv)
    finite_view = torch.stack([torch.isfinite(t).all(dim=1) for t in rays.tensors()]).all(dim=0)
    assert torch.all(fwd[:, ~finite_view] == 0), "a non-finite view contributed to the projection"
    back = CPU.backproject(sino, grid, z0, z1, rays, tile)
    assert back.shape == (B, nz, grid.H, grid.W)
    if nz > 0 and nu > 0 and nv > 0:
        grads = CPU.geometry_vjp(vol, grid, z0, sino, rays, tile)
        assert all(g.shape == (rays.n_views, 3) for g in grads)
        assert all(torch.all(g[~finite_view] == 0) for g in grads), "a non-finite view got a gradient"
    if tile == Tile.full(c["det"]):
        w = torch.rand(rays.n_views, dtype=dtype)
        out = weighted_backproject(sino[0], rays, grid, w, z0=z0, z1=z1, backend="cpu")
        assert out.shape == (nz, grid.H, grid.W)
    # the reference backend: plain torch, must not crash either (its huge-value
    # index arithmetic is masked); kept to small cases for speed
    if nz * grid.H * grid.W <= 64:
        r = REF.project(vol, grid, z0, rays, tile)
        assert r.shape == fwd.shape
        r = REF.backproject(sino, grid, z0, z1, rays, tile)
        assert r.shape == back.shape


def main(n_examples: int) -> None:
    torch.set_num_threads(2)

    @settings(max_examples=n_examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(cases())
    @example(ISSUE_CASE)
    def fuzz(c):
        run_case(c)

    fuzz()
    print(f"FUZZ OK {n_examples} examples")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
