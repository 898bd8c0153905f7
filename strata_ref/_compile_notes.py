"""Notes on numba compiling: what the first use of a kernel is waiting for.

The CPU kernels are numba functions compiled at their first call and kept
in numba's on-disk cache (`_jitcache`); the first run of a model with a new
combination of weight types, architecture options or CPU profile compiles
for a minute or two, every later run loads the machine code in a fraction
of a second. So that this wait is not silent, `install()` listens to
numba's "numba:compile" events, which fire only for a real compilation (a
cache hit loads without one), and logs one note on the "strata_ref.compile"
logger (INFO; the command line prints the library's notes on stderr) when
the first compilation of the process starts, naming the function. `stats()`
gives what was compiled so far: the command line prints it as a closing
note after a run that compiled (`log_summary`). The switch
STRATA_REF_QUIET_COMPILE=1 turns the notes off (the test suite sets it:
whether a test compiles depends on what ran before it).

A function's compilation compiles the functions it calls: only the
outermost compilations are counted and timed.
"""
from __future__ import annotations

import logging
import threading
import time

__all__ = ["install", "stats", "reset", "log_summary"]

_log = logging.getLogger("strata_ref.compile")
_state = threading.local()
_lock = threading.Lock()
_totals = {"count": 0, "seconds": 0.0, "noted": False}
_installed = False


def _name(data) -> str:
    d = (data or {}).get("dispatcher")
    f = getattr(d, "py_func", None)
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or "a kernel"


def _quiet() -> bool:
    from ._env import switch
    return switch("STRATA_REF_QUIET_COMPILE")


def _listener():
    from numba.core import event

    class Listener(event.Listener):
        def on_start(self, ev):
            if _quiet():
                return
            depth = getattr(_state, "depth", 0)
            _state.depth = depth + 1
            if depth:
                return
            _state.t0 = time.perf_counter()
            with _lock:
                first, _totals["noted"] = not _totals["noted"], True
            if first:
                _log.info(f"compiling with numba, starting with {_name(ev.data)} (a first use on "
                          "this machine of these kernels: up to a minute or two, and for a model once "
                          "per new combination of weight types, architecture options and CPU "
                          "profile; cached on disk for later runs)")

        def on_end(self, ev):
            if _quiet():
                return
            _state.depth = getattr(_state, "depth", 1) - 1
            if _state.depth == 0:
                with _lock:
                    _totals["count"] += 1
                    _totals["seconds"] += time.perf_counter() - _state.t0

    return Listener()


def install() -> None:
    """Listen to numba's compile events from now on (idempotent; nothing
    with STRATA_REF_QUIET_COMPILE=1). Starts the counts from zero."""
    global _installed
    if _quiet():
        return
    reset()
    with _lock:
        if _installed:
            return
        _installed = True
    from numba.core import event
    event.register("numba:compile", _listener())


def stats() -> tuple[int, float]:
    """(outermost functions compiled, seconds spent compiling them) since
    `install` or the last `reset`."""
    with _lock:
        return _totals["count"], _totals["seconds"]


def log_summary() -> None:
    """Log what was compiled since `install` (one note; nothing when
    nothing was compiled)."""
    n, s = stats()
    if n:
        _log.info(f"compiled {n} function{'s' if n > 1 else ''} in {s:.0f} s; later runs load "
                  "them from numba's cache")


def reset() -> None:
    """Zero the counts; the next compilation logs its note again."""
    with _lock:
        _totals.update(count=0, seconds=0.0, noted=False)
