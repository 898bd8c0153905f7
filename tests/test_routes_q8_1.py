"""q8_1 activation quantization (kernels.md §6): hand-computed blocks, .5
boundaries, amax = 0, the butterfly sum order, the fp16 sum overflow, and
non-finite values."""
import numpy as np
import pytest

from strata_ref.routes.q8_1 import butterfly_sum, q8_1_fields, quantize_q8_1


def _block(x):
    return quantize_q8_1(np.asarray(x, np.float32))


def test_hand_block_d_and_q():
    # amax = 127 -> d = 1 exactly; q = x rounded half away from zero.
    x = np.zeros(32, np.float32)
    x[0], x[1], x[2], x[3], x[4] = 127, -2.5, 2.5, 0.5, -0.49
    b = _block(x)
    d, s, qs = q8_1_fields(b)
    assert d[0] == 1.0
    assert s[0] == np.float32(127 - 2.5 + 2.5 + 0.5 - 0.49).astype(np.float16).astype(np.float32)
    assert list(qs[0, :5]) == [127, -3, 3, 1, 0]
    assert not qs[0, 5:].any()
    # byte layout: d (fp16 1.0 = 0x3C00) at byte 0, s at 2, qs from 4
    assert b[0, 0] == 0x00 and b[0, 1] == 0x3C
    assert b.shape == (1, 36)


def test_half_boundary_uses_float32_quotient_then_exact_round():
    # d = 127/127 = 1, x/d = 0.49999997 exactly (float32 below 0.5): must give
    # 0, while float32 0.49999997 + 0.5 would round up to 1.
    x = np.zeros(32, np.float32)
    x[0] = 127
    x[1] = np.nextafter(np.float32(0.5), np.float32(0))
    x[2] = -x[1]
    x[3] = np.float32(1.5)
    _, _, qs = q8_1_fields(_block(x))
    assert list(qs[0, :4]) == [127, 0, 0, 2]


def test_ieee_division_for_d_and_quotient():
    # amax = 1 -> d = fl(1/127); q_i = round(fl(x_i / d)) with both divisions
    # correctly rounded float32 (compared with exact rationals via float64).
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 32).astype(np.float32)
    x[7] = 1.0
    d_f32 = np.float32(np.float64(1.0) / 127.0)           # float64 quotient rounds once
    v = (x.astype(np.float64) / np.float64(d_f32)).astype(np.float32).astype(np.float64)
    expect = np.sign(v) * np.floor(np.abs(v) + 0.5)
    d, _, qs = q8_1_fields(_block(x))
    assert np.array_equal(qs[0].astype(np.float64), expect)
    assert d[0] == np.float32(d_f32).astype(np.float16).astype(np.float32)


def test_amax_zero_gives_zero_block():
    b = _block(np.zeros(32, np.float32))
    assert not b.any()
    neg0 = _block(np.full(32, -0.0, np.float32))
    _, _, qs = q8_1_fields(neg0)
    assert not qs.any()


def test_butterfly_order_is_pairwise_tree():
    # 2^24 + 1 + 1 ... : sequential summation would lose the ones, the tree
    # (v[:h] + v[h:]) keeps pairs of ones together.
    v = np.ones(32, np.float32)
    v[0] = 2.0 ** 24
    tree = butterfly_sum(v)
    # level 1: lane 0 = 2^24 + 1 (rounds to 2^24, tie to even), others 2
    # levels 2..5 add 2^24 + (2+2) + (4+4)... = 2^24 + 30 exactly
    assert tree == np.float32(2.0 ** 24 + 30)
    assert np.float32(np.sum(v.astype(np.float64))) == np.float32(2.0 ** 24 + 31)


def test_multiple_columns_quantize_as_one_vector():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    both = quantize_q8_1(x)
    assert np.array_equal(both, np.concatenate([quantize_q8_1(r) for r in x]))


def test_sum_overflow_becomes_infinity_in_fp16():
    # Issue 6 item 6: a block sum beyond the fp16 range. 32 values of 3000
    # sum to 96000 > 65504; fp16 RNE makes s = +Inf (|s| >= 65520 rounds to
    # Inf), d = 3000/127 stays finite. Types whose dot uses s (Q4_0, Q5_0,
    # Q4_1, Q5_1, IQ1_S) then give an infinite or NaN output for that block;
    # the others never read s. This mirrors ggml's CUDA q8_1 (half2 ds).
    x = np.full(32, 3000.0, np.float32)
    d, s, qs = q8_1_fields(_block(x))
    assert np.isinf(s[0]) and s[0] > 0
    assert np.isfinite(d[0])
    assert (qs == 127).all()
    # just below the rounding threshold: 32 · 2046.5 = 65488 stays finite
    d, s, _ = q8_1_fields(_block(np.full(32, 2046.5, np.float32)))
    assert s[0] == 65504.0 or s[0] == np.float32(65488).astype(np.float16).astype(np.float32)
    assert np.isfinite(s[0])
    # mixed signs cancel: no overflow although |x| is large
    y = np.array([3000.0, -3000.0] * 16, np.float32)
    _, s, _ = q8_1_fields(_block(y))
    assert s[0] == 0.0


