"""The compiled dense layers (strata_ref.infer.compiled) against the graph's
Python path: the same logits, bit for bit, for a prompt pass and the decode
steps after it, in every CPU profile.

The llama.cpp reference tests (test_cpu_profiles, test_kv_cache) run the
registry models through whichever path applies by default (the compiled
one for the F16 cache); this file checks that the Python path, which every
other cache configuration takes, agrees with it on the shapes each model
brings: stacked and separate projections, mixed weight types in one layer,
q/k/v biases (qwen2), q/k norms (qwen3, gemma3), gemma3's extra norms,
scaling, GeGLU and sliding window.
"""
import numpy as np
import pytest

from infer_helpers import model_path, tiny_model

PROFILES = ["scalar", "avx2", "avx512"]


def _run(m, ids, compiled, steps=3):
    m.compiled = compiled
    cache = m.new_cache(64)
    rows = [m.forward(ids, cache, all_logits=True)]
    last = rows[0][-1]
    for _ in range(steps):
        last = m.forward([int(np.argmax(last))], cache)
        rows.append(last[None])
    return np.concatenate(rows).view(np.uint32)


def _check(m, ids):
    from strata_ref.infer.compiled import CompiledLayers
    assert CompiledLayers.build(m) is not None
    a = _run(m, ids, False)
    b = _run(m, ids, True)
    assert m._compiled, "the compiled layers did not run"
    assert np.array_equal(a, b)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_tiny_models(arch, profile, tmp_path):
    from strata_ref.infer.loader import load
    path = tmp_path / f"{arch}.gguf"
    tiny_model(arch, path)
    m = load(path, profile=profile)
    _check(m, list(range(40, 49)))


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct", "gemma-3-270m"])
def test_registry_models(name, profile):
    from strata_ref.infer.loader import load
    m = load(model_path(name), profile=profile)
    _check(m, m.tokenizer.encode("The capital of France is"))


def test_other_caches_take_the_python_path(tmp_path):
    from strata_ref.infer.compiled import CompiledLayers
    from strata_ref.infer.loader import load
    path = tmp_path / "q.gguf"
    tiny_model("qwen3", path)
    m = load(path, profile="avx2")
    assert CompiledLayers.eligible(m.new_cache(16))
    for opts in (dict(type_k="f32", type_v="f16"), dict(type_k="f32", type_v="f32"),
                 dict(flash_attn=True), dict(type_k="bf16", type_v="bf16")):
        assert not CompiledLayers.eligible(m.new_cache(16, **opts)), opts
