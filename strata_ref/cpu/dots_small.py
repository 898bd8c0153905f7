"""ggml-cpu's mat-muls of the small block types (Q1_0, Q2_0, MXFP4, NVFP4,
IQ4_NL with Q8_0 activations; TQ1_0, TQ2_0 with Q8_K activations), per CPU
profile, bit for bit (the float weight types: `dots_float`).

Source: llama.cpp vendored by llama-cpp-python 0.3.36, `ggml/src/ggml-cpu/`
(GCC 12, `-std=gnu11`: `a * b + c` in C code and in GCC's vector
intrinsics, whose `_mm256_mul_ps` / `_mm256_add_ps` are plain vector
arithmetic, is contracted into an FMA on builds with FMA; the baseline
build has none). Which code each path follows (`QMatrix.segments` picks
the path per GGUF tensor, by `traits.mm_path`; the instruction-set chain
names the variant, `traits.kernel`):

Block types, "vec_dot" (one weight row times one activation row; every
activation row of MXFP4, NVFP4, Q1_0, Q2_0, TQ1_0, TQ2_0 that is not
repacked, and IQ4_NL's single row):

* IQ4_NL, MXFP4 (`ggml_vec_dot_iq4_nl_q8_0`, `ggml_vec_dot_mxfp4_q8_0`,
  `arch/x86/quants.c`, `__AVX2__`): blocks taken in pairs, the even block
  into one 8-lane accumulator and the odd one into another, each lane L
  getting fma(d_a * d_w, float(dot of values 4L..4L+3), lane); the two
  accumulators added lane by lane, `hsum_float_8`, and an odd last block
  added in a scalar, fma(d, float(block dot), sum). d_w: the fp16 scale
  (IQ4_NL) or `ggml_e8m0_to_fp32_half(e)` (MXFP4).
* NVFP4 (`ggml_vec_dot_nvfp4_q8_0`, AVX2): one accumulator; per block of 64
  two FMA steps, one per Q8_0 block, lanes 0-3 scaled by the first
  sub-block's ue4m3(d_s) * d_a, lanes 4-7 by the second's.
* Q1_0 (`ggml_vec_dot_q1_0_q8_0`, AVX2): per block of 128, b = d_a0 *
  float(lanes_0), then b = fma(d_aK, float(lanes_K), b) for its other three
  Q8_0 blocks, then acc = fma(d_w, b, acc); `hsum_float_8`.
* the AVX (no AVX2) branches: NVFP4's and Q1_0's are the AVX2 lanes and
  steps, unfused on a build without FMA; MXFP4's is IQ4_NL's pairs of
  blocks (`_AVX_PAIRS`); the SSSE3 branch of Q1_0 (sse42) four 4-lane
  accumulators, one per Q8_0 block, lane l the dot of values 4l..4l+3 and
  16+4l..16+4l+3, acc + (d_w * d_a) * lane unfused, `hsum_float_4x4`
  (`_SSSE3_Q1`).
* TQ1_0, TQ2_0 (`ggml_vec_dot_tq1_0_q8_K`, `ggml_vec_dot_tq2_0_q8_K`, AVX2):
  the unsigned codes (0..2; TQ2_0's 3 too) times the q8, lane L of a
  super-block summing positions 4L..4L+3 of each 32 minus the Q8_K bsums
  2L and 2L+1 (the -1 offset), then acc = fma(float(lane), d_a * d_w,
  acc) (mul + add intrinsics, contracted); `hsum_float_8`.
* "generic", the C code (`quants.c` `ggml_vec_dot_*_generic`; the baseline
  build, and Q2_0 on every x86 build, `arch-fallback.h`): one exact integer
  per block (Q1_0 / Q2_0: per Q8_0 block, summed in a float with the Q8_0
  scale, then times d_w into the total; NVFP4: per 16), added to a float
  sum in block order, contracted into FMAs on FMA builds.

* the arm64 `vec_dot`s (`arch/arm/quants.c`, as GCC 12 compiled them:
  docs/arm64.md): IQ4_NL / MXFP4 per pair of blocks (`_NEON_NL`,
  `_NEON_MX`, below); NVFP4 one 4-lane accumulator, lane k fma(float(dot of
  sub-block k), ue4m3_k * d_a, lane) per block of 64, `vaddvq_f32`; Q1_0 /
  Q2_0 one 4-lane accumulator over `ggml_vdotq_s32`'s lanes (which values
  a lane sums depends on dotprod), lane + round(float(lane) * (d_w * d_a))
  per Q8_0 block (`vmlaq_n_f32`, unfused), `vaddvq_f32`; TQ1_0 / TQ2_0 the
  generic order (one integer per super-block, fused).
* the arm64 dotprod builds' CPU_REPACK `iq4_nl_4x4` / `mxfp4_4x4` (rows %
  4; `arch/arm/repack.cpp`): gemv and gemm alike, one accumulator per
  output, acc + round((d_a * d_w) * float(block dot)) block after block
  (`vmlaq_f32`, unfused); the gemm's activations come from the NEON
  `ggml_quantize_mat_q8_0_4x4`, per row what `quantize_row_q8_0` computes.

Block types, other paths:

* "tinyblas" (IQ4_NL, two or more activation rows on AVX builds):
  llamafile's `tinyBLAS_Q0_AVX` (`llamafile/sgemm.cpp`), one 8-lane
  accumulator per output, fma(d_w * d_a, float(lanes), acc) block after
  block, `hsum`: Q4_0's arithmetic, not IQ4_NL's two-accumulator vec_dot.
* "repack" (IQ4_NL, MXFP4 with rows % 8 == 0 on the AVX2 and AVX-512
  builds): ggml's
  CPU_REPACK `iq4_nl_8x8` / `mxfp4_8x8` gemv and gemm
  (`arch/x86/repack.cpp`, `gemv_q4_b32_8x8_q8_0_lut_avx` and
  `gemm_q4_b32_8x8_q8_0_lut_avx`, AVX2 and AVX-512 variants alike): one
  accumulator per output, acc = fma(float(block dot), d_w * d_a, acc). The
  gemm's activations come from `ggml_quantize_mat_q8_0_4x8`, which computes
  what the AVX `quantize_row_q8_0` computes.

Weights stay as stored: the block types' codes widened to one int8 each
(values in natural order), their scales as float32. Integer parts are exact
and computed in any exact way (`lanes`).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._digest import jit
from ..numerics import F16_TO_F32
from ..types import GGMLType as T, block_format
from . import act_quant
from .fp import fma32, hsum8
# lanes' IR helpers (`_lanes`: the exact 8 int32 lanes of a block) build the
# intrinsics below
from .lanes import _V8F, _V8I32, _V32I8, _check, _fn, _lanes, _ptr, fma8_into, lanes_scaled_add
from .neon_legacy import LANE_DOTPROD as _LANE_DOTPROD, LANE_NEON as _LANE_NEON
from .traits import Family, kernel

__all__ = ["SMALL_TYPES", "FAMILY", "pack_small"]

_F32 = np.float32


# ------------------------------------------------------------------ intrinsics
@intrinsic
def _lanes_fma2(typingctx, acc, accoff, w, woff, x, xoff, d_lo, d_hi):
    """acc[accoff + L] = fma(d, float(lane L), acc[accoff + L]) for L < 8,
    d = d_lo for lanes 0-3 and d_hi for lanes 4-7; lane L is the exact dot
    of int8 values 4L..4L+3 of the 32 at w[woff] and x[xoff] (`lanes`).
    One AVX2 step `_mm256_fmadd_ps(scales, _mm256_cvtepi32_ps(p), acc)` of
    ggml's Q8_0 dots (one scale: d_lo == d_hi; NVFP4: two)."""
    _check(acc=(acc, types.float32), w=(w, types.int8), x=(x, types.int8))
    sig = types.void(acc, types.intp, w, types.intp, x, types.intp, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        A, ao, W, wo, X, xo, dlo, dhi = args
        ta, _, tw, _, tx, _, _, _ = signature.args
        wv = builder.load(_ptr(context, builder, tw, W, wo, _V32I8), align=1)
        xv = builder.load(_ptr(context, builder, tx, X, xo, _V32I8), align=1)
        lf = builder.sitofp(_lanes(builder, wv, xv), _V8F)
        sc = ir.Constant(_V8F, ir.Undefined)
        for L in range(8):
            sc = builder.insert_element(sc, dlo if L < 4 else dhi, ir.Constant(ir.IntType(32), L))
        pa = _ptr(context, builder, ta, A, ao, _V8F)
        fma = _fn(builder, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
        builder.store(builder.call(fma, [sc, lf, builder.load(pa, align=4)]), pa, align=4)
        return context.get_dummy_value()
    return sig, codegen


def _hsum_i32x8(builder, v, width):
    # sum of each group of `width` (8 or 4) int32 lanes of v, in registers
    # (three / two shuffle-adds); lane 0 holds lanes 0..width-1, lane 4
    # (width 4) lanes 4..7
    u = ir.Constant(_V8I32, ir.Undefined)
    if width == 8:
        v = builder.add(v, builder.shuffle_vector(v, u, ir.Constant(_V8I32, [4, 5, 6, 7] * 2)))
    v = builder.add(v, builder.shuffle_vector(v, u, ir.Constant(_V8I32, [2, 3, 2, 3, 6, 7, 6, 7])))
    return builder.add(v, builder.shuffle_vector(v, u, ir.Constant(_V8I32, [1, 1, 1, 1, 5, 5, 5, 5])))


def _block_lanes(context, builder, signature, args):
    W, wo, X, xo = args
    tw, _, tx, _ = signature.args
    wv = builder.load(_ptr(context, builder, tw, W, wo, _V32I8), align=1)
    xv = builder.load(_ptr(context, builder, tx, X, xo, _V32I8), align=1)
    return _lanes(builder, wv, xv)


@intrinsic
def _bdot(typingctx, w, woff, x, xoff):
    """The exact int32 dot of the 32 int8 values at w[woff] and x[xoff],
    the lanes summed in registers (summed through an array they made the
    generic and repacked paths 5 to 10 times slower, measured)."""
    _check(w=(w, types.int8), x=(x, types.int8))
    sig = types.int32(w, types.intp, x, types.intp)

    def codegen(context, builder, signature, args):
        v = _hsum_i32x8(builder, _block_lanes(context, builder, signature, args), 8)
        return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))
    return sig, codegen


