"""Reference quantizers of the legacy 32-value formats: Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q8_1.

Each block function follows ggml `quantize_row_<type>_ref` (ggml-org/ggml
src/ggml-quants.c @ d99724f2) statement by statement in float32: the same
scans (strict comparisons, first hit wins, starting from 0 or ±FLT_MAX), the
same `1.0f/d` reciprocal followed by multiplications, and the same truncating
casts (`(int8_t)(v + 8.5f)`, `(uint8_t)(v + 0.5f)`, `roundf`), so the bytes
equal ggml's portable (no FMA) build. See ../shared/spec/formats.md §8.

`quant_q4_0_fma`, `quant_q4_1_fma`, `quant_q5_0_fma`, `quant_q5_1_fma` are
the same blocks as GCC compiles them where it contracts `x*id + 8.5f` (and
`(x - min)*id + 0.5f`) into one fused multiply-add: ggml-base on aarch64
(`strata_ref.cpu.base_quant`, docs/arm64.md). Where 1/d overflows (a block
whose largest |x| is subnormal) they keep the x86 casts; aarch64's
saturating conversions are not reproduced there.
"""
import numpy as np
from numba import njit

from ..types import GGMLType, block_format
from ._qdrive import register_block_quantizer
from ._qnum import (abs_max_bits, bits_f32, c_roundf_int, c_trunc_int, f32_bits,
                    first_signed_absmax, fp16_store, mul_add, store_u32, to_i8)

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
    """(min, max) as ggml's scan from FLT_MAX / -FLT_MAX with `<` and `>`
    finds them, for non-NaN blocks of at most 256 values: equal values keep
    the first one, which only matters for ±0 (C keeps the first zero's sign).

    Computed as two integer reductions (vectorisable) over keys that order the
    floats, with -0 and +0 given the same key, and the position in the low 8
    bits so that the first of equal keys wins."""
    kmin = np.int64(1) << 62
    kmax = -(np.int64(1) << 62)
    for i in range(x.shape[0]):
        u = f32_bits(x[i])
        mag = u & 0x7FFFFFFF
        key = (mag - 2 * mag * (u >> 31)) << 8          # -|x| for negatives, -0 -> 0
        lo = key | i
        hi = key | (255 - i)
        kmin = kmin if kmin < lo else lo
        kmax = kmax if kmax > hi else hi
    return x[kmin & 255], x[255 - (kmax & 255)]


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


# Each code loop is an inline function called twice, with safe=True and
# safe=False as literals: numba inlines it and LLVM folds the flag, so the
# common (range-proven) loop is branch-free, the other follows C's x86 casts.

@njit(inline="always", cache=True, error_model="numpy")
def codes_q4_0(x, b, idv, safe, fused):
    for j in range(16):
        q0 = min(15, small_code(mul_add(x[j], idv, np.float32(8.5), fused), safe)) & 0xFF
        q1 = min(15, small_code(mul_add(x[j + 16], idv, np.float32(8.5), fused), safe)) & 0xFF
        b[Q4_0_QS + j] = q0 | ((q1 & 0x0F) << 4)


@njit(inline="always", cache=True, error_model="numpy")
def block_q4_0(x, b, fused):
    """ggml `quantize_row_q4_0_ref`, one block: d = max/-8, q = (int8)(x*id + 8.5) capped at 15."""
    _, mx = first_signed_absmax(x)
    d = mx / np.float32(-8.0)
    idv = recip_or_zero(d)
    fp16_store(b, Q4_0_D, d)
    if bounded(d, idv):
        codes_q4_0(x, b, idv, True, fused)
    else:
        codes_q4_0(x, b, idv, False, fused)


@njit(cache=True, error_model="numpy")
def quant_q4_0(x, b):
    """ggml `quantize_row_q4_0_ref`, one block: d = max/-8, q = (int8)(x*id + 8.5) capped at 15."""
    block_q4_0(x, b, False)


@njit(cache=True, error_model="numpy")
def quant_q4_0_fma(x, b):
    """`quant_q4_0` with `x*id + c` fused (module docstring)."""
    block_q4_0(x, b, True)


@njit(inline="always", cache=True, error_model="numpy")
def codes_q4_1(x, b, mn, idv, safe, fused):
    for j in range(16):
        q0 = min(15, small_code(mul_add(x[j] - mn, idv, np.float32(0.5), fused), safe)) & 0xFF
        q1 = min(15, small_code(mul_add(x[j + 16] - mn, idv, np.float32(0.5), fused), safe)) & 0xFF
        b[Q4_1_QS + j] = q0 | ((q1 & 0x0F) << 4)


@njit(inline="always", cache=True, error_model="numpy")
def block_q4_1(x, b, fused):
    """ggml `quantize_row_q4_1_ref`, one block: d = (max-min)/15, m = min."""
    mn, mx = min_max(x)
    d = (mx - mn) / np.float32(15.0)
    idv = recip_or_zero(d)
    fp16_store(b, Q4_1_D, d)
    fp16_store(b, Q4_1_M, mn)
    if bounded(d, idv):
        codes_q4_1(x, b, mn, idv, True, fused)
    else:
        codes_q4_1(x, b, mn, idv, False, fused)


@njit(cache=True, error_model="numpy")
def quant_q4_1(x, b):
    """ggml `quantize_row_q4_1_ref`, one block: d = (max-min)/15, m = min."""
    block_q4_1(x, b, False)


@njit(cache=True, error_model="numpy")
def quant_q4_1_fma(x, b):
    """`quant_q4_1` with `x*id + c` fused (module docstring)."""
    block_q4_1(x, b, True)


