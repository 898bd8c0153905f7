"""The x86-64 baseline build (ggml's `x64` variant: SSE2, no FMA, no F16C):
llama.cpp vendored by llama-cpp-python 0.3.36, GCC 12.

What SSE2 changes over the portable C code: `vec.h`'s `__SSE2__` branch of
`ggml_v_expf` / `ggml_v_silu` (the Arm optimized-routines exponential on
4 lanes, with a separate multiply and add where the AVX2 version has an
FMA), which `ggml_vec_soft_max_f32`, `ggml_vec_silu_f32` and
`ggml_vec_swiglu_f32` run on whole vectors of 4, summing each vector's
lanes as `(v0 + v1) + (v2 + v3)`. Everything else (the dots, the
activation quantizers, every weight type's `vec_dot`) is the generic code:
`arch/x86/quants.c` has no SSE2-only branch that the model paths reach.

`expf_bits` / `expf8_bits` are the algorithm of both the SSE2 and the
AVX2 version (`fused`: with the AVX2 build's FMAs); `x86_avx2` takes them
with `fused=True`.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..fp import (C1, C2, C3, C4, C5, LN2_HI, LN2_LO, LOG2E, ONE_BITS, R, bits_f32, f32_bits, fma32,
                  hsum4)
from ..simd import (f8_abs, f8_add, f8_bits, f8_div, f8_fma, f8_from_bits, f8_gt, f8_le, f8_mul,
                    f8_select, f8_splat, f8_sub, f8_zero, i32_add, i32_select, i32_shl, i32_splat,
                    i32_sub)

_F32 = np.float32

EXPF_LANES = 4


@njit(inline="always", cache=True)
def expf_bits(x, fused):
    """`ggml_v_expf` of the SSE2 build (fused False) and the AVX2 build
    (fused True) on one float32 lane: n = round(x log2 e) by the 0x1.8p23
    shift, b = x - n ln2 in two parts, a degree-5 polynomial j, and 2^n
    built in the exponent bits, scaled in two steps near over- and
    underflow (|n| > 126), saturated beyond |n| > 192."""
    if fused:
        z = fma32(x, LOG2E, R)
    else:
        z = _F32(_F32(x * LOG2E) + R)
    n = _F32(z - R)
    if fused:
        b = fma32(-n, LN2_LO, fma32(-n, LN2_HI, x))
    else:
        b = _F32(_F32(x - _F32(n * LN2_HI)) - _F32(n * LN2_LO))
    zb = f32_bits(z)
    e = np.int32(np.uint32(np.uint32(zb) << np.uint32(23)) & np.uint32(0xFFFFFFFF))
    k = bits_f32(np.int32(np.uint32((np.uint32(e) + np.uint32(ONE_BITS)) & np.uint32(0xFFFFFFFF))))
    u = _F32(b * b)
    if fused:
        j = fma32(fma32(fma32(C5, b, C4), u, fma32(C3, b, C2)), u, _F32(C1 * b))
    else:
        j = _F32(_F32(_F32(_F32(_F32(C5 * b) + C4) * u) + _F32(_F32(C3 * b) + C2)) * u)
        j = _F32(j + _F32(C1 * b))
    an = abs(n)
    if an > _F32(192.0):
        g = np.uint32(0x82000000) if n <= _F32(0.0) else np.uint32(0)
        s1 = bits_f32(np.int32((g + np.uint32(0x7F000000)) & np.uint32(0xFFFFFFFF)))
        return _F32(s1 * s1)
    if an > _F32(126.0):
        g = np.uint32(0x82000000) if n <= _F32(0.0) else np.uint32(0)
        s1 = bits_f32(np.int32((g + np.uint32(0x7F000000)) & np.uint32(0xFFFFFFFF)))
        s2 = bits_f32(np.int32((np.uint32(e) - g) & np.uint32(0xFFFFFFFF)))
        t = fma32(s2, j, s2) if fused else _F32(_F32(s2 * j) + s2)
        return _F32(t * s1)
    return fma32(k, j, k) if fused else _F32(_F32(k * j) + k)


@njit(inline="always", cache=True)
def expf8_bits(x, fused):
    """`expf_bits` on the 8 lanes of an F32x8, the branches taken per lane
    by masks (as ggml's vector code does); the same bits in every lane."""
    if fused:
        z = f8_fma(x, f8_splat(LOG2E), f8_splat(R))
    else:
        z = f8_add(f8_mul(x, f8_splat(LOG2E)), f8_splat(R))
    n = f8_sub(z, f8_splat(R))
    if fused:
        neg_n = f8_sub(f8_zero(), n)
        b = f8_fma(neg_n, f8_splat(LN2_LO), f8_fma(neg_n, f8_splat(LN2_HI), x))
    else:
        b = f8_sub(f8_sub(x, f8_mul(n, f8_splat(LN2_HI))), f8_mul(n, f8_splat(LN2_LO)))
    e = i32_shl(f8_bits(z), 23)
    k = f8_from_bits(i32_add(e, i32_splat(ONE_BITS)))
    u = f8_mul(b, b)
    if fused:
        j = f8_fma(f8_fma(f8_fma(f8_splat(C5), b, f8_splat(C4)), u, f8_fma(f8_splat(C3), b, f8_splat(C2))), u,
                   f8_mul(f8_splat(C1), b))
    else:
        j = f8_mul(f8_add(f8_mul(f8_add(f8_mul(f8_splat(C5), b), f8_splat(C4)), u),
                          f8_add(f8_mul(f8_splat(C3), b), f8_splat(C2))), u)
        j = f8_add(j, f8_mul(f8_splat(C1), b))
    an = f8_abs(n)
    # g = 0x82000000 where n <= 0, else 0; s1 = bits(g + 0x7F000000)
    g = i32_select(f8_le(n, f8_zero()), i32_splat(np.int32(-2113929216)), i32_splat(0))
    s1 = f8_from_bits(i32_add(g, i32_splat(0x7F000000)))
    far = f8_mul(s1, s1)
    s2 = f8_from_bits(i32_sub(e, g))
    t = f8_fma(s2, j, s2) if fused else f8_add(f8_mul(s2, j), s2)
    near = f8_mul(t, s1)
    normal = f8_fma(k, j, k) if fused else f8_add(f8_mul(k, j), k)
    return f8_select(f8_gt(an, f8_splat(_F32(192.0))), far,
                     f8_select(f8_gt(an, f8_splat(_F32(126.0))), near, normal))


@njit(inline="always", cache=True)
def expf_v(x):
    """`ggml_v_expf`, SSE2 version, one lane."""
    return expf_bits(x, False)


@njit(inline="always", cache=True)
def silu_v(x):
    """`ggml_v_silu`, SSE2 version: x / (1 + expf_v(0 - x))."""
    return _F32(x / _F32(_F32(1.0) + expf_bits(_F32(_F32(0.0) - x), False)))


@njit(inline="always", cache=True)
def expf8(v):
    return expf8_bits(v, False)


@njit(inline="always", cache=True)
def silu8(v):
    return f8_div(v, f8_add(f8_splat(_F32(1.0)), expf8_bits(f8_sub(f8_zero(), v), False)))


@njit(inline="always", cache=True)
def lane_sum(w, c0):
    """The SSE2 sum of the 4 lanes w[c0:c0+4] in `ggml_vec_soft_max_f32`
    (shuffle, add, movehl, add_ss): (v0 + v1) + (v2 + v3)."""
    return hsum4(w, c0)
