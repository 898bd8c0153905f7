"""The oracle against ggml's own C results, stored as hashes (no C needed).

golden/ggml/dequant.json and quantize.json are written by
tools/ggml_vectors.py from ggml-base of llama-cpp-python 0.3.36 (portable
build: no -march, -ffp-contract=off; docs/ggml-vectors.md). For every corpus
case with a C `to_float`, the FNV-1a 64 of the oracle's f32 output (NaNs
canonical) must equal ggml's; for every quantizer input, the FNV-1a 64 of
`strata_ref.quantize`'s bytes must equal ggml's `quantize_row_*_ref` bytes
(types without a strata quantizer yet are skipped, by name).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from strata_ref import golden
from strata_ref.hashing import fnv1a64, hash_array
from strata_ref.types import GGMLType, UnsupportedTypeError

ROOT = Path(__file__).resolve().parents[1]
DEQ = json.loads((ROOT / "golden" / "ggml" / "dequant.json").read_text())
QUANT = json.loads((ROOT / "golden" / "ggml" / "quantize.json").read_text())
CASES = {c.name: c for c in golden.corpus_cases()}
DEQ_TYPES = sorted({it["type"] for it in DEQ["cases"]}, key=lambda n: GGMLType[n])
QUANT_TYPES = sorted({it["type"] for it in QUANT["cases"]}, key=lambda n: GGMLType[n])

# Each type costs a numba compile (seconds on a shared 2-core machine); the
# default run checks a few, `-m slow` (or --runslow, as registered) all of them.
FAST_DEQ = {"F16", "Q4_0", "Q4_K", "IQ2_XXS", "MXFP4"}
FAST_QUANT = {"Q4_0", "Q8_0", "Q4_K"}
# Known differences between strata_ref.quantize and ggml, reported to the
# quantizer's owner; xfail (not strict) so a fix shows up as XPASS.
KNOWN_QUANT: dict = {}


def _by_speed(names, fast):
    return [n if n in fast else pytest.param(n, marks=pytest.mark.slow) for n in names]


def test_files_describe_the_portable_build():
    for doc in (DEQ, QUANT):
        assert doc["corpus_seed"] == golden.CORPUS_SEED
        assert doc["corpus_version"] == golden.CORPUS_VERSION
        assert "llama-cpp-python 0.3.36" in doc["ggml_source"]
        assert "-ffp-contract=off" in doc["build"] and "-DGGML_NATIVE=OFF" in doc["build"]
    # every type with a C to_float (formats.md §3: 27 types) plus Q8_K, through
    # the exported dequantize_row_q8_K
    assert len(DEQ_TYPES) == 28 and "Q8_K" in DEQ_TYPES and set(DEQ["no_c_to_float"]) == {"F32", "Q8_1"}
    assert {GGMLType[n] for n in QUANT_TYPES} == set(golden.QUANT_TYPES)


def test_every_vector_names_a_current_case():
    names = [it["name"] for it in DEQ["cases"]]
    assert len(names) == len(set(names))
    assert set(names) == {c.name for c in CASES.values() if c.type.name in DEQ_TYPES}
    qn = {q.name for q in golden.quant_cases()}
    assert {it["case"] for it in QUANT["cases"]} == qn


def test_stored_corpus_f32_equals_ggml():
    """golden/corpus.json (the oracle's hashes) against ggml's, case by case."""
    corpus = {it["name"]: it for it in json.loads((ROOT / "golden" / "corpus.json").read_text())["cases"]}
    bad = [it["name"] for it in DEQ["cases"]
           if corpus[it["name"]]["f32"] != it["f32"] or corpus[it["name"]]["input"] != it["input"]]
    assert bad == []


@pytest.mark.parametrize("tname", _by_speed(DEQ_TYPES, FAST_DEQ))
def test_oracle_dequant_equals_ggml(tname):
    items = [it for it in DEQ["cases"] if it["type"] == tname]
    assert items
    for it in items:
        c = CASES[it["name"]]
        data = c.data()
        assert f"{fnv1a64(data):016x}" == it["input"], f"{c.name}: generator drift"
        try:
            y = golden.case_output(c, "f32", data)
        except UnsupportedTypeError:
            pytest.skip(f"the oracle cannot dequantize {tname} yet")
        assert f"{hash_array(y):016x}" == it["f32"], c.name


def _quantize_or_skip(x, tname):
    from strata_ref.quantize import quantize
    try:
        return quantize(x, tname)
    except UnsupportedTypeError as e:
        pytest.skip(f"strata_ref.quantize lacks {tname}: {e}")


def _quant_params():
    out = []
    for it in QUANT["cases"]:
        key = (it["type"], it["case"])
        marks = [] if it["type"] in FAST_QUANT else [pytest.mark.slow]
        if key in KNOWN_QUANT:
            marks.append(pytest.mark.xfail(reason=KNOWN_QUANT[key], strict=False))
        out.append(pytest.param(it, marks=marks, id=f"{it['type']}/{it['case']}"))
    return out


def test_every_quant_type_has_normal_and_t2_hashes():
    for t in QUANT_TYPES:
        ok = {it["case"] for it in QUANT["cases"] if it["type"] == t and len(it["bytes"]) == 16}
        assert {"normal", "t2", "mixed", "spikes", "zero", "zero-neg"} <= ok, t


@pytest.mark.parametrize("it", _quant_params())
def test_quantize_equals_ggml(it):
    tname = it["type"]
    x = {q.name: q for q in golden.quant_cases()}[it["case"]].inputs()
    assert f"{fnv1a64(x.view(np.uint8).reshape(-1)):016x}" == it["input"], "generator drift"
    if len(it["bytes"]) != 16:
        pytest.skip(f"ggml itself gave no result: {it['bytes']}")   # GGML_ASSERT abort
    if it.get("nonfinite"):
        try:
            out = _quantize_or_skip(x, tname)
        except ValueError:
            return          # documented: Inf/NaN input is refused
    else:
        out = _quantize_or_skip(x, tname)
    masked, n = golden.mask_undefined(tname, np.ascontiguousarray(out).reshape(-1).view(np.uint8), x)
    assert n == it.get("masked_blocks", 0)
    assert f"{fnv1a64(masked):016x}" == it["bytes"]
