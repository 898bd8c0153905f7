"""numerics: every conversion against an independent implementation written here."""
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from strata_ref import numerics as nm

SPECIAL_F32 = np.array([
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
    0x7F800001, 0xFF812345, 0x7FFFFFFF, 0x00000001, 0x80000001, 0x007FFFFF,
    0x00800000, 0x3F800000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001,
    0x47800000, 0x38800000, 0x387FFFFF, 0x33000000, 0x33000001, 0x337FFFFF,
    0x33800000, 0x33C00000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F808000, 0x3F818000,
    0x3F80FFFF, 0x7F7F8000, 0x7F7FFFFF, 0xC0490FDB,
], dtype=np.uint32)


def _patterns(n, seed):
    r = np.random.default_rng(seed)
    return np.concatenate([SPECIAL_F32, r.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)])


# ---------------------------------------------------------------- fp16 -> f32
def _ref_f16_to_f32_bits(h: int) -> int:
    """Bit-level fp16 -> f32 from the IEEE definition; NaNs quieted like ggml."""
    s, e, m = h >> 15, (h >> 10) & 31, h & 1023
    if e == 31:
        return (s << 31) | 0x7F800000 | (m << 13) | (0x400000 if m else 0)
    if e == 0:
        if m == 0:
            return s << 31
        v = Fraction(m, 1 << 24)
    else:
        v = Fraction(1024 + m, 1024) * Fraction(2) ** (e - 15)
    return int(np.array(float(v) * (-1 if s else 1), np.float32).view(np.uint32))


def test_f16_to_f32_all_patterns():
    got = nm.F16_TO_F32.view(np.uint32)
    want = np.array([_ref_f16_to_f32_bits(h) for h in range(65536)], np.uint32)
    assert np.array_equal(got, want)
    # the signalling NaN of formats.md §4 is quieted, numpy's astype is not
    assert got[0x7C01] == 0x7FC02000
    assert nm.f16_bits_to_f32(np.array([0x3C00, 0x8000, 0x0001])).view(np.uint32).tolist() == [
        0x3F800000, 0x80000000, 0x33800000]


# ---------------------------------------------------------------- f32 -> f16
def _ref_f32_to_f16(u: np.ndarray) -> np.ndarray:
    """RNE via float64 significand scaling and np.rint (half-even), not bits."""
    with np.errstate(invalid="ignore"):
        x = u.view(np.float32).astype(np.float64)
    sign = np.where(u >> 31, 0x8000, 0).astype(np.int64)
    a = np.abs(x)
    out = np.zeros(u.shape, np.int64)
    fin = np.isfinite(a)
    _, e = np.frexp(np.where(fin, a, 1.0))
    E = e - 1                                          # a = 1.f * 2^E
    sub = fin & (a < 2.0 ** -14)
    k_sub = np.rint(np.where(sub, a, 0) * 2.0 ** 24).astype(np.int64)   # units of 2^-24
    with np.errstate(invalid="ignore"):
        k = np.rint(np.where(fin & ~sub, a, 1.0) * np.exp2(10.0 - E)).astype(np.int64)
    carry = k == 2048
    E = np.where(carry, E + 1, E)
    k = np.where(carry, 1024, k)
    norm = ((E + 15) << 10) | (k - 1024)
    norm = np.where(E + 15 >= 31, 0x7C00, norm)
    out = np.where(sub, k_sub, norm)
    out = np.where(np.isinf(a), 0x7C00, out)
    out = np.where(np.isnan(a), 0x7FFF, out | sign)
    return out.astype(np.uint16)


def test_f32_to_f16_million_patterns():
    u = _patterns(1_000_000, 1)
    got = nm.f32_to_f16_bits(u.view(np.float32))
    assert np.array_equal(got, _ref_f32_to_f16(u))
    fin = ~np.isnan(u.view(np.float32))
    with np.errstate(over="ignore"):
        assert np.array_equal(got[fin], u.view(np.float32)[fin].astype(np.float16).view(np.uint16))


