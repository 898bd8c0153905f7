"""strata_ref.quantize against ggml's reference quantizers.

Three independent checks, none of which needs a C compiler:
1. gguf-py 0.19.0 `gguf.quants.quantize` (whose quantizers follow
   ggml-quants.c), bitwise, for every type it implements; the two documented
   differences (../shared/spec/formats.md §9: all-zero blocks that start with
   -0.0) are asserted as differences.
2. ggml's own C output as FNV-1a 64 hashes in golden/ggml/quantize.json,
   written by tools/ggml_vectors.py from ggml's portable build (skipped when
   the file is absent).
3. Hand-computed blocks: inputs chosen so that the scale is exact, with the
   expected bytes derived here from the rule in ggml's `quantize_row_*_ref`
   (packing from ggml-common.h's struct order, not from strata_ref's layout).
Plus the input contract: dtypes, shapes, lengths, NaN/Inf, unsupported types.
"""
import json
import struct
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest

from strata_ref import golden
from strata_ref.hashing import fnv1a64
from strata_ref.quantize import quantize
from strata_ref.types import GGMLType as T, UnsupportedTypeError, block_format

ROOT = Path(__file__).resolve().parent.parent
GGUF_TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0",
              "TQ2_0", "MXFP4"]
OUR_TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
             "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "TQ1_0", "TQ2_0",
             "MXFP4", "NVFP4", "Q1_0", "Q2_0"]


def f16(x: float) -> bytes:
    return np.float16(x).tobytes()        # exact for every value used here


def gguf_quantize(x: np.ndarray, name: str) -> np.ndarray:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = gguf.quants.quantize(x, gguf.GGMLQuantizationType[name])
    # gguf-py returns F16 as a float16 array, everything else as bytes
    return np.ascontiguousarray(out).view(np.uint8).reshape(x.shape[:-1] + (-1,))


def cross_check_inputs(qk: int, seed: int) -> np.ndarray:
    """N(0,1), t2 and special finite blocks; no all-zero block starts with -0.0."""
    rng = np.random.default_rng(seed)
    n = max(qk, 256)
    rows = [rng.standard_normal((400, n)), rng.standard_t(2, (400, n))]
    base = rng.standard_normal((8, n))
    base /= np.abs(base).max(axis=1, keepdims=True)
    for s in (1e-39, 1e-30, 6e-8, 1e-5, 1.0, 6e4, 65504.0, 1e10, 3e38):
        rows.append(base * s)
    spikes = np.zeros((16, n))
    spikes[np.arange(16), rng.integers(0, n, 16)] = rng.choice([-1.0, 1.0], 16) * 10.0 ** rng.integers(-3, 4, 16)
    rows += [spikes, rng.integers(-16, 17, (16, n)) / 2.0, np.zeros((2, n)),
             np.full((2, n), 0.75), rng.choice([-1.0, 0.0, 1.0], (16, n))]
    return np.concatenate(rows).astype(np.float32)


# ---------------------------------------------------------------- gguf-py

@pytest.mark.parametrize("name", GGUF_TYPES)
def test_equals_gguf_py_bitwise(name):
    fmt = block_format(name)
    x = cross_check_inputs(fmt.block_values, seed=7)
    ours = quantize(x, name)
    ref = gguf_quantize(x, name)
    assert ours.shape == ref.shape and ours.dtype == np.uint8
    diff = np.flatnonzero((ours != ref).any(axis=1))
    assert diff.size == 0, f"{name}: rows {diff[:5]} differ from gguf-py"


@pytest.mark.parametrize("name,field", [("Q4_0", "d"), ("Q5_0", "d"), ("Q4_1", "m"), ("Q5_1", "m")])
def test_zero_block_starting_with_negative_zero(name, field):
    # C scans |v| > amax from +0.0f, so max stays +0 and d = +0/-8 = -0 (0x8000);
    # Q4_1/Q5_1 keep the first v < min, i.e. -0.0. gguf-py takes x[argmax] = -0
    # (d = +0) and numpy's min (+0): the documented difference (formats.md §9).
    fmt = block_format(name)
    x = np.zeros(32, np.float32)
    x[0] = -0.0
    ours = quantize(x, name)
    o = fmt.offset(field)
    assert ours[o:o + 2].tobytes() == b"\x00\x80"
    ref = gguf_quantize(x, name)
    assert ref[o:o + 2].tobytes() == b"\x00\x00"
    rest = [i for i in range(fmt.block_bytes) if i not in (o, o + 1)]
    assert np.array_equal(ours[rest], ref[rest])


