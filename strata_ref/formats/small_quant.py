"""Reference quantizers of the plain float, ternary, FP4 and low-bit formats:
F16, BF16, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0.

Sources (ggml-org/ggml @ d99724f2): F16 is `ggml_fp32_to_fp16_row` through
the portable `ggml_compute_fp32_to_fp16` (src/ggml-impl.h; a NaN becomes
sign | 0x7E00); BF16 is `ggml_fp32_to_bf16_row_ref` (`ggml_compute_fp32_to_bf16`);
the block types follow `quantize_row_<type>_ref` in src/ggml-quants.c
statement by statement in float32 (see ../shared/spec/formats.md §4, §8).
"""
import math

import numpy as np
from numba import njit

from ..types import GGMLType, block_format
from . import register_quantize
from ._qdrive import register_block_quantizer
from ._qnum import (abs_max_bits, bits_f32, c_lroundf_int, c_roundf_int, cvtt_i32,
                    e8m0_half, fp16_store, fp32_to_fp16_ggml, ue4m3_encode, ue4m3_value)
from .legacy_quant import abs_max, bounded, recip_or_zero

_F0 = np.float32(0.0)

_TQ1 = block_format(GGMLType.TQ1_0)
_TQ2 = block_format(GGMLType.TQ2_0)
_MX = block_format(GGMLType.MXFP4)
_NV = block_format(GGMLType.NVFP4)
_Q1 = block_format(GGMLType.Q1_0)
_Q2 = block_format(GGMLType.Q2_0)

TQ1_QS, TQ1_QH, TQ1_D = _TQ1.offset("qs"), _TQ1.offset("qh"), _TQ1.offset("d")
TQ1_NQS = _TQ1.field("qs").count            # 48: 32 bytes of 5 trits, then 16
TQ1_NQH = _TQ1.field("qh").count            # 4 bytes of 4 trits
TQ2_QS, TQ2_D = _TQ2.offset("qs"), _TQ2.offset("d")
TQ2_NQS = _TQ2.field("qs").count
MX_E, MX_QS = _MX.offset("e"), _MX.offset("qs")
NV_D, NV_QS = _NV.offset("d"), _NV.offset("qs")
NV_NSUB = _NV.field("d").count              # one UE4M3 scale per 16 values
Q1_D, Q1_QS = _Q1.offset("d"), _Q1.offset("qs")
Q2_D, Q2_QS = _Q2.offset("d"), _Q2.offset("qs")

# E2M1 values doubled (ggml-common.h `kvalues_mxfp4`, spec/formats.md §7).
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                         dtype=np.float32)


# ---------------------------------------------------------------- F16, BF16

@njit(inline="always", cache=True, error_model="numpy")
def fp32_to_bf16_ggml(u):
    """bf16 bits of the float32 with bits u (`ggml_compute_fp32_to_bf16`):
    NaN -> (u >> 16) | 0x40, otherwise RNE on bit 16 with carry into Inf."""
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


@njit(nogil=True, cache=True, error_model="numpy")
def _f16_rows(src, dst):
    for i in range(src.shape[0]):
        dst[i] = fp32_to_fp16_ggml(np.int64(src[i]))


@njit(nogil=True, cache=True, error_model="numpy")
def _bf16_rows(src, dst):
    for i in range(src.shape[0]):
        dst[i] = fp32_to_bf16_ggml(np.int64(src[i]))


def _halves(x, conv):
    src = np.ascontiguousarray(x, np.float32).reshape(-1).view(np.uint32)
    dst = np.empty(src.size, "<u2")
    if src.size:
        conv(src, dst)
    return dst.view(np.uint8).reshape(len(x), 2)


@register_quantize(GGMLType.F16)
def quantize_f16(x):
    """F16: float32 (n, 1) -> uint8 (n, 2): ggml `ggml_compute_fp32_to_fp16`
    (RNE, |x| >= 65520 -> ±Inf, subnormals kept, NaN -> sign | 0x7E00)."""
    return _halves(x, _f16_rows)


@register_quantize(GGMLType.BF16)
def quantize_bf16(x):
    """BF16: float32 (n, 1) -> uint8 (n, 2): ggml `ggml_compute_fp32_to_bf16`
    (RNE on bit 16 with carry into ±Inf; NaN -> (u >> 16) | 0x40)."""
    return _halves(x, _bf16_rows)


# ---------------------------------------------------------------- ternary

@njit(inline="always", cache=True, error_model="numpy")
def trit(v, idv, safe):
    """`lroundf(v * id) + 1` as the C int it is stored in."""
    return c_lroundf_int(v * idv, safe) + 1


