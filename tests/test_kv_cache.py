"""The KV cache in every type llama.cpp's CPU backend stores, its Hadamard
rotation and flash attention, bit for bit against llama.cpp.

Reference data per CPU profile (tests/data/<profile>/, made by the peer
built for that profile):

* `llama_kv_<model>.npz` (`python tools/llama_ref.py --profile P kvcache
  MODEL`): per cache configuration (types of K and V, flash attention,
  rotation, short or long prompt) llama.cpp's greedy continuation and the
  logits of prompt + continuation, batched and incremental; every row is
  checked whole (its hash) and on its stored top logits.
* `llama_attn_<config>.npz` (`python tools/llama_dump.py --profile P ...
  --attn LAYER`): one layer's flash-attention node with llama.cpp's own
  inputs (q, the cache's K and V rows, the mask) and output, and the
  Hadamard mul_mats (input, output, the matrix): each operation alone.

Plus the rules themselves (which sizes rotate, when flash attention runs,
which of ggml's flash-attention paths), the oracle's properties, and
orders of arithmetic pinned by cases that change with them.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from infer_helpers import DATA, PROFILES, check_kv_config, f32_bits, load_model, profile_files
from strata_ref import cpu
from strata_ref.cpu.flash_attn import fa_path, flash_attn_ext
from strata_ref.cpu.hadamard import fwht, gen_hadamard, hadamard_scale, mul_mat_hadamard
from strata_ref.infer.kv_cache import (CACHE_TYPES, KVCache, cache_type, kv_length,
                                       resolve_flash_attn, rotation_disabled, rotation_sizes)
from strata_ref.types import GGMLType as T

KV_MODELS = ("SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct", "gemma-3-270m")


# ------------------------------------------------------------ the oracle
@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 128, 256, 512])
def test_gen_hadamard_is_ggml_matrix(n):
    h = gen_hadamard(n)
    assert h.dtype == np.float32 and h.shape == (n, n)
    # the entry: (float)(1.0 / (double)sqrtf(n)), one rounding of a double quotient
    c = np.float32(1.0 / float(np.sqrt(np.float32(n))))
    i = np.arange(n)
    sign = np.array([[(-1) ** bin(a & b).count("1") for b in i] for a in i])
    assert np.array_equal(f32_bits(h), f32_bits(sign * c))
    assert np.array_equal(h, h.T)
    # orthonormal: H H = I within the rounding of c
    e = np.abs(h.astype(np.float64) @ h.astype(np.float64) - np.eye(n)).max()
    assert e <= n * 2.0 ** -23


def test_gen_hadamard_sylvester_doubling():
    # the construction llama.cpp writes: [[H, H], [H, -H]] scaled
    h4 = gen_hadamard(4) / gen_hadamard(4)[0, 0]
    h8 = gen_hadamard(8) / gen_hadamard(8)[0, 0]
    assert np.array_equal(h8, np.block([[h4, h4], [h4, -h4]]))


@pytest.mark.parametrize("bad", [0, 3, 96, -64, 2.0, True, "64"])
def test_hadamard_size_must_be_a_power_of_two(bad):
    with pytest.raises(ValueError, match="power of two"):
        gen_hadamard(bad)
    with pytest.raises(ValueError, match="power of two"):
        fwht(np.zeros(192, np.float32), bad)


def test_fwht_errors():
    with pytest.raises(ValueError, match="whole rows of 64"):
        fwht(np.zeros(100, np.float32), 64)
    with pytest.raises(TypeError, match="float32"):
        fwht(np.zeros(64), 64)


def test_hadamard_scale_is_a_float_division():
    for n in (64, 256):
        assert hadamard_scale(n) == gen_hadamard(n)[0, 0]
    assert hadamard_scale(128) == np.float32(np.float32(1) / np.sqrt(np.float32(128)))


@pytest.mark.parametrize("n", [8, 64, 128, 256])
def test_fwht_is_the_hadamard_product_within_its_rounding(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((5, n)).astype(np.float32) * 3
    y = fwht(x, n)
    exact = x.astype(np.float64) @ (np.array(gen_hadamard(n), np.float64) / gen_hadamard(n)[0, 0]
                                    * float(hadamard_scale(n))).T
    # the scaling rounds once per value, each of the log2(n) butterfly levels
    # once more: |error| <= (1 + log2 n) * u * sum |x| * scale
    u = 2.0 ** -24
    bound = (1 + np.log2(n)) * u * (np.abs(x).astype(np.float64).sum(axis=1, keepdims=True)
                                    * float(hadamard_scale(n))) * 1.01
    assert (np.abs(y - exact) <= bound).all()
    # self-inverse up to rounding
    assert np.allclose(fwht(y, n), x, atol=1e-5 * np.abs(x).max())


def test_fwht_scales_first_then_butterflies():
    # the fast path's order: each value times 1/sqrt(n) first, then u + v
    # and u - v per level; on values whose sums round, the dense product
    # (sum of products, then one result) gives other bits
    x = np.array([1.0, 2.0 ** -24, 2.0 ** -24, 2.0 ** -24], np.float32)
    y = fwht(x, 4)
    s = np.float32(0.5)
    a = [np.float32(v * s) for v in x]
    l1 = [a[0] + a[1], a[0] - a[1], a[2] + a[3], a[2] - a[3]]
    l1 = [np.float32(v) for v in l1]
    want = np.array([l1[0] + l1[2], l1[1] + l1[3], l1[0] - l1[2], l1[1] - l1[3]], np.float32)
    assert np.array_equal(f32_bits(y), f32_bits(want))
    # the first level rounds 0.5 + 2^-25 to 0.5 (a tie, to even), so the
    # result is 0.5 + 2^-24, where the exact 0.5 + 1.5 * 2^-24 rounds to
    # 0.5 + 2^-23
    assert y[0] == np.float32(0.5 + 2.0 ** -24)
    assert np.float32(0.5 + 1.5 * 2.0 ** -24) == np.float32(0.5 + 2.0 ** -23)


def test_fwht_cost_is_n_log_n(monkeypatch):
    # the fast path never builds the matrix ...
    import strata_ref.cpu.hadamard as had
    monkeypatch.setattr(had, "gen_hadamard", lambda n: pytest.fail("fwht built the matrix"))
    import time

    def best(n):
        x = np.random.default_rng(0).standard_normal((2 ** 20 // n, n)).astype(np.float32)
        fwht(x[:1], n)
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fwht(x, n)
            ts.append(time.perf_counter() - t0)
        return min(ts)
    # ... and its time per value grows with log2(n) (64 -> 1024: 6 -> 10
    # butterfly levels), where a dense product's would grow with n (16x)
    assert best(1024) < 5 * best(64)


def test_mul_mat_hadamard_rows_are_the_innermost_axis():
    x = np.arange(2 * 3 * 128, dtype=np.float32).reshape(2, 3, 128)
    y = mul_mat_hadamard(x, 64)
    assert y.shape == x.shape
    assert np.array_equal(y.reshape(-1, 64), fwht(x.reshape(-1, 64), 64))


# ------------------------------------------------------------ the rules
@pytest.mark.parametrize("hd, tk, tv, want", [
    (64, "q8_0", "q8_0", (64, 64)), (64, "f16", "f16", (0, 0)), (64, "q4_0", "f16", (64, 0)),
    (64, "bf16", "iq4_nl", (0, 64)), (128, "q5_1", "q5_0", (128, 64)),
    (256, "q8_0", "q8_0", (256, 64)), (192, "q4_1", "q4_1", (64, 64)),
    (96, "q8_0", "q8_0", (0, 0)), (32, "q8_0", "q8_0", (0, 0)), (64, "f32", "bf16", (0, 0)),
])
def test_rotation_sizes_follow_llama_kv_cache(hd, tk, tv, want):
    assert rotation_sizes(hd, hd, tk, tv) == want
    assert rotation_sizes(hd, hd, tk, tv, disabled=True) == (0, 0)


@pytest.mark.parametrize("value, off", [("1", True), ("0", False), ("", False), ("abc", False),
                                        (" 2x", True), ("-1", True), ("+0", False), (None, False)])
def test_rotation_env_is_read_as_atoi(value, off):
    env = {} if value is None else {"LLAMA_ATTN_ROT_DISABLE": value}
    assert rotation_disabled(env) is off


def test_cache_rotation_env(monkeypatch):
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    c = KVCache(1, 1, 64, 8, "q8_0", "q8_0")
    assert (c.rot_k, c.rot_v) == (0, 0)
    c = KVCache(1, 1, 64, 8, "q8_0", "q8_0", rotate=True)
    assert (c.rot_k, c.rot_v) == (64, 64)
    monkeypatch.delenv("LLAMA_ATTN_ROT_DISABLE")
    assert KVCache(1, 1, 64, 8, "q8_0", "q8_0").rot_k == 64


def test_flash_attn_resolution():
    assert resolve_flash_attn(None, "f16") is False          # llama-cpp-python's default
    assert resolve_flash_attn(None, "q4_0") is True          # required for a block-type V
    assert resolve_flash_attn("auto", "f16") is True         # llama.cpp's auto on the CPU
    assert resolve_flash_attn("on", "f16") is True and resolve_flash_attn(False, "bf16") is False
    with pytest.raises(ValueError, match="requires flash attention"):
        resolve_flash_attn("off", "q8_0")
    with pytest.raises(ValueError, match="on, off or auto"):
        resolve_flash_attn("yes", "f16")


def test_cache_types_and_errors():
    assert set(CACHE_TYPES) == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}
    assert cache_type("Q8_0") == T.Q8_0 and cache_type(T.BF16) == T.BF16 and cache_type(20) == T.IQ4_NL
    for bad in ("q4_k", "f64", 12, None, "x"):
        with pytest.raises(ValueError, match="is not a KV cache type"):
            cache_type(bad)
    with pytest.raises(ValueError, match="does not divide head_dim 48"):
        KVCache(1, 1, 48, 8, "q8_0", "f16")
    with pytest.raises(ValueError, match="fa_threads"):
        KVCache(1, 1, 64, 8, flash_attn=True, fa_threads=0)
    # fa_threads sets flash attention's split only: refused without it
    # (once silently unused), named with the flash_attn it met
    for fa in (False, "off"):
        with pytest.raises(ValueError, match=f"fa_threads 4 needs flash attention, but flash_attn="
                                             f"{fa!r} turns flash attention off: pass flash_attn=True"):
            KVCache(1, 1, 64, 8, flash_attn=fa, fa_threads=4)
    with pytest.raises(ValueError, match="fa_threads 4 needs flash attention, but flash attention is "
                                         "off by default: pass flash_attn=True"):
        KVCache(1, 1, 64, 8, fa_threads=4)
    # at most ggml's GGML_MAX_N_THREADS (512): a larger count once ran
    # until flash attention's split allocated a chunk per thread
    for bad in (513, 10**30, -1):
        with pytest.raises(ValueError, match=r"fa_threads must be a whole number in 1 \.\. 512 "):
            KVCache(1, 1, 64, 8, flash_attn=True, fa_threads=bad)
    assert KVCache(1, 1, 64, 8, flash_attn=True, fa_threads=512).fa_threads == 512
    assert KVCache(1, 1, 64, 8, flash_attn=True, fa_threads=4).fa_threads == 4
    assert KVCache(1, 1, 64, 8, "f16", "q8_0", fa_threads=3).fa_threads == 3     # on: its V's default
    assert KVCache(1, 1, 64, 8).fa_threads == 2
    with pytest.raises(ValueError, match="n_ctx must be positive"):
        KVCache(1, 1, 64, 0)


def test_kv_length_is_llama_cpp_n_kv():
    assert [kv_length(n) for n in (1, 37, 256, 257, 511, 512, 513)] == [256, 256, 256, 512, 512, 512, 768]


def test_fa_path_is_ggml_choice():
    assert fa_path(T.F16, T.F16, 1, 256) == "vec"
    assert fa_path(T.F16, T.F16, 1, 512) == "split"
    assert fa_path(T.F16, T.F16, 63, 512) == "vec"
    assert fa_path(T.F16, T.F16, 64, 256) == "tiled"
    assert fa_path(T.Q8_0, T.Q8_0, 1, 1024) == "vec"
    assert fa_path(T.Q8_0, T.Q8_0, 100, 256) == "vec"
    assert fa_path(T.F16, T.Q4_0, 100, 256) == "vec"
    assert fa_path(T.BF16, T.BF16, 100, 512) == "vec"


@pytest.mark.parametrize("t", sorted(CACHE_TYPES))
def test_bytes_needed_is_what_is_allocated(t):
    c = KVCache(2, 3, 64, 16, t, t if t in ("f16", "f32", "bf16") else "f16")
    assert KVCache.bytes_needed(2, 3, 64, 16, c.type_k.name.lower(), c.type_v.name.lower()) == \
        c.k.nbytes + c.v.nbytes


@pytest.mark.parametrize("profile", PROFILES)
def test_store_uses_the_builds_from_float(profile):
    from strata_ref import quantize
    from strata_ref.cpu.act_quant import quantize_q8_0_act
    prof = cpu.select(profile)
    rng = np.random.default_rng(5)
    k = rng.standard_normal((3, 2, 64)).astype(np.float32)
    k[1, 0, :32] = np.arange(32, dtype=np.float32) - 15.5       # ties of x * 127 / amax
    for t in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"):
        c = KVCache(1, 2, 64, 4, t, "f16")
        c.store(0, k, k, prof)
        for h in range(2):
            for m in range(3):
                want = (quantize_q8_0_act(k[m, h], isa=prof.isa).reshape(-1)
                        if t == "q8_0" else quantize(k[m, h], t))
                assert np.array_equal(c.k[0, h, m], want), (t, h, m)
    c = KVCache(1, 2, 64, 4, "bf16", "f32")
    c.store(0, k, k, prof)
    from strata_ref.numerics import f32_to_bf16_bits
    assert np.array_equal(c.k[0, :, :3], f32_to_bf16_bits(k.transpose(1, 0, 2)).reshape(2, 3, 64))
    assert np.array_equal(c.v[0, :, :3], k.transpose(1, 0, 2))


def test_store_refuses_non_finite_for_block_types():
    c = KVCache(1, 1, 64, 4, "q4_0", "f16")
    k = np.zeros((1, 1, 64), np.float32)
    k[0, 0, 3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        c.store(0, k, np.zeros_like(k), cpu.select("avx2"))


# ------------------------------------------------- orders pinned by hand
def _fa_inputs(n, H, Hkv, D, T_, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    k = rng.standard_normal((Hkv, T_, D)).astype(np.float16)
    v = rng.standard_normal((Hkv, T_, D)).astype(np.float16)
    return q, k, v


def test_fa_vec_accumulates_an_f16_v_in_f16():
    # ggml_vec_mad_f16: the accumulator is rounded to F16 after every key,
    # unlike a float32 accumulator of the same products
    prof = cpu.select("avx2")
    q, k, v = _fa_inputs(1, 1, 1, 64, 40)
    out16 = flash_attn_ext(q, T.F16, k, T.F16, v, 40, 256, np.array([39]), 0.125, prof)
    # the same scores and V through the float32 accumulator (ggml_vec_mad_f32)
    vf = v.astype(np.float32)
    from strata_ref.cpu.flash_attn import _vec_rows
    from strata_ref.cpu.attention import cache_dots
    s = cache_dots(T.F16, k[0], 64, q[0], prof, "vec_dot").reshape(1, 1, 40)
    out32 = np.empty((1, 1, 64), np.float32)
    d = np.empty((1, 1), np.float32)
    _vec_rows(s, vf, False, 0, np.float32(0.125), np.array([39]), 0, 0, 40, True, True, True, out32, d, d,
              False, np.zeros(1, np.float32))
    assert not np.array_equal(f32_bits(out16), f32_bits(out32.reshape(1, -1)))
    assert np.allclose(out16, out32.reshape(1, -1), atol=2e-3)


def test_fa_fma_only_on_fma_builds():
    q, k, v = _fa_inputs(2, 2, 1, 64, 30, seed=3)
    import sys
    import types
    from strata_ref.cpu.isa import chain
    prof = cpu.select("avx2")
    # the avx2 build with GCC's contraction off: a one-name module ahead of
    # its chain (the fallback rule takes everything else from avx2)
    mod = types.ModuleType("strata_ref.cpu.isa.nofma_for_test")
    mod.FMA = False
    sys.modules[mod.__name__] = mod
    nofma = dataclasses.replace(prof, isa=chain(("nofma_for_test",) + prof.isa.names))
    assert prof.fma and not nofma.fma
    a = flash_attn_ext(q, T.F16, k, T.F16, v, 30, 256, np.array([28, 29]), 0.125, prof)
    b = flash_attn_ext(q, T.F16, k, T.F16, v, 30, 256, np.array([28, 29]), 0.125, nofma)
    assert not np.array_equal(f32_bits(a), f32_bits(b))


def test_fa_tiled_rows_do_not_depend_on_their_neighbours():
    # the tiled path is computed per query row; the rows of a 70-token pass
    # equal those of the same rows in a 64-token pass (both tiled)
    prof = cpu.select("avx512")
    q, k, v = _fa_inputs(70, 2, 1, 64, 70, seed=4)
    pos = np.arange(70)
    a = flash_attn_ext(q, T.F16, k, T.F16, v, 70, 256, pos, 0.125, prof)
    b = flash_attn_ext(q[6:], T.F16, k, T.F16, v, 70, 256, pos[6:], 0.125, prof)
    assert np.array_equal(f32_bits(a[6:]), f32_bits(b))
    # and differ from the vec path, which rounds q to F16 and sums in F16
    c = flash_attn_ext(q[:10], T.F16, k, T.F16, v, 70, 256, pos[:10], 0.125, prof)
    assert not np.array_equal(f32_bits(a[:10]), f32_bits(c))


def test_fa_split_depends_on_the_thread_count():
    prof = cpu.select("avx512")
    q, k, v = _fa_inputs(1, 2, 1, 64, 400, seed=6)
    outs = [flash_attn_ext(q, T.F16, k, T.F16, v, 400, 512, np.array([399]), 0.125, prof,
                           n_threads=nt) for nt in (1, 2, 4)]
    assert not np.array_equal(f32_bits(outs[0]), f32_bits(outs[1]))
    # F16 accumulators: the chunks agree to F16 rounding
    assert np.allclose(outs[0], outs[1], atol=5e-3) and np.allclose(outs[1], outs[2], atol=5e-3)
    # one thread is the vec path over all cells
    vec = flash_attn_ext(q, T.F16, k, T.F16, v, 400, 256, np.array([399]), 0.125, prof)
    assert np.array_equal(f32_bits(outs[0]), f32_bits(vec))


def test_f32_cache_is_cast_to_f16_for_flash_attention():
    prof = cpu.select("avx2")
    q, k, v = _fa_inputs(3, 2, 1, 64, 12, seed=7)
    k32 = (k.astype(np.float32) + np.float32(1e-4)).astype(np.float32)
    a = flash_attn_ext(q, T.F32, k32, T.F32, v.astype(np.float32), 12, 256, np.arange(9, 12), 0.125, prof)
    b = flash_attn_ext(q, T.F16, k32.astype(np.float16), T.F16, v, 12, 256, np.arange(9, 12), 0.125, prof)
    assert np.array_equal(f32_bits(a), f32_bits(b))


@pytest.mark.parametrize("profile", PROFILES)
def test_generic_attention_equals_the_f16_kernel(profile):
    # cpu.attention runs the F16 / F16 case through QMatrix as ggml's mat-mul
    # does; f16_attention.attention is its one-call kernel: the same bits
    from strata_ref.cpu import f16_attention
    from strata_ref.cpu.attention import attention_mm
    prof = cpu.select(profile)
    for n, T_ in ((1, 37), (5, 37), (12, 12)):
        q, k, v = _fa_inputs(n, 6, 2, 64, T_, seed=n)
        pos = np.arange(T_ - n, T_)
        a = f16_attention.attention(q, k.view(np.uint16), v.view(np.uint16), T_, pos, 0.125, prof)
        b = attention_mm(q, T.F16, k, T.F16, v, T_, kv_length(T_), pos, 0.125, prof)
        assert np.array_equal(f32_bits(a), f32_bits(b)), (profile, n)


@pytest.mark.parametrize("profile", PROFILES)
def test_f16_attention_kernel_edges(profile):
    # the vectorized kernel (cpu.f16_attention) against the generic mat-mul
    # path on what its loops split: head_dim not a multiple of 8 (24, 12:
    # the per-column tail) or of 64, the tinyBLAS and vec orders (1 and 2+
    # tokens), sinks, a sliding window, and stale cells past T (NaN bits),
    # which must not be read
    from strata_ref.cpu import f16_attention
    from strata_ref.cpu.attention import attention_mm
    prof = cpu.select(profile)
    rng = np.random.default_rng(11)
    for n, H, Hkv, hd, T_ in ((1, 4, 2, 24, 70), (3, 4, 2, 24, 70), (1, 2, 1, 12, 130), (2, 6, 3, 32, 9),
                              (1, 2, 1, 256, 5)):
        q, k, v = _fa_inputs(n, H, Hkv, hd, T_ + 3, seed=hd + n)
        k, v = k.copy(), v.copy()
        k[:, T_:] = np.float16(np.nan)
        v[:, T_:] = np.float16(np.inf)
        sinks = rng.standard_normal(H).astype(np.float32)
        pos = np.arange(T_ - n, T_)
        for n_swa, sk in ((0, None), (7, sinks)):
            a = f16_attention.attention(q, k.view(np.uint16), v.view(np.uint16), T_, pos, 0.125, prof, n_swa,
                                        sinks=sk)
            b = attention_mm(q, T.F16, k[:, :T_], T.F16, v[:, :T_], T_, kv_length(T_), pos, 0.125, prof,
                             n_swa, sk)
            assert np.isfinite(a).all()
            assert np.array_equal(f32_bits(a), f32_bits(b)), (profile, n, hd, T_, n_swa)


# ------------------------------------------------- llama.cpp, op by op
def _attn_cases():
    out = []
    for name in ("smollm2-q8_0-q8_0-fa", "smollm2-bf16-bf16-fa", "smollm2-f16-q4_1-fa",
                 "smollm2-q5_1-q5_1-fa", "smollm2-f16-f16-fa-long", "gemma3-q8_0-q8_0-fa"):
        for p in profile_files(f"llama_attn_{name}.npz"):
            out.append(pytest.param(*p.values, id=f"{name}-{p.values[0]}"))
    return out


def _cells(raw: np.ndarray, t) -> np.ndarray:
    """A dumped cache view's rows (n_kv, row bytes) as KVCache stores one
    KV head: (1, n_kv, w)."""
    if t == T.F16:
        return raw.view(np.float16)[None]
    if t == T.BF16:
        return raw.view(np.uint16)[None]
    if t == T.F32:
        return raw.view(np.float32)[None]
    return raw[None]


@pytest.mark.parametrize("profile, path", _attn_cases())
def test_attention_ops_are_llama_cpp_bits(profile, path):
    d = np.load(path)
    assert str(d["profile"]) == profile
    prof = cpu.select(profile)
    tk, tv = T(int(d["type_k"])), T(int(d["type_v"]))
    for n in (64, 128, 256):
        if f"rot_{n}" in d.files:
            assert np.array_equal(f32_bits(gen_hadamard(n)), f32_bits(d[f"rot_{n}"])), n
    prefixes = ["b_"] + [f"d{c}_" for c in d["calls"]]
    n_rot = 0
    for p in prefixes:
        for w in ("Qcur", "Kcur", "Vcur", "kqv_out"):
            if f"{p}rot_{w}_in" in d.files:
                x = d[f"{p}rot_{w}_in"]
                assert np.array_equal(f32_bits(fwht(x, x.shape[-1])), f32_bits(d[f"{p}rot_{w}_out"])), (p, w)
                n_rot += 1
        q = d[p + "fa_q"].transpose(1, 0, 2)
        mask = d[p + "fa_mask"]
        vis = np.isfinite(mask)
        pos = np.array([np.flatnonzero(r).max() for r in vis])
        T_ = int(pos.max()) + 1
        out = flash_attn_ext(q, tk, _cells(d[p + "fa_k"], tk), tv, _cells(d[p + "fa_v"], tv), T_,
                             mask.shape[1], pos, float(d[p + "fa_scale"]), prof)
        want = d[p + "fa_out"].reshape(out.shape)
        bad = int((f32_bits(out) != f32_bits(want)).sum())
        assert bad == 0, f"{p}: {bad} of {out.size} values differ (max {np.abs(out - want).max():.3g})"
    assert n_rot == 0 or n_rot >= 4


# ---------------------------------------------- llama.cpp, whole models
@functools.lru_cache(maxsize=None)
def _kv_ref(path):
    return np.load(path)


#: configurations checked in the default run (the rest are marked slow):
#: on SmolLM2 every configuration of the avx512 and scalar data, and the
#: short ones of avx2; on Qwen and Gemma one flash-attention block type
_FAST = {
    "SmolLM2-135M-Instruct": None,
    "Qwen2.5-Coder-0.5B-Instruct": ("q8_0-q8_0-fa",),
    "gemma-3-270m": ("q8_0-q8_0-fa", "q4_0-f16"),
}


def _kv_cases():
    out = []
    for stem in KV_MODELS:
        for p in profile_files(f"llama_kv_{stem}.npz"):
            prof, path = p.values
            ref = _kv_ref(path)
            for name in ref["configs"]:
                name = str(name)
                fast = _FAST[stem]
                slow = (fast is not None and name not in fast) or (
                    fast is None and prof == "avx2" and str(ref[f"{name}:prompt"]) == "long")
                out.append(pytest.param(stem, prof, path, name, id=f"{stem}-{prof}-{name}",
                                        marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize("stem, profile, path, name", _kv_cases())
def test_kv_cache_logits_are_llama_cpp_bits(stem, profile, path, name):
    ref = _kv_ref(path)
    assert str(ref["profile"]) == profile
    # every row, the top logits' bits, and our greedy continuation is llama.cpp's
    check_kv_config(load_model(stem, profile), ref, name)


def test_flash_attention_defaults_to_the_profiles_llama_cpp(tmp_path):
    # llama-cpp-python 0.3.36: off; llama.cpp v0.4.0: `auto`, which is on when every layer is on the
    # CPU (docs/prebuilt.md "Defaults of v0.4.0")
    from infer_helpers import tiny_model
    from strata_ref.infer import load
    path = tmp_path / "tiny_qwen3.gguf"
    tiny_model("qwen3", path, seed=0)
    for name, p in cpu.PROFILES.items():
        m = load(str(path), cpu=name)
        v040 = p.version == cpu.profiles.V0_4_0
        assert m.new_cache(16).flash_attn == v040, name
        assert m.new_cache(16, flash_attn="off").flash_attn is False, name
    # the speed line names a cache that is not the profile's default, and
    # on a v0.4.0 profile either setting (off is not its default)
    from strata_ref.cli.inference import cache_note
    assert cache_note(load(str(path), cpu="avx2")) == ""
    assert cache_note(load(str(path), cpu="avx2", flash_attn="on")).endswith("flash attention on")
    assert cache_note(load(str(path), cpu="v0.4.0-haswell")).endswith("flash attention on")
    assert cache_note(load(str(path), cpu="v0.4.0-haswell", flash_attn="off")).endswith("flash attention off")


def test_every_profile_has_kv_reference_data():
    for p in PROFILES:
        assert (DATA / p / "llama_kv_SmolLM2-135M-Instruct.npz").is_file(), p


def _attention_args(cells=10, n_head=4, n_kv=2, hd=32, n=2):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((n, n_head, hd)).astype(np.float32)
    kv = rng.standard_normal((n_kv, cells, hd)).astype(np.float16).view(np.uint16)
    return q, kv, kv.copy()


@pytest.mark.parametrize("bad, msg", [
    (dict(T=11), "T = 11 is outside 1 .. 10"),
    (dict(T=10 ** 7, pos=[10 ** 7 - 2, 10 ** 7 - 1]), "outside 1 .. 10"),
    (dict(T=0), "outside 1 .. 10"),
    (dict(pos=[4, 5]), "pos must be 2 positions in 0 .. 4"),
    (dict(pos=[-1, 0]), "pos must be"),
    (dict(pos=[0]), "pos must be"),
    (dict(n_swa=-1), "n_swa must be >= 0"),
    (dict(heads=3), "n_head 3 is not a multiple of n_head_kv 2"),
    (dict(hd_kv=64), "head_dim 64 / 64 is not q's 32"),
    (dict(f16=True), "kbits must be uint16"),
])
def test_attention_refuses_inputs_that_would_read_outside_the_cache(bad, msg):
    # these used to read past the cache (a segfault for a huge T) or return
    # NaNs silently
    from strata_ref.cpu.f16_attention import attention
    q, kb, vb = _attention_args(n_head=bad.get("heads", 4), hd=32)
    if "hd_kv" in bad:
        _, kb, vb = _attention_args(hd=bad["hd_kv"])
    if bad.get("f16"):
        kb = kb.view(np.float16)
    T_, pos = bad.get("T", 5), bad.get("pos", [3, 4])
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        attention(q, kb, vb, T_, np.asarray(pos), 0.125, cpu.select("avx2"), bad.get("n_swa", 0))


@pytest.mark.parametrize("fn", ["attention_mm", "flash_attn_ext"])
def test_typed_cache_attention_refuses_a_length_past_the_cells(fn):
    from strata_ref.cpu import attention as att
    q, kb, vb = _attention_args()
    k16, v16 = kb.view(np.float16), vb.view(np.float16)
    f = att.attention_mm if fn == "attention_mm" else flash_attn_ext
    with pytest.raises(ValueError, match="outside 1 .. 10"):
        f(q, T.F16, k16, T.F16, v16, 12, 256, np.array([10, 11]), 0.125, cpu.select("avx2"))
    if fn == "attention_mm":        # its V p runs over n_kv cells (flash: n_kv picks the path)
        with pytest.raises(ValueError, match="n_kv = 4 is below T = 5"):
            f(q, T.F16, k16, T.F16, v16, 5, 4, np.array([3, 4]), 0.125, cpu.select("avx2"))
    if fn == "attention_mm":
        # the valid call still runs, and without flash attention it is the
        # F16 kernel's arithmetic, bit for bit (flash attention's own bits:
        # the fa tests above and the stored llama.cpp references)
        out = f(q, T.F16, k16, T.F16, v16, 5, 256, np.array([3, 4]), 0.125, cpu.select("avx2"))
        from strata_ref.cpu.f16_attention import attention
        want = attention(q, kb, vb, 5, np.array([3, 4]), 0.125, cpu.select("avx2"))
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_fa_split_takes_the_sink_as_the_first_chunks_maximum():
    # ggml_compute_forward_flash_attn_ext_f16_one_chunk: a sink above the
    # first chunk's maximum rescales that chunk's accumulator and S and
    # becomes its M, which ggml_flash_attn_ext_reduce_partials weighs the
    # chunk by. Scores 4 in chunk 0 (V = +1), 5 in chunk 1 (V = -1), sink
    # 4.5: the result is the exact softmax attention, (300 e^-1 - 300) /
    # (300 e^-1 + 300 + e^-0.5) = -0.461, up to the F16 accumulators (taking
    # chunk 0's M as 4 would give -0.635)
    prof = cpu.select("avx2")
    D, T_ = 64, 600
    q = np.zeros((1, 1, D), np.float32)
    q[0, 0, 0] = 1.0
    k = np.zeros((1, T_, D), np.float16)
    k[0, :300, 0], k[0, 300:, 0] = 4.0, 5.0
    v = np.ones((1, T_, D), np.float16)
    v[0, 300:] = -1.0
    assert fa_path(T.F16, T.F16, 1, T_) == "split"
    got = flash_attn_ext(q, T.F16, k, T.F16, v, T_, T_, np.array([T_ - 1]), 1.0, prof, n_threads=2,
                         sinks=np.array([4.5], np.float32))
    e = np.exp(-1.0)
    want = (300 * e - 300) / (300 * e + 300 + np.exp(-0.5))
    assert np.abs(got - want).max() < 2e-3, (got[0, :4], want)
