"""Several devices in one process: ``Projector(..., devices=[...])``.

Views are split into contiguous shards in the order of the device list; each
shard runs the ordinary differentiable windowed pair (``project_op`` /
``backproject_op``) on its device, so autograd works across shards with the
ordinary full-sinogram loss (no scaling).  Outputs return to the input
tensor's device: projections are concatenated along the views, partial
backprojections summed in device-list order (deterministic).

Shards run concurrently, one thread per shard: CUDA kernels of different
devices overlap, and for several CPU "devices" (testing, multi-socket
machines) each shard's kernels get their share of ``torch.get_num_threads()``
OpenMP threads.  With CPU-backed input and a CUDA shard the executor streams
the input to the device (pinned buffers, overlapped copies) instead of
copying it whole.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from . import get_backend
from .base import Rays
from .executor import make_executor
from .ops import backproject_op, project_op
from .plan import Plan


def parse_devices(devices) -> list[torch.device]:
    """A non-empty list of devices from strings, ints (CUDA ordinals) or torch.device."""
    if isinstance(devices, (str, int, torch.device)):
        devices = [devices]
    try:
        items = list(devices)
    except TypeError:
        raise ValueError(f"devices must be a list of devices such as ['cuda:0', 'cuda:1'] or ['cpu', 'cpu'], "
                         f"got {devices!r}") from None
    if not items:
        raise ValueError("devices must name at least one device, got an empty list")
    out = []
    for d in items:
        try:
            dev = torch.device("cuda", d) if isinstance(d, int) and not isinstance(d, bool) else torch.device(d)
        except (TypeError, RuntimeError, ValueError):
            raise ValueError(f"devices: {d!r} is not a device (expected e.g. 'cuda:0', 0 or 'cpu')") from None
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"devices: only 'cpu' and CUDA devices are supported, got {dev}")
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", 0)
        out.append(dev)
    return out


def view_shards(n_views: int, n_devices: int) -> list[tuple[int, int]]:
    """Contiguous, balanced view ranges, one per device (the first ones one view larger)."""
    base, extra = divmod(n_views, n_devices)
    bounds, start = [], 0
    for k in range(n_devices):
        stop = start + base + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def thread_shares(n_shards: int, total: int | None = None) -> list[int]:
    """Split ``total`` OpenMP threads (default torch's count) among CPU shards, at least one each."""
    total = max(1, torch.get_num_threads() if total is None else total)
    base, extra = divmod(total, n_shards)
    return [max(1, base + (1 if k < extra else 0)) for k in range(n_shards)]


@contextlib.contextmanager
def cpu_thread_share(count: int | None):
    """Run the CPU kernels called from this thread with ``count`` OpenMP threads."""
    from .cpu import backend as cpu

    previous = getattr(cpu._THREAD_SHARE, "count", None)
    cpu._THREAD_SHARE.count = count
    try:
        yield
    finally:
        cpu._THREAD_SHARE.count = previous


class MultiDeviceStrategy:
    """Views split into contiguous shards over ``devices``; outputs on the input's device."""

    def __init__(self, projector, devices):
        self.p = projector
        self.devices = parse_devices(devices)
        backend_name = projector.backend_name
        for d in self.devices:
            backend = get_backend(backend_name, d)
            if not backend.supports(d):
                raise ValueError(f"devices: backend {backend.name!r} cannot run on {d}; choose backend='auto' "
                                 "or devices of the backend's kind")
            if d.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"devices: {d} requested but CUDA is not available in this torch build or machine")
            if d.type == "cuda" and d.index >= torch.cuda.device_count():
                raise ValueError(f"devices: {d} does not exist (this machine has {torch.cuda.device_count()} "
                                 "CUDA devices)")

    # -------------------------------------------------------------- shards
    def _shards(self, n_views: int):
        return [(d, a, b) for d, (a, b) in zip(self.devices, view_shards(n_views, len(self.devices))) if b > a]

    def _executor(self, device: torch.device, data_device: torch.device):
        """The shard's executor and the device its inputs must be moved to."""
        p = self.p
        if device.type == "cuda" and data_device.type == "cpu":
            backend = get_backend(p.backend_name, device)
            return make_executor(backend, p.grid, p.detector_shape, p.options, compute_device=device), data_device
        return p._executor(device), device

    def _run(self, jobs):
        """Run shard jobs ``(device, fn)`` concurrently, one thread each; results in shard order."""
        grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
        cpu_jobs = [k for k, (d, _) in enumerate(jobs) if d.type == "cpu"]
        shares = dict(zip(cpu_jobs, thread_shares(len(cpu_jobs)))) if cpu_jobs else {}

        def call(k, device, fn):
            # Grad and inference modes are thread-local: carry the caller's into the worker.
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                if device.type == "cuda":
                    with torch.cuda.device(device):
                        return fn()
                with cpu_thread_share(shares.get(k)):
                    return fn()

        if len(jobs) == 1:
            return [call(0, *jobs[0])]
        results: list = [None] * len(jobs)
        errors: list = [None] * len(jobs)

        def worker(k, device, fn):
            try:
                results[k] = call(k, device, fn)
            except BaseException as e:  # re-raised in the caller's thread
                errors[k] = e

        threads = [threading.Thread(target=worker, args=(k, d, fn), name=f"ctbench-shard-{k}", daemon=True)
                   for k, (d, fn) in enumerate(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for e in errors:
            if e is not None:
                raise e
        return results

    # ----------------------------------------------------------- operators
    def project(self, vol4: torch.Tensor, rays: Rays) -> torch.Tensor:
        p = self.p
        home = vol4.device
        z0 = p.volume_slice.start
        shards = self._shards(rays.n_views)

        def job(device, a, b):
            def fn():
                ex, where = self._executor(device, home)
                r = rays.views(a, b)
                return project_op(vol4.to(where), *(t.to(where) for t in r.tensors()), ex, z0, rays.cone,
                                  p.detector_shape)
            return device, fn

        parts = self._run([job(d, a, b) for d, a, b in shards])
        parts = [part.to(home) for part in parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def backproject(self, sino4: torch.Tensor, rays: Rays) -> torch.Tensor:
        p = self.p
        home = sino4.device
        z0, z1 = p.volume_slice.start, p.volume_slice.stop
        shards = self._shards(rays.n_views)

        def job(device, a, b):
            def fn():
                ex, where = self._executor(device, home)
                r = rays.views(a, b)
                return backproject_op(sino4[:, a:b].to(where), *(t.to(where) for t in r.tensors()), ex, z0, z1,
                                      rays.cone, p.detector_shape)
            return device, fn

        parts = self._run([job(d, a, b) for d, a, b in shards])
        total = parts[0].to(home)
        for part in parts[1:]:
            total = total + part.to(home)
        return total

    def inner_volume(self, a, b):
        return (a * b).sum()

    def inner_projection(self, a, b):
        return (a * b).sum()

    # ------------------------------------------------------------ planning
    def plan(self, kind: str, batch: int, dtype: torch.dtype, data_device) -> Plan:
        """The plan of the first (largest) shard, on the first device."""
        p = self.p
        device, (a, b) = self.devices[0], view_shards(p.projection_shape[0], len(self.devices))[0]
        ex, where = self._executor(device, torch.device(data_device))
        return ex.plan(kind, batch, p.volume_slice.start, p.volume_slice.stop, b - a, dtype, where)