@intrinsic
def _bdot_halves(typingctx, w, woff, x, xoff):
    """(dot of the first 16, dot of the last 16) of the 32 int8 values at
    w[woff] and x[xoff], exact int32 (NVFP4's sub-blocks)."""
    _check(w=(w, types.int8), x=(x, types.int8))
    ret = types.UniTuple(types.int32, 2)
    sig = ret(w, types.intp, x, types.intp)

    def codegen(context, builder, signature, args):
        v = _hsum_i32x8(builder, _block_lanes(context, builder, signature, args), 4)
        i32 = ir.IntType(32)
        return context.make_tuple(builder, ret, [builder.extract_element(v, ir.Constant(i32, 0)),
                                                 builder.extract_element(v, ir.Constant(i32, 4))])
    return sig, codegen


# ------------------------------------------------------------- block types
#: kinds of block dot (the packed layout and the ggml function family)
_B32, _NV, _Q1, _Q2, _TQ = 0, 1, 2, 3, 4
#: paths of the block kernels (_NEON_NL, _NEON_MX: the arm64 `vec_dot`s of
#: IQ4_NL and MXFP4, which contract different products; _NEON_NV: NVFP4's;
#: _NEON_Q, _DOTPROD_Q: Q1_0's and Q2_0's over the lanes of
#: `ggml_vdotq_s32` without and with dotprod; _REPACK_ARM: the arm64
#: `iq4_nl_4x4` / `mxfp4_4x4` gemv and gemm; _AVX_PAIRS: IQ4_NL's AVX
#: `vec_dot`, builds without AVX2)
(_AVX2, _GENERIC, _TINYBLAS, _REPACK, _NEON_NL, _NEON_MX, _NEON_NV, _NEON_Q, _DOTPROD_Q, _REPACK_ARM,
 _AVX_PAIRS, _SSSE3_Q1) = range(12)


