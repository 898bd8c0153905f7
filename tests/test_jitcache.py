"""numba's on-disk cache as strata_ref._jitcache sets it up: a cached
function that calls a cached parallel one, compiled in a process that
loaded the parallel one from the cache, runs when it is itself loaded from
the cache in a fresh process (numba alone: a segmentation fault, issues
4807 / 8578; found as `strata-ref matmul --cpu avx512` crashing after runs
of the avx2 and scalar profiles had filled the cache)."""
from __future__ import annotations

import os
import subprocess
import sys

_MOD = '''
import sys
import numpy as np
from numba import njit, prange
import strata_ref._jitcache as jc

def _inner(a, parts):
    for p in prange(parts):
        a[p] += 1.0

inner = jc.cached(njit(parallel=True)(_inner), "t_inner", lambda: "d")

def _make(k):
    def outer(a):
        inner(a, a.size)
        return a.sum() + k
    return jc.cached(njit(outer), f"t_outer{k}", lambda: "d")

outer = {1: _make(1), 2: _make(2)}
a = np.zeros(8)
print(outer[int(sys.argv[1])](a))
'''


def test_a_cached_caller_of_a_parallel_kernel_runs_from_the_cache(tmp_path):
    (tmp_path / "nest.py").write_text(_MOD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path)] + sys.path),
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    got = []
    # 1 compiles inner and outer1; 2 loads inner, compiles outer2; then
    # both outers come from the cache
    for k in ("1", "2", "2", "1"):
        r = subprocess.run([sys.executable, "nest.py", k], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        got.append((r.returncode, r.stdout.strip()))
    assert got == [(0, "9.0"), (0, "10.0"), (0, "10.0"), (0, "9.0")]


_QUANT = '''
import numpy as np
from strata_ref import _compile_notes
from strata_ref.formats import get_quantizer
from strata_ref.types import GGMLType
_compile_notes.install()
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
b = get_quantizer(GGMLType.Q4_0)(x)
print(_compile_notes.stats()[0], b.tobytes().hex())
'''


def test_a_block_quantizer_compiles_once_per_machine(tmp_path):
    # its per-block-function driver is a closure: it recompiled in every
    # process (about a second, for every q4_0 / q4_1 KV cache run) while the
    # closing note said later runs load it from the cache
    (tmp_path / "quant.py").write_text(_QUANT)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("STRATA_REF_QUIET_COMPILE", None)
    runs = [subprocess.run([sys.executable, "quant.py"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:]
    (n1, b1), (n2, b2) = (r.stdout.split() for r in runs)
    assert int(n1) > 0 and int(n2) == 0 and b1 == b2
