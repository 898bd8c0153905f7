"""Ternary (TQ1_0, TQ2_0), FP4 (MXFP4, NVFP4) and low-bit (Q1_0, Q2_0)
formats against their definition (formats.md §4, §5), gguf-py 0.19.0 and, for
Q1_0 and Q2_0 (not in gguf-py), independent vectorised numpy decoders.

Blocks are assembled here from logical values in the C struct order of
ggml-common.h; expected values are exact products in Python floats, rounded
once to float32.
"""
import math
import struct
from fractions import Fraction

import numpy as np
import pytest

from _blocks import (as_f32, assert_bits_equal, check_against, check_against_gguf,
                     dequant_one, half_bits)
from strata_ref.formats import dequantize_blocks
from strata_ref.types import GGMLType as T

N_SANE = 100_000
N_RAW = 20_000
SCALES = [0.5, -0.5, 0.0, -0.0, 2.0 ** -24, -3 * 2.0 ** -24, 65504.0, -1.5]


def h(x: float) -> bytes:
    return struct.pack("<H", half_bits(x))


# --- TQ1_0 ------------------------------------------------------------------

def tq1_0_byte(trits) -> int:
    # ggml's encoder: the trits as a base-3 fraction, 256/243 scaled, rounded up
    v = sum(int(t) * 3 ** (4 - n) for n, t in enumerate(trits))
    return (v * 256 + 242) // 243


def pack_tq1_0(t) -> bytes:
    # t: 256 trits in {0, 1, 2}. Bytes 0-31: trit n of byte m is output
    # 32n+m; bytes 32-47: output 160+16n+m; qh byte j (4 trits, the 5th is
    # 0): output 240+4n+j.
    qs = [tq1_0_byte([t[32 * n + m] for n in range(5)]) for m in range(32)]
    qs += [tq1_0_byte([t[160 + 16 * n + m] for n in range(5)]) for m in range(16)]
    qh = [tq1_0_byte([t[240 + 4 * n + j] for n in range(4)] + [0]) for j in range(4)]
    return bytes(qs + qh)


@pytest.mark.parametrize("d", SCALES)
def test_tq1_0_hand(d):
    t = np.random.default_rng(20).integers(0, 3, 256)
    y = dequant_one(T.TQ1_0, pack_tq1_0(t) + h(d))
    assert_bits_equal(y, as_f32([(int(x) - 1) * d for x in t]))


