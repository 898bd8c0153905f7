"""The arm64 profiles against their llama.cpp builds, bit for bit.

tests/data/<profile>/ holds, per ARM build (docs/arm64.md; `python
tools/arm_ref.py data`, run under qemu-aarch64), the files the x86
profiles have, with the same names and keys: `ggml_mm.npz` (every weight
type through the build's own `ggml_mul_mat`, 40 x 512, n = 1, 2, 3, 4, 8,
13 activation rows, a plain CPU buffer), `ggml_act_quant.npz` (its
`from_float`), `llama_ref_tiny.npz` / `llama_ref_typed.npz` (every logit
of tiny random models) and `llama_ref_<model>.npz` (a real model's
greedy run). Each comparison is of the float32 bits. What no kernel
reproduces yet is a strict xfail naming the missing piece.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from infer_helpers import DATA, TINY_IDS, arm_profile_files, f32_bits, tiny_model
from strata_ref import GGMLType
from strata_ref.cpu import PROFILES, act_quant
from strata_ref.cpu.matmul import QMatrix
from strata_ref.cpu.profiles import LLAMA_CPP_ARM64

ARM = tuple(n for n, p in PROFILES.items() if p.version == LLAMA_CPP_ARM64)
TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q1_0", "Q2_0", "MXFP4",
         "NVFP4", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S",
         "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS", "TQ1_0", "TQ2_0")
#: the weight types whose arm64 `vec_dot` is emulated (every one: the
#: families' "neon" / "dotprod" variants; the float types through the
#: chain's dots and tinyBLAS)
DONE = frozenset(TYPES)


def _data(profile, name):
    path = DATA / profile / name
    if not path.is_file():
        pytest.skip(f"no {path}")
    v = np.load(path)
    assert str(v["profile"]) == profile
    return v


def test_arm_profiles_are_declared():
    assert ARM == ("armv8.0", "armv8.2-dotprod", "armv8.2-fp16", "armv8.6-i8mm")
    a0, dp, fp, mm = (PROFILES[p] for p in ARM)
    assert a0.isa.names == ("arm_neon", "generic")
    assert dp.isa.names == ("arm_dotprod", "arm_neon", "generic")
    assert fp.isa.names == ("arm_fp16", "arm_dotprod", "arm_neon", "generic")
    assert mm.isa.names == ("arm_i8mm", "arm_fp16", "arm_dotprod", "arm_neon", "generic")
    # what the stored builds say of themselves (system_info, cmake_args)
    for p in (a0, dp, fp, mm):
        v = np.load(DATA / p.name / "ggml_mm.npz")
        info = str(v["system_info"])
        assert f"-DGGML_CPU_ARM_ARCH={p.march}" in str(v["cmake_args"])
        assert ("DOTPROD = 1" in info) == ("DOTPROD" in p.options)
        assert ("FP16_VA = 1" in info) == ("FP16_VA" in p.options) == bool(p.isa.resolve("F16_VA"))
        assert ("MATMUL_INT8 = 1" in info) == ("MATMUL_INT8" in p.options)
        # llamafile is compiled out of the i8mm build
        assert ("LLAMAFILE = 1" in info) == (p.tinyblas > 0)
        assert "SVE" not in info
    assert (a0.simd_lanes, a0.fma, a0.tinyblas, a0.repack) == (4, True, 4, frozenset())
    assert dp.repack == {"Q4_0", "Q8_0", "Q1_0", "IQ4_NL", "MXFP4", "Q4_K", "Q5_K", "Q6_K"}
    assert fp.repack == mm.repack == dp.repack
    assert a0.isa.resolve("quantize_rows_q8") is act_quant.quantize_rows_q8_arm
    # the layouts each build chose (the `repack` key of its stored runs)
    layouts = {p.name: " ".join(str(np.load(f)["repack"]) for f in sorted((DATA / p.name).glob("llama_ref_*.npz")))
               for p in (dp, mm)}
    for p in (dp, mm):
        for t, lay in p.isa.resolve("REPACK").items():
            if t.name in ("Q4_0", "Q8_0", "Q4_K", "Q6_K"):
                assert lay.removeprefix("arm_") in layouts[p.name], (p.name, lay)


def test_two_row_vec_dot_follows_ggml_chunking():
    # ggml_compute_forward_mul_mat with 2 threads: the i8mm two-row vec_dot
    # only on even tensors whose thread chunk is even on both sides
    from strata_ref.cpu.mmla import two_rows
    # 40 weight rows x 2 activation rows: 3 x 1 chunks of 16 < 4 * 2, so
    # re-chunked by thread: rows [0, 20) and [20, 40), both even
    assert all(two_rows(r, t, 40, 2, 2) for r in range(40) for t in range(2))
    assert not any(two_rows(r, t, 40, 3, 2) for r in range(40) for t in range(3))    # odd n
    # 42 rows: chunks [0, 21) and [21, 42), odd: one row at a time
    assert not any(two_rows(r, 0, 42, 2, 2) for r in range(42))
    # 38 x 38 with 16-chunks: 3 x 3 = 9 >= 8 chunks of 13, 13, 12 per side:
    # only the last chunk of each side is even
    assert [two_rows(r, 30, 38, 38, 2) for r in (0, 12, 25, 26, 37)] == [False] * 3 + [True] * 2
    assert not two_rows(37, 12, 38, 38, 2)


def _mm_case(t, profile):
    marks = () if t in DONE else (pytest.mark.xfail(
        strict=True, raises=(AssertionError, NotImplementedError),
        reason=f"{t}: the NEON vec_dot of arch/arm/quants.c is not emulated yet"),)
    return pytest.param(t, profile, id=f"{t}-{profile}", marks=marks)


#: ggml_mm_odd.npz (`tools/arm_ref.py data P --only mmodd`): the 32-value
#: block types with rows of 5 blocks, which end the NEON `vec_dot`s in
#: their scalar tail (the i8mm build's Q5_0: GCC's `usdot`, `neon_legacy`)
ODD_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4")


@pytest.mark.parametrize("t, profile, fname", [pytest.param(*_mm_case(t, p).values, "ggml_mm.npz",
                                                            marks=_mm_case(t, p).marks, id=f"{t}-{p}")
                                               for p in ARM for t in TYPES]
                         + [pytest.param(t, p, "ggml_mm_odd.npz", id=f"{t}-{p}-odd") for p in ARM for t in ODD_TYPES])
def test_matmul_is_the_arm_builds_bits(t, profile, fname):
    v = _data(profile, fname)
    rows, cols = int(v["rows"]), int(v["cols"])
    w = QMatrix(GGMLType[t], v[f"{t}_w"], rows, cols, t, profile)
    w.repackable = False         # ggml's graph API kept the plain layout
    for n in v["ns"]:
        y = w.matmul(v[f"x{n}"])
        want = v[f"{t}_y{n}"]
        bad = np.flatnonzero(f32_bits(y) != f32_bits(want))
        assert bad.size == 0, (f"{t} {profile} n={n}: {bad.size} of {y.size} differ, first at "
                               f"{np.unravel_index(bad[0], y.shape)}: {y.flat[bad[0]]!r} vs "
                               f"{want.flat[bad[0]]!r}")


@pytest.mark.parametrize("profile", ARM)
def test_activation_quantizers_are_the_arm_builds_bytes(profile):
    ref = _data(profile, "ggml_act_quant.npz")
    isa = PROFILES[profile].isa
    for name, fn in (("q8_0", lambda v: act_quant.quantize_q8_0_act(v, isa=isa)),
                     ("q8_1", lambda v: act_quant.quantize_q8_1_act(v, isa=isa)),
                     ("q8_k", lambda v: act_quant.quantize_q8_k_act(v, isa=isa))):
        for i, row in enumerate(ref["x"]):
            assert np.array_equal(fn(row), ref[name][i]), f"{profile} {name} row {i}"


def test_arm_quantizer_takes_the_inverse_of_d():
    # ARM's id = 1 / (amax / 127) (two roundings) against x86's 127 / amax
    # (one): for amax = 0.3 they are one ulp apart, and a value whose x * id
    # rounds to another integer under each shows which one a quantizer took
    amax = np.float32(0.3)
    id_arm = np.float32(np.float32(1) / np.float32(amax / np.float32(127)))
    id_x86 = np.float32(np.float32(127) / amax)
    assert id_arm != id_x86
    x = np.arange(1, 1 << 20, dtype=np.float32) * np.float32(amax / (1 << 20))
    qa, qx = np.rint(x * id_arm), np.rint(x * id_x86)
    i = int(np.flatnonzero(qa != qx)[0])
    row = np.zeros(32, np.float32)
    row[0], row[1] = amax, x[i]
    arm = act_quant.quantize_q8_0_act(row, isa=PROFILES["armv8.0"].isa)[0, 2:].view(np.int8)
    x86 = act_quant.quantize_q8_0_act(row, isa=PROFILES["avx2"].isa)[0, 2:].view(np.int8)
    assert (arm[0], x86[0]) == (127, 127)
    assert (arm[1], x86[1]) == (qa[i], qx[i]) and qa[i] != qx[i]


def test_arm_q8_k_rounds_the_exact_product():
    # ARM's ggml-base contracts quantize_row_q8_K_ref's nearest_int(iscale *
    # x) = iscale * x + 1.5 * 2^23 into one FMA: q is the exact product
    # rounded half to even; x86 rounds the product to float first. A value
    # whose product lies within half an ulp of a half gets another q.
    mx = np.float32(-3.0)
    iscale = np.float32(np.float32(-127.0) / mx)
    # the float32s next to x = (k + 0.5) / iscale, k = 0 .. 125 (products
    # near each half)
    x0 = (np.arange(126, dtype=np.float32) + np.float32(0.5)) / iscale
    x = (x0.view(np.uint32)[:, None].astype(np.int64) + np.arange(-64, 64)).ravel().astype(np.uint32)
    x = x.view(np.float32)
    exact = np.rint(np.float64(iscale) * x.astype(np.float64))
    rounded = np.rint(np.float32(iscale) * x)
    i = int(np.flatnonzero(exact != rounded)[0])
    row = np.zeros(256, np.float32)
    row[0], row[1] = mx, x[i]
    arm = act_quant.quantize_q8_k_act(row, isa=PROFILES["armv8.0"].isa)[0, 4:260].view(np.int8)
    x86 = act_quant.quantize_q8_k_act(row, isa=PROFILES["avx2"].isa)[0, 4:260].view(np.int8)
    assert (arm[0], x86[0]) == (-127, -127)
    assert (arm[1], x86[1]) == (exact[i], rounded[i]) and exact[i] != rounded[i]


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("profile", ARM)
def test_tiny_random_models_are_the_arm_builds_bits(arch, profile, tmp_path):
    from strata_ref.infer.loader import load
    ref = _data(profile, "llama_ref_tiny.npz")
    f = tmp_path / f"tiny_{arch}.gguf"
    tiny_model(arch, f, seed=0)
    assert hashlib.sha256(f.read_bytes()).hexdigest() == str(ref[f"{arch}_sha256"])
    m = load(f, profile=profile)
    got = m.forward(TINY_IDS, m.new_cache(64), all_logits=True)
    assert np.array_equal(f32_bits(got), f32_bits(ref[f"{arch}_logits"]))


def _logits(m, ids, n_prompt: int, kind: str) -> np.ndarray:
    """float32 logits of every position: one batched pass, or the prompt
    pass then one token per call (as tools/llama_ref.py made them)."""
    cache = m.new_cache(512)
    if kind == "batched":
        return m.forward(ids, cache, all_logits=True)
    rows = [m.forward(ids[:n_prompt], cache, all_logits=True)]
    rows += [m.forward([t], cache)[None] for t in ids[n_prompt:]]
    return np.concatenate(rows)


#: the registry models and llama.cpp-quantized variants (tests/model_variants.py)
#: run on the ARM profiles; the files' `repack` key names the layouts each
#: build chose
MODELS = ("SmolLM2-135M-Instruct", "smollm2-q4_0", "smollm2-q5_1", "smollm2-q2_k", "smollm2-q3_k_m",
          "smollm2-iq4_nl", "smollm2-iq4_xs", "smollm2-q5_k_m", "Qwen2.5-Coder-0.5B-Instruct", "gemma-3-270m")


def _model_cases():
    # every (model, profile) with a stored file (arm_profile_files: the
    # marks of a layout not emulated yet)
    return [pytest.param(name, p.values[0], id=f"{name}-{p.values[0]}", marks=p.marks)
            for name in MODELS for p in arm_profile_files(f"llama_ref_{name}.npz")]


def _model(name, profile):
    from infer_helpers import load_model
    if name.startswith("smollm2-"):
        from model_variants import build_variant
        from strata_ref.infer.loader import load
        return load(build_variant(name), profile=profile)
    return load_model(name, profile)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["batched", "incr"])
@pytest.mark.parametrize("name, profile", _model_cases())
def test_model_is_the_arm_builds_bits(name, profile, kind):
    # every logit of every row (llama.cpp's rows are stored as blake2b
    # hashes, `infer_helpers.row_hashes`), its argmax, and the greedy
    # continuation
    from infer_helpers import row_hashes
    ref = _data(profile, f"llama_ref_{name}.npz")
    m = _model(name, profile)
    ids = ref["prompt_ids"].tolist() + ref["greedy_ids"].tolist()
    ours = _logits(m, ids, len(ref["prompt_ids"]), kind)
    bad = np.flatnonzero(row_hashes(ours) != ref[f"{kind}_hash"])
    got = np.take_along_axis(ours, ref[f"{kind}_ids"], axis=1)
    assert bad.size == 0, (f"{profile} {kind}: rows {bad.tolist()} differ (top-128 max |diff| "
                           f"{np.abs(got - ref[f'{kind}_logits']).max():.3g})")
    # the stored top-1 is llama.cpp's argmax; the greedy run is the
    # incremental pass (a batched row may tie-break elsewhere)
    assert np.array_equal(np.argmax(ours, axis=1), ref[f"{kind}_ids"][:, 0])
    if kind == "incr":
        p = len(ref["prompt_ids"])
        assert np.argmax(ours[p - 1:-1], axis=1).tolist() == ref["greedy_ids"].tolist()


def test_rope_contracts_as_arm_gcc():
    # aarch64 GCC vectorizes rotate_pairs' normal-style loop with y0 =
    # fma(-x1, sin, round(x0 cos)) where x86 GCC fuses x0 cos (SmolLM2's
    # stored logits differ from row 1 on with the x86 order); NeoX pairs
    # and y1 as on x86. Values with a product that rounds: the two orders
    # give different bits.
    from math import fsum
    from strata_ref.cpu import ops

    def fma(a, b, c):        # exact a*b + c (float32 products are exact in
        return np.float32(fsum([float(a) * float(b), float(c)]))   # double)

    x = np.array([[[1.1, 0.7]]], np.float32)
    c = np.array([[0.3]], np.float32)
    s = np.array([[0.9]], np.float32)
    x0, x1 = x[0, 0]
    arm_y0 = fma(-x1, s[0, 0], np.float32(x0 * c[0, 0]))
    x86_y0 = fma(x0, c[0, 0], -np.float32(x1 * s[0, 0]))
    y1 = fma(x0, s[0, 0], np.float32(x1 * c[0, 0]))
    assert arm_y0 != x86_y0
    for prof, y0 in (("armv8.0", arm_y0), ("armv8.2-dotprod", arm_y0), ("avx2", x86_y0)):
        got = ops.rope(x, c, s, 2, False, PROFILES[prof])[0, 0]
        assert (got[0], got[1]) == (y0, y1), prof
    # NeoX pairs: the x86 order on ARM too
    got = ops.rope(x, c, s, 2, True, PROFILES["armv8.0"])[0, 0]
    assert (got[0], got[1]) == (x86_y0, y1)


def test_repacked_q8_0_expert_rows_take_the_gemv():
    # ggml's MUL_MAT_ID on a repacked q8_0_4x4 matrix runs the gemv (fused)
    # for every row; a plain mul_mat takes the gemm (unfused) for whole
    # groups of 4: the expert rows are the one-row products' bits
    rng = np.random.default_rng(0)
    from strata_ref import quantize
    w = quantize(rng.standard_normal((8, 64)).astype(np.float32), "Q8_0")
    x = rng.standard_normal((4, 64)).astype(np.float32)
    m = QMatrix(GGMLType.Q8_0, w, 8, 64, "w", "armv8.2-dotprod")
    assert m.repacked()
    rows = np.concatenate([m.matmul(x[r:r + 1]) for r in range(4)])
    assert np.array_equal(f32_bits(m.matmul(x, mmid=True)), f32_bits(rows))
    assert not np.array_equal(f32_bits(m.matmul(x)), f32_bits(rows))     # the gemm


def test_unemulated_repacked_layout_is_refused():
    # dotprod repacks Q1_0 matrices of rows % 4 as q1_0_4x4, whose gemv /
    # gemm are not emulated: a product on that path says so (the CLI prints
    # it as one error line); the plain layout runs the NEON vec_dot
    rng = np.random.default_rng(0)
    from strata_ref import quantize
    w = quantize(rng.standard_normal((4, 128)).astype(np.float32), "Q1_0")
    x = rng.standard_normal((1, 128)).astype(np.float32)
    m = QMatrix(GGMLType.Q1_0, w, 4, 128, "w", "armv8.2-dotprod")
    assert m.repacked()
    with pytest.raises(NotImplementedError, match="q1_0_4x4") as e:
        m.matmul(x)
    # the short phrase `strata-ref which` prints for a candidate not run
    assert (e.value.what, e.value.where) == ("the Q1_0 mat-mul (w)", "on this profile")
    plain = QMatrix(GGMLType.Q1_0, w, 4, 128, "w", "armv8.0")
    assert not plain.repacked()
    assert plain.matmul(x).shape == (1, 4)


@pytest.mark.parametrize("opts, what", [
    (dict(flash_attn=True, type_k="q4_0"), "flash attention and a q4_0 K cache on the arm64 profile armv8.0"),
    (dict(type_k="q8_0"), "a q8_0 K cache on the arm64 profile armv8.0"),
    (dict(type_v="q4_0"), "flash attention and a q4_0 V cache on the arm64 profile armv8.0")])
def test_unemulated_kv_caches_are_refused(opts, what, tmp_path, capsys, monkeypatch):
    # trial finding: flash attention and quantized KV caches ran on the ARM
    # profiles through the x86 code (other bits, no word); a cache type
    # whose ARM code is not emulated and checked (`ARM64_KV_TYPES`) is
    # refused. Every cache type is checked now, so the table is cut down
    # here to see the refusal. A quantized V cache turns flash attention on
    # (`auto`)
    from strata_ref.cli import main
    from strata_ref.infer import model as model_mod
    from strata_ref.infer.loader import load
    monkeypatch.setitem(model_mod.ARM64_KV_TYPES, "armv8.0",
                        {False: frozenset({"f16"}), True: frozenset({"f16", "q8_0"})})
    f = tmp_path / "tiny.gguf"
    tiny_model("qwen3", f, seed=0)
    m = load(f, profile="armv8.0")
    assert m.new_cache(16).n == 0                    # F16 without flash attention runs
    with pytest.raises(NotImplementedError, match=what):
        m.new_cache(16, **opts)
    args = ["--flash-attn", "on"] if opts.get("flash_attn") else []
    for kv in ("k", "v"):
        if f"type_{kv}" in opts:
            args += [f"--cache-type-{kv}", opts[f"type_{kv}"]]
    assert main(["generate", str(f), "Hi", "--max-tokens", "1", "--cpu", "armv8.0", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"strata-ref: error: {what}") and err.count("\n") == 1


@pytest.mark.parametrize("profile", ARM)
def test_arm_profiles_run_the_caches_their_data_checks(profile):
    # ARM64_KV_TYPES claims no more than the profile's stored data checks:
    # each type it lists, with and without flash attention, is the K or the
    # V type of a configuration of that setting in the llama_kv file (F16
    # without flash attention: every llama_ref file); a pair runs iff both
    # types are listed. (A stored configuration outside the table is
    # checked to be refused: test_kv_cache_is_the_arm_builds_bits.)
    from strata_ref.infer.kv_cache import CACHE_TYPES
    from strata_ref.infer.model import ARM64_KV_TYPES, unemulated_cache
    ref = np.load(DATA / profile / "llama_kv_SmolLM2-135M-Instruct.npz")
    stored = {False: {"f16"}, True: set()}
    for name in map(str, ref["configs"]):
        fa = bool(ref[f"{name}:flash_attn"])
        stored[fa] |= {str(ref[f"{name}:type_k"]), str(ref[f"{name}:type_v"])}
    table = ARM64_KV_TYPES[profile]
    assert set(table[False]) <= stored[False] and set(table[True]) <= stored[True], (table, stored)
    for fa in (False, True):
        for tk in CACHE_TYPES:
            for tv in CACHE_TYPES:
                if not fa and tv not in ("f32", "f16", "bf16"):
                    continue             # llama.cpp: a quantized V cache needs flash attention
                got = unemulated_cache(profile, dict(flash_attn=fa, type_k=tk, type_v=tv))
                assert (got is None) == (tk in table[fa] and tv in table[fa]), (fa, tk, tv, got)
    assert unemulated_cache(profile, {}) is None
    assert unemulated_cache("avx2", dict(flash_attn=True)) is None


#: the KV configurations every arm64 profile checks by default; each other
#: one is checked by default on one profile in turn (the rest `-m slow`):
#: every cache type compiles its own kernels per profile
_KV_EVERY_PROFILE = ("f16-f16-fa", "q8_0-q8_0-fa")


def _kv_cases():
    # every (profile, configuration) of the stored llama_kv files; the long
    # prompt (the tiled and split-KV paths, 278 rows) is marked slow
    out = []
    for k, p in enumerate(arm_profile_files("llama_kv_SmolLM2-135M-Instruct.npz")):
        prof, path = p.values
        ref = np.load(path)
        for i, name in enumerate(map(str, ref["configs"])):
            slow = str(ref[f"{name}:prompt"]) == "long" or (
                name not in _KV_EVERY_PROFILE and i % len(ARM) != k % len(ARM))
            out.append(pytest.param(prof, name, id=f"{prof}-{name}",
                                    marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize("profile, name", _kv_cases())
def test_kv_cache_is_the_arm_builds_bits(profile, name):
    # a cache the profile runs (`unemulated_cache` None): every row of the
    # batched and the incremental pass (hashes of the float32 bytes), the
    # stored top logits' bits and llama.cpp's greedy ids; a cache it
    # refuses: the refusal (what is still to emulate, docs/arm64.md)
    from infer_helpers import check_kv_config, kv_opts, load_model
    from strata_ref.infer.model import unemulated_cache
    ref = _data(profile, "llama_kv_SmolLM2-135M-Instruct.npz")
    opts = kv_opts(ref, name)
    m = load_model("SmolLM2-135M-Instruct", profile)
    if unemulated_cache(profile, opts):
        with pytest.raises(NotImplementedError, match="is not emulated yet"):
            m.new_cache(int(ref["n_ctx"]), **opts)
        return
    check_kv_config(m, ref, name, f"{profile} ")


@pytest.mark.parametrize("profile", ARM)
@pytest.mark.parametrize("t", ["IQ4_NL", "MXFP4"])
def test_typed_models_are_the_arm_builds_bits(t, profile, tmp_path):
    # tests/typed_models.py: every matrix of type t; every logit of the
    # batched pass and of the incremental one (5 tokens, then one by one)
    from typed_models import IDS, N_PROMPT, typed_model
    from strata_ref.infer.loader import load
    ref = _data(profile, "llama_ref_typed.npz")
    assert ref["ids"].tolist() == IDS and int(ref["n_prompt"]) == N_PROMPT
    f = tmp_path / f"typed_{t}.gguf"
    typed_model(t, f, seed=0)
    assert hashlib.sha256(f.read_bytes()).hexdigest() == str(ref[f"{t}_sha256"])
    m = load(f, profile=profile)
    batched = m.forward(IDS, m.new_cache(64), all_logits=True)
    cache = m.new_cache(64)
    incr = np.concatenate([m.forward(IDS[:N_PROMPT], cache, all_logits=True)]
                          + [m.forward([k], cache)[None] for k in IDS[N_PROMPT:]])
    for kind, got in (("batched", batched), ("incr", incr)):
        bad = np.flatnonzero((f32_bits(got) != f32_bits(ref[f"{t}_{kind}"])).any(axis=1))
        assert bad.size == 0, f"{t} {profile} {kind}: rows {bad.tolist()} differ"


def test_i8mm_stacks_only_what_ggml_chunks_alike():
    # ggml picks the i8mm two-row vec_dot per tensor (its row count and its
    # thread chunks): q|k|v or gate|up stacked into one matrix could change
    # bits, so QMatrix.stack declines; a MUL_MAT_ID expert stack (one row
    # at a time in ggml) is made. Trial finding: the MoE models failed on
    # armv8.6-i8mm with an AttributeError on a None expert stack.
    from strata_ref import quantize
    from strata_ref.cpu.moe import ExpertMatrix
    rng = np.random.default_rng(0)
    w = np.asarray(quantize(rng.standard_normal((2 * 6, 64)).astype(np.float32), "Q8_0")).reshape(-1)
    half = w.size // 2                   # 6 rows of 2 Q8_0 blocks (68 bytes)
    for prof, stacked in (("armv8.2-dotprod", True), ("armv8.6-i8mm", False)):
        parts = [QMatrix(GGMLType.Q8_0, w[:half], 6, 64, "a", prof),
                 QMatrix(GGMLType.Q8_0, w[half:], 6, 64, "b", prof)]
        assert (QMatrix.stack(parts) is not None) == stacked, prof
    ex = [ExpertMatrix(GGMLType.Q8_0, w, 2, 6, 64, n, "armv8.6-i8mm") for n in ("gate", "up")]
    gu = ExpertMatrix.stack(ex, "gate_up")
    assert all(q is not None and q.rows == 12 for q in gu.experts)
    x = rng.standard_normal((3, 1, 64)).astype(np.float32)
    ids = np.array([[0], [1], [0]])
    got = gu.mul_mat_id(x, ids)
    want = np.concatenate([e.mul_mat_id(x, ids) for e in ex], axis=2)
    assert np.array_equal(f32_bits(got), f32_bits(want))


@pytest.mark.parametrize("profile", ARM)
@pytest.mark.parametrize("t", ["q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
def test_base_quantizers_are_the_arm_builds_bits(t, profile):
    # a block-type KV cache is stored by ggml-base's reference quantizer,
    # which GCC contracts on arm64 (`cpu.base_quant`): the build's own
    # from_float under qemu (tools/arm_ref.py basequant) on blocks searched
    # so that the FMA changes their bytes, then 16 plain blocks
    from strata_ref.cpu import select
    from strata_ref.cpu.base_quant import quantize_base
    ref = _data(profile, "ggml_base_quant.npz")
    x, want = ref[f"{t}_x"], ref[t]
    got = quantize_base(x, t, select(profile).isa)
    assert np.array_equal(got, want), np.flatnonzero((got != want).any(axis=1))[:8]
    searched = len(x) - 16
    if t in ("q4_0", "q5_0", "iq4_nl"):
        assert searched >= 32           # the data can tell the two forms apart
    # the x86 form (rounded twice) gives other bytes on every searched block
    plain = quantize_base(x, t, select("avx2").isa)
    assert (plain[:searched] != want[:searched]).any(axis=1).all()


def test_base_quant_refuses_what_it_does_not_emulate():
    from strata_ref.cpu import select
    from strata_ref.cpu.base_quant import quantize_base
    x = np.ones((2, 256), np.float32)
    with pytest.raises(NotImplementedError, match="Q4_K's reference quantizer"):
        quantize_base(x, "Q4_K", select("armv8.0").isa)
    assert quantize_base(x, "Q4_K", select("avx2").isa).shape == (2, 144)   # as written on x86
    arm, x86 = select("armv8.0").isa, select("scalar").isa
    with pytest.raises(ValueError, match="row length 48 is not a multiple of the block size 32"):
        quantize_base(np.ones((2, 48), np.float32), "q4_0", arm)
    # the inputs, shapes and errors of strata_ref.quantize on every build
    # (trial findings: 1-D and empty input, NaN named without its position)
    for t in ("q4_0", "iq4_nl"):
        for x in (np.zeros((0, 32), np.float32), np.linspace(-1, 1, 64, dtype=np.float32)):
            assert quantize_base(x, t, arm).shape == quantize_base(x, t, x86).shape
        y = np.ones((3, 64), np.float32)
        y[2, 5] = np.nan
        with pytest.raises(ValueError, match=rf"quantize\({t.upper()}\): x\[2, 5\] is NaN"):
            quantize_base(y, t, arm)
    with pytest.raises(TypeError, match="instruction-set chain"):
        quantize_base(x, "q4_0", "armv8.0")


@pytest.mark.parametrize("t", ["Q8_0", "Q4_0"])
def test_cache_dots_take_the_path_ggml_takes(t):
    # attention stacks the query heads of one KV head as rows of K q, but
    # ggml multiplies each head's tokens apart: one decode token is
    # vec_dot, where llamafile's tinyBLAS_Q0_ARM would take the stacked
    # rows (found on armv8.2-dotprod's q8_0 / q4_0 K caches without flash
    # attention: its tinyBLAS rounds otherwise than its vec_dot)
    from strata_ref import quantize
    from strata_ref.cpu import select
    from strata_ref.cpu.attention import cache_dots
    rng = np.random.default_rng(1)
    k = np.asarray(quantize(rng.standard_normal((256, 64)).astype(np.float32), t)).reshape(256, -1)
    q = rng.standard_normal((3, 64)).astype(np.float32)
    prof = select("armv8.2-dotprod")
    stacked = cache_dots(t, k, 64, q, prof, "vec_dot")
    apart = np.concatenate([cache_dots(t, k, 64, q[i:i + 1], prof, "vec_dot") for i in range(3)])
    assert np.array_equal(f32_bits(stacked), f32_bits(apart))
    tiny = cache_dots(t, k, 64, q, prof, "tinyblas")
    assert not np.array_equal(f32_bits(tiny), f32_bits(apart))     # the two paths are told apart


def test_odd_block_data_is_stored_for_every_profile():
    # the odd-row products would otherwise skip silently
    assert all((DATA / p / "ggml_mm_odd.npz").is_file() for p in ARM)
