"""Reference quantizers of the legacy 32-value formats: Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q8_1.

Each block function follows ggml `quantize_row_<type>_ref` (ggml-org/ggml
src/ggml-quants.c @ d99724f2) statement by statement in float32: the same
scans (strict comparisons, first hit wins, starting from 0 or ±FLT_MAX), the
same `1.0f/d` reciprocal followed by multiplications, and the same truncating
casts (`(int8_t)(v + 8.5f)`, `(uint8_t)(v + 0.5f)`, `roundf`), so the bytes
equal ggml's portable (no FMA) build. See ../shared/spec/formats.md §8.
"""
import numpy as np
from numba import njit

from ..types import GGMLType, block_format
from ._qdrive import register_block_quantizer
from ._qnum import (abs_max_bits, bits_f32, c_roundf_int, c_trunc_int, first_signed_absmax,
                    fp16_store, store_u32, to_i8)

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_FLT_MAX = np.float32(3.4028234663852886e38)

_Q4_0 = block_format(GGMLType.Q4_0)
_Q4_1 = block_format(GGMLType.Q4_1)
_Q5_0 = block_format(GGMLType.Q5_0)
_Q5_1 = block_format(GGMLType.Q5_1)
_Q8_0 = block_format(GGMLType.Q8_0)
_Q8_1 = block_format(GGMLType.Q8_1)

Q4_0_D, Q4_0_QS = _Q4_0.offset("d"), _Q4_0.offset("qs")
Q4_1_D, Q4_1_M, Q4_1_QS = _Q4_1.offset("d"), _Q4_1.offset("m"), _Q4_1.offset("qs")
Q5_0_D, Q5_0_QH, Q5_0_QS = _Q5_0.offset("d"), _Q5_0.offset("qh"), _Q5_0.offset("qs")
Q5_1_D, Q5_1_M = _Q5_1.offset("d"), _Q5_1.offset("m")
Q5_1_QH, Q5_1_QS = _Q5_1.offset("qh"), _Q5_1.offset("qs")
Q8_0_D, Q8_0_QS = _Q8_0.offset("d"), _Q8_0.offset("qs")
Q8_1_D, Q8_1_S, Q8_1_QS = _Q8_1.offset("d"), _Q8_1.offset("s"), _Q8_1.offset("qs")