def test_tq1_0_every_trit_pattern():
    # All 243 five-trit patterns in the 32-byte run, d = 1.
    pats = [[(k // 3 ** (4 - n)) % 3 for n in range(5)] for k in range(243)]
    for start in range(0, 243, 32):
        chunk = pats[start:start + 32]
        chunk += [[0] * 5] * (32 - len(chunk))
        qs = bytes(tq1_0_byte(p) for p in chunk)
        y = dequant_one(T.TQ1_0, qs + bytes(16) + bytes(4) + h(1.0))
        exp = [chunk[m][n] - 1 for n in range(5) for m in range(32)]
        assert_bits_equal(y[:160], as_f32(exp))


# --- TQ2_0 ------------------------------------------------------------------

@pytest.mark.parametrize("d", SCALES)
def test_tq2_0_hand(d):
    q = np.random.default_rng(21).integers(0, 4, 256)   # code 3 -> +2d
    q[:4] = (0, 1, 2, 3)
    qs = bytearray(64)
    for i, x in enumerate(q):          # output 128c+32l+m: byte 32c+m, bits 2l
        c, r = divmod(i, 128)
        qs[32 * c + r % 32] |= int(x) << (2 * (r // 32))
    y = dequant_one(T.TQ2_0, bytes(qs) + h(d))
    assert_bits_equal(y, as_f32([(int(x) - 1) * d for x in q]))


# --- Q1_0, Q2_0 ---------------------------------------------------------------

@pytest.mark.parametrize("d", SCALES)
def test_q1_0_hand(d):
    bits = np.random.default_rng(22).integers(0, 2, 128)
    qs = bytes(sum(int(bits[8 * k + i]) << i for i in range(8)) for k in range(16))
    y = dequant_one(T.Q1_0, h(d) + qs)
    assert_bits_equal(y, as_f32([d if b else -d for b in bits]))


def test_q1_0_signed_zero_scales():
    # Set bits give d, clear bits -d: -0 for d = +0 and +0 for d = -0.
    y = dequant_one(T.Q1_0, h(0.0) + bytes([0x0F] * 16))
    assert (y.view(np.uint32)[[0, 1, 2, 3]] == 0).all()
    assert (y.view(np.uint32)[[4, 5, 6, 7]] == 0x80000000).all()
    y = dequant_one(T.Q1_0, h(-0.0) + bytes([0x0F] * 16))
    assert (y.view(np.uint32)[[0, 1, 2, 3]] == 0x80000000).all()
    assert (y.view(np.uint32)[[4, 5, 6, 7]] == 0).all()


@pytest.mark.parametrize("d", SCALES)
def test_q2_0_hand(d):
    q = np.random.default_rng(23).integers(0, 4, 64)
    q[:4] = (3, 2, 1, 0)
    qs = bytes(sum(int(q[4 * k + i]) << (2 * i) for i in range(4)) for k in range(16))
    y = dequant_one(T.Q2_0, h(d) + qs)
    assert_bits_equal(y, as_f32([(int(x) - 1) * d for x in q]))


def q1_0_numpy(blocks: np.ndarray) -> np.ndarray:
    """Independent decoder: block_q1_0 = {fp16 d, u8 qs[16]}, bit j (LSB
    first) selects d, else -d."""
    d = np.ascontiguousarray(blocks[:, 0:2]).view("<f2").astype(np.float32)
    bits = np.unpackbits(blocks[:, 2:18], axis=1, bitorder="little").astype(bool)
    return np.where(bits, d, -d)


def q2_0_numpy(blocks: np.ndarray) -> np.ndarray:
    """Independent decoder: block_q2_0 = {fp16 d, u8 qs[16]}, 2-bit codes
    sequential from the low bits, y = (code - 1) * d."""
    d = np.ascontiguousarray(blocks[:, 0:2]).view("<f2").astype(np.float32)
    codes = (blocks[:, 2:18, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    return (codes.reshape(len(blocks), 64).astype(np.float32) - np.float32(1)) * d


@pytest.mark.parametrize("sane", [True, False], ids=["sane", "raw"])
@pytest.mark.parametrize("t, ref", [(T.Q1_0, q1_0_numpy), (T.Q2_0, q2_0_numpy)],
                         ids=["Q1_0", "Q2_0"])
def test_low_bit_matches_numpy(t, ref, sane):
    with np.errstate(all="ignore"):
        check_against(t, ref, N_SANE if sane else N_RAW,
                      np.random.default_rng(400 + t), sane=sane)


# --- MXFP4, NVFP4 ---------------------------------------------------------------

def e2m1_doubled(code: int) -> int:
    # E2M1: sign bit 3, exponent bits 1-2 (bias 1), mantissa bit 0. Twice
    # its value is an integer; as in ggml's int8 table, code 8 (-0) is 0.
    s, e, m = code >> 3, (code >> 1) & 3, code & 1
    v = Fraction(m, 2) if e == 0 else Fraction(2 + m, 2) * 2 ** (e - 1)
    return int(-2 * v if s else 2 * v)


def test_e2m1_table_values():
    # the table of formats.md §7, from the definition above
    assert [e2m1_doubled(c) for c in range(16)] == [0, 1, 2, 3, 4, 6, 8, 12,
                                                    0, -1, -2, -3, -4, -6, -8, -12]


def nibbles(codes, n) -> bytes:
    # codes[j] in the low nibble of byte j, codes[j + n] in its high nibble
    return bytes(int(codes[j]) | (int(codes[j + n]) << 4) for j in range(n))


@pytest.mark.parametrize("e", [0, 1, 2, 100, 127, 128, 200, 253, 254, 255])
def test_mxfp4_hand(e):
    codes = np.random.default_rng(24).permutation(np.tile(np.arange(16), 2))
    y = dequant_one(T.MXFP4, bytes([e]) + nibbles(codes, 16))
    # ggml_e8m0_to_fp32_half(e) = 2^(e-128), subnormal for e < 2, 2^127 for
    # e = 255; ±Inf where the product passes FLT_MAX (e >= 254).
    exp = [math.ldexp(e2m1_doubled(int(c)), e - 128) for c in codes]
    assert_bits_equal(y, as_f32(exp))


def test_mxfp4_code8_is_plus_zero():
    y = dequant_one(T.MXFP4, bytes([127]) + bytes([0x88] * 16))
    assert (y.view(np.uint32) == 0).all()


def ue4m3_half(x: int) -> Fraction:
    # formats.md §4: 0x00 and 0x7F are 0; bit 7 is ignored otherwise;
    # exp = bits 3-6 (bias 7), man = bits 0-2; the result is half the value.
    if x in (0x00, 0x7F):
        return Fraction(0)
    ex, man = (x >> 3) & 15, x & 7
    raw = Fraction(man, 512) if ex == 0 else (1 + Fraction(man, 8)) * Fraction(2) ** (ex - 7)
    return raw / 2


def test_nvfp4_every_scale_byte():
    # 64 blocks x 4 sub-blocks = all 256 scale bytes (0x80.., 0x7F, 0xFF too)
    rng = np.random.default_rng(25)
    raws, exp = [], []
    for blk in range(64):
        sbytes = list(range(4 * blk, 4 * blk + 4))
        codes = [rng.permutation(16) for _ in range(4)]
        raws.append(bytes(sbytes) + b"".join(nibbles(c, 8) for c in codes))
        for s in range(4):
            # outputs 16s+j: low nibble of byte 8s+j; 16s+8+j: its high nibble
            # int * float, so that -1 * 0.0 is -0.0 as in C's (float)kv * D
            exp += [e2m1_doubled(int(c)) * float(ue4m3_half(sbytes[s])) for c in codes[s]]
    blocks = np.frombuffer(b"".join(raws), np.uint8).reshape(64, 36)
    y = dequantize_blocks(T.NVFP4, blocks).reshape(-1)
    assert_bits_equal(y, as_f32(exp))
    assert ue4m3_half(0xFF) == 240 and ue4m3_half(0x7F) == 0


# --- gguf-py ----------------------------------------------------------------

GGUF_TYPES = [T.TQ1_0, T.TQ2_0, T.MXFP4, T.NVFP4]


@pytest.mark.parametrize("t", GGUF_TYPES, ids=lambda t: t.name)
def test_matches_gguf_sane(t):
    check_against_gguf(t, N_SANE, np.random.default_rng(100 + t), sane=True)


@pytest.mark.parametrize("t", GGUF_TYPES, ids=lambda t: t.name)
def test_matches_gguf_raw(t):
    check_against_gguf(t, N_RAW, np.random.default_rng(200 + t), sane=False)
