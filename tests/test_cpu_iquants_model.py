"""A whole model whose mat-muls are the 256-value I-quants (tests/iq_model.py)
against llama.cpp's logits in every CPU profile (stored by
tools/llama_ref_iq.py; the arm64 ones by tools/arm_ref.py): every position of a 12-token pass (ggml's tiled
path), a 5-token pass and three one-token passes (vec_dot), bit for bit.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from infer_helpers import arm_profile_files, profile_files
from iq_model import PASSES, tiny_iq_model


@pytest.mark.parametrize("profile, path", profile_files("llama_ref_tiny_iq.npz")
                         + arm_profile_files("llama_ref_tiny_iq.npz"))
def test_tiny_iq_model_is_llama_cpp_bits(profile, path, tmp_path):
    from strata_ref.infer.loader import load
    ref = np.load(path)
    assert str(ref["profile"]) == profile
    f = tmp_path / "tiny_iq.gguf"
    tiny_iq_model(f)
    assert hashlib.sha256(f.read_bytes()).hexdigest() == str(ref["sha256"])
    m = load(f, profile=profile)
    cache = m.new_cache(64)
    got = np.concatenate([np.asarray(m.forward(ids, cache, all_logits=True), np.float32)
                          .reshape(len(ids), -1) for ids in PASSES])
    want = ref["logits"]
    bad = np.flatnonzero((got.view(np.uint32) != want.view(np.uint32)).any(axis=1))
    assert bad.size == 0, f"{profile}: positions {bad.tolist()} differ from llama.cpp"


def test_every_profile_has_reference_data():
    assert len(profile_files("llama_ref_tiny_iq.npz")) == 3
