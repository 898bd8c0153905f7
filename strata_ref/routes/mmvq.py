"""The q8_1 mat-vec (MMVQ) oracle: integer dots, float combines, one order.

y[c, r] = sum over the K values of row r of a quantized weight matrix times
activation column c, quantized to q8_1 (routes/q8_1.py), computed exactly as
strata-ref's CUDA kernels compute it (native/mmvq*.cu), bit for bit.

Thread dots (../shared/spec/kernels.md §7; the expressions of
ggml-org/llama.cpp ggml/src/ggml-cuda/vecdotq.cuh, `vec_dot_*_q8_1`). A weight
block is shared by T threads; thread t (its `iqs` is vdr·t) covers a fixed
set of the block's values, split into S segments with separate scales. Its
integer dots are sums of int8 products (dp4a: exact, int32 wraparound; with
these formats no sum comes near 2^31). The float combine of each type is
listed in `_COMBINE` with every float32 operation written out; `fma` marks
the sites where the kernel calls `__fmaf_rn` (emulated exactly by
numerics.fma_f32), every other step is one rounded float32 operation
(`__fmul_rn`, `__fadd_rn`, `__fsub_rn`). int -> float is RNE (`__int2float_rn`).

Canonical reduction order (kernels.md §8), the same for every type, every
column count and every kernel layout (plain, interleaved, expert modes):

1. 128 threads, tid = 32·warp + lane. Thread tid visits weight blocks
   kbx = tid // T + BPI·i (BPI = 128 // T), i = 0, 1, ..., in increasing
   order, sub-position t = tid % T: `tmp = tmp + dot` from tmp = +0.0f.
2. Lane l: ((tmp[w0] + tmp[w1]) + tmp[w2]) + tmp[w3].
3. XOR butterfly over the 32 lanes (offsets 16, 8, 4, 2, 1): q8_1.butterfly_sum.

A warp-per-row kernel reproduces it with four virtual-warp accumulators:
its chunk m (blocks 32/T·m + lane/T) is warp m % 4's iteration m // 4.
Column c of a multi-column call is bitwise the single-column call on c.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..numerics import fma_f32
from ..types import GGMLType, block_format, parse_type
from ..blocks import unpack
from .q8_1 import QK8_1, butterfly_sum, q8_1_fields, quantize_q8_1

__all__ = ["Geometry", "GEOMETRY", "SUPPORTED_TYPES", "thread_dots", "canonical_reduce",
           "mmvq", "mmvq_f32", "dp4a", "MAX_COLUMNS"]

T = GGMLType
MAX_COLUMNS = 8
_F = np.float32


@dataclass(frozen=True)
class Geometry:
    """Thread geometry of one type: `T` threads per weight block, `vdr`
    ints per thread call (iqs = vdr·t), `vidx` int (T, S, n): the block's
    value indices covered by thread t in segment s."""
    T: int
    vdr: int
    vidx: np.ndarray

    @property
    def bpi(self) -> int:
        """Weight blocks covered per iteration of the 128 threads."""
        return 128 // self.T


def dp4a(a, b, c) -> np.ndarray:
    """CUDA `__dp4a(a, b, c)` on int32 words: c + sum of the four int8 byte
    products, int32 wraparound (numpy int32 addition wraps)."""
    a = np.ascontiguousarray(a, dtype=np.int32)
    b = np.ascontiguousarray(b, dtype=np.int32)
    pa = a[..., None].view(np.int8).astype(np.int32)
    pb = b[..., None].view(np.int8).astype(np.int32)
    s = (pa * pb).sum(axis=-1, dtype=np.int32)
    with np.errstate(over="ignore"):
        return (np.asarray(c, dtype=np.int32) + s).astype(np.int32)


# --- value sets per thread ------------------------------------------------

def _legacy_vidx():
    # T = 2, vdr 2: thread t reads qs bytes 8t..8t+7: low nibbles are values
    # 8t..8t+7, high nibbles values 16+8t..16+8t+7 (q8 ints iqs+i, iqs+i+4).
    t = np.arange(2)[:, None]
    k = np.arange(8)[None, :]
    return np.concatenate([8 * t + k, 16 + 8 * t + k], axis=1)[:, None, :]


def _q8_0_vidx():
    return (8 * np.arange(4)[:, None] + np.arange(8))[:, None, :]


def _k45_vidx():
    # T = 16: v[0], v[1] are qs ints at byte 32·(t/4) + 4·(t%4) and +16;
    # segment i (nibble i) is sub-block 2·(t/4)+i, positions 4(t%4)+k, 16+4(t%4)+k.
    t = np.arange(16)[:, None, None]
    i = np.arange(2)[None, :, None]
    k = np.arange(4)[None, None, :]
    pos = np.concatenate([4 * (t % 4) + k + 0 * i, 16 + 4 * (t % 4) + k + 0 * i], axis=2)
    return 32 * (2 * (t // 4) + i) + pos


def _q6_vidx():
    # T = 32: ql int t is half n = t/16, byte b = 4(t%16): l = b%32, k = b/32;
    # segment i (nibble i): values 128n + 32k + 64i + l + 0..3.
    t = np.arange(32)[:, None, None]
    i = np.arange(2)[None, :, None]
    j = np.arange(4)[None, None, :]
    b = 4 * (t % 16)
    return 128 * (t // 16) + 32 * (b // 32) + 64 * i + b % 32 + j


def _k23_vidx():
    # T = 16, vdr 1: qs int t is half n = t/8, bytes l = 4(t%8)+k; segment
    # i (shift 2i) holds values 128n + 32i + l.
    t = np.arange(16)[:, None, None]
    i = np.arange(4)[None, :, None]
    k = np.arange(4)[None, None, :]
    return 128 * (t // 8) + 32 * i + 4 * (t % 8) + k


def _sub_vidx(segments: int):
    # T = 8: thread t takes sub-block t (32 values), in `segments` equal parts.
    n = 32 // segments
    t = np.arange(8)[:, None, None]
    s = np.arange(segments)[None, :, None]
    return 32 * t + n * s + np.arange(n)[None, None, :]


def _geometry() -> dict:
    g = {}
    for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL, T.MXFP4):
        g[t] = Geometry(2, 2, _legacy_vidx())
    g[T.Q8_0] = Geometry(4, 2, _q8_0_vidx())
    g[T.Q4_K] = Geometry(16, 2, _k45_vidx())
    g[T.Q5_K] = Geometry(16, 2, _k45_vidx())
    g[T.Q6_K] = Geometry(32, 1, _q6_vidx())
    g[T.Q2_K] = Geometry(16, 1, _k23_vidx())
    g[T.Q3_K] = Geometry(16, 1, _k23_vidx())
    g[T.IQ4_XS] = Geometry(8, 4, _sub_vidx(1))
    for t in (T.IQ2_XXS, T.IQ3_XXS, T.IQ3_S):
        g[t] = Geometry(8, 2, _sub_vidx(1))
    for t in (T.IQ2_XS, T.IQ2_S):
        g[t] = Geometry(8, 2, _sub_vidx(2))
    g[T.IQ1_S] = Geometry(8, 1, _sub_vidx(4))    # 4 groups of 8 (sumi is one sum)
    g[T.IQ1_M] = Geometry(8, 1, _sub_vidx(4))    # groups of 8: delta per group
    for v in g.values():
        v.vidx.setflags(write=False)
    return g


GEOMETRY: dict = _geometry()
SUPPORTED_TYPES = tuple(GEOMETRY)


# --- float helpers (each one float32 operation, one rounding) -------------

def _f32(i) -> np.ndarray:
    """int32 -> float32, RNE (`__int2float_rn`)."""
    return np.asarray(i).astype(_F)


def _mul(a, b):
    return np.multiply(a, b, dtype=_F)


def _add(a, b):
    return np.add(a, b, dtype=_F)


def _sub(a, b):
    return np.subtract(a, b, dtype=_F)


def _cdiv(a, k: int) -> np.ndarray:
    """C integer division a / k (truncation toward zero), int32."""
    a = np.asarray(a, np.int32)
    return np.where(a < 0, -((-a) // k), a // k).astype(np.int32)


# --- combines: (W fields at (r, b, ...), A at (c, 1, b, ...)) -> dots --------
# In every combine: si[..., s] is the thread's integer dot in segment s, shape
# (c, r, b, T, S); su[..., s] the sum of its q8 values (c, 1, b, T, S); d8/s8
# the fp16 d and sum of the q8_1 block of each segment (c, 1, b, T, S); w the
# unpacked weight fields indexed by the thread's sub-block (r, b, T, S).

def _legacy_center(w, si, su, d8, s8, k: float):
    # d_w * (float(sumi)·d8 − k·s8), k = 8·vdr/QI (Q4_0: 4) or 16·vdr/QI (Q5_0: 8)
    a = _mul(_f32(si[..., 0]), d8[..., 0])
    b = _mul(_F(k), s8[..., 0])
    return _mul(w["d"], _sub(a, b))


def _legacy_min(w, si, su, d8, s8):
    # float(sumi)·(d_w·d8) + (m_w·s8)·0.5  (the ÷2 of vecdotq.cuh, exact)
    dd = _mul(w["d"], d8[..., 0])
    ms = _mul(w["m"], s8[..., 0])
    return _add(_mul(_f32(si[..., 0]), dd), _mul(ms, _F(0.5)))


def _scaled_sumi(w, si, su, d8, s8, sumi=None):
    # (d_w·d8)·float(sumi)
    if sumi is None:
        sumi = si[..., 0]
    return _mul(_mul(w["d"], d8[..., 0]), _f32(sumi))


def _k45(w, si, su, d8, s8):
    # sumf_d = fma(d8_i, float(dot1_i·sc_i), sumf_d); sumf_m likewise with
    # dot2_i·m_i (dot2 = sum of the q8 values); d·sumf_d − dmin·sumf_m.
    sd = np.zeros(si.shape[:-1], _F)
    sm = np.zeros(si.shape[:-1], _F)
    for i in range(si.shape[-1]):
        sd = fma_f32(d8[..., i], _f32(si[..., i] * w["sc"][..., i]), sd)
        sm = fma_f32(d8[..., i], _f32(su[..., i] * w["m"][..., i]), sm)
    return _sub(_mul(w["d"], sd), _mul(w["dmin"], sm))


def _k_signed(w, si, su, d8, s8):
    # Q6_K / Q3_K: sumf = fma(d8_i, float(dot_i·sc_i), sumf); d·sumf
    sf = np.zeros(si.shape[:-1], _F)
    for i in range(si.shape[-1]):
        sf = fma_f32(d8[..., i], _f32(si[..., i] * w["sc"][..., i]), sf)
    return _mul(w["d"], sf)


def _iq4_xs(w, si, su, d8, s8):
    return _scaled_sumi(w, si, su, d8, s8, si[..., 0] * (w["ls"][..., 0] - 32))


def _iq2_xxs(w, si, su, d8, s8):
    return _scaled_sumi(w, si, su, d8, s8, _cdiv(si[..., 0] * w["ls"][..., 0], 8))


def _iq2_two_scales(w, si, su, d8, s8):
    # (sumi0·ls0 + sumi1·ls1 + (sumi0 + sumi1)/2)/4, C integer divisions
    s0, s1 = si[..., 0], si[..., 1]
    acc = s0 * w["ls0"][..., 0] + s1 * w["ls1"][..., 0] + _cdiv(s0 + s1, 2)
    return _scaled_sumi(w, si, su, d8, s8, _cdiv(acc, 4))


def _iq3_xxs(w, si, su, d8, s8):
    s = si[..., 0]
    return _scaled_sumi(w, si, su, d8, s8, _cdiv(w["ls"][..., 0] * s + _cdiv(s, 2), 2))


def _iq3_s(w, si, su, d8, s8):
    return _scaled_sumi(w, si, su, d8, s8, si[..., 0] * (1 + 2 * w["ls"][..., 0]))


_DELTA_LO = _F(-0.875)   # -1 + IQ1S_DELTA (0.125), exact
_DELTA_HI = _F(-1.125)   # -1 - IQ1S_DELTA


def _iq1_s(w, si, su, d8, s8):
    # d1q = d·float(2·((qh >> 12) & 7) + 1); delta = −1 ± 0.125 by qh bit 15;
    # d1q · (d8·float(sumi) + s8·delta)
    qh = w["qh"][..., 0]
    d1q = _mul(w["d"], _f32(2 * ((qh >> 12) & 7) + 1))
    delta = np.where(qh & 0x8000, _DELTA_HI, _DELTA_LO).astype(_F)
    sumi = si.sum(axis=-1, dtype=np.int32)
    return _mul(d1q, _add(_mul(d8[..., 0], _f32(sumi)), _mul(s8[..., 0], delta)))


def _iq1_m(w, si, su, d8, s8):
    # per half h (groups 2h, 2h+1): sumi_h, and sumf_h = fma(delta_g,
    # float(sumy_g), sumf_h) over its groups; then
    # (d_w·d8) · ((float(sumi0) + sumf0)·sc0 + (float(sumi1) + sumf1)·sc1)
    half = []
    for h in range(2):
        sumi = si[..., 2 * h] + si[..., 2 * h + 1]
        sf = np.zeros(si.shape[:-1], _F)
        for g in (2 * h, 2 * h + 1):
            delta = np.where(w["qhl"][..., g] & 8, _DELTA_HI, _DELTA_LO).astype(_F)
            sf = fma_f32(delta, _f32(su[..., g]), sf)
        sc = w["sc0" if h == 0 else "sc1"][..., 0]
        half.append(_mul(_add(_f32(sumi), sf), _f32(sc)))
    d = _mul(w["d"], d8[..., 0])
    return _mul(d, _add(half[0], half[1]))


_COMBINE = {
    T.Q4_0: lambda *a: _legacy_center(*a, 4.0), T.Q5_0: lambda *a: _legacy_center(*a, 8.0),
    T.Q4_1: _legacy_min, T.Q5_1: _legacy_min,
    T.Q8_0: _scaled_sumi, T.IQ4_NL: _scaled_sumi, T.MXFP4: _scaled_sumi,
    T.Q4_K: _k45, T.Q5_K: _k45, T.Q2_K: _k45, T.Q6_K: _k_signed, T.Q3_K: _k_signed,
    T.IQ4_XS: _iq4_xs, T.IQ2_XXS: _iq2_xxs, T.IQ2_XS: _iq2_two_scales,
    T.IQ2_S: _iq2_two_scales, T.IQ3_XXS: _iq3_xxs, T.IQ3_S: _iq3_s,
    T.IQ1_S: _iq1_s, T.IQ1_M: _iq1_m,
}


def _scale_index(t: GGMLType, geo: Geometry) -> np.ndarray:
    """Per (thread, segment): the index into the type's per-block scale
    arrays (sub-block of 32 for Q4_K/Q5_K, of 16 for Q6_K/Q2_K/Q3_K, the
    thread's sub-block for the I-quants, 0 for 32-value blocks)."""
    v0 = geo.vidx[..., 0]
    if t in (T.Q6_K, T.Q2_K, T.Q3_K):
        return v0 // 16
    return v0 // 32


def _weight_fields(t, geo, blocks_rb):
    """Unpacked weight fields gathered to (r, b, T, S) (per-block scalars as
    (r, b, 1), q as (r, b, QK))."""
    r, nb = blocks_rb.shape[:2]
    u = unpack(t, blocks_rb.reshape(r * nb, -1))
    si = _scale_index(t, geo)
    out = {}
    for k, v in u.items():
        v = v.reshape((r, nb) + v.shape[1:])
        if k == "q":
            out[k] = v
        elif v.ndim == 2:
            out[k] = v[..., None]                                  # (r, b, 1)
        elif k == "qhl":
            out[k] = v[:, :, np.arange(geo.T)]                    # (r, b, 8, 4)
        else:
            out[k] = v[:, :, si]                                   # (r, b, T, S)
    if t == T.IQ1_S:
        out["qh"] = u["qh"].reshape(r, nb, 8)[:, :, :, None]
    return out


def thread_dots(t, w_blocks: np.ndarray, q8: np.ndarray) -> np.ndarray:
    """float32 (ncols, rows, nb, T): the dot each thread call returns.

    w_blocks: uint8 (rows, nb, block_bytes); q8: uint8 (ncols, nb·QK/32, 36)
    q8_1 blocks. Element [c, r, b, t] is `vec_dot_<type>_q8_1` of weight
    block b of row r at sub-position t with column c.
    """
    t = GGMLType(t)
    geo = GEOMETRY[t]
    rows, nb = w_blocks.shape[:2]
    qk = block_format(t).block_values
    ncols = q8.shape[0]
    d8, s8, qs = q8_1_fields(q8.reshape(-1, q8.shape[-1]))
    nsub = qk // QK8_1
    d8 = d8.reshape(ncols, nb, nsub)
    s8 = s8.reshape(ncols, nb, nsub)
    aq = qs.astype(np.int32).reshape(ncols, nb, qk)
    w = _weight_fields(t, geo, w_blocks)
    tt, ss, n = geo.vidx.shape
    flat = geo.vidx.reshape(-1)
    wq = w.pop("q")[:, :, flat].reshape(rows, nb, tt, ss, n)
    ag = aq[:, :, flat].reshape(ncols, nb, tt, ss, n)
    si = np.einsum("rbtsn,cbtsn->crbts", wq, ag, dtype=np.int64).astype(np.int32)
    su = ag.sum(axis=-1, dtype=np.int32)[:, None]
    sub = geo.vidx[..., 0] // QK8_1                              # q8_1 block per segment
    d8g = d8[:, :, sub][:, None]
    s8g = s8[:, :, sub][:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(_COMBINE[t](w, si, su, d8g, s8g), dtype=_F)


def canonical_reduce(dots: np.ndarray) -> np.ndarray:
    """Reduce thread dots (..., nb, T) float32 to (...) in the canonical
    order (module docstring): strided per-thread sums, cross-warp combine,
    XOR butterfly."""
    dots = np.asarray(dots, _F)
    nb, tt = dots.shape[-2:]
    bpi = 128 // tt
    niter = -(-nb // bpi)
    pad = niter * bpi - nb
    if pad:
        # tmp starts at +0.0f and x + (+0) == x for every x but -0, which
        # tmp never is (+0 + -0 = +0), so zero padding changes no bit.
        dots = np.concatenate([dots, np.zeros(dots.shape[:-2] + (pad, tt), _F)], axis=-2)
    per = dots.reshape(dots.shape[:-2] + (niter, 128))           # tid = T·(kbx % BPI) + t
    tmp = np.zeros(per.shape[:-2] + (128,), _F)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(niter):
            tmp = _add(tmp, per[..., i, :])
        w = tmp.reshape(tmp.shape[:-1] + (4, 32))
        lane = _add(_add(_add(w[..., 0, :], w[..., 1, :]), w[..., 2, :]), w[..., 3, :])
        return butterfly_sum(lane)


def _check(t, w, q8):
    t = parse_type(t)
    if t not in GEOMETRY:
        raise ValueError(f"no q8_1 mat-vec for type {t.name}")
    fmt = block_format(t)
    w = np.asarray(w)
    q8 = np.asarray(q8)
    if w.dtype != np.uint8 or q8.dtype != np.uint8:
        raise TypeError(f"weights and q8_1 blocks must be uint8, got {w.dtype}, {q8.dtype}")
    if q8.ndim == 2:
        q8 = q8[None]
    if q8.ndim != 3 or q8.shape[-1] != block_format(T.Q8_1).block_bytes:
        raise ValueError(f"q8_1 blocks must be (ncols, K/32, 36), got {q8.shape}")
    if not 1 <= q8.shape[0] <= MAX_COLUMNS:
        raise ValueError(f"1..{MAX_COLUMNS} columns, got {q8.shape[0]}")
    k = q8.shape[1] * QK8_1
    if k == 0:
        raise ValueError("q8_1 blocks hold no values (K = 0)")
    if k % fmt.block_values:
        raise ValueError(f"K = {k} is not a multiple of {t.name}'s block of {fmt.block_values}")
    nb = k // fmt.block_values
    if w.ndim != 2 or w.shape[1] != nb * fmt.block_bytes:
        raise ValueError(f"{t.name} weights for K = {k} must be (rows, {nb * fmt.block_bytes})"
                         f" bytes, got {w.shape}")
    return t, w.reshape(w.shape[0], nb, fmt.block_bytes), q8, nb


def mmvq(t, w: np.ndarray, q8: np.ndarray, *, chunk_elems: int = 1 << 22) -> np.ndarray:
    """y = W · x over q8_1 activations, bitwise the CUDA kernels.

    t: GGMLType (one of SUPPORTED_TYPES). w: uint8 (rows, row_bytes), each
    row K/QK whole blocks. q8: uint8 (ncols, K/32, 36) or (K/32, 36), from
    `quantize_q8_1`, 1..8 columns. Returns float32 (ncols, rows).
    Raises TypeError / ValueError naming a bad dtype, shape or type.
    """
    t, wb, q8, nb = _check(t, w, q8)
    tt = GEOMETRY[t].T
    rows = wb.shape[0]
    step = max(1, chunk_elems // max(1, q8.shape[0] * nb * tt * 4))
    out = np.empty((q8.shape[0], rows), _F)
    for r0 in range(0, rows, step):
        out[:, r0:r0 + step] = canonical_reduce(thread_dots(t, wb[r0:r0 + step], q8))
    return out


def mmvq_f32(t, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`mmvq` with float32 activations x (ncols, K) or (K,), each column
    quantized to q8_1 by the canonical rule. Returns float32 (ncols, rows).
    Raises TypeError for non-float32 x, ValueError for x that is not 1-D or
    2-D or whose K is not a multiple of 32 (and as `mmvq` does)."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"activations must be float32, got {x.dtype}")
    if x.ndim not in (1, 2):
        raise ValueError(f"activations must be (K,) or (ncols, K), got shape {x.shape}")
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    if x2.shape[1] % QK8_1:
        raise ValueError(f"activations (ncols, K) = {x2.shape}: K must be a multiple of {QK8_1}")
    q8 = quantize_q8_1(np.ascontiguousarray(x2)).reshape(x2.shape[0], -1, 36)
    return mmvq(t, w, q8)
