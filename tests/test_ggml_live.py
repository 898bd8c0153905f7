"""The oracle against ggml's C library itself, through ctypes (tools/ggml_c.py).

Skipped unless a ggml-base library is found: STRATA_REF_GGML_LIB, the
portable build of `python tools/ggml_vectors.py --build`, or an installed
llama-cpp-python. Compares values bitwise (NaN: any NaN equals any NaN, as
C keeps payloads and the oracle canonicalises them), and checks that the
stored vectors in golden/ggml/ are what this library computes.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from strata_ref import dequantize, golden
from strata_ref.hashing import fnv1a64, hash_array
from strata_ref.types import GGMLType as T, UnsupportedTypeError, block_format

ROOT = Path(__file__).resolve().parents[1]


def _load_ggml_c():
    mod = sys.modules.get("ggml_c")
    if mod is None:
        spec = importlib.util.spec_from_file_location("ggml_c", ROOT / "tools" / "ggml_c.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ggml_c"] = mod          # dataclasses look their module up
        spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def g():
    lib = _load_ggml_c().load()
    if lib is None:
        pytest.skip("no ggml-base library (run tools/ggml_vectors.py --build)")
    return lib


C_DEQUANT = [t for t in golden.CORPUS_TYPES if t not in (T.F32, T.Q8_1)]
# Each type costs a numba compile; the default run takes a few, -m slow all.
FAST = {T.F16, T.Q4_0, T.Q4_K, T.IQ2_XXS, T.MXFP4, T.Q8_0}


def _by_speed(types):
    return [pytest.param(t, id=t.name, marks=[] if t in FAST else [pytest.mark.slow])
            for t in types]


def test_traits_agree_with_our_block_formats(g):
    # The struct layout was verified on load (blck_size/type_size against
    # the scalar accessors); here the sizes against strata_ref.types.
    for t in golden.CORPUS_TYPES:
        tr = g.traits(int(t))
        fmt = block_format(t)
        assert (tr.blck_size, tr.type_size) == (fmt.block_values, fmt.block_bytes), t.name
        assert tr.name.upper() == t.name
        assert g.row_size(int(t), 4 * fmt.block_values) == 4 * fmt.block_bytes
    needs = {t for t in T if int(t) not in (4, 5, 31, 32, 33, 36, 37, 38)
             and g.requires_imatrix(int(t))}
    assert needs == {T.IQ2_XXS, T.IQ2_XS, T.IQ1_S}          # formats.md §8
    with pytest.raises(ValueError):
        g.traits(4)


def _same_bits_any_nan(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(a.view(np.uint32)[~na], b.view(np.uint32)[~nb]))


@pytest.mark.parametrize("t", _by_speed(C_DEQUANT))
def test_to_float_equals_oracle_on_fresh_random_blocks(g, t):
    """Beyond the corpus: new seeded random blocks (raw bytes and sane)."""
    fmt = block_format(t)
    rng = np.random.default_rng(int(t) + 1000)
    raw = rng.integers(0, 256, (64, fmt.block_bytes), dtype=np.uint8)
    sane = golden.sane_blocks(t, 64, rng)
    for what, blocks in (("raw", raw), ("sane", sane)):
        want = g.to_float(int(t), blocks.tobytes())
        try:
            got = dequantize(blocks.reshape(-1), t)
        except UnsupportedTypeError:
            pytest.skip(f"oracle lacks {t.name}")
        assert _same_bits_any_nan(got, want), what


def test_validate_row_data(g):
    # formats.md §2: valid = finite fp16 scales; a NaN d is invalid
    ok = golden.corpus_cases([T.Q4_0])
    sane = next(c for c in ok if c.name == "Q4_0/sane").data()
    nan = next(c for c in ok if c.name == "Q4_0/scale/d=qnan").data()
    assert g.validate_row_data(int(T.Q4_0), sane)
    assert not g.validate_row_data(int(T.Q4_0), nan)
    with pytest.raises(ValueError):
        g.validate_row_data(int(T.Q4_0), sane[:-1])


def test_stored_dequant_vectors_are_this_librarys(g):
    doc = json.loads((ROOT / "golden" / "ggml" / "dequant.json").read_text())
    cases = {c.name: c for c in golden.corpus_cases()}
    for it in doc["cases"][::7]:
        c = cases[it["name"]]
        y = g.to_float(int(c.type), c.slice_bytes()).reshape(c.rows, c.cols)
        assert f"{hash_array(y):016x}" == it["f32"], c.name


@pytest.mark.parametrize("t", _by_speed(x for x in golden.QUANT_TYPES if x != T.IQ1_M))
def test_quantize_chunk_equals_row_ref_and_oracle(g, t):
    x = np.random.default_rng(int(t)).standard_normal((3, 1024)).astype(np.float32)
    ref = g.quantize_ref(int(t), x)
    if t == T.IQ4_NL:
        # quantize_row_iq4_nl_ref searches with ntry = -1, ggml_quantize_chunk
        # (quantize_iq4_nl) with ntry = 7: most blocks differ. IQ4_XS's _ref
        # calls the chunk function, so it has no such split.
        assert not np.array_equal(g.quantize_chunk(int(t), x), ref)
    elif t not in (T.Q8_1, T.Q8_K):          # ggml_quantize_chunk handles neither
        assert np.array_equal(g.quantize_chunk(int(t), x), ref)
    from strata_ref.quantize import quantize
    try:
        ours = quantize(x, t)
    except UnsupportedTypeError:
        pytest.skip(f"strata_ref.quantize lacks {t.name}")
    assert np.array_equal(np.asarray(ours).reshape(-1).view(np.uint8), ref.reshape(-1))


def test_bad_arguments_never_reach_c(g):
    x = np.zeros((1, 100), np.float32)
    with pytest.raises(ValueError):
        g.quantize_chunk(int(T.Q4_0), x)                   # 100 is not whole blocks
    with pytest.raises(ValueError):
        g.quantize_chunk(int(T.IQ2_XXS), np.zeros(256, np.float32))   # needs an imatrix
    with pytest.raises(TypeError):
        g.quantize_ref(int(T.Q8_0), np.zeros(32, np.float64))
    with pytest.raises(ValueError):
        g.to_float(int(T.Q8_0), b"\0" * 33)
    with pytest.raises(ValueError):
        g.to_float(int(T.F32), b"\0" * 4)
    assert fnv1a64(b"") == 0xCBF29CE484222325
