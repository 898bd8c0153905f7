"""The C library's float functions that ggml-cpu calls one value at a time,
as the builds' glibc computes them (numba, float32 operation for
operation).

ggml's `ggml_vec_tanh_f32` (the `tanh` op: gemma2 / gemma4's final logit
soft-capping) and `ggml_gelu_f32` (its GELU table) call libm's `tanhf`.
The llama.cpp builds here link Debian 12's glibc 2.36, whose `tanhf` is
the old Sun fdlibm one (`sysdeps/ieee754/flt-32/s_tanhf.c` over
`s_expm1f.c`): for 2^-55 <= |x| < 22, with y = |x|,

    |x| >= 1: t = expm1f(2y),  tanh = 1 - 2 / (t + 2)
    |x| <  1: t = expm1f(-2y), tanh = -t / (t + 2)

and `expm1f` reduces x by k ln 2 (ln2_hi 0x3f317180, ln2_lo 0x3717f7d1,
k = (int)(x / ln 2 +- 0.5), or k = +-1 between 0.5 and 1.5 ln 2), then
evaluates the rational approximation with Q1..Q5 = 0xbd088889,
0x3ad00d01, 0xb8a670cd, 0x36867e54, 0xb457edbb on hxs = x * (x / 2) and
puts k back into the exponent.

The x86-64 build of that glibc has no FMA (its baseline), so each `a*b + c`
rounds twice. The aarch64 one is compiled by GCC with contraction, and its
`libm.a` (`__expm1f`, disassembled: `fmadd` / `fmsub` / `fnmsub`) fuses
these sites, each rounding once (`fused`):

* the reduction `hi = x - t*ln2_hi` (exact either way, the product being
  exact; kept for the record);
* every Horner step of r1 = 1 + hxs*(Q1 + hxs*(Q2 + ... + hxs*Q5));
* t = 3 - r1*hfx and the divisor 6 - x*t;
* k = 0: x - (x*e - hxs), the inner difference;
* k != 0: e = x*(e - c) - c; for k = -1, 0.5*(x - e) - 0.5; for k = 1
  and x >= -0.25, 1 + 2*(x - e).

`k` itself (`invln2*x + 0.5`, then truncated) is a product and a sum on
both. Over every float32 in [2^-10, 1) the two forms of `tanhf` differ in
74,530 of 83,886,080 values (one ulp); `fused=False` is, bit for bit, the
x86 glibc 2.36 `tanhf` these builds called (`tests/test_cpu_libm.py`
checks both against the functions themselves where their libm is at
hand). Using this instead of the host's `tanhf` also keeps the x86
profiles independent of the glibc the engine runs on (glibc 2.41 replaced
`tanhf` by a correctly rounded one).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .fp import bits_f32, f32_bits, fma32

__all__ = ["expm1f", "tanhf", "tanhf_array"]

_F32 = np.float32
_ONE = _F32(1.0)
_TWO = _F32(2.0)
_HALF = _F32(0.5)
_HUGE = _F32(1.0e30)
_TINY = _F32(1.0e-30)


def _f(bits: int) -> np.float32:
    """The float32 of bit pattern `bits` (the constants' hexadecimal spelling)."""
    return np.array([bits], np.uint32).view(np.float32)[0]


_LN2_HI = _f(0x3F317180)
_LN2_LO = _f(0x3717F7D1)
_INVLN2 = _f(0x3FB8AA3B)
_O_THRESHOLD = _f(0x42B17180)
_Q1 = _f(0xBD088889)
_Q2 = _f(0x3AD00D01)
_Q3 = _f(0xB8A670CD)
_Q4 = _f(0x36867E54)
_Q5 = _f(0xB457EDBB)


@njit(inline="always", cache=True)
def _madd(a, b, c, fused):
    # a*b + c: one rounding where GCC fused it, else two
    return fma32(a, b, c) if fused else _F32(_F32(a * b) + c)


@njit(inline="always", cache=True)
def _f32_pow2_127():
    return bits_f32(np.int32(0x7F000000))


@njit(cache=True)
def expm1f(x, fused):
    """glibc 2.36 `__expm1f` (module docstring): float32 x -> float32
    e^x - 1; fused: the aarch64 build's contractions."""
    x = _F32(x)
    hx = np.int64(f32_bits(x)) & 0xFFFFFFFF
    neg = hx >= 0x80000000
    hx &= 0x7FFFFFFF
    if hx >= 0x4195B844:                        # |x| >= 27 ln 2
        if hx >= 0x42B17218:                    # |x| >= 88.72...
            if hx > 0x7F800000:
                return _F32(x + x)               # NaN
            if hx == 0x7F800000:
                return x if not neg else _F32(-1.0)
            if x > _O_THRESHOLD:
                return _F32(_HUGE * _HUGE)      # overflow: inf
        if neg:
            return _F32(_TINY - _ONE)           # -1
    c = _F32(0.0)
    if hx > 0x3EB17218:                         # |x| > 0.5 ln 2
        if hx < 0x3F851592:                     # and < 1.5 ln 2
            if not neg:
                hi = _F32(x - _LN2_HI)
                lo = _LN2_LO
                k = 1
            else:
                hi = _F32(x + _LN2_HI)
                lo = _F32(-_LN2_LO)
                k = -1
        else:
            k = int(_F32(_F32(_INVLN2 * x) + (_F32(-0.5) if neg else _HALF)))
            t = _F32(k)
            hi = _madd(_F32(-t), _LN2_HI, x, fused)
            lo = _F32(t * _LN2_LO)
        x = _F32(hi - lo)
        c = _F32(_F32(hi - x) - lo)
    elif hx < 0x33000000:                       # |x| < 2^-25
        return x
    else:
        k = 0
    hfx = _F32(_HALF * x)
    hxs = _F32(x * hfx)
    r1 = _madd(hxs, _Q5, _Q4, fused)
    r1 = _madd(r1, hxs, _Q3, fused)
    r1 = _madd(r1, hxs, _Q2, fused)
    r1 = _madd(r1, hxs, _Q1, fused)
    r1 = _madd(r1, hxs, _ONE, fused)
    t = _madd(_F32(-r1), hfx, _F32(3.0), fused)
    den = _madd(_F32(-x), t, _F32(6.0), fused)
    e = _F32(hxs * _F32(_F32(r1 - t) / den))
    if k == 0:
        return _F32(x - _madd(x, e, _F32(-hxs), fused))
    e = _madd(_F32(e - c), x, _F32(-c), fused)
    e = _F32(e - hxs)
    if k == -1:
        return _madd(_F32(x - e), _HALF, _F32(-0.5), fused)
    if k == 1:
        if x < _F32(-0.25):
            return _F32(_F32(-2.0) * _F32(e - _F32(x + _HALF)))
        return _madd(_F32(x - e), _TWO, _ONE, fused)
    if k <= -2 or k > 56:
        y = _F32(_ONE - _F32(e - x))
        if k == 128:
            y = _F32(_F32(y * _TWO) * _f32_pow2_127())
        else:
            y = bits_f32(np.int32(f32_bits(y) + (k << 23)))
        return _F32(y - _ONE)
    if k < 23:
        t = bits_f32(np.int32(0x3F800000 - (0x1000000 >> k)))   # 1 - 2^-k
        y = _F32(t - _F32(e - x))
    else:
        t = bits_f32(np.int32((0x7F - k) << 23))                 # 2^-k
        y = _F32(_F32(x - _F32(e + t)) + _ONE)
    return bits_f32(np.int32(f32_bits(y) + (k << 23)))


@njit(cache=True)
def tanhf(x, fused):
    """glibc 2.36 `__tanhf` (module docstring) over `expm1f`: float32 x ->
    float32 tanh(x); fused: the aarch64 build's `expm1f`."""
    x = _F32(x)
    jx = f32_bits(x)
    ix = np.int64(jx) & 0x7FFFFFFF
    if ix >= 0x7F800000:                        # inf or NaN
        return _F32(_F32(_ONE / x) + _ONE) if jx >= 0 else _F32(_F32(_ONE / x) - _ONE)
    if ix < 0x41B00000:                         # |x| < 22
        if ix == 0:
            return x
        if ix < 0x24000000:                     # |x| < 2^-55
            return _F32(x * _F32(_ONE + x))
        y = abs(x)
        if ix >= 0x3F800000:                    # |x| >= 1
            t = expm1f(_F32(_TWO * y), fused)
            z = _F32(_ONE - _F32(_TWO / _F32(t + _TWO)))
        else:
            t = expm1f(_F32(_F32(-2.0) * y), fused)
            z = _F32(_F32(-t) / _F32(t + _TWO))
    else:
        z = _F32(_ONE - _TINY)
    return z if jx >= 0 else _F32(-z)


@njit(cache=True)
def _tanhf_into(x, fused, out):
    for i in range(x.size):
        out[i] = tanhf(x[i], fused)


def tanhf_array(x, fused: bool) -> np.ndarray:
    """`tanhf` of every value of x (any shape, converted to float32 as a
    float32 `ggml_tanh` input would be), as a new float32 array of x's
    shape. fused: True for the aarch64 glibc, False for the x86-64 one (a
    bool; TypeError otherwise)."""
    if not isinstance(fused, (bool, np.bool_)):
        raise TypeError(f"tanhf_array: fused must be a bool, got {type(fused).__name__}")
    x = np.asarray(x, np.float32)
    out = np.empty(x.shape, np.float32)
    _tanhf_into(np.ascontiguousarray(x).reshape(-1), bool(fused), out.reshape(-1))
    return out
