"""Library calls with careless arguments (issue 16, item 18 and the import
under a bad NUMBA_NUM_THREADS, item 15): a clear error or the right result."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import strata_ref as sr
from strata_ref.types import GGMLType as T, UnsupportedTypeError, parse_type


@pytest.mark.parametrize("t", ["Q4_0", "Q8_0", "Q4_K", "F16", "BF16"])
@pytest.mark.parametrize("dt", [">f2", ">f4", ">f8"])
def test_quantize_big_endian_equals_little_endian(t, dt):
    x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
    if dt == ">f2":
        x = x.astype(np.float16).astype(np.float32)   # exactly representable
    le = sr.quantize(x.astype(dt.replace(">", "<")), t)
    be = sr.quantize(x.astype(dt), t)
    assert be.dtype == np.uint8 and be.tobytes() == le.tobytes()


def test_quantize_big_endian_nonfinite_is_named():
    x = np.zeros(32, ">f8")
    x[5] = 1e300          # finite in float64, Inf in float32
    with pytest.raises(ValueError, match=r"x\[5\] is Inf \(float64 input outside the float32"):
        sr.quantize(x, "Q8_0")


@pytest.mark.parametrize("raw", [b"", bytes(144)])
@pytest.mark.parametrize("out", ["garbage", "F64", None, 3])
def test_dequantize_bad_out_is_refused_whatever_raw_holds(raw, out):
    with pytest.raises(ValueError, match=r"out must be one of f32, f16, bf16, got"):
        sr.dequantize(raw, "Q4_K", out=out)


def test_dequantize_empty_input_is_an_empty_array_of_the_dtype():
    assert sr.dequantize(b"", "Q4_K", out="f16").dtype == np.float16
    assert sr.dequantize(b"", "Q4_K").shape == (0,)


def test_hash_array_canonicalises_complex_nans():
    a = np.array([complex(np.nan, 1.0), 2 + 3j, complex(0.0, np.nan)], np.complex64)
    b = a.copy()
    u = b.view(np.uint32)
    u[0], u[5] = 0xFFC00001, 0x7FA00000          # other NaN encodings, same values
    assert sr.hash_array(a) == sr.hash_array(b) == sr.hash_array(a.astype(">c8"))
    want = np.array([0x7FFFFFFF, 0x3F800000, 0x40000000, 0x40400000, 0, 0x7FFFFFFF], "<u4")
    assert sr.hash_array(a) == sr.fnv1a64(want.tobytes())
    c = a.astype(np.complex128)
    d = c.copy()
    d.view(np.uint64)[0] = 0xFFF0000000000001
    assert sr.hash_array(c) == sr.hash_array(d)
    assert sr.hash_array(c) != sr.hash_array(a)          # the bytes of another dtype
    z = np.complex64(complex(np.nan, 0.0))                 # 0-d keeps its shape
    assert sr.hash_array(z) == sr.fnv1a64(np.array([0x7FFFFFFF, 0], "<u4").tobytes())


def test_hash_array_refuses_extended_precision():
    if np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("long double is float64 here")
    with pytest.raises(TypeError, match="padding bytes"):
        sr.hash_array(np.zeros(3, np.longdouble))


@pytest.mark.parametrize("s, want", [("12", T.Q4_K), (" 0 ", T.F32), ("42", T.Q2_0), ("q8_0", T.Q8_0)])
def test_parse_type_takes_decimal_ids(s, want):
    assert parse_type(s) is want


@pytest.mark.parametrize("s, msg", [("43", "unknown ggml type id 43"), ("Q9", "unknown ggml type name 'Q9'"),
                                    ("-1", "unknown ggml type name '-1'"), ("١٢", "unknown ggml type name")])
def test_parse_type_bad_text(s, msg):
    with pytest.raises(UnsupportedTypeError, match=msg):
        parse_type(s)


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "abc"])
def test_bad_numba_threads_gives_a_clear_import_error(value):
    code = ("import strata_ref as sr\n"
            "try:\n    sr.hash_array\nexcept ImportError as e:\n    print('IE', e)\n"
            "import sys; print('numba' in sys.modules)\n")
    env = {**os.environ, "NUMBA_NUM_THREADS": value}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"IE NUMBA_NUM_THREADS={value!r} is not a number of threads: give a whole number >= 1, "
        "or unset it for one thread per CPU", "False"]


@pytest.mark.parametrize("h, err", [(-1, ValueError), (2**64, ValueError), (1.5, TypeError),
                                    (True, TypeError), ("0", TypeError)])
def test_fnv_state_must_be_a_64_bit_int(h, err):
    with pytest.raises(err, match=r"an FNV-1a 64 state is an int in \[0, 2\*\*64\)"):
        sr.fnv1a64(b"abc", h)
    with pytest.raises(err):
        sr.hash_array(np.zeros(2), h)
    assert sr.fnv1a64(b"", 2**64 - 1) == 2**64 - 1 and sr.fnv1a64(b"", np.uint64(7)) == 7


def test_dequant_absurd_ld_names_it():
    with pytest.raises(ValueError, match=r"an output of rows=1 x ld=4611686018427387904 f32 values "
                                         r"cannot be allocated"):
        sr.dequant_f32("Q4_0", bytes(18), 1, 32, ld=2**62)


@pytest.mark.parametrize("bad", [-3, 1.5, float("nan"), float("inf"), None, "3"])
def test_generate_refuses_a_negative_or_fractional_token_count(bad):
    # it returned [] for -3; checked before the model is touched
    from strata_ref.infer import generate
    with pytest.raises(ValueError, match="max_tokens must be a whole number >= 0"):
        generate(None, [1], bad, None)


def test_embedding_rows_outside_the_matrix_are_named():
    from strata_ref import cpu
    from strata_ref.cpu.matmul import QMatrix
    from strata_ref.types import GGMLType
    w = np.arange(12, dtype=np.float32)
    m = QMatrix(GGMLType.F32, w.view(np.uint8), 3, 4, "token_embd.weight", cpu.select("avx2"))
    assert np.array_equal(m.rows_f32([2, 0]).view(np.uint32), w.reshape(3, 4)[[2, 0]].view(np.uint32))
    for bad in ([3], [-1]):
        with pytest.raises(IndexError, match=r"token_embd.weight: row ids must be in 0 \.\. 2"):
            m.rows_f32(bad)


def test_qmatrix_takes_a_ggml_type_name():
    # QMatrix took a GGMLType only: "Q4_K" gave "'Q4_K' is not a valid GGMLType"
    from strata_ref import cpu, quantize
    from strata_ref.cpu.matmul import QMatrix
    rng = np.random.default_rng(0)
    raw = quantize(rng.standard_normal((4, 256)).astype(np.float32), "Q4_K")
    x = rng.standard_normal((2, 256)).astype(np.float32)
    want = QMatrix(T.Q4_K, raw, 4, 256, "w", cpu.select("avx2")).matmul(x)
    for name in ("Q4_K", "q4_k", " q4_K "):
        m = QMatrix(name, raw, 4, 256, "w", "avx2")
        assert m.type is T.Q4_K
        assert np.array_equal(m.matmul(x).view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match=r"^QMatrix 'blk\.0\.w': unknown ggml type name 'Q4_Z\\x1b\[2J' "
                                         r"\(names such as Q4_K, or ids 0\.\.\d+\)$"):
        QMatrix("Q4_Z\x1b[2J", raw, 4, 256, "blk.0.w", "avx2")
    with pytest.raises(ValueError, match=r"^QMatrix: not a ggml type: 4\.5$"):
        QMatrix(4.5, raw, 4, 256)


def test_qmatrix_reads_the_weights_as_bytes():
    # np.asarray(raw, dtype=uint8) converted a float32 array value by value
    # (300.5 -> 44) and gave "invalid literal for int()" for bytes
    from strata_ref import quantize
    from strata_ref.cpu.matmul import QMatrix
    rng = np.random.default_rng(1)
    raw = quantize(rng.standard_normal((4, 256)).astype(np.float32), "Q4_K")
    x = rng.standard_normal((1, 256)).astype(np.float32)
    want = QMatrix("Q4_K", raw, 4, 256, "w", "avx2").matmul(x).view(np.uint32)
    for same in (raw.tobytes(), bytearray(raw.tobytes()), raw.view(np.float32), raw.view(np.uint16)):
        got = QMatrix("Q4_K", same, 4, 256, "w", "avx2").matmul(x).view(np.uint32)
        assert np.array_equal(got, want)
    with pytest.raises(ValueError, match=r"^QMatrix 'w': the weights must be the tensor's bytes .*got a list$"):
        QMatrix("Q4_K", list(raw), 4, 256, "w", "avx2")
    with pytest.raises(ValueError, match=r"^QMatrix 'w\\x0a': 576 bytes do not hold 2 x 256 Q4_K \(288 bytes\)$"):
        QMatrix("Q4_K", raw, 2, 256, "w\n", "avx2")
    with pytest.raises(ValueError, match=r"^QMatrix: 0 x 256 is not a matrix shape"):
        QMatrix("Q4_K", raw[:0], 0, 256)
    with pytest.raises(ValueError, match=r"^QMatrix: -2 x -256 is not a matrix shape"):
        QMatrix("Q4_K", raw, -2, -256)
    with pytest.raises(ValueError, match=r"^QMatrix 'blk\.0\.w': ggml-cpu has no mat-mul for Q8_1 weights$"):
        QMatrix("Q8_1", np.zeros(36, np.uint8), 1, 32, "blk.0.w", "avx2").matmul(np.zeros((1, 32), np.float32))



def test_infer_load_names_cpu_for_profile():
    # the loader's keyword is profile=, the public load's cpu=: passing
    # profile= was "got multiple values for keyword argument 'profile'"
    from strata_ref.infer import load
    with pytest.raises(TypeError, match="takes the CPU profile as cpu=..., not profile="):
        load("no-such-model.gguf", profile="avx2")
