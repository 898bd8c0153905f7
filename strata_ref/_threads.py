"""numba's threads: the threading layer chosen for the CPU inference's
decode speed (`configure`, called explicitly before numba's first parallel
region: by `strata_ref.infer.load`, the task runner's workers and the
command line) and a cheap read of the thread count (`threads`).

A decode step launches about four parallel regions per layer, each tens of
microseconds long, so how idle threads wait decides the decode speed.
Measured on a 2-core VM (tools/bench_infer.py, SmolLM2-135M / Qwen2.5-0.5B
decode tok/s, idle | with one busy-looping process): OpenMP (GNU libgomp)
with its default spin of 300,000 rounds 83 / 27 | 23 / 8 (the spinning
waiters take the core from the thread that has work); numba's workqueue,
which always sleeps, 30-43 / 14-19 | 39 / 13; one thread 50 / 14 | 46 / 14;
OpenMP spinning 2,000 rounds before sleeping 67-72 / 23 | 36 / 13, close to
the spinning speed at idle and to workqueue's under load
(docs/inference.md, "Threading layer"). So: the OpenMP layer with
GOMP_SPINCOUNT=2000, unless the user chose a layer (who still gets that
spin count), a wait policy or a spin count. libgomp reads the variable
once, when it is loaded: if it already is (another library brought it in),
the spin cannot be set and the never-spinning workqueue is used. It only
takes effect if no parallel numba function has run yet in this process; it
changes no result (every row's arithmetic is the same on any thread).
"""
from __future__ import annotations

import os

import numba

__all__ = ["configure", "threads"]

_GOMP_SPINCOUNT = "2000"
_configured = False


def _libgomp_loaded() -> bool:
    try:
        import ctypes
        ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return True
    except (OSError, AttributeError):      # not loaded, or no RTLD_NOLOAD (not Linux/glibc)
        return False


def configure() -> None:
    """Choose numba's threading layer as the module docstring says, once
    per process (later calls do nothing). Call it before the first
    parallel kernel runs; it sets GOMP_SPINCOUNT in os.environ (unless the
    user set a wait policy) and numba's layer or layer priority (unless the
    user set NUMBA_THREADING_LAYER)."""
    global _configured
    if _configured:
        return
    _configured = True
    user_wait = any(k in os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))
    gomp_fixed = _libgomp_loaded()
    if not user_wait and not gomp_fixed:
        os.environ["GOMP_SPINCOUNT"] = _GOMP_SPINCOUNT
    if "NUMBA_THREADING_LAYER" in os.environ:
        return
    if not user_wait and gomp_fixed:
        numba.config.THREADING_LAYER = "workqueue"
    elif "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:   # numba's own order: tbb, omp, workqueue
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]


def threads() -> int:
    """numba's current thread count (`numba.get_num_threads()`), read
    without the lock that function takes (1.5 us a call; a decode step
    makes about a hundred) once numba's thread pool is up."""
    from numba.np.ufunc import parallel
    fast = getattr(parallel, "_get_num_threads", None)     # set when the pool starts
    return int(fast()) if fast is not None else numba.get_num_threads()