@njit(inline="always", cache=True)
def _hadd4(acc, o):
    # one accumulator's part of `hsum_float_4x4` (`_mm_hadd_ps` thrice):
    # (a0 + a1) + (a2 + a3)
    return _F32(_F32(acc[o] + acc[o + 1]) + _F32(acc[o + 2] + acc[o + 3]))


@njit(inline="always", cache=True)
def _lanes_madd2(acc, ao, w, wo, x, xo, d_lo, d_hi):
    # `_lanes_fma2` as a build without FMA computes it (the AVX branches'
    # `_mm256_add_ps(acc, _mm256_mul_ps(..))`): acc + d * float(lane) in
    # two roundings, lane L the exact dot of values 4L..4L+3
    for L in range(8):
        p = np.int32(0)
        for q in range(4):
            p += np.int32(w[wo + 4 * L + q]) * np.int32(x[xo + 4 * L + q])
        acc[ao + L] = _F32(acc[ao + L] + _F32((d_lo if L < 4 else d_hi) * _F32(p)))


@njit(inline="always", cache=True)
def _arm_lanes(w, o, x, lane, ln):
    # ln[0:4] = the 4 int32 lanes of the 32-value dot at o: value p goes to
    # lane[p] (`neon_legacy.LANE_NEON` / `LANE_DOTPROD`), exact
    for L in range(4):
        ln[L] = 0
    for p in range(32):
        ln[lane[p]] += np.int32(w[o + p]) * np.int32(x[o + p])


