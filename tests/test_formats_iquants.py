"""I-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_NL,
IQ4_XS) against their definition (formats.md §5), gguf-py 0.19.0 and, where
a ggml build is found, ggml's C `to_float`.

The definition is read a second time here, independently of the package:
byte offsets are taken from the spec's layout column (formats.md §3), the
tables from gguf-py's compressed copies (not from strata_ref's), and the
arithmetic is done with Python floats, every product checked exact, then
rounded once to float32. Blocks are assembled from logical values (grid
index, sign byte, scale) by encoders written in the direction opposite to
the decoder.
"""
from __future__ import annotations

import importlib.util
import struct
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from gguf import quants as gq

from _blocks import (as_f32, assert_bits_equal, dequant_one, gguf_dequantize,
                     half_bits, half_value, random_blocks)
from strata_ref.formats import dequantize_blocks
from strata_ref.types import GGMLType as T

N_SANE = 100_000
N_RAW = 20_000
CHUNK = 25_000

IQ_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S,
            T.IQ1_M, T.IQ4_NL, T.IQ4_XS]


# --- second source for the tables: gguf-py ---------------------------------

def _gguf_grid(cls) -> list[list[int]]:
    cls.init_grid()
    g = np.asarray(cls.grid)
    return g.reshape(g.shape[-2], g.shape[-1]).astype(np.int64).tolist()


G_IQ2XXS = _gguf_grid(gq.IQ2_XXS)
G_IQ2XS = _gguf_grid(gq.IQ2_XS)
G_IQ2S = _gguf_grid(gq.IQ2_S)
G_IQ3XXS = _gguf_grid(gq.IQ3_XXS)
G_IQ3S = _gguf_grid(gq.IQ3_S)
G_IQ1S = _gguf_grid(gq.IQ1_S)
KSIGNS = list(gq.IQ2_XXS.ksigns)
KV = list(gq.IQ4_NL.kvalues)


# --- exact scalar arithmetic -------------------------------------------------

def mul(a: float, b: float) -> float:
    """a * b in float64, asserting it is exact (so C's float32 product of
    the same operands is this value, formats.md §6)."""
    p = a * b
    assert Fraction(p) == Fraction(a) * Fraction(b), (a, b)
    return p


def signed(v: float, negate: int) -> float:
    return -v if negate else v


def u16(raw: bytes, o: int) -> int:
    return int.from_bytes(raw[o:o + 2], "little")


def u32(raw: bytes, o: int) -> int:
    return int.from_bytes(raw[o:o + 4], "little")


def h(x: float) -> bytes:
    return struct.pack("<H", half_bits(x))


class Seen:
    """Which grid rows, sign bytes and scales a reference decode touched."""

    def __init__(self):
        self.grid, self.sign, self.scale, self.delta = set(), set(), set(), set()


# --- reference decoders, from formats.md §3 and §5 -------------------------

def ref_iq2_xxs(raw, seen=None):
    # d@0, qs:u16[32]@2 read as pairs of u32 (a0: 4 grid bytes, a1: 4 x 7-bit
    # sign indices and the 4-bit scale on top).
    d = half_value(u16(raw, 0))
    y = []
    for ib in range(8):
        a0, a1 = u32(raw, 2 + 8 * ib), u32(raw, 6 + 8 * ib)
        db = mul(mul(d, 0.5 + (a1 >> 28)), 0.25)
        for l in range(4):
            g, s = (a0 >> (8 * l)) & 255, KSIGNS[(a1 >> (7 * l)) & 127]
            if seen:
                seen.grid.add(g), seen.sign.add((a1 >> (7 * l)) & 127), seen.scale.add(a1 >> 28)
            y += [signed(mul(db, G_IQ2XXS[g][j]), (s >> j) & 1) for j in range(8)]
    return y


def ref_iq2_xs(raw, seen=None):
    # d@0, qs:u16[32]@2 (9-bit grid index, 7-bit sign index), scales[8]@66.
    d = half_value(u16(raw, 0))
    y = []
    for ib in range(8):
        sc = raw[66 + ib]
        for l in range(4):
            w = u16(raw, 2 + 2 * (4 * ib + l))
            nib = sc & 15 if l < 2 else sc >> 4
            db = mul(mul(d, 0.5 + nib), 0.25)
            s = KSIGNS[w >> 9]
            if seen:
                seen.grid.add(w & 511), seen.sign.add(w >> 9), seen.scale.add(nib)
            y += [signed(mul(db, G_IQ2XS[w & 511][j]), (s >> j) & 1) for j in range(8)]
    return y


