"""The integers inside each block type, declared once.

`strata_ref.types` declares a block's bytes and field offsets; this module
declares how its packed integer fields are read: the rules that take a
sub-block's scale, min or code out of the bytes (ggml's `get_scale_min_k4`,
the Q3_K scale shuffle, IQ4_XS's split 6-bit scales, IQ1_M's fp16 d spread
over four words), and per type `unpack(t, blocks)`, every value's integer
and the block's scale fields in value order.

Each rule is one plain function of (b, o, index): `b[i]` is byte i of the
block, `o` a field's offset (from `types.block_format`). It is written so
that the same source serves twice: compiled by numba (`rule(b, o, j)` on one
block's uint8 array, inlined into the formats' block functions and the
quantizers), and as NumPy over many blocks at once (`rule.py_func(blocks.T,
o, j)`: row i of the transposed (B, n) array is byte i of every block), which
is how `unpack` uses it. A rule calls no other rule, so its `py_func` runs
without numba.

`unpack` returns the integers that the q8_1 dot products feed to dp4a (not
the dequantized floats) plus the block's scale fields; the value order is
ggml's dequantization order (formats.md §5): value v of the block is the one
`dequantize_row_*` writes to y[v]. What each type's integers are
(ggml-org/llama.cpp ggml-cuda/vecdotq.cuh):

* Q4_0, Q4_1: the nibble 0..15 (the -8 / the min enter through the q8_1 sum);
  Q5_0, Q5_1: nibble | qh bit << 4, 0..31; Q8_0: the int8.
* Q4_K: nibble; Q5_K: nibble | qh bit << 4; Q6_K: (ql | qh << 4) - 32;
  Q2_K: the 2-bit value; Q3_K: 2-bit value - 4 where the hmask bit is clear.
* IQ4_NL, IQ4_XS: kvalues_iq4nl[nibble]; MXFP4: kvalues_mxfp4[nibble].
* IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: the grid byte, negated where the
  sign bit is set (ksigns parity rule for the 7-bit sign fields).
* IQ1_S, IQ1_M: the iq1s_grid_gpu nibble 0..2 (value + 1; the -1 and the
  delta enter through the q8_1 values' sum).

Scale fields are float32 (fp16 widened by ggml's rule) or int32. Sources:
ggml-org/ggml src/ggml-quants.c (`dequantize_row_*`, `get_scale_min_k4`)
and src/ggml-common.h (block structs) @ d99724f2.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
from numba import njit

from .numerics import e8m0_half_to_f32, f16_bits_to_f32
from .types import GGMLType, block_format

__all__ = ["unpack", "UNPACKERS", "scale_min_k4", "q3_k_scale", "iq4_xs_ls", "iq1_m_d_bits",
           "put_iq1_m_d"]


def _rule(fn):
    # numba-compiled for one block, the plain function kept as `.py_func`
    return njit(inline="always", cache=True, error_model="numpy")(fn)


# ---------------------------------------------------------------- rules

@_rule
def scale_min_k4(b, o, j):
    """ggml `get_scale_min_k4(j, scales)`: the 6-bit (scale, min) of
    sub-block j < 8 of a Q4_K / Q5_K block whose 12 scale bytes start at o.
    j < 4: scales[j] & 63, scales[j+4] & 63; j >= 4: the low / high nibble
    of scales[j+4] with the top 2 bits of scales[j-4] / scales[j] above."""
    if j < 4:
        return np.int64(b[o + j]) & 63, np.int64(b[o + j + 4]) & 63
    sc = (np.int64(b[o + j + 4]) & 15) | ((np.int64(b[o + j - 4]) >> 6) << 4)
    m = (np.int64(b[o + j + 4]) >> 4) | ((np.int64(b[o + j]) >> 6) << 4)
    return sc, m


@_rule
def q3_k_scale(b, o, s):
    """Signed 6-bit scale s < 16 of a Q3_K block whose 12 scale bytes start
    at o (ggml's kmask1/kmask2 shuffle in `dequantize_row_q3_K`): the low 4
    bits are the low nibbles of bytes 0-7 (s < 8) or their high nibbles
    (s >= 8), the 2 high bits are bits 2(s/4)..2(s/4)+1 of byte 8 + s%4;
    value - 32."""
    if s < 8:
        low4 = np.int64(b[o + s]) & 15
    else:
        low4 = np.int64(b[o + s - 8]) >> 4
    hi2 = (np.int64(b[o + 8 + (s & 3)]) >> (2 * (s >> 2))) & 3
    return (low4 | (hi2 << 4)) - 32


@_rule
def iq4_xs_ls(b, o_h, o_l, ib):
    """Unsigned 6-bit scale ls of sub-block ib < 8 of an IQ4_XS block
    (`dequantize_row_iq4_xs`): nibble ib of scales_l (at o_l) | bits 2ib,
    2ib+1 of the u16 scales_h (at o_h) << 4; the scale is ls - 32."""
    lo = (np.int64(b[o_l + ib // 2]) >> (4 * (ib % 2))) & 15
    sh = np.int64(b[o_h]) | (np.int64(b[o_h + 1]) << 8)
    return lo | (((sh >> (2 * ib)) & 3) << 4)


@_rule
def iq1_m_d_bits(b, o):
    """fp16 bits of an IQ1_M block's d (`dequantize_row_iq1_m`): the top
    nibbles of its four little-endian u16 scale words at o, word 0's lowest."""
    s0 = np.int64(b[o]) | (np.int64(b[o + 1]) << 8)
    s1 = np.int64(b[o + 2]) | (np.int64(b[o + 3]) << 8)
    s2 = np.int64(b[o + 4]) | (np.int64(b[o + 5]) << 8)
    s3 = np.int64(b[o + 6]) | (np.int64(b[o + 7]) << 8)
    return (s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000)


def put_iq1_m_d(blocks: np.ndarray, o: int, d_bits) -> None:
    """Write fp16 bits `d_bits` (one per block, or one for all) as the d of
    the IQ1_M blocks (n, 56) in place: nibble k of d into the top nibble of
    scale word k at o, the low 12 bits of each word kept (the inverse of
    `iq1_m_d_bits`)."""
    n = len(blocks)
    sc = np.ascontiguousarray(blocks[:, o:o + 8]).view("<u2").copy()
    d = np.broadcast_to(np.asarray(d_bits, np.uint16), (n,))
    for k in range(4):
        sc[:, k] = (sc[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
    blocks[:, o:o + 8] = sc.view(np.uint8)


def _cols(rule, bt, *args, count):
    """int64 (n, count): rule.py_func over the blocks' bytes bt (B, n) for
    index 0..count-1."""
    return np.stack([rule.py_func(bt, *args, i) for i in range(count)], axis=1)


# ---------------------------------------------------------------- unpack

T = GGMLType
UNPACKERS: dict = {}


@functools.cache
def _tables() -> SimpleNamespace:
    # ggml's codebooks, kept by the formats package (formats.iq_tables,
    # formats.fp4), read when an unpack first runs: importing this module
    # needs only types and numerics, so the formats can inline the rules
    from .formats import iq_tables
    from .formats.fp4 import KVALUES_MXFP4
    return SimpleNamespace(iqt=iq_tables, kv_iq4nl=iq_tables.KVALUES_IQ4NL.astype(np.int32),
                           kv_mxfp4=np.asarray(KVALUES_MXFP4).astype(np.int32))


def _reg(t):
    def deco(fn):
        UNPACKERS[t] = fn
        return fn
    return deco


def _f16(a) -> np.ndarray:
    return f16_bits_to_f32(np.asarray(a)[..., 0]).astype(np.float32)


def _lo_hi(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) nibbles: low nibbles are values 0..15,
    high nibbles values 16..31 (the 32-value legacy layout)."""
    qs = qs.astype(np.int32)
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def _qh_bits(qh_u32: np.ndarray) -> np.ndarray:
    """(n, 1) uint32 qh -> (n, 32) int32 bit j of qh for value j."""
    return ((qh_u32.astype(np.int64) >> np.arange(32)) & 1).astype(np.int32)


@_reg(T.Q4_0)
def _q4_0(f, bt):
    return {"q": _lo_hi(f["qs"]), "d": _f16(f["d"])}


@_reg(T.Q4_1)
def _q4_1(f, bt):
    return {"q": _lo_hi(f["qs"]), "d": _f16(f["d"]), "m": _f16(f["m"])}


@_reg(T.Q5_0)
def _q5_0(f, bt):
    return {"q": _lo_hi(f["qs"]) | (_qh_bits(f["qh"]) << 4), "d": _f16(f["d"])}


@_reg(T.Q5_1)
def _q5_1(f, bt):
    return {"q": _lo_hi(f["qs"]) | (_qh_bits(f["qh"]) << 4), "d": _f16(f["d"]),
            "m": _f16(f["m"])}


@_reg(T.Q8_0)
def _q8_0(f, bt):
    return {"q": f["qs"].astype(np.int32), "d": _f16(f["d"])}


@_reg(T.IQ4_NL)
def _iq4_nl(f, bt):
    return {"q": _tables().kv_iq4nl[_lo_hi(f["qs"])], "d": _f16(f["d"])}


@_reg(T.MXFP4)
def _mxfp4(f, bt):
    # d is ggml's E8M0 *half* value 2^(e-128) (the kvalues are doubled),
    # exactly `ggml_cuda_e8m0_to_fp32(e) * 0.5f` for e < 255.
    return {"q": _tables().kv_mxfp4[_lo_hi(f["qs"])],
            "d": e8m0_half_to_f32(f["e"][:, 0]).astype(np.float32)}




def _k4_scales(t, bt) -> tuple[np.ndarray, np.ndarray]:
    """`scale_min_k4` for j = 0..7: (scale, min), int32 (n, 8)."""
    o = block_format(t).offset("scales")
    pairs = [scale_min_k4.py_func(bt, o, j) for j in range(8)]
    return (np.stack([p[0] for p in pairs], axis=1).astype(np.int32),
            np.stack([p[1] for p in pairs], axis=1).astype(np.int32))


def _k4_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 256): chunk c of 32 bytes gives values
    64c..64c+31 (low nibbles) and 64c+32..64c+63 (high nibbles)."""
    q = qs.astype(np.int32).reshape(-1, 4, 1, 32)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, 256)


@_reg(T.Q4_K)
def _q4_k(f, bt):
    sc, m = _k4_scales(T.Q4_K, bt)
    return {"q": _k4_nibbles(f["qs"]), "sc": sc, "m": m,
            "d": _f16(f["d"]), "dmin": _f16(f["dmin"])}


@_reg(T.Q5_K)
def _q5_k(f, bt):
    sc, m = _k4_scales(T.Q5_K, bt)
    v = np.arange(256)
    qh = f["qh"].astype(np.int32)                     # (n, 32)
    hi = (qh[:, v % 32] >> (v // 32)) & 1             # sub-block j uses bit j
    return {"q": _k4_nibbles(f["qs"]) | (hi << 4), "sc": sc, "m": m,
            "d": _f16(f["d"]), "dmin": _f16(f["dmin"])}


def _q6_index():
    """(ql byte, ql shift, qh byte, qh shift) of each Q6_K value v."""
    v = np.arange(256)
    n, r = v // 128, v % 128
    k, l = r // 32, r % 32                            # y[128n + 32k + l]
    ql_byte = 64 * n + l + 32 * (k % 2)
    ql_shift = 4 * (k // 2)
    qh_byte = 32 * n + l
    qh_shift = 2 * k
    return ql_byte, ql_shift, qh_byte, qh_shift


_Q6 = _q6_index()


@_reg(T.Q6_K)
def _q6_k(f, bt):
    qlb, qls, qhb, qhs = _Q6
    ql = f["ql"].astype(np.int32)
    qh = f["qh"].astype(np.int32)
    q = (((ql[:, qlb] >> qls) & 15) | (((qh[:, qhb] >> qhs) & 3) << 4)) - 32
    return {"q": q, "sc": f["scales"].astype(np.int32), "d": _f16(f["d"])}


def _k23_index():
    """Q2_K/Q3_K value v = 128h + 32j + l: qs byte 32h + l, shift 2j."""
    v = np.arange(256)
    h, r = v // 128, v % 128
    j, l = r // 32, r % 32
    return 32 * h + l, 2 * j, 4 * h + j, l


_K23 = _k23_index()


@_reg(T.Q2_K)
def _q2_k(f, bt):
    qb, sh, _, _ = _K23
    q = (f["qs"].astype(np.int32)[:, qb] >> sh) & 3
    s = f["scales"].astype(np.int32)
    return {"q": q, "sc": s & 15, "m": s >> 4, "d": _f16(f["d"]), "dmin": _f16(f["dmin"])}


_Q3_K_SC = block_format(T.Q3_K).offset("scales")


@_reg(T.Q3_K)
def _q3_k(f, bt):
    qb, sh, bit, l = _K23
    q = (f["qs"].astype(np.int32)[:, qb] >> sh) & 3
    hm = (f["hmask"].astype(np.int32)[:, l] >> bit) & 1
    return {"q": q - 4 * (1 - hm), "sc": _cols(q3_k_scale, bt, _Q3_K_SC, count=16), "d": _f16(f["d"])}


_IQ4_XS = block_format(T.IQ4_XS)


@_reg(T.IQ4_XS)
def _iq4_xs(f, bt):
    ls = _cols(iq4_xs_ls, bt, _IQ4_XS.offset("scales_h"), _IQ4_XS.offset("scales_l"), count=8)
    q = f["qs"].astype(np.int32).reshape(-1, 8, 16)
    q = np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, 256)
    return {"q": _tables().kv_iq4nl[q], "ls": ls, "d": _f16(f["d"])}


def _signed(grid_bytes: np.ndarray, sign_bits: np.ndarray) -> np.ndarray:
    """grid (..., 8) magnitudes, sign byte (...) -> int32 values, value j
    negated where bit j of the sign byte is set."""
    neg = (sign_bits[..., None].astype(np.int32) >> np.arange(8)) & 1
    g = grid_bytes.astype(np.int32)
    return np.where(neg == 1, -g, g)


def _ksigns(bits7: np.ndarray) -> np.ndarray:
    """7-bit sign field -> 8 sign bits (the 8th is the parity, `ksigns_iq2xs`)."""
    return _tables().iqt.KSIGNS_IQ2XS[bits7 & 127]


@_reg(T.IQ2_XXS)
def _iq2_xxs(f, bt):
    qs = np.ascontiguousarray(f["qs"]).view(np.uint8).reshape(-1, 8, 8)   # 8 sub-blocks
    idx = qs[:, :, :4].astype(np.int32)                                  # 4 grid indices
    aux = qs[:, :, 4:].copy().view("<u4")[..., 0].astype(np.int64)       # (n, 8)
    signs = _ksigns((aux[..., None] >> (7 * np.arange(4))).astype(np.int64))
    q = _signed(_tables().iqt.IQ2XXS_GRID_BYTES[idx], signs).reshape(-1, 256)
    return {"q": q, "ls": (2 * (aux >> 28) + 1).astype(np.int32), "d": _f16(f["d"])}


@_reg(T.IQ2_XS)
def _iq2_xs(f, bt):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4)
    q = _signed(_tables().iqt.IQ2XS_GRID_BYTES[qs & 511], _ksigns(qs >> 9)).reshape(-1, 256)
    s = f["scales"].astype(np.int32)
    return {"q": q, "ls0": s & 15, "ls1": s >> 4, "d": _f16(f["d"])}


@_reg(T.IQ2_S)
def _iq2_s(f, bt):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4)
    qh = f["qh"].astype(np.int32)[:, :, None] >> (2 * np.arange(4))
    idx = qs | ((qh & 3) << 8)
    q = _signed(_tables().iqt.IQ2S_GRID_BYTES[idx], f["signs"].reshape(-1, 8, 4)).reshape(-1, 256)
    s = f["scales"].astype(np.int32)
    return {"q": q, "ls0": s & 15, "ls1": s >> 4, "d": _f16(f["d"])}


@_reg(T.IQ3_XXS)
def _iq3_xxs(f, bt):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4, 2)                   # (n, ib, group, half)
    aux = f["scales_and_signs"].astype(np.int64)                         # (n, 8)
    signs = _ksigns(aux[..., None] >> (7 * np.arange(4)))                # (n, 8, 4)
    g = _tables().iqt.IQ3XXS_GRID_BYTES[qs].reshape(-1, 8, 4, 8)
    q = _signed(g, signs).reshape(-1, 256)
    return {"q": q, "ls": (aux >> 28).astype(np.int32), "d": _f16(f["d"])}


@_reg(T.IQ3_S)
def _iq3_s(f, bt):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 8)
    qh = f["qh"].astype(np.int32)[:, :, None] >> np.arange(8)
    idx = (qs | ((qh & 1) << 8)).reshape(-1, 8, 4, 2)
    g = _tables().iqt.IQ3S_GRID_BYTES[idx].reshape(-1, 8, 4, 8)
    q = _signed(g, f["signs"].reshape(-1, 8, 4)).reshape(-1, 256)
    ib = np.arange(8)
    ls = (f["scales"].astype(np.int32)[:, ib // 2] >> (4 * (ib % 2))) & 15
    return {"q": q, "ls": ls, "d": _f16(f["d"])}


def _iq1_grid(idx: np.ndarray) -> np.ndarray:
    """iq1s_grid_gpu entries (..., ) -> (..., 8) nibbles 0..2: values 0..3
    are the low nibbles of bytes 0..3, values 4..7 the high nibbles."""
    g = _tables().iqt.IQ1S_GRID_GPU[idx].astype(np.int64)
    b = (g[..., None] >> (8 * np.arange(4))) & 255
    return np.concatenate([b & 15, b >> 4], axis=-1).astype(np.int32)


@_reg(T.IQ1_S)
def _iq1_s(f, bt):
    qh = f["qh"].astype(np.int32)                                         # (n, 8)
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4)
    idx = qs | (((qh[:, :, None] >> (3 * np.arange(4))) & 7) << 8)
    return {"q": _iq1_grid(idx).reshape(-1, 256), "qh": qh, "d": _f16(f["d"])}


@_reg(T.IQ1_M)
def _iq1_m(f, bt):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4)
    qh = f["qh"].astype(np.int32).reshape(-1, 8, 2)
    qhl = qh[:, :, np.arange(4) // 2] >> (4 * (np.arange(4) % 2))        # (n, 8, 4)
    idx = qs | ((qhl & 7) << 8)
    sc = f["scales"].astype(np.int64)                                     # (n, 4) u16
    d_bits = iq1_m_d_bits.py_func(bt, block_format(T.IQ1_M).offset("scales"))
    ib = np.arange(8)
    tmp = sc[:, ib // 2] >> (6 * (ib % 2))
    return {"q": _iq1_grid(idx).reshape(-1, 256), "qhl": qhl,
            "sc0": (2 * (tmp & 7) + 1).astype(np.int32),
            "sc1": (2 * ((tmp >> 3) & 7) + 1).astype(np.int32),
            "d": f16_bits_to_f32(d_bits).astype(np.float32)}


def unpack(t: GGMLType, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """Integer quants and scale fields of `blocks` (uint8 (n, block_bytes)).

    Returns {"q": int32 (n, QK) in value order, plus per-type scale arrays
    with leading axis n}. The 20 weight types of the q8_1 mat-vec
    (`UNPACKERS`) have one; ValueError for another type.
    """
    fn = UNPACKERS.get(GGMLType(t))
    if fn is None:
        raise ValueError(f"no integer unpacking declared for type {GGMLType(t).name}")
    fmt = block_format(t)
    return fn(fmt.split(blocks), np.asarray(blocks, np.uint8).T)
