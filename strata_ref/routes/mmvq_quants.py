"""Integer quants of weight blocks, in value order, for the q8_1 mat-vec.

`unpack(t, blocks)` returns the integers that the CUDA dot products feed to
dp4a (not the dequantized floats) plus the block's scale fields, so that
routes/mmvq.py can form each thread's integer dot and its float combine.
The value order is ggml's dequantization order (formats.md §5): value v of
the block is the one `dequantize_row_*` writes to y[v].

What each type's integers are (ggml-org/llama.cpp ggml-cuda/vecdotq.cuh):

* Q4_0, Q4_1: the nibble 0..15 (the -8 / the min enter through the q8_1 sum);
  Q5_0, Q5_1: nibble | qh bit << 4, 0..31; Q8_0: the int8.
* Q4_K: nibble; Q5_K: nibble | qh bit << 4; Q6_K: (ql | qh << 4) - 32;
  Q2_K: the 2-bit value; Q3_K: 2-bit value - 4 where the hmask bit is clear.
* IQ4_NL, IQ4_XS: kvalues_iq4nl[nibble]; MXFP4: kvalues_mxfp4[nibble].
* IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: the grid byte, negated where the
  sign bit is set (ksigns parity rule for the 7-bit sign fields).
* IQ1_S, IQ1_M: the iq1s_grid_gpu nibble 0..2 (value + 1; the -1 and the
  delta enter through the q8_1 values' sum).

Scale fields are float32 (fp16 widened by ggml's rule) or int32.
"""
from __future__ import annotations

import numpy as np

from ..formats import iq_tables as iqt
from ..formats.fp4 import KVALUES_MXFP4
from ..numerics import e8m0_half_to_f32, f16_bits_to_f32
from ..types import GGMLType, block_format

__all__ = ["unpack", "UNPACKERS"]

T = GGMLType
UNPACKERS: dict = {}


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
def _q4_0(f):
    return {"q": _lo_hi(f["qs"]), "d": _f16(f["d"])}


@_reg(T.Q4_1)
def _q4_1(f):
    return {"q": _lo_hi(f["qs"]), "d": _f16(f["d"]), "m": _f16(f["m"])}


@_reg(T.Q5_0)
def _q5_0(f):
    return {"q": _lo_hi(f["qs"]) | (_qh_bits(f["qh"]) << 4), "d": _f16(f["d"])}


@_reg(T.Q5_1)
def _q5_1(f):
    return {"q": _lo_hi(f["qs"]) | (_qh_bits(f["qh"]) << 4), "d": _f16(f["d"]),
            "m": _f16(f["m"])}


@_reg(T.Q8_0)
def _q8_0(f):
    return {"q": f["qs"].astype(np.int32), "d": _f16(f["d"])}


@_reg(T.IQ4_NL)
def _iq4_nl(f):
    return {"q": KVALUES_IQ4NL_I32[_lo_hi(f["qs"])], "d": _f16(f["d"])}


@_reg(T.MXFP4)
def _mxfp4(f):
    # d is ggml's E8M0 *half* value 2^(e-128) (the kvalues are doubled),
    # exactly `ggml_cuda_e8m0_to_fp32(e) * 0.5f` for e < 255.
    return {"q": KVALUES_MXFP4_I32[_lo_hi(f["qs"])],
            "d": e8m0_half_to_f32(f["e"][:, 0]).astype(np.float32)}


KVALUES_IQ4NL_I32 = iqt.KVALUES_IQ4NL.astype(np.int32)
KVALUES_MXFP4_I32 = np.asarray(KVALUES_MXFP4).astype(np.int32)


def _k4_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml get_scale_min_k4 for j = 0..7: (scale, min), int32 (n, 8)."""
    s = sc.astype(np.int32)
    scale = np.empty((len(s), 8), np.int32)
    mins = np.empty((len(s), 8), np.int32)
    scale[:, :4] = s[:, 0:4] & 63
    mins[:, :4] = s[:, 4:8] & 63
    scale[:, 4:] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    mins[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return scale, mins


def _k4_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 256): chunk c of 32 bytes gives values
    64c..64c+31 (low nibbles) and 64c+32..64c+63 (high nibbles)."""
    q = qs.astype(np.int32).reshape(-1, 4, 1, 32)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, 256)


