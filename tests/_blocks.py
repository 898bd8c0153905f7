"""Shared test helpers for the format oracle: random blocks of any ggml type,
fp16 bits of Python floats, bitwise comparison, and the gguf-py cross-check.

Only generic helpers live here; each format's hand-computed blocks are built
in its own test module.
"""
from __future__ import annotations

import struct
from fractions import Fraction

import gguf
import numpy as np

from strata_ref import synth
from strata_ref.formats import dequantize_blocks
from strata_ref.types import GGMLType, block_format

CANON_NAN = 0x7FFFFFFF


# --- random blocks ---------------------------------------------------------

def random_blocks(t, n: int, rng: np.random.Generator, sane: bool = True) -> np.ndarray:
    """n random blocks of type t, uint8 of shape (n, block_bytes)
    (`strata_ref.synth.blocks`).

    Raw mode (sane=False): uniformly random bytes, so scales may be NaN/Inf.
    Sane mode: random bytes with every scale in synth's "valid" range (what
    ggml_validate_row_data accepts: finite fp16/f32 scales, E8M0 bytes other
    than 0xFF, UE4M3 0..0x7E, IQ1_M's d spread over four nibbles finite).
    """
    return synth.blocks(t, n, rng, "valid" if sane else None)


# --- scalar helpers for hand-computed blocks -------------------------------

def half_bits(x: float) -> int:
    """fp16 bits of x (IEEE binary16 via struct); x must be exactly a half."""
    (h,) = struct.unpack("<H", struct.pack("<e", x))
    if struct.unpack("<e", struct.pack("<H", h))[0] != x:
        raise ValueError(f"{x!r} is not exactly representable as fp16")
    return h


def half_value(bits: int) -> float:
    """Python float value of a finite fp16 bit pattern (struct)."""
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def f32_value(bits: int) -> float:
    """Python float value of a float32 bit pattern (struct)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def add_exact(a: float, b: float) -> float:
    """a + b in float64, asserting that no rounding happened, so that one
    later conversion to float32 is the single rounding C performs."""
    s = a + b
    assert Fraction(s) == Fraction(a) + Fraction(b), (a, b)
    return s


def as_f32(values) -> np.ndarray:
    """float32 array from exact Python floats (each rounded once, RNE)."""
    with np.errstate(over="ignore"):
        return np.array(values, dtype=np.float64).astype(np.float32)


def dequant_one(t, raw: bytes) -> np.ndarray:
    """The oracle's float32 output for one block given as bytes."""
    fmt = block_format(t)
    assert len(raw) == fmt.block_bytes, (len(raw), fmt.block_bytes)
    return dequantize_blocks(t, np.frombuffer(raw, dtype=np.uint8)[None])[0]


# --- comparisons -----------------------------------------------------------

def assert_bits_equal(ours: np.ndarray, ref: np.ndarray, nan_any: bool = False,
                      what: str = "") -> None:
    """Bitwise comparison of float32 arrays of the same shape.

    Our NaNs must all be the canonical 0x7FFFFFFF. With `nan_any`, wherever
    `ref` is NaN (any payload or sign) ours must be NaN; everywhere else the
    bits must be equal (±0, ±Inf and subnormals included).
    """
    ours = np.asarray(ours)
    ref = np.asarray(ref)
    assert ours.dtype == np.float32 and ref.dtype == np.float32, (ours.dtype, ref.dtype)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    ob = ours.view(np.uint32)
    rb = ref.view(np.uint32)
    onan = np.isnan(ours)
    bad_nan = onan & (ob != CANON_NAN)
    assert not bad_nan.any(), f"{what}: non-canonical NaN at {np.argwhere(bad_nan)[:5]}"
    if nan_any:
        rnan = np.isnan(ref)
        diff = (rnan != onan) | (~rnan & (ob != rb))
    else:
        diff = ob != rb
    if diff.any():
        idx = np.argwhere(diff)
        i = tuple(idx[0])
        raise AssertionError(
            f"{what}: {len(idx)} of {ours.size} values differ; first at {i}: "
            f"ours {ours[i]!r} (0x{int(ob[i]):08x}), ref {ref[i]!r} (0x{int(rb[i]):08x})")


def gguf_dequantize(t, blocks: np.ndarray) -> np.ndarray:
    """gguf-py 0.19.0's `quants.dequantize` of (n, B) blocks -> (n, QK) f32."""
    fmt = block_format(t)
    qt = gguf.GGMLQuantizationType[GGMLType(t).name]
    with np.errstate(all="ignore"):
        out = gguf.quants.dequantize(np.ascontiguousarray(blocks).reshape(-1), qt)
    return np.asarray(out, dtype=np.float32).reshape(len(blocks), fmt.block_values)


def check_against(t, reference, n: int, rng: np.random.Generator, sane: bool,
                  chunk: int = 25_000) -> None:
    """Compare the oracle with `reference(blocks) -> float32 (n, QK)` on n
    random blocks (sane: bit for bit; raw: bit for bit where the reference
    is not NaN, NaN where it is), in chunks to bound memory."""
    done = 0
    while done < n:
        m = min(chunk, n - done)
        blocks = random_blocks(t, m, rng, sane=sane)
        ours = dequantize_blocks(t, blocks)
        ref = reference(blocks)
        assert_bits_equal(ours, ref, nan_any=not sane,
                          what=f"{GGMLType(t).name} {'sane' if sane else 'raw'}")
        done += m


def check_against_gguf(t, n: int, rng: np.random.Generator, sane: bool) -> None:
    """check_against with gguf-py's dequantizer as the reference."""
    check_against(t, lambda b: gguf_dequantize(t, b), n, rng, sane)
