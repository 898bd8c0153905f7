"""The operands of ggml-cpu's float dots (`vec.cpp`), whatever holds them.

ggml's F16 dots read their operands as fp16 and widen them exactly
(`GGML_F32Cx8_LOAD`, `vcvtph2ps`); the kernels here get them either as
float32 arrays already holding fp16 (or bf16) values, or as the raw fp16
bits of a cache or a weight row (uint16). `operand` and `load8` read one
value or 8 lanes of either kind, exactly, so that each instruction set's
dot (`strata_ref.cpu.isa`) is written once for both.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..numerics import F16_TO_F32
from .simd import HOST_F16C, f8_f16_load, f8_load

__all__ = ["operand", "load8", "rest_in_double"]

_TABLE = F16_TO_F32


def operand(a, i):
    """a[i] as float32: a float32 array's element, or the value of the fp16
    bits of a uint16 array (exact)."""
    raise NotImplementedError("numba only")


def load8(a, off):
    """F32x8 of a[off:off + 8] (float32, or fp16 bits widened exactly)."""
    raise NotImplementedError("numba only")


@njit(inline="always", cache=True)
def _h8(a, off):
    if HOST_F16C:
        return f8_f16_load(a, off)
    t = np.empty(8, np.float32)
    for i in range(8):
        t[i] = _TABLE[a[off + i]]
    return f8_load(t, 0)


@overload(operand, inline="always")
def _operand(a, i):
    if isinstance(a, types.Array) and a.dtype == types.float32:
        return lambda a, i: a[i]
    if isinstance(a, types.Array) and a.dtype == types.uint16:
        return lambda a, i: _TABLE[a[i]]
    return None


@overload(load8, inline="always")
def _load8(a, off):
    if isinstance(a, types.Array) and a.dtype == types.float32:
        return lambda a, off: f8_load(a, off)
    if isinstance(a, types.Array) and a.dtype == types.uint16:
        return lambda a, off: _h8(a, off)
    return None


@njit(inline="always", cache=True)
def rest_in_double(main_sum, a, ao, b, bo, main, n):
    """The end of ggml's float dots (`ggml_vec_dot_f16` / `_bf16`, vec.cpp):
    `main_sum`, the SIMD part's float32 sum of the first `main` products,
    widened to ggml_float (double), then each product of the rest of the
    row, a[ao+i] * b[bo+i] for main <= i < n (`operand`s) rounded to
    float32, added in double; the total rounded to float32."""
    tot = np.float64(main_sum)
    for i in range(main, n):
        tot += np.float64(np.float32(operand(a, ao + i) * operand(b, bo + i)))
    return np.float32(tot)
