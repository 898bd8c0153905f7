"""Mat-mul of the K-quants Q4_K, Q5_K and Q6_K on their GGUF super-blocks
as stored, in the float order of each CPU profile's llama.cpp build.

A super-block is 256 values in 8 sub-blocks of 32 (Q6_K: 16 of 16) with
integer scales (Q4_K / Q5_K: and mins) and fp16 `d` (and `dmin`). The
kernels read the stored bytes, unpack each 32-value chunk into int8 lanes
in registers (`simd`: nibbles, the Q5_K fifth bit, Q6_K's low and high
bits, the 12 packed 6-bit scales and mins of Q4_K / Q5_K), and dot them
with the Q8_K activations (`act_quant.q8_k_fields`: int8 quants, a float32
scale per super-block, the sums of every 16 quants). All integer sums are
exact; what ggml's builds differ in is where the float steps come
(llama.cpp vendored by llama-cpp-python 0.3.36, ggml-cpu):

* `LANES`, the AVX2 `ggml_vec_dot_q{4,5,6}_K_q8_K` (`arch/x86/quants.c`,
  fewer than 8 activation rows): per super-block 8 int32 lanes, lane L =
  sum over the chunks of scale * (the exact dot of values 4L..4L+3 of the
  chunk) (Q6_K: minus 32 * (bsum[2L] scale[2L] + bsum[2L+1]
  scale[2L+1]), the unsigned quants' offset), then `acc = fma(d_a * d,
  float(lane), acc)`; `hsum_float_8` at the end. The mins: Q4_K in 4
  lanes, lane i = min[2i] bsum[2i] + min[2i+1] bsum[2i+1] (per 32),
  `accm = fma(-d_a * dmin, float(lane), accm)`, added as ((m0 + m2) + (m1
  + m3)); Q5_K as one integer per super-block in a scalar `summs`, added
  last.
* `TILED`, ggml's tiled K-quant mat-mul (`tiled/`, 8 or more rows; its
  AVX2 and AVX512-VNNI micro-kernels round alike): per super-block the
  exact s1 = sum scale * dot (and s2 = sum min * bsum), `r = fma(-dmin,
  float(s2), float(s1) * d)` (Q6_K: `r = float(s1) * d`), `out = fma(r,
  d_a, out)`.
* `REPACK` (Q4_K, rows % 8 == 0 on builds with AVX2: ggml's CPU_REPACK
  `q4_K_8x8`): `ggml_gemv_q4_K_8x8_q8_K` for the activation rows past the
  last whole group of 4, exact I = sum scale * dot and M = sum min * bsum,
  `acc = fma(float(I), d * d_a, acc)`, `accm = fma(float(M), dmin * d_a,
  accm)` per super-block, acc - accm; `ggml_gemm_q4_K_8x8_q8_K` (AVX-512
  code) for the rows in whole groups of 4: the same per pair of
  sub-blocks.
* `NEON`, the arm64 `ggml_vec_dot_q{4,5,6}_K_q8_K` (`arch/arm/quants.c`,
  every NEON build; the lanes are reduced as integers, so dotprod changes
  nothing): per super-block the exact I = sum scale * dot (Q6_K: minus 32
  sum scale * bsum) and M = sum min * bsum, then scalar C as GCC 12
  contracted it (docs/arm64.md, disassembly): Q4_K `sum = fma(float(I), d
  * d_a, fma(-float(M), dmin * d_a, sum))`, Q5_K `sum = sum +
  fma(float(I), d * d_a, -round(float(M) * (dmin * d_a)))`, Q6_K `sum =
  fma(d * d_a, float(I), sum)`.
* `ARM_8X4`, the arm64 dotprod builds' CPU_REPACK layouts `q4_K_8x4`,
  `q5_K_8x4`, `q6_K_8x4` (rows % 8; `arch/arm/repack.cpp`, contractions
  from the disassembly): Q4_K / Q5_K gemv and gemm alike, per pair of
  sub-blocks `acc = fma(d * d_a, float(sc_lo dot_lo + sc_hi dot_hi),
  acc)` (`vfmaq_f32`), after each super-block `acc = acc - round(float(M)
  * (dmin * d_a))` (`vmlsq_f32`, unfused); Q6_K per super-block, the gemv
  `acc = fma(float(I), d * d_a, acc)` (`vaddq_f32(acc, vmulq_f32(..))`,
  contracted by GCC), the gemm `acc + round(float(I) * (d * d_a))`
  (`vmlaq_f32`, not). The gemm's activation rows come from
  `ggml_quantize_mat_q8_K_4x4` (generic C: the reference's arithmetic).
* `GENERIC`, the baseline build (`ggml_vec_dot_q{4,5,6}_K_q8_K_generic`,
  quants.c, no FMA): 8 int32 lanes of the positions mod 8, each 16 values
  times their scale, over the signed values (Q6_K: q - 32); per
  super-block `sums[l] += (d * d_a) * float(lane l)`, Q4_K / Q5_K `sumf -=
  (dmin * d_a) * float(sum min * bsum)`; at the end sumf += sums[0], ...,
  sums[7] in order.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ..types import GGMLType, block_format
from ._digest import kquant_row_kernels
from . import kquant_panel
from .fp import fma32 as _fma
from .simd import (I32x8, _BYTES, _I8, _I16, _I32, _V8I32, _V16I8, _V16I16, _V32I8, _byte_ptr, _check_array,
                   _literal, _mod8_ir, _splat, scaled_pairs_ir, f8_add, f8_fma, f8_hsum, f8_lane, f8_mul,
                   f8_splat, f8_zero, f16_at, i8_at, i8_load, i8x32_lanes_scaled, i32_add,
                   i32_hsum, i32_lane, i32_load, i32_mul, i32_pairdot, i32_pairsum, i32_splat,
                   i32_sub, i32_to_f8, i32_zero)

__all__ = ["KQUANT_TYPES", "LANES", "TILED", "REPACK", "GENERIC", "NEON", "ARM_8X4", "kernels",
           "AMAX_TIE_LAYOUTS"]

KQUANT_TYPES = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
#: arithmetic modes (module docstring)
LANES, TILED, REPACK, GENERIC, NEON, ARM_8X4 = 0, 1, 2, 3, 4, 5
#: `LANES`' integers with `acc + d * lane` unfused: the AVX (no AVX2) branch
#: of a build without FMA (v0.4.0's ivybridge; isa `x86_avx_nofma`)
LANES_NOFMA = 6

_F32 = np.float32
#: the modes whose products of several activation rows run as a panel of
#: eight weight rows (`kquant_panel`)
_PANEL_KINDS = {REPACK: kquant_panel.REPACK, TILED: kquant_panel.TILED}


def _off(t, name):
    return block_format(t).field(name).offset


# ------------------------------------------------ super-block integers (IR)
# Each intrinsic emits the whole super-block's integer work unrolled (the
# chunk index decides shifts, masks and which scale applies, so it must be
# a compile-time constant): one super-block at byte `o` of the weights `w`,
# its 256 activations at `xo` of `x` (int8), all exact.

def _load(context, builder, sig, args, i, off, llty):
    return builder.load(_byte_ptr(context, builder, sig.args[i], args[i], off, llty), align=1)


def _at(builder, base, k):
    return builder.add(base, ir.Constant(base.type, k))


def _q4k_scale_ir(builder, s12, mins: bool):
    # ggml `get_scale_min_k4` for the 8 sub-blocks at once: entries 0-3 the
    # low 6 bits of bytes 0-3 (scales) / 4-7 (mins); entries 4-7 the low
    # (scales) / high (mins) nibble of bytes 8-11 and the top 2 bits of
    # bytes 0-3 / 4-7 above them
    v12 = builder.zext(s12, ir.VectorType(_I32, 12))
    undef = ir.Constant(ir.VectorType(_I32, 12), ir.Undefined)
    a = builder.shuffle_vector(v12, undef, ir.Constant(_V8I32, ([4, 5, 6, 7] if mins else [0, 1, 2, 3]) + [8, 9, 10, 11]))
    b = builder.shuffle_vector(v12, undef, ir.Constant(_V8I32, [0, 0, 0, 0] + ([4, 5, 6, 7] if mins else [0, 1, 2, 3])))
    if mins:
        high = builder.lshr(a, ir.Constant(_V8I32, [4] * 8))
    else:
        high = builder.and_(a, ir.Constant(_V8I32, [15] * 8))
    high = builder.or_(high, builder.shl(builder.lshr(b, ir.Constant(_V8I32, [6] * 8)), ir.Constant(_V8I32, [4] * 8)))
    first = ir.Constant(ir.VectorType(ir.IntType(1), 8), [1, 1, 1, 1, 0, 0, 0, 0])
    return builder.select(first, builder.and_(a, ir.Constant(_V8I32, [63] * 8)), high)


def _make_q45(t: GGMLType):
    """The intrinsics of Q4_K / Q5_K (`t`): lanes(w, o, x, xo, j0, n),
    lanes8(w, o, x, xo) and mins(w, o)."""
    SC, QS = _off(t, "scales"), _off(t, "qs")
    QH = _off(t, "qh") if t == GGMLType.Q5_K else None

    def scales(context, builder, sig, args, mins=False):
        return _q4k_scale_ir(builder, _load(context, builder, sig, args, 0, _at(builder, args[1], SC),
                                            ir.VectorType(_I8, 12)), mins)

    def sub(context, builder, sig, args, j, qh):
        # sub-block j: the low (j even) or high nibbles of 32 bytes, and
        # for Q5_K bit j of the 32 qh bytes as the fifth bit
        q = _load(context, builder, sig, args, 0, _at(builder, args[1], QS + 32 * (j // 2)), _V32I8)
        v = builder.and_(q, ir.Constant(_V32I8, [15] * 32)) if j % 2 == 0 else \
            builder.lshr(q, ir.Constant(_V32I8, [4] * 32))
        if qh is not None:
            on = builder.icmp_unsigned("!=", builder.and_(qh, ir.Constant(_V32I8, [1 << j] * 32)),
                                       ir.Constant(_V32I8, [0] * 32))
            v = builder.or_(v, builder.select(on, ir.Constant(_V32I8, [16] * 32), ir.Constant(_V32I8, [0] * 32)))
        return v

    def qh_bits(context, builder, sig, args):
        return None if QH is None else _load(context, builder, sig, args, 0, _at(builder, args[1], QH), _V32I8)

    @intrinsic
    def lanes(typingctx, w, o, x, xo, j0, n):
        """I32x8: sum over sub-blocks j0 .. j0+n-1 (literals) of scale_j *
        (the exact dot lanes of sub-block j with its 32 activations)."""
        _check_array("w", w, _BYTES)
        _check_array("x", x, _BYTES)
        jj, nn = _literal(j0), _literal(n)
        if jj is None or nn is None:
            return None

        def codegen(context, builder, sig, args):
            sc = builder.trunc(scales(context, builder, sig, args), ir.VectorType(_I16, 8))
            qh = qh_bits(context, builder, sig, args)
            js = range(jj, jj + nn)
            xs = [_load(context, builder, sig, args, 2, _at(builder, args[3], 32 * j), _V32I8) for j in js]
            return scaled_pairs_ir(builder, [sub(context, builder, sig, args, j, qh) for j in js], xs, sc,
                                   [(j, j) for j in js])
        return I32x8(w, types.intp, x, types.intp, j0, n), codegen

    @intrinsic
    def lanes8(typingctx, w, o, x, xo):
        """I32x8 of the generic code: lane l = sum over the sub-blocks of
        scale_j * (the products at positions l mod 8 of sub-block j)."""
        _check_array("w", w, _BYTES)
        _check_array("x", x, _BYTES)

        def codegen(context, builder, sig, args):
            sc = scales(context, builder, sig, args)
            qh = qh_bits(context, builder, sig, args)
            acc = ir.Constant(_V8I32, [0] * 8)
            for j in range(8):
                xv = _load(context, builder, sig, args, 2, _at(builder, args[3], 32 * j), _V32I8)
                h0, h1 = _mod8_ir(builder, sub(context, builder, sig, args, j, qh), xv)
                s = _splat(builder, builder.extract_element(sc, ir.Constant(_I32, j)), _V8I32)
                acc = builder.add(acc, builder.add(builder.mul(s, h0), builder.mul(s, h1)))
            return acc
        return I32x8(w, types.intp, x, types.intp), codegen

    @intrinsic
    def mins(typingctx, w, o):
        """I32x8 of the 8 sub-block mins."""
        _check_array("w", w, _BYTES)

        def codegen(context, builder, sig, args):
            return scales(context, builder, sig, args, mins=True)
        return I32x8(w, types.intp), codegen

    @intrinsic
    def scales8(typingctx, w, o):
        """I32x8 of the 8 sub-block scales."""
        _check_array("w", w, _BYTES)

        def codegen(context, builder, sig, args):
            return scales(context, builder, sig, args)
        return I32x8(w, types.intp), codegen

    @intrinsic
    def unpack(typingctx, w, o, dst, do):
        """dst[do:do + 256] = the super-block's unsigned values, sub-block
        after sub-block (the values `lanes` multiplies)."""
        _check_array("w", w, _BYTES)
        _check_array("dst", dst, _BYTES)

        def codegen(context, builder, sig, args):
            qh = qh_bits(context, builder, sig, args)
            for j in range(8):
                p = _byte_ptr(context, builder, sig.args[2], args[2], _at(builder, args[3], 32 * j), _V32I8)
                builder.store(sub(context, builder, sig, args, j, qh), p, align=1)
            return context.get_dummy_value()
        return types.void(w, types.intp, dst, types.intp), codegen

    return lanes, lanes8, mins, scales8, unpack


_Q6_QL, _Q6_QH, _Q6_SC = (_off(GGMLType.Q6_K, n) for n in ("ql", "qh", "scales"))


def _q6_chunk_ir(context, builder, sig, args, c):
    """The unsigned values (0..63) of chunk c of the Q6_K super-block: in
    half h = c // 4, k = c % 4: the low (k < 2) or high nibbles of ql[64h +
    32 (k & 1):][:32] with bits 2k, 2k+1 of qh[32h:][:32] above them (ggml
    `dequantize_row_q6_K`)."""
    h, k = divmod(c, 4)
    lo = _load(context, builder, sig, args, 0, _at(builder, args[1], _Q6_QL + 64 * h + 32 * (k & 1)), _V32I8)
    lo = builder.lshr(lo, ir.Constant(_V32I8, [4] * 32)) if k >= 2 else builder.and_(lo, ir.Constant(_V32I8, [15] * 32))
    hi = _load(context, builder, sig, args, 0, _at(builder, args[1], _Q6_QH + 32 * h), _V32I8)
    if k:
        hi = builder.lshr(hi, ir.Constant(_V32I8, [2 * k] * 32))
    hi = builder.shl(builder.and_(hi, ir.Constant(_V32I8, [3] * 32)), ir.Constant(_V32I8, [4] * 32))
    return builder.or_(lo, hi)


@intrinsic
def _q6_lanes(typingctx, w, o, x, xo):
    """I32x8: sum over the 8 chunks c of (scale[2c] in lanes 0-3, scale[2c+1]
    in lanes 4-7) * (the exact dot lanes of the chunk's unsigned values with
    its activations); the -32 offset is not applied."""
    _check_array("w", w, _BYTES)
    _check_array("x", x, _BYTES)

    def codegen(context, builder, sig, args):
        sc16 = builder.sext(_load(context, builder, sig, args, 0, _at(builder, args[1], _Q6_SC), _V16I8), _V16I16)
        xs = [_load(context, builder, sig, args, 2, _at(builder, args[3], 32 * c), _V32I8) for c in range(8)]
        return scaled_pairs_ir(builder, [_q6_chunk_ir(context, builder, sig, args, c) for c in range(8)], xs,
                               sc16, [(2 * c, 2 * c + 1) for c in range(8)])
    return I32x8(w, types.intp, x, types.intp), codegen


@intrinsic
def _q6_unpack(typingctx, w, o, dst, do):
    """dst[do:do + 256] = the Q6_K super-block's unsigned values (0..63),
    chunk after chunk."""
    _check_array("w", w, _BYTES)
    _check_array("dst", dst, _BYTES)

    def codegen(context, builder, sig, args):
        for c in range(8):
            p = _byte_ptr(context, builder, sig.args[2], args[2], _at(builder, args[3], 32 * c), _V32I8)
            builder.store(_q6_chunk_ir(context, builder, sig, args, c), p, align=1)
        return context.get_dummy_value()
    return types.void(w, types.intp, dst, types.intp), codegen


@intrinsic
def _q6_lanes8(typingctx, w, o, x, xo):
    """I32x8 of the generic code: lane l = sum over the chunks of scale[2c]
    * (products of the signed values q - 32 at positions l, 8 + l) +
    scale[2c+1] * (at 16 + l, 24 + l)."""
    _check_array("w", w, _BYTES)
    _check_array("x", x, _BYTES)

    def codegen(context, builder, sig, args):
        sc = builder.sext(_load(context, builder, sig, args, 0, _at(builder, args[1], _Q6_SC), _V16I8),
                          ir.VectorType(_I32, 16))
        acc = ir.Constant(_V8I32, [0] * 8)
        for c in range(8):
            xv = _load(context, builder, sig, args, 2, _at(builder, args[3], 32 * c), _V32I8)
            v = builder.sub(_q6_chunk_ir(context, builder, sig, args, c), ir.Constant(_V32I8, [32] * 32))
            h0, h1 = _mod8_ir(builder, v, xv)
            s0 = _splat(builder, builder.extract_element(sc, ir.Constant(_I32, 2 * c)), _V8I32)
            s1 = _splat(builder, builder.extract_element(sc, ir.Constant(_I32, 2 * c + 1)), _V8I32)
            acc = builder.add(acc, builder.add(builder.mul(s0, h0), builder.mul(s1, h1)))
        return acc
    return I32x8(w, types.intp, x, types.intp), codegen


# --------------------------------------------------------------- kernels
def _make_kernels(t: GGMLType, mode: int):
    """The `_digest.RowKernels` (serial, parallel, span, split) for type t in `mode`: k(raw, xq, xd,
    xb, n_gemm, out[, parts]) with raw uint8 (rows, row_bytes) the stored
    super-blocks, xq int8 (n, cols), xd float32 (n, cols/256), xb int32 the
    bsums (n, cols/16), out float32 (n, rows); n_gemm: REPACK's rows taken
    by the gemm."""
    BB = block_format(t).block_bytes
    Q6 = t == GGMLType.Q6_K
    Q5 = t == GGMLType.Q5_K
    D = _off(t, "d")
    DMIN = -1 if Q6 else _off(t, "dmin")
    MODE = mode
    if not Q6:
        lanes, lanes8, mins, scales8, unpack = _make_q45(t)
    else:
        lanes = lanes8 = mins = scales8 = unpack = None
    # several activation rows on the repacked / tiled paths: eight weight
    # rows at a time as a panel (`kquant_panel`, the same bits)
    PANEL = MODE in _PANEL_KINDS
    panel = kquant_panel.make_panel(t, _PANEL_KINDS[MODE], _q6_unpack if Q6 else unpack, scales8, mins, _Q6_SC) if PANEL else None

    # --- the float steps of one super-block for one activation row (the
    # module docstring's modes); st = (acc F32x8, out, accm, mv F32x8):
    # LANES acc the 8 float lanes, mv (Q4_K) the 4 min lanes; GENERIC acc
    # the 8 `sums`, out `sumf`; TILED / REPACK out (and accm)
    @njit(inline="always")
    def fstep(st, li, p0, p1, p2, p3, mnx, d, dmin, da, gemm):
        acc, out, accm, mv = st
        if MODE == GENERIC:
            # sums[l] = sums[l] + dd * float(lane l), no FMA
            acc = _f8_add_products(acc, _F32(d * da), i32_to_f8(li))
            if not Q6:
                out = _F32(out - _F32(_F32(dmin * da) * _F32(i32_hsum(mnx))))
        elif MODE == ARM_8X4:
            ds = _F32(d * da)
            if Q6:
                if gemm:
                    out = _F32(out + _F32(_F32(i32_hsum(li)) * ds))
                else:
                    out = _fma(_F32(i32_hsum(li)), ds, out)
            else:
                out = _fma(ds, _F32(i32_hsum(p0)), out)
                out = _fma(ds, _F32(i32_hsum(p1)), out)
                out = _fma(ds, _F32(i32_hsum(p2)), out)
                out = _fma(ds, _F32(i32_hsum(p3)), out)
                out = _F32(out - _F32(_F32(i32_hsum(mnx)) * _F32(dmin * da)))
        elif MODE == NEON:
            di = _F32(i32_hsum(li))
            if Q6:
                out = _fma(_F32(d * da), di, out)
            elif Q5:
                out = _F32(out + _fma(di, _F32(d * da), -_F32(_F32(i32_hsum(mnx)) * _F32(dmin * da))))
            else:
                out = _fma(di, _F32(d * da), _fma(-_F32(i32_hsum(mnx)), _F32(dmin * da), out))
        elif MODE == LANES_NOFMA:
            acc = _f8_add_products(acc, _F32(da * d), i32_to_f8(li))
            if Q5:
                out = _F32(out + _F32(_F32(-da * dmin) * _F32(i32_hsum(mnx))))   # summs
            elif not Q6:
                # Q4_K's 4 min lanes (`acc_m`), acc_m + dmin * lane unfused
                mv = f8_add(f8_mul(f8_splat(_F32(-da * dmin)), i32_to_f8(i32_pairsum(mnx))), mv)
        elif Q6:
            if MODE == TILED:
                out = _fma(_F32(_F32(i32_hsum(li)) * d), da, out)
            else:
                acc = f8_fma(f8_splat(_F32(da * d)), i32_to_f8(li), acc)
        elif MODE == REPACK:
            dm = _F32(dmin * da)
            ds = _F32(d * da)
            if gemm:
                # per pair of sub-blocks
                out = _fma(_F32(i32_hsum(p0)), ds, out)
                accm = _fma(_F32(i32_lane(mnx, 0) + i32_lane(mnx, 1)), dm, accm)
                out = _fma(_F32(i32_hsum(p1)), ds, out)
                accm = _fma(_F32(i32_lane(mnx, 2) + i32_lane(mnx, 3)), dm, accm)
                out = _fma(_F32(i32_hsum(p2)), ds, out)
                accm = _fma(_F32(i32_lane(mnx, 4) + i32_lane(mnx, 5)), dm, accm)
                out = _fma(_F32(i32_hsum(p3)), ds, out)
                accm = _fma(_F32(i32_lane(mnx, 6) + i32_lane(mnx, 7)), dm, accm)
            else:
                out = _fma(_F32(i32_hsum(li)), ds, out)
                accm = _fma(_F32(i32_hsum(mnx)), dm, accm)
        elif MODE == TILED:
            r = _fma(-dmin, _F32(i32_hsum(mnx)), _F32(_F32(i32_hsum(li)) * d))
            out = _fma(r, da, out)
        else:
            acc = f8_fma(f8_splat(_F32(da * d)), i32_to_f8(li), acc)
            dm = _F32(-da * dmin)
            if Q5:
                out = _fma(dm, _F32(i32_hsum(mnx)), out)       # summs
            else:
                # lanes i < 4: m_i = fma(dm, float(pair i of min * bsum), m_i)
                mv = f8_fma(f8_splat(dm), i32_to_f8(i32_pairsum(mnx)), mv)
        return acc, out, accm, mv

    @njit(inline="always")
    def ffinish(st):
        acc, out, accm, mv = st
        if MODE == GENERIC:
            for l in range(8):
                out = _F32(out + f8_lane(acc, l))
            return out
        if MODE == TILED or MODE == NEON or MODE == ARM_8X4:
            return out
        if MODE == REPACK:
            return _F32(out - accm)
        if Q6:
            return f8_hsum(acc)
        if Q5:
            return _F32(f8_hsum(acc) + out)
        m = _F32(_F32(f8_lane(mv, 0) + f8_lane(mv, 2)) + _F32(f8_lane(mv, 1) + f8_lane(mv, 3)))
        return _F32(f8_hsum(acc) + m)

    @njit(inline="always")
    def fstart():
        return f8_zero(), _F32(0.0), _F32(0.0), f8_zero()

    # --- the integer lanes
    @njit(inline="always")
    def direct_ints(w, o, x, xo, xb, bo):
        # one activation row, from the stored super-block: (li, mins * bsums)
        if Q6:
            if MODE == GENERIC:
                return _q6_lanes8(w, o, x, xo), i32_zero()
            return (i32_sub(_q6_lanes(w, o, x, xo), i32_mul(i32_splat(32), i32_pairdot(w, o + _Q6_SC, xb, bo))),
                    i32_zero())
        mnx = i32_mul(mins(w, o), i32_load(xb, bo))
        if MODE == GENERIC:
            return lanes8(w, o, x, xo), mnx
        return lanes(w, o, x, xo, 0, 8), mnx

    @njit(inline="always")
    def scr_pairs(scr, so, scs, w, o, x, xa, xb_, two):
        # two activation rows (quants at xa and xb_ of x) from the unpacked
        # super-block: the 4 pair sums of each (Q4_K / Q5_K: sub-blocks 2k,
        # 2k+1 with their scales; Q6_K: chunks 2k, 2k+1 with theirs); the
        # second row's are zeros unless `two`
        a0, a1, a2, a3 = i32_zero(), i32_zero(), i32_zero(), i32_zero()
        b0, b1, b2, b3 = i32_zero(), i32_zero(), i32_zero(), i32_zero()
        for j in range(8):
            wv = i8_load(scr[0], so + 32 * j)
            if Q6:
                lo = i8_at(w, o + _Q6_SC + 2 * j)
                hi = i8_at(w, o + _Q6_SC + 2 * j + 1)
            else:
                lo = scr[1][scs + j]
                hi = lo
            la = i8x32_lanes_scaled(wv, i8_load(x, xa + 32 * j), lo, hi)
            lb = i8x32_lanes_scaled(wv, i8_load(x, xb_ + 32 * j), lo, hi) if two else i32_zero()
            k = j // 2
            if k == 0:
                a0, b0 = i32_add(a0, la), i32_add(b0, lb)
            elif k == 1:
                a1, b1 = i32_add(a1, la), i32_add(b1, lb)
            elif k == 2:
                a2, b2 = i32_add(a2, la), i32_add(b2, lb)
            else:
                a3, b3 = i32_add(a3, la), i32_add(b3, lb)
        return a0, a1, a2, a3, b0, b1, b2, b3

    @njit(inline="always")
    def li_of(p0, p1, p2, p3, w, o, xb, bo):
        li = i32_add(i32_add(p0, p1), i32_add(p2, p3))
        if Q6:
            li = i32_sub(li, i32_mul(i32_splat(32), i32_pairdot(w, o + _Q6_SC, xb, bo)))
        return li

    @njit(inline="always")
    def row_direct(w, ow, x, ox, xd, xb, bo, t):
        # one weight row, one activation row, from the stored blocks
        st = fstart()
        z = i32_zero()
        for b in range(xd.shape[1]):
            o = ow + b * BB
            li, mnx = direct_ints(w, o, x, ox + 256 * b, xb, bo + (16 if Q6 else 8) * b)
            st = fstep(st, li, z, z, z, z, mnx, f16_at(w, o + D), f16_at(w, o + DMIN) if not Q6 else _F32(0.0),
                       xd[t, b], False)
        return ffinish(st)

    @njit(inline="always")
    def rows_two(w, ow, x, oa, ob, xd, xb, ba, bb, ta, tb, gemm, scr, two):
        # one weight row (unpacked in scr) with activation rows ta and tb
        # (tb's result is not computed unless `two`)
        sa = fstart()
        sb = fstart()
        for b in range(xd.shape[1]):
            o = ow + b * BB
            d = f16_at(w, o + D)
            dmin = f16_at(w, o + DMIN) if not Q6 else _F32(0.0)
            a0, a1, a2, a3, b0, b1, b2, b3 = scr_pairs(scr, 256 * b, 8 * b, w, o, x, oa + 256 * b, ob + 256 * b, two)
            sb16 = (16 if Q6 else 8) * b
            if Q6:
                ma = i32_zero()
                mb = ma
            else:
                mn = i32_load(scr[2], 8 * b)
                ma = i32_mul(mn, i32_load(xb, ba + sb16))
                mb = i32_mul(mn, i32_load(xb, bb + sb16))
            sa = fstep(sa, li_of(a0, a1, a2, a3, w, o, xb, ba + sb16), a0, a1, a2, a3, ma, d, dmin, xd[ta, b], gemm)
            if two:
                sb = fstep(sb, li_of(b0, b1, b2, b3, w, o, xb, bb + sb16), b0, b1, b2, b3, mb, d, dmin, xd[tb, b],
                           gemm)
        return ffinish(sa), ffinish(sb)

    @njit(inline="always")
    def unpack_row(w, ow, nb, scr):
        # the row's super-blocks unpacked once for all activation rows:
        # values to scr[0] (256 per super-block), Q4_K / Q5_K scales and
        # mins to scr[1], scr[2] (8 per super-block)
        for b in range(nb):
            o = ow + b * BB
            if Q6:
                _q6_unpack(w, o, scr[0], 256 * b)
            else:
                unpack(w, o, scr[0], 256 * b)
                sc = scales8(w, o)
                mn = mins(w, o)
                for j in range(8):
                    scr[1][8 * b + j] = i32_lane(sc, j)
                    scr[2][8 * b + j] = i32_lane(mn, j)

    @njit(inline="always")
    def rows(raw, xq, xd, xb, n_gemm, out, r0, r1):
        n, cols = xq.shape
        rb = raw.shape[1]
        w = raw.reshape(-1)
        x = xq.reshape(-1)
        xbf = xb.reshape(-1)
        nbs = xb.shape[1]
        nb = xd.shape[1]
        if (n == 1 and MODE != ARM_8X4) or MODE == GENERIC:
            # straight from the stored blocks, one weight row at a time (the
            # generic code's lanes are other sums, and one row needs each
            # block once); REPACK's gemv too: each row's float steps are
            # `fstep`'s, and one row streamed at a time reads a matrix from
            # memory at twice the speed of eight rows side by side
            for r in range(r0, r1):
                for t in range(n):
                    out[t, r] = row_direct(w, r * rb, x, t * cols, xd, xbf, t * nbs, t)
            return
        if PANEL:
            r0 = panel(w, r0, r1, rb, x, xd, xbf, nbs, n_gemm, out)
            if r0 == r1:
                return
        # several activation rows: each weight row unpacked once, then
        # dotted with the activation rows two at a time
        scr = (np.empty(256 * nb, np.uint8), np.empty(8 * nb, np.int32), np.empty(8 * nb, np.int32))
        for r in range(r0, r1):
            unpack_row(w, r * rb, nb, scr)
            t = 0
            while t < n:
                two = t + 1 < n                    # else an odd last row, alone
                tb = t + 1 if two else t
                ya, yb = rows_two(w, r * rb, x, t * cols, tb * cols, xd, xbf, t * nbs, tb * nbs, t, tb,
                                  t < n_gemm, scr, two)
                out[t, r] = ya
                if two:
                    out[tb, r] = yb
                t += 2

    return kquant_row_kernels(rows, f"kquant_{t.name}_mode{mode}")


@njit(inline="always")
def _f8_add_products(s, dd, lf):
    """s + dd * lf per lane as two float32 roundings (the generic build's
    `sums[l] += (d * d_a) * (float)aux32[l]`, no FMA)."""
    return f8_add(s, f8_mul(f8_splat(dd), lf))


_KERNELS = {}


def kernels(t, mode: int):
    """The `_digest.RowKernels` (serial, parallel, span, split) of K-quant type t in `mode`
    (module docstring; REPACK for Q4_K only): serial(raw, xq, xd, xb,
    n_gemm, out), parallel(..., out, parts) with raw uint8 (rows,
    row_bytes) the GGUF super-blocks, xq int8 (n, cols), xd float32 (n,
    cols/256), xb int32 bsums (per 16 values for Q6_K, per 32 for Q4_K /
    Q5_K), out float32 (n, rows); n_gemm: with REPACK, the leading
    activation rows ggml's repacked gemm takes (the others take its gemv);
    parts: equal parts of the rows over numba's threads. Compiled at first
    use and cached on disk. KeyError for another type."""
    key = (GGMLType(t), mode)
    if key[0] not in KQUANT_TYPES:
        raise KeyError(f"{key[0].name} is not a kquant_dots type")
    if key not in _KERNELS:
        _KERNELS[key] = _make_kernels(*key)
    return _KERNELS[key]


#: the mode of each kernel variant an instruction-set chain names
#: (`strata_ref.cpu.traits.kernel`)
VARIANTS = {"x86": LANES, "x86_nofma": LANES_NOFMA, "generic": GENERIC, "tiled": TILED, "q4_K_8x8": REPACK, "neon": NEON,
            "q4_K_8x4": ARM_8X4, "q5_K_8x4": ARM_8X4, "q6_K_8x4": ARM_8X4}
#: the repacked layouts whose gemm rows are quantized by x86's
#: `ggml_quantize_mat_q8_K_4x8`, where +amax wins a tie with -amax
#: (`act_quant.q8_k_fields`' mat_rows); ARM's `_4x4` quantizer takes the
#: first, as the reference does
AMAX_TIE_LAYOUTS = frozenset({"q4_K_8x8"})


def variant_kernels(t, variant: str):
    """`kernels(t, VARIANTS[variant])`; NotImplementedError for a variant
    not emulated here (an arm64 one)."""
    if variant not in VARIANTS:
        from . import arm_kquant
        if variant in arm_kquant.VARIANTS:
            return arm_kquant.variant_kernels(t, variant)
        raise NotImplementedError(f"{GGMLType(t).name}: ggml's {variant} kernel is not emulated yet")
    return kernels(t, VARIANTS[variant])
