"""Background work: napari thread workers with one error path, below the GUI thread's priority, one pool
thread kept free, a process spawner of normal priority, and workers that never outlive their widget."""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from concurrent.futures import Future
from typing import Callable

log = logging.getLogger("ctbench_napari")


def start_worker(func: Callable, *args, on_yield=None, on_return=None, on_error=None, on_finished=None,
                 owner=None, cancel: Callable[[], None] | None = None):
    """Run ``func`` in a napari thread worker with one error path: ``on_error`` and nothing else.

    napari's workers also show every error as a traceback notification and
    superqt re-raises errors nobody handles, which aborts a script that has
    no ``napari.run()``; the widgets show the error once, in their own words.
    A RuntimeError of a generator ``func`` reaches ``on_error`` too (see WorkerRuntimeError).

    The worker never outlives its widget's reach: with ``owner`` (the widget) its callbacks are dropped
    once the owner's Qt side is gone, and ``cancel`` (or, for a generator, the worker's quit) is called
    then; no callback ever raises into Qt (an exception in a slot aborts a script without napari's
    exception hook).  At interpreter exit the workers still running are cancelled and waited for
    (``EXIT_WAIT_MS``), so none emits on signals Python has already deleted.
    """
    import inspect

    from napari.qt.threading import create_worker

    handle = on_error or (lambda e: log.error("ctbench worker failed: %s", e))
    if threading.current_thread() is threading.main_thread():
        spawner_ready()          # before any worker lowers a thread's priority (see _Spawner)
        _guard_exit()
    func, ended = _at_background_priority(func)
    generator = inspect.isgeneratorfunction(func)
    # The function's own exceptions come back as values (``_Raised``), never through the worker's ``errored``:
    # napari would show them as a traceback toast, and under PySide6 napari's own ``errored`` slot fails
    # with a TypeError for every error (it takes the signal's argument as an extra one).
    func = _errors_returned(func, generator)
    alive = _owner_alive(owner)
    connect = {"errored": _slot(lambda e: handle(e.error if isinstance(e, WorkerRuntimeError) else e), alive)}
    worker = create_worker(func, *args, _start_thread=False, _connect=connect)
    import warnings

    with warnings.catch_warnings():          # PySide6 warns instead of raising when nothing was connected
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            worker.errored.disconnect(worker._relay_error)      # the notification toast (napari's mixin)
        except (AttributeError, TypeError, RuntimeError):
            pass

    def delivered(callback):
        def route(value):
            if isinstance(value, _Raised):
                handle(value.error)
            elif callback is not None:
                callback(value)
        return route

    if on_yield is not None or generator:
        worker.yielded.connect(_slot(delivered(on_yield), alive))
    worker.returned.connect(_slot(delivered(on_return), alive))
    if on_finished is not None:
        worker.finished.connect(_slot(on_finished, alive))
    # A generator worker quit before its first step never enters the generator (superqt checks the abort
    # first), so the count also ends with the worker: either way once.
    worker.finished.connect(ended)
    stop = _stopper(worker if generator else None, cancel)
    _RUNNING[id(worker)] = stop
    worker.finished.connect(lambda key=id(worker): _RUNNING.pop(key, None))
    if owner is not None:
        _on_destroyed(owner, stop)
    keep_a_pool_thread_free()
    worker.start()
    return worker


EXIT_WAIT_MS = 15000     # how long interpreter exit waits for cancelled workers (a blocked call ends by its timeout)
_RUNNING: dict = {}      # id(worker) -> its stop(): the workers started and not yet finished
_EXIT_GUARDED = [False]


def _slot(fn, alive):
    """``fn`` as a slot that is skipped once its owner is gone and never raises into Qt (logged instead)."""

    def slot(*args):
        if not alive():
            return
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a slot that raises aborts a script without napari's hook
            log.warning("ctbench worker callback failed", exc_info=True)
    return slot


