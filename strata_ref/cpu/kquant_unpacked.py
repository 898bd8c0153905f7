"""Mat-mul of Q2_K and Q3_K weights (Q8_K activations) in each CPU build's
float order, on their quants unpacked once (llama.cpp vendored by
llama-cpp-python 0.3.36, ggml-cpu):

* "x86", the AVX2 `ggml_vec_dot_q3_K_q8_K` / `ggml_vec_dot_q2_K_q8_K`
  (`arch/x86/quants.c`): 8 int32 lanes per super-block, acc = fma(d_a * d,
  float(lanes), acc), `hsum_float_8` (Q2_K: the mins first, acc =
  fma(-d_a * dmin, float(min lanes), acc)).
* "tiled", ggml's tiled K-quant mat-mul (`tiled/tiled-kernel.cpp`, 8 or
  more activation rows): per super-block the exact integer sums, r =
  float(s) * d (Q2_K: fma(-dmin, float(sum min * bsum), r)), out = fma(r,
  d_a, out).
* "q2_K_8x8", ggml's CPU_REPACK `q2_K_8x8` gemv / gemm (x86, AVX-512):
  exact I = sum scale * dot and M = sum min * bsum, acc = fma(float(I), d *
  d_a, acc), accm = fma(float(M), dmin * d_a, accm) per super-block (gemv)
  or per half of it (gemm); acc - accm. The gemm takes the activation rows
  in whole groups of 4, quantized by `ggml_quantize_mat_q8_K_4x8`.
* "avx", the AVX (no AVX2) branch of the same functions (v0.4.0's
  sandybridge, ivybridge, piledriver): the same float steps (unfused on a
  build without FMA), other lanes: the 128-bit halves put 16-value groups
  0-3 of each 128 values in lanes 0-3 and groups 4-7 in lanes 4-7, lane l
  summing values 4l..4l+3 of each group.
* "generic", `ggml_vec_dot_q{2,3}_K_q8_K_generic` (quants.c, no FMA).
* "neon", the arm64 `ggml_vec_dot_q{2,3}_K_q8_K` (`arch/arm/quants.c`,
  every NEON build: the lanes are reduced as integers, so dotprod changes
  nothing): per super-block the exact I = sum scale * dot (and Q2_K's M =
  sum min * bsum), then as GCC 12 contracted the C (disassembly, docs/arm64.md):
  Q2_K `sum = fma(float(M), -(d_a * dmin), sum)`, `sum = fma(float(I), d *
  d_a, sum)`; Q3_K `sum = fma(float(I), d * d_a, sum)`.

The quants are widened to one int8 each (Q2_K unsigned 0..3, Q3_K signed
-4..3) with the sub-block scales (and Q2_K mins) as int32, once per matrix
(`pack`).
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit, prange

from ._digest import jit
from ..numerics import F16_TO_F32
from ..types import GGMLType, block_format
from . import act_quant
from .fp import fma32, hsum8
from .lanes import fma8_into, lanes8_scaled_add, lanes_scaled_add
from .traits import Family

__all__ = ["FAMILY", "Q23Packed"]

#: weight rows per task of the parallel kernels
_ROWS_PER_TASK = 64


def _field(raw3, t, name, dtype):
    """Field `name` of every block as a contiguous array (rows, nb, bytes),
    viewed as the field's dtype and cast to `dtype` when given."""
    f = block_format(t).field(name)
    b = np.ascontiguousarray(raw3[:, :, f.offset:f.offset + f.nbytes])
    return b.view(f.dtype).astype(dtype) if dtype is not None else b


def _f16(raw3, t, name):
    """A one-element fp16 field as float32 (rows, nb)."""
    return F16_TO_F32[_field(raw3, t, name, None).view(np.uint16)[..., 0]]



