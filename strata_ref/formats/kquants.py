"""K-quants (256-value super-blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.

Formulas: ../shared/spec/formats.md §5 "K-quants", in the operation order of
ggml `dequantize_row_q2_K` ... `dequantize_row_q8_K` (ggml-org/ggml
src/ggml-quants.c @ d99724f2). Q2_K, Q4_K and Q5_K round once, in the final
`- m`; every product before it is exact (formats.md §6).

For Q2_K and Q3_K the output index is i = 128h + 32j + 16k + l (h < 2,
j < 4, k < 2, l < 16): half h, 2-bit plane j (shift 2j), 16-value group k.

Inner loop bounds are computed from `y.shape[0]` (256), a run-time value,
not written as constants: see strata_ref.formats.legacy for why (LLVM would
unroll a constant-bound loop and then leave it scalar).
"""
import numpy as np
from numba import njit

from ..blocks import q3_k_scale, scale_min_k4
from ..types import GGMLType, block_format
from . import _bytes as rd
from . import register_dequant

_Q2_K = block_format(GGMLType.Q2_K)
_Q2_K_SC = _Q2_K.offset("scales")
_Q2_K_QS = _Q2_K.offset("qs")
_Q2_K_D = _Q2_K.offset("d")
_Q2_K_DMIN = _Q2_K.offset("dmin")

_Q3_K = block_format(GGMLType.Q3_K)
_Q3_K_HM = _Q3_K.offset("hmask")
_Q3_K_QS = _Q3_K.offset("qs")
_Q3_K_SC = _Q3_K.offset("scales")
_Q3_K_D = _Q3_K.offset("d")

_Q4_K = block_format(GGMLType.Q4_K)
_Q4_K_D = _Q4_K.offset("d")
_Q4_K_DMIN = _Q4_K.offset("dmin")
_Q4_K_SC = _Q4_K.offset("scales")
_Q4_K_QS = _Q4_K.offset("qs")

_Q5_K = block_format(GGMLType.Q5_K)
_Q5_K_D = _Q5_K.offset("d")
_Q5_K_DMIN = _Q5_K.offset("dmin")
_Q5_K_SC = _Q5_K.offset("scales")
_Q5_K_QH = _Q5_K.offset("qh")
_Q5_K_QS = _Q5_K.offset("qs")

_Q6_K = block_format(GGMLType.Q6_K)
_Q6_K_QL = _Q6_K.offset("ql")
_Q6_K_QH = _Q6_K.offset("qh")
_Q6_K_SC = _Q6_K.offset("scales")
_Q6_K_D = _Q6_K.offset("d")

_Q8_K = block_format(GGMLType.Q8_K)
_Q8_K_D = _Q8_K.offset("d")
_Q8_K_QS = _Q8_K.offset("qs")
_Q8_K_NQ = _Q8_K.field("qs").count


@register_dequant(GGMLType.Q2_K)
@njit(inline="always", cache=True)
def dequant_q2_k(b, y):
    """Q2_K super-block (84 bytes) -> 256 float32 (ggml `dequantize_row_q2_K`).

    s = scales[8h+2j+k]: dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
    y[i] = dl * (float)((qs[32h+16k+l] >> 2j) & 3) - ml.
    """
    d = rd.f16(b, _Q2_K_D)
    dmin = rd.f16(b, _Q2_K_DMIN)
    n16 = y.shape[0] >> 4                # = 16
    for h in range(2):
        for j in range(4):
            for k in range(2):
                s = np.int64(b[_Q2_K_SC + 8 * h + 2 * j + k])
                dl = d * np.float32(s & 15)
                ml = dmin * np.float32(s >> 4)
                q0 = _Q2_K_QS + 32 * h + 16 * k
                y0 = 128 * h + 32 * j + 16 * k
                for l in range(n16):
                    q = (np.int64(b[q0 + l]) >> (2 * j)) & 3
                    y[y0 + l] = dl * np.float32(q) - ml


@register_dequant(GGMLType.Q3_K)
@njit(inline="always", cache=True)
def dequant_q3_k(b, y):
    """Q3_K super-block (110 bytes) -> 256 float32 (ggml `dequantize_row_q3_K`).

    With s = 8h+2j+k and sc[s] the signed 6-bit scale (`blocks.q3_k_scale`): q = ((qs[32h+16k+l] >> 2j) & 3) - (4 unless bit 4h+j
    of hmask[16k+l] is set); y[i] = (d * (float)sc[s]) * (float)q.
    """
    d = rd.f16(b, _Q3_K_D)
    n16 = y.shape[0] >> 4                # = 16
    for h in range(2):
        for j in range(4):
            m = 1 << (4 * h + j)
            for k in range(2):
                dl = d * np.float32(q3_k_scale(b, _Q3_K_SC, 8 * h + 2 * j + k))
                q0 = _Q3_K_QS + 32 * h + 16 * k
                h0 = _Q3_K_HM + 16 * k
                y0 = 128 * h + 32 * j + 16 * k
                for l in range(n16):
                    q = (np.int64(b[q0 + l]) >> (2 * j)) & 3
                    if (np.int64(b[h0 + l]) & m) == 0:
                        q -= 4
                    y[y0 + l] = dl * np.float32(q)