@njit(inline="always", cache=True, error_model="numpy")
def pack_trits_ceil(q):
    """ggml's `((uint16_t)q * 256 + 242) / 243`, stored in a uint8."""
    return ((q * 256 + 242) // 243) & 0xFF


@njit(cache=True, error_model="numpy")
def quant_tq1_0(x, b):
    """ggml `quantize_row_tq1_0_ref`, one block: d = amax, trits lroundf(x/d)+1,
    five per byte (four in qh), stored as ceil(q·256/243)."""
    d = abs_max(x)
    idv = recip_or_zero(d)
    safe = bounded(d, idv)
    fp16_store(b, TQ1_D, d)
    n32 = TQ1_NQS - TQ1_NQS % 32               # bytes filled 32 at a time
    base = 0
    for j in range(0, n32, 32):
        for m in range(32):
            q = 0
            for n in range(5):
                q = (q * 3 + trit(x[base + m + n * 32], idv, safe)) & 0xFF
            b[TQ1_QS + j + m] = pack_trits_ceil(q)
        base += 5 * 32
    for j in range(n32, TQ1_NQS, 16):
        for m in range(16):
            q = 0
            for n in range(5):
                q = (q * 3 + trit(x[base + m + n * 16], idv, safe)) & 0xFF
            b[TQ1_QS + j + m] = pack_trits_ceil(q)
        base += 5 * 16
    for j in range(TQ1_NQH):
        q = 0
        for m in range(4):
            q = (q * 3 + trit(x[base + j + m * TQ1_NQH], idv, safe)) & 0xFF
        q = (q * 3) & 0xFF
        b[TQ1_QH + j] = pack_trits_ceil(q)


@njit(cache=True, error_model="numpy")
def quant_tq2_0(x, b):
    """ggml `quantize_row_tq2_0_ref`, one block: d = amax, 2-bit codes
    lroundf(x/d)+1, value 32n+m of each 128 in bits 2n of byte m."""
    d = abs_max(x)
    idv = recip_or_zero(d)
    safe = bounded(d, idv)
    fp16_store(b, TQ2_D, d)
    base = 0
    for j in range(0, TQ2_NQS, 32):
        for m in range(32):
            q = 0
            for n in range(4):
                q = (q + ((trit(x[base + m + n * 32], idv, safe) & 3) << (2 * n))) & 0xFF
            b[TQ2_QS + j + m] = q
        base += 4 * 32


# ---------------------------------------------------------------- FP4

@njit(inline="always", cache=True, error_model="numpy")
def best_index_fp4(v, e):
    """ggml `best_index_mxfp4`: first i minimising |kv[i]*e - v| (strict <)."""
    best = 0
    best_err = abs(KVALUES_MXFP4[0] * e - v)
    for i in range(1, 16):
        err = abs(KVALUES_MXFP4[i] * e - v)
        if err < best_err:
            best = i
            best_err = err
    return best


@njit(inline="always", cache=True, error_model="numpy")
def first_abs_max(x, start, n):
    """`if (amax < fabsf(v)) amax = fabsf(v)` from 0.0f over x[start:start+n]
    (non-NaN input: the largest |v|, +0 when all are ±0)."""
    return bits_f32(abs_max_bits(x[start:start + n]))


@njit(cache=True, error_model="numpy")
def quant_mxfp4(x, b):
    """ggml `quantize_row_mxfp4_ref`, one block: e = (uint8)(floorf(log2f(amax)) - 2 + 127)
    (0 when amax is 0), values by nearest doubled E2M1 times e8m0_half(e)."""
    amax = first_abs_max(x, 0, 32)
    e = 0
    if amax > _F0:
        # math.log2 on float32 compiles to libm log2f, as the C code calls.
        lg = np.floor(np.float32(math.log2(amax)))
        e = cvtt_i32(lg - np.float32(2.0) + np.float32(127.0)) & 0xFF
    d = e8m0_half(e)
    b[MX_E] = e
    for j in range(16):
        b[MX_QS + j] = best_index_fp4(x[j], d) | (best_index_fp4(x[j + 16], d) << 4)


@njit(cache=True, error_model="numpy")
def quant_nvfp4(x, b):
    """ggml `quantize_row_nvfp4_ref`, one block of 64: per 16 values a UE4M3
    scale `ggml_fp32_to_ue4m3(amax / 6)`, values by nearest doubled E2M1."""
    sub = x.shape[0] // NV_NSUB
    for s in range(NV_NSUB):
        amax = first_abs_max(x, s * sub, sub)
        ue = ue4m3_encode(amax / np.float32(6.0))
        b[NV_D + s] = ue
        d = ue4m3_value(ue)
        half = sub // 2
        for j in range(half):
            q0 = best_index_fp4(x[s * sub + j], d)
            q1 = best_index_fp4(x[s * sub + half + j], d)
            b[NV_QS + s * half + j] = q0 | (q1 << 4)


# ---------------------------------------------------------------- Q1_0, Q2_0

@njit(cache=True, error_model="numpy")
def quant_q1_0(x, b):
    """ggml `quantize_row_q1_0_ref`, one block of 128: d = (sequential Σ|x|)/128,
    bit j set when x[j] >= 0 (so -0.0 counts as non-negative)."""
    s = _F0
    for j in range(x.shape[0]):
        s += abs(x[j])
    fp16_store(b, Q1_D, s / np.float32(x.shape[0]))
    for j in range(x.shape[0]):
        if x[j] >= _F0:
            b[Q1_QS + j // 8] |= 1 << (j % 8)


@njit(cache=True, error_model="numpy")
def quant_q2_0(x, b):
    """ggml `quantize_row_q2_0_ref`, one block of 64: d = amax (strict > scan),
    q = clamp((int)roundf(x/d) + 1, 0, 3), four codes per byte in order."""
    d = abs_max(x)              # C: `if (a > amax) amax = a` from 0.0f
    idv = np.float32(1.0) / d if d > _F0 else _F0
    safe = bounded(d, idv)
    fp16_store(b, Q2_D, d)
    for j in range(x.shape[0]):
        q = c_roundf_int(x[j] * idv, safe) + 1
        q = min(3, max(0, q))
        b[Q2_QS + j // 4] |= q << (2 * (j % 4))


for _t, _fn in ((GGMLType.TQ1_0, quant_tq1_0), (GGMLType.TQ2_0, quant_tq2_0),
                (GGMLType.MXFP4, quant_mxfp4), (GGMLType.NVFP4, quant_nvfp4),
                (GGMLType.Q1_0, quant_q1_0), (GGMLType.Q2_0, quant_q2_0)):
    register_block_quantizer(_t, _fn)
