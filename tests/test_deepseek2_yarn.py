"""deepseek2 (MLA) with DeepSeek V3 / R1's own YaRN RoPE settings against
llama.cpp bit for bit.

The `deepseek2-v3` tiny model (tests/test_infer_moe.py, test_mla_flash_attn.py)
has YaRN scaled down (factor 4 over 16 original positions). Here the same
model with the keys real DeepSeek V3 / R1 files have: `rope.scaling.factor`
40, `rope.scaling.original_context_length` 4096, `yarn_log_multiplier` 0.1
(`infer_helpers.tiny_moe_model(..., real_yarn=True)`; everything else,
seed included, the same). For each profile P (scalar, avx2) llama.cpp's
logits are tests/data/P/llama_ref_moe_deepseek2-v3-yarn40.npz (F16 cache,
no flash attention: `python tools/llama_ref.py --profile P moe --arch
deepseek2-v3 --real-yarn`) and llama_ref_moe_fa_deepseek2-v3-yarn40.npz
(flash attention, with the long run of 270 prompt ids: the same with
`--flash-attn`). Every logit of the batched and the incremental pass equals
llama.cpp's bits, the greedy ids are llama.cpp's; the long run's rows
match by hash.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from infer_helpers import (DATA, cache_passes, cached_model, check_stored_fa_run, f32_bits, moe_seed,
                           profile_files, tiny_moe_model)
from strata_ref.cpu import PROFILES as CPU_PROFILES
from strata_ref.gguf import read_file

ARCH = "deepseek2-v3"
NAME = "deepseek2-v3-yarn40"
REAL = {"rope_scaling_factor": 40.0, "rope_orig_ctx": 4096, "yarn_log_multiplier": np.float32(0.1)}
PROFILES = ("scalar", "avx2")


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("tiny_yarn40") / f"tiny_{NAME}.gguf"
    tiny_moe_model(ARCH, f, seed=moe_seed(ARCH), real_yarn=True)
    return f


_model = cached_model


def _files(fa: bool):
    return profile_files(f"llama_ref_moe_{'fa_' if fa else ''}{NAME}.npz")


def test_data_is_the_real_yarn_model(tiny_file):
    # the file and the stored data have DeepSeek V3's keys, not the scaled-down
    # model's (factor 4 over 16): the data cannot silently be the other model's
    md = read_file(tiny_file).metadata
    assert md["deepseek2.rope.scaling.type"] == "yarn"
    assert md["deepseek2.rope.scaling.factor"] == 40.0
    assert md["deepseek2.rope.scaling.original_context_length"] == 4096
    assert np.float32(md["deepseek2.rope.scaling.yarn_log_multiplier"]) == np.float32(0.1)
    sha = hashlib.sha256(tiny_file.read_bytes()).hexdigest()
    for fa in (False, True):
        assert {p.values[0] for p in _files(fa)} == set(PROFILES), fa
        for p in _files(fa):
            ref = np.load(p.values[1])
            for k, v in REAL.items():
                assert ref[k] == v, (p.values[0], fa, k)
            assert str(ref["sha256"]) == sha and "--real-yarn" in str(ref["command"])
            assert int(ref["seed"]) == moe_seed(ARCH)
            # llama.cpp's logits differ from the scaled-down model's on every
            # row after the first (position 0 is not rotated)
            old = np.load(DATA / p.values[0] / f"llama_ref_moe_{'fa_' if fa else ''}{ARCH}.npz")
            assert str(old["sha256"]) != sha
            for k in ("batched", "incr"):
                assert (f32_bits(ref[k][1:]) != f32_bits(old[k][1:])).any(axis=1).all(), (p.values[0], fa, k)


@pytest.mark.parametrize("profile, path", _files(False))
def test_real_yarn_logits_are_llama_cpp_bits(profile, path, tiny_file):
    # F16 cache without flash attention (llama-cpp-python's default)
    ref = np.load(path)
    assert str(ref["profile"]) == profile and profile in CPU_PROFILES
    assert hashlib.sha256(tiny_file.read_bytes()).hexdigest() == str(ref["sha256"])
    m = _model(tiny_file, profile)
    prompt, gen = ref["prompt_ids"].tolist(), ref["greedy_ids"].tolist()
    batched, incr, _ = cache_passes(m, prompt, prompt + gen)
    for kind, got in (("batched", batched), ("incr", incr)):
        bad = np.flatnonzero((f32_bits(got) != f32_bits(ref[kind])).any(axis=1))
        assert bad.size == 0, f"{profile} {kind}: rows {bad.tolist()} differ"
    assert np.argmax(incr[len(prompt) - 1:-1], axis=1).tolist() == gen


@pytest.mark.parametrize("profile, path", _files(True))
def test_real_yarn_flash_attn_logits_are_llama_cpp_bits(profile, path, tiny_file):
    ref = np.load(path)
    assert str(ref["profile"]) == profile and bool(ref["flash_attn"]) and str(ref["type_k"]) == "f16"
    assert hashlib.sha256(tiny_file.read_bytes()).hexdigest() == str(ref["sha256"])
    check_stored_fa_run(_model(tiny_file, profile), ref, f"{profile} fa", flash_attn=True)