@njit(inline="always", cache=True)
def _madd(a, b, c, fma):
    # a * b + c as GCC compiles it: one FMA on FMA builds, else two roundings
    if fma:
        return fma32(a, b, c)
    return _F32(_F32(a * b) + c)


@njit(inline="always", cache=True)
def _row_small(kind, path, fma, w, ws, x, xs, xb, sumi, acc):
    # One weight row (w: int8 values, ws: float32 scales per scale group)
    # times one activation row (x: int8 q8, xs: its float32 scales, xb: the
    # Q8_K bsums per 16); module docstring for the orders.
    if kind == _B32:                       # IQ4_NL, MXFP4: groups of 32
        nb = ws.shape[0]
        if path == _AVX2:
            for L in range(16):
                acc[L] = 0.0
            ib = 0
            while ib + 1 < nb:
                d0 = _F32(xs[ib] * ws[ib])
                d1 = _F32(xs[ib + 1] * ws[ib + 1])
                _lanes_fma2(acc, 0, w, 32 * ib, x, 32 * ib, d0, d0)
                _lanes_fma2(acc, 8, w, 32 * ib + 32, x, 32 * ib + 32, d1, d1)
                ib += 2
            for L in range(8):
                acc[L] = _F32(acc[L] + acc[8 + L])
            s = hsum8(acc)
            if ib < nb:
                d = _F32(xs[ib] * ws[ib])
                s = _madd(d, _F32(_bdot(w, 32 * ib, x, 32 * ib)), s, fma)
            return s
        if path == _AVX_PAIRS:
            # the AVX branch (no AVX2): a pair of blocks per step into one
            # 8-lane accumulator, lanes 0-3 the even block, 4-7 the odd one,
            # lane L the dot of values 4L..4L+3 and 16+4L..16+4L+3
            # (`mul_sum_i8_quad_float`), acc + d * lane (contracted on FMA
            # builds), `hsum_float_8`; an odd last block as above
            for L in range(8):
                acc[L] = 0.0
            ib = 0
            while ib + 1 < nb:
                for h in range(2):
                    d = _F32(ws[ib + h] * xs[ib + h])
                    o = 32 * (ib + h)
                    for L in range(4):
                        p = np.int32(0)
                        for q in range(4):
                            p += (np.int32(w[o + 4 * L + q]) * np.int32(x[o + 4 * L + q])
                                  + np.int32(w[o + 16 + 4 * L + q]) * np.int32(x[o + 16 + 4 * L + q]))
                        acc[4 * h + L] = _madd(d, _F32(p), acc[4 * h + L], fma)
                ib += 2
            s = hsum8(acc)
            if ib < nb:
                d = _F32(xs[ib] * ws[ib])
                s = _madd(d, _F32(_bdot(w, 32 * ib, x, 32 * ib)), s, fma)
            return s
        if path == _TINYBLAS:
            for L in range(8):
                acc[L] = 0.0
            for ib in range(nb):
                d = _F32(ws[ib] * xs[ib])
                if fma:
                    _lanes_fma2(acc, 0, w, 32 * ib, x, 32 * ib, d, d)
                else:
                    # llamafile's `madd` without __FMA__: add(mul(..))
                    for L in range(8):
                        p = np.int32(0)
                        for q in range(4):
                            p += np.int32(w[32 * ib + 4 * L + q]) * np.int32(x[32 * ib + 4 * L + q])
                        acc[L] = _F32(acc[L] + _F32(d * _F32(p)))
            return hsum8(acc)
        if path == _NEON_NL or path == _NEON_MX:
            # arch/arm/quants.c: per pair of blocks the exact dots p0, p1 and
            # sumf += d0 dy0 p0 + d1 dy1 p1, contracted by GCC 12 (disassembly,
            # docs/arm64.md): IQ4_NL fma(d0 dy0, p0, round(d1 dy1 p1)),
            # MXFP4 fma(p1, e1 dy1, round(p0 (e0 dy0))); an odd last block
            # sumf += d * sumi taken as fma(d, sumi, sumf)
            s = _F32(0.0)
            ib = 0
            while ib + 1 < nb:
                p0 = _F32(_bdot(w, 32 * ib, x, 32 * ib))
                p1 = _F32(_bdot(w, 32 * ib + 32, x, 32 * ib + 32))
                e0 = _F32(ws[ib] * xs[ib])
                e1 = _F32(ws[ib + 1] * xs[ib + 1])
                if path == _NEON_MX:
                    s = _F32(s + fma32(p1, e1, _F32(p0 * e0)))
                else:
                    s = _F32(s + fma32(e0, p0, _F32(e1 * p1)))
                ib += 2
            if ib < nb:
                s = fma32(_F32(xs[ib] * ws[ib]), _F32(_bdot(w, 32 * ib, x, 32 * ib)), s)
            return s
        s = _F32(0.0)
        for ib in range(nb):
            d = _F32(xs[ib] * ws[ib])
            si = _F32(_bdot(w, 32 * ib, x, 32 * ib))
            if path == _REPACK:
                s = fma32(si, d, s)
            elif path == _REPACK_ARM:
                s = _F32(s + _F32(d * si))
            else:
                s = _madd(d, si, s, fma)
        return s
    if kind == _NV:                        # NVFP4: blocks of 64, scales per 16
        nb = ws.shape[0] // 4
        if path == _NEON_NV:
            # arch/arm/quants.c: lane k of one 4-lane accumulator takes
            # sub-block k of each block, fma(float(dot), ue4m3_k * d_a, lane)
            # (`vfmaq_f32`), then `vaddvq_f32`
            for L in range(4):
                acc[L] = 0.0
            for b in range(nb):
                for h in range(2):
                    o = 64 * b + 32 * h
                    lo, hi = _bdot_halves(w, o, x, o)
                    dy = xs[2 * b + h]
                    acc[2 * h] = fma32(_F32(lo), _F32(ws[4 * b + 2 * h] * dy), acc[2 * h])
                    acc[2 * h + 1] = fma32(_F32(hi), _F32(ws[4 * b + 2 * h + 1] * dy), acc[2 * h + 1])
            return _F32(_F32(acc[0] + acc[1]) + _F32(acc[2] + acc[3]))
        if path == _AVX2:
            # (the AVX branch: the same lanes, unfused without FMA)
            for L in range(8):
                acc[L] = 0.0
            for b in range(nb):
                dy0 = xs[2 * b]
                dy1 = xs[2 * b + 1]
                for h in range(2):
                    o = 64 * b + 32 * h
                    dy = dy0 if h == 0 else dy1
                    d_lo = _F32(ws[4 * b + 2 * h] * dy)
                    d_hi = _F32(ws[4 * b + 2 * h + 1] * dy)
                    if fma:
                        _lanes_fma2(acc, 0, w, o, x, o, d_lo, d_hi)
                    else:
                        _lanes_madd2(acc, 0, w, o, x, o, d_lo, d_hi)
            return hsum8(acc)
        s = _F32(0.0)
        for b in range(nb):
            for h in range(2):
                o = 64 * b + 32 * h
                lo, hi = _bdot_halves(w, o, x, o)
                dy = xs[2 * b + h]
                s = _madd(_F32(dy * ws[4 * b + 2 * h]), _F32(lo), s, fma)
                s = _madd(_F32(dy * ws[4 * b + 2 * h + 1]), _F32(hi), s, fma)
        return s
    if kind == _Q1 or kind == _Q2:         # Q1_0 (128, 4 Q8_0 blocks), Q2_0 (64, 2)
        sub = 4 if kind == _Q1 else 2
        nb = ws.shape[0]
        if path == _NEON_Q or path == _DOTPROD_Q:
            # arch/arm/quants.c: one 4-lane accumulator, per Q8_0 block
            # acc + round(float(lane) * (d_w * d_a)) (`vmlaq_n_f32`, not
            # fused by GCC 12), then `vaddvq_f32`
            lane = _LANE_DOTPROD if path == _DOTPROD_Q else _LANE_NEON
            for L in range(4):
                acc[L] = 0.0
            for b in range(nb):
                for k in range(sub):
                    o = 32 * (sub * b + k)
                    _arm_lanes(w, o, x, lane, sumi)
                    d = _F32(ws[b] * xs[sub * b + k])
                    for L in range(4):
                        acc[L] = _F32(acc[L] + _F32(_F32(sumi[L]) * d))
            return _F32(_F32(acc[0] + acc[1]) + _F32(acc[2] + acc[3]))
        if path == _AVX2:                  # Q1_0 only: Q2_0 has no x86 code
            # (the AVX branch: the same lanes, unfused without FMA)
            for L in range(8):
                acc[L] = 0.0
            for b in range(nb):
                # -0.0 + p == p exactly, so the first FMA is the first multiply
                for L in range(8, 16):
                    acc[L] = -0.0
                for k in range(4):
                    dk = xs[4 * b + k]
                    if fma:
                        _lanes_fma2(acc, 8, w, 128 * b + 32 * k, x, 128 * b + 32 * k, dk, dk)
                    else:
                        _lanes_madd2(acc, 8, w, 128 * b + 32 * k, x, 128 * b + 32 * k, dk, dk)
                if fma:
                    fma8_into(acc, acc, 8, ws[b])
                else:
                    for L in range(8):
                        acc[L] = _F32(acc[L] + _F32(ws[b] * acc[8 + L]))
            return hsum8(acc)
        if path == _SSSE3_Q1:              # Q1_0's SSSE3 branch (sse42, no AVX)
            # four 4-lane accumulators, one per Q8_0 block of a Q1_0 block,
            # lane L the dot of values 4L..4L+3 and 16+4L..16+4L+3, each
            # acc + (d_w * d_a) * float(lane) unfused; `hsum_float_4x4`
            for L in range(16):
                acc[L] = 0.0
            for b in range(nb):
                for k in range(4):
                    o = 128 * b + 32 * k
                    dd = _F32(ws[b] * xs[4 * b + k])
                    for L in range(4):
                        p = np.int32(0)
                        for q in range(4):
                            p += (np.int32(w[o + 4 * L + q]) * np.int32(x[o + 4 * L + q])
                                  + np.int32(w[o + 16 + 4 * L + q]) * np.int32(x[o + 16 + 4 * L + q]))
                        acc[4 * k + L] = _F32(acc[4 * k + L] + _F32(dd * _F32(p)))
            return _F32(_F32(_hadd4(acc, 0) + _hadd4(acc, 4)) + _F32(_hadd4(acc, 8) + _hadd4(acc, 12)))
        s = _F32(0.0)
        for b in range(nb):
            si = _F32(0.0)
            for k in range(sub):
                o = 32 * (sub * b + k)
                si = _madd(xs[sub * b + k], _F32(_bdot(w, o, x, o)), si, fma)
            s = _madd(ws[b], si, s, fma)
        return s
    # _TQ: TQ1_0 / TQ2_0, super-blocks of 256, unsigned codes, Q8_K
    nb = ws.shape[0]
    if path == _AVX2:
        for L in range(8):
            acc[L] = 0.0
        for b in range(nb):
            for L in range(8):
                sumi[L] = 0
            for c in range(8):
                o = 256 * b + 32 * c
                lanes_scaled_add(sumi, w, o, x, o, 1, 1)
            d = _F32(xs[b] * ws[b])
            for L in range(8):
                lane = sumi[L] - (xb[16 * b + 2 * L] + xb[16 * b + 2 * L + 1])
                acc[L] = _madd(_F32(lane), d, acc[L], fma)
        return hsum8(acc)
    s = _F32(0.0)
    for b in range(nb):
        tot = 0
        for c in range(8):
            o = 256 * b + 32 * c
            tot += _bdot(w, o, x, o)
        for j in range(16):
            tot -= xb[16 * b + j]
        s = _madd(_F32(tot), _F32(ws[b] * xs[b]), s, fma)
    return s


