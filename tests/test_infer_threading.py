"""The threading setup `strata_ref._threads.configure()` makes, called
explicitly by `strata_ref.infer.load`, the task workers and the command line
(docs/inference.md, "Threading layer"): numba's OpenMP layer with libgomp
spinning GOMP_SPINCOUNT=2000 rounds, the user's own settings left alone, and
workqueue when libgomp was loaded before the spin could be set. Each case
runs in a fresh interpreter, since the setup happens once; importing
the CPU kernels alone changes nothing (checked below)."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
PROBE = """
import json, os, sys
{pre}
import numba, numpy as np
import strata_ref.cpu.matmul
{configure}
@numba.njit(parallel=True)
def f(a):
    for i in numba.prange(a.size):
        a[i] += 1.0
f(np.zeros(64))
print(json.dumps({{"spin": os.environ.get("GOMP_SPINCOUNT"), "layer": numba.threading_layer()}}))
"""


def _probe(env_extra: dict, pre: str = "", configure: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", PROBE.format(pre=pre, configure="import strata_ref._threads as t; t.configure()" if configure else "")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _omp_available() -> bool:
    try:
        from numba.np.ufunc import omppool  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not _omp_available(), reason="numba's OpenMP layer is not available here")
def test_default_is_omp_with_short_spin():
    assert _probe({}) == {"spin": "2000", "layer": "omp"}


def test_user_spin_count_and_layer_are_kept():
    assert _probe({"GOMP_SPINCOUNT": "5", "NUMBA_THREADING_LAYER": "workqueue"}) == \
        {"spin": "5", "layer": "workqueue"}


def test_user_layer_still_gets_the_spin_count():
    assert _probe({"NUMBA_THREADING_LAYER": "workqueue"}) == {"spin": "2000", "layer": "workqueue"}


def test_libgomp_loaded_first_falls_back_to_workqueue():
    try:
        ctypes.CDLL("libgomp.so.1")
    except OSError:
        pytest.skip("no libgomp.so.1 here")
    got = _probe({}, pre="import ctypes; ctypes.CDLL('libgomp.so.1')")
    assert got == {"spin": None, "layer": "workqueue"}


def test_importing_the_cpu_kernels_sets_nothing():
    # issue 28: no threading side effect at import; the layer numba picks by
    # itself and no spin count
    got = _probe({}, configure=False)
    assert got["spin"] is None