@njit(inline="always", cache=True)
def _row_neon(mode, w, x, sc, mn, d, dmin, xd, xb, sumi):
    # the arm64 NEON `ggml_vec_dot_q{2,3}_K_q8_K` (module docstring): the
    # exact integers of each super-block, then one or two scalar FMAs
    out = np.float32(0.0)
    for b in range(d.shape[0]):
        for L in range(8):
            sumi[L] = 0
        totm = 0
        for c in range(8):
            o = b * 256 + c * 32
            lanes_scaled_add(sumi, w, o, x, o, sc[b, 2 * c], sc[b, 2 * c + 1])
            if mode != _Q3_K:
                totm += mn[b, 2 * c] * xb[b * 16 + 2 * c] + mn[b, 2 * c + 1] * xb[b * 16 + 2 * c + 1]
        tot = 0
        for L in range(8):
            tot += sumi[L]
        if mode != _Q3_K:
            out = fma32(np.float32(totm), -np.float32(xd[b] * dmin[b]), out)
        out = fma32(np.float32(tot), np.float32(d[b] * xd[b]), out)
    return out


@njit(inline="always", cache=True)
def _chunk_lanes(sumi, w, o, x, c, s_lo, s_hi, avx, tmp):
    # the scaled int32 lanes of 32-value chunk c (of its super-block) at o,
    # added to sumi. AVX2: lanes 0-3 from its first 16 values, 4-7 from the
    # second (`lanes_scaled_add`). The AVX branch (no AVX2) forms each 128
    # values' lanes on 128-bit halves: lane l < 4 sums values 16k + 4l ..
    # 16k + 4l + 3 of its 16-value groups k < 4, lane 4 + l those of k >= 4,
    # so chunks 0-1 of each 128 go to lanes 0-3, chunks 2-3 to lanes 4-7
    if not avx:
        lanes_scaled_add(sumi, w, o, x, o, s_lo, s_hi)
        return
    for L in range(8):
        tmp[L] = 0
    lanes_scaled_add(tmp, w, o, x, o, s_lo, s_hi)
    base = 0 if c % 4 < 2 else 4
    for L in range(4):
        sumi[base + L] += tmp[L] + tmp[4 + L]


@njit(inline="always", cache=True)
def _acc8(acc, lf, s, fma):
    # acc + s * lane: `_mm256_fmadd_ps`, or the AVX branch's mul + add
    # (contracted by GCC on an FMA build; two roundings without FMA)
    if fma:
        fma8_into(acc, lf, 0, s)
    else:
        for L in range(8):
            acc[L] = np.float32(acc[L] + np.float32(s * lf[L]))


@njit(inline="always", cache=True)
def _row_q3_k(w, x, sc, d, xd, tiled, avx, fma, sumi, lf, acc, tmp):
    # Q3_K (w the signed quants -4..3, sc the scales minus 32). tiled False:
    # AVX2 `ggml_vec_dot_q3_K_q8_K`: 8 int32 lanes per super-block; lane L =
    # sum over the 8 chunks c of 32 values of scale[2c + L // 4] times the
    # dot of values 4L..4L+3 of chunk c; acc[L] = fma(d_a * d, float(lane),
    # acc[L]); `hsum_float_8`. tiled True: ggml's tiled K-quant mat-mul
    # (`tiled/tiled-kernel.cpp`, 8 or more activation rows): per super-block
    # the exact integer s (the sum of the lanes), r = float(s) * d, then out
    # = fma(r, d_a, out). avx: the AVX branch's lanes (`_chunk_lanes`);
    # fma False: its unfused steps.
    for L in range(8):
        acc[L] = 0.0
    out = np.float32(0.0)
    for b in range(d.shape[0]):
        for L in range(8):
            sumi[L] = 0
        for c in range(8):
            o = b * 256 + c * 32
            _chunk_lanes(sumi, w, o, x, c, sc[b, 2 * c], sc[b, 2 * c + 1], avx, tmp)
        tot = 0
        for L in range(8):
            lf[L] = np.float32(sumi[L])
            tot += sumi[L]
        if tiled:
            out = fma32(np.float32(np.float32(tot) * d[b]), xd[b], out)
        else:
            _acc8(acc, lf, np.float32(xd[b] * d[b]), fma)
    return out if tiled else hsum8(acc)