def ref_iq2_s(raw, seen=None):
    # d@0, qs[32]@2, signs[32]@34, qh[8]@66, scales[8]@74.
    d = half_value(u16(raw, 0))
    y = []
    for ib in range(8):
        sc = raw[74 + ib]
        for l in range(4):
            g = raw[2 + 4 * ib + l] | (((raw[66 + ib] >> (2 * l)) & 3) << 8)
            s = raw[34 + 4 * ib + l]
            nib = sc & 15 if l < 2 else sc >> 4
            db = mul(mul(d, 0.5 + nib), 0.25)
            if seen:
                seen.grid.add(g), seen.sign.add(s), seen.scale.add(nib)
            y += [signed(mul(db, G_IQ2S[g][j]), (s >> j) & 1) for j in range(8)]
    return y


def ref_iq3_xxs(raw, seen=None):
    # d@0, qs[64]@2 (two 4-element grid rows per group),
    # scales_and_signs:u32[8]@66.
    d = half_value(u16(raw, 0))
    y = []
    for ib in range(8):
        a = u32(raw, 66 + 4 * ib)
        db = mul(mul(d, 0.5 + (a >> 28)), 0.5)
        for l in range(4):
            g1, g2 = raw[2 + 8 * ib + 2 * l], raw[2 + 8 * ib + 2 * l + 1]
            s = KSIGNS[(a >> (7 * l)) & 127]
            if seen:
                seen.grid.update((g1, g2)), seen.sign.add((a >> (7 * l)) & 127)
                seen.scale.add(a >> 28)
            row = G_IQ3XXS[g1] + G_IQ3XXS[g2]
            y += [signed(mul(db, row[j]), (s >> j) & 1) for j in range(8)]
    return y


