"""The v0.4.0 profiles against node-llama-cpp 3.21.1's prebuilt llama.cpp
v0.4.0, bit for bit.

tests/data/v0.4.0-<variant>/llama_ref_<model>[-fa].npz hold the logits of
the shipped `libggml-cpu-<variant>.so` (made by `python tools/prebuilt_ref.py`,
docs/prebuilt.md): a batched teacher-forced pass over the prompt and its 32
greedy tokens, and an incremental one (the prompt, then one token per call),
flash attention off and on (`-fa`). For every v0.4.0 profile, every model
stored for its variant, both passes and both flash-attention settings:

* every logit of every row: the row's FNV-1a 64 of its float32 bytes equals
  the stored one, and the stored top-k logits equal ours bit for bit;
* our argmax of every row is llama.cpp's, and the incremental pass's
  argmax from the last prompt row on is llama.cpp's greedy continuation.

An alias (`strata_ref.cpu.ALIASES`) computes with its profile; that the
two variants' libraries gave the same bits is tests/test_prebuilt_data.py's
alias-class test, and `test_aliases_are_alias_classes` ties the two lists.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from infer_helpers import DATA, f32_bits, model_path
from strata_ref import cpu
from strata_ref.cpu.profiles import V0_4_0

VERSION = "v0.4.0"
#: the v0.4.0 profiles declared
V040 = [p for p in cpu.PROFILES.values() if p.version == V0_4_0]


#: the default suite runs the models stored first (the F16 / BF16 dots, a
#: legacy quant, K-quants, an I-quant) for x64, haswell, skylakex and zen4
#: with flash attention on (v0.4.0's default) and, on haswell, off too;
#: SmolLM2 for every variant with flash attention on, and off on those
#: four; plus sapphirerapids' AMX models' batched pass. The rest (the
#: other variants' runs without flash attention, Qwen2.5, Gemma 3, the
#: SmolLM2 variants of every other weight type) runs under `-m slow`: the
#: one pytest process of the default suite, holding the compiled code of
#: every profile, grew past this machine's 23 GB with all of them
#: (OOM-killed), and CI's 90 minutes do not hold them (each variant and
#: attention path compiles its own kernels: 20-40 s a case on a 2-core
#: Zen 3, tests/test_cpu_prebuilt.py took 944 s of a 4,507 s suite)
DEFAULT_VARIANTS = {"x64", "haswell", "skylakex", "zen4"}
DEFAULT_MODELS = {"SmolLM2-135M-Instruct", "smollm2-f16", "smollm2-bf16", "smollm2-q4_0", "smollm2-q5_k_m",
                  "smollm2-iq4_xs"}
DEFAULT_ALSO = {("sapphirerapids", "smollm2-q4_0", "batched"), ("sapphirerapids", "smollm2-iq4_xs", "batched"),
                ("sapphirerapids", "smollm2-q5_k_m", "batched")}


def _in_default(variant: str, model: str, kind: str, fa: bool) -> bool:
    smollm2 = model == "SmolLM2-135M-Instruct"
    return ((variant in DEFAULT_VARIANTS and model in DEFAULT_MODELS
             and (fa or variant == "haswell" or smollm2))
            or (smollm2 and fa) or (variant, model, kind) in DEFAULT_ALSO)


def _cases():
    out = []
    for p in V040:
        d = DATA / f"{VERSION}-{p.variant}"
        for f in sorted(d.glob("llama_ref_*.npz")):
            stem = f.stem[len("llama_ref_"):]
            model, fa = (stem[:-3], True) if stem.endswith("-fa") else (stem, False)
            for kind in ("batched", "incr"):
                marks = () if _in_default(p.variant, model, kind, fa) else (pytest.mark.slow,)
                out.append(pytest.param(p.name, model, fa, f, kind, marks=marks,
                                        id=f"{p.name}-{model}-{'fa' if fa else 'nofa'}-{kind}"))
    return out


def _path(name: str) -> Path:
    # a requantized SmolLM2 variant (tests/model_variants.py), else a
    # registry model (gemma-3-270m too)
    from model_variants import VARIANTS, build_variant
    return build_variant(name) if name in VARIANTS else model_path(name)


@functools.lru_cache(maxsize=None)
def _sha256(name: str) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(_path(name), "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


# the cases come model by model within a profile: two loaded models are
# enough, and an unbounded cache held every (model, profile) of the session
# (the default suite's one process grew past 18 GB of anonymous memory)
@functools.lru_cache(maxsize=2)
def _model(name: str, profile: str):
    from strata_ref.infer.loader import load
    return load(_path(name), profile=profile)


def _logits(m, ids, n_prompt: int, kind: str, fa: bool) -> np.ndarray:
    cache = m.new_cache(512, flash_attn=fa)
    if kind == "batched":
        return m.forward(ids, cache, all_logits=True)
    rows = [m.forward(ids[:n_prompt], cache, all_logits=True)]
    rows += [m.forward([t], cache)[None] for t in ids[n_prompt:]]
    return np.concatenate(rows)


def test_every_profile_has_its_data():
    # each v0.4.0 profile is checked against its variant's library
    assert {p.variant for p in V040} == {"x64", "sse42", "sandybridge", "ivybridge", "piledriver", "haswell",
                                         "skylakex", "zen4", "sapphirerapids"}
    for p in V040:
        d = DATA / f"{VERSION}-{p.variant}"
        assert (d / "llama_ref_SmolLM2-135M-Instruct.npz").is_file(), p.name
        assert (d / "llama_ref_SmolLM2-135M-Instruct-fa.npz").is_file(), p.name


@pytest.mark.parametrize("profile, model, fa, path, kind", _cases())
def test_prebuilt_logits_are_llama_cpp_bits(profile, model, fa, path, kind):
    from strata_ref.hashing import fnv1a64
    ref = np.load(path)
    assert str(ref["profile"]) == f"{VERSION}-{cpu.PROFILES[profile].variant}"
    assert bool(ref["flash_attn"]) == fa
    m = _model(model, profile)
    assert _sha256(model) == str(ref["sha256"])     # the file llama.cpp ran
    p = ref["prompt_ids"].tolist()
    ids = p + ref["greedy_ids"].tolist()
    ours = _logits(m, ids, len(p), kind, fa)
    hashes = np.array([fnv1a64(np.ascontiguousarray(r, np.float32).tobytes()) for r in ours], np.uint64)
    bad = np.flatnonzero(hashes != ref[f"{kind}_hash"])
    got = np.take_along_axis(ours, ref[f"{kind}_ids"], axis=1)
    want = ref[f"{kind}_logits"]
    bad_top = np.flatnonzero((f32_bits(got) != f32_bits(want)).any(axis=1))
    assert bad.size == 0 and bad_top.size == 0, (
        f"{profile} {model} fa={fa} {kind}: rows {bad.tolist()} differ "
        f"(top-k max |diff| {np.abs(got - want).max():.3g})")
    assert np.array_equal(np.argmax(ours, axis=1), ref[f"{kind}_top1"])
    if kind == "incr":
        assert np.argmax(ours[len(p) - 1:-1], axis=1).tolist() == ref["greedy_ids"].tolist()


def test_aliases_are_alias_classes():
    # an alias computes with its profile: both variants are one alias class
    # of the stored data (tests/test_prebuilt_data.py checks their bits)
    from test_prebuilt_data import CLASSES
    for alias, name in cpu.ALIASES.items():
        a, p = alias[len(VERSION) + 1:], cpu.PROFILES[name]
        assert alias.startswith(VERSION + "-") and p.version == V0_4_0
        assert any(a in c and p.variant in c for c in CLASSES), (alias, name)
        assert cpu.select(alias) is p


def test_profiles_select_by_name():
    for p in V040:
        assert cpu.select(p.name) is p and cpu.select(p.name.upper()) is p
    # every variant of ggml's x86 ALL_VARIANTS list is a profile or an alias;
    # a name outside it is refused, named
    assert {p.variant for p in V040} | {a.removeprefix("v0.4.0-") for a in cpu.ALIASES} == {
        "x64", "sse42", "sandybridge", "ivybridge", "piledriver", "haswell", "skylakex", "cannonlake",
        "cascadelake", "icelake", "cooperlake", "zen4", "alderlake", "sapphirerapids"}
    with pytest.raises(ValueError, match="v0.4.0-zen5"):
        cpu.select("v0.4.0-zen5")


# ------------------------------------------------ deepseek2 (MLA), tiny models
#: tests/data/v0.4.0-<variant>/moe_<arch>.npz (`python tools/prebuilt_ref.py
#: moe`): the tiny seeded deepseek2 models through the variant's library,
#: flash attention off and on (v0.4.0's default), every logit of every row
MLA_FILES = sorted(DATA.glob(f"{VERSION}-*/moe_*.npz"))


def _mla_cases():
    out = []
    for f in MLA_FILES:
        variant = f.parent.name[len(VERSION) + 1:]
        arch = f.stem[len("moe_"):]
        # haswell's by default (the variant most x86 machines load), the
        # others under `-m slow`: each variant compiles its MoE / MLA paths
        # (79 s for haswell's first case in the CI), which the 90-minute CI
        # budget cannot give every variant
        marks = () if variant == "haswell" else (pytest.mark.slow,)
        for fa in (False, True):
            out.append(pytest.param(f"{VERSION}-{variant}", arch, fa, f, marks=marks,
                                    id=f"{VERSION}-{variant}-{arch}-{'fa' if fa else 'nofa'}"))
    return out


@functools.lru_cache(maxsize=None)
def _tiny_moe(arch: str) -> Path:
    import tempfile
    from infer_helpers import moe_seed, tiny_moe_model
    path = Path(tempfile.mkdtemp(prefix="tiny_mla_")) / f"tiny_{arch}.gguf"
    tiny_moe_model(arch, path, seed=moe_seed(arch))
    return path


def test_mla_data_is_stored():
    # haswell (the AVX2 builds) and x64 (the baseline) at least
    have = {(f.parent.name, f.stem) for f in MLA_FILES}
    for v in ("haswell", "x64"):
        for arch in ("deepseek2", "deepseek2-v3"):
            assert (f"{VERSION}-{v}", f"moe_{arch}") in have


@pytest.mark.parametrize("profile, arch, fa, path", _mla_cases())
def test_prebuilt_mla_logits_are_llama_cpp_bits(profile, arch, fa, path):
    import hashlib
    from infer_helpers import row_hashes
    from strata_ref.infer.loader import load
    ref = np.load(path)
    assert str(ref["profile"]) == profile and str(ref["cpu_library"]) == f"libggml-cpu-{ref['variant']}.so"
    f = _tiny_moe(arch)
    assert hashlib.sha256(f.read_bytes()).hexdigest() == str(ref["sha256"])
    m = load(f, profile=profile)
    mode = "on" if fa else "off"
    want = "enabled" if fa else "disabled"
    assert f"flash_attn            = {want}" in str(ref[f"{mode}:fa_log"])
    p = ref[f"{mode}:prompt_ids"].tolist()
    ids = p + ref[f"{mode}:greedy_ids"].tolist()
    for kind in ("batched", "incr"):
        ours = _logits(m, ids, len(p), kind, fa)
        bad = np.flatnonzero((f32_bits(ours) != f32_bits(ref[f"{mode}:{kind}"])).any(axis=1))
        assert bad.size == 0, f"{profile} {arch} fa={fa} {kind}: rows {bad.tolist()} differ"
        if kind == "incr":
            assert np.argmax(ours[len(p) - 1:-1], axis=1).tolist() == ref[f"{mode}:greedy_ids"].tolist()
    if fa:
        # the long run: flash attention's tiled path (batched) and split-KV
        # path (the decode steps over 512 KV cells)
        lp = ref["long_prompt_ids"].tolist()
        lids = lp + ref["long_greedy_ids"].tolist()
        for kind in ("batched", "incr"):
            ours = _logits(m, lids, len(lp), kind, True)
            bad = np.flatnonzero(row_hashes(ours) != ref[f"long_{kind}_hash"])
            assert bad.size == 0, f"{profile} {arch} long {kind}: rows {bad.tolist()} differ"
            if kind == "incr":
                assert np.argmax(ours[len(lp) - 1:-1], axis=1).tolist() == ref["long_greedy_ids"].tolist()
