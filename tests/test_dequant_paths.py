"""The dequant drivers' three paths give the same bits.

`strata_ref.formats` runs a call through one of three compiled drivers: the
serial one below SERIAL_VALUES outputs, the streaming one (non-temporal
stores through a scratch block, formats._stream) from STREAM_VALUES outputs
on when the caller's output is contiguous per block and 16-byte aligned,
else (and for an output the call allocates) the parallel one. The other
tests mostly make small calls (serial); here every type's large call is
checked bitwise against the serial driver, on random bytes (so non-finite
scales and NaN outputs occur), through the public API.
"""
from __future__ import annotations

import numpy as np
import pytest

import strata_ref as sr
from strata_ref import formats
from strata_ref.formats import _stream
from strata_ref.types import GGMLType as T

# Each type costs three numba compiles (cached afterwards); the default run
# takes a few, -m slow all.
FAST = {T.Q4_0, T.Q8_0, T.Q4_K, T.TQ2_0, T.IQ1_S}


def _types():
    return [pytest.param(t, id=t.name, marks=[] if t in FAST else [pytest.mark.slow])
            for t in formats.dequant_types()]


def _tensor(t, rng):
    fmt = sr.block_format(t)
    cols = 64 * fmt.block_values
    rows = -(-formats.STREAM_VALUES // cols) + 3     # just past the threshold
    raw = rng.integers(0, 256, rows * cols // fmt.block_values * fmt.block_bytes, dtype=np.uint8)
    return raw, rows, cols


@pytest.mark.parametrize("t", _types())
def test_large_calls_equal_the_serial_driver(t, monkeypatch):
    raw, rows, cols = _tensor(t, np.random.default_rng(int(t)))
    fast = sr.dequant_f32(t, raw, rows, cols, out=np.empty((rows, cols), np.float32))
    padded = sr.dequant_f32(t, raw, rows, cols, ld=cols + 4,        # aligned rows: streams
                            out=np.zeros((rows, cols + 4), np.float32))
    fresh = sr.dequant_f32(t, raw, rows, cols)                      # allocated: never streams
    odd = np.zeros(rows * (cols + 1) + 1, np.float32)               # 4-byte aligned: does not
    sr.dequant_f32(t, raw, rows, cols, ld=cols + 1, out=odd[1:])
    monkeypatch.setattr(formats, "STREAM_VALUES", 1 << 62)
    plain = sr.dequant_f32(t, raw, rows, cols)
    monkeypatch.setattr(formats, "SERIAL_VALUES", 1 << 62)
    ref = sr.dequant_f32(t, raw, rows, cols).view(np.uint32)
    assert np.array_equal(fast.view(np.uint32), ref)
    assert np.array_equal(fresh.view(np.uint32), ref)
    assert np.array_equal(plain.view(np.uint32), ref)
    assert np.array_equal(padded[:, :cols].view(np.uint32), ref)
    assert not padded[:, cols:].any()
    got = np.lib.stride_tricks.as_strided(odd[1:], (rows, cols), ((cols + 1) * 4, 4))
    assert np.array_equal(got.view(np.uint32), ref)


def test_path_choice():
    fmt = sr.block_format(T.Q4_K)
    n = formats.STREAM_VALUES // fmt.block_values
    out = np.empty((1, n, fmt.block_values), np.float32)
    assert formats._streamable(out) == _stream.AVAILABLE
    assert not formats._streamable(out[:, : n // 2])                 # too small
    flat = np.empty(out.size + 1, np.float32)
    off = flat[1:].reshape(out.shape) if flat[1:].ctypes.data % 16 else flat[:-1].reshape(out.shape)
    assert not formats._streamable(off)                               # not 16-byte aligned
    assert not formats._streamable(np.empty((1, n, 2 * fmt.block_values), np.float32)[:, :, ::2])


@pytest.mark.parametrize("t", [T.F16, T.BF16, T.F32], ids=lambda t: t.name)
def test_plain_floats_parallel_equal_serial_and_numpy(t, monkeypatch):
    from strata_ref import numerics
    rng = np.random.default_rng(7)
    rows, cols = 64, 4096                                     # > SERIAL_VALUES
    wide = t == T.F32
    bits = rng.integers(0, 1 << (32 if wide else 16), rows * cols, dtype=np.uint64)
    raw = bits.astype(np.uint32 if wide else np.uint16).view(np.uint8)
    got = sr.dequant_f32(t, raw, rows, cols).view(np.uint32)
    monkeypatch.setattr(numerics, "SERIAL_VALUES", 1 << 62)
    serial = sr.dequant_f32(t, raw, rows, cols).view(np.uint32)
    if t == T.F16:
        want = numerics.F16_TO_F32.view(np.uint32)[bits.astype(np.uint16)]
    elif t == T.BF16:
        want = bits.astype(np.uint32) << 16
    else:
        want = bits.astype(np.uint32)
    want = np.where((want & 0x7FFFFFFF) > 0x7F800000, np.uint32(0x7FFFFFFF), want).reshape(rows, cols)
    assert np.array_equal(got, want)
    assert np.array_equal(serial, want)
