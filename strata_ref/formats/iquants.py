"""I-quants: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_NL,
IQ4_XS.

Formulas: ../shared/spec/formats.md §5 "I-quants", in the operation order of
ggml `dequantize_row_iq2_xxs` ... `dequantize_row_iq4_xs` (ggml-org/ggml
src/ggml-quants.c @ d99724f2); tables from `iq_tables` (ggml-common.h).

Outputs of the 256-value types are indexed `y[32*ib + 8*l + j]`: sub-block
ib, group l of 8, element j. Every product is exact on valid data
(formats.md §6), so the only care needed is to keep every operation in
float32 (numba would widen float32 * int64 to float64) and to keep C's
literal formulas for signed zeros. The IQ sign step is a negation, as GCC
compiles `v * (c ? -1.f : 1.f)`; it differs from a multiply only in a NaN's
sign, which the driver canonicalises anyway.
"""
import numpy as np
from numba import njit

from ..blocks import iq1_m_d_bits, iq4_xs_ls
from ..numerics import F16_TO_F32
from ..types import GGMLType, block_format
from . import _bytes as rd
from . import register_dequant
from .iq_tables import (IQ1S_GRID_BYTES, IQ2S_GRID_BYTES, IQ2XS_GRID_BYTES,
                        IQ2XXS_GRID_BYTES, IQ3S_GRID_BYTES, IQ3XXS_GRID_BYTES,
                        KMASK_IQ2XS, KSIGNS_IQ2XS, KVALUES_IQ4NL)

# float32 constants: a Python float literal would turn float32 math into
# float64 inside numba.
_HALF = np.float32(0.5)
_QUARTER = np.float32(0.25)
_IQ1_DELTA = np.float32(0.125)     # IQ1S_DELTA = IQ1M_DELTA in ggml-common.h

_SUB = 32                          # values per sub-block of a 256-value block

T = GGMLType

_IQ2_XXS = block_format(T.IQ2_XXS)
_IQ2_XXS_NSUB = _IQ2_XXS.block_values // _SUB
_IQ2_XXS_D = _IQ2_XXS.offset("d")
_IQ2_XXS_QS = _IQ2_XXS.offset("qs")

_IQ2_XS = block_format(T.IQ2_XS)
_IQ2_XS_NSUB = _IQ2_XS.block_values // _SUB
_IQ2_XS_D = _IQ2_XS.offset("d")
_IQ2_XS_QS = _IQ2_XS.offset("qs")
_IQ2_XS_SCALES = _IQ2_XS.offset("scales")

_IQ2_S = block_format(T.IQ2_S)
_IQ2_S_NSUB = _IQ2_S.block_values // _SUB
_IQ2_S_D = _IQ2_S.offset("d")
_IQ2_S_QS = _IQ2_S.offset("qs")
_IQ2_S_SIGNS = _IQ2_S.offset("signs")
_IQ2_S_QH = _IQ2_S.offset("qh")
_IQ2_S_SCALES = _IQ2_S.offset("scales")

_IQ3_XXS = block_format(T.IQ3_XXS)
_IQ3_XXS_NSUB = _IQ3_XXS.block_values // _SUB
_IQ3_XXS_D = _IQ3_XXS.offset("d")
_IQ3_XXS_QS = _IQ3_XXS.offset("qs")
_IQ3_XXS_SAS = _IQ3_XXS.offset("scales_and_signs")

_IQ3_S = block_format(T.IQ3_S)
_IQ3_S_NSUB = _IQ3_S.block_values // _SUB
_IQ3_S_D = _IQ3_S.offset("d")
_IQ3_S_QS = _IQ3_S.offset("qs")
_IQ3_S_QH = _IQ3_S.offset("qh")
_IQ3_S_SIGNS = _IQ3_S.offset("signs")
_IQ3_S_SCALES = _IQ3_S.offset("scales")

_IQ1_S = block_format(T.IQ1_S)
_IQ1_S_NSUB = _IQ1_S.block_values // _SUB
_IQ1_S_D = _IQ1_S.offset("d")
_IQ1_S_QS = _IQ1_S.offset("qs")
_IQ1_S_QH = _IQ1_S.offset("qh")

_IQ1_M = block_format(T.IQ1_M)
_IQ1_M_NSUB = _IQ1_M.block_values // _SUB
_IQ1_M_QS = _IQ1_M.offset("qs")
_IQ1_M_QH = _IQ1_M.offset("qh")
_IQ1_M_SCALES = _IQ1_M.offset("scales")

