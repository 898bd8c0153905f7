"""One compiled call per mat-mul of a weight type that is multiplied on its
stored blocks (the legacy quants, `legacy_dots`; Q4_K, Q5_K, Q6_K,
`kquant_dots`): the activations quantized as the build does it
(`act_quant`), the kernel of the ggml code path, the output allocated, all
inside numba, so that a product costs one call from Python, or none from
another compiled function (`strata_ref.infer.compiled`).

`runner(t)` is the compiled function of type t:

    run(path, ref, tiled, mmid, raw, x, parts) -> out

raw: uint8 (rows, row_bytes), the tensor's blocks; x: float32 (n, cols);
out: float32 (n, rows). path: 0 the baseline build's generic C dots, 1 the
SIMD builds' code (vec_dot / tinyBLAS, and from 8 rows on ggml's tiled
K-quant kernel when `tiled`), 2 the CPU_REPACK layout (Q4_0's q4_0_8x8,
Q4_K's q4_K_8x8); ref: the reference activation quantizers (the baseline
build); mmid: the rows are one expert's share of a MUL_MAT_ID (the repacked
path runs its gemv for every row); par: split the rows over numba's
threads. Which path applies is the caller's (`cpu.matmul.QMatrix`), from
`families.mm_path`'s rules.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit

from .._jitcache import cached
from ..types import GGMLType
from . import kquant_dots, legacy_dots
from ._digest import cpu_digest
from .act_quant import _q8_32, _q8_k

__all__ = ["RUN_TYPES", "runner", "threads"]

def threads() -> int:
    """numba's current thread count (`numba.get_num_threads()`), read
    without the lock that function takes (1.5 us a call; a decode step
    makes about a hundred) once numba's thread pool is up."""
    from numba.np.ufunc import parallel
    fast = getattr(parallel, "_get_num_threads", None)     # set when the pool starts
    return int(fast()) if fast is not None else numba.get_num_threads()

#: the types `runner` serves
RUN_TYPES = legacy_dots.LEGACY_TYPES + kquant_dots.KQUANT_TYPES

_RUNNERS = {}


def _legacy_runner(t: GGMLType):
    L = legacy_dots
    lanes_s, lanes_p = L.kernels(t, L.LANES)
    gen_s, gen_p = L.kernels(t, L.GENERIC)
    whole_s, whole_p = L.kernels(t, L.WHOLE) if t == GGMLType.Q4_0 else (lanes_s, lanes_p)
    Q8_1 = t in (GGMLType.Q4_1, GGMLType.Q5_1)

    def run(path, ref, tiled, mmid, raw, x, parts):
        n, k = x.shape
        xq = np.empty((n, k), np.int8)
        xs = np.empty((n, k // 32), np.float32)
        xm = np.empty((n, k // 32), np.float32) if Q8_1 else xs
        _q8_32(x, xq, xs, xm, Q8_1, ref)
        out = np.empty((n, raw.shape[0]), np.float32)
        if path == 0:
            if parts > 1:
                gen_p(raw, xq, xs, xm, out, parts)
            else:
                gen_s(raw, xq, xs, xm, out)
        elif path == 2:
            if parts > 1:
                whole_p(raw, xq, xs, xm, out, parts)
            else:
                whole_s(raw, xq, xs, xm, out)
        elif parts > 1:
            lanes_p(raw, xq, xs, xm, out, parts)
        else:
            lanes_s(raw, xq, xs, xm, out)
        return out
    return run


def _kquant_runner(t: GGMLType):
    K = kquant_dots
    lanes_s, lanes_p = K.kernels(t, K.LANES)
    tiled_s, tiled_p = K.kernels(t, K.TILED)
    gen_s, gen_p = K.kernels(t, K.GENERIC)
    rep_s, rep_p = K.kernels(t, K.REPACK) if t == GGMLType.Q4_K else (lanes_s, lanes_p)
    PER32 = t != GGMLType.Q6_K

    def run(path, ref, tiled, mmid, raw, x, parts):
        n, k = x.shape
        n_gemm = n - n % 4 if path == 2 and not mmid else 0
        xq = np.empty((n, k), np.int8)
        xd = np.empty((n, k // 256), np.float32)
        b16 = np.empty((n, k // 16), np.int32)
        _q8_k(x, xq, xd, b16, n_gemm)
        if PER32:
            xb = np.empty((n, k // 32), np.int32)
            for t_ in range(n):
                for j in range(k // 32):
                    xb[t_, j] = b16[t_, 2 * j] + b16[t_, 2 * j + 1]
        else:
            xb = b16
        out = np.empty((n, raw.shape[0]), np.float32)
        if path == 0:
            if parts > 1:
                gen_p(raw, xq, xd, xb, n_gemm, out, parts)
            else:
                gen_s(raw, xq, xd, xb, n_gemm, out)
        elif path == 2:
            if parts > 1:
                rep_p(raw, xq, xd, xb, n_gemm, out, parts)
            else:
                rep_s(raw, xq, xd, xb, n_gemm, out)
        elif tiled and n >= 8:
            if parts > 1:
                tiled_p(raw, xq, xd, xb, n_gemm, out, parts)
            else:
                tiled_s(raw, xq, xd, xb, n_gemm, out)
        elif parts > 1:
            lanes_p(raw, xq, xd, xb, n_gemm, out, parts)
        else:
            lanes_s(raw, xq, xd, xb, n_gemm, out)
        return out
    return run


def runner(t):
    """The compiled `run` of weight type t (module docstring); KeyError for
    a type not in `RUN_TYPES`."""
    t = GGMLType(t)
    r = _RUNNERS.get(t)
    if r is None:
        if t in legacy_dots.LEGACY_TYPES:
            fn = _legacy_runner(t)
        elif t in kquant_dots.KQUANT_TYPES:
            fn = _kquant_runner(t)
        else:
            raise KeyError(f"no compiled mat-mul runner for {t.name}")
        r = _RUNNERS[t] = cached(njit(fn), f"matvec_{t.name}", cpu_digest)
    return r
