"""deepseek2's MLA cache with a head of a multiple of 64 (DeepSeek V3's
576) in a block type, with flash attention, against llama.cpp bit for bit.

llama.cpp 0.3.36's KV cache decides a Hadamard rotation of K
(`attn_rot_k`, src/llama-kv-cache.cpp) for any block cache type whose head
size is a multiple of 64, MLA's included; but MLA's graph
(`build_attn_inp_k` / `build_attn` for `llm_graph_input_attn_k`,
src/llama-graph.cpp, used by src/models/deepseek2.cpp) builds no rotation
input and never multiplies q or k by one. So the cache stays unrotated, as
strata-ref's `KVCache` keeps it (`rotated` False).

The model: the tiny seeded deepseek2 (`infer_helpers.tiny_moe_model`) with
kv_lora_rank 160, i.e. a cached head of 160 + 32 = 192. Its llama.cpp
logits, for each profile P (scalar, avx2) and cache type T (q8_0, q4_0,
and f16 as the control), are tests/data/P/llama_ref_moe_fa[_T]_deepseek2-r160.npz
(`python tools/llama_ref.py --profile P moe --arch deepseek2 --flash-attn
--kv-lora-rank 160 --cache-type T`): every logit of the batched and the
incremental pass equals llama.cpp's bits, the greedy ids are llama.cpp's;
the long run (270 prompt ids, 8 greedy tokens) matches every row's hash
(the F16 control under `-m slow`). Then what stays refused.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from infer_helpers import (ARM_PROFILES, DATA, all_profile_files, cached_model, check_stored_fa_run, f32_bits,
                           moe_seed, tiny_moe_model)
from strata_ref.cpu import PROFILES as CPU_PROFILES
from strata_ref.infer.kv_cache import MLA_HEAD64_CACHE_TYPES
from strata_ref.infer.mla import MLA_FLASH_ATTN_PROFILES, MLA_HEAD64_PROFILES

RANK = 160                   # kv_lora_rank: a cached head of 160 + 32 = 192
TYPES = ("f16", "q8_0", "q4_0")


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("tiny_mla64") / "tiny_deepseek2-r160.gguf"
    tiny_moe_model("deepseek2", f, seed=moe_seed("deepseek2"), kv_lora_rank=RANK)
    return f


_model = cached_model


def _name(ct):
    return f"llama_ref_moe_fa{'' if ct == 'f16' else '_' + ct}_deepseek2-r{RANK}.npz"


def _cases():
    # the F16 control (a type that was never refused here) under `-m slow`:
    # its long run takes flash attention's tiled and split-KV paths,
    # minutes; the arm64 profiles under `-m slow`
    return [pytest.param(ct, *p.values, id=f"{ct}-{p.values[0]}",
                         marks=() if ct != "f16" and p.values[0] not in ARM_PROFILES else (pytest.mark.slow,))
            for ct in TYPES for p in all_profile_files(_name(ct))]


def test_bookkeeping_is_the_stored_data():
    # a (profile, block type) is in MLA_HEAD64_PROFILES exactly when its data
    # is stored; every such type is one the profile runs with flash
    # attention and one KVCache emulates with such a head
    have = {(p.values[0], ct) for ct in TYPES if ct != "f16" for p in all_profile_files(_name(ct))}
    assert have == {(p, t) for p, ts in MLA_HEAD64_PROFILES.items() for t in ts}
    assert {(p.values[0]) for p in all_profile_files(_name("f16"))} == set(MLA_HEAD64_PROFILES)
    for p, ts in MLA_HEAD64_PROFILES.items():
        assert ts <= MLA_FLASH_ATTN_PROFILES[p], p
    assert set().union(*MLA_HEAD64_PROFILES.values()) == {t.name.lower() for t in MLA_HEAD64_CACHE_TYPES}


@pytest.mark.parametrize("ct, profile, path", _cases())
def test_head64_logits_are_llama_cpp_bits(ct, profile, path, tiny_file):
    ref = np.load(path)
    assert str(ref["profile"]) == profile and profile in CPU_PROFILES and bool(ref["flash_attn"])
    assert str(ref["type_k"]) == str(ref["type_v"]) == ct and int(ref["kv_lora_rank"]) == RANK
    assert hashlib.sha256(tiny_file.read_bytes()).hexdigest() == str(ref["sha256"])
    m = _model(tiny_file, profile)
    c = m.new_cache(512, flash_attn=True, type_k=ct, type_v=ct)
    assert c.head_dim == RANK + 32 and c.head_dim % 64 == 0 and not c.rotated
    check_stored_fa_run(m, ref, f"{profile} {ct}", flash_attn=True, type_k=ct, type_v=ct)


def test_block_types_differ_from_f16():
    # the stored block-type rows are the block cache's, not the F16 control's
    for p in MLA_HEAD64_PROFILES:
        f16 = np.load(DATA / p / _name("f16"))
        for ct in MLA_HEAD64_PROFILES[p]:
            ref = np.load(DATA / p / _name(ct))
            assert (f32_bits(ref["batched"][1:]) != f32_bits(f16["batched"][1:])).any(axis=1).all(), (p, ct)


def test_unchecked_head64_types_are_refused(tiny_file, monkeypatch):
    m = _model(tiny_file, "avx2")
    # a block type the profile runs with flash attention for other heads
    with pytest.raises(NotImplementedError, match="multiple of 64 \\(here 192\\) is checked against llama.cpp "
                                                  "with the block types q8_0, q4_0 only") as e:
        m.new_cache(64, flash_attn=True, type_k="q5_1", type_v="q5_1")
    assert "192" in e.value.where
    # the per-profile bookkeeping: a profile without the entry refuses
    import strata_ref.infer.moe as moe
    monkeypatch.setattr(moe, "MLA_HEAD64_PROFILES", {"scalar": MLA_HEAD64_PROFILES["scalar"]})
    with pytest.raises(NotImplementedError, match="checked against llama.cpp for the cache types "
                                                  "q8_0, q4_0 on scalar only, not q8_0 on avx2"):
        m.new_cache(64, flash_attn=True, type_k="q8_0", type_v="q8_0")
    assert m.new_cache(64, flash_attn=True).type_k.name == "F16"