@njit(inline="always", cache=True)
def _row_q2_k(w, x, sc, mn, d, dmin, xd, xb, path, avx, fma, sumi, lf, acc, tmp):
    # Q2_K (unsigned quants 0..3, 16 sub-blocks of 16 with a 4-bit scale and
    # min each), bsums xb per 16. path 0: AVX2 `ggml_vec_dot_q2_K_q8_K`: per
    # super-block acc = fma(-d_a * dmin, float(min lanes), acc), lane L =
    # min[2L] bsum[2L] + min[2L+1] bsum[2L+1], then acc = fma(d_a * d,
    # float(lanes as Q6_K's), acc); hsum_float_8. path 1: the tiled kernel
    # (as for Q4_K). paths 2 / 3: ggml's CPU_REPACK `q2_K_8x8` gemv / gemm
    # (x86, AVX-512): exact I = sum scale * dot and M = sum min * bsum,
    # acc = fma(float(I), d * d_a, acc), accm = fma(float(M), dmin * d_a,
    # accm) per super-block (gemv) or per half of it (gemm); acc - accm.
    # avx, fma: path 0 as the AVX branch computes it (`_row_q3_k`).
    for L in range(8):
        acc[L] = 0.0
    out = np.float32(0.0)
    accm = np.float32(0.0)
    for b in range(d.shape[0]):
        if path == 0:
            for L in range(8):
                lf[L] = np.float32(mn[b, 2 * L] * xb[b * 16 + 2 * L] + mn[b, 2 * L + 1] * xb[b * 16 + 2 * L + 1])
            _acc8(acc, lf, np.float32(-xd[b] * dmin[b]), fma)
        step = 4 if path == 3 else 8
        for c0 in range(0, 8, step):
            for L in range(8):
                sumi[L] = 0
            totm = 0
            for c in range(c0, c0 + step):
                o = b * 256 + c * 32
                _chunk_lanes(sumi, w, o, x, c, sc[b, 2 * c], sc[b, 2 * c + 1], avx, tmp)
                totm += mn[b, 2 * c] * xb[b * 16 + 2 * c] + mn[b, 2 * c + 1] * xb[b * 16 + 2 * c + 1]
            tot = 0
            for L in range(8):
                tot += sumi[L]
            if path == 0:
                for L in range(8):
                    lf[L] = np.float32(sumi[L])
                _acc8(acc, lf, np.float32(xd[b] * d[b]), fma)
            elif path == 1:
                r = fma32(-dmin[b], np.float32(totm), np.float32(np.float32(tot) * d[b]))
                out = fma32(r, xd[b], out)
            else:
                out = fma32(np.float32(tot), np.float32(d[b] * xd[b]), out)
                accm = fma32(np.float32(totm), np.float32(dmin[b] * xd[b]), accm)
    if path == 0:
        return hsum8(acc)
    if path == 1:
        return out
    return np.float32(out - accm)


@njit(inline="always", cache=True)
def _row_kq_generic(mode, w, x, sc, mn, d, dmin, xd, xb, sumi, sums):
    # ggml's generic `ggml_vec_dot_q{2,3}_K_q8_K_generic` (quants.c; the
    # baseline build, no FMA). Q3_K: per super-block 8 int32 lanes
    # (`lanes8_scaled_add`: lane l sums positions l mod 8 with their
    # sub-block scale), sums[l] += (d_w * d_a) * lane[l]; at the end sumf +=
    # sums[0], ..., sums[7] in order. Q2_K: one exact isum (scale * dot) and
    # summs (min * bsum) per super-block, sumf += (d_a d_w) isum - (d_a
    # dmin) summs. (Q4_K, Q5_K, Q6_K: `kquant_dots`.)
    for L in range(8):
        sums[L] = 0.0
    sumf = np.float32(0.0)
    for b in range(d.shape[0]):
        if mode == _Q2_K or mode == _Q2_K_8X8:
            isum = 0
            summs = 0
            for c in range(8):
                o = b * 256 + c * 32
                for L in range(8):
                    sumi[L] = 0
                lanes8_scaled_add(sumi, w, o, x, o, sc[b, 2 * c], sc[b, 2 * c + 1])
                for L in range(8):
                    isum += sumi[L]
            for j in range(16):
                summs += xb[b * 16 + j] * mn[b, j]
            dall = np.float32(xd[b] * d[b])
            dm = np.float32(xd[b] * dmin[b])
            sumf = np.float32(sumf + np.float32(np.float32(dall * np.float32(isum)) -
                                                np.float32(dm * np.float32(summs))))
            continue
        for L in range(8):
            sumi[L] = 0
        for c in range(8):
            o = b * 256 + c * 32
            lanes8_scaled_add(sumi, w, o, x, o, sc[b, 2 * c], sc[b, 2 * c + 1])
        dd = np.float32(d[b] * xd[b])
        for L in range(8):
            sums[L] = np.float32(sums[L] + np.float32(dd * np.float32(sumi[L])))
    if mode == _Q2_K or mode == _Q2_K_8X8:
        return sumf
    for L in range(8):
        sumf = np.float32(sumf + sums[L])
    return sumf