@_reg(T.Q4_K)
def _q4_k(f):
    sc, m = _k4_scales(f["scales"])
    return {"q": _k4_nibbles(f["qs"]), "sc": sc, "m": m,
            "d": _f16(f["d"]), "dmin": _f16(f["dmin"])}


@_reg(T.Q5_K)
def _q5_k(f):
    sc, m = _k4_scales(f["scales"])
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
def _q6_k(f):
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
def _q2_k(f):
    qb, sh, _, _ = _K23
    q = (f["qs"].astype(np.int32)[:, qb] >> sh) & 3
    s = f["scales"].astype(np.int32)
    return {"q": q, "sc": s & 15, "m": s >> 4, "d": _f16(f["d"]), "dmin": _f16(f["dmin"])}


def _q3_scales(sc: np.ndarray) -> np.ndarray:
    """The 16 signed 6-bit Q3_K scales (value - 32), int32 (n, 16)."""
    s = sc.astype(np.int32)
    j = np.arange(16)
    low = (s[:, j % 8] >> (4 * (j // 8))) & 15
    high = ((s[:, 8 + j % 4] >> (2 * (j // 4))) & 3) << 4
    return (low | high) - 32


@_reg(T.Q3_K)
def _q3_k(f):
    qb, sh, bit, l = _K23
    q = (f["qs"].astype(np.int32)[:, qb] >> sh) & 3
    hm = (f["hmask"].astype(np.int32)[:, l] >> bit) & 1
    return {"q": q - 4 * (1 - hm), "sc": _q3_scales(f["scales"]), "d": _f16(f["d"])}


@_reg(T.IQ4_XS)
def _iq4_xs(f):
    ib = np.arange(8)
    sl = f["scales_l"].astype(np.int32)[:, ib // 2] >> (4 * (ib % 2)) & 15
    sh = (f["scales_h"].astype(np.int32) >> (2 * ib)) & 3
    q = f["qs"].astype(np.int32).reshape(-1, 8, 16)
    q = np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, 256)
    return {"q": KVALUES_IQ4NL_I32[q], "ls": sl | (sh << 4), "d": _f16(f["d"])}


def _signed(grid_bytes: np.ndarray, sign_bits: np.ndarray) -> np.ndarray:
    """grid (..., 8) magnitudes, sign byte (...) -> int32 values, value j
    negated where bit j of the sign byte is set."""
    neg = (sign_bits[..., None].astype(np.int32) >> np.arange(8)) & 1
    g = grid_bytes.astype(np.int32)
    return np.where(neg == 1, -g, g)


def _ksigns(bits7: np.ndarray) -> np.ndarray:
    """7-bit sign field -> 8 sign bits (the 8th is the parity, `ksigns_iq2xs`)."""
    return iqt.KSIGNS_IQ2XS[bits7 & 127]


@_reg(T.IQ2_XXS)
def _iq2_xxs(f):
    qs = np.ascontiguousarray(f["qs"]).view(np.uint8).reshape(-1, 8, 8)   # 8 sub-blocks
    idx = qs[:, :, :4].astype(np.int32)                                  # 4 grid indices
    aux = qs[:, :, 4:].copy().view("<u4")[..., 0].astype(np.int64)       # (n, 8)
    signs = _ksigns((aux[..., None] >> (7 * np.arange(4))).astype(np.int64))
    q = _signed(iqt.IQ2XXS_GRID_BYTES[idx], signs).reshape(-1, 256)
    return {"q": q, "ls": (2 * (aux >> 28) + 1).astype(np.int32), "d": _f16(f["d"])}


@_reg(T.IQ2_XS)
def _iq2_xs(f):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4)
    q = _signed(iqt.IQ2XS_GRID_BYTES[qs & 511], _ksigns(qs >> 9)).reshape(-1, 256)
    s = f["scales"].astype(np.int32)
    return {"q": q, "ls0": s & 15, "ls1": s >> 4, "d": _f16(f["d"])}


@_reg(T.IQ2_S)
def _iq2_s(f):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4)
    qh = f["qh"].astype(np.int32)[:, :, None] >> (2 * np.arange(4))
    idx = qs | ((qh & 3) << 8)
    q = _signed(iqt.IQ2S_GRID_BYTES[idx], f["signs"].reshape(-1, 8, 4)).reshape(-1, 256)
    s = f["scales"].astype(np.int32)
    return {"q": q, "ls0": s & 15, "ls1": s >> 4, "d": _f16(f["d"])}


@_reg(T.IQ3_XXS)
def _iq3_xxs(f):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4, 2)                   # (n, ib, group, half)
    aux = f["scales_and_signs"].astype(np.int64)                         # (n, 8)
    signs = _ksigns(aux[..., None] >> (7 * np.arange(4)))                # (n, 8, 4)
    g = iqt.IQ3XXS_GRID_BYTES[qs].reshape(-1, 8, 4, 8)
    q = _signed(g, signs).reshape(-1, 256)
    return {"q": q, "ls": (aux >> 28).astype(np.int32), "d": _f16(f["d"])}


@_reg(T.IQ3_S)
def _iq3_s(f):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 8)
    qh = f["qh"].astype(np.int32)[:, :, None] >> np.arange(8)
    idx = (qs | ((qh & 1) << 8)).reshape(-1, 8, 4, 2)
    g = iqt.IQ3S_GRID_BYTES[idx].reshape(-1, 8, 4, 8)
    q = _signed(g, f["signs"].reshape(-1, 8, 4)).reshape(-1, 256)
    ib = np.arange(8)
    ls = (f["scales"].astype(np.int32)[:, ib // 2] >> (4 * (ib % 2))) & 15
    return {"q": q, "ls": ls, "d": _f16(f["d"])}


def _iq1_grid(idx: np.ndarray) -> np.ndarray:
    """iq1s_grid_gpu entries (..., ) -> (..., 8) nibbles 0..2: values 0..3
    are the low nibbles of bytes 0..3, values 4..7 the high nibbles."""
    g = iqt.IQ1S_GRID_GPU[idx].astype(np.int64)
    b = (g[..., None] >> (8 * np.arange(4))) & 255
    return np.concatenate([b & 15, b >> 4], axis=-1).astype(np.int32)


@_reg(T.IQ1_S)
def _iq1_s(f):
    qh = f["qh"].astype(np.int32)                                         # (n, 8)
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4)
    idx = qs | (((qh[:, :, None] >> (3 * np.arange(4))) & 7) << 8)
    return {"q": _iq1_grid(idx).reshape(-1, 256), "qh": qh, "d": _f16(f["d"])}


@_reg(T.IQ1_M)
def _iq1_m(f):
    qs = f["qs"].astype(np.int32).reshape(-1, 8, 4)
    qh = f["qh"].astype(np.int32).reshape(-1, 8, 2)
    qhl = qh[:, :, np.arange(4) // 2] >> (4 * (np.arange(4) % 2))        # (n, 8, 4)
    idx = qs | ((qhl & 7) << 8)
    sc = f["scales"].astype(np.int64)                                     # (n, 4) u16
    d_bits = ((sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00)
              | (sc[:, 3] & 0xF000))
    ib = np.arange(8)
    tmp = sc[:, ib // 2] >> (6 * (ib % 2))
    return {"q": _iq1_grid(idx).reshape(-1, 256), "qhl": qhl,
            "sc0": (2 * (tmp & 7) + 1).astype(np.int32),
            "sc1": (2 * ((tmp >> 3) & 7) + 1).astype(np.int32),
            "d": f16_bits_to_f32(d_bits).astype(np.float32)}


def unpack(t: GGMLType, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """Integer quants and scale fields of `blocks` (uint8 (n, block_bytes)).

    Returns {"q": int32 (n, QK) in value order, plus per-type scale arrays
    with leading axis n}. Raises ValueError for a type without a q8_1 dot.
    """
    fn = UNPACKERS.get(GGMLType(t))
    if fn is None:
        raise ValueError(f"no q8_1 mat-vec for type {GGMLType(t).name}")
    return fn(block_format(t).split(blocks))
