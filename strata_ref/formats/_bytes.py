"""Little-endian field readers for numba block functions.

`b` is one block's uint8 array, `o` a byte offset taken from the format's
declaration (`block_format(t).offset(name)`), so no layout is restated here.
"""
import numpy as np
from numba import njit

from ..numerics import F16_TO_F32
from ._qnum import bits_f32


@njit(inline="always", cache=True)
def u16(b, o):
    return np.int64(b[o]) | (np.int64(b[o + 1]) << 8)


@njit(inline="always", cache=True)
def u32(b, o):
    return (np.int64(b[o]) | (np.int64(b[o + 1]) << 8)
            | (np.int64(b[o + 2]) << 16) | (np.int64(b[o + 3]) << 24))


@njit(inline="always", cache=True)
def i8(b, o):
    return np.int64(np.int8(b[o]))   # numba's uint8 -> int8 cast wraps


@njit(inline="always", cache=True)
def f16(b, o):
    """ggml fp16 -> f32 of the half at byte offset o."""
    return F16_TO_F32[u16(b, o)]


@njit(inline="always", cache=True)
def f32(b, o):
    # a bitcast; a one-element array view would allocate per call (measured
    # in the streaming driver: Q8_K 6x slower)
    return bits_f32(u32(b, o))