def test_f32_to_f16_boundaries():
    f = lambda b: int(nm.f32_to_f16_bits(np.array([b], np.uint32).view(np.float32))[0])
    assert f(0x477FE000) == 0x7BFF          # 65504
    assert f(0x477FEFFF) == 0x7BFF          # just below 65520
    assert f(0x477FF000) == 0x7C00          # 65520 ties to even = Inf
    assert f(0xC77FF000) == 0xFC00
    assert f(0x33000000) == 0x0000          # 2^-25 ties to even 0
    assert f(0x33000001) == 0x0001          # above the tie
    assert f(0xB3000000) == 0x8000
    assert f(0x7F800001) == 0x7FFF          # every NaN canonical
    assert int(nm.f32_to_f16_bits(np.array([0xFF812345], np.uint32).view(np.float32),
                                  ggml_nan=True)[0]) == 0xFE00


# ---------------------------------------------------------------- f32 -> bf16
def test_f32_to_bf16_million_patterns():
    u = _patterns(1_000_000, 2)
    got = nm.f32_to_bf16_bits(u.view(np.float32))
    x = u.view(np.float32)
    nan = np.isnan(x)
    # Non-NaN: ggml's rule is RNE on bit 16, which ml_dtypes implements independently.
    with np.errstate(over="ignore"):
        ref = x[~nan].astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(got[~nan], ref)
    assert np.array_equal(got[nan], ((u[nan] >> 16) | 0x40).astype(np.uint16))
    # and a Python-integer transcription of the formula on a sample
    for v in u[:5000].tolist():
        want = ((v >> 16) | 0x40) if (v & 0x7FFFFFFF) > 0x7F800000 else ((v + 0x7FFF + ((v >> 16) & 1)) >> 16) & 0xFFFF
        assert int(nm.f32_to_bf16_bits(np.array([v], np.uint32).view(np.float32))[0]) == want


def test_bf16_widening_exact():
    b = np.arange(65536, dtype=np.uint32)
    assert np.array_equal(nm.bf16_bits_to_f32(b).view(np.uint32), b << 16)


# ---------------------------------------------------------------- E8M0, UE4M3
def test_e8m0_half_all_bytes():
    got = nm.e8m0_half_to_f32(np.arange(256)).astype(np.float64)
    for e in range(256):
        assert Fraction(float(got[e])) == Fraction(2) ** (e - 128), e
    assert nm.e8m0_half_to_f32(np.array([0, 1])).view(np.uint32).tolist() == [0x00200000, 0x00400000]


def test_ue4m3_all_bytes():
    got = nm.ue4m3_to_f32(np.arange(256))
    for x in range(256):
        ex, man = (x >> 3) & 15, x & 7
        raw = Fraction(man, 512) if ex == 0 else (1 + Fraction(man, 8)) * Fraction(2) ** (ex - 7)
        want = Fraction(0) if x in (0x00, 0x7F) else raw / 2
        assert Fraction(float(got[x])) == want, hex(x)
    assert got[0xFF] == 240 and got[0x7F] == 0 and got[0x80 | 0x38] == got[0x38]


# ---------------------------------------------------------------- NaN, rounding
def test_canonicalize_nan_all_dtypes():
    f = np.array([0x7F800001, 0xFFC00000, 0x7F800000, 0x80000000], np.uint32).view(np.float32)
    assert nm.canonicalize_nan(f).view(np.uint32).tolist() == [0x7FFFFFFF, 0x7FFFFFFF, 0x7F800000, 0x80000000]
    h = np.array([0x7C01, 0xFE00, 0x7C00, 0x8000], np.uint16).view(np.float16)
    assert nm.canonicalize_nan(h).view(np.uint16).tolist() == [0x7FFF, 0x7FFF, 0x7C00, 0x8000]
    b = np.array([0x7F81, 0xFFC0, 0x7F80, 0x8000], np.uint16).view(ml_dtypes.bfloat16)
    assert nm.canonicalize_nan(b).view(np.uint16).tolist() == [0x7FFF, 0x7FFF, 0x7F80, 0x8000]


def test_round_half_away():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 8388607.5, 1e30, -3.7], np.float32)
    assert nm.round_half_away(x).tolist() == [1, 2, 3, -1, -3, 0, 0, 8388608, np.float32(1e30), -4]


