"""Ternary formats (256-value blocks): TQ1_0, TQ2_0.

Formulas: ../shared/spec/formats.md §5 "Ternary and low-bit types", in the
operation order of ggml `dequantize_row_tq1_0` and `dequantize_row_tq2_0`
(ggml-org/ggml src/ggml-quants.c @ d99724f2).

Run widths are computed from `y.shape[0]` (256), a run-time value: see
strata_ref.formats.legacy for why (a constant-bound loop stays scalar).
"""
import numpy as np
from numba import njit

from ..types import GGMLType, block_format
from . import _bytes as rd
from . import register_dequant

_TQ1_0 = block_format(GGMLType.TQ1_0)
_TQ1_0_QS = _TQ1_0.offset("qs")
_TQ1_0_QH = _TQ1_0.offset("qh")
_TQ1_0_D = _TQ1_0.offset("d")
_TQ1_0_NQS = _TQ1_0.field("qs").count
_TQ1_0_NQH = _TQ1_0.field("qh").count
assert _TQ1_0_NQH == _TQ1_0.block_values // 64   # the run width below
# qs is read in runs of 32 bytes, then the remainder in runs of 16 (ggml's
# loops over `sizeof(qs) - sizeof(qs) % 32`); each byte holds 5 trits.
_TQ1_0_N32 = _TQ1_0_NQS - _TQ1_0_NQS % 32

_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.int64)

_TQ2_0 = block_format(GGMLType.TQ2_0)
_TQ2_0_QS = _TQ2_0.offset("qs")
_TQ2_0_D = _TQ2_0.offset("d")
_TQ2_0_NQS = _TQ2_0.field("qs").count


@njit(inline="always", cache=True)
def _trit(byte, n):
    # Trit n of a base-3 fixed-point byte: multiplying by 3^n (mod 256)
    # shifts the first n trits out; (q * 3) >> 8 reads the next one.
    q = (byte * _POW3[n]) & 255
    return (q * 3) >> 8


@njit(inline="always", cache=True)
def _tq1_0_run(b, y, d, q0, y0, width, ntrits):
    # y[y0 + width*n + m] from trit n of byte q0 + m (n < ntrits, m < width).
    for n in range(ntrits):
        for m in range(width):
            t = _trit(np.int64(b[q0 + m]), n)
            y[y0 + width * n + m] = np.float32(t - 1) * d


@register_dequant(GGMLType.TQ1_0)
@njit(inline="always", cache=True)
def dequant_tq1_0(b, y):
    """TQ1_0 block (54 bytes) -> 256 float32 (ggml `dequantize_row_tq1_0`).

    y = (float)(t - 1) * d, trit t in {0, 1, 2}: 5 trits per byte of qs
    (first the 32-byte run, y[32n+m]; then the 16-byte run, y[160+16n+m]),
    then 4 trits per byte of qh, y[240+4n+j].
    """
    d = rd.f16(b, _TQ1_0_D)
    w32 = y.shape[0] >> 3                # = 32
    for j in range(0, _TQ1_0_N32, 32):
        _tq1_0_run(b, y, d, _TQ1_0_QS + j, 5 * j, w32, 5)
    for j in range(_TQ1_0_N32, _TQ1_0_NQS, 16):
        _tq1_0_run(b, y, d, _TQ1_0_QS + j, 5 * j, w32 >> 1, 5)
    _tq1_0_run(b, y, d, _TQ1_0_QH, 5 * _TQ1_0_NQS, w32 >> 3, 4)   # width _TQ1_0_NQH = 4


@register_dequant(GGMLType.TQ2_0)
@njit(inline="always", cache=True)
def dequant_tq2_0(b, y):
    """TQ2_0 block (66 bytes) -> 256 float32 (ggml `dequantize_row_tq2_0`).

    y[128c+32l+m] = (float)(((qs[32c+m] >> 2l) & 3) - 1) * d; code 3 gives +2d.
    """
    d = rd.f16(b, _TQ2_0_D)
    n32 = y.shape[0] >> 3                # = 32
    for c in range(_TQ2_0_NQS // 32):
        for l in range(4):
            for m in range(n32):
                q = (np.int64(b[_TQ2_0_QS + 32 * c + m]) >> (2 * l)) & 3
                y[128 * c + 32 * l + m] = np.float32(q - 1) * d
