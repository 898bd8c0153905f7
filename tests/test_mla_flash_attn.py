"""deepseek2's multi-head latent attention with flash attention against
llama.cpp, bit for bit (issue 32).

For the tiny seeded deepseek2 models (`infer_helpers.tiny_moe_model`:
deepseek2 and deepseek2-v3, the absorbed layout) and each profile P with
tests/data/P/llama_ref_moe_fa_<arch>.npz (`python tools/llama_ref.py
--profile P moe --arch deepseek2,deepseek2-v3 --flash-attn`, llama-cpp-python
0.3.36 built for P, F16 cache, flash attention on): every logit of every
row of the batched teacher-forced pass and of the incremental pass equals
llama.cpp's bits (the "vec" path), our greedy continuation is llama.cpp's;
the long run (270 prompt ids, 8 greedy tokens) matches every row's hash:
its batched pass takes the "tiled" path, its decode steps the "split-KV"
one. Then what stays refused.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from infer_helpers import (ARM_PROFILES, DATA, all_profile_files, cached_model, check_stored_fa_run, f32_bits,
                           tiny_moe_files)
from strata_ref.cpu import PROFILES as CPU_PROFILES
from strata_ref.infer.mla import MLA_FLASH_ATTN_PROFILES

ARCHS = ("deepseek2", "deepseek2-v3")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    return tiny_moe_files(tmp_path_factory, ARCHS, "tiny_mla")


_model = cached_model


#: the cache types other than F16 stored (deepseek2 only: `python
#: tools/llama_ref.py --profile P moe --arch deepseek2 --flash-attn
#: --cache-type T`)
OTHER_TYPES = ("f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")


def _name(arch, ct):
    return f"llama_ref_moe_fa_{arch}.npz" if ct == "f16" else f"llama_ref_moe_fa_{ct}_{arch}.npz"


#: the cache types other than F16 the default suite checks (the others
#: under `-m slow`, for CI's time)
DEFAULT_TYPES = ("q8_0",)


#: the arm64 profile whose DEFAULT_TYPES files the default suite checks
#: (the other arm64 files under `-m slow`)
DEFAULT_ARM = "armv8.2-fp16"


def _slow(ct: str, profile: str) -> tuple:
    if profile in ARM_PROFILES:
        default = ct in DEFAULT_TYPES and profile == DEFAULT_ARM
    else:
        default = ct == "f16" or ct in DEFAULT_TYPES
    return () if default else (pytest.mark.slow,)


def _cases():
    return ([pytest.param(arch, "f16", *p.values, id=f"{arch}-f16-{p.values[0]}",
                          marks=_slow("f16", p.values[0]))
             for arch in ARCHS for p in all_profile_files(_name(arch, "f16"))]
            + [pytest.param("deepseek2", ct, *p.values, id=f"deepseek2-{ct}-{p.values[0]}",
                            marks=_slow(ct, p.values[0]))
               for ct in OTHER_TYPES for p in all_profile_files(_name("deepseek2", ct))])


def test_every_checked_profile_has_data():
    # a (profile, cache type) is in MLA_FLASH_ATTN_PROFILES exactly when its
    # data is stored: llama-cpp-python 0.3.36's here, prebuilt v0.4.0's
    # (F16) in tests/test_cpu_prebuilt.py (`moe_<arch>.npz`, flash attention
    # on and off)
    for arch in ARCHS:
        have = {(p.values[0], "f16") for p in all_profile_files(_name(arch, "f16"))}
        have |= {(f.parent.name, "f16") for f in DATA.glob(f"v0.4.0-*/moe_{arch}.npz")}
        if arch == "deepseek2":
            have |= {(p.values[0], ct) for ct in OTHER_TYPES for p in all_profile_files(_name(arch, ct))}
        want = {(p, t) for p, ts in MLA_FLASH_ATTN_PROFILES.items() for t in ts
                if arch == "deepseek2" or t == "f16"}
        assert have == want, arch


@pytest.mark.parametrize("arch, ct, profile, path", _cases())
def test_mla_flash_attn_logits_are_llama_cpp_bits(arch, ct, profile, path, tiny_files):
    ref = np.load(path)
    assert str(ref["profile"]) == profile and profile in CPU_PROFILES and bool(ref["flash_attn"])
    assert str(ref["type_k"]) == str(ref["type_v"]) == ct
    f = tiny_files[arch]
    assert hashlib.sha256(f.read_bytes()).hexdigest() == str(ref["sha256"])
    m = _model(f, profile)
    check_stored_fa_run(m, ref, profile, flash_attn=True, type_k=ct, type_v=ct)
    if ct == "f16":
        # the data is flash attention's: every row past the first differs
        # from llama.cpp's rows without it (same model, prompt and tokens)
        # (the long run: for F16 and F32 (cast to F16) the tiled path
        # (batched, 278 query tokens) and the split-KV path (the decode
        # steps see 512 KV cells); for the other types the vec path)
        off = np.load(DATA / profile / f"llama_ref_moe_{arch}.npz")
        assert off["greedy_ids"].tolist() == ref["greedy_ids"].tolist()
        assert (f32_bits(off["batched"][1:]) != f32_bits(ref["batched"][1:])).any(axis=1).all()


def test_fa_paths_of_the_long_run():
    # the long run reaches all three of ggml's paths, for the MLA cache
    # (one KV head, F16)
    from infer_helpers import FA_LONG_IDS, FA_LONG_N_GREEDY
    from strata_ref.cpu.flash_attn import fa_path
    from strata_ref.infer.kv_cache import kv_length
    from strata_ref.types import GGMLType
    f16 = GGMLType.F16
    n = len(FA_LONG_IDS)
    assert fa_path(f16, f16, n + FA_LONG_N_GREEDY, kv_length(n + FA_LONG_N_GREEDY)) == "tiled"
    assert fa_path(f16, f16, n, kv_length(n)) == "tiled"
    assert fa_path(f16, f16, 1, kv_length(n + 1)) == "split"
    assert fa_path(f16, f16, 12, kv_length(12)) == "vec"


@pytest.mark.parametrize("profile", ["v0.4.0-sapphirerapids"])
def test_mla_flash_attn_is_refused_where_not_checked(profile, tiny_files):
    # NotEmulated naming flash attention and the profile; without flash
    # attention the MLA cache runs there
    assert profile not in MLA_FLASH_ATTN_PROFILES
    m = _model(tiny_files["deepseek2"], profile)
    with pytest.raises(NotImplementedError, match="flash attention over the MLA cache .* pass --flash-attn off") as e:
        m.new_cache(64, flash_attn=True)
    assert e.value.what == "flash attention" and profile in e.value.where
    assert not m.new_cache(64, flash_attn=False).flash_attn
    # a type emulated with flash attention only: flash attention is no way
    # out on this profile, an f16 cache is
    with pytest.raises(NotImplementedError, match=f"emulated with flash attention only, .* not bf16 on "
                                                  f"{profile}: use an f16 cache here$") as e:
        m.new_cache(64, type_k="bf16", type_v="bf16", flash_attn=False)
    assert e.value.what == "a bf16 K cache and a bf16 V cache"


def test_flash_attn_v_width_is_checked():
    from strata_ref.cpu.flash_attn import flash_attn_ext
    from strata_ref.types import GGMLType
    f16 = GGMLType.F16
    q = np.zeros((1, 2, 64), np.float32)
    k = np.zeros((1, 4, 64), np.float16)
    with pytest.raises(ValueError, match="v_width 65 is outside 1 .. head_dim 64"):
        flash_attn_ext(q, f16, k, f16, k, 1, 256, np.array([0]), 0.125, CPU_PROFILES["avx2"], v_width=65)
    out = flash_attn_ext(q, f16, k, f16, k[:, :, :32], 1, 256, np.array([0]), 0.125, CPU_PROFILES["avx2"],
                         v_width=32)
    assert out.shape == (1, 2 * 32)


def test_mla_flash_attn_cache_types_are_per_profile(tiny_files):
    # v0.4.0-haswell is checked with the F16 cache only (its prebuilt data):
    # a q8_0 MLA cache with flash attention is refused there, not on avx2
    m = _model(tiny_files["deepseek2"], "v0.4.0-haswell")
    assert m.new_cache(64).flash_attn        # v0.4.0's default: flash attention on, F16
    with pytest.raises(NotImplementedError, match="not q8_0 on v0.4.0-haswell") as e:
        m.new_cache(64, type_k="q8_0", type_v="q8_0")
    assert e.value.what == "flash attention" and "q8_0" in e.value.where
    # the profiles with the same types named together (was one list per profile)
    assert ("for the cache types f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 on scalar, avx2, avx512, "
            "armv8.0, armv8.2-dotprod, armv8.2-fp16, armv8.6-i8mm; "
            "f16 on v0.4.0-x64, v0.4.0-sse42, v0.4.0-sandybridge, v0.4.0-ivybridge, v0.4.0-piledriver, "
            "v0.4.0-haswell, v0.4.0-skylakex, v0.4.0-zen4 only") in str(e.value)
    assert _model(tiny_files["deepseek2"], "avx2").new_cache(64, flash_attn=True, type_k="q8_0",
                                                              type_v="q8_0").type_k.name == "Q8_0"
