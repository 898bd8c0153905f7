"""Legacy 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1) against their
definition (formats.md §5), gguf-py 0.19.0 and, for Q8_1, an independent
vectorised numpy decoder.

Blocks are assembled here in the C struct order of ggml-common.h (not from
strata_ref's layout declaration), and the expected values are computed from
the logical values with Python floats: every product is exact in float64,
the one `+ m` is checked exact by `add_exact`, so the final float32
conversion is the single rounding C performs, and IEEE signed-zero rules
(0 * -d = -0) hold in Python as in C.
"""
import struct

import numpy as np
import pytest

from _blocks import (add_exact, as_f32, assert_bits_equal, check_against,
                     check_against_gguf, dequant_one, half_bits)
from strata_ref.types import GGMLType as T

# fp16 scales: normal, negative, ±0, subnormal (smallest and negative), max.
SCALES = [0.5, -0.5, 0.0, -0.0, 2.0 ** -24, -3 * 2.0 ** -24, 2.0 ** -14,
          65504.0, -65504.0, -1.5]
N_SANE = 100_000
N_RAW = 20_000


def h(x: float) -> bytes:
    return struct.pack("<H", half_bits(x))


def nibbles(v) -> bytes:
    # value j in the low nibble of byte j, value j + 16 in its high nibble
    return bytes(int(v[j]) | (int(v[j + 16]) << 4) for j in range(16))


def qh_bits(v) -> bytes:
    # bit j of the u32 qh = 5th bit of value j (j < 32)
    return struct.pack("<I", sum(((int(x) >> 4) & 1) << j for j, x in enumerate(v)))


def values(rng, lo, hi, must):
    # 32 random ints in [lo, hi] that include every value of `must`
    v = rng.integers(lo, hi + 1, 32)
    v[:len(must)] = must
    return rng.permutation(v)


@pytest.mark.parametrize("d", SCALES)
def test_q4_0_hand(d):
    rng = np.random.default_rng(1)
    v = values(rng, 0, 15, [0, 8, 15, 7, 9])
    y = dequant_one(T.Q4_0, h(d) + nibbles(v))
    assert_bits_equal(y, as_f32([(int(q) - 8) * d for q in v]))


def test_q4_0_q8_negative_d_is_minus_zero():
    y = dequant_one(T.Q4_0, h(-0.5) + bytes([0x88] * 16))
    assert (y.view(np.uint32) == 0x80000000).all()
    y = dequant_one(T.Q4_0, h(0.5) + bytes([0x88] * 16))
    assert (y.view(np.uint32) == 0).all()


@pytest.mark.parametrize("d, m", [(0.5, -4.0), (-0.5, 0.25), (65504.0, 2.0 ** -24),
                                  (1.0, -3.0), (-0.0, -0.0), (0.0, -0.0),
                                  (2.0 ** -24, -65504.0), (-3 * 2.0 ** -24, 2.0 ** -14)])
def test_q4_1_hand(d, m):
    rng = np.random.default_rng(2)
    v = values(rng, 0, 15, [0, 3, 15])
    y = dequant_one(T.Q4_1, h(d) + h(m) + nibbles(v))
    assert_bits_equal(y, as_f32([add_exact(int(q) * d, m) for q in v]))


def test_q4_1_rounds_once_and_cancels_to_plus_zero():
    v = [1] * 16 + [3] * 16
    y = dequant_one(T.Q4_1, h(65504.0) + h(2.0 ** -24) + nibbles(v))
    assert y[0] == np.float32(65504.0)         # 65504 + 2^-24 rounds to 65504
    y = dequant_one(T.Q4_1, h(1.0) + h(-3.0) + nibbles(v))
    assert y[16].view(np.uint32) == 0          # 3 * 1 + (-3) = +0
    assert y[0] == np.float32(-2.0)


@pytest.mark.parametrize("d", SCALES)
def test_q5_0_hand(d):
    rng = np.random.default_rng(3)
    v = values(rng, 0, 31, [0, 15, 16, 17, 31])
    y = dequant_one(T.Q5_0, h(d) + qh_bits(v) + nibbles([x & 15 for x in v]))
    assert_bits_equal(y, as_f32([(int(q) - 16) * d for q in v]))


@pytest.mark.parametrize("d, m", [(0.5, -8.0), (-0.5, 0.25), (65504.0, 2.0 ** -24),
                                  (-0.0, -0.0), (2.0 ** -24, -1.0)])
def test_q5_1_hand(d, m):
    rng = np.random.default_rng(4)
    v = values(rng, 0, 31, [0, 15, 16, 31])
    y = dequant_one(T.Q5_1, h(d) + h(m) + qh_bits(v) + nibbles([x & 15 for x in v]))
    assert_bits_equal(y, as_f32([add_exact(int(q) * d, m) for q in v]))


def test_q5_high_bits_by_position():
    # Only value 5 and value 21 have their 5th bit set: bits 5 and 21 of qh.
    v = [0] * 32
    v[5] = v[21] = 16
    blk = h(1.0) + struct.pack("<I", (1 << 5) | (1 << 21)) + bytes(16)
    y = dequant_one(T.Q5_0, blk)
    assert_bits_equal(y, as_f32([q - 16 for q in v]))


@pytest.mark.parametrize("d", SCALES)
def test_q8_0_hand(d):
    rng = np.random.default_rng(5)
    v = values(rng, -128, 127, [-128, 127, 0, -1, 1])
    y = dequant_one(T.Q8_0, h(d) + v.astype(np.int8).tobytes())
    assert_bits_equal(y, as_f32([int(q) * d for q in v]))


@pytest.mark.parametrize("d", SCALES)
def test_q8_1_hand_ignores_s(d):
    rng = np.random.default_rng(6)
    v = values(rng, -128, 127, [-128, 127, 0])
    expected = as_f32([int(q) * d for q in v])
    for s in (0.0, -2.5, 65504.0):             # s is redundant: never read
        y = dequant_one(T.Q8_1, h(d) + h(s) + v.astype(np.int8).tobytes())
        assert_bits_equal(y, expected)
    y = dequant_one(T.Q8_1, h(d) + b"\xff\x7f" + v.astype(np.int8).tobytes())  # NaN s
    assert_bits_equal(y, expected)


def q8_1_numpy(blocks: np.ndarray) -> np.ndarray:
    """Independent decoder: block_q8_1 = {fp16 d, fp16 s, int8 qs[32]}, y = qs * d."""
    d = np.ascontiguousarray(blocks[:, 0:2]).view("<f2").astype(np.float32)
    qs = np.ascontiguousarray(blocks[:, 4:36]).view(np.int8).astype(np.float32)
    return qs * d


GGUF_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


@pytest.mark.parametrize("t", GGUF_TYPES, ids=lambda t: t.name)
def test_matches_gguf_sane(t):
    check_against_gguf(t, N_SANE, np.random.default_rng(100 + t), sane=True)


@pytest.mark.parametrize("t", GGUF_TYPES, ids=lambda t: t.name)
def test_matches_gguf_raw(t):
    check_against_gguf(t, N_RAW, np.random.default_rng(200 + t), sane=False)


@pytest.mark.parametrize("sane", [True, False], ids=["sane", "raw"])
def test_q8_1_matches_numpy(sane):
    with np.errstate(all="ignore"):
        check_against(T.Q8_1, q8_1_numpy, N_SANE if sane else N_RAW,
                      np.random.default_rng(300), sane=sane)
