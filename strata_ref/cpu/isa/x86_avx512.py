"""The AVX-512 build (ggml's `zen4` variant: the AVX2 set plus AVX-512
F/CD/VL/DQ/BW, VBMI, VNNI and BF16): llama.cpp vendored by
llama-cpp-python 0.3.36, GCC 12.

What AVX-512 decides over the AVX2 code (which it otherwise runs:
`arch/x86/quants.c` has no AVX-512 `vec_dot` the model paths reach, and
VNNI only changes how exact integer sums are formed):

* `simd-mappings.h`: 16-lane `__m512` vectors, `GGML_F32_STEP` 64;
  `GGML_F32x16_REDUCE` adds the four accumulators as (x0 + x2) + (x1 +
  x3), then `_mm512_reduce_add_ps` (GCC: v[8+i] + v[i], then the same
  halving on 8, 4 and 2 lanes); GCC's vectorized tail of
  `ggml_vec_dot_f32` contracts its last elements (fewer than 8).
* `vec.h`: the AVX-512 `ggml_v_expf` (`_mm512_scalef_ps` applies 2^n in one
  rounding) on 16 lanes, each vector summed by `_mm512_reduce_add_ps`.
* `ggml_vec_dot_bf16`: AVX512-BF16's `vdpbf16ps`, two accumulators over
  steps of 64, each lane sum added to a double (`vec_dot_bf16`); tinyBLAS
  16 float lanes, and for BF16 weights `tinyBLAS<32, __m512, __m512bh>`,
  16 lanes of `vdpbf16ps` over steps of 32.
* CPU_REPACK also takes Q2_K (`q2_K_8x8`) with AVX-512.

`vdpbf16ps` (Intel SDM, and checked on the instruction of an AVX512-BF16
CPU, tools/vdpbf16ps_vectors.py): lane j of the accumulator gets the odd
pair's product first, then the even pair's, each added with one rounding
to nearest even; denormal inputs (the bf16 values and the accumulator)
count as zero, and a sum is rounded to 24 bits as if the exponent were
unbounded and flushed to zero when that is below FLT_MIN (`dpbf16`).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .._digest import jit
from ..fp import C1, C2, C3, C4, C5, LN2_HI, LN2_LO, LOG2E, ONE, R, fma32, hsum16
from ..simd import (f8_abs, f8_add, f8_div, f8_fma, f8_from_bits, f8_gt, f8_hsum16, f8_load, f8_mul,
                    f8_select, f8_splat, f8_store, f8_sub, f8_to_i32, f8_zero, i32_add, i32_select, i32_shl,
                    i32_splat, i32_sub)
from ..lanes import _check, _fn, _ptr
from ..vec import load8, rest_in_double
from .x86_avx2 import REPACK as _AVX2_REPACK, vec_dot_f32_tail
from ...types import GGMLType as T

_F32 = np.float32
_INF = _F32(np.inf)
#: smallest normal float32 (vdpbf16ps's DAZ / FTZ threshold)
_FLT_MIN = _F32(1.1754943508222875e-38)

F32_EPR = F16_EPR = 16
F32_STEP = F16_STEP = 64
EXPF_LANES = 16
TINYBLAS = 16
TINYBLAS_BF16 = 32
F32_TAIL_FMA = 8

REPACK = {**_AVX2_REPACK, T.Q2_K: "q2_K_8x8"}


@njit(inline="always", cache=True)
def expf_v(x):
    """`ggml_v_expf`, AVX-512 version, on one float32 lane."""
    z = fma32(x, LOG2E, R)
    n = _F32(z - R)
    b = fma32(-n, LN2_LO, fma32(-n, LN2_HI, x))
    u = _F32(b * b)
    j = fma32(fma32(fma32(C5, b, C4), u, fma32(C3, b, C2)), u, fma32(C1, b, ONE))
    if abs(n) > _F32(192.0):
        return _F32(np.inf) if n > 0 else _F32(0.0)
    # _mm512_scalef_ps(j, n) = j * 2^floor(n), n integral here; one rounding
    return _F32(np.ldexp(np.float64(j), int(n)))


@njit(inline="always", cache=True)
def silu_v(x):
    return _F32(x / _F32(_F32(1.0) + expf_v(_F32(_F32(0.0) - x))))


@njit(inline="always", cache=True)
def _pow2(k):
    """F32x8 of 2^k for int32 lanes k in [-126, 127] (exponent bits)."""
    return f8_from_bits(i32_shl(i32_add(k, i32_splat(127)), 23))


@njit(inline="always", cache=True)
def expf8(x):
    """`expf_v` on 8 lanes. scalef(j, n) is j * 2^(n - m) * 2^m: the first
    product exact, the second rounding once; m = 0 for n in [-126, 127],
    where 2^n is a normal float, m = -100 below (so the first product stays
    normal) and m = 65 above."""
    z = f8_fma(x, f8_splat(LOG2E), f8_splat(R))
    n = f8_sub(z, f8_splat(R))
    neg_n = f8_sub(f8_zero(), n)
    b = f8_fma(neg_n, f8_splat(LN2_LO), f8_fma(neg_n, f8_splat(LN2_HI), x))
    u = f8_mul(b, b)
    j = f8_fma(f8_fma(f8_fma(f8_splat(C5), b, f8_splat(C4)), u, f8_fma(f8_splat(C3), b, f8_splat(C2))), u,
               f8_fma(f8_splat(C1), b, f8_splat(ONE)))
    # lanes with |n| > 192 get inf or 0 below, whatever this computes for them
    big = f8_gt(n, f8_splat(_F32(127.0)))
    small = f8_gt(f8_splat(_F32(-126.0)), n)
    ni = f8_to_i32(f8_select(f8_gt(f8_abs(n), f8_splat(_F32(192.0))), f8_zero(), n))
    m = i32_select(big, i32_splat(65), i32_select(small, i32_splat(-100), i32_splat(0)))
    r = f8_mul(f8_mul(j, _pow2(i32_sub(ni, m))), _pow2(m))
    huge = f8_gt(f8_abs(n), f8_splat(_F32(192.0)))
    over = f8_select(f8_gt(n, f8_zero()), f8_splat(_INF), f8_zero())
    return f8_select(huge, over, r)


@njit(inline="always", cache=True)
def silu8(v):
    return f8_div(v, f8_add(f8_splat(_F32(1.0)), expf8(f8_sub(f8_zero(), v))))


@njit(inline="always", cache=True)
def lane_sum(w, c0):
    """`_mm512_reduce_add_ps` of w[c0:c0+16]."""
    return f8_hsum16(f8_load(w, c0), f8_load(w, c0 + 8))


@njit(inline="always", cache=True)
def reduce_f32(acc):
    """`GGML_F32x16_REDUCE` of four 16-lane accumulators acc[0:64] (x_k =
    acc[16k:16k+16]): (x0 + x2) + (x1 + x3) lane-wise, then
    `_mm512_reduce_add_ps`."""
    for lane in range(16):
        acc[lane] = _F32(_F32(acc[lane] + acc[32 + lane]) + _F32(acc[16 + lane] + acc[48 + lane]))
    return hsum16(acc)


@njit(inline="always", cache=True)
def hsum_cols(acc, d, dst):
    """`_mm512_reduce_add_ps` of acc[0..15] for the columns d..d+7 of acc
    (16+, m), into dst[d:d+8]: t_i = v[8+i] + v[i], u_i = t[4+i] + t[i],
    w_i = u[2+i] + u[i], w0 + w1."""
    t0 = f8_add(f8_load(acc[8], d), f8_load(acc[0], d))
    t1 = f8_add(f8_load(acc[9], d), f8_load(acc[1], d))
    t2 = f8_add(f8_load(acc[10], d), f8_load(acc[2], d))
    t3 = f8_add(f8_load(acc[11], d), f8_load(acc[3], d))
    t4 = f8_add(f8_load(acc[12], d), f8_load(acc[4], d))
    t5 = f8_add(f8_load(acc[13], d), f8_load(acc[5], d))
    t6 = f8_add(f8_load(acc[14], d), f8_load(acc[6], d))
    t7 = f8_add(f8_load(acc[15], d), f8_load(acc[7], d))
    u0 = f8_add(t4, t0)
    u1 = f8_add(t5, t1)
    u2 = f8_add(t6, t2)
    u3 = f8_add(t7, t3)
    f8_store(dst, d, f8_add(f8_add(u2, u0), f8_add(u3, u1)))


@njit(inline="always", cache=True)
def reduce_f32_cols(acc, d, dst):
    """`reduce_f32` of the columns d..d+7 of acc (64, m) into dst[d:d+8]."""
    for lane in range(16):
        x = f8_add(f8_add(f8_load(acc[lane], d), f8_load(acc[32 + lane], d)),
                   f8_add(f8_load(acc[16 + lane], d), f8_load(acc[48 + lane], d)))
        f8_store(acc[lane], d, x)
    hsum_cols(acc, d, dst)


@njit(inline="always", cache=True)
def hsum(acc):
    """`_mm512_reduce_add_ps` of acc[0:16] (tinyBLAS's `hsum(__m512)`)."""
    return hsum16(acc)


@njit(inline="always", cache=True)
def vec_dot_f16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f16` of a[ao:ao+n] and b[bo:bo+n] (`vec.operand`):
    four 16-lane FMA accumulators over steps of 64 (each as two 8-lane
    halves), `GGML_F32x16_REDUCE`, the rest of the row in double."""
    l0, l1, l2, l3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
    h0, h1, h2, h3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
    main = n - n % 64
    for s in range(0, main, 64):
        l0 = f8_fma(load8(a, ao + s), load8(b, bo + s), l0)
        h0 = f8_fma(load8(a, ao + s + 8), load8(b, bo + s + 8), h0)
        l1 = f8_fma(load8(a, ao + s + 16), load8(b, bo + s + 16), l1)
        h1 = f8_fma(load8(a, ao + s + 24), load8(b, bo + s + 24), h1)
        l2 = f8_fma(load8(a, ao + s + 32), load8(b, bo + s + 32), l2)
        h2 = f8_fma(load8(a, ao + s + 40), load8(b, bo + s + 40), h2)
        l3 = f8_fma(load8(a, ao + s + 48), load8(b, bo + s + 48), l3)
        h3 = f8_fma(load8(a, ao + s + 56), load8(b, bo + s + 56), h3)
    return rest_in_double(f8_hsum16(f8_add(f8_add(l0, l2), f8_add(l1, l3)),
                                    f8_add(f8_add(h0, h2), f8_add(h1, h3))), a, ao, b, bo, main, n)


@njit(inline="always", cache=True)
def vec_dot_f32(a, ao, b, bo, n, acc):
    return vec_dot_f32_tail(vec_dot_f16(a, ao, b, bo, n - n % 64, acc), a, ao, b, bo, n, 64, 8)


# ------------------------------------------------------------ vdpbf16ps
def _daz16(builder, v):
    # denormal lanes of <16 x float> v -> zero of the same sign
    v16 = ir.VectorType(ir.FloatType(), 16)
    fabs = _fn(builder, "llvm.fabs.v16f32", v16, [v16])
    csign = _fn(builder, "llvm.copysign.v16f32", v16, [v16, v16])
    tiny = builder.fcmp_ordered("<", builder.call(fabs, [v]), ir.Constant(v16, [float(_FLT_MIN)] * 16))
    return builder.select(tiny, builder.call(csign, [ir.Constant(v16, [0.0] * 16), v]), v)


@intrinsic
def _dpbf16_fast(typingctx, acc, off, a, ai, b, bi):
    """One `vdpbf16ps` step on 16 lanes (`dpbf16`) as vector FMAs, for
    when no intermediate result is +-FLT_MIN: stores the new lanes and
    returns False; else stores nothing and returns True (that result may
    have to be flushed, which `_dpbf16_exact` decides)."""
    _check(acc=(acc, types.float32), a=(a, types.float32), b=(b, types.float32))
    sig = types.boolean(acc, types.intp, a, types.intp, b, types.intp)

    def codegen(context, builder, signature, args):
        A, ao, X, xi, Y, yi = args
        ta, _, tx, _, ty, _ = signature.args
        v16 = ir.VectorType(ir.FloatType(), 16)
        v32 = ir.VectorType(ir.FloatType(), 32)
        xv = builder.load(_ptr(context, builder, tx, X, xi, v32), align=4)
        yv = builder.load(_ptr(context, builder, ty, Y, yi, v32), align=4)
        idx = ir.IntType(32)
        u = ir.Constant(v32, ir.Undefined)
        pa = _ptr(context, builder, ta, A, ao, v16)
        fma = _fn(builder, "llvm.fma.v16f32", v16, [v16, v16, v16])
        fabs = _fn(builder, "llvm.fabs.v16f32", v16, [v16])
        fmin = ir.Constant(v16, [float(_FLT_MIN)] * 16)
        s = _daz16(builder, builder.load(pa, align=4))
        edge = None
        for first in (1, 0):                    # the odd pair, then the even pair
            sel = ir.Constant(ir.VectorType(idx, 16), [2 * j + first for j in range(16)])
            p = _daz16(builder, builder.shuffle_vector(xv, u, sel))
            q = _daz16(builder, builder.shuffle_vector(yv, u, sel))
            s = builder.call(fma, [p, q, s])
            hit = builder.fcmp_ordered("==", builder.call(fabs, [s]), fmin)
            edge = hit if edge is None else builder.or_(edge, hit)
            s = _daz16(builder, s)
        i1x16 = ir.VectorType(ir.IntType(1), 16)
        any_edge = builder.call(_fn(builder, "llvm.vector.reduce.or.v16i1", ir.IntType(1), [i1x16]), [edge])
        with builder.if_then(builder.not_(any_edge)):
            builder.store(s, pa, align=4)
        return any_edge
    return sig, codegen


@njit(inline="always", cache=True)
def _daz(v):
    # a denormal read as zero of its sign
    if abs(v) < _FLT_MIN:
        return _F32(v * _F32(0.0))
    return v


_TINY_TIE = np.float64(_FLT_MIN) - 2.0 ** -151   # half an ulp (unbounded exponent) below FLT_MIN


@njit(inline="always", cache=True)
def _ftz_fma(x, y, c):
    # x * y + c rounded to 24 bits as if the exponent were unbounded, and
    # zero (of the result's sign) when that is below FLT_MIN: vdpbf16ps's
    # rounding and flush (checked on the instruction near FLT_MIN). fma32
    # rounds onto the denormal grid instead, which differs only when it
    # lands on +-FLT_MIN: then the exact sum (TwoSum in double; the product
    # of two bf16 is exact) is compared with the tie point.
    r = fma32(x, y, c)
    ar = abs(r)
    if ar < _FLT_MIN:
        return _F32(r * _F32(0.0))
    if ar == _FLT_MIN:
        p = np.float64(x) * np.float64(y)
        cc = np.float64(c)
        s = p + cc
        bb = s - p
        err = (p - (s - bb)) + (cc - bb)
        if r < 0:
            s, err = -s, -err
        d = s - _TINY_TIE                        # exact: s and the tie are within 2x
        if d < 0 or (d == 0 and err < 0):
            return _F32(r * _F32(0.0))
    return r


@jit
def _dpbf16_exact(acc, off, a, ai, b, bi):
    # `_dpbf16` lane by lane, with the exact flush rule
    for j in range(16):
        s = _ftz_fma(_daz(a[ai + 2 * j + 1]), _daz(b[bi + 2 * j + 1]), _daz(acc[off + j]))
        acc[off + j] = _ftz_fma(_daz(a[ai + 2 * j]), _daz(b[bi + 2 * j]), s)


@njit(inline="always", cache=True)
def dpbf16(acc, off, a, ai, b, bi):
    """One `vdpbf16ps` step: lane j of acc[off:off+16] += a[ai+2j+1] *
    b[bi+2j+1], then += a[ai+2j] * b[bi+2j] (a, b: float32 arrays holding
    bf16 values), each add rounded once (an FMA of the exact product);
    denormal inputs, the accumulator included, read as zero and results
    below FLT_MIN after rounding flushed to zero (module docstring)."""
    if _dpbf16_fast(acc, off, a, ai, b, bi):
        _dpbf16_exact(acc, off, a, ai, b, bi)



@njit(inline="always", cache=True)
def vec_dot_bf16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_bf16`, AVX512-BF16 branch (a, b float32 holding bf16
    values): two `vdpbf16ps` accumulators of 16 lanes (acc[0:32]) over steps
    of 64, each one's `_mm512_reduce_add_ps` added to a double, then the
    rest of the row in double."""
    for lane in range(32):
        acc[lane] = 0.0
    i = 0
    while i + 64 <= n:
        dpbf16(acc, 0, a, ao + i, b, bo + i)
        dpbf16(acc, 16, a, ao + i + 32, b, bo + i + 32)
        i += 64
    tot = np.float64(hsum16(acc[:16]))
    tot += np.float64(hsum16(acc[16:32]))
    for j in range(i, n):
        tot += np.float64(_F32(a[ao + j] * b[bo + j]))
    return _F32(tot)


@njit(inline="always", cache=True)
def tinyblas_bf16(a, ao, b, bo, n, acc):
    """llamafile's tinyBLAS<32, __m512, __m512bh> on BF16 weights: 16 lanes
    of `vdpbf16ps` over steps of 32 (n a multiple of 32), then
    `_mm512_reduce_add_ps`."""
    for lane in range(16):
        acc[lane] = 0.0
    for i in range(0, n, 32):
        dpbf16(acc, 0, a, ao + i, b, bo + i)
    return hsum16(acc)


@njit(inline="always", cache=True)
def tinyblas_dot(a, ao, b, bo, n, acc):
    """llamafile's tinyBLAS<16>: one 16-lane accumulator (two 8-lane
    halves), lane l taking the elements l, l + 16, ... by FMA (n a multiple
    of 16), then `_mm512_reduce_add_ps`."""
    lo = f8_zero()
    hi = f8_zero()
    for s in range(0, n, 16):
        lo = f8_fma(load8(a, ao + s), load8(b, bo + s), lo)
        hi = f8_fma(load8(a, ao + s + 8), load8(b, bo + s + 8), hi)
    return f8_hsum16(lo, hi)