# ---------------------------------------------------------------- ggml's C, as hashes

def _golden_quant_items():
    p = ROOT / "golden" / "ggml" / "quantize.json"
    if not p.exists():
        return None
    return json.loads(p.read_text())["cases"]


@pytest.mark.parametrize("name", OUR_TYPES)
def test_equals_ggml_c_hashes(name):
    items = _golden_quant_items()
    if items is None:
        pytest.skip("golden/ggml/quantize.json not written yet (tools/ggml_vectors.py)")
    cases = {c.name: c for c in golden.quant_cases()}
    mine = [it for it in items if it["type"] == name]
    assert mine, f"{name} missing from golden/ggml/quantize.json"
    checked = 0
    for it in mine:
        case = cases[it["case"]]
        x = case.inputs()
        assert f"{fnv1a64(x.view(np.uint8).reshape(-1)):016x}" == it["input"], it["case"]
        if it.get("nonfinite"):
            if block_format(name).quantized:
                with pytest.raises(ValueError):
                    quantize(x, name)
                continue
        out = quantize(x, name)
        assert f"{fnv1a64(out.reshape(-1)):016x}" == it["bytes"], f"{name}/{it['case']}"
        checked += 1
    assert checked >= 10


# ---------------------------------------------------------------- hand-computed blocks

def test_q8_0_rounds_half_away_from_zero():
    # amax = 127 gives d = 1 and id = 1 exactly, so q = roundf(x).
    x = np.zeros(32, np.float32)
    x[:8] = [127, -2.5, 2.5, 0.5, -0.5, 1.49, -126.5, 3.5]
    q = [127, -3, 3, 1, -1, 1, -127, 4] + [0] * 24
    want = f16(1.0) + np.array(q, np.int8).tobytes()
    assert quantize(x, "Q8_0").tobytes() == want
    # Q8_1 adds s = fp16(sum(q) * d)
    want1 = f16(1.0) + f16(float(sum(q))) + np.array(q, np.int8).tobytes()
    assert quantize(x, "Q8_1").tobytes() == want1


def test_q4_0_and_q5_0_truncate_after_adding_half():
    # max = -8 (first largest magnitude) -> d = -8/-8 = 1, q = min(15, (int)(x + 8.5)).
    x = np.zeros(32, np.float32)
    x[:6] = [-8, 7, 7.4, -7.6, 0.5, -0.5]
    x[16:19] = [7.9, -0.49, 3.0]
    q = [int(np.trunc(v + 8.5)) for v in x]
    q = [min(15, v) for v in q]
    assert q[:6] == [0, 15, 15, 0, 9, 8] and q[16:19] == [15, 8, 11]
    want = f16(1.0) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    assert quantize(x, "Q4_0").tobytes() == want
    # Q5_0 with max = -16: d = 1, q = min(31, (int)(x + 16.5)); 5th bits in qh.
    x5 = x.copy()
    x5[0] = -16
    q5 = [min(31, int(np.trunc(v + 16.5))) for v in x5]
    qh = sum(((v >> 4) & 1) << j for j, v in enumerate(q5))
    want5 = f16(1.0) + struct.pack("<I", qh) + bytes((q5[j] & 15) | ((q5[j + 16] & 15) << 4) for j in range(16))
    assert quantize(x5, "Q5_0").tobytes() == want5


def test_q4_1_and_q5_1_codes_are_offsets_from_min():
    x = (np.arange(32) % 16 + 2).astype(np.float32)          # min 2, max 17: d = 1, m = 2
    q = [int(v) - 2 for v in x]
    want = f16(1.0) + f16(2.0) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    assert quantize(x, "Q4_1").tobytes() == want
    x5 = (np.arange(32) - 3).astype(np.float32)             # min -3, max 28: d = 1
    q5 = list(range(32))
    qh = sum(((v >> 4) & 1) << j for j, v in enumerate(q5))
    want5 = f16(1.0) + f16(-3.0) + struct.pack("<I", qh) + bytes(
        (q5[j] & 15) | ((q5[j + 16] & 15) << 4) for j in range(16))
    assert quantize(x5, "Q5_1").tobytes() == want5


