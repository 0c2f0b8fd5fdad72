"""The CPU kernels' per-thread kept buffers (kernels/cpu_helpers.hpp, KeptBlocks).

The forward's padded copies and the backprojection's accumulators of small slabs stay allocated between calls,
one block per slot and calling thread, and are reused by the next call that fits.  A reused block holds the
previous call's data, so every call must overwrite or zero what it reads: calls of different sizes in turn
(a smaller one into a larger block, a larger one that replaces it), and calls from several Python threads at
once (each its own blocks), must give what the same call gives alone, bitwise, and agree with the reference
backend.
"""

import math
import threading

import pytest
import torch

from ctbench import Projector, circular_trajectory_3d

SIZES = (24, 40, 17)  # all below the kept blocks' 8 MiB: the padded copies and accumulators are kept


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _projector(n, backend="cpu"):
    traj = circular_trajectory_3d(24, 6.0 * n, 12.0 * n, angle_range=2 * math.pi, dtype=torch.float32)
    return Projector(traj, (n, n, n), (n + 4, n + 2), backend=backend, voxel_spacing=1.0, detector_spacing=1.8)


def _inputs(n):
    g = torch.Generator().manual_seed(n)
    return torch.rand((n, n, n), generator=g), torch.rand((24, n + 4, n + 2), generator=g)


def _both(n):
    p = _projector(n)
    vol, sino = _inputs(n)
    return p.project(vol), p.backproject(sino)


def test_calls_of_other_sizes_in_turn_equal_each_call_alone():
    torch.set_num_threads(2)
    first = {n: _both(n) for n in SIZES}
    # again, in the other order: each call now finds blocks left by calls of other sizes
    for n in reversed(SIZES):
        fwd, back = _both(n)
        assert torch.equal(fwd, first[n][0]), n
        assert torch.equal(back, first[n][1]), n
    for n in SIZES:
        vol, sino = _inputs(n)
        ref = _projector(n, "reference")
        want_f, want_b = ref.project(vol.double()), ref.backproject(sino.double())
        assert float((first[n][0].double() - want_f).abs().max()) <= 1e-4 * float(want_f.abs().max()), n
        assert float((first[n][1].double() - want_b).abs().max()) <= 1e-4 * float(want_b.abs().max()), n


def test_threads_calling_at_once_keep_their_own_blocks():
    torch.set_num_threads(1)
    want = {n: _both(n) for n in SIZES}
    errors, results = [], {}

    def work(n):
        try:
            results[n] = [_both(n) for _ in range(3)]
        except Exception as e:  # surfaced below, with the thread's size
            errors.append((n, repr(e)))

    threads = [threading.Thread(target=work, args=(n,)) for n in SIZES]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for n in SIZES:
        for fwd, back in results[n]:
            assert torch.equal(fwd, want[n][0]), n
            assert torch.equal(back, want[n][1]), n
