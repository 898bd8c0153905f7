"""Every CPU profile against the llama.cpp build it reproduces, bit for bit.

For each profile P with reference data under tests/data/P/ (made by
`python tools/llama_ref.py --profile P ...` against llama-cpp-python 0.3.36
built for P by tools/peer_build.py; the command is stored in each file):

* the registry models (SmolLM2-135M Q4_1, Qwen2.5-Coder-0.5B Q4_K_M, Gemma 3
  270M Q4_K_M): teacher-forced over the prompt and llama.cpp's 32 greedy
  tokens, every stored logit of every row bit for bit, in the batched pass
  and in the incremental one (prompt, then one token per call), and our
  own greedy continuation equal to llama.cpp's;
* requantized variants of SmolLM2 made by llama.cpp's own quantizer
  (`tests/model_variants.py`, rebuilt here bitwise from the registry model),
  so that every weight type that `llama_model_quantize` makes without an
  importance matrix occurs in a real model: the same checks;
* tiny random models (`infer_helpers.tiny_model`): every logit of every row.

The profile is emulation, so every profile's data is checked on any CPU.
"""
from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest

from infer_helpers import DATA, PROFILES, TINY_IDS, f32_bits, load_model, profile_files, tiny_model
from model_variants import VARIANTS
from strata_ref.cpu import PROFILES as CPU_PROFILES

MODELS = {"SmolLM2-135M-Instruct": "SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct":
          "Qwen2.5-Coder-0.5B-Instruct", "gemma-3-270m": "gemma-3-270m"}


def _logits(m, ids, n_prompt: int, kind: str) -> np.ndarray:
    """float32 logits of every position: one batched pass, or the prompt
    pass then one token per call (as the reference was made)."""
    cache = m.new_cache(512)
    if kind == "batched":
        return m.forward(ids, cache, all_logits=True)
    rows = [m.forward(ids[:n_prompt], cache, all_logits=True)]
    rows += [m.forward([t], cache)[None] for t in ids[n_prompt:]]
    return np.concatenate(rows)


def _cases():
    out = []
    for stem, name in MODELS.items():
        for p in profile_files(f"llama_ref_{stem}.npz"):
            prof, path = p.values
            for kind in ("batched", "incr"):
                marks = [pytest.mark.slow] if name.startswith("Qwen") and prof != "avx512" else []
                out.append(pytest.param(name, prof, path, kind, id=f"{stem}-{prof}-{kind}", marks=marks))
    return out


def _variant_cases():
    from model_variants import VARIANTS
    out = []
    for name in VARIANTS:
        for p in profile_files(f"llama_ref_{name}.npz"):
            prof, path = p.values
            for kind in ("batched", "incr"):
                out.append(pytest.param(name, prof, path, kind, id=f"{name}-{prof}-{kind}"))
    return out


def _pending_types(man) -> list:
    """Types of a variant with no profile kernel yet (they would run on the
    dense fallback, which is not llama.cpp's arithmetic)."""
    from strata_ref import GGMLType
    from strata_ref.cpu.traits import TRAITS
    return sorted({t for _, t, _ in man["tensors"] if GGMLType[t] not in TRAITS})


@functools.lru_cache(maxsize=2)     # bounded: loaded models are large
def _variant_model(name, profile):
    from model_variants import build_variant
    from strata_ref.infer.loader import load
    return load(build_variant(name), profile=profile)


@pytest.mark.parametrize("name, profile, path, kind", _variant_cases())
def test_variant_logits_are_llama_cpp_bits(name, profile, path, kind):
    from model_variants import manifest
    pending = _pending_types(manifest(name))
    if pending:
        pytest.skip(f"{name}: no profile kernel yet for {', '.join(pending)}")
    ref = np.load(path)
    assert str(ref["profile"]) == profile
    m = _variant_model(name, profile)
    ids = ref["prompt_ids"].tolist() + ref["greedy_ids"].tolist()
    ours = _logits(m, ids, len(ref["prompt_ids"]), kind)
    got = np.take_along_axis(ours, ref[f"{kind}_ids"], axis=1)
    want = ref[f"{kind}_logits"]
    bad = np.flatnonzero((f32_bits(got) != f32_bits(want)).any(axis=1))
    assert bad.size == 0, (f"{name} {profile} {kind}: rows {bad.tolist()} differ "
                           f"(max |diff| {np.abs(got - want).max():.3g})")
    if kind == "incr":
        # our greedy continuation is llama.cpp's: the argmax of each
        # incremental row from the last prompt position on is the next token
        p = len(ref["prompt_ids"])
        assert np.argmax(ours[p - 1:-1], axis=1).tolist() == ref["greedy_ids"].tolist()


