"""Arm's FP16 vector arithmetic (`__ARM_FEATURE_FP16_VECTOR_ARITHMETIC`),
emulated exactly: the half-precision FMA and add of `vfmaq_f16` /
`vaddq_f16`, and the two ggml-cpu dots built from them (llama.cpp vendored
by llama-cpp-python 0.3.36; docs/arm64.md "Vector mappings").

* `fma16(a, b, c)`: binary16 a*b + c rounded once to binary16 (round to
  nearest even, overflow to infinity, subnormals kept: Arm's FPCR default
  for these builds, FZ16 clear). a*b is exact in double; the sum is taken
  in double with its rounding error (TwoSum), which settles the one case
  double rounding could get wrong (a double that lands on a binary16 tie).
* `add16(a, b)`: binary16 a + b rounded once (exact in double first).
* `mul16(a, b)`: binary16 a * b rounded once (`vmulq_f16` lane; the
  product of two binary16 values is exact in double).
* `vec_dot_f16(a, ao, b, bo, n, acc)`: `ggml_vec_dot_f16` (`vec.cpp`) over
  the FP16 macros of `simd-mappings.h` (`GGML_F16_STEP` 32, `GGML_F16_EPR`
  8): four 8-lane binary16 accumulators, `vfmaq_f16` per step,
  `GGML_F16x8_REDUCE` (x0 += x2, x1 += x3, x0 += x1 lane-wise in binary16,
  then the low and high halves of x0 widened to float32 and added
  lane-wise, then `vaddvq_f32`: (t0 + t1) + (t2 + t3)), the result
  widened to double and the last n % 32 products (each rounded to float32)
  added in double.
* `tinyblas_f16x8(a, ao, b, bo, n, acc)`: llamafile's `tinyBLAS<8,
  float16x8_t, float16x8_t, ggml_fp16_t, ggml_fp16_t, float>`
  (`llamafile/sgemm.cpp`): one 8-lane binary16 accumulator per output,
  lane l the `vfmaq_f16` chain over elements l, l + 8, ... (n a multiple
  of 8), then its `hsum(float16x8_t)`: low + high halves in float32,
  `vaddvq_f32`.

The operands are float32 arrays holding binary16 values, or binary16 bits
(uint16, `vec.operand`); accumulators are kept as float32 holding binary16
values (exact). Every function is numba, inlined into its caller.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .fp import sum8_halves
from .vec import operand, rest_in_double

__all__ = ["round_f16", "fma16", "add16", "mul16", "vec_dot_f16", "tinyblas_f16x8"]

_F32 = np.float32
_F64 = np.float64
_F16_MIN_EXP = -13          # frexp exponent of binary16's smallest normal, 2^-14
_F16_MAX = 65504.0


@njit(inline="always", cache=True)
def round_f16(r, err):
    """The binary16 nearest (ties to even) to r + err, as float32, where r
    is a double and err the exact error of r (r = RN(r + err), |err| at
    most half an ulp of r): only where r is a binary16 tie does err decide.
    Infinite or NaN r is returned as it is."""
    if not math.isfinite(r):
        return _F32(r)
    neg = r < 0.0
    ar = -r if neg else r
    aerr = -err if neg else err
    if ar == 0.0:
        return _F32(r)
    m, e = math.frexp(ar)
    q = math.ldexp(1.0, max(e, _F16_MIN_EXP) - 11)
    y = ar / q                       # exact: a power-of-two scaling
    fl = math.floor(y)
    frac = y - fl
    if frac > 0.5 or (frac == 0.5 and (aerr > 0.0 or (aerr == 0.0 and fl % 2.0 == 1.0))):
        fl += 1.0
    out = fl * q
    if out > _F16_MAX:
        out = math.inf
    return _F32(-out if neg else out)


@njit(inline="always", cache=True)
def fma16(a, b, c):
    """binary16 a*b + c, one rounding (`vfmaq_f16` lane): float32 operands
    holding binary16 values, float32 result holding one."""
    p = _F64(a) * _F64(b)            # exact: 11-bit significands
    cc = _F64(c)
    s = p + cc
    bb = s - p
    err = (p - (s - bb)) + (cc - bb)
    return round_f16(s, err)


@njit(inline="always", cache=True)
def add16(a, b):
    """binary16 a + b, one rounding (`vaddq_f16` lane); the double sum of
    two binary16 values is exact."""
    return round_f16(_F64(a) + _F64(b), 0.0)


@njit(inline="always", cache=True)
def mul16(a, b):
    """binary16 a * b, one rounding (`vmulq_f16` lane); the double product
    of two binary16 values is exact."""
    return round_f16(_F64(a) * _F64(b), 0.0)


@njit(inline="always", cache=True)
def vec_dot_f16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f16` with FP16 vector arithmetic (module docstring) of
    a[ao:ao+n] and b[bo:bo+n]; acc: float32 scratch of 32 or more lanes.
    float32."""
    main = n - n % 32
    for i in range(32):
        acc[i] = _F32(0.0)
    for s in range(0, main, 32):
        for i in range(32):
            acc[i] = fma16(operand(a, ao + s + i), operand(b, bo + s + i), acc[i])
    for i in range(8):                        # x0 += x2, x1 += x3, x0 += x1
        acc[i] = add16(acc[i], acc[16 + i])
        acc[8 + i] = add16(acc[8 + i], acc[24 + i])
        acc[i] = add16(acc[i], acc[8 + i])
    return rest_in_double(sum8_halves(acc), a, ao, b, bo, main, n)


@njit(inline="always", cache=True)
def tinyblas_f16x8(a, ao, b, bo, n, acc):
    """llamafile's `tinyBLAS<8, float16x8_t>` dot (module docstring) of
    a[ao:ao+n] and b[bo:bo+n], n a multiple of 8; acc: float32 scratch of 8
    or more lanes. float32."""
    for i in range(8):
        acc[i] = _F32(0.0)
    for s in range(0, n, 8):
        for i in range(8):
            acc[i] = fma16(operand(a, ao + s + i), operand(b, bo + s + i), acc[i])
    return sum8_halves(acc)      # vaddvq_f32 of vcvt_f32_f16(low) + (high)
