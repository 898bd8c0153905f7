"""FNV-1a 64: the standard vectors, an independent Python transcription, NaN policy."""
import ml_dtypes
import numpy as np
import pytest

from strata_ref import fnv1a64, hash_array
from strata_ref.hashing import canonical_bytes, fnv1a64_pair, hash_tensor


def _py_fnv(data: bytes, h=0xCBF29CE484222325) -> int:
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@pytest.mark.parametrize("s,want", [(b"", 0xCBF29CE484222325), (b"a", 0xAF63DC4C8601EC8C),
                                    (b"foobar", 0x85944171F73967E8)])
def test_standard_vectors(s, want):
    assert fnv1a64(s) == want
    assert _py_fnv(s) == want


def test_random_bytes_and_chaining():
    data = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8)
    assert fnv1a64(data) == _py_fnv(data.tobytes())
    h = fnv1a64(data[:3333])
    assert fnv1a64(data[3333:], h) == fnv1a64(data)
    a, b = fnv1a64_pair(data[5000:], 1, fnv1a64(data[:5000]))
    assert (a, b) == (fnv1a64(data[5000:], 1), fnv1a64(data))


def test_hash_array_canonical_nan_and_endianness():
    a = np.array([1.0, np.nan, -np.nan, -0.0], np.float32)
    a.view(np.uint32)[2] = 0xFF812345
    want = _py_fnv(np.array([0x3F800000, 0x7FFFFFFF, 0x7FFFFFFF, 0x80000000], "<u4").tobytes())
    assert hash_array(a) == want
    assert hash_array(a.astype(">f4")) == want
    h = np.array([0x7C01, 0x3C00], np.uint16).view(np.float16)
    assert hash_array(h) == _py_fnv(np.array([0x7FFF, 0x3C00], "<u2").tobytes())
    b = np.array([0xFFC1, 0x3F80], np.uint16).view(ml_dtypes.bfloat16)
    assert hash_array(b) == _py_fnv(np.array([0x7FFF, 0x3F80], "<u2").tobytes())
    assert canonical_bytes(np.arange(3, dtype=">i4")).tobytes() == np.arange(3, dtype="<i4").tobytes()


def test_type_error_on_typed_array():
    with pytest.raises(TypeError):
        fnv1a64(np.zeros(3, np.float32))


def test_hash_tensor_matches_whole_output_and_chain():
    from strata_ref.dequant import dequant_f16, dequant_f32
    r = np.random.default_rng(5)
    raw = r.integers(0, 256, 7 * 4 * 34, dtype=np.uint8)   # 7 rows x 128 cols of Q8_0
    chain = {"f32": 123, "f16": 456}
    h = hash_tensor("Q8_0", raw, 7, 128, ("f32", "f16"), chain)
    assert h["f32"] == hash_array(dequant_f32("Q8_0", raw, 7, 128))
    assert h["f16"] == hash_array(dequant_f16("Q8_0", raw, 7, 128))
    assert chain["f32"] == fnv1a64(canonical_bytes(dequant_f32("Q8_0", raw, 7, 128)), 123)
