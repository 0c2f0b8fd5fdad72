"""What iterative solvers yield and return, and the loop they share.

Every iterative solver is a generator underneath: it yields an
:class:`IterationState` after each iteration (the GUI and the job worker
show progress and previews from it, and may stop between iterations).  The
public functions run the generator to the end and return a
:class:`ReconResult`.

Stopping rules, checked between iterations in this order:

- ``cancel`` (a ``threading.Event`` or a callable returning True) is set:
  the solver stops *before* starting another iteration, so it ends within
  one iteration of the request (``stopped="cancelled"``);
- ``callback(state)`` returned ``True`` (``stopped="callback"``);
- the solver's tolerance test passed (``stopped="tol"``);
- ``n_iter`` iterations ran (``stopped="completed"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator, Iterator

import torch


@dataclass(frozen=True)
class IterationState:
    """One iteration's outcome.

    ``iteration`` counts from 1; ``residual`` is the data residual norm
    ``||A x - b||`` (global over all rays) after the iteration; ``volume`` is
    the current estimate (a tensor the solver does not modify afterwards);
    ``extra`` holds solver-specific numbers (relative residual, objective, ...).
    """

    iteration: int
    residual: float
    volume: torch.Tensor
    extra: dict = field(default_factory=dict)


@dataclass
class ReconResult:
    """Result of an iterative solver.

    ``volume``: the final estimate; ``residuals``: ``||A x - b||`` after each
    iteration; ``n_iter``: iterations run; ``stopped``: why the solver stopped
    (``"completed"``, ``"tol"``, ``"cancelled"`` or ``"callback"``);
    ``history``: the ``extra`` dict of every iteration.
    """

    volume: torch.Tensor
    residuals: list[float]
    n_iter: int
    stopped: str
    history: list[dict] = field(default_factory=list)


def is_cancelled(cancel) -> bool:
    if cancel is None:
        return False
    is_set = getattr(cancel, "is_set", None)
    if callable(is_set):
        return bool(is_set())
    return bool(cancel())


StepFn = Callable[[], tuple[float, torch.Tensor, dict]]


def iterate(step: StepFn, n_iter: int, *, converged: Callable[[IterationState], bool] | None,
            callback, cancel) -> Generator[IterationState, None, str]:
    """Run ``step`` up to ``n_iter`` times, yielding states; returns the stop reason."""
    for it in range(1, n_iter + 1):
        if is_cancelled(cancel):
            return "cancelled"
        residual, volume, extra = step()
        state = IterationState(it, float(residual), volume, extra)
        stop_requested = callback is not None and callback(state) is True
        yield state
        if stop_requested:
            return "callback"
        if converged is not None and converged(state):
            return "tol"
    return "completed"


def run_to_end(gen: Iterator[IterationState], x0: torch.Tensor) -> ReconResult:
    """Consume a solver generator and collect its history into a :class:`ReconResult`."""
    residuals: list[float] = []
    history: list[dict] = []
    volume = x0
    n = 0
    while True:
        try:
            state = next(gen)
        except StopIteration as stop:
            reason = stop.value if isinstance(stop.value, str) else "completed"
            break
        residuals.append(state.residual)
        history.append(dict(state.extra))
        volume = state.volume
        n = state.iteration
    return ReconResult(volume=volume, residuals=residuals, n_iter=n, stopped=reason, history=history)
