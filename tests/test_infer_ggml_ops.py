"""ggml-cpu's float arithmetic as reproduced by strata_ref.cpu (fp, lanes,
ops, the mat-mul kernels), checked bit for bit: by hand where the order of
operations decides the result, and against llama.cpp's own intermediate
tensors (tests/data/<profile>/llama_ops_*.npz, made by
tools/llama_dump.py --vectors from llama-cpp-python 0.3.36 built for that
CPU profile): for rows 0 and n-1 of a batched pass of 37 tokens (tinyBLAS,
tiled and repacked-gemm code paths) and for one single-token decode call
(vec_dot paths)."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

from strata_ref.cpu import PROFILES, ops
from strata_ref.cpu.fp import fma32, hsum8, hsum16
from strata_ref.cpu.isa import x86_avx512
from strata_ref.cpu.simd import f8_load, f8_store
from strata_ref.numerics import fma_f32
from infer_helpers import DATA, f32_bits, load_model, profile_files

F32 = np.float32


def _same(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape, (a.shape, b.shape)
    bad = np.flatnonzero(f32_bits(a) != f32_bits(b))
    assert bad.size == 0, f"{bad.size} of {a.size} values differ, first at {bad[0]}: " \
                          f"{a.reshape(-1)[bad[0]]!r} vs {b.reshape(-1)[bad[0]]!r}"


@njit(cache=True)
def _fma_many(a, b, c, out):
    for i in range(a.size):
        out[i] = fma32(a[i], b[i], c[i])


@njit(cache=True)
def _hsums(v8, v16):
    return hsum8(v8), hsum16(v16)


@njit(cache=True)
def _exp_many(x, out):
    for i in range(x.size):
        out[i] = x86_avx512.expf_v(x[i])


@njit(cache=True)
def _exp_v_many(x, isa, out):
    for i in range(x.size):
        out[i] = isa.expf_v(x[i])


#: the three x86 builds' instruction-set chains (SSE2, AVX2, AVX-512 exp)
_ISAS = {p: PROFILES[p].isa for p in ("scalar", "avx2", "avx512")}


# ---------------------------------------------------------------- by hand
def test_fma32_rounds_once():
    a = F32(1 + 2.0 ** -12)
    c = F32(-(1 + 2.0 ** -11))
    out = np.empty(1, np.float32)
    _fma_many(np.array([a]), np.array([a]), np.array([c]), out)
    # a*a = 1 + 2^-11 + 2^-24 exactly; rounded first it ties to 1 + 2^-11
    assert out[0] == F32(2.0 ** -24) and F32(a * a) + c == 0.0
    rng = np.random.default_rng(7)
    x = [rng.standard_normal(20000).astype(np.float32) * F32(s) for s in (1, 1e3, 1e-3)]
    out = np.empty(20000, np.float32)
    _fma_many(x[0], x[1], x[2], out)
    _same(out, fma_f32(x[0], x[1], x[2]))          # numerics' independent float64 version


def test_lane_reductions_follow_ggml_trees():
    big = F32(2.0 ** 24)
    # hsum_float_8: (v[4+i] + v[i]) then (s0 + s2) + (s1 + s3): the two 2^24
    # cancel first, so the ones survive (a left-to-right sum gives 3)
    v8 = np.array([big, 1, 1, 1, -big, 1, 1, 1], np.float32)
    # _mm512_reduce_add_ps: v[8+i] + v[i], then 4, 2 and 1 lanes the same way
    v16 = np.zeros(16, np.float32)
    v16[0], v16[8], v16[1:8] = big, -big, 1
    h8, h16 = _hsums(v8, v16)
    assert h8 == F32(6.0) and h16 == F32(7.0)
    seq = F32(0)
    for v in v8:
        seq = F32(seq + v)
    assert seq != h8


def test_expf_edges():
    x = np.array([0.0, -np.inf, -104.0, 1.0, -1.0, 88.0], np.float32)
    out = np.empty_like(x)
    _exp_many(x, out)
    assert out[0] == 1.0 and out[1] == 0.0 and out[2] == 0.0
    # the polynomial is within 2 ulp of expf on ordinary arguments
    assert np.all(np.abs(out[3:] / np.exp(x[3:].astype(np.float64)) - 1) < 2.5e-7)


@pytest.mark.parametrize("arch", list(_ISAS))
def test_expf_variants_edges(arch):
    # every build's ggml_v_expf: exact at 0, flushes at the ends, within 2
    # ulp of exp elsewhere, including the two-step scaling for |n| > 126
    x = np.array([0.0, -np.inf, -104.0, -120.0, 1.0, -1.0, 88.0, 88.7, -87.5, -100.0,
                  np.inf], np.float32)
    out = np.empty_like(x)
    _exp_v_many(x, _ISAS[arch], out)
    assert out[0] == 1.0 and out[1] == 0.0 and out[2] == 0.0 and out[3] == 0.0
    assert out[-1] == np.inf
    ref = np.exp(x[4:-2].astype(np.float64))
    assert np.all(np.abs(out[4:-2] / ref - 1) < 2.5e-7), out[4:-2] / ref - 1
    # exp(-100) is subnormal: within a few of its ulps (2^-149)
    assert abs(float(out[-2]) - np.exp(-100.0)) < 4 * 2.0 ** -149


@njit(cache=True)
def _exp8_many(x, isa, which, out):
    for i in range(0, x.size, 8):
        v = f8_load(x, i)
        f8_store(out, i, isa.expf8(v) if which == 0 else isa.silu8(v))


@njit(cache=True)
def _silu_v_many(x, isa, out):
    for i in range(x.size):
        out[i] = isa.silu_v(x[i])


@pytest.mark.parametrize("arch", list(_ISAS))
def test_vector_expf_and_silu_equal_the_lane_functions(arch):
    # each build's expf8 / silu8 compute 8 lanes at once with masks where the scalar
    # functions branch (and scalef as two exact scalings): the same bits on
    # every float32 exponent (random bit patterns), around the branch
    # points (|n| = 126, 192: x near +-87.3, +-133) and at the specials
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        rng.uniform(-140, 140, 100_000).astype(np.float32),
                        rng.uniform(-90, 90, 100_000).astype(np.float32),
                        np.array([0, -0.0, np.inf, -np.inf, 88.72, 88.73, -87.33, -87.34, -103.97, 133.0,
                                  -133.1, -88.0, 1e-40, -1e-40, 126 * 0.6931, -126 * 0.6931], np.float32)])
    x = np.ascontiguousarray(x[:x.size // 8 * 8])
    for which, scalar in ((0, _exp_v_many), (1, _silu_v_many)):
        a = np.empty_like(x)
        b = np.empty_like(x)
        _exp8_many(x, _ISAS[arch], which, a)
        scalar(x, _ISAS[arch], b)
        nan = np.isnan(b)
        assert np.array_equal(np.isnan(a), nan)
        _same(a[~nan], b[~nan])


def test_expf_avx2_differs_from_avx512_somewhere():
    # the builds' polynomials apply 2^n differently (exponent bits and an
    # FMA against _mm512_scalef_ps), so some results differ in the last bit:
    # one profile's expf cannot stand in for another's
    x = np.linspace(-20, 20, 20001).astype(np.float32)
    outs = []
    for isa in _ISAS.values():
        o = np.empty_like(x)
        _exp_v_many(x, isa, o)
        outs.append(o.view(np.uint32))
    assert (outs[1] != outs[2]).any() and (outs[0] != outs[1]).any()


def test_rope_angles_use_libm_cosf():
    import ctypes
    import ctypes.util
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.cosf.restype = libm.sinf.restype = ctypes.c_float
    libm.cosf.argtypes = libm.sinf.argtypes = [ctypes.c_float]
    libm.powf.restype = ctypes.c_float
    libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
    cos, sin = ops.rope_cache(np.array([3, 1000]), 64, 1e6, 1.0)
    ts = F32(libm.powf(1e6, F32(-2.0) / F32(64)))
    for r, p in enumerate((3, 1000)):
        theta = F32(p)
        for i in range(32):
            assert cos[r, i] == F32(libm.cosf(theta)) and sin[r, i] == F32(libm.sinf(theta))
            theta = F32(theta * ts)


def test_soft_max_masks_and_pads():
    s = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], np.float32)
    p = ops.soft_max(s, 1.0, np.array([0, 1]), PROFILES["avx2"])
    assert p.shape == (2, 64) and not p[:, 3:].any()
    assert p[0, 0] == 1.0 and p[0, 1] == 0.0 and p[0, 2] == 0.0   # only key 0 visible
    assert p[1, 2] == 0.0 and p[1, 0] < p[1, 1]


# ------------------------------------------------- against llama.cpp's tensors
CASES = {"qwen": ("Qwen2.5-Coder-0.5B-Instruct", "llama_ops_qwen.npz"),
         "smollm2": ("SmolLM2-135M-Instruct", "llama_ops_smollm2.npz")}
OPS = [pytest.param(key, *p.values, id=f"{key}-{p.values[0]}")
       for key, (_, f) in CASES.items() for p in profile_files(f)]


def _f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("key, profile, path", OPS)
@pytest.mark.parametrize("tag", ["b", "d"])
def test_attention_ops_match_llama_cpp(key, profile, path, tag):
    v = np.load(path)
    m = load_model(CASES[key][0], profile)
    prof = PROFILES[profile]
    hp = m.hp
    pos = v[f"{tag}_pos"].astype(np.int64)
    batched = int(v[f"{tag}_n"]) >= 2
    for il in v["layers"]:
        g = lambda name: v[f"{tag}_{il}_{name}"]
        cos, sin = ops.rope_cache(pos, hp.n_rot, hp.rope_base, hp.rope_freq_scale)
        _same(ops.rope(g("q_biased"), cos, sin, hp.n_rot, hp.neox, prof), g("q_rope"))
        q = g("q_attn")                                   # (G, rows, hd), query heads of KV head 0
        G, R, hd = q.shape
        K = g("k_cache").astype(np.float32)              # (T, hd)
        T = K.shape[0]
        kq = ops.f16_products(_f16(q).reshape(1, G * R, hd), K[None], batched, prof,
                              m_rows=256).reshape(G, R, T)
        _same(kq, g("kq")[..., :T])
        qpos = np.tile(pos, G)
        p = ops.soft_max(g("kq").reshape(G * R, -1)[:, :T], hp.kq_scale, qpos, prof).reshape(G, R, -1)
        _same(p[..., :T], g("kq_soft_max")[..., :T])
        assert not p[..., T:].any() and not g("kq_soft_max")[..., T:].any()
        Vt = g("v_cache").astype(np.float32)             # (hd, T)
        # V p over llama.cpp's padded KV length (256 cells, the unused ones
        # with probability 0)
        o = ops.f16_products(_f16(g("kq_soft_max")).reshape(1, G * R, -1), Vt[None], batched, prof,
                             m_rows=hd)
        _same(o.reshape(G, R, hd), g("kqv"))


@pytest.mark.parametrize("key, profile, path", OPS)
@pytest.mark.parametrize("tag", ["b", "d"])
def test_matmuls_and_swiglu_match_llama_cpp(key, profile, path, tag):
    v = np.load(path)
    m = load_model(CASES[key][0], profile)
    rows = v[f"{tag}_rows"]
    n = int(v[f"{tag}_n"])

    def batch(x):
        # the stored rows at their places in a batch of n (the code path of
        # a row depends on n and on its index); other rows repeat row 0
        full = np.repeat(x[:1], n, axis=0)
        full[rows] = x
        return full

    for il in v["layers"]:
        g = lambda name: v[f"{tag}_{il}_{name}"]
        L = m.layers[il]
        _same(L.attn.wq.matmul(batch(g("attn_norm")))[rows], g("q_mm"))
        _same(L.attn.wv.matmul(batch(g("attn_norm")))[rows], g("v_mm"))
        _same(L.ffn.w_down.matmul(batch(g("ffn_swiglu")))[rows], g("ffn_out"))
        _same(ops.swiglu(g("ffn_gate"), g("ffn_up"), PROFILES[profile]), g("ffn_swiglu"))


_PORTABLE = r"""
import sys, numpy as np
from strata_ref import GGMLType
from strata_ref.quantize import quantize
from strata_ref.cpu import simd
from strata_ref.cpu.matmul import QMatrix
rng = np.random.default_rng(5)
out = {"avx2": np.array(simd.HOST_AVX2), "vnni": np.array(simd.HOST_VNNI), "f16c": np.array(simd.HOST_F16C)}
for prof in ("scalar", "avx2", "avx512"):
  for t in ("Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):
    w = rng.standard_normal((16, 512)).astype(np.float32)
    q = QMatrix(GGMLType[t], quantize(w, GGMLType[t]), 16, 512, t, prof)
    q2 = QMatrix(GGMLType[t], quantize(w[:9], GGMLType[t]), 9, 512, t, prof)   # not repacked
    for n in (1, 9):
        x = rng.standard_normal((n, 512)).astype(np.float32)
        out[f"{prof}_{t}_{n}"] = q.matmul(x)
        out[f"{prof}_{t}_{n}_9rows"] = q2.matmul(x)
# the F16 attention (F16C conversions or the table ones)
from strata_ref.cpu import f16_attention, ops
from strata_ref.cpu import select as _sel
for prof in ("scalar", "avx2", "avx512"):
    for n, hd in ((1, 64), (3, 24)):
        q = rng.standard_normal((n, 4, hd)).astype(np.float32)
        kv = rng.standard_normal((2, 2, 40, hd)).astype(np.float16).view(np.uint16)
        out[f"{prof}_attn_{n}_{hd}"] = f16_attention.attention(q, kv[0], kv[1], 37, np.arange(37 - n, 37), 0.125, _sel(prof))
        out[f"{prof}_geglu_{n}_{hd}"] = ops.geglu(q, q * np.float32(0.5), _sel(prof))
np.savez(sys.argv[1], **out)
"""


@pytest.mark.slow
def test_portable_lanes_give_the_avx2_bits(tmp_path):
    # The integer lanes are exact either way; this runs the kernels with the
    # host's instructions (VNNI's vpdpbusd where the CPU has it), with
    # ggml's AVX2 maddubs / madd (no VNNI), with plain LLVM vector code and
    # with fp16 converted by tables instead of F16C.
    res = {}
    for mode in ("native", "novnni", "portable", "nof16c"):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / mode))
        if mode == "portable":
            env["STRATA_REF_PORTABLE_LANES"] = "1"
        if mode == "novnni":
            env["STRATA_REF_NO_VNNI"] = "1"
        if mode == "nof16c":
            env["STRATA_REF_NO_F16C"] = "1"
        out = tmp_path / f"{mode}.npz"
        subprocess.run([sys.executable, "-c", _PORTABLE, str(out)], check=True, env=env,
                       cwd=str(DATA.parent.parent))
        res[mode] = np.load(out)
    assert not bool(res["portable"]["avx2"]) and not bool(res["novnni"]["vnni"])
    assert not bool(res["nof16c"]["f16c"])
    for mode in ("novnni", "portable", "nof16c"):
        for k in res["native"].files:
            if k not in ("avx2", "vnni", "f16c"):
                _same(res[mode][k], res["native"][k])


MATRIX_TYPES = {
    # a Q4_0 matrix of 512 rows, which ggml repacks to q4_0_8x8 on AVX2 CPUs
    # (gemm for the 12-token pass, gemv for one token): layer 0's attn_q
    "llama_matrix_q4_0.npz": "Q4_0",
    # a Q4_K matrix of 259 rows, which ggml does not repack (tiled kernel for
    # the 12-token pass, vec_dot_q4_K_q8_K for one token): output.weight
    "llama_matrix_q4_k.npz": "Q4_K",
    # a Q5_K matrix of 512 rows (tiled kernel for 12 tokens,
    # vec_dot_q5_K_q8_K for one): layer 1's attn_q
    "llama_matrix_q5_k.npz": "Q5_K",
    # a Q3_K matrix of 512 rows (tiled / vec_dot_q3_K_q8_K): layer 0's attn_q
    "llama_matrix_q3_k.npz": "Q3_K",
    # Q2_K, which ggml repacks (q2_K_8x8) on AVX-512 CPUs when rows % 8 == 0:
    # layer 0's attn_q (gemm / gemv) and the 259-row output.weight (tiled /
    # vec_dot_q2_K_q8_K)
    "llama_matrix_q2_k.npz": "Q2_K",
    "llama_matrix_q2_k_output.npz": "Q2_K",
}


MATRICES = [pytest.param(name, *p.values, id=f"{name[13:-4]}-{p.values[0]}")
            for name in MATRIX_TYPES for p in profile_files(name)]


@pytest.mark.parametrize("name, profile, path", MATRICES)
def test_one_matrix_matches_llama_cpp(name, profile, path):
    # Matrices of 2-layer random qwen3 models (tests/infer_helpers.py
    # tiny_model with n_embd 512, head_dim 64, n_ff 1024 and Q4_0, Q4_K, Q5_K,
    # Q3_K or Q2_K matrices), stored with their llama.cpp inputs and outputs
    # (command in the file).
    from strata_ref import GGMLType
    from strata_ref.cpu.matmul import QMatrix
    v = np.load(path)
    t = GGMLType(int(v["w_type"]))
    assert t == GGMLType[MATRIX_TYPES[name]]
    w = QMatrix(t, v["w_raw"], int(v["w_rows"]), int(v["w_cols"]), name, profile)
    for tag in ("b", "d"):
        _same(w.matmul(v[f"{tag}_x"]), v[f"{tag}_y"])


@pytest.mark.parametrize("profile, width", [("avx512", 16), ("avx2", 8), ("scalar", 4)])
def test_swiglu_tail_uses_the_scalar_silu(profile, width):
    # ggml_vec_swiglu_f32 runs a vector of values at a time through
    # ggml_v_silu and the rest of a row through ggml_silu_f32 = x / (1 +
    # expf(-x)) (libm)
    import ctypes
    import ctypes.util
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.expf.restype = ctypes.c_float
    libm.expf.argtypes = [ctypes.c_float]
    rng = np.random.default_rng(11)
    prof = PROFILES[profile]
    n = 32 + width - 1
    g = (rng.standard_normal((2, n)) * 4).astype(np.float32)
    u = rng.standard_normal((2, n)).astype(np.float32)
    y = ops.swiglu(g, u, prof)
    _same(y[:, :32], ops.swiglu(g[:, :32], u[:, :32], prof))      # the vector part of each row
    for r in range(2):
        for i in range(32, n):
            x = g[r, i]
            want = F32(F32(x / F32(F32(1.0) + F32(libm.expf(-x)))) * u[r, i])
            assert y[r, i] == want


@pytest.mark.parametrize("profile, fused", [("avx2", False), ("armv8.0", True)])
def test_softcap_is_scale_tanhf_scale(profile, fused):
    # llama.cpp: ggml_scale(x, 1/c) (a float32 product), ggml_tanh (libm
    # tanhf per value: the build's glibc, tests/test_cpu_libm.py), ggml_scale(., c)
    from strata_ref.cpu.libm import tanhf_array
    x = (np.random.default_rng(12).standard_normal(5000) * 40).astype(np.float32)
    inv = F32(1.0) / F32(30.0)
    want = (tanhf_array((x * inv).astype(np.float32), fused) * F32(30.0)).astype(np.float32)
    _same(ops.softcap(x, 30.0, PROFILES[profile]), want)


@pytest.mark.parametrize("profile", ["scalar", "avx2", "avx512"])
def test_geglu_is_the_table_rule(profile):
    # ggml_vec_geglu_f32 with GGML_GELU_FP16: the literal +0.0 at or below
    # -10 (not multiplied by u, so never -0.0), g*u at or above 10, else the
    # table at fp16(g) (RNE) times u; restated with
    # numpy over the whole range, the thresholds, fp16 overflow and NaN
    from strata_ref import cpu
    from strata_ref.cpu import ops
    from strata_ref.numerics import f32_to_f16_bits
    prof = cpu.select(profile)
    rng = np.random.default_rng(4)
    g = np.concatenate([(rng.standard_normal(50_000) * 6).astype(np.float32),
                        np.array([np.nan, np.inf, -np.inf, -10, 10, 9.999, -9.999, 65519, 65520, 1e-8, -0.0, 5.0],
                                 np.float32)])
    u = rng.standard_normal(g.size).astype(np.float32)
    t = ops.gelu_table(prof)[f32_to_f16_bits(g)]
    act = np.where(g >= F32(10.0), g, t)
    ref = np.where(g <= F32(-10.0), F32(0.0), act * u).astype(np.float32)
    out = ops.geglu(g.reshape(4, -1), u.reshape(4, -1), prof).reshape(-1)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(out), nan)
    _same(out[~nan], ref[~nan])


@pytest.mark.parametrize("profile", ["scalar", "avx2", "avx512"])
def test_geglu_below_minus_ten_is_positive_zero(profile):
    # ggml_vec_geglu_f32 (vec.h, GGML_GELU_FP16): y = 0.0f for x <= -10,
    # not 0 * g (which is -0.0 for a negative g and NaN for an infinite one)
    g = np.array([-10.0, -11.0, -1e30, -10.0, -np.inf], np.float32)
    u = np.array([-2.0, -0.5, np.inf, 3.0, -1.0], np.float32)
    y = ops.geglu(g, u, PROFILES[profile])
    assert y.view(np.uint32).tolist() == [0] * 5