_IQ4_NL = block_format(T.IQ4_NL)
_IQ4_NL_HALF = _IQ4_NL.block_values // 2
_IQ4_NL_D = _IQ4_NL.offset("d")
_IQ4_NL_QS = _IQ4_NL.offset("qs")

_IQ4_XS = block_format(T.IQ4_XS)
_IQ4_XS_NSUB = _IQ4_XS.block_values // _SUB
_IQ4_XS_D = _IQ4_XS.offset("d")
_IQ4_XS_SCALES_H = _IQ4_XS.offset("scales_h")
_IQ4_XS_SCALES_L = _IQ4_XS.offset("scales_l")
_IQ4_XS_QS = _IQ4_XS.offset("qs")

del T


@njit(inline="always", cache=True)
def _signed_group8(y, o, db, grid_row, signs):
    """y[o+j] = ±(db * grid_row[j]) for j < 8, negated where bit j of the
    sign byte is set (ggml's `kmask_iq2xs[j]` test)."""
    for j in range(8):
        v = db * np.float32(grid_row[j])
        y[o + j] = -v if signs & KMASK_IQ2XS[j] else v


@njit(inline="always", cache=True)
def _signed_group4x2(y, o, db, row1, row2, signs):
    """IQ3 groups: elements 0-3 from row1 and 4-7 from row2 (4-byte grid
    rows), signed as `_signed_group8`."""
    for j in range(4):
        v1 = db * np.float32(row1[j])
        y[o + j] = -v1 if signs & KMASK_IQ2XS[j] else v1
        v2 = db * np.float32(row2[j])
        y[o + 4 + j] = -v2 if signs & KMASK_IQ2XS[j + 4] else v2


@njit(inline="always", cache=True)
def _iq2_db(d, nibble):
    """`d * (0.5f + nibble) * 0.25f` in C order (IQ2 sub-block scale)."""
    return (d * (_HALF + np.float32(nibble))) * _QUARTER


@njit(inline="always", cache=True)
def _iq1_group8(y, o, dl, grid_row, delta):
    """y[o+j] = dl * ((float)grid_row[j] + delta), IQ1_S/IQ1_M."""
    for j in range(8):
        y[o + j] = dl * (np.float32(grid_row[j]) + delta)


@register_dequant(GGMLType.IQ2_XXS)
@njit(inline="always", cache=True)
def dequant_iq2_xxs(b, y):
    """IQ2_XXS block (66 bytes) -> 256 float32 (ggml `dequantize_row_iq2_xxs`).

    Per sub-block ib: a0 = u32 (4 grid indices, one per byte), a1 = u32
    (4 x 7-bit sign indices, 4-bit scale in the top nibble);
    y = ±((d * (0.5 + (a1 >> 28))) * 0.25 * iq2xxs_grid[byte l of a0][j]),
    signs ksigns_iq2xs[(a1 >> 7l) & 127].
    """
    d = rd.f16(b, _IQ2_XXS_D)
    for ib in range(_IQ2_XXS_NSUB):
        o = _IQ2_XXS_QS + 8 * ib
        a1 = rd.u32(b, o + 4)
        db = _iq2_db(d, a1 >> 28)
        for l in range(4):
            signs = KSIGNS_IQ2XS[(a1 >> (7 * l)) & 127]
            _signed_group8(y, _SUB * ib + 8 * l, db, IQ2XXS_GRID_BYTES[b[o + l]], signs)


@register_dequant(GGMLType.IQ2_XS)
@njit(inline="always", cache=True)
def dequant_iq2_xs(b, y):
    """IQ2_XS block (74 bytes) -> 256 float32 (ggml `dequantize_row_iq2_xs`).

    w = qs[4ib + l] (u16): grid iq2xs_grid[w & 511], signs ksigns_iq2xs[w >> 9];
    scale nibble: low of scales[ib] for l < 2, high for l >= 2.
    """
    d = rd.f16(b, _IQ2_XS_D)
    for ib in range(_IQ2_XS_NSUB):
        sc = b[_IQ2_XS_SCALES + ib]
        db0 = _iq2_db(d, sc & 15)
        db1 = _iq2_db(d, sc >> 4)
        for l in range(4):
            w = rd.u16(b, _IQ2_XS_QS + 2 * (4 * ib + l))
            db = db0 if l < 2 else db1
            _signed_group8(y, _SUB * ib + 8 * l, db, IQ2XS_GRID_BYTES[w & 511],
                           KSIGNS_IQ2XS[w >> 9])