# ---------------------------------------------------------------- fma_f32
def _frac_to_f32(q: Fraction) -> np.float32:
    """Correctly rounded (RNE) float32 of an exact rational, with overflow."""
    if q == 0:
        return np.float32(0.0)
    s, a = (-1 if q < 0 else 1), abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    n = a / quantum
    k = n.numerator // n.denominator
    rem = n - k
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and k % 2 == 1):
        k += 1
    v = k * quantum
    if v >= Fraction(2) ** 128:
        return np.float32(s * np.inf)
    return np.float32(s * float(v))


def _check_fma(a, b, c):
    got = nm.fma_f32(np.array(a, np.float32), np.array(b, np.float32), np.array(c, np.float32))
    for x, y, z, g in zip(np.atleast_1d(a), np.atleast_1d(b), np.atleast_1d(c), np.atleast_1d(got)):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        want = _frac_to_f32(exact)
        if exact == 0:   # IEEE: an exact zero sum is -0 only when both addends are -0
            p_neg = (np.signbit(x) != np.signbit(y)) and (x == 0 or y == 0)
            want = np.float32(-0.0) if (p_neg and np.signbit(z) and z == 0) else np.float32(0.0)
        assert np.array(g).view(np.uint32) == np.array(want).view(np.uint32), (x, y, z, g, want)


def test_fma_double_rounding_trap():
    one_ulp = np.float32(1 + 2.0 ** -23)
    # a*b + c = 1 + 2^-24 + 2^-70: just above a tie. A float64 sum loses 2^-70
    # and then ties to even (1.0); the single rounding must give 1 + 2^-23.
    a, b, c = one_ulp, np.float32(-(1 - 2.0 ** -23) * 2.0 ** -24), one_ulp
    _check_fma([a], [b], [c])
    assert nm.fma_f32(a, b, c) == one_ulp


def test_fma_ties_cancellation_overflow_subnormal():
    f = np.float32
    cases = [
        (f(2.0 ** -12), f(2.0 ** -12), f(1.0)),                 # exact tie -> even
        (f(1 + 2.0 ** -23), f(1 + 2.0 ** -23), f(-1.0)),        # cancellation
        (f(1 + 2.0 ** -12), f(1 - 2.0 ** -12), f(-1.0)),        # result -2^-24 exact
        (f(3.4e38), f(2.0), f(-3.4e38)),                        # product beyond f32, sum finite
        (f(3.4e38), f(3.4e38), f(0.0)),                         # overflow to inf
        (f(-3.4e38), f(3.4e38), f(0.0)),
        (f(2.0 ** -75), f(2.0 ** -75), f(0.0)),                 # underflow to 0 / subnormal
        (f(2.0 ** -70), f(2.0 ** -70), f(2.0 ** -149)),         # subnormal result, sticky bits
        (f(1.5 * 2.0 ** -75), f(2.0 ** -75), f(2.0 ** -149)),
        (f(-0.0), f(1.0), f(0.0)), (f(-0.0), f(1.0), f(-0.0)),  # signed zeros
        (f(1e-20), f(1e-20), f(-1e-40)),
    ]
    a, b, c = (np.array(x, np.float32) for x in zip(*cases))
    _check_fma(a, b, c)


def test_fma_random_exponents():
    r = np.random.default_rng(3)
    def rnd(n):
        m = r.uniform(-2, 2, n)
        return (m * np.exp2(r.integers(-75, 60, n))).astype(np.float32)
    a, b, c = rnd(3000), rnd(3000), rnd(3000)
    c[::3] = -(a[::3].astype(np.float64) * b[::3]).astype(np.float32)  # heavy cancellation
    _check_fma(a, b, c)


def test_fma_nan_inf():
    f = np.float32
    r = nm.fma_f32(np.array([np.inf, 0, np.nan]), np.array([0, np.inf, 1]), np.array([1, 1, 1], f))
    assert r.view(np.uint32).tolist() == [0x7FFFFFFF] * 3
    assert nm.fma_f32(f(np.inf), f(1), f(1)) == np.inf


def test_ulp_distance():
    x = np.array([1.0, 0.0, -0.0, np.nan], np.float32)
    y = np.array([np.nextafter(np.float32(1), np.float32(2)), -0.0, np.float32(-1e-45), np.nan], np.float32)
    assert nm.ulp_distance_f32(x, y).tolist() == [1, 0, 1, 0]


def test_type_errors():
    with pytest.raises(TypeError):
        nm.f32_to_f16_bits(np.zeros(3, np.float64))