def test_every_profile_has_reference_data():
    # the data of all three profiles is committed; a missing file would make
    # the tests below silently thinner
    for p in PROFILES:
        assert p in CPU_PROFILES
        for stem in MODELS:
            assert (DATA / p / f"llama_ref_{stem}.npz").is_file(), (p, stem)
        for name in VARIANTS:
            assert (DATA / p / f"llama_ref_{name}.npz").is_file(), (p, name)
        for f in ("llama_ref_tiny.npz", "ggml_mm.npz", "ggml_act_quant.npz", "llama_ref_typed.npz",
                  "llama_ref_tiny_iq.npz", "llama_ops_qwen.npz", "llama_ops_smollm2.npz"):
            assert (DATA / p / f).is_file(), (p, f)


@pytest.mark.parametrize("name, profile, path, kind", _cases())
def test_registry_model_logits_are_llama_cpp_bits(name, profile, path, kind):
    ref = np.load(path)
    assert str(ref["profile"]) == profile
    m = load_model(name, profile)
    ids = ref["prompt_ids"].tolist() + ref["greedy_ids"].tolist()
    ours = _logits(m, ids, len(ref["prompt_ids"]), kind)
    got = np.take_along_axis(ours, ref[f"{kind}_ids"], axis=1)
    want = ref[f"{kind}_logits"]
    bad = np.flatnonzero((f32_bits(got) != f32_bits(want)).any(axis=1))
    assert bad.size == 0, (f"{profile} {kind}: rows {bad.tolist()} differ "
                           f"(max |diff| {np.abs(got - want).max():.3g})")
    # the stored top-1 is llama.cpp's argmax; ours over the full vocabulary
    assert np.array_equal(np.argmax(ours, axis=1), ref[f"{kind}_ids"][:, 0])


@pytest.mark.parametrize("name, profile, path", [
    pytest.param(name, *p.values, id=f"{stem}-{p.values[0]}",
                 marks=[pytest.mark.slow] if name.startswith("Qwen") else [])
    for stem, name in MODELS.items() for p in profile_files(f"llama_ref_{stem}.npz")])
def test_greedy_continuation_is_llama_cpp(name, profile, path):
    ref = np.load(path)
    m = load_model(name, profile)
    ids = ref["prompt_ids"].tolist()
    assert m.tokenizer.encode(str(ref["prompt"])) == ids
    cache = m.new_cache(512)
    logits = m.forward(ids, cache)
    gen = []
    for i in range(len(ref["greedy_ids"])):
        gen.append(int(np.argmax(logits)))
        if i + 1 < len(ref["greedy_ids"]):
            logits = m.forward([gen[-1]], cache)
    assert gen == ref["greedy_ids"].tolist()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("profile, path", profile_files("llama_ref_tiny.npz"))
def test_tiny_random_models_are_llama_cpp_bits(arch, profile, path, tmp_path):
    # qwen3 (q/k norms, NeoX RoPE, separate output) and gemma3 (embedding
    # scale, post norms, GELU, sliding-window layers with their own RoPE base,
    # tied output): every logit of one batched pass
    from strata_ref.infer.loader import load
    ref = np.load(path)
    f = tmp_path / f"tiny_{arch}.gguf"
    tiny_model(arch, f, seed=0)
    assert hashlib.sha256(f.read_bytes()).hexdigest() == str(ref[f"{arch}_sha256"])
    m = load(f, profile=profile)
    got = m.forward(TINY_IDS, m.new_cache(64), all_logits=True)
    assert np.array_equal(f32_bits(got), f32_bits(ref[f"{arch}_logits"]))
