"""gemma4 with flash attention and the other KV caches against llama.cpp,
bit for bit (issue 32).

For each tiny gemma4 model (`infer_helpers.tiny_moe_model`, "gemma4":
E2B's layout with shared-KV layers and per-layer embeddings,
"gemma4-moe": 26B-A4B's, whose full layer has no attn_v) and each profile
P with tests/data/P/llama_kv_moe_<arch>.npz (made by `python
tools/llama_ref.py --profile P moekv` against llama-cpp-python 0.3.36
built for P; its `KV_CONFIGS`: K / V type, flash attention, rotation,
prompt): the rebuilt GGUF has the stored sha256; every logit of every row
of the batched teacher-forced pass and of the incremental pass (prompt,
then one token per call) equals llama.cpp's bits (float32 rows compared as
uint32, or the rows' stored blake2b hashes); our greedy continuation is
llama.cpp's (the default run: `DEFAULT`'s configurations; `-m slow`:
all). Then what stays refused, by name.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from infer_helpers import (ARM_PROFILES, DATA, all_profile_files, cache_passes, cached_model, f32_bits,
                           row_hashes, tiny_moe_files)
from strata_ref.infer import gemma4 as g4

ARCHS = ("gemma4", "gemma4-moe")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    return tiny_moe_files(tmp_path_factory, ARCHS, "tiny_gemma4_kv")


_model = cached_model


#: the configurations the default run checks in every profile (16 cases,
#: about 30 s on 2 cores, the numba compiling included); `pytest -m slow`
#: checks the other 72 (about 40 s)
DEFAULT = ("f16-f16-fa", "q8_0-q8_0-fa", "q4_0-q4_0-fa", "q8_0-f16")
#: the configurations the default run checks on one arm64 profile
DEFAULT_ARM = ("q8_0-q8_0-fa", "q8_0-f16")


def _cases():
    # the x86 profiles: DEFAULT in each; the arm64 ones: DEFAULT_ARM on
    # armv8.2-fp16 (one more chain's compiling in CI), the rest under `-m slow`
    out = []
    for arch in ARCHS:
        for p in all_profile_files(f"llama_kv_moe_{arch}.npz"):
            profile, path = p.values
            for name in np.load(path)["configs"].tolist():
                if profile in ARM_PROFILES:
                    default = name in DEFAULT_ARM and profile == "armv8.2-fp16"
                else:
                    default = name in DEFAULT
                marks = () if default else (pytest.mark.slow,)
                out.append(pytest.param(arch, profile, path, name, id=f"{arch}-{profile}-{name}", marks=marks))
    return out


def test_the_checked_profiles_have_the_data():
    for p in g4.CACHE_PROFILES:
        for arch in ARCHS:
            assert (DATA / p / f"llama_kv_moe_{arch}.npz").is_file(), (p, arch)


def test_the_data_covers_exactly_the_checked_caches():
    # every (type_k, type_v, flash attention) the graph accepts beyond the
    # F16 cache without flash attention is in every checked profile's data,
    # and the data has no configuration the graph refuses
    for p in g4.CACHE_PROFILES:
        for arch in ARCHS:
            ref = np.load(DATA / p / f"llama_kv_moe_{arch}.npz")
            keys, norot = set(), set()
            for n in ref["configs"].tolist():
                k = (str(ref[f"{n}:type_k"]), str(ref[f"{n}:type_v"]), bool(ref[f"{n}:flash_attn"]))
                (norot if bool(ref[f"{n}:rot_disable"]) else keys).add(k)
            assert keys == set(g4.CHECKED_CACHES), (p, arch)
            assert norot == set(g4.CHECKED_NO_ROTATION), (p, arch)


@pytest.mark.parametrize("arch, profile, path, name", _cases())
def test_gemma4_caches_are_llama_cpp_bits(arch, profile, path, name, tiny_files):
    ref = np.load(path)
    assert str(ref["profile"]) == profile
    f = tiny_files[arch]
    assert hashlib.sha256(f.read_bytes()).hexdigest() == str(ref["sha256"])
    m = _model(f, profile)
    opts = dict(type_k=str(ref[f"{name}:type_k"]), type_v=str(ref[f"{name}:type_v"]),
                flash_attn=bool(ref[f"{name}:flash_attn"]), rotate=not bool(ref[f"{name}:rot_disable"]))
    n_ctx = int(ref["n_ctx"])
    prompt = ref[f"{name}:prompt_ids"].tolist()
    gen = ref[f"{name}:greedy_ids"].tolist()
    ids = prompt + gen
    batched, incr, cache = cache_passes(m, prompt, ids, n_ctx, **opts)
    assert cache.flash_attn == opts["flash_attn"]
    for kind, got in (("batched", batched), ("incr", incr)):
        if f"{name}:{kind}" in ref:
            bad = np.flatnonzero((f32_bits(got) != f32_bits(ref[f"{name}:{kind}"])).any(axis=1))
        else:
            assert np.argmax(got, axis=1).tolist() == ref[f"{name}:{kind}_argmax"].tolist(), kind
            bad = np.flatnonzero(row_hashes(got) != ref[f"{name}:{kind}_hash"])
        assert bad.size == 0, f"{profile} {name} {kind}: rows {bad.tolist()} differ"
    assert np.argmax(incr[len(prompt) - 1:-1], axis=1).tolist() == gen


@pytest.mark.parametrize("opts, what", [
    ({"type_k": "q8_0", "flash_attn": True}, "flash attention and a q8_0 K cache"),
    ({"type_v": "q8_0", "flash_attn": True}, "flash attention and a q8_0 V cache"),
    ({"type_k": "q5_0", "type_v": "iq4_nl", "flash_attn": True}, "flash attention and a q5_0 K cache and an "
                                                                  "iq4_nl V cache"),
    ({"type_k": "bf16", "flash_attn": False}, "a bf16 K cache"),
])
def test_unchecked_caches_are_refused_by_name(opts, what, tiny_files):
    from strata_ref._notemulated import NotEmulated
    m = _model(tiny_files["gemma4"], "avx2")
    with pytest.raises(NotEmulated, match="is not checked against llama.cpp(; .*)?: its checked caches are, "
                                          "with flash attention, K = V of ") as e:
        m.new_cache(64, **opts)
    assert (e.value.what, e.value.where) == (what, "for gemma4")
    # the same types checked with flash attention the other way: said first
    other = {"flash attention and a q8_0 K cache": "without flash attention (--flash-attn off)"}.get(what)
    assert (f"not checked against llama.cpp; these types are checked {other}: " in str(e.value)) == bool(other)
    assert len(str(e.value)) < 450          # grouped, not 23 cases one by one (was 800+)


def test_checked_caches_in_words():
    # every entry of CHECKED_CACHES, grouped by flash attention, in the
    # order of llama.cpp's --cache-type-k list
    from strata_ref.infer.gemma4 import _checked_phrase
    assert _checked_phrase() == (
        "with flash attention, K = V of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1; "
        "the K/V pairs f16/q4_0, q8_0/q4_1; "
        "without flash attention, K = V of f32, f16, bf16; K of q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 "
        "over an f16 V; the K/V pairs q5_1/bf16")


def test_rotation_off_is_refused_but_where_checked(tiny_files):
    from strata_ref._notemulated import NotEmulated
    m = _model(tiny_files["gemma4-moe"], "avx2")
    assert m.new_cache(64, type_k="q8_0", type_v="q8_0", flash_attn=True, rotate=False).rotated is False
    with pytest.raises(NotEmulated, match="Hadamard rotation off") as e:
        m.new_cache(64, type_k="q4_0", type_v="q4_0", flash_attn=True, rotate=False)
    assert e.value.what == "flash attention and a q4_0 K cache and a q4_0 V cache without the rotation"
    # no block type: nothing to rotate, nothing refused
    assert m.new_cache(64, type_k="bf16", type_v="bf16", flash_attn=True, rotate=False).rotated is False


def test_unchecked_profiles_are_refused(tiny_files):
    from strata_ref._notemulated import NotEmulated
    from strata_ref.infer.loader import load
    # every 0.3.36 profile is checked (avx512 too); the v0.4.0 ones are not
    m = load(tiny_files["gemma4"], profile="v0.4.0-skylakex")
    m.new_cache(64, flash_attn=False)          # the F16 cache without flash attention: checked
    with pytest.raises(NotEmulated, match="checked against llama.cpp on the profiles scalar, avx2, avx512, "
                                          "armv8.0, armv8.2-dotprod, armv8.2-fp16, armv8.6-i8mm only, not on "
                                          "v0.4.0-skylakex ") as e:
        m.new_cache(64, flash_attn=True)
    assert (e.value.what, e.value.where) == ("flash attention", "for gemma4 on this profile")
    assert str(e.value).endswith("without flash attention there (--flash-attn off)")
    # with flash attention already off, the cache types are what to change
    with pytest.raises(NotEmulated, match="not on v0.4.0-skylakex: use the F16 cache there "
                                          "\\(no --cache-type-k / --cache-type-v\\)$") as e:
        m.new_cache(64, type_k="q8_0", flash_attn=False)
    assert e.value.what == "a q8_0 K cache"
    # the profile is refused before the list of checked caches, which would
    # name caches this profile refuses too
    with pytest.raises(NotEmulated, match="not on v0.4.0-skylakex .*: use the F16") as e:
        m.new_cache(64, type_k="q4_1", type_v="q8_0", flash_attn=True)
    # v0.4.0 turns flash attention on by default: the refusal says so
    with pytest.raises(NotEmulated, match="not on v0.4.0-haswell \\(flash attention is on by default on "
                                          "the v0.4.0 profiles\\): use the F16 cache without flash "
                                          "attention there \\(--flash-attn off\\)"):
        load(tiny_files["gemma4"], profile="v0.4.0-haswell").new_cache(64)


def test_rotation_follows_each_kinds_head_size(tiny_files):
    # sliding-window heads of 64, full ones of 128: K rotated by 64 and
    # 128 (the largest power of two from 64 dividing the head), V by 64
    m = _model(tiny_files["gemma4"], "avx2")
    c = m.new_cache(64, type_k="q8_0", type_v="q8_0", flash_attn=True)
    assert (c.swa.rot_k, c.swa.rot_v, c.base.rot_k, c.base.rot_v) == (64, 64, 128, 64)


def test_cache_bytes_follow_the_types(tiny_files):
    m = _model(tiny_files["gemma4"], "avx2")
    f16 = m._cache_bytes(256, type_k="f16", type_v="f16", flash_attn=True)
    q8 = m._cache_bytes(256, type_k="q8_0", type_v="q8_0", flash_attn=True)
    assert q8 * 64 == f16 * 34      # 34 bytes per 32 values against 64