def ref_iq3_s(raw, seen=None):
    # d@0, qs[64]@2, qh[8]@66, signs[32]@74, scales[4]@106.
    d = half_value(u16(raw, 0))
    y = []
    for ib in range(8):
        nib = (raw[106 + ib // 2] >> (4 * (ib % 2))) & 15
        db = mul(d, 1 + 2 * nib)
        qh = raw[66 + ib]
        for l in range(4):
            g1 = raw[2 + 8 * ib + 2 * l] | (((qh >> (2 * l)) & 1) << 8)
            g2 = raw[2 + 8 * ib + 2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8)
            s = raw[74 + 4 * ib + l]
            if seen:
                seen.grid.update((g1, g2)), seen.sign.add(s), seen.scale.add(nib)
            row = G_IQ3S[g1] + G_IQ3S[g2]
            y += [signed(mul(db, row[j]), (s >> j) & 1) for j in range(8)]
    return y


def ref_iq1_s(raw, seen=None):
    # d@0, qs[32]@2, qh:u16[8]@34 (3 high index bits per group, 3-bit scale
    # in bits 12-14, delta sign in bit 15).
    d = half_value(u16(raw, 0))
    y = []
    for ib in range(8):
        q = u16(raw, 34 + 2 * ib)
        dl = mul(d, 2 * ((q >> 12) & 7) + 1)
        delta = -0.125 if q & 0x8000 else 0.125
        for l in range(4):
            g = raw[2 + 4 * ib + l] | (((q >> (3 * l)) & 7) << 8)
            if seen:
                seen.grid.add(g), seen.scale.add((q >> 12) & 7), seen.delta.add(delta)
            y += [mul(dl, G_IQ1S[g][j] + delta) for j in range(8)]
    return y


def iq1_m_d_bits(raw) -> int:
    # The fp16 d of IQ1_M: top nibble of each u16 scale, sc0's lowest.
    sc = [u16(raw, 48 + 2 * k) for k in range(4)]
    return sum((sc[k] >> 12) << (4 * k) for k in range(4))


def ref_iq1_m(raw, seen=None):
    # qs[32]@0, qh[16]@32, scales:u16[4]@48.
    d = half_value(iq1_m_d_bits(raw))
    y = []
    for ib in range(8):
        sc = u16(raw, 48 + 2 * (ib // 2))
        s1 = (sc >> (6 * (ib % 2))) & 7
        s2 = (sc >> (6 * (ib % 2) + 3)) & 7
        for l in range(4):
            qh = raw[32 + 2 * ib + l // 2] >> (4 * (l % 2))
            g = raw[4 * ib + l] | ((qh & 7) << 8)
            delta = -0.125 if qh & 8 else 0.125
            dl = mul(d, 2 * (s1 if l < 2 else s2) + 1)
            if seen:
                seen.grid.add(g), seen.scale.add(s1 if l < 2 else s2), seen.delta.add(delta)
            y += [mul(dl, G_IQ1S[g][j] + delta) for j in range(8)]
    return y


def ref_iq4_nl(raw, seen=None):
    # d@0, qs[16]@2.
    d = half_value(u16(raw, 0))
    lo = [mul(d, KV[raw[2 + j] & 15]) for j in range(16)]
    hi = [mul(d, KV[raw[2 + j] >> 4]) for j in range(16)]
    if seen:
        seen.grid.update(raw[2:18])
    return lo + hi


def ref_iq4_xs(raw, seen=None):
    # d@0, scales_h:u16@2, scales_l[4]@4, qs[128]@8.
    d = half_value(u16(raw, 0))
    sh = u16(raw, 2)
    y = []
    for ib in range(8):
        ls = ((raw[4 + ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
        dl = mul(d, ls - 32)
        qs = raw[8 + 16 * ib: 8 + 16 * ib + 16]
        if seen:
            seen.scale.add(ls), seen.grid.update(qs)
        y += [mul(dl, KV[q & 15]) for q in qs] + [mul(dl, KV[q >> 4]) for q in qs]
    return y


REFERENCE = {
    T.IQ2_XXS: ref_iq2_xxs, T.IQ2_XS: ref_iq2_xs, T.IQ2_S: ref_iq2_s,
    T.IQ3_XXS: ref_iq3_xxs, T.IQ3_S: ref_iq3_s, T.IQ1_S: ref_iq1_s,
    T.IQ1_M: ref_iq1_m, T.IQ4_NL: ref_iq4_nl, T.IQ4_XS: ref_iq4_xs,
}


def expected_f32(t, raw, seen=None) -> np.ndarray:
    ref = REFERENCE[t](raw, seen)
    y = as_f32(ref)
    # The definition's exact values are float32 values (formats.md §6).
    assert np.array_equal(y.astype(np.float64), np.array(ref)), t.name
    return y


def check_blocks(t, raws, seen=None):
    ours = dequantize_blocks(t, np.frombuffer(b"".join(raws), np.uint8).reshape(len(raws), -1))
    want = np.stack([expected_f32(t, r, seen) for r in raws])
    assert_bits_equal(ours, want, what=t.name)


# --- encoders: logical values -> block bytes ---------------------------------

def enc_iq2_xxs(d, grid, sign, scale):
    """grid[32], sign[32] (7-bit ksigns indices), scale[8] (4 bits)."""
    out = h(d)
    for ib in range(8):
        a0 = sum(grid[4 * ib + l] << (8 * l) for l in range(4))
        a1 = sum(sign[4 * ib + l] << (7 * l) for l in range(4)) | (scale[ib] << 28)
        out += struct.pack("<II", a0, a1)
    return out


def enc_iq2_xs(d, grid, sign, scale):
    """grid[32] (9 bits), sign[32] (7-bit ksigns indices), scale[16]:
    low/high nibble per sub-block."""
    qs = b"".join(struct.pack("<H", grid[k] | (sign[k] << 9)) for k in range(32))
    sc = bytes(scale[2 * ib] | (scale[2 * ib + 1] << 4) for ib in range(8))
    return h(d) + qs + sc


def enc_iq2_s(d, grid, sign, scale):
    """grid[32] (10 bits), sign[32] (raw sign bytes), scale[16]."""
    qs = bytes(g & 255 for g in grid)
    qh = bytes(sum((grid[4 * ib + l] >> 8) << (2 * l) for l in range(4)) for ib in range(8))
    sc = bytes(scale[2 * ib] | (scale[2 * ib + 1] << 4) for ib in range(8))
    return h(d) + qs + bytes(sign) + qh + sc


def enc_iq3_xxs(d, grid, sign, scale):
    """grid[64] (two rows per group), sign[32] (7-bit indices), scale[8]."""
    sas = b"".join(struct.pack("<I", sum(sign[4 * ib + l] << (7 * l) for l in range(4))
                               | (scale[ib] << 28)) for ib in range(8))
    return h(d) + bytes(grid) + sas


def enc_iq3_s(d, grid, sign, scale):
    """grid[64] (9 bits, two rows per group), sign[32] (raw), scale[8]."""
    qs = bytes(g & 255 for g in grid)
    qh = bytes(sum((grid[8 * ib + k] >> 8) << k for k in range(8)) for ib in range(8))
    sc = bytes(scale[2 * i] | (scale[2 * i + 1] << 4) for i in range(4))
    return h(d) + qs + qh + bytes(sign) + sc


def enc_iq1_s(d, grid, neg_delta, scale):
    """grid[32] (11 bits), neg_delta[8] (bool), scale[8] (3 bits)."""
    qs = bytes(g & 255 for g in grid)
    qh = b"".join(struct.pack("<H", sum((grid[4 * ib + l] >> 8) << (3 * l) for l in range(4))
                              | (scale[ib] << 12) | (neg_delta[ib] << 15)) for ib in range(8))
    return h(d) + qs + qh


def enc_iq1_m(d, grid, neg_delta, scale):
    """grid[32] (11 bits), neg_delta[32] (one per group), scale[16]: dl1 and
    dl2 scales of each sub-block; d is spread over the scales' top nibbles."""
    qs = bytes(g & 255 for g in grid)
    qh = bytes((grid[2 * k] >> 8) | (neg_delta[2 * k] << 3)
               | ((grid[2 * k + 1] >> 8) << 4) | (neg_delta[2 * k + 1] << 7)
               for k in range(16))
    dbits = half_bits(d)
    sc = b""
    for k in range(4):
        v = sum(scale[2 * (2 * k + i)] << (6 * i) | scale[2 * (2 * k + i) + 1] << (6 * i + 3)
                for i in range(2))
        sc += struct.pack("<H", v | (((dbits >> (4 * k)) & 15) << 12))
    return qs + qh + sc


def enc_iq4_nl(d, qs):
    return h(d) + bytes(qs)


def enc_iq4_xs(d, ls, qs):
    """ls[8] (6-bit scales), qs[128] bytes."""
    sh = sum((ls[ib] >> 4) << (2 * ib) for ib in range(8))
    sl = bytes((ls[2 * i] & 15) | ((ls[2 * i + 1] & 15) << 4) for i in range(4))
    return h(d) + struct.pack("<H", sh) + sl + bytes(qs)


# Scales over the fp16 range: normal, negative, ±0, subnormal, ±max.
D_VALUES = [1.0, -1.0, 0.5, -0.0, 0.0, 65504.0, -65504.0, 2.0 ** -24,
            -3 * 2.0 ** -24, 1.5, -(2.0 ** -14), 1234.0, -0.333251953125]


# --- every grid row, sign pattern and scale --------------------------------

def _perm(k: int, rows: int) -> int:
    # A bijection of range(rows) (rows a power of two) that scatters
    # neighbours, so that the high index bits of adjacent rows, which share
    # a qh byte, differ.
    return (131 * k + 7) % rows


def _systematic(t):
    """Blocks that together use every grid row, every sign byte (or ksigns
    index) and every scale value of type t."""
    raws = []
    if t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S):
        rows, signs = {T.IQ2_XXS: (256, 128), T.IQ2_XS: (512, 128), T.IQ2_S: (1024, 256)}[t]
        enc = {T.IQ2_XXS: enc_iq2_xxs, T.IQ2_XS: enc_iq2_xs, T.IQ2_S: enc_iq2_s}[t]
        nsc = 8 if t == T.IQ2_XXS else 16
        for n in range(rows // 32):
            ks = range(32 * n, 32 * n + 32)
            raws.append(enc(D_VALUES[n % len(D_VALUES)], [_perm(k, rows) for k in ks],
                            [(37 * k) % signs for k in ks],
                            [(3 * n + i) % 16 for i in range(nsc)]))
    elif t in (T.IQ3_XXS, T.IQ3_S):
        rows, signs = (256, 128) if t == T.IQ3_XXS else (512, 256)
        enc = enc_iq3_xxs if t == T.IQ3_XXS else enc_iq3_s
        for n in range(max(rows // 64, 256 // 32)):
            raws.append(enc(D_VALUES[n % len(D_VALUES)],
                            [_perm(k, rows) for k in range(64 * n, 64 * n + 64)],
                            [(37 * k) % signs for k in range(32 * n, 32 * n + 32)],
                            [(8 * n + i) % 16 for i in range(8)]))
    elif t in (T.IQ1_S, T.IQ1_M):
        for n in range(2048 // 32):
            grid = [_perm(k, 2048) for k in range(32 * n, 32 * n + 32)]
            d = D_VALUES[n % len(D_VALUES)]
            if t == T.IQ1_S:
                raws.append(enc_iq1_s(d, grid, [(n + ib) & 1 for ib in range(8)],
                                      [(n + ib) % 8 for ib in range(8)]))
            else:
                raws.append(enc_iq1_m(d, grid, [(n + k // 3) & 1 for k in range(32)],
                                      [(n + 3 * i) % 8 for i in range(16)]))
    elif t == T.IQ4_NL:
        for n in range(16):
            raws.append(enc_iq4_nl(D_VALUES[n % len(D_VALUES)], range(16 * n, 16 * n + 16)))
    elif t == T.IQ4_XS:
        for n in range(8):
            raws.append(enc_iq4_xs(D_VALUES[n % len(D_VALUES)],
                                   [(8 * n + ib) % 64 for ib in range(8)],
                                   [(128 * n + j) % 256 for j in range(128)]))
    return raws


# (grid rows, sign patterns, scale values, deltas) each type must cover;
# IQ4 "grid" = every qs byte.
COVERAGE = {
    T.IQ2_XXS: (256, 128, 16, 0), T.IQ2_XS: (512, 128, 16, 0),
    T.IQ2_S: (1024, 256, 16, 0), T.IQ3_XXS: (256, 128, 16, 0),
    T.IQ3_S: (512, 256, 16, 0), T.IQ1_S: (2048, 0, 8, 2),
    T.IQ1_M: (2048, 0, 8, 2), T.IQ4_NL: (256, 0, 0, 0), T.IQ4_XS: (256, 0, 64, 0),
}


@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_every_grid_row_sign_and_scale(t):
    seen = Seen()
    check_blocks(t, _systematic(t), seen)
    rows, signs, scales, deltas = COVERAGE[t]
    assert seen.grid == set(range(rows))
    assert seen.sign == set(range(signs))
    assert seen.scale == set(range(scales))
    assert len(seen.delta) == deltas


# --- hand-computed blocks ----------------------------------------------------

def test_iq2_xxs_hand():
    # d = -1.5. Sub-block 2: grid rows (0, 1, 165, 255), ksigns indices
    # (0, 1, 0x55, 127), scale 9: db = -1.5 * 9.5 * 0.25 = -3.5625.
    # Every other sub-block is zero: db = -1.5 * 0.5 * 0.25 = -0.1875.
    grid = [0] * 32
    sign = [0] * 32
    scale = [0] * 8
    grid[8:12], sign[8:12], scale[2] = [0, 1, 165, 255], [0, 1, 0x55, 127], 9
    raw = enc_iq2_xxs(-1.5, grid, sign, scale)
    y = dequant_one(T.IQ2_XXS, raw)
    assert y[:8].tolist() == [-1.5] * 8                   # row 0 = 8s: -0.1875 * 8
    assert y[64:72].tolist() == [-28.5] * 8               # -3.5625 * 8, no sign
    g1 = G_IQ2XXS[1]                                      # ksigns[1] = 0x81: j = 0, 7
    assert y[72:80].tolist() == [(-3.5625 * g1[j]) * (-1 if j in (0, 7) else 1)
                                 for j in range(8)]
    g255 = G_IQ2XXS[255]                                  # ksigns[127] = 0xFF: all
    assert y[88:96].tolist() == [3.5625 * g255[j] for j in range(8)]
    assert_bits_equal(y, expected_f32(T.IQ2_XXS, raw))


def test_iq2_xs_hand():
    # d = 2; sub-block 3 scales 0x5A: db = 2 * 10.5 * 0.25 = 5.25 for groups
    # 0-1 and 2 * 5.5 * 0.25 = 2.75 for groups 2-3. Group 2 has w = 0xFFFF:
    # row 511 (all 43), ksigns[127] = 0xFF.
    grid, sign, scale = [0] * 32, [0] * 32, [0] * 16
    scale[6], scale[7] = 10, 5
    grid[14], sign[14] = 511, 127
    raw = enc_iq2_xs(2.0, grid, sign, scale)
    assert raw[2 + 2 * 14: 2 + 2 * 15] == b"\xff\xff"
    y = dequant_one(T.IQ2_XS, raw)
    assert G_IQ2XS[511] == [43] * 8
    assert y[96:104].tolist() == [42.0] * 8               # 5.25 * 8
    assert y[112:120].tolist() == [-118.25] * 8           # -(2.75 * 43)
    assert y[120:128].tolist() == [22.0] * 8              # 2.75 * 8
    assert_bits_equal(y, expected_f32(T.IQ2_XS, raw))


def test_iq2_s_hand():
    # d = 0.5; sub-block 1, scales 12 / 3: db0 = 1.5625, db1 = 0.4375.
    # Group 2 takes its 2 high index bits from qh[1] bits 4-5: row 1023
    # (all 43), sign byte 0x0F.
    grid, sign, scale = [0] * 32, [0] * 32, [0] * 16
    scale[2], scale[3] = 12, 3
    grid[6], sign[6] = 1023, 0x0F
    raw = enc_iq2_s(0.5, grid, sign, scale)
    assert raw[66 + 1] == 0x30 and raw[2 + 6] == 0xFF
    y = dequant_one(T.IQ2_S, raw)
    assert y[32:40].tolist() == [12.5] * 8                # 1.5625 * 8
    assert y[48:56].tolist() == [-18.8125] * 4 + [18.8125] * 4
    assert_bits_equal(y, expected_f32(T.IQ2_S, raw))


def test_iq3_xxs_hand():
    # d = 1, sub-block 0 scale 3: db = (1 * 3.5) * 0.5 = 1.75; group 0 rows
    # 0 (all 4) and 255 (4, 28, 52, 62), ksigns[127] = 0xFF.
    grid, sign, scale = [0] * 64, [0] * 32, [0] * 8
    grid[0], grid[1], sign[0], scale[0] = 0, 255, 127, 3
    raw = enc_iq3_xxs(1.0, grid, sign, scale)
    y = dequant_one(T.IQ3_XXS, raw)
    assert G_IQ3XXS[255] == [4, 28, 52, 62]
    assert y[:8].tolist() == [-7.0] * 4 + [-7.0, -49.0, -91.0, -108.5]
    assert y[8:16].tolist() == [7.0] * 8
    assert y[32:40].tolist() == [1.0] * 8                 # db = 0.25, row 0 (4s)
    assert_bits_equal(y, expected_f32(T.IQ3_XXS, raw))


def test_iq3_s_hand():
    # d = -0.25; sub-block 0 nibble 0: db = -0.25; sub-block 1 nibble 7:
    # db = -0.25 * 15 = -3.75. Sub-block 1, group 3: rows 511 (1, 1, 15, 15;
    # high bit from qh[1] bit 6) and 255 (bit 7 clear); sign byte 0x81.
    grid, sign, scale = [0] * 64, [0] * 32, [0] * 8
    scale[1] = 7
    grid[8 + 6], grid[8 + 7], sign[4 + 3] = 511, 255, 0x81
    raw = enc_iq3_s(-0.25, grid, sign, scale)
    assert raw[66 + 1] == 0x40 and raw[106] == 0x70
    y = dequant_one(T.IQ3_S, raw)
    assert G_IQ3S[511] == [1, 1, 15, 15]
    assert y[:8].tolist() == [-0.25] * 8
    g = G_IQ3S[255]
    assert y[56:64].tolist() == [3.75, -3.75, -56.25, -56.25,
                                 -3.75 * g[0], -3.75 * g[1], -3.75 * g[2], 3.75 * g[3]]
    assert_bits_equal(y, expected_f32(T.IQ3_S, raw))


def test_iq1_s_hand():
    # d = 2; sub-block 0: scale 5 (dl = 22), delta -1/8; group 3 row 2047
    # (all +1) from qs[3] = 0xFF and qh bits 9-11; group 0 row 0 (all -1).
    # Sub-block 1: scale 0 (dl = 2), delta +1/8, row 0.
    grid, neg, scale = [0] * 32, [0] * 8, [0] * 8
    grid[3], neg[0], scale[0] = 2047, 1, 5
    raw = enc_iq1_s(2.0, grid, neg, scale)
    assert struct.unpack_from("<H", raw, 34)[0] == 0x8000 | (5 << 12) | (7 << 9)
    y = dequant_one(T.IQ1_S, raw)
    assert y[:8].tolist() == [-24.75] * 8                  # 22 * (-1 - 1/8)
    assert y[24:32].tolist() == [19.25] * 8                # 22 * (1 - 1/8)
    assert y[32:40].tolist() == [-1.75] * 8                # 2 * (-1 + 1/8)
    assert_bits_equal(y, expected_f32(T.IQ1_S, raw))


def test_iq1_m_hand():
    # d = 1.5 = fp16 0x3E00, stored as the nibbles 0, 0, E, 3 on top of
    # scales[0..3]. Sub-block 0: scales 2 and 6 (dl1 = 7.5, dl2 = 19.5);
    # sub-block 1: 1 and 7 (dl1 = 4.5, dl2 = 22.5). qh[0] = 0x8F: group 0
    # row 2047 (all +1) with delta -1/8; group 1 row 0 with delta -1/8.
    grid, neg, scale = [0] * 32, [0] * 32, [0] * 16
    grid[0], neg[0], neg[1] = 2047, 1, 1
    scale[0:4] = [2, 6, 1, 7]
    raw = enc_iq1_m(1.5, grid, neg, scale)
    assert raw[32] == 0x8F
    assert struct.unpack_from("<4H", raw, 48) == (0x0E72, 0x0000, 0xE000, 0x3000)
    assert iq1_m_d_bits(raw) == 0x3E00
    y = dequant_one(T.IQ1_M, raw)
    assert y[0:8].tolist() == [6.5625] * 8                 # 7.5 * (1 - 1/8)
    assert y[8:16].tolist() == [-8.4375] * 8               # 7.5 * (-1 - 1/8)
    assert y[16:24].tolist() == [-17.0625] * 8             # 19.5 * (-1 + 1/8)
    assert y[32:48].tolist() == [-3.9375] * 16             # 4.5 * (-7/8)
    assert y[48:64].tolist() == [-19.6875] * 16            # 22.5 * (-7/8)
    assert y[64:].tolist() == [-1.3125] * 192              # 1.5 * (-7/8)
    assert_bits_equal(y, expected_f32(T.IQ1_M, raw))


def test_iq4_nl_hand():
    raw = enc_iq4_nl(-2.0, [j | ((15 - j) << 4) for j in range(16)])
    y = dequant_one(T.IQ4_NL, raw)
    assert y[0] == 254.0 and y[8] == -2.0 and y[16] == -226.0 and y[31] == 254.0
    assert y.tolist() == [-2.0 * KV[j] for j in range(16)] + [-2.0 * KV[15 - j] for j in range(16)]
    assert_bits_equal(y, expected_f32(T.IQ4_NL, raw))


@pytest.mark.parametrize("d", [0.5, -0.5])
def test_iq4_xs_hand(d):
    # ls = 0 (dl = -32 d), 32 (dl = ±0: signed zeros follow C's literal
    # formula), 63 (dl = 31 d), then zeros. Sub-block 2's bytes 0xF0 pick
    # kv[0] = -127 (low nibble) and kv[15] = 113 (high nibble).
    qs = [0] * 128
    qs[32:48] = [0xF0] * 16
    raw = enc_iq4_xs(d, [0, 32, 63, 0, 0, 0, 0, 0], qs)
    assert raw[2:8] == bytes([56, 0, 0x00, 0x0F, 0, 0])
    y = dequant_one(T.IQ4_XS, raw)
    s = 1.0 if d > 0 else -1.0
    assert y[:32].tolist() == [s * 2032.0] * 32            # -16 * -127
    zero = y[32:64].view(np.uint32)
    assert (zero == (0x80000000 if d > 0 else 0)).all()   # (+0) * -127 = -0
    assert y[64:80].tolist() == [s * -1968.5] * 16         # 15.5 * -127
    assert y[80:96].tolist() == [s * 1751.5] * 16          # 15.5 * 113
    assert_bits_equal(y, expected_f32(T.IQ4_XS, raw))


@pytest.mark.parametrize("t", [T.IQ2_XXS, T.IQ3_S], ids=lambda t: t.name)
@pytest.mark.parametrize("d", [0.0, -0.0])
def test_zero_scale_keeps_the_sign_rule(t, d):
    # With d = ±0 every product is a zero of d's sign, and a set sign bit
    # negates it: the output's sign bit is sign(d) XOR the sign bit.
    raw = h(d) + _systematic(t)[1][2:]          # d@0 in both types
    y = dequant_one(t, raw)
    assert (y == 0).all()
    assert_bits_equal(y, expected_f32(t, raw))
    assert len(set(y.view(np.uint32).tolist())) == 2      # both zeros occur


def test_nonfinite_scales():
    # d = ±Inf: IQ2_XXS gives ±Inf with the sign of the finite block's value
    # times sign(d); IQ4_XS's ls = 32 gives Inf * 0 = NaN, which must be the
    # canonical 0x7FFFFFFF.
    rest = _systematic(T.IQ2_XXS)[0][2:]
    finite = expected_f32(T.IQ2_XXS, h(1.0) + rest)
    for bits, sign in ((0x7C00, 1), (0xFC00, -1)):
        y = dequant_one(T.IQ2_XXS, struct.pack("<H", bits) + rest)
        want = np.where(sign * finite > 0, np.inf, -np.inf).astype(np.float32)
        assert_bits_equal(y, want)
    raw = struct.pack("<H", 0x7C00) + enc_iq4_xs(1.0, [32] * 8, [0] * 128)[2:]
    y = dequant_one(T.IQ4_XS, raw)
    assert (y.view(np.uint32) == 0x7FFFFFFF).all()


# --- random blocks against gguf-py ---------------------------------------

def valid_blocks(t, n, rng) -> np.ndarray:
    """n random blocks that ggml_validate_row_data accepts: random bytes
    with finite scales; for IQ1_M the reassembled d is finite too."""
    return random_blocks(t, n, rng, sane=True)


def _compare(t, reference, n, rng, sane):
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        blocks = valid_blocks(t, m, rng) if sane else random_blocks(t, m, rng, sane=False)
        assert_bits_equal(dequantize_blocks(t, blocks), reference(t, blocks),
                          nan_any=not sane, what=f"{t.name} {'sane' if sane else 'raw'}")


@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_matches_gguf_on_valid_blocks(t):
    _compare(t, gguf_dequantize, N_SANE, np.random.default_rng(1000 + t.value), sane=True)


@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_matches_gguf_on_raw_bytes(t):
    # NaN/Inf scales: bits equal wherever gguf-py is not NaN; where it is,
    # ours is the canonical NaN (gguf-py multiplies by -1, so its NaN signs
    # differ from C's; formats.md §9).
    _compare(t, gguf_dequantize, N_RAW, np.random.default_rng(2000 + t.value), sane=False)


def test_valid_blocks_helper_makes_iq1_m_scales_finite():
    blocks = valid_blocks(T.IQ1_M, 5000, np.random.default_rng(3))
    d = np.array([iq1_m_d_bits(bytes(b)) for b in blocks])
    assert not ((d & 0x7C00) == 0x7C00).any()
    assert len(np.unique(d)) > 4000                       # d still spans the range


# --- ggml's C library, when a build is at hand -----------------------------

def _ggml():
    path = Path(__file__).resolve().parents[1] / "tools" / "ggml_c.py"
    if not path.is_file():
        return None
    mod = sys.modules.get("ggml_c")
    if mod is None:
        spec = importlib.util.spec_from_file_location("ggml_c", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ggml_c"] = mod      # dataclasses look their module up
        spec.loader.exec_module(mod)
    return mod.load()


@pytest.fixture(scope="module")
def ggml():
    lib = _ggml()
    if lib is None:
        pytest.skip("no ggml-base library (tools/ggml_c.py finds none)")
    return lib


@pytest.mark.parametrize("sane", [True, False], ids=["valid", "raw"])
@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_matches_ggml_c(ggml, t, sane):
    def reference(t, blocks):
        return ggml.to_float(int(t), blocks.tobytes()).reshape(len(blocks), -1)
    _compare(t, reference, 20_000, np.random.default_rng(3000 + t.value), sane)
