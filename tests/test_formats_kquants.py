"""K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K) against their definition
(formats.md §5), gguf-py 0.19.0 and, for Q8_K, an independent vectorised
numpy decoder.

Each super-block is assembled here from logical values (one scale and min
per sub-block, one quant per output) by an encoder written from the block
structs of ggml-common.h, in the direction opposite to the decoder; expected
outputs come from the logical values with Python floats (products exact in
float64, the one `- m` checked exact, then one float32 rounding).
"""
import struct

import numpy as np
import pytest

from _blocks import (add_exact, as_f32, assert_bits_equal, check_against,
                     check_against_gguf, dequant_one, f32_value, half_bits)
from strata_ref.types import GGMLType as T

N_SANE = 100_000
N_RAW = 20_000

# (d, dmin) pairs: normal, negative, ±0, subnormal, max (rounding in `- m`).
SCALE_PAIRS = [(0.5, 0.25), (-0.5, 2.0 ** -10), (0.0, -0.0), (-0.0, 0.0),
               (2.0 ** -24, -3 * 2.0 ** -24), (65504.0, 2.0 ** -24),
               (-1.5, 65504.0), (2.0 ** -14, 3.0)]


def h(x: float) -> bytes:
    return struct.pack("<H", half_bits(x))


def pack_2bit_planes(q) -> bytes:
    # Q2_K/Q3_K low bits: output i sits in byte 32*(i//128) + i%32 at bit
    # 2*((i%128)//32): each 128-value half is 4 planes of 32 values.
    qs = bytearray(64)
    for i, x in enumerate(q):
        qs[32 * (i // 128) + i % 32] |= (int(x) & 3) << (2 * ((i % 128) // 32))
    return bytes(qs)


def pack_high_bits(bits) -> bytes:
    # Q3_K hmask / Q5_K qh: bit i//32 of byte i%32 is output i's high bit.
    out = bytearray(32)
    for i, x in enumerate(bits):
        out[i % 32] |= (int(x) & 1) << (i // 32)
    return bytes(out)


def pack_scale_min_k4(sc, mn) -> bytes:
    # Inverse of ggml get_scale_min_k4: 8 six-bit scales and mins in 12 bytes.
    b = bytearray(12)
    for j in range(4):
        b[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        b[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6)
        b[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
    return bytes(b)


def pack_q3_k_scales(sc) -> bytes:
    # 16 signed 6-bit scales: u = sc + 32; low nibbles of scales 0-7 in bytes
    # 0-7, of scales 8-15 in their high nibbles; bits 4-5 of u go to byte
    # 8 + s%4 at bit 2*(s//4).
    b = bytearray(12)
    for s, x in enumerate(sc):
        u = int(x) + 32
        b[s % 8] |= (u & 15) << (4 * (s // 8))
        b[8 + s % 4] |= (u >> 4) << (2 * (s // 4))
    return bytes(b)


def nibble_chunks(q) -> bytes:
    # Q4_K/Q5_K: chunk c of 64 outputs; outputs 64c+l (l < 32) in the low
    # nibble of byte 32c+l, outputs 64c+32+l in its high nibble.
    qs = bytearray(128)
    for i, x in enumerate(q):
        c, r = divmod(i, 64)
        qs[32 * c + r % 32] |= (int(x) & 15) << (4 * (r // 32))
    return bytes(qs)


@pytest.mark.parametrize("d, dmin", SCALE_PAIRS)
def test_q2_k_hand(d, dmin):
    rng = np.random.default_rng(10)
    sc = rng.integers(0, 16, 16)
    mn = rng.integers(0, 16, 16)
    sc[:2], mn[:2] = (0, 15), (15, 0)
    q = rng.integers(0, 4, 256)
    blk = bytes(int(a) | (int(b) << 4) for a, b in zip(sc, mn)) + pack_2bit_planes(q) + h(d) + h(dmin)
    exp = [add_exact((d * int(sc[i // 16])) * int(q[i]), -(dmin * int(mn[i // 16])))
           for i in range(256)]
    assert_bits_equal(dequant_one(T.Q2_K, blk), as_f32(exp))


def test_q2_k_minus_zero_minus_zero():
    # dl*q = -0 (d < 0, q = 0) and ml = +0: -0 - +0 = -0, as C.
    blk = bytes([0x01] * 16) + bytes(64) + h(-1.0) + h(1.0)
    y = dequant_one(T.Q2_K, blk)
    assert (y.view(np.uint32) == 0x80000000).all()


@pytest.mark.parametrize("d", [0.5, -0.5, 0.0, -0.0, 2.0 ** -24, 65504.0, -3 * 2.0 ** -24])
def test_q3_k_hand(d):
    rng = np.random.default_rng(11)
    sc = rng.integers(-32, 32, 16)
    sc[:3] = (-32, 31, 0)
    q = rng.integers(-4, 4, 256)
    q[:3] = (-4, 3, 0)
    u = q + 4                       # 3-bit unsigned: low 2 bits + high bit
    blk = pack_high_bits(u >> 2) + pack_2bit_planes(u) + pack_q3_k_scales(sc) + h(d)
    exp = [(d * int(sc[i // 16])) * int(q[i]) for i in range(256)]
    assert_bits_equal(dequant_one(T.Q3_K, blk), as_f32(exp))


def test_q3_k_set_high_bit_means_no_offset():
    # All low bits 0, all scales 1 (u = 33: low nibble 1, high bits 2):
    # hmask set -> q = 0, clear -> q = -4.
    sc = pack_q3_k_scales([1] * 16)
    blk = bytes([0xFF] * 32) + bytes(64) + sc + h(2.0)
    assert (dequant_one(T.Q3_K, blk) == 0).all()
    blk = bytes(32) + bytes(64) + sc + h(2.0)
    assert (dequant_one(T.Q3_K, blk) == -8.0).all()


def _q45_k_case(rng, qbits):
    sc = rng.integers(0, 64, 8)
    mn = rng.integers(0, 64, 8)
    sc[:2], mn[:2] = (63, 0), (0, 63)
    sc[4:6], mn[4:6] = (63, 16), (17, 63)   # the split 6-bit fields of j >= 4
    q = rng.integers(0, 1 << qbits, 256)
    return sc, mn, q


def _q45_k_expected(d, dmin, sc, mn, q):
    return [add_exact((d * int(sc[i // 32])) * int(q[i]), -(dmin * int(mn[i // 32])))
            for i in range(256)]


@pytest.mark.parametrize("d, dmin", SCALE_PAIRS)
def test_q4_k_hand(d, dmin):
    sc, mn, q = _q45_k_case(np.random.default_rng(12), 4)
    blk = h(d) + h(dmin) + pack_scale_min_k4(sc, mn) + nibble_chunks(q)
    assert_bits_equal(dequant_one(T.Q4_K, blk), as_f32(_q45_k_expected(d, dmin, sc, mn, q)))


@pytest.mark.parametrize("d, dmin", SCALE_PAIRS)
def test_q5_k_hand(d, dmin):
    sc, mn, q = _q45_k_case(np.random.default_rng(13), 5)
    blk = (h(d) + h(dmin) + pack_scale_min_k4(sc, mn) + pack_high_bits(q >> 4)
           + nibble_chunks(q & 15))
    assert_bits_equal(dequant_one(T.Q5_K, blk), as_f32(_q45_k_expected(d, dmin, sc, mn, q)))


def pack_q6_k(q) -> tuple[bytes, bytes]:
    # u = q + 32 (6 bits). Half h = i//128, t = (i%128)//32, l = i%32:
    # low nibble in ql[64h + 32*(t%2) + l] (low nibble for t < 2, high for
    # t >= 2), high 2 bits in qh[32h + l] at bit 2t.
    ql, qh = bytearray(128), bytearray(64)
    for i, x in enumerate(q):
        u = int(x) + 32
        hh, r = divmod(i, 128)
        t, l = divmod(r, 32)
        ql[64 * hh + 32 * (t % 2) + l] |= (u & 15) << (4 * (t // 2))
        qh[32 * hh + l] |= (u >> 4) << (2 * t)
    return bytes(ql), bytes(qh)


@pytest.mark.parametrize("d", [0.5, -0.5, 0.0, -0.0, 2.0 ** -24, 65504.0, -3 * 2.0 ** -24])
def test_q6_k_hand(d):
    rng = np.random.default_rng(14)
    sc = rng.integers(-128, 128, 16)
    sc[:3] = (-128, 127, 0)
    q = rng.integers(-32, 32, 256)
    q[:3] = (-32, 31, 0)
    ql, qh = pack_q6_k(q)
    blk = ql + qh + sc.astype(np.int8).tobytes() + h(d)
    exp = [(d * int(sc[i // 16])) * int(q[i]) for i in range(256)]
    assert_bits_equal(dequant_one(T.Q6_K, blk), as_f32(exp))


# f32 d bits: normal, negative, ±0, f32 subnormal, near FLT_MAX (d*q overflows).
Q8_K_D_BITS = [0x3F800000, 0xBEAAAAAB, 0x00000000, 0x80000000, 0x00000007,
               0x3DCCCCCD, 0x7F7FFFFF, 0xC0490FDB]


@pytest.mark.parametrize("dbits", Q8_K_D_BITS, ids=hex)
def test_q8_k_hand(dbits):
    rng = np.random.default_rng(15)
    q = rng.integers(-128, 128, 256)
    q[:4] = (-128, 127, 0, 3)
    bsums = rng.integers(-2000, 2000, 16).astype("<i2").tobytes()   # never read
    blk = struct.pack("<I", dbits) + q.astype(np.int8).tobytes() + bsums
    d = f32_value(dbits)
    # d * q is exact in float64 (24 + 8 bits): as_f32 rounds it once, as C's
    # float32 multiply does (to ±Inf beyond FLT_MAX).
    assert_bits_equal(dequant_one(T.Q8_K, blk), as_f32([d * int(x) for x in q]))


def q8_k_numpy(blocks: np.ndarray) -> np.ndarray:
    """Independent decoder: block_q8_K = {f32 d, int8 qs[256], int16 bsums[16]},
    y = d * qs in float32."""
    d = np.ascontiguousarray(blocks[:, 0:4]).view("<f4")
    qs = np.ascontiguousarray(blocks[:, 4:260]).view(np.int8).astype(np.float32)
    return d * qs


GGUF_TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]


@pytest.mark.parametrize("t", GGUF_TYPES, ids=lambda t: t.name)
def test_matches_gguf_sane(t):
    check_against_gguf(t, N_SANE, np.random.default_rng(100 + t), sane=True)


@pytest.mark.parametrize("t", GGUF_TYPES, ids=lambda t: t.name)
def test_matches_gguf_raw(t):
    check_against_gguf(t, N_RAW, np.random.default_rng(200 + t), sane=False)


@pytest.mark.parametrize("sane", [True, False], ids=["sane", "raw"])
def test_q8_k_matches_numpy(sane):
    with np.errstate(all="ignore"):
        check_against(T.Q8_K, q8_k_numpy, N_SANE if sane else N_RAW,
                      np.random.default_rng(301), sane=sane)