@njit(inline="always", cache=True)
def _rows_kquant(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, neon, avx, fma, n_gemm, out, r0, r1,
                 sumi, lf, acc, tmp):
    # n_gemm: the leading activation rows the repacked layouts take through
    # their gemm (whole groups of 4 for a mul_mat, none for a MUL_MAT_ID,
    # whose repacked path runs the gemv for every routed row)
    n = xq.shape[0]
    tiled = tiled_ok and n >= 8
    for r in range(r0, r1):
        for t in range(n):
            if neon:
                out[t, r] = _row_neon(mode, wq[r], xq[t], sc[r], mn[r], d[r], dmin[r], xd[t], xb[t], sumi)
            elif gen:
                out[t, r] = _row_kq_generic(mode, wq[r], xq[t], sc[r], mn[r], d[r], dmin[r], xd[t], xb[t],
                                            sumi, lf)
            elif mode == _Q3_K:
                out[t, r] = _row_q3_k(wq[r], xq[t], sc[r], d[r], xd[t], tiled, avx, fma, sumi, lf, acc, tmp)
            else:
                # Q2_K: repacked gemm for whole groups of 4 rows, else gemv;
                # not repacked: tiled from 8 rows, else vec_dot
                path = (3 if t < n_gemm else 2) if mode == _Q2_K_8X8 else (1 if tiled else 0)
                out[t, r] = _row_q2_k(wq[r], xq[t], sc[r], mn[r], d[r], dmin[r], xd[t], xb[t],
                                      path, avx, fma, sumi, lf, acc, tmp)


#: `_mm_kquant` modes
_Q3_K, _Q2_K, _Q2_K_8X8 = 0, 1, 2


