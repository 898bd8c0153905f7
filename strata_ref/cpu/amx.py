"""ggml-cpu's AMX mat-mul (`ggml-cpu/amx/`, the sapphirerapids variant's
extra buffer), bit for bit: the weights ggml's AMX buffer holds
(`traits.amx_buffer`) are multiplied here instead of by their family's
kernels.

Source: ggml-cpu/amx/mmq.cpp `ggml_backend_amx_mul_mat` (llama.cpp v0.4.0;
the same file in llama-cpp-python 0.3.36's llama.cpp). It quantizes every
activation row with the weight type's `vec_dot_type` (Q4_0 and Q8_0:
ggml-cpu's `quantize_row_q8_0`, Q4_1: `quantize_row_q8_1`, the chain's
`quantize_rows_q8`; the 256-value types: `quantize_row_q8_K_ref`), then runs
`tinygemm_kernel_vnni` for one activation row or `tinygemm_kernel_amx`
(AMX tiles, `_tile_dpbssd`) for more. Both give, per output element (weight
row n, activation row m), one sequential chain over the blocks b of the
row, c starting at +0.0 (docs/prebuilt.md, "The AMX path"):

| weight | per block b | exact int32 I_b (and J_b) |
|---|---|---|
| Q4_0, Q8_0 | c = fma(float(I_b), d_w * d_a, c) | sum of w * a over 32 (Q4_0: w = q - 8) |
| Q4_1 | the same, then c = fma(m_w, s_a, c) | sum of q * a over 32, q in 0..15 |
| Q4_K, Q5_K | c = fma(float(I_b), d_a * d_w, c); c = fma(float(J_b), -(d_a * dmin_w), c) | I_b = sum over the 8 sub-blocks of scale_j * (sum q * a over 32); J_b = sum of min_j * (the activations' sum over sub-block j, from q8_K's `bsums`) |
| Q6_K | c = fma(float(I_b), d_a * d_w, c) | sum over the 16 sub-blocks of scale_j * (sum (q - 32) * a over 16) |
| IQ4_XS | c = fma(float(I_b), d_a * d_w, c) | sum over the 8 sub-blocks of (ls_j - 32) * (sum kvalues[q] * a over 32) |

(`acc_C` and the VNNI kernels; every product d_w * d_a is one rounded
float32 multiply, and `(-d_a) * dmin_w` in `acc_C` is the
`fnmadd(J, dmin_w * d_a, c)` of the VNNI kernel, bit for bit.) float(I)
rounds to nearest even: I_b can pass 2^24.

F16 weights (`tinygemm_kernel_avx<float, ggml_fp16_t>`, every batch size):
the activations stay F32 (no rounding to F16); per output 16 F32 lanes,
lane l = fma(x[k + l], w[k + l], lane l) for k = 0, 16, 32, ..., then
`_mm512_reduce_add_ps` (`fp.hsum16`).

Threads split whole outputs (`balance211` over blocks of outputs), so no
sum depends on the thread count; here tasks of `_ROWS_PER_TASK` weight rows
run in parallel.

Layout (`pack`, once per matrix): the signed quants as int8 (Q4_0: q - 8,
Q6_K: q - 32, IQ4_XS: kvalues[q]), the sub-block scales as int32 (per 32
values, Q6_K per 16; IQ4_XS: ls - 32), d_w (and m_w / dmin_w) widened to
float32 per block, the mins per 32 values as int32 (Q4_K / Q5_K). F16
weights stay as their bits, widened per row.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import prange

from ..formats.iq_tables import KVALUES_IQ4NL
from ..types import GGMLType as T
from ..types import block_format
from ._digest import jit
from .act_quant import q8_0_fields, q8_1_fields, q8_k_fields
from .dots_float import _widen_f16
from .fp import fma32, hsum16
from .lanes import lanes_scaled_add, q8_block_dot

__all__ = ["AMX_TYPES", "AmxPacked", "pack", "matmul"]

#: the weight types ggml's AMX buffer multiplies (`qtype_has_amx_kernels`
#: in ggml-cpu/amx/common.h, and F16 by `tinygemm_kernel_avx`)
AMX_TYPES = (T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.F16)

_F32 = np.float32
#: arithmetic kinds (module docstring's table rows)
_LEGACY, _LEGACY_MIN, _KQ_MIN, _KQ, _F16 = 0, 1, 2, 3, 4
_KIND = {T.Q4_0: _LEGACY, T.Q8_0: _LEGACY, T.Q4_1: _LEGACY_MIN, T.Q4_K: _KQ_MIN, T.Q5_K: _KQ_MIN,
         T.Q6_K: _KQ, T.IQ4_XS: _KQ, T.F16: _F16}
#: weight rows per parallel task
_ROWS_PER_TASK = 32

#: the packed form (module docstring): `kind`, block size `qk`, sub-block
#: size `sub` (32, Q6_K 16), `w` (rows, cols) int8 quants or F16 bits
#: (uint16), `sc` int32 (rows, cols / sub) sub-block scales (the 256-value
#: types, else a dummy), `d` and `m` float32 (rows, cols / qk) (m: Q4_1's
#: m, Q4_K / Q5_K's dmin, else a dummy), `mins` int32 (rows, cols / 32)
#: (Q4_K / Q5_K, else a dummy)
AmxPacked = namedtuple("AmxPacked", "kind qk sub w sc d m mins")


# ------------------------------------------------------------ unpacking
def _blocks(t, raw, rows: int, cols: int):
    fmt = block_format(t)
    return raw.reshape(rows * (cols // fmt.block_values), fmt.block_bytes), fmt


def _f16(b, fmt, name):
    o = fmt.offset(name)
    return np.ascontiguousarray(b[:, o:o + 2]).view(np.float16)[:, 0].astype(np.float32)


def _nibbles(qs):
    # (nb, 16 * c) bytes -> (nb, 32 * c): per 16 bytes the low nibbles, then
    # the high ones (the 32-value groups of Q4_0 / Q4_1 / IQ4_XS)
    nb = qs.shape[0]
    q = qs.reshape(nb, -1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 15).reshape(nb, -1)


def _k_scale_min(sc12):
    # ggml `get_scale_min_k4` for the 8 sub-blocks: (nb, 8) scales and mins
    s = sc12.astype(np.int32)
    lo_s, lo_m = s[:, 0:4] & 63, s[:, 4:8] & 63
    hi_s = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    hi_m = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return np.concatenate([lo_s, hi_s], 1), np.concatenate([lo_m, hi_m], 1)


def _k_quants(b, fmt, five: bool):
    # Q4_K / Q5_K values 0..15 (0..31) in order: 4 chunks of 64, per chunk
    # the low nibbles of 32 bytes, then their high nibbles (+ 16 * the bit
    # 2c / 2c + 1 of qh for Q5_K)
    nb = b.shape[0]
    o = fmt.offset("qs")
    qs = b[:, o:o + 128].astype(np.int32).reshape(nb, 4, 1, 32)
    q = (qs >> np.array([0, 4]).reshape(1, 1, 2, 1)) & 15
    if five:
        oh = fmt.offset("qh")
        qh = b[:, oh:oh + 32].astype(np.int32).reshape(nb, 1, 1, 32)
        bit = np.arange(8).reshape(1, 4, 2, 1)
        q = q + (((qh >> bit) & 1) << 4)
    return q.reshape(nb, 256)


def _q6_quants(b, fmt):
    # Q6_K values q - 32 in order (formats.kquants.dequant_q6_k's indexing)
    nb = b.shape[0]
    ql = b[:, fmt.offset("ql"):fmt.offset("ql") + 128].astype(np.int32).reshape(nb, 2, 1, 2, 32)
    qh = b[:, fmt.offset("qh"):fmt.offset("qh") + 64].astype(np.int32).reshape(nb, 2, 1, 1, 32)
    lo = (ql >> np.array([0, 4]).reshape(1, 1, 2, 1, 1)) & 15            # (nb, h, nibble, half, l)
    t = np.array([[0, 1], [2, 3]]).reshape(1, 1, 2, 2, 1)                   # t = 2 * nibble + half
    hi = (qh >> (2 * t)) & 3
    return ((lo | (hi << 4)) - 32).reshape(nb, 256)


def _iq4_xs(b, fmt):
    nb = b.shape[0]
    o = fmt.offset("qs")
    q = np.asarray(KVALUES_IQ4NL, np.int32)[_nibbles(b[:, o:o + 128])]
    sh = np.ascontiguousarray(b[:, fmt.offset("scales_h"):fmt.offset("scales_h") + 2]).view(np.uint16)
    sh = sh.astype(np.int32).reshape(nb, 1)
    ol = fmt.offset("scales_l")
    sl = b[:, ol:ol + 4].astype(np.int32)
    ib = np.arange(8)
    ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
    return q, ls - 32


def pack(t, raw, rows: int, cols: int) -> AmxPacked:
    """The AMX form (`AmxPacked`, module docstring) of a rows x cols matrix
    of type t (one of `AMX_TYPES`) from its GGUF bytes `raw` (uint8);
    what `ggml_backend_amx_convert_weight` repacks, as integers and
    float32. KeyError for another type."""
    t = T(t)
    kind = _KIND[t]
    raw = np.asarray(raw, np.uint8).reshape(-1)
    none_f, none_i = np.zeros((1, 1), np.float32), np.zeros((1, 1), np.int32)
    if kind == _F16:
        return AmxPacked(kind, 16, 16, np.ascontiguousarray(raw.view(np.uint16).reshape(rows, cols)),
                         none_i, none_f, none_f, none_i)
    b, fmt = _blocks(t, raw, rows, cols)
    qk = fmt.block_values
    nbr = cols // qk
    d = _f16(b, fmt, "d").reshape(rows, nbr)
    m, mins, sc, sub = none_f, none_i, none_i, 32
    if t == T.Q8_0:
        o = fmt.offset("qs")
        w = b[:, o:o + 32].view(np.int8)
    elif t in (T.Q4_0, T.Q4_1):
        o = fmt.offset("qs")
        q = _nibbles(b[:, o:o + 16])
        w = (q.astype(np.int16) - 8).astype(np.int8) if t == T.Q4_0 else q.astype(np.int8)
        if t == T.Q4_1:
            m = _f16(b, fmt, "m").reshape(rows, nbr)
    elif t in (T.Q4_K, T.Q5_K):
        o = fmt.offset("scales")
        sc, mn = _k_scale_min(b[:, o:o + 12])
        w = _k_quants(b, fmt, t == T.Q5_K).astype(np.int8)
        m = _f16(b, fmt, "dmin").reshape(rows, nbr)
        mins = np.ascontiguousarray(mn.reshape(rows, cols // 32), np.int32)
    elif t == T.Q6_K:
        o = fmt.offset("scales")
        sc = b[:, o:o + 16].view(np.int8).astype(np.int32)
        w, sub = _q6_quants(b, fmt).astype(np.int8), 16
    else:                                   # IQ4_XS
        w, sc = _iq4_xs(b, fmt)
        w = w.astype(np.int8)
    sc = np.ascontiguousarray(sc.reshape(rows, -1), np.int32) if qk == 256 else sc
    return AmxPacked(kind, qk, sub, np.ascontiguousarray(w.reshape(rows, cols)), sc, d, m, mins)


# --------------------------------------------------------------- kernels
@jit
def _block_int(qk, sub, wr, at, o, scr, so, sumi):
    # I_b of the block at o: q8_block_dot for 32 values; for 256, per 32
    # the exact lanes (`lanes`: lanes 0-3 the first 16 values, 4-7 the
    # last 16) times their sub-block scales, then the lanes' sum
    if qk == 32:
        return np.int64(q8_block_dot(wr, o, at, o))
    sumi[:] = 0
    for c in range(qk // 32):
        if sub == 16:
            lo, hi = scr[so + 2 * c], scr[so + 2 * c + 1]
        else:
            lo = hi = scr[so + c]
        lanes_scaled_add(sumi, wr, o + 32 * c, at, o + 32 * c, lo, hi)
    i = np.int64(0)
    for lane in range(8):
        i += sumi[lane]
    return i


@jit
def _rows_q(kind, qk, sub, w, sc, d, m, mins, xq, xd, xs, xb, out, r0, r1):
    # out[t, r] for r0 <= r < r1 (module docstring's table)
    nb = w.shape[1] // qk
    nsub = qk // sub
    sumi = np.zeros(8, np.int32)
    for r in range(r0, r1):
        wr = w[r]
        scr = sc[r] if qk == 256 else sc[0]
        for t in range(xq.shape[0]):
            at = xq[t]
            c = _F32(0.0)
            for b in range(nb):
                i = _block_int(qk, sub, wr, at, b * qk, scr, b * nsub, sumi)
                if kind == _LEGACY or kind == _LEGACY_MIN:
                    c = fma32(_F32(i), _F32(d[r, b] * xd[t, b]), c)
                    if kind == _LEGACY_MIN:
                        c = fma32(m[r, b], xs[t, b], c)
                else:
                    c = fma32(_F32(i), _F32(xd[t, b] * d[r, b]), c)
                    if kind == _KQ_MIN:
                        j = np.int32(0)
                        for s in range(8):
                            j += mins[r, b * 8 + s] * (xb[t, b * 16 + 2 * s] + xb[t, b * 16 + 2 * s + 1])
                        c = fma32(_F32(j), -_F32(xd[t, b] * m[r, b]), c)
            out[t, r] = c


@jit
def _rows_f16(w16, x, out, r0, r1):
    # `tinygemm_kernel_avx<float, ggml_fp16_t>`: 16 lanes of fma, then
    # `_mm512_reduce_add_ps`
    k_all = x.shape[1]
    wf = np.empty(k_all, np.float32)
    acc = np.empty(16, np.float32)
    for r in range(r0, r1):
        _widen_f16(w16[r], wf)
        for t in range(x.shape[0]):
            acc[:] = 0.0
            for k in range(0, k_all, 16):
                for lane in range(16):
                    acc[lane] = fma32(x[t, k + lane], wf[k + lane], acc[lane])
            out[t, r] = hsum16(acc)


@jit(parallel=True)
def _rows_q_parallel(kind, qk, sub, w, sc, d, m, mins, xq, xd, xs, xb, out, r0, r1):
    for c in prange((r1 - r0 + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        a = r0 + c * _ROWS_PER_TASK
        _rows_q(kind, qk, sub, w, sc, d, m, mins, xq, xd, xs, xb, out, a, min(r1, a + _ROWS_PER_TASK))


@jit(parallel=True)
def _rows_f16_parallel(w16, x, out, r0, r1):
    for c in prange((r1 - r0 + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        a = r0 + c * _ROWS_PER_TASK
        _rows_f16(w16, x, out, a, min(r1, a + _ROWS_PER_TASK))


def matmul(packed: AmxPacked, x: np.ndarray, isa, r0: int, r1: int, parallel: bool = False) -> np.ndarray:
    """float32 (n, r1 - r0): rows r0..r1-1 of the AMX-packed matrix `packed`
    (`pack`) times the activations x (float32 (n, cols)), as
    `ggml_backend_amx_mul_mat` computes them (module docstring); the
    activations quantized with the quantizer of the instruction-set chain
    `isa` (its `quantize_rows_q8`; Q8_K: `quantize_row_q8_K_ref`)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty((x.shape[0], packed.w.shape[0]), np.float32)
    if packed.kind == _F16:
        (_rows_f16_parallel if parallel else _rows_f16)(packed.w, x, out, r0, r1)
        return np.ascontiguousarray(out[:, r0:r1])
    xs = xb = np.zeros((1, 1), np.int32)
    if packed.kind == _LEGACY:
        xq, xd = q8_0_fields(x, isa=isa)
        xs = np.zeros((1, 1), np.float32)
    elif packed.kind == _LEGACY_MIN:
        xq, xd, xs = q8_1_fields(x, isa=isa)
    else:
        xq, xd, xb = q8_k_fields(x, isa=isa)
        xs = np.zeros((1, 1), np.float32)
    (_rows_q_parallel if parallel else _rows_q)(packed.kind, packed.qk, packed.sub, packed.w, packed.sc,
                                                packed.d, packed.m, packed.mins, xq, xd, xs, xb, out, r0, r1)
    return np.ascontiguousarray(out[:, r0:r1])