def _owner_alive(owner) -> Callable[[], bool]:
    if owner is None:
        return lambda: True
    from .layout import is_deleted

    gone = [False]
    try:
        owner.destroyed.connect(lambda *_: gone.__setitem__(0, True))
    except (AttributeError, RuntimeError, TypeError):
        pass
    return lambda: not gone[0] and not is_deleted(owner)


def _stopper(worker, cancel):
    """Stop a worker: its ``cancel`` callable, and a generator worker's quit (checked between its steps)."""

    def stop():
        for f in (cancel, getattr(worker, "quit", None)):
            if f is None:
                continue
            try:
                f()
            except (RuntimeError, AttributeError):
                pass          # the worker or its signals are already gone
    return stop


def _on_destroyed(owner, stop) -> None:
    try:
        owner.destroyed.connect(lambda *_: stop())
    except (AttributeError, RuntimeError, TypeError):
        pass


def stop_all_workers(wait_ms: int = 0) -> bool:
    """Cancel every running ctbench worker and wait up to ``wait_ms`` for Qt's pool to be idle; True if it is."""
    for stop in list(_RUNNING.values()):
        stop()
    if wait_ms <= 0:
        return not _RUNNING
    from qtpy.QtCore import QThreadPool

    return bool(QThreadPool.globalInstance().waitForDone(int(wait_ms)))


def _guard_exit() -> None:
    """At interpreter exit (before Python deletes the workers' signal objects), stop and wait for workers."""
    if _EXIT_GUARDED[0]:
        return
    import atexit

    _EXIT_GUARDED[0] = True
    atexit.register(lambda: stop_all_workers(EXIT_WAIT_MS) if _RUNNING else None)


class WorkerRuntimeError(Exception):
    """A RuntimeError raised inside a generator worker, carried (as ``error``) under a type superqt passes on.

    superqt's generator workers take any RuntimeError for "the worker was deleted" and end silently, with
    neither ``errored`` nor ``finished``: torch's out-of-memory and shape errors are RuntimeErrors, and the
    widget would wait forever with its Cancel button lit.  ``start_worker`` hands ``on_error`` the original."""

    def __init__(self, error: RuntimeError):
        super().__init__(str(error) or type(error).__name__)
        self.error = error


class _Raised:
    """An exception of a worker's function, carried as its result (see ``start_worker``)."""

    def __init__(self, error: BaseException):
        self.error = error


def _errors_returned(func, generator: bool):
    """``func`` with its exceptions returned (or, for a generator, yielded last) as ``_Raised`` values."""
    if generator:
        @functools.wraps(func)
        def gen(*args, **kwargs):
            try:
                return (yield from func(*args, **kwargs))
            except Exception as e:  # noqa: BLE001 - handed to on_error on the GUI thread
                yield _Raised(e)
        return gen

    @functools.wraps(func)
    def plain(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - handed to on_error on the GUI thread
            return _Raised(e)
    return plain


def _runtime_errors_reported(gen_func):
    """``gen_func`` with a RuntimeError from its body re-raised as WorkerRuntimeError (the errors of the
    worker's own signals, outside the generator, keep superqt's handling)."""

    @functools.wraps(gen_func)
    def guarded(*args, **kwargs):
        try:
            return (yield from gen_func(*args, **kwargs))
        except RuntimeError as e:
            raise WorkerRuntimeError(e) from e

    return guarded


BACKGROUND_NICE = 10     # how much nicer than the GUI thread a worker runs (Linux; the ``nice`` default)


def background_priority() -> None:
    """Lower the calling thread's CPU priority to the GUI thread's nice value + ``BACKGROUND_NICE`` (Linux).

    A worker's solver and the OpenMP threads it starts (libgomp gives every calling thread its own team,
    created with that thread's priority) took every core while a run went on, and the GUI thread, Qt's
    repaints and llvmpipe's rasteriser threads waited for the CPU: the window's longest stalls were during
    runs.  At a lower priority the workers still get every core the GUI leaves idle.  A thread's nice value
    can only go up without privileges, so a pool thread stays at this level (it only ever runs workers).
    Elsewhere (macOS: ``setpriority`` would renice the whole process) nothing changes."""
    if not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return
    try:
        target = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + BACKGROUND_NICE)   # pid: the main thread
        tid = threading.get_native_id()
        if tid != os.getpid() and os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except OSError:
        log.debug("could not lower a worker's priority", exc_info=True)