@jit
def _rows_small(kind, path, fma, wq, ws, xq, xs, xb, out, r0, r1):
    sumi = np.empty(8, np.int32)
    acc = np.empty(16, np.float32)
    for r in range(r0, r1):
        for t in range(xq.shape[0]):
            out[t, r] = _row_small(kind, path, fma, wq[r], ws[r], xq[t], xs[t], xb[t], sumi, acc)


#: weight rows per parallel task
_ROWS_PER_TASK = 64


@jit(parallel=True)
def _mm_small(kind, path, fma, wq, ws, xq, xs, xb, out, r0, r1):
    """out[t, r] = ggml's dot of block-type weight row r (int8 values wq
    (rows, cols), float32 scales ws (rows, groups)) with activation row t
    (int8 xq (n, cols), float32 scales xs, int32 Q8_K bsums xb (n, cols /
    16) or a dummy), for r0 <= r < r1, `kind` and `path` (module
    docstring); fma: the build contracts C's a * b + c. Tasks of
    `_ROWS_PER_TASK` rows run in parallel."""
    for c in prange((r1 - r0 + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        a = r0 + c * _ROWS_PER_TASK
        _rows_small(kind, path, fma, wq, ws, xq, xs, xb, out, a, min(r1, a + _ROWS_PER_TASK))


# ------------------------------------------------------------------ packing
def _fields(qm):
    return qm.raw.reshape(qm.rows, -1, block_format(qm.type).block_bytes)


def _field(raw3, t, name):
    f = block_format(t).field(name)
    return np.ascontiguousarray(raw3[:, :, f.offset:f.offset + f.nbytes])


def _f16_field(raw3, t, name):
    return F16_TO_F32[_field(raw3, t, name).view(np.uint16)[..., 0]]


def _nibble_values(qs: np.ndarray, table: np.ndarray, half: int) -> np.ndarray:
    """4-bit codes (rows, groups, half) -> int8 values (rows, groups, 2 *
    half) through `table`: value j of a group is the low nibble of byte j,
    value half + j its high nibble (ggml's IQ4_NL / MXFP4 / NVFP4 layout)."""
    return table[np.concatenate([qs & 15, qs >> 4], axis=2)].astype(np.int8)


def _tq1_codes(raw3: np.ndarray) -> np.ndarray:
    """TQ1_0 trits (0..2) in value order, uint8 (rows, blocks, 256), ggml
    `dequantize_row_tq1_0`: trit n of a byte is ((byte * 3^n mod 256) * 3)
    >> 8; qs bytes 0-31 give values 32n + m, bytes 32-47 values 160 + 16n +
    m, the 4 qh bytes values 240 + 4n + m."""
    qs = _field(raw3, T.TQ1_0, "qs").astype(np.int32)
    qh = _field(raw3, T.TQ1_0, "qh").astype(np.int32)
    pow3 = np.array([1, 3, 9, 27, 81], np.int32)

    def trits(b, n):                 # (rows, blocks, width) -> (rows, blocks, n * width)
        q = (b[:, :, None, :] * pow3[None, None, :n, None]) & 255
        return ((q * 3) >> 8).reshape(b.shape[0], b.shape[1], -1)
    return np.concatenate([trits(qs[..., :32], 5), trits(qs[..., 32:], 5), trits(qh, 4)],
                          axis=2).astype(np.uint8)


def _tq2_codes(raw3: np.ndarray) -> np.ndarray:
    """TQ2_0 2-bit codes in value order, uint8 (rows, blocks, 256): value
    128c + 32l + m is bits 2l..2l+1 of qs[32c + m] (`dequantize_row_tq2_0`)."""
    qs = _field(raw3, T.TQ2_0, "qs")
    r, nb, _ = qs.shape
    q = qs.reshape(r, nb, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)
    return (q & 3).reshape(r, nb, 256)


def pack_small(t, raw, rows: int, cols: int):
    """(kind, values, scales) of a block-type matrix: values int8 (rows,
    cols) in natural order (IQ4_NL / MXFP4 / NVFP4 through their value
    tables, Q1_0 as +-1, Q2_0 as code - 1, TQ1_0 / TQ2_0 as the unsigned
    codes that ggml's AVX2 code multiplies), scales float32 (rows, groups)
    per scale group (32, 64 for Q2_0, 128 for Q1_0, 256 for TQ, and 16 for
    NVFP4). raw: uint8 of rows * cols / QK whole blocks. ValueError for
    another type."""
    from ..formats.fp4 import E8M0_HALF, KVALUES_MXFP4, UE4M3_HALF
    from ..formats.iq_tables import KVALUES_IQ4NL
    t = T(t)
    raw3 = np.asarray(raw, np.uint8).reshape(rows, -1, block_format(t).block_bytes)
    c32 = np.ascontiguousarray
    if t == T.IQ4_NL:
        v = _nibble_values(_field(raw3, t, "qs"), KVALUES_IQ4NL, 16)
        return _B32, c32(v.reshape(rows, cols)), c32(_f16_field(raw3, t, "d"))
    if t == T.MXFP4:
        v = _nibble_values(_field(raw3, t, "qs"), KVALUES_MXFP4, 16)
        return _B32, c32(v.reshape(rows, cols)), c32(E8M0_HALF[_field(raw3, t, "e")[..., 0]])
    if t == T.NVFP4:
        qs = _field(raw3, t, "qs").reshape(rows, -1, 8)          # 8 bytes per 16 values
        v = _nibble_values(qs, KVALUES_MXFP4, 8)
        return _NV, c32(v.reshape(rows, cols)), c32(UE4M3_HALF[_field(raw3, t, "d")].reshape(rows, -1))
    if t == T.Q1_0:
        qs = _field(raw3, t, "qs")
        bits = (qs[..., None] >> np.arange(8, dtype=np.uint8)) & 1
        v = (2 * bits.astype(np.int8) - 1).reshape(rows, cols)
        return _Q1, c32(v), c32(_f16_field(raw3, t, "d"))
    if t == T.Q2_0:
        qs = _field(raw3, t, "qs")
        q = (qs[..., None] >> (2 * np.arange(4, dtype=np.uint8))) & 3
        return _Q2, c32((q.astype(np.int8) - 1).reshape(rows, cols)), c32(_f16_field(raw3, t, "d"))
    if t in (T.TQ1_0, T.TQ2_0):
        codes = _tq1_codes(raw3) if t == T.TQ1_0 else _tq2_codes(raw3)
        return _TQ, c32(codes.reshape(rows, cols).view(np.int8)), c32(_f16_field(raw3, t, "d"))
    raise ValueError(f"{t.name} is not a small block type")


SMALL_TYPES = frozenset({T.Q1_0, T.Q2_0, T.MXFP4, T.NVFP4, T.IQ4_NL, T.TQ1_0, T.TQ2_0})


class SmallFamily(Family):
    """Q1_0, Q2_0, MXFP4, NVFP4, IQ4_NL (Q8_0 activations), TQ1_0, TQ2_0
    (Q8_K activations): module docstring."""

    def pack(self, qm):
        return pack_small(qm.type, qm.raw, qm.rows, qm.cols)

    def matmul(self, qm, packed, x, segments, parallel, mmid):
        kind, wq, ws = packed
        isa = qm.profile.isa
        n = x.shape[0]
        if kind == _TQ:
            xq, xs, xb = act_quant.q8_k_fields(x, isa=qm.profile.isa)
        else:
            xq, xs = act_quant.q8_0_fields(x, isa=isa)
            xb = np.zeros((n, 1), np.int32)
        xb = np.ascontiguousarray(xb, np.int32)
        out = np.empty((n, qm.rows), np.float32)
        fma = bool(isa.resolve("FMA"))
        for r0, r1, path in segments:
            variant = kernel(isa, qm.type, path)
            if (variant, qm.type) in _ARM_PATHS:
                code = _ARM_PATHS[(variant, qm.type)]
            elif (variant, qm.type) in _X86_PATHS:
                code = _X86_PATHS[(variant, qm.type)]
            elif variant in _PATH_OF_VARIANT or variant in ("iq4_nl_8x8", "mxfp4_8x8"):
                code = _PATH_OF_VARIANT.get(variant, _REPACK)
            else:
                raise NotImplementedError(f"{qm.type.name}: ggml's {variant} kernel is not emulated yet")
            (_mm_small if parallel else _rows_small)(kind, code, fma, wq, ws, xq, xs, xb, out, r0, r1)
        return out


#: the kernel path of each variant an instruction-set chain names (the
#: repacked layouts `iq4_nl_8x8`, `mxfp4_8x8`: `_REPACK`)
_PATH_OF_VARIANT = {"x86": _AVX2, "generic": _GENERIC, "tinyblas_q0": _TINYBLAS}
#: the arm64 `vec_dot`s written here ("neon" in the chain's VEC_DOT;
#: "dotprod" where the dotprod lanes change the float sums). TQ1_0 / TQ2_0:
#: one exact integer per super-block, `sumf += d * float(sumi)` (contracted
#: by GCC): the generic C's order on an FMA build
_ARM_PATHS = {("neon", T.IQ4_NL): _NEON_NL, ("neon", T.MXFP4): _NEON_MX, ("neon", T.NVFP4): _NEON_NV,
              ("neon", T.Q1_0): _NEON_Q, ("neon", T.Q2_0): _NEON_Q, ("dotprod", T.Q1_0): _DOTPROD_Q,
              ("dotprod", T.Q2_0): _DOTPROD_Q, ("neon", T.TQ1_0): _GENERIC, ("neon", T.TQ2_0): _GENERIC,
              ("iq4_nl_4x4", T.IQ4_NL): _REPACK_ARM, ("mxfp4_4x4", T.MXFP4): _REPACK_ARM}

#: the x86 `vec_dot`s of the builds without AVX2 (arch/x86/quants.c
#: `#elif defined(__AVX__)`) that differ from the AVX2 one in float order
_X86_PATHS = {("avx", T.IQ4_NL): _AVX_PAIRS, ("avx", T.MXFP4): _AVX_PAIRS, ("ssse3", T.Q1_0): _SSSE3_Q1}

FAMILY = SmallFamily()
