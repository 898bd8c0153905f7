"""The kernel-shaped dequant API: row slices, ld padding, out buffers, errors."""
import ml_dtypes
import numpy as np
import pytest

from strata_ref import UnsupportedTypeError, dequant_bf16, dequant_f16, dequant_f32, dequantize
from strata_ref import numerics as nm


def _q8_0_tensor(rows, cols, seed=0):
    r = np.random.default_rng(seed)
    nb = rows * cols // 32
    blocks = r.integers(0, 256, (nb, 34), dtype=np.uint8)
    d = r.uniform(-2, 2, nb).astype(np.float16)
    blocks[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(-1), d.astype(np.float32), blocks[:, 2:].view(np.int8).astype(np.float32)


def test_q8_0_values_row_slice_and_padding():
    raw, d, q = _q8_0_tensor(6, 128)
    full = (q * d[:, None]).astype(np.float32).reshape(6, 128)   # products exact
    assert np.array_equal(dequant_f32("Q8_0", raw, 6, 128).view(np.uint32), full.view(np.uint32))
    out = np.full((3, 136), -12345.0, np.float32)
    r = dequant_f32("Q8_0", raw, 3, 128, row0=2, ld=136, out=out)
    assert r is out
    assert np.array_equal(out[:, :128].view(np.uint32), full[2:5].view(np.uint32))
    assert np.all(out[:, 128:] == -12345.0)                      # padding untouched
    flat = np.full(2 * 136, 7.0, np.float32)
    dequant_f32("Q8_0", raw, 2, 128, row0=4, ld=136, out=flat)
    assert np.array_equal(flat.reshape(2, 136)[:, :128], full[4:6]) and np.all(flat.reshape(2, 136)[:, 128:] == 7)
    new = dequant_f32("Q8_0", raw, 2, 128, row0=1, ld=130)
    assert new.shape == (2, 130) and np.all(new[:, 128:] == 0)


def test_f16_bf16_are_conversions_of_f32():
    raw, _, _ = _q8_0_tensor(4, 64, seed=3)
    raw = raw.copy()
    raw[0:2] = [0x00, 0x7E]            # NaN scale in block 0
    raw[34:36] = [0xFF, 0x7B]          # 65504: products overflow f16
    f32 = dequant_f32(8, raw, 4, 64)
    assert np.all(f32.view(np.uint32)[0, :32] == 0x7FFFFFFF)
    h = dequant_f16(8, raw, 4, 64)
    b = dequant_bf16(8, raw, 4, 64)
    assert h.dtype == np.float16 and b.dtype == ml_dtypes.bfloat16
    assert np.array_equal(h.view(np.uint16), nm.f32_to_f16_bits(f32))
    assert np.array_equal(b.view(np.uint16), nm.f32_to_bf16_bits(f32))
    assert np.all(h.view(np.uint16)[0, :32] == 0x7FFF) and np.all(b.view(np.uint16)[0, :32] == 0x7FFF)
    assert np.isinf(h[0, 32:64]).any()


def test_plain_float_types():
    x = np.array([1.5, -0.0, np.inf, np.nan, 65504.0], np.float32)
    x.view(np.uint32)[3] = 0x7F800001
    assert np.array_equal(dequantize(x.tobytes(), "F32").view(np.uint32),
                          np.array([0x3FC00000, 0x80000000, 0x7F800000, 0x7FFFFFFF, 0x477FE000], np.uint32))
    h = np.array([0x3C00, 0x7C01, 0x0001], np.uint16)
    assert dequantize(h.tobytes(), "F16").view(np.uint32).tolist() == [0x3F800000, 0x7FFFFFFF, 0x33800000]
    bf = np.array([0x3F80, 0xFF81, 0x0001], np.uint16)
    assert dequantize(bf.tobytes(), "BF16").view(np.uint32).tolist() == [0x3F800000, 0x7FFFFFFF, 0x00010000]
    assert dequantize(bf.tobytes(), "BF16", out="bf16").view(np.uint16).tolist() == [0x3F80, 0x7FFF, 0x0001]


def test_plain_integer_types():
    v = np.array([-3, 7, 1 << 40], "<i8")
    assert dequantize(v.tobytes(), "I64").tolist() == [-3, 7, 1 << 40]
    assert dequantize(np.array([-1, 2], "<i2").tobytes(), 25).tolist() == [-1, 2]
    with pytest.raises(UnsupportedTypeError):
        dequant_f32("I32", v.tobytes(), 1, 6)
    with pytest.raises(ValueError):
        dequantize(v.tobytes(), "I64", out="f16")


@pytest.mark.parametrize("call,match", [
    (lambda raw: dequant_f32("Q8_0", raw, 1, 100), "not a multiple of the Q8_0 block size 32"),
    (lambda raw: dequant_f32("Q8_0", raw, 3, 128, row0=4), r"rows \[4, 7\) are beyond the tensor's 6 rows"),
    (lambda raw: dequant_f32("Q8_0", raw, 1, 128, ld=64), "ld=64 is smaller than cols=128"),
    (lambda raw: dequant_f32("Q8_0", raw[:-5], 1, 128), "not a whole number of Q8_0 blocks of 34 bytes"),
    (lambda raw: dequantize(raw[:40], "Q8_0"), "40 bytes is not a whole number"),
    (lambda raw: dequant_f32("Q8_0", raw, 2, 128, out=np.zeros((2, 100), np.float32)), "need"),
    (lambda raw: dequant_f32("Q8_0", raw, 2, 128, out=np.zeros(100, np.float32)), "need 256"),
    (lambda raw: dequant_f32("Q8_0", raw, -1, 128), "rows=-1"),
])
def test_shape_errors(call, match):
    raw, _, _ = _q8_0_tensor(6, 128)
    with pytest.raises(ValueError, match=match):
        call(raw)


def test_type_errors():
    raw, _, _ = _q8_0_tensor(1, 32)
    with pytest.raises(TypeError):
        dequant_f32("Q8_0", raw.astype(np.int16), 1, 32)
    with pytest.raises(TypeError):
        dequant_f32("Q8_0", raw, 1, 32, out=np.zeros(32, np.float64))
    with pytest.raises(UnsupportedTypeError):
        dequant_f32(33, raw, 1, 32)
    with pytest.raises(UnsupportedTypeError):
        dequant_f32("Q4_2", raw, 1, 32)


def test_zero_rows():
    raw, _, _ = _q8_0_tensor(2, 64)
    assert dequant_f32("Q8_0", raw, 0, 64).shape == (0, 64)


@pytest.mark.parametrize("t,bits", [("F16", "<u2"), ("BF16", "<u2"), ("F32", "<u4")])
def test_plain_floats_row_slice_and_padding(t, bits):
    r = np.random.default_rng(9)
    raw = r.integers(0, 256, 5 * 8 * np.dtype(bits).itemsize, dtype=np.uint8)   # 5 rows x 8, raw bits
    want = dequantize(raw, t)
    out = np.full((3, 11), -5.0, np.float32)
    dequant_f32(t, raw, 3, 8, row0=1, ld=11, out=out)
    assert np.array_equal(out[:, :8].view(np.uint32), want.reshape(5, 8)[1:4].view(np.uint32))
    assert np.all(out[:, 8:] == -5.0)
    # the 1-D path itself: element by element from the numerics rules
    src = raw.view(bits)
    ref = (nm.f16_bits_to_f32(src) if t == "F16" else
           nm.bf16_bits_to_f32(src) if t == "BF16" else src.view(np.float32))
    assert np.array_equal(want.view(np.uint32), nm.canonicalize_nan(ref).view(np.uint32))
