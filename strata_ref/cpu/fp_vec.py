"""ggml-cpu's vector exp and SiLU (`fp.expf_v`, `fp.silu_v`) on 8 float32
lanes at once (`simd.F32x8`), for the loops that apply them to whole rows
(SwiGLU, soft_max).

Every lane gets exactly the float32 operations of the scalar function of
its build (`fp`), in the same order; the branches of the scalar code (the
overflow and underflow cases of `ggml_v_expf`) are computed for every lane
and chosen per lane by masks, as ggml's own vector code does. So each lane
equals `fp.expf_v(x, arch)` bit for bit, which the tests check on every
float32 exponent range.

The AVX-512 build scales by `_mm512_scalef_ps(j, n)`: j * 2^n rounded once.
Here it is a multiplication by the power of two 2^(n - m), exact, then by
2^m, which rounds once: m = 0 for n in [-126, 127], where 2^n is a normal
float; m = -100 below (so the first product stays normal) and m = 65 above.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .fp import _C1, _C2, _C3, _C4, _C5, _LN2_HI, _LN2_LO, _LOG2E, _ONE, _ONE_BITS, _R
from .simd import (f8_abs, f8_add, f8_bits, f8_div, f8_fma, f8_from_bits, f8_gt, f8_le, f8_mul, f8_select,
                   f8_splat, f8_sub, f8_to_i32, f8_zero, i32_add, i32_or, i32_select, i32_shl, i32_splat,
                   i32_sub)

__all__ = ["expf8", "silu8"]

_F32 = np.float32
_INF = _F32(np.inf)


@njit(inline="always", cache=True)
def _pow2(k):
    """F32x8 of 2^k for int32 lanes k in [-126, 127] (exponent bits)."""
    return f8_from_bits(i32_shl(i32_add(k, i32_splat(127)), 23))


@njit(inline="always", cache=True)
def _expf8_avx512(x):
    z = f8_fma(x, f8_splat(_LOG2E), f8_splat(_R))
    n = f8_sub(z, f8_splat(_R))
    neg_n = f8_sub(f8_zero(), n)
    b = f8_fma(neg_n, f8_splat(_LN2_LO), f8_fma(neg_n, f8_splat(_LN2_HI), x))
    u = f8_mul(b, b)
    j = f8_fma(f8_fma(f8_fma(f8_splat(_C5), b, f8_splat(_C4)), u, f8_fma(f8_splat(_C3), b, f8_splat(_C2))), u,
               f8_fma(f8_splat(_C1), b, f8_splat(_ONE)))
    # scalef(j, n) as j * 2^(n - m) * 2^m (module docstring); lanes with
    # |n| > 192 get inf or 0 below, whatever this computes for them
    big = f8_gt(n, f8_splat(_F32(127.0)))
    small = f8_gt(f8_splat(_F32(-126.0)), n)
    ni = f8_to_i32(f8_select(f8_gt(f8_abs(n), f8_splat(_F32(192.0))), f8_zero(), n))
    m = i32_select(big, i32_splat(65), i32_select(small, i32_splat(-100), i32_splat(0)))
    r = f8_mul(f8_mul(j, _pow2(i32_sub(ni, m))), _pow2(m))
    huge = f8_gt(f8_abs(n), f8_splat(_F32(192.0)))
    over = f8_select(f8_gt(n, f8_zero()), f8_splat(_INF), f8_zero())
    return f8_select(huge, over, r)


@njit(inline="always", cache=True)
def _expf8_bits(x, fused):
    # ggml_v_expf of the AVX2 (fused) and SSE2 builds, `fp._expf_bits` per lane
    if fused:
        z = f8_fma(x, f8_splat(_LOG2E), f8_splat(_R))
    else:
        z = f8_add(f8_mul(x, f8_splat(_LOG2E)), f8_splat(_R))
    n = f8_sub(z, f8_splat(_R))
    if fused:
        neg_n = f8_sub(f8_zero(), n)
        b = f8_fma(neg_n, f8_splat(_LN2_LO), f8_fma(neg_n, f8_splat(_LN2_HI), x))
    else:
        b = f8_sub(f8_sub(x, f8_mul(n, f8_splat(_LN2_HI))), f8_mul(n, f8_splat(_LN2_LO)))
    e = i32_shl(f8_bits(z), 23)
    k = f8_from_bits(i32_add(e, i32_splat(_ONE_BITS)))
    u = f8_mul(b, b)
    if fused:
        j = f8_fma(f8_fma(f8_fma(f8_splat(_C5), b, f8_splat(_C4)), u, f8_fma(f8_splat(_C3), b, f8_splat(_C2))), u,
                   f8_mul(f8_splat(_C1), b))
    else:
        j = f8_mul(f8_add(f8_mul(f8_add(f8_mul(f8_splat(_C5), b), f8_splat(_C4)), u),
                          f8_add(f8_mul(f8_splat(_C3), b), f8_splat(_C2))), u)
        j = f8_add(j, f8_mul(f8_splat(_C1), b))
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
def expf8(x, arch):
    """`fp.expf_v(x, arch)` on each lane of the F32x8 x (arch: 0 SSE2, 1
    AVX2, 2 AVX-512)."""
    if arch == 2:
        return _expf8_avx512(x)
    return _expf8_bits(x, arch == 1)


@njit(inline="always", cache=True)
def silu8(x, arch):
    """`fp.silu_v(x, arch)` on each lane: x / (1 + expf_v(0 - x))."""
    return f8_div(x, f8_add(f8_splat(_F32(1.0)), expf8(f8_sub(f8_zero(), x), arch)))


del i32_or
