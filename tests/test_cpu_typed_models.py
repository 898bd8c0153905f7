"""Whole models whose layer matrices are IQ4_NL, resp. MXFP4, against
llama.cpp per CPU profile, bit for bit (tests/typed_models.py).

Every layer matrix has rows % 8 == 0, so llama.cpp's AVX2 and AVX-512
builds keep them in the CPU_REPACK layout (`iq4_nl_8x8`, `mxfp4_8x8`) and
run ggml's repacked gemm (whole groups of 4 token rows) and gemv (the
rest); the baseline build has no repacking and takes the generic vec_dot.
ggml's graph API cannot produce that layout, which is why these paths are
checked through llama.cpp itself. tests/data/<profile>/llama_ref_typed.npz
holds every logit of one batched pass over `IDS` and of an incremental
one (`N_PROMPT` tokens, then one per call), made by
`python tools/llama_ref.py --profile P typed`.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from infer_helpers import PROFILES, f32_bits, profile_files
from typed_models import IDS, N_PROMPT, TYPED, typed_model


def test_every_profile_has_typed_reference_data():
    assert [p.values[0] for p in profile_files("llama_ref_typed.npz")] == list(PROFILES)


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("typed")
    files = {}
    for t in TYPED:
        files[t] = d / f"typed_{t}.gguf"
        typed_model(t, files[t], seed=0)
    return files


@pytest.mark.parametrize("t", TYPED)
@pytest.mark.parametrize("profile, path", profile_files("llama_ref_typed.npz"))
def test_typed_model_logits_are_llama_cpp_bits(t, profile, path, model_files):
    from strata_ref.infer.loader import load
    ref = np.load(path)
    assert str(ref["profile"]) == profile
    assert ref["ids"].tolist() == IDS and int(ref["n_prompt"]) == N_PROMPT
    f = model_files[t]
    assert hashlib.sha256(f.read_bytes()).hexdigest() == str(ref[f"{t}_sha256"])
    m = load(f, profile=profile)
    layer = [m_ for m_ in m.layers[0].attn.matrices() + m.layers[0].ffn.matrices()
             if hasattr(m_, "repacked")]
    assert layer and all(q.repacked() == (profile != "scalar") for q in layer)
    batched = m.forward(IDS, m.new_cache(64), all_logits=True)
    cache = m.new_cache(64)
    incr = np.concatenate([m.forward(IDS[:N_PROMPT], cache, all_logits=True)]
                          + [m.forward([k], cache)[None] for k in IDS[N_PROMPT:]])
    for kind, got in (("batched", batched), ("incr", incr)):
        want = ref[f"{t}_{kind}"]
        bad = np.flatnonzero((f32_bits(got) != f32_bits(want)).any(axis=1))
        assert bad.size == 0, (f"{t} {profile} {kind}: rows {bad.tolist()} differ "
                               f"(max |diff| {np.abs(got - want).max():.3g})")