@jit(parallel=True)
def _mm_kquant(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, neon, avx, fma, n_gemm, out):
    """Q3_K and Q2_K weight rows times Q8_K activation rows in ggml-cpu's
    order: mode `_Q3_K` (`_row_q3_k`), `_Q2_K` / `_Q2_K_8X8` (`_row_q2_k`).
    wq: the quants (rows, cols) int8 (Q3_K signed, Q2_K unsigned); sc (and
    mn for Q2_K): the integer sub-block scales, int32 (rows, super-blocks,
    16); d (dmin) float32 per super-block; xq the Q8_K quants int8, xd their
    scales, xb the bsums int32 per 16 values.
    tiled_ok: the build has ggml's tiled mat-mul (taken from 8 rows on);
    gen: the generic C dots (`_row_kq_generic`); neon: the arm64 NEON
    ones (`_row_neon`); avx: the x86 AVX (no AVX2) lanes; fma: the build
    fuses `acc + d * lane`; n_gemm: activation rows
    taken by the repacked gemm (`_rows_kquant`)."""
    R = wq.shape[0]
    for c in prange((R + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        _rows_kquant(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, neon, avx, fma, n_gemm, out,
                     c * _ROWS_PER_TASK, min(R, (c + 1) * _ROWS_PER_TASK), np.empty(8, np.int32),
                     np.empty(8, np.float32), np.empty(8, np.float32), np.empty(8, np.int32))


@jit
def _mm_kquant_serial(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, neon, avx, fma, n_gemm, out):
    _rows_kquant(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, neon, avx, fma, n_gemm, out, 0,
                 wq.shape[0], np.empty(8, np.int32),
                 np.empty(8, np.float32), np.empty(8, np.float32), np.empty(8, np.int32))



def _q3_k_values(hmask: np.ndarray, qs: np.ndarray, s12: np.ndarray):
    """Q3_K fields -> (values int8 (rows, nb, 256) in -4..3, scales int32
    (rows, nb, 16) in -32..31), ggml `dequantize_row_q3_K`: value 128h + 32k
    + l (h < 2, k < 4, l < 32) = bits 2k..2k+1 of qs[32h + l], minus 4 when
    bit 4h + k of hmask[l] is clear; scale j: low 4 bits from byte j % 8
    (low nibble for j < 8, high nibble after), high 2 bits from byte 8 + j %
    4 at bit 2 * (j // 4), minus 32."""
    r, nb, _ = qs.shape
    q = qs.reshape(r, nb, 2, 1, 32)
    h = hmask.reshape(r, nb, 1, 1, 32)
    k = np.arange(4, dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    half = np.arange(2, dtype=np.uint8).reshape(1, 1, 2, 1, 1)
    low = (q >> (2 * k)) & 3
    high = (h >> (4 * half + k)) & 1
    values = (low.astype(np.int16) - 4 * (1 - high.astype(np.int16))).reshape(r, nb, 256)
    s = s12.astype(np.int32)
    j = np.arange(16)
    lo = np.where(j < 8, s[..., j % 8] & 15, s[..., j % 8] >> 4)
    hi = (s[..., 8 + j % 4] >> (2 * (j // 4))) & 3
    return values.astype(np.int8), (lo | (hi << 4)) - 32



#: the packed form: quants int8 (rows, cols), scales and mins int32 (rows,
#: super-blocks, 16), d and dmin float32 (rows, super-blocks)
Q23Packed = namedtuple("Q23Packed", "wq sc mn d dmin")

#: `_mm_kquant`'s mode of each (type, variant)
_MODES = {(GGMLType.Q3_K, v): _Q3_K for v in ("generic", "x86", "avx", "tiled", "neon")}
_MODES.update({(GGMLType.Q2_K, v): _Q2_K for v in ("generic", "x86", "avx", "tiled", "neon")})
_MODES[(GGMLType.Q2_K, "q2_K_8x8")] = _Q2_K_8X8


def _pack(t, raw, rows: int) -> Q23Packed:
    raw3 = np.asarray(raw, np.uint8).reshape(rows, -1, block_format(t).block_bytes)
    c32 = np.ascontiguousarray
    if t == GGMLType.Q2_K:
        qs = _field(raw3, t, "qs", None)
        r, nb, _ = qs.shape
        shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)
        wq = ((qs.reshape(r, nb, 2, 1, 32) >> shifts) & 3).reshape(r, nb, 256)
        s16 = _field(raw3, t, "scales", None).astype(np.int32)
        return Q23Packed(c32(wq.reshape(rows, -1), np.int8), c32(s16 & 15), c32(s16 >> 4),
                         c32(_f16(raw3, t, "d")), c32(_f16(raw3, t, "dmin")))
    wq, sc = _q3_k_values(_field(raw3, t, "hmask", None), _field(raw3, t, "qs", None),
                          _field(raw3, t, "scales", None))
    d = c32(_f16(raw3, t, "d"))
    return Q23Packed(c32(wq.reshape(rows, -1), np.int8), c32(sc, np.int32), c32(sc, np.int32), d, d)


class _Q23Family(Family):
    """Q2_K and Q3_K (module docstring)."""

    def pack(self, qm):
        return _pack(qm.type, qm.raw, qm.rows)

    def matmul(self, qm, packed, x, segments, parallel, mmid):
        n = x.shape[0]

        def part(r0, r1, path, variant):
            if (qm.type, variant) not in _MODES:
                raise NotImplementedError(f"{qm.type.name}: ggml's {variant} kernel is not emulated yet")
            mode = _MODES[(qm.type, variant)]
            n_gemm = n - n % 4 if mode == _Q2_K_8X8 and not mmid else 0
            xq, xd, bsums = act_quant.q8_k_fields(x, mat_rows=n_gemm, isa=qm.profile.isa)
            y = np.empty((n, r1 - r0), np.float32)
            p = packed
            (_mm_kquant if parallel else _mm_kquant_serial)(
                mode, p.wq[r0:r1], p.sc[r0:r1], p.mn[r0:r1], p.d[r0:r1], p.dmin[r0:r1], xq, xd,
                bsums.astype(np.int32), variant == "tiled", variant == "generic", variant == "neon",
                variant == "avx", bool(qm.profile.isa.resolve("FMA")), n_gemm, y)
            return y
        return self.by_segment(qm, segments, part)


FAMILY = _Q23Family()