@register_dequant(GGMLType.Q4_K)
@njit(inline="always", cache=True)
def dequant_q4_k(b, y):
    """Q4_K super-block (144 bytes) -> 256 float32 (ggml `dequantize_row_q4_K`).

    Chunk c < 4 of 64 values: d1 = d * (float)sc[2c], m1 = dmin * (float)m[2c]
    (d2, m2 from 2c+1); y[64c+l] = d1 * (float)(qs[32c+l] & 15) - m1,
    y[64c+32+l] = d2 * (float)(qs[32c+l] >> 4) - m2.
    """
    d = rd.f16(b, _Q4_K_D)
    dmin = rd.f16(b, _Q4_K_DMIN)
    n32 = y.shape[0] >> 3                # = 32
    for c in range(4):
        sc1, mn1 = scale_min_k4(b, _Q4_K_SC, 2 * c)
        sc2, mn2 = scale_min_k4(b, _Q4_K_SC, 2 * c + 1)
        d1 = d * np.float32(sc1)
        m1 = dmin * np.float32(mn1)
        d2 = d * np.float32(sc2)
        m2 = dmin * np.float32(mn2)
        for l in range(n32):
            x = np.int64(b[_Q4_K_QS + 32 * c + l])
            y[64 * c + l] = d1 * np.float32(x & 15) - m1
            y[64 * c + 32 + l] = d2 * np.float32(x >> 4) - m2


@register_dequant(GGMLType.Q5_K)
@njit(inline="always", cache=True)
def dequant_q5_k(b, y):
    """Q5_K super-block (176 bytes) -> 256 float32 (ggml `dequantize_row_q5_K`).

    As Q4_K, plus a 5th bit worth 16: bit 2c of qh[l] for the low nibbles of
    chunk c, bit 2c+1 for its high nibbles.
    """
    d = rd.f16(b, _Q5_K_D)
    dmin = rd.f16(b, _Q5_K_DMIN)
    n32 = y.shape[0] >> 3                # = 32
    for c in range(4):
        sc1, mn1 = scale_min_k4(b, _Q5_K_SC, 2 * c)
        sc2, mn2 = scale_min_k4(b, _Q5_K_SC, 2 * c + 1)
        d1 = d * np.float32(sc1)
        m1 = dmin * np.float32(mn1)
        d2 = d * np.float32(sc2)
        m2 = dmin * np.float32(mn2)
        for l in range(n32):
            x = np.int64(b[_Q5_K_QS + 32 * c + l])
            hb = np.int64(b[_Q5_K_QH + l]) >> (2 * c)
            y[64 * c + l] = d1 * np.float32((x & 15) + ((hb & 1) << 4)) - m1
            y[64 * c + 32 + l] = d2 * np.float32((x >> 4) + ((hb & 2) << 3)) - m2


@register_dequant(GGMLType.Q6_K)
@njit(inline="always", cache=True)
def dequant_q6_k(b, y):
    """Q6_K super-block (210 bytes) -> 256 float32 (ggml `dequantize_row_q6_K`).

    Half h < 2, l < 32, t < 4: the 6-bit value q_t takes its low 4 bits from
    a nibble of ql[64h+l] (t = 0, 2) or ql[64h+l+32] (t = 1, 3), low nibble
    for t < 2, and its high 2 bits from bits 2t..2t+1 of qh[32h+l];
    y[128h+32t+l] = (d * (float)sc[8h + l/16 + 2t]) * (float)(q_t - 32).
    """
    d = rd.f16(b, _Q6_K_D)
    n16 = y.shape[0] >> 4                # = 16
    for h in range(2):
        for t in range(4):
            shift = 4 * (t >> 1)         # low nibble for t < 2
            lo0 = _Q6_K_QL + 64 * h + 32 * (t & 1)
            for g in range(2):
                dl = d * np.float32(rd.i8(b, _Q6_K_SC + 8 * h + g + 2 * t))
                for l in range(n16 * g, n16 * g + n16):
                    lo = (np.int64(b[lo0 + l]) >> shift) & 15
                    hi = (np.int64(b[_Q6_K_QH + 32 * h + l]) >> (2 * t)) & 3
                    y[128 * h + 32 * t + l] = dl * np.float32((lo | (hi << 4)) - 32)


@register_dequant(GGMLType.Q8_K)
@njit(inline="always", cache=True)
def dequant_q8_k(b, y):
    """Q8_K block (292 bytes) -> 256 float32: y[j] = d * (float)qs[j] with
    a float32 d (ggml `dequantize_row_q8_K`; one rounding, the multiply).

    Q8_K has no `to_float` in ggml's type_traits (it is the activation format
    of the K-quant dot products); the field `bsums` is not read.
    """
    d = rd.f32(b, _Q8_K_D)
    for j in range(y.shape[0]):          # = _Q8_K_NQ
        y[j] = d * np.float32(rd.i8(b, _Q8_K_QS + j))