@njit(inline="always", cache=True, error_model="numpy")
def min_max(x):
    """(min, max) by ggml's scan from FLT_MAX / -FLT_MAX with `<` and `>`."""
    mn = _FLT_MAX
    mx = -_FLT_MAX
    for j in range(x.shape[0]):
        v = x[j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


@njit(inline="always", cache=True, error_model="numpy")
def abs_max(x):
    """ggml's `amax = MAX(amax, fabsf(v))` from 0.0f (non-NaN input)."""
    return bits_f32(abs_max_bits(x))


@njit(inline="always", cache=True, error_model="numpy")
def small_code(v, safe):
    """C's `(int8_t)v` of a float, as the int MIN() then compares; with `safe`
    the truncation lands in the code range, where the int8 wrap is a no-op."""
    q = c_trunc_int(v, safe)
    return q if safe else to_i8(q)


@njit(inline="always", cache=True, error_model="numpy")
def recip_or_zero(d):
    """`d ? 1.0f/d : 0.0f`."""
    return _F1 / d if d != _F0 else _F0


@njit(inline="always", cache=True, error_model="numpy")
def bounded(d, idv):
    """True when x*id is bounded by the code range for every finite x of the
    block (scale and reciprocal finite), so the fast conversions are exact."""
    return abs(d) <= _FLT_MAX and abs(idv) <= _FLT_MAX


@njit(cache=True, error_model="numpy")
def quant_q4_0(x, b):
    """ggml `quantize_row_q4_0_ref`, one block: d = max/-8, q = (int8)(x*id + 8.5) capped at 15."""
    _, mx = first_signed_absmax(x)
    d = mx / np.float32(-8.0)
    idv = recip_or_zero(d)
    safe = bounded(d, idv)
    fp16_store(b, Q4_0_D, d)
    for j in range(16):
        q0 = min(15, small_code(x[j] * idv + np.float32(8.5), safe))
        q1 = min(15, small_code(x[j + 16] * idv + np.float32(8.5), safe))
        b[Q4_0_QS + j] = (q0 & 0xFF) | ((q1 << 4) & 0xFF)


@njit(cache=True, error_model="numpy")
def quant_q4_1(x, b):
    """ggml `quantize_row_q4_1_ref`, one block: d = (max-min)/15, m = min."""
    mn, mx = min_max(x)
    d = (mx - mn) / np.float32(15.0)
    idv = recip_or_zero(d)
    safe = bounded(d, idv)
    fp16_store(b, Q4_1_D, d)
    fp16_store(b, Q4_1_M, mn)
    for j in range(16):
        q0 = min(15, small_code((x[j] - mn) * idv + np.float32(0.5), safe))
        q1 = min(15, small_code((x[j + 16] - mn) * idv + np.float32(0.5), safe))
        b[Q4_1_QS + j] = (q0 & 0xFF) | ((q1 << 4) & 0xFF)


@njit(cache=True, error_model="numpy")
def quant_q5_0(x, b):
    """ggml `quantize_row_q5_0_ref`, one block: d = max/-16, q = (int8)(x*id + 16.5) capped at 31."""
    _, mx = first_signed_absmax(x)
    d = mx / np.float32(-16.0)
    idv = recip_or_zero(d)
    safe = bounded(d, idv)
    fp16_store(b, Q5_0_D, d)
    qh = 0
    for j in range(16):
        q0 = min(31, small_code(x[j] * idv + np.float32(16.5), safe)) & 0xFF
        q1 = min(31, small_code(x[j + 16] * idv + np.float32(16.5), safe)) & 0xFF
        b[Q5_0_QS + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4)
        qh |= ((q0 & 0x10) >> 4) << j
        qh |= ((q1 & 0x10) >> 4) << (j + 16)
    store_u32(b, Q5_0_QH, qh)


@njit(cache=True, error_model="numpy")
def quant_q5_1(x, b):
    """ggml `quantize_row_q5_1_ref`, one block: d = (max-min)/31, m = min, q = (uint8)(v + 0.5)."""
    mn, mx = min_max(x)
    d = (mx - mn) / np.float32(31.0)
    idv = recip_or_zero(d)
    safe = bounded(d, idv)
    fp16_store(b, Q5_1_D, d)
    fp16_store(b, Q5_1_M, mn)
    qh = 0
    for j in range(16):
        q0 = c_trunc_int((x[j] - mn) * idv + np.float32(0.5), safe) & 0xFF
        q1 = c_trunc_int((x[j + 16] - mn) * idv + np.float32(0.5), safe) & 0xFF
        b[Q5_1_QS + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4)
        qh |= ((q0 & 0x10) >> 4) << j
        qh |= ((q1 & 0x10) >> 4) << (j + 16)
    store_u32(b, Q5_1_QH, qh)


@njit(cache=True, error_model="numpy")
def quant_q8_0(x, b):
    """ggml `quantize_row_q8_0_ref`, one block: d = amax/127, q = roundf(x*id)."""
    d = abs_max(x) / np.float32(127.0)
    idv = recip_or_zero(d)
    safe = bounded(d, idv)
    fp16_store(b, Q8_0_D, d)
    for j in range(32):
        b[Q8_0_QS + j] = c_roundf_int(x[j] * idv, safe) & 0xFF


@njit(cache=True, error_model="numpy")
def quant_q8_1(x, b):
    """ggml `quantize_row_q8_1_ref`, one block: Q8_0's rule plus s = fp16((float)Σq * d)."""
    d = abs_max(x) / np.float32(127.0)
    idv = recip_or_zero(d)
    safe = bounded(d, idv)
    fp16_store(b, Q8_1_D, d)
    total = 0
    for j in range(32):
        q = to_i8(c_roundf_int(x[j] * idv, safe))
        b[Q8_1_QS + j] = q & 0xFF
        total += q
    fp16_store(b, Q8_1_S, np.float32(total) * d)


for _t, _fn in ((GGMLType.Q4_0, quant_q4_0), (GGMLType.Q4_1, quant_q4_1),
                (GGMLType.Q5_0, quant_q5_0), (GGMLType.Q5_1, quant_q5_1),
                (GGMLType.Q8_0, quant_q8_0), (GGMLType.Q8_1, quant_q8_1)):
    register_block_quantizer(_t, _fn)
