"""Legacy 32-value formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.

Formulas: ../shared/spec/formats.md §5 "32-value legacy types", in the
operation order of ggml `dequantize_row_q4_0` ... `dequantize_row_q8_0`
(ggml-org/ggml src/ggml-quants.c @ d99724f2).

The 4-bit types pack value j in the low nibble of qs[j] and value j + 16 in
its high nibble; the 5-bit types take the 5th bit of value j from bit j of
the u32 `qh` and that of value j + 16 from bit j + 16. Integers are widened
with np.float32 before they meet a float, so every operation is a float32
operation (numba would otherwise promote float32 * int64 to float64).

Loop bounds come from `y.shape[0]`, a run-time value, rather than the
constant QK: LLVM fully unrolls a constant 32-trip loop before its loop
vectorizer runs, and the unrolled stores to `y` cannot be moved past the
loads of `b` (the two arrays might overlap), so the block stays scalar. With
a run-time bound the loop reaches the vectorizer, which checks the overlap
once per block (measured on AVX-512: Q4_0 1.6x, Q8_0 1.8x faster).
"""
import numpy as np
from numba import njit

from ..types import GGMLType, block_format
from . import _bytes as rd
from . import register_dequant

_Q4_0 = block_format(GGMLType.Q4_0)
_Q4_0_D = _Q4_0.offset("d")
_Q4_0_QS = _Q4_0.offset("qs")
_Q4_0_NQ = _Q4_0.field("qs").count          # bytes of nibbles = QK / 2

_Q4_1 = block_format(GGMLType.Q4_1)
_Q4_1_D = _Q4_1.offset("d")
_Q4_1_M = _Q4_1.offset("m")
_Q4_1_QS = _Q4_1.offset("qs")
_Q4_1_NQ = _Q4_1.field("qs").count

_Q5_0 = block_format(GGMLType.Q5_0)
_Q5_0_D = _Q5_0.offset("d")
_Q5_0_QH = _Q5_0.offset("qh")
_Q5_0_QS = _Q5_0.offset("qs")
_Q5_0_NQ = _Q5_0.field("qs").count

_Q5_1 = block_format(GGMLType.Q5_1)
_Q5_1_D = _Q5_1.offset("d")
_Q5_1_M = _Q5_1.offset("m")
_Q5_1_QH = _Q5_1.offset("qh")
_Q5_1_QS = _Q5_1.offset("qs")
_Q5_1_NQ = _Q5_1.field("qs").count

_Q8_0 = block_format(GGMLType.Q8_0)
_Q8_0_D = _Q8_0.offset("d")
_Q8_0_QS = _Q8_0.offset("qs")

_Q8_1 = block_format(GGMLType.Q8_1)
_Q8_1_D = _Q8_1.offset("d")
_Q8_1_QS = _Q8_1.offset("qs")
_Q8_1_NQ = _Q8_1.field("qs").count


@register_dequant(GGMLType.Q4_0)
@njit(inline="always", cache=True)
def dequant_q4_0(b, y):
    """Q4_0 block (18 bytes) -> 32 float32: y = (float)(nib - 8) * d
    (ggml `dequantize_row_q4_0`). nib = 8 with d < 0 gives -0.0, as in C."""
    d = rd.f16(b, _Q4_0_D)
    nq = y.shape[0] >> 1                 # = _Q4_0_NQ, as a run-time value
    for j in range(nq):
        x = np.int64(b[_Q4_0_QS + j])
        y[j] = np.float32((x & 15) - 8) * d
        y[j + nq] = np.float32((x >> 4) - 8) * d


@register_dequant(GGMLType.Q4_1)
@njit(inline="always", cache=True)
def dequant_q4_1(b, y):
    """Q4_1 block (20 bytes) -> 32 float32: y = (float)nib * d + m
    (ggml `dequantize_row_q4_1`); the add is the one rounding."""
    d = rd.f16(b, _Q4_1_D)
    m = rd.f16(b, _Q4_1_M)
    nq = y.shape[0] >> 1                 # = _Q4_1_NQ
    for j in range(nq):
        x = np.int64(b[_Q4_1_QS + j])
        y[j] = np.float32(x & 15) * d + m
        y[j + nq] = np.float32(x >> 4) * d + m


@njit(inline="always", cache=True)
def _q5(b, qs, qh, j):
    # The two 5-bit values (j, j + n) of a Q5_0/Q5_1 block, unsigned.
    x = np.int64(b[qs + j])
    lo = (x & 15) | (((qh >> j) << 4) & 0x10)
    hi = (x >> 4) | ((qh >> (j + 12)) & 0x10)
    return lo, hi


@register_dequant(GGMLType.Q5_0)
@njit(inline="always", cache=True)
def dequant_q5_0(b, y):
    """Q5_0 block (22 bytes) -> 32 float32: y = (float)(x - 16) * d
    (ggml `dequantize_row_q5_0`)."""
    d = rd.f16(b, _Q5_0_D)
    qh = rd.u32(b, _Q5_0_QH)
    for j in range(_Q5_0_NQ):
        lo, hi = _q5(b, _Q5_0_QS, qh, j)
        y[j] = np.float32(lo - 16) * d
        y[j + _Q5_0_NQ] = np.float32(hi - 16) * d


@register_dequant(GGMLType.Q5_1)
@njit(inline="always", cache=True)
def dequant_q5_1(b, y):
    """Q5_1 block (24 bytes) -> 32 float32: y = (float)x * d + m
    (ggml `dequantize_row_q5_1`); the add is the one rounding."""
    d = rd.f16(b, _Q5_1_D)
    m = rd.f16(b, _Q5_1_M)
    qh = rd.u32(b, _Q5_1_QH)
    for j in range(_Q5_1_NQ):
        lo, hi = _q5(b, _Q5_1_QS, qh, j)
        y[j] = np.float32(lo) * d + m
        y[j + _Q5_1_NQ] = np.float32(hi) * d + m


@register_dequant(GGMLType.Q8_0)
@njit(inline="always", cache=True)
def dequant_q8_0(b, y):
    """Q8_0 block (34 bytes) -> 32 float32: y[j] = (float)qs[j] * d
    (ggml `dequantize_row_q8_0`)."""
    d = rd.f16(b, _Q8_0_D)
    for j in range(y.shape[0]):          # = 32
        y[j] = np.float32(rd.i8(b, _Q8_0_QS + j)) * d


@register_dequant(GGMLType.Q8_1)
@njit(inline="always", cache=True)
def dequant_q8_1(b, y):
    """Q8_1 block (36 bytes) -> 32 float32: y[j] = (float)qs[j] * d.

    ggml has no `dequantize_row_q8_1` (Q8_1 is a dot-product activation
    format); this is the natural reading of `block_q8_1` (formats.md §5).
    The field `s` (fp16 of d * sum(qs)) is redundant and not read.
    """
    d = rd.f16(b, _Q8_1_D)
    for j in range(y.shape[0]):          # = _Q8_1_NQ
        y[j] = np.float32(rd.i8(b, _Q8_1_QS + j)) * d