def test_q8_k_rounds_half_to_even():
    # max = -127 -> iscale = -127/-127 = 1, d = 1/iscale = 1.0f; nearest_int is RNE.
    x = np.zeros(256, np.float32)
    x[:6] = [-127, 2.5, 3.5, -0.5, 1.5, 100.49]
    q = np.zeros(256, np.int64)
    q[:6] = [-127, 2, 4, 0, 2, 100]
    bsums = q.reshape(16, 16).sum(axis=1)
    want = struct.pack("<f", 1.0) + q.astype(np.int8).tobytes() + bsums.astype("<i2").tobytes()
    assert quantize(x, "Q8_K").tobytes() == want


def test_q1_0_signs_and_mean_abs():
    rng = np.random.default_rng(3)
    x = rng.choice([-0.5, 0.5, -1.5, 1.5], 128).astype(np.float32)
    x[5] = -0.0                         # -0.0 >= 0.0f: bit set
    d = float(np.abs(x.astype(np.float64)).sum() / 128)   # exact: multiples of 2^-8
    bits = [1 if (v >= 0) else 0 for v in x]
    want = f16(d) + bytes(sum(bits[8 * i + k] << k for k in range(8)) for i in range(16))
    assert quantize(x, "Q1_0").tobytes() == want


def test_q2_0_codes():
    # d = amax = 2, id = 0.5: q = clamp(roundf(x/2) + 1, 0, 3), four per byte in order.
    x = np.zeros(64, np.float32)
    x[:8] = [2, -2, 1, -1, 0.9, -0.9, 0.5, 1.1]
    q = [min(3, max(0, int(np.sign(v) * np.floor(abs(v) / 2 + 0.5)) + 1)) for v in x]
    assert q[:8] == [2, 0, 2, 0, 1, 1, 1, 2]
    want = f16(2.0) + bytes(sum(q[4 * i + k] << (2 * k) for k in range(4)) for i in range(16))
    assert quantize(x, "Q2_0").tobytes() == want


def _trits(seed):
    return np.random.default_rng(seed).integers(-1, 2, 256)


def test_tq2_0_codes():
    t = _trits(4)
    x = t.astype(np.float32)
    x[0] = 1.0                                               # amax = 1: d = 1
    t[0] = 1
    code = t + 1
    qs = bytes(sum(int(code[128 * c + 32 * n + m]) << (2 * n) for n in range(4))
               for c in range(2) for m in range(32))
    assert quantize(x, "TQ2_0").tobytes() == qs + f16(1.0)


def test_tq1_0_codes():
    t = _trits(5)
    t[0] = 1
    x = t.astype(np.float32)
    c = t + 1

    def pack(vals, scale3=False):
        q = 0
        for v in vals:
            q = q * 3 + int(v)
        if scale3:
            q *= 3
        return (q * 256 + 242) // 243                       # ceil(q * 256 / 243)

    qs = [pack([c[m + 32 * n] for n in range(5)]) for m in range(32)]
    qs += [pack([c[160 + m + 16 * n] for n in range(5)]) for m in range(16)]
    qh = [pack([c[240 + j + 4 * m] for m in range(4)], scale3=True) for j in range(4)]
    assert quantize(x, "TQ1_0").tobytes() == bytes(qs) + bytes(qh) + f16(1.0)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _fp4_codes(vals):
    # index into kvalues_mxfp4 / 2: 0..7 positive, 8..15 negative (-0 is 8, never chosen first)
    return [E2M1.index(v) if v >= 0 else 8 + E2M1.index(-v) for v in vals]


def test_mxfp4_exact_grid_values():
    # amax = 6: floor(log2 6) = 2, e = 2 - 2 + 127 = 127, d = e8m0_half(127) = 0.5:
    # kvalues (doubled E2M1) * 0.5 are the E2M1 values, hit exactly.
    rng = np.random.default_rng(6)
    vals = rng.choice(E2M1 + [-v for v in E2M1[1:]], 32)
    vals[3] = 6.0
    codes = _fp4_codes(vals)
    want = bytes([127]) + bytes(codes[j] | (codes[j + 16] << 4) for j in range(16))
    assert quantize(vals.astype(np.float32), "MXFP4").tobytes() == want


