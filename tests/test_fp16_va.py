"""Arm's FP16 vector arithmetic (`strata_ref.cpu.fp16_va`) against an
independent rounding: the exact value (fractions) to the nearest binary16,
ties to even, found among all finite binary16 values; overflow to
infinity past 65520 (65504 + half an ulp)."""
from __future__ import annotations

from bisect import bisect_left
from fractions import Fraction

import numpy as np

from strata_ref.cpu import fp16_va

_ALL = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)   # +0 .. 65504
_POS = [Fraction(float(v)) for v in _ALL]


def _nearest_f16(x: Fraction) -> float:
    """The binary16 nearest to x (ties to even), as a float; +-inf past
    the largest value's half ulp."""
    sign = -1.0 if x < 0 else 1.0
    a = abs(x)
    if a >= Fraction(65520):
        return sign * np.inf
    i = bisect_left(_POS, a)
    if i < len(_POS) and _POS[i] == a:
        return sign * float(_POS[i])
    lo, hi = _POS[i - 1], _POS[i]
    if a - lo < hi - a or (a - lo == hi - a and (i - 1) % 2 == 0):
        return sign * float(lo)
    return sign * float(hi)


def _f16(v) -> np.float32:
    return np.float32(np.float16(v))


def test_fma16_and_add16_round_once_to_binary16():
    rng = np.random.default_rng(0)
    cases = [(_f16(1 + 2 ** -10), _f16(1 + 2 ** -10), _f16(2048)),     # just above the tie 2049: 2050
             (_f16(1.5), _f16(1.0), _f16(2048.0)),                     # 2049.5: rounds up to 2050
             (_f16(1.0), _f16(1.0), _f16(2048.0)),                     # 2049: tie, to even 2048
             (_f16(3.0), _f16(1.0), _f16(2048.0)),                     # 2051: tie, to even 2052
             (_f16(256.0), _f16(256.0), _f16(0.0)),                    # 65536: overflow
             (_f16(255.9), _f16(255.9), _f16(0.0)),                    # near the top
             (_f16(2 ** -12), _f16(2 ** -12), _f16(0.0)),              # 2^-24: the smallest subnormal
             (_f16(2 ** -12), _f16(2 ** -13), _f16(0.0)),              # 2^-25: tie with 0, to even 0
             (_f16(-1.0), _f16(1.0), _f16(1.0))]                       # +0
    vals = _f16(rng.standard_normal(900) * np.exp2(rng.integers(-12, 8, 900)))
    cases += [tuple(vals[i:i + 3]) for i in range(0, 900, 3)]
    for a, b, c in cases:
        want = _nearest_f16(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))
        got = fp16_va.fma16(a, b, c)
        assert np.float32(got).view(np.uint32) == np.float32(want).view(np.uint32), (a, b, c, got, want)
        want = _nearest_f16(Fraction(float(a)) + Fraction(float(c)))
        got = fp16_va.add16(a, c)
        assert np.float32(got).view(np.uint32) == np.float32(want).view(np.uint32), (a, c, got, want)


def test_vec_dot_f16_accumulates_in_binary16():
    # 32 products of 1 * 2^-11 on a lane already at 1: each FMA rounds
    # back to 1 in binary16 (the ulp at 1 is 2^-10; 1 + 2^-11 is a tie,
    # to even 1), where float32 lanes would keep them
    n = 64
    x = np.ones(n, np.float32)
    y = np.full(n, np.float32(2 ** -11))
    y[:32] = 1.0                          # lanes start at 1 after the first step
    acc = np.empty(64, np.float32)
    got = fp16_va.vec_dot_f16(x, 0, y, 0, n, acc)
    # each of the 32 lanes holds 1 (the second step's 2^-11 lost): the
    # binary16 reduction 1+1, 2+2 -> 4 per lane of x0, halves 8 each, sum 32
    assert got == np.float32(32.0)
    assert np.float32(np.sum(x.astype(np.float64) * y)) == np.float32(32 + 32 * 2 ** -11)
    # tinyBLAS<8, float16x8_t>: the same loss on its 8 lanes
    got = fp16_va.tinyblas_f16x8(x, 0, y, 0, n, acc)
    assert got == np.float32(32.0)
