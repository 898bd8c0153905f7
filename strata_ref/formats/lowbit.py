"""Low-bit formats with one fp16 scale per block: Q1_0 (128 values), Q2_0 (64).

Formulas: ../shared/spec/formats.md §5 "Ternary and low-bit types", as in ggml
`dequantize_row_q1_0` and `dequantize_row_q2_0` (ggml-org/ggml
src/ggml-quants.c @ d99724f2). Both pack values sequentially from the low
bits of each byte.
"""
import numpy as np
from numba import njit

from ..types import GGMLType, block_format
from . import _bytes as rd
from . import register_dequant

_Q1_0 = block_format(GGMLType.Q1_0)
_Q1_0_D = _Q1_0.offset("d")
_Q1_0_QS = _Q1_0.offset("qs")
_Q1_0_QK = _Q1_0.block_values

_Q2_0 = block_format(GGMLType.Q2_0)
_Q2_0_D = _Q2_0.offset("d")
_Q2_0_QS = _Q2_0.offset("qs")
_Q2_0_QK = _Q2_0.block_values


@register_dequant(GGMLType.Q1_0)
@njit(inline="always", cache=True)
def dequant_q1_0(b, y):
    """Q1_0 block (18 bytes) -> 128 float32: y[j] = d if bit j else -d,
    bit j = (qs[j/8] >> (j%8)) & 1 (ggml `dequantize_row_q1_0`).

    A sign flip, not a multiply: -d of d = +0 is -0, and a NaN d keeps its
    payload (canonicalised later).
    """
    d = rd.f16(b, _Q1_0_D)
    nd = -d
    for j in range(_Q1_0_QK):
        bit = (np.int64(b[_Q1_0_QS + (j >> 3)]) >> (j & 7)) & 1
        y[j] = d if bit else nd


@register_dequant(GGMLType.Q2_0)
@njit(inline="always", cache=True)
def dequant_q2_0(b, y):
    """Q2_0 block (18 bytes) -> 64 float32 (ggml `dequantize_row_q2_0`):
    y[j] = (float)(((qs[j/4] >> 2(j%4)) & 3) - 1) * d, so code 3 gives +2d."""
    d = rd.f16(b, _Q2_0_D)
    for j in range(_Q2_0_QK):
        q = (np.int64(b[_Q2_0_QS + (j >> 2)]) >> (2 * (j & 3))) & 3
        y[j] = np.float32(q - 1) * d