@register_dequant(GGMLType.IQ2_S)
@njit(inline="always", cache=True)
def dequant_iq2_s(b, y):
    """IQ2_S block (82 bytes) -> 256 float32 (ggml `dequantize_row_iq2_s`).

    10-bit grid index qs[4ib + l] | ((qh[ib] >> 2l) & 3) << 8 into iq2s_grid;
    the sign byte is signs[4ib + l] itself; scales as IQ2_XS.
    """
    d = rd.f16(b, _IQ2_S_D)
    for ib in range(_IQ2_S_NSUB):
        sc = b[_IQ2_S_SCALES + ib]
        db0 = _iq2_db(d, sc & 15)
        db1 = _iq2_db(d, sc >> 4)
        qh = np.int64(b[_IQ2_S_QH + ib])
        for l in range(4):
            k = 4 * ib + l
            idx = np.int64(b[_IQ2_S_QS + k]) | (((qh >> (2 * l)) & 3) << 8)
            db = db0 if l < 2 else db1
            _signed_group8(y, _SUB * ib + 8 * l, db, IQ2S_GRID_BYTES[idx],
                           b[_IQ2_S_SIGNS + k])


@register_dequant(GGMLType.IQ3_XXS)
@njit(inline="always", cache=True)
def dequant_iq3_xxs(b, y):
    """IQ3_XXS block (98 bytes) -> 256 float32 (ggml `dequantize_row_iq3_xxs`).

    a = scales_and_signs[ib] (u32): db = (d * (0.5 + (a >> 28))) * 0.5,
    signs ksigns_iq2xs[(a >> 7l) & 127]; elements 0-3 from
    iq3xxs_grid[qs[8ib + 2l]], 4-7 from iq3xxs_grid[qs[8ib + 2l + 1]].
    """
    d = rd.f16(b, _IQ3_XXS_D)
    for ib in range(_IQ3_XXS_NSUB):
        a = rd.u32(b, _IQ3_XXS_SAS + 4 * ib)
        db = (d * (_HALF + np.float32(a >> 28))) * _HALF
        for l in range(4):
            q = _IQ3_XXS_QS + 8 * ib + 2 * l
            signs = KSIGNS_IQ2XS[(a >> (7 * l)) & 127]
            _signed_group4x2(y, _SUB * ib + 8 * l, db, IQ3XXS_GRID_BYTES[b[q]],
                             IQ3XXS_GRID_BYTES[b[q + 1]], signs)