@njit(inline="always", cache=True, error_model="numpy")
def pack_q5(b, o_qs, o_qh, q0, q1, j, qh):
    """Low nibbles of codes j, j+16 into qs[j]; their 5th bits into qh."""
    b[o_qs + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4)
    return qh | (((q0 & 0x10) >> 4) << j) | (((q1 & 0x10) >> 4) << (j + 16))


@njit(inline="always", cache=True, error_model="numpy")
def codes_q5_0(x, b, idv, safe, fused):
    qh = 0
    for j in range(16):
        q0 = min(31, small_code(mul_add(x[j], idv, np.float32(16.5), fused), safe)) & 0xFF
        q1 = min(31, small_code(mul_add(x[j + 16], idv, np.float32(16.5), fused), safe)) & 0xFF
        qh = pack_q5(b, Q5_0_QS, Q5_0_QH, q0, q1, j, qh)
    store_u32(b, Q5_0_QH, qh)


@njit(inline="always", cache=True, error_model="numpy")
def block_q5_0(x, b, fused):
    """ggml `quantize_row_q5_0_ref`, one block: d = max/-16, q = (int8)(x*id + 16.5) capped at 31."""
    _, mx = first_signed_absmax(x)
    d = mx / np.float32(-16.0)
    idv = recip_or_zero(d)
    fp16_store(b, Q5_0_D, d)
    if bounded(d, idv):
        codes_q5_0(x, b, idv, True, fused)
    else:
        codes_q5_0(x, b, idv, False, fused)


@njit(cache=True, error_model="numpy")
def quant_q5_0(x, b):
    """ggml `quantize_row_q5_0_ref`, one block: d = max/-16, q = (int8)(x*id + 16.5) capped at 31."""
    block_q5_0(x, b, False)


@njit(cache=True, error_model="numpy")
def quant_q5_0_fma(x, b):
    """`quant_q5_0` with `x*id + c` fused (module docstring)."""
    block_q5_0(x, b, True)


@njit(inline="always", cache=True, error_model="numpy")
def codes_q5_1(x, b, mn, idv, safe, fused):
    qh = 0
    for j in range(16):
        q0 = c_trunc_int(mul_add(x[j] - mn, idv, np.float32(0.5), fused), safe) & 0xFF
        q1 = c_trunc_int(mul_add(x[j + 16] - mn, idv, np.float32(0.5), fused), safe) & 0xFF
        qh = pack_q5(b, Q5_1_QS, Q5_1_QH, q0, q1, j, qh)
    store_u32(b, Q5_1_QH, qh)


@njit(inline="always", cache=True, error_model="numpy")
def block_q5_1(x, b, fused):
    """ggml `quantize_row_q5_1_ref`, one block: d = (max-min)/31, m = min, q = (uint8)(v + 0.5)."""
    mn, mx = min_max(x)
    d = (mx - mn) / np.float32(31.0)
    idv = recip_or_zero(d)
    fp16_store(b, Q5_1_D, d)
    fp16_store(b, Q5_1_M, mn)
    if bounded(d, idv):
        codes_q5_1(x, b, mn, idv, True, fused)
    else:
        codes_q5_1(x, b, mn, idv, False, fused)


@njit(cache=True, error_model="numpy")
def quant_q5_1(x, b):
    """ggml `quantize_row_q5_1_ref`, one block: d = (max-min)/31, m = min, q = (uint8)(v + 0.5)."""
    block_q5_1(x, b, False)


@njit(cache=True, error_model="numpy")
def quant_q5_1_fma(x, b):
    """`quant_q5_1` with `x*id + c` fused (module docstring)."""
    block_q5_1(x, b, True)


@njit(inline="always", cache=True, error_model="numpy")
def codes_q8(x, b, o_qs, idv, safe):
    """roundf(x*id) as int8 into b[o_qs:o_qs+32]; returns Σq (for Q8_1's s)."""
    total = 0
    for j in range(32):
        q = to_i8(c_roundf_int(x[j] * idv, safe))
        b[o_qs + j] = q & 0xFF
        total += q
    return total


@njit(cache=True, error_model="numpy")
def quant_q8_0(x, b):
    """ggml `quantize_row_q8_0_ref`, one block: d = amax/127, q = roundf(x*id)."""
    d = abs_max(x) / np.float32(127.0)
    idv = recip_or_zero(d)
    fp16_store(b, Q8_0_D, d)
    if bounded(d, idv):
        codes_q8(x, b, Q8_0_QS, idv, True)
    else:
        codes_q8(x, b, Q8_0_QS, idv, False)


@njit(cache=True, error_model="numpy")
def quant_q8_1(x, b):
    """ggml `quantize_row_q8_1_ref`, one block: Q8_0's rule plus s = fp16((float)Σq * d)."""
    d = abs_max(x) / np.float32(127.0)
    idv = recip_or_zero(d)
    fp16_store(b, Q8_1_D, d)
    if bounded(d, idv):
        total = codes_q8(x, b, Q8_1_QS, idv, True)
    else:
        total = codes_q8(x, b, Q8_1_QS, idv, False)
    fp16_store(b, Q8_1_S, np.float32(total) * d)


for _t, _fn in ((GGMLType.Q4_0, quant_q4_0), (GGMLType.Q4_1, quant_q4_1),
                (GGMLType.Q5_0, quant_q5_0), (GGMLType.Q5_1, quant_q5_1),
                (GGMLType.Q8_0, quant_q8_0), (GGMLType.Q8_1, quant_q8_1)):
    register_block_quantizer(_t, _fn)
