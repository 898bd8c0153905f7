"""Mixture-of-experts and hybrid architectures against llama.cpp, bit for
bit, in every CPU profile with stored data (issue 14).

For each tiny seeded model of `infer_helpers.tiny_moe_model` and each
profile P with tests/data/P/llama_ref_moe_<arch>.npz (made by `python
tools/llama_ref.py --profile P moe` against llama-cpp-python 0.3.36 built
for P): the rebuilt GGUF has the stored sha256; every logit of every row of
the batched teacher-forced pass and of the incremental pass (prompt, then
one token per call) equals llama.cpp's bits; our greedy continuation is
llama.cpp's. Then the MoE pieces by hand: ggml's argsort tie order, the
routing weights, `mul_mat_id`'s grouping.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from infer_helpers import DATA, MOE_LAYERS, PROFILES, profile_files, tiny_moe_model
from strata_ref.cpu import PROFILES as CPU_PROFILES
from strata_ref.cpu import moe as cmoe

ARCHS = tuple(MOE_LAYERS)


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_moe")
    out = {}
    for arch in ARCHS:
        out[arch] = d / f"tiny_{arch}.gguf"
        tiny_moe_model(arch, out[arch], seed=0)
    return out


_MODELS = {}


def _model(path, profile):
    from strata_ref.infer.model import load
    key = (str(path), profile)
    if key not in _MODELS:
        _MODELS[key] = load(path, profile=profile)
    return _MODELS[key]


def _cases():
    return [pytest.param(arch, *p.values, id=f"{arch}-{p.values[0]}")
            for arch in ARCHS for p in profile_files(f"llama_ref_moe_{arch}.npz")]


def test_every_profile_has_moe_reference_data():
    for p in PROFILES:
        for arch in ARCHS:
            assert (DATA / p / f"llama_ref_moe_{arch}.npz").is_file(), (p, arch)


@pytest.mark.parametrize("arch, profile, path", _cases())
def test_tiny_moe_logits_are_llama_cpp_bits(arch, profile, path, tiny_files):
    ref = np.load(path)
    assert str(ref["profile"]) == profile and profile in CPU_PROFILES
    f = tiny_files[arch]
    assert hashlib.sha256(f.read_bytes()).hexdigest() == str(ref["sha256"])
    m = _model(f, profile)
    prompt = ref["prompt_ids"].tolist()
    ids = prompt + ref["greedy_ids"].tolist()
    got = m.forward(ids, m.new_cache(512), all_logits=True)
    bad = np.flatnonzero((_bits(got) != _bits(ref["batched"])).any(axis=1))
    assert bad.size == 0, f"{profile} batched: rows {bad.tolist()} differ"
    cache = m.new_cache(512)
    rows = [m.forward(prompt, cache, all_logits=True)]
    rows += [m.forward([t], cache)[None] for t in ids[len(prompt):]]
    got = np.concatenate(rows)
    bad = np.flatnonzero((_bits(got) != _bits(ref["incr"])).any(axis=1))
    assert bad.size == 0, f"{profile} incremental: rows {bad.tolist()} differ"
    # greedy: the stored continuation is llama.cpp's argmax of its own rows
    assert np.argmax(got[len(prompt) - 1:-1], axis=1).tolist() == ref["greedy_ids"].tolist()


# ---------------------------------------------------------------- pieces
def test_argsort_ties_keep_the_lower_index_below_17():
    # libstdc++'s std::sort ends in an insertion sort, alone for n <= 16:
    # stable, so equal values keep their index order
    x = np.array([[0.5, 0.25, 0.5, 1.0, 0.25, 0.5, -1.0, 1.0]], np.float32)
    assert cmoe.argsort_desc(x).tolist() == [[3, 7, 0, 2, 5, 1, 4, 6]]
    assert cmoe.top_k(x, 3).tolist() == [[3, 7, 0]]


def test_argsort_is_a_descending_permutation_for_long_rows():
    rng = np.random.default_rng(3)
    for n in (17, 32, 128, 512):
        x = rng.integers(0, 5, (4, n)).astype(np.float32)     # many ties
        got = cmoe.argsort_desc(x)
        for r in range(4):
            assert sorted(got[r].tolist()) == list(range(n))
            assert np.all(np.diff(x[r, got[r]]) <= 0)


def test_routing_weights_by_hand():
    prof = CPU_PROFILES["avx512"]
    logits = np.array([[0.0, 1.0, 2.0, 1.0]], np.float32)
    ids, w = cmoe.routing_weights(logits, 2, "softmax", True, 0.0, prof)
    assert ids.tolist() == [[2, 1]]                 # 1 and 3 tie: the lower index
    p = np.exp(np.float64([2.0, 1.0]))
    assert np.allclose(w, p / p.sum(), rtol=1e-6) and w.dtype == np.float32
    # SOFTMAX_WEIGHT (gpt-oss): select on the logits, softmax over the k
    ids, w = cmoe.routing_weights(logits, 2, "softmax_weight", False, 0.0, prof,
                                  bias=np.array([0, 0, 0, 2], np.float32))
    assert ids.tolist() == [[3, 2]]
    assert np.allclose(w, [[np.exp(1) / (np.exp(1) + 1), 1 / (np.exp(1) + 1)]], rtol=1e-6)
    with pytest.raises(ValueError, match="'sigmoid' is not supported"):
        cmoe.routing_weights(logits, 2, "sigmoid", False, 0.0, prof)


def test_mul_mat_id_routes_rows_to_their_experts():
    from strata_ref import GGMLType
    from strata_ref.quantize import quantize
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((4, 16, 64)) * 0.1).astype(np.float32)
    raw = quantize(w.reshape(-1, 64), GGMLType.Q8_0).reshape(-1)
    em = cmoe.ExpertMatrix(GGMLType.Q8_0, raw, 4, 16, 64, "t", "avx2")
    x = rng.standard_normal((3, 1, 64)).astype(np.float32)
    ids = np.array([[0, 3], [3, 1], [2, 0]])
    y = em.mul_mat_id(x, ids)
    for t in range(3):
        for j in range(2):
            want = em.experts[ids[t, j]].matmul(x[t])
            assert np.array_equal(_bits(y[t, j]), _bits(want[0]))
    with pytest.raises(ValueError, match=r"expert ids must lie in \[0, 4\)"):
        em.mul_mat_id(x, ids + 2)
    with pytest.raises(ValueError, match="activations must be"):
        em.mul_mat_id(x[:, :, :32], ids)