@register_dequant(GGMLType.IQ3_S)
@njit(inline="always", cache=True)
def dequant_iq3_s(b, y):
    """IQ3_S block (110 bytes) -> 256 float32 (ggml `dequantize_row_iq3_s`).

    db = d * (1 + 2 * scale nibble ib); 9-bit indices qs[8ib + 2l] | bit 2l of
    qh[ib] << 8 (elements 0-3) and qs[8ib + 2l + 1] | bit 2l+1 << 8
    (elements 4-7) into iq3s_grid; the sign byte is signs[4ib + l].
    """
    d = rd.f16(b, _IQ3_S_D)
    for ib in range(_IQ3_S_NSUB):
        sc = (np.int64(b[_IQ3_S_SCALES + ib // 2]) >> (4 * (ib % 2))) & 15
        db = d * np.float32(1 + 2 * sc)
        qh = np.int64(b[_IQ3_S_QH + ib])
        for l in range(4):
            q = _IQ3_S_QS + 8 * ib + 2 * l
            i1 = np.int64(b[q]) | (((qh >> (2 * l)) & 1) << 8)
            i2 = np.int64(b[q + 1]) | (((qh >> (2 * l + 1)) & 1) << 8)
            _signed_group4x2(y, _SUB * ib + 8 * l, db, IQ3S_GRID_BYTES[i1],
                             IQ3S_GRID_BYTES[i2], b[_IQ3_S_SIGNS + 4 * ib + l])


@register_dequant(GGMLType.IQ1_S)
@njit(inline="always", cache=True)
def dequant_iq1_s(b, y):
    """IQ1_S block (50 bytes) -> 256 float32 (ggml `dequantize_row_iq1_s`).

    q = qh[ib] (u16): dl = d * (2 * ((q >> 12) & 7) + 1), delta = -0.125 if
    bit 15 else +0.125; 11-bit index qs[4ib + l] | ((q >> 3l) & 7) << 8 into
    iq1s_grid; y = dl * (g[j] + delta).
    """
    d = rd.f16(b, _IQ1_S_D)
    n8 = y.shape[0] >> 5                 # = 8, a run-time bound (see legacy)
    for ib in range(_IQ1_S_NSUB):
        q = rd.u16(b, _IQ1_S_QH + 2 * ib)
        dl = d * np.float32(2 * ((q >> 12) & 7) + 1)
        delta = -_IQ1_DELTA if q & 0x8000 else _IQ1_DELTA
        for l in range(4):
            idx = np.int64(b[_IQ1_S_QS + 4 * ib + l]) | (((q >> (3 * l)) & 7) << 8)
            o = _SUB * ib + 8 * l
            # _iq1_group8, with the table indexed in place rather than
            # through a row view (measured 1.3x)
            for j in range(n8):
                y[o + j] = dl * (np.float32(IQ1S_GRID_BYTES[idx, j]) + delta)


@register_dequant(GGMLType.IQ1_M)
@njit(inline="always", cache=True)
def dequant_iq1_m(b, y):
    """IQ1_M block (56 bytes) -> 256 float32 (ggml `dequantize_row_iq1_m`).

    The fp16 d is the top nibbles of the four u16 scales, sc0's lowest. Each
    u16 sc[k] also holds 3-bit scales for sub-blocks 2k, 2k+1: sub-block ib
    uses dl1 = d * (2 * ((sc[ib/2] >> 6(ib%2)) & 7) + 1) for groups 0-1 and
    shift 6(ib%2)+3 (dl2) for groups 2-3. Group l's 11-bit index is
    qs[4ib + l] | (low or high 3 bits of qh[2ib + l/2]) << 8, and its delta is
    -0.125 where bit 3 (l even) or 7 (l odd) of that qh byte is set.
    """
    s = _IQ1_M_SCALES
    d = F16_TO_F32[iq1_m_d_bits(b, s)]
    for ib in range(_IQ1_M_NSUB):
        sc = rd.u16(b, s + 2 * (ib // 2))
        shift = 6 * (ib % 2)
        dl1 = d * np.float32(2 * ((sc >> shift) & 7) + 1)
        dl2 = d * np.float32(2 * ((sc >> (shift + 3)) & 7) + 1)
        for l in range(4):
            qh = np.int64(b[_IQ1_M_QH + 2 * ib + l // 2])
            half = 4 * (l % 2)
            idx = np.int64(b[_IQ1_M_QS + 4 * ib + l]) | (((qh >> half) & 7) << 8)
            delta = -_IQ1_DELTA if (qh >> (half + 3)) & 1 else _IQ1_DELTA
            dl = dl1 if l < 2 else dl2
            _iq1_group8(y, _SUB * ib + 8 * l, dl, IQ1S_GRID_BYTES[idx], delta)


@register_dequant(GGMLType.IQ4_NL)
@njit(inline="always", cache=True)
def dequant_iq4_nl(b, y):
    """IQ4_NL block (18 bytes) -> 32 float32 (ggml `dequantize_row_iq4_nl`):
    y[j] = d * kvalues_iq4nl[qs[j] & 15], y[j+16] = d * kvalues_iq4nl[qs[j] >> 4].
    """
    d = rd.f16(b, _IQ4_NL_D)
    for j in range(_IQ4_NL_HALF):
        q = b[_IQ4_NL_QS + j]
        y[j] = d * np.float32(KVALUES_IQ4NL[q & 15])
        y[j + _IQ4_NL_HALF] = d * np.float32(KVALUES_IQ4NL[q >> 4])


@register_dequant(GGMLType.IQ4_XS)
@njit(inline="always", cache=True)
def dequant_iq4_xs(b, y):
    """IQ4_XS block (136 bytes) -> 256 float32 (ggml `dequantize_row_iq4_xs`).

    6-bit scale ls = nibble ib of scales_l | ((scales_h >> 2ib) & 3) << 4,
    dl = d * (ls - 32); y[32ib + j] = dl * kv[qs[16ib + j] & 15],
    y[32ib + 16 + j] = dl * kv[qs[16ib + j] >> 4] (kv = kvalues_iq4nl).
    """
    d = rd.f16(b, _IQ4_XS_D)
    for ib in range(_IQ4_XS_NSUB):
        dl = d * np.float32(iq4_xs_ls(b, _IQ4_XS_SCALES_H, _IQ4_XS_SCALES_L, ib) - 32)
        for j in range(_SUB // 2):
            q = b[_IQ4_XS_QS + (_SUB // 2) * ib + j]
            y[_SUB * ib + j] = dl * np.float32(KVALUES_IQ4NL[q & 15])
            y[_SUB * ib + _SUB // 2 + j] = dl * np.float32(KVALUES_IQ4NL[q >> 4])