_LIVE = {"workers": 0}           # ctbench workers started and not yet ended (see keep_a_pool_thread_free)
_LIVE_LOCK = threading.Lock()


def _live(delta: int) -> None:
    with _LIVE_LOCK:
        _LIVE["workers"] = max(0, _LIVE["workers"] + delta)


class _Spawner:
    """Starts processes from a thread of normal priority: a child process inherits the nice value of the
    thread that starts it, and a worker's (see ``background_priority``) can never go back down, so a
    detached process a worker starts (the local job bridge, its jobs) would run below normal priority
    for good.  The thread is made on first use from the GUI thread (``spawner_ready``) or else, with the
    same effect, from whichever thread has the process's own priority."""

    def __init__(self):
        import queue

        self._requests: "queue.Queue" = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()

    def ready(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="ctbench-spawner", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            fn, args, kwargs, future = self._requests.get()
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                future.set_exception(e)

    def popen(self, *args, **kwargs):
        """``subprocess.Popen(*args, **kwargs)``, run in the spawner thread."""
        import subprocess

        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the process spawner was not started (common.spawner_ready on the GUI thread)")
        future: Future = Future()
        self._requests.put((subprocess.Popen, args, kwargs, future))
        return future.result()


SPAWNER = _Spawner()


def spawner_ready() -> None:
    """Start ``SPAWNER``'s thread (call from the GUI thread, whose priority it takes)."""
    SPAWNER.ready()


def _at_background_priority(func):
    """``func`` (a generator function stays one: napari picks its worker type by that) run after
    ``background_priority`` in its worker thread, counted among the live workers until it ends; and
    ``ended()``, which ends the count too (once in all: whichever comes first)."""
    import inspect

    _live(+1)      # from the start (GUI thread): a queued worker that has not run yet counts too
    lock, counted = threading.Lock(), [True]

    def ended(*_):
        with lock:
            if not counted[0]:
                return
            counted[0] = False
        _live(-1)

    if inspect.isgeneratorfunction(func):
        @functools.wraps(func)
        def generator(*args, **kwargs):
            try:
                background_priority()
                return (yield from func(*args, **kwargs))
            finally:
                ended()
        return generator, ended

    @functools.wraps(func)
    def plain(*args, **kwargs):
        try:
            background_priority()
            return func(*args, **kwargs)
        finally:
            ended()
    return plain, ended


def keep_a_pool_thread_free() -> None:
    """Let Qt's global thread pool grow so that one of its threads stays free of Python workers.

    The workers run in that pool, and so do the pieces Qt splits a large image conversion into
    (``QImage.convertToFormat``, e.g. inside napari's ``viewer.screenshot``), which the GUI thread waits
    for while it holds the GIL.  With every pool thread running a Python worker that waits for the GIL,
    neither side moves: the window hangs for good (seen with two Run estimates and a screenshot on a
    2-core machine).  A free thread runs the conversion; the workers only wait as they did anyway."""
    from qtpy.QtCore import QThreadPool

    pool = QThreadPool.globalInstance()
    # Qt counts a thread as active once it has taken its task; a low-priority pool thread woken for a new
    # worker may not have yet, so the workers this module started are counted as well.
    need = max(pool.activeThreadCount() + 1, _LIVE["workers"]) + 1     # every worker, and one thread to spare
    if pool.maxThreadCount() < need:
        pool.setMaxThreadCount(need)


def live_workers() -> int:
    """ctbench workers started and not yet ended."""
    return _LIVE["workers"]