def test_nvfp4_exact_grid_values():
    # per 16 values amax = 6: ue4m3(6/6 = 1.0) = exponent 7, mantissa 0 = 0x38,
    # whose decoded half-value is 0.5: again the E2M1 values exactly.
    rng = np.random.default_rng(8)
    vals = rng.choice(E2M1 + [-v for v in E2M1[1:]], 64)
    vals[::16] = -6.0
    codes = _fp4_codes(vals)
    qs = bytes(codes[16 * s + j] | (codes[16 * s + 8 + j] << 4) for s in range(4) for j in range(8))
    assert quantize(vals.astype(np.float32), "NVFP4").tobytes() == bytes([0x38] * 4) + qs


def test_f16_and_bf16_conversions():
    x = np.array([1.0, 65504.0, 65519.0, 65520.0, -np.inf, 2.0 ** -24, 2.0 ** -25,
                  3 * 2.0 ** -25, -0.0], np.float32)
    nan = np.array([0x7F800001, 0xFFC12345], np.uint32).view(np.float32)
    want16 = [0x3C00, 0x7BFF, 0x7BFF, 0x7C00, 0xFC00, 0x0001, 0x0000, 0x0002, 0x8000,
              0x7E00, 0xFE00]                               # ggml: NaN -> sign | 0x7E00
    got = quantize(np.concatenate([x, nan]), "F16").view("<u2")
    assert [int(v) for v in got] == want16
    xb = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00000001,
                   0x7F800001, 0xFFC12345], np.uint32).view(np.float32)
    wantb = [0x3F80, 0x3F80, 0x3F82, 0x7F80, 0x0000, 0x7FC0, 0xFFC1]
    assert [int(v) for v in quantize(xb, "BF16").view("<u2")] == wantb


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"])
def test_k_quant_zero_super_block_is_zero_bytes(name):
    # Every scale search returns 0 on an all-zero input (GROUP_MAX_EPS / max == min
    # branches) and the stored d, dmin are fp16(0): all bytes zero.
    out = quantize(np.zeros(512, np.float32), name)
    assert out.shape == (2 * block_format(name).block_bytes,) and not out.any()


# ---------------------------------------------------------------- input contract

def test_shapes_and_float64():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 512))
    out = quantize(x, "Q4_K")
    assert out.shape == (3, 2 * 144) and out.dtype == np.uint8
    assert np.array_equal(out, quantize(x.astype(np.float32), T.Q4_K))
    assert np.array_equal(quantize(x[1], 12), out[1])
    assert quantize(np.zeros((0, 64), np.float32), "Q2_0").shape == (0, 18)
    assert np.array_equal(quantize(x, "q8_0"), quantize(x, T.Q8_0))


@pytest.mark.parametrize("bad", [np.arange(32), np.zeros(32, bool), np.zeros(32, np.complex64),
                                 ["a"] * 32])
def test_non_float_input_is_type_error(bad):
    with pytest.raises(TypeError, match="float"):
        quantize(bad, "Q8_0")


def test_bad_shapes_are_value_errors():
    with pytest.raises(ValueError, match=r"row length 100 .* block size 256"):
        quantize(np.zeros(100, np.float32), "Q4_K")
    with pytest.raises(ValueError, match="1-D or 2-D"):
        quantize(np.zeros((2, 2, 32), np.float32), "Q8_0")
    with pytest.raises(ValueError, match="1-D or 2-D"):
        quantize(np.float32(1.0), "F16")


@pytest.mark.parametrize("name", [n for n in OUR_TYPES if n not in ("F16", "BF16")])
def test_nonfinite_input_rejected_for_block_types(name):
    qk = block_format(name).block_values
    x = np.ones((2, 2 * qk), np.float32)
    x[1, qk + 3] = np.nan
    with pytest.raises(ValueError, match=rf"x\[1, {qk + 3}\] is NaN"):
        quantize(x, name)
    x[1, qk + 3] = -np.inf
    with pytest.raises(ValueError, match="is Inf"):
        quantize(x, name)
    with pytest.raises(ValueError, match="float32 range"):
        quantize(np.full(qk, 1e300), name)


@pytest.mark.parametrize("t", ["IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M", "F32", "I8", 4, 99, "Q9_9"])
def test_types_without_reference_quantizer(t):
    with pytest.raises(UnsupportedTypeError):
        quantize(np.zeros(256, np.float32), t)
