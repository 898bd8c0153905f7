"""The K-quant mat-mul of several activation rows, eight weight rows at a
time: the same results, bit for bit, as `kquant_dots`' row kernels for
ggml's repacked (`q4_K_8x8`) and tiled paths, computed as a panel.

ggml's gemm kernels for these paths (`arch/x86/repack.cpp`
`ggml_gemm_q4_K_8x8_q8_K`, `tiled/`) keep a tile of weight rows by
activation rows in registers. Their float steps are per output value and
per super-block; everything below them is exact integer arithmetic
(`kquant_dots` module docstring, REPACK and TILED), so any instructions
that produce the same integers give the same bits. Here:

* Eight weight rows are unpacked once into a panel: their values (one byte
  each, unsigned: Q4_K 0..15, Q5_K 0..31, Q6_K 0..63) interleaved by 4
  bytes, so that one 32-byte load holds 4 consecutive values of each of
  the 8 rows; beside it their scales and mins (int32, 8 rows side by
  side) and `d` / `dmin` (float32, 8 rows side by side).
* Against 4 activation bytes broadcast, one `maddubs` (unsigned weight
  bytes by signed activation bytes; with VNNI one `vpdpbusd`) gives the
  dot of those 4 values for each row; 8 of them a 32-value chunk's
  (`_chunk_intrinsic`: on AVX2 their int16 pair sums are added within
  their bound, then one `madd` multiplies by the rows' scales).
* The scales, mins and float steps then run on 8 rows at once, a row per
  lane, with the operations `kquant_dots.fstep` does for one row (a lane
  computes exactly what the scalar code computes), so no horizontal sum
  is needed until the output is written.

Two activation rows share each panel load. The rows left over (fewer than
8) take `kquant_dots`' row kernel.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ..types import GGMLType, block_format
from .simd import (HOST_AVX2, HOST_VNNI, I32x8, _BYTES, _I32, _V8I32, _V16I16, _V32I8, _byte_ptr, _check_array,
                   _fn, _lanes_ir, _splat, f8_fma, f8_lane, f8_load, f8_mul, f8_splat, f8_sub, f8_zero, f16_at,
                   i8_at, i32_add, i32_lane, i32_load, i32_mul, i32_splat, i32_sub, i32_to_f8, i32_zero)

__all__ = ["make_panel", "REPACK", "TILED"]

_F32 = np.float32
#: whose float steps a panel takes (`make_panel`)
REPACK, TILED = 0, 1


def make_panel(t: GGMLType, kind: int, unpack, scales8, mins, q6_scales: int):
    """The numba function panel(w, r0, r1, rb, x, xd, xb, nbs, n_gemm, out)
    -> r for K-quant type t, which computes out[:, r0:r] for the largest r
    <= r1 with r - r0 a multiple of 8 and returns r (the caller does the
    rest). w: the tensor's bytes, uint8, row after row of rb bytes; x: the
    Q8_K quants, int8 (n * cols,); xd: their scales, float32 (n, cols/256);
    xb: the bsums, int32, nbs per activation row (per 32 values, Q6_K per
    16); out: float32 (n, rows). kind: whose float steps (`REPACK`:
    ggml's `q4_K_8x8`, activation rows below n_gemm as its gemm, the
    others as its gemv; `TILED`: its tiled mat-mul). unpack(w, o, dst, do), scales8(w, o), mins(w, o):
    `kquant_dots`' intrinsics of t (Q6_K: its `_q6_unpack`, and q6_scales
    the byte offset of its scales)."""
    BB = block_format(t).block_bytes
    Q6 = t == GGMLType.Q6_K
    D = _off(t, "d")
    DMIN = 0 if Q6 else _off(t, "dmin")
    NS = 16 if Q6 else 8
    KIND = kind
    SC = q6_scales

    @njit(inline="always")
    def fill(w, r, rb, nb, scr, pan, psc, pmn, pd, pdm):
        # rows r .. r+7 into the panel (module docstring)
        for k in range(8):
            ow = (r + k) * rb
            for b in range(nb):
                o = ow + b * BB
                unpack(w, o, scr, (k * nb + b) * 256)
                pd[b * 8 + k] = f16_at(w, o + D)
                if Q6:
                    for i in range(16):
                        psc[(b * 16 + i) * 8 + k] = i8_at(w, o + SC + i)
                else:
                    pdm[b * 8 + k] = f16_at(w, o + DMIN)
                    sc = scales8(w, o)
                    mn = mins(w, o)
                    for j in range(8):
                        psc[(b * 8 + j) * 8 + k] = i32_lane(sc, j)
                        pmn[(b * 8 + j) * 8 + k] = i32_lane(mn, j)
        for i in range(8 * nb):
            _transpose8(scr, 32 * i, 256 * nb, pan, 256 * i)

    chunk = _chunk_intrinsic(_INT16_GROUPS[t])

    @njit(inline="always")
    def ints(pan, psc, x, xo, xb, bo, b):
        # the four pair sums of a super-block for one activation row: pair k
        # = chunks 2k, 2k+1, each times its scale (Q6_K: minus 32 times the
        # scale times the bsum of 16, the unsigned values' offset)
        p0, p1, p2, p3 = i32_zero(), i32_zero(), i32_zero(), i32_zero()
        for j in range(8):
            if Q6:
                s_lo = i32_load(psc, (b * 16 + 2 * j) * 8)
                s_hi = i32_load(psc, (b * 16 + 2 * j + 1) * 8)
                s = chunk(pan, (b * 8 + j) * 256, x, xo + 32 * j, s_lo, s_hi)
                off = i32_add(i32_mul(s_lo, i32_splat(xb[bo + 2 * j])), i32_mul(s_hi, i32_splat(xb[bo + 2 * j + 1])))
                s = i32_sub(s, i32_mul(i32_splat(32), off))
            else:
                sc = i32_load(psc, (b * 8 + j) * 8)
                s = chunk(pan, (b * 8 + j) * 256, x, xo + 32 * j, sc, sc)
            k = j // 2
            if k == 0:
                p0 = i32_add(p0, s)
            elif k == 1:
                p1 = i32_add(p1, s)
            elif k == 2:
                p2 = i32_add(p2, s)
            else:
                p3 = i32_add(p3, s)
        return p0, p1, p2, p3

    @njit(inline="always")
    def min_pair(pmn, b, k, xb, bo):
        return i32_add(i32_mul(i32_load(pmn, (b * 8 + 2 * k) * 8), i32_splat(xb[bo + 2 * k])),
                       i32_mul(i32_load(pmn, (b * 8 + 2 * k + 1) * 8), i32_splat(xb[bo + 2 * k + 1])))

    @njit(inline="always")
    def fsteps(acc, accm, p0, p1, p2, p3, pmn, xb, bo, b, dv, dmv, da, gemm):
        # `kquant_dots.fstep` of REPACK / TILED, a weight row per lane
        li = i32_add(i32_add(p0, p1), i32_add(p2, p3))
        if Q6:
            return f8_fma(f8_mul(i32_to_f8(li), dv), f8_splat(da), acc), accm
        m0 = min_pair(pmn, b, 0, xb, bo)
        m1 = min_pair(pmn, b, 1, xb, bo)
        m2 = min_pair(pmn, b, 2, xb, bo)
        m3 = min_pair(pmn, b, 3, xb, bo)
        if KIND == REPACK:
            ds = f8_mul(dv, f8_splat(da))
            dm = f8_mul(dmv, f8_splat(da))
            if gemm:
                acc = f8_fma(i32_to_f8(p0), ds, acc)
                accm = f8_fma(i32_to_f8(m0), dm, accm)
                acc = f8_fma(i32_to_f8(p1), ds, acc)
                accm = f8_fma(i32_to_f8(m1), dm, accm)
                acc = f8_fma(i32_to_f8(p2), ds, acc)
                accm = f8_fma(i32_to_f8(m2), dm, accm)
                acc = f8_fma(i32_to_f8(p3), ds, acc)
                accm = f8_fma(i32_to_f8(m3), dm, accm)
            else:
                acc = f8_fma(i32_to_f8(li), ds, acc)
                accm = f8_fma(i32_to_f8(i32_add(i32_add(m0, m1), i32_add(m2, m3))), dm, accm)
            return acc, accm
        # -dmin exactly (a product with -1 keeps a zero's sign flipped)
        r = f8_fma(f8_mul(dmv, f8_splat(_F32(-1.0))), i32_to_f8(i32_add(i32_add(m0, m1), i32_add(m2, m3))),
                   f8_mul(i32_to_f8(li), dv))
        return f8_fma(r, f8_splat(da), acc), accm

    @njit(inline="always")
    def panel(w, r0, r1, rb, x, xd, xb, nbs, n_gemm, out):
        n, nb = xd.shape
        if r1 - r0 < 8:
            return r0
        cols = 256 * nb
        scr = np.empty(8 * 256 * nb, np.uint8)
        pan = np.empty(8 * 256 * nb, np.uint8)
        psc = np.empty(NS * 8 * nb, np.int32)
        pmn = np.empty(8 * 8 * nb, np.int32)
        pd = np.empty(8 * nb, np.float32)
        pdm = np.empty(8 * nb, np.float32)
        SB = 16 if Q6 else 8
        r = r0
        while r + 8 <= r1:
            fill(w, r, rb, nb, scr, pan, psc, pmn, pd, pdm)
            t = 0
            while t < n:
                two = t + 1 < n                     # else an odd last row, alone
                tb = t + 1 if two else t
                acc_a, accm_a, acc_b, accm_b = f8_zero(), f8_zero(), f8_zero(), f8_zero()
                for b in range(nb):
                    ba, bb = t * nbs + SB * b, tb * nbs + SB * b
                    dv = f8_load(pd, 8 * b)
                    dmv = f8_load(pdm, 8 * b)
                    a0, a1, a2, a3 = ints(pan, psc, x, t * cols + 256 * b, xb, ba, b)
                    acc_a, accm_a = fsteps(acc_a, accm_a, a0, a1, a2, a3, pmn, xb, ba, b, dv, dmv, xd[t, b],
                                           t < n_gemm)
                    if two:
                        b0, b1, b2, b3 = ints(pan, psc, x, tb * cols + 256 * b, xb, bb, b)
                        acc_b, accm_b = fsteps(acc_b, accm_b, b0, b1, b2, b3, pmn, xb, bb, b, dv, dmv, xd[tb, b],
                                               tb < n_gemm)
                if KIND == REPACK:
                    acc_a = f8_sub(acc_a, accm_a)
                    acc_b = f8_sub(acc_b, accm_b)
                for k in range(8):
                    out[t, r + k] = f8_lane(acc_a, k)
                    if two:
                        out[tb, r + k] = f8_lane(acc_b, k)
                t += 2
            r += 8
        return r

    return panel


def _off(t, name):
    return block_format(t).field(name).offset


#: how many 4-value groups' `maddubs` pair sums may be added in int16 before
#: the scale's `madd` without overflow: a pair sum is at most 2 * vmax *
#: 128 (Q8_K's quants lie in -127 .. 127; 128 leaves a margin), vmax 15 / 31 / 63
_INT16_GROUPS = {GGMLType.Q4_K: 8, GGMLType.Q5_K: 4, GGMLType.Q6_K: 2}
for _t, _g in _INT16_GROUPS.items():
    assert _g * 2 * (2 ** {GGMLType.Q4_K: 4, GGMLType.Q5_K: 5, GGMLType.Q6_K: 6}[_t] - 1) * 128 <= 32767


def _chunk_intrinsic(G: int):
    """chunk(pan, base, x, xo, s_lo, s_hi) -> I32x8: for the 8 weight rows
    of the panel (a row per lane), s_lo * (the exact dot of the chunk's
    values 0-15 with x[xo:xo + 16]) + s_hi * (values 16-31 with the next
    16); the chunk's 8 groups of 4 values (8 rows each, 32 bytes) at bytes
    base, base + 32, ... of pan; s_lo / s_hi the rows' scales (|s| < 2^15).
    Exact integers whatever the instructions: with VNNI a `vpdpbusd` per
    group and the scales multiplied; with AVX2 ggml's `maddubs` per group,
    G groups added in int16 (`_INT16_GROUPS`: no overflow), then one
    `madd` by the scales (each lane's two int16 halves the row's scale);
    elsewhere plain vector arithmetic."""
    @intrinsic
    def chunk(typingctx, pan, base, x, xo, s_lo, s_hi):
        _check_array("pan", pan, _BYTES)
        _check_array("x", x, _BYTES)

        def codegen(context, builder, sig, args):
            pan_, base_, x_, xo_, slo, shi = args
            ws, xs = [], []
            for q in range(8):
                off = builder.add(base_, ir.Constant(base_.type, 32 * q))
                ws.append(builder.load(_byte_ptr(context, builder, sig.args[0], pan_, off, _V32I8), align=1))
                xoff = builder.add(xo_, ir.Constant(xo_.type, 4 * q))
                w4 = builder.load(_byte_ptr(context, builder, sig.args[2], x_, xoff, _I32), align=1)
                xs.append(builder.bitcast(_splat(builder, w4, _V8I32), _V32I8))
            scales = (slo, shi)
            if HOST_VNNI:
                fn = _fn(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [_V8I32, _V8I32, _V8I32])
                out = None
                for h in range(2):
                    acc = ir.Constant(_V8I32, [0] * 8)
                    for q in range(4 * h, 4 * h + 4):
                        acc = builder.call(fn, [acc, builder.bitcast(ws[q], _V8I32), builder.bitcast(xs[q], _V8I32)])
                    m = builder.mul(acc, scales[h])
                    out = m if out is None else builder.add(out, m)
                return out
            if HOST_AVX2:
                maddubs = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
                maddwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
                low = ir.Constant(_V8I32, [0xFFFF] * 8)
                s16 = [builder.bitcast(builder.or_(builder.and_(s, low), builder.shl(s, ir.Constant(_V8I32, [16] * 8))),
                                       _V16I16) for s in scales]
                out = None
                for g0 in range(0, 8, G):
                    p = None
                    for q in range(g0, g0 + G):
                        m = builder.call(maddubs, [ws[q], xs[q]])
                        p = m if p is None else builder.add(p, m)
                    m = builder.call(maddwd, [p, s16[g0 // 4]])
                    out = m if out is None else builder.add(out, m)
                return out
            out = None
            for q in range(8):
                m = builder.mul(_lanes_ir(builder, ws[q], xs[q], True), scales[q // 4])
                out = m if out is None else builder.add(out, m)
            return out
        return I32x8(pan, types.intp, x, types.intp, I32x8, I32x8), codegen
    return chunk


_UNPACK_LO, _UNPACK_HI = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
_PAIRS_LO, _PAIRS_HI = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
_HALVES_LO, _HALVES_HI = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]


@intrinsic
def _transpose8(typingctx, src, soff, stride, dst, doff):
    """The 8 x 8 transpose of 32-bit words: row k = the 32 bytes at byte
    soff + k * stride of src; dst[doff + 32 q + 4 k:][:4] = word q of row
    k (the panel's interleave: 4 values of each of 8 rows per 32 bytes).
    Three rounds of two-source shuffles (unpack, pairs, halves)."""
    _check_array("src", src, _BYTES)
    _check_array("dst", dst, _BYTES)

    def codegen(context, builder, sig, args):
        src_, soff_, stride_, dst_, doff_ = args
        rows = []
        for k in range(8):
            off = builder.add(soff_, builder.mul(stride_, ir.Constant(stride_.type, k)))
            rows.append(builder.load(_byte_ptr(context, builder, sig.args[0], src_, off, _V8I32), align=1))

        def shuf(a, b, mask):
            return builder.shuffle_vector(a, b, ir.Constant(_V8I32, mask))
        t = [shuf(rows[2 * i], rows[2 * i + 1], m) for i in range(4) for m in (_UNPACK_LO, _UNPACK_HI)]
        # t[0], t[1]: rows 0/1 lo, hi; t[2], t[3]: rows 2/3; ...
        u = [shuf(t[4 * h + a], t[4 * h + a + 2], m) for h in range(2) for a in range(2)
             for m in (_PAIRS_LO, _PAIRS_HI)]
        # u[0..3]: rows 0-3, words (0, 4), (1, 5), (2, 6), (3, 7); u[4..7]: rows 4-7
        for q in range(4):
            for half, mask in ((0, _HALVES_LO), (1, _HALVES_HI)):
                off = builder.add(doff_, ir.Constant(doff_.type, 32 * (q + 4 * half)))
                builder.store(shuf(u[q], u[4 + q], mask),
                              _byte_ptr(context, builder, sig.args[3], dst_, off, _V8I32), align=1)
        return context.get_dummy_value()
    return types.void(src, types.intp, types.intp, dst, types.intp), codegen