def test_q4_0_output_with_overflowed_sum_is_not_finite():
    from strata_ref.routes.mmvq import mmvq
    from strata_ref.types import GGMLType, block_format
    fmt = block_format(GGMLType.Q4_0)
    w = np.zeros((1, fmt.block_bytes), np.uint8)
    w[0, 0:2] = np.array([0x3C00], "<u2").view(np.uint8)     # d = 1
    w[0, 2:] = 0x88                                           # q = 8 -> value 0
    q8 = quantize_q8_1(np.full(32, 3000.0, np.float32)).reshape(1, 1, 36)
    y = mmvq(GGMLType.Q4_0, w, q8)
    assert not np.isfinite(y).any()
    # the true product is 0 (all weights 0): the documented overflow hazard


@pytest.mark.parametrize("bad", [np.zeros(31, np.float32), np.zeros(32, np.float64)])
def test_bad_input(bad):
    with pytest.raises((TypeError, ValueError)):
        quantize_q8_1(bad)


def test_nan_value_is_skipped_by_amax_and_quantizes_to_zero():
    # The CUDA kernel (like ggml's) reduces amax with fmaxf, which skips NaN:
    # the block keeps the d of its other values (amax 127 -> d = 1), the NaN
    # value's x/d is NaN and converts to q = 0, and the sum carries the NaN
    # into s as fp16 0x7FFF (__float2half_rn's NaN).
    x = np.zeros(32, np.float32)
    x[0], x[1], x[7] = 127.0, -3.0, np.nan
    b = _block(x)
    d, s, qs = q8_1_fields(b)
    assert d[0] == 1.0
    assert list(qs[0, :2]) == [127, -3] and qs[0, 7] == 0
    assert int(b[0, 2]) | (int(b[0, 3]) << 8) == 0x7FFF
    # all NaN: fmaxf(NaN, NaN) = NaN, so d is NaN too and every q is 0
    d, s, qs = q8_1_fields(_block(np.full(32, np.nan, np.float32)))
    assert np.isnan(d[0]) and np.isnan(s[0]) and not qs.any()


def test_infinite_value_gives_infinite_d_and_zero_quants():
    # amax = Inf: d = Inf/127 = Inf, finite/Inf = 0 and Inf/Inf = NaN -> q = 0.
    x = np.ones(32, np.float32)
    x[4] = np.inf
    d, s, qs = q8_1_fields(_block(x))
    assert np.isinf(d[0]) and np.isinf(s[0]) and not qs.any()


def test_subnormal_amax_wraps_like_the_cuda_int8_store():
    # amax = 190·2^-149: d = amax/127 = 1.496·2^-149 rounds to 2^-149, so
    # x/d = 190 and 64 exactly. nvcc stores roundf(x/d) into int8 through
    # cvt.rzi.s32.f32 and the low byte: 190 -> 0xBE = -66 (measured on the
    # H200, kernel and ggml's conversion alike).
    tiny = np.float32(2.0 ** -149)
    x = np.zeros(32, np.float32)
    x[0], x[1] = 190 * tiny, 64 * tiny
    d, s, qs = q8_1_fields(_block(x))
    assert list(qs[0, :3]) == [-66, 64, 0]
    assert d[0] == 0.0                       # fp16 of 2^-149 is 0: dots see d = 0
    # amax = 2^-149: d = 2^-149/127 rounds to 0, x/0 = +-Inf saturates to
    # 0x7FFFFFFF (low byte 0xFF = -1) or 0x80000000 (low byte 0), 0/0 = NaN -> 0
    x = np.zeros(32, np.float32)
    x[0], x[1] = tiny, -tiny
    d, s, qs = q8_1_fields(_block(x))
    assert list(qs[0, :3]) == [-1, 0, 0]


def test_signalling_nan_is_skipped_by_amax_like_a_quiet_one():
    # fmaxf skips any NaN; a signalling NaN (0x7FA00000) must not hide the
    # block's real amax (NumPy's fmax.reduce can, on SIMD builds).
    for bits in (0x7FA00000, 0xFF800001, 0x7FC00000):
        for lane in (20, 31, 0):
            x = np.ones(32, np.float32)
            x[10] = 100.0
            x.view(np.uint32)[lane] = bits
            d, s, qs = q8_1_fields(_block(x))
            assert d[0] == np.float32(np.float16(np.float32(100.0) / np.float32(127.0)))
            assert qs[0, 10] == 127 and qs[0, lane] == 0
            assert qs[0, 1 if lane != 1 else 2] == 1     # 1/(100/127) = 1.27 -> 1
    # all lanes signalling NaN: amax is NaN, as fmaxf(NaN, NaN) gives
    d, s, qs = q8_1_fields(_block(np.full(32, np.uint32(0x7FA00000)).view(np.float32)))
    assert np.isnan(d[0]) and not qs.any()
