"""The shape of strata_ref.cpu after ggml-cpu: instruction-set modules with
ggml's fallback rule, one table of per-type traits, ggml's mat-mul
dispatch stated once (docs/extending.md). The bits each profile computes
are the other tests' (every stored-data test runs every profile); these
check the declarations those tests rely on."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from strata_ref import GGMLType as T
from strata_ref.cpu import PROFILES, act_quant
from strata_ref.cpu.isa import CONSTANTS, FUNCTIONS, TABLES, chain, generic
from strata_ref.cpu.traits import TRAITS, family, kernel, mm_path, traits, vec_dot_type

CPU = Path(__file__).resolve().parents[1] / "strata_ref" / "cpu"


def test_generic_defines_the_whole_interface():
    # arch-fallback.h's rule needs a generic definition of every name
    for name in CONSTANTS + tuple(FUNCTIONS) + TABLES:
        assert name in vars(generic), name
    for p in PROFILES.values():
        for name in CONSTANTS + tuple(FUNCTIONS) + TABLES:
            p.isa.resolve(name)


def test_fallback_takes_the_first_module_that_defines_a_name():
    a5 = PROFILES["avx512"].isa
    assert a5.names == ("x86_avx512", "x86_avx2", "x86_64", "generic")
    # AVX-512 keeps the AVX2 activation quantizer and vec_dots ...
    assert a5.resolve("quantize_rows_q8") is act_quant.quantize_rows_q8_x86
    assert a5.lookup("VEC_DOT", T.Q4_K) == "x86"
    # ... and where x86 has no code, the generic one (Q2_0: arch-fallback.h)
    assert a5.lookup("VEC_DOT", T.Q2_0) == "generic"
    assert PROFILES["scalar"].isa.lookup("VEC_DOT", T.Q4_K) == "generic"
    assert PROFILES["scalar"].isa.resolve("quantize_rows_q8") is act_quant.quantize_rows_q8_ref
    # its own constants override the AVX2 ones; EXPF from SSE2 on the baseline
    three = [PROFILES[n] for n in ("scalar", "avx2", "avx512")]
    assert [p.isa.resolve("EXPF_LANES") for p in three] == [4, 8, 16]
    assert [p.isa.resolve("F32_STEP") for p in three] == [0, 32, 64]
    with pytest.raises(AttributeError, match="x86_avx2/generic defines nothing_here"):
        chain(("x86_avx2", "generic")).resolve("nothing_here")
    with pytest.raises(ValueError, match="ends in 'generic'"):
        chain(("x86_avx2",))
    assert chain(("x86_avx2", "generic")) is chain(["x86_avx2", "generic"])


def test_no_instruction_set_test_outside_the_isa_modules():
    # the done-when of the reshape: kernels ask the chain, never compare an
    # instruction-set number or name
    bad = re.compile(r"\barch\s*==|\bARCH_|profile\.arch\b|\.act_quant\s*==|\.vec_dot\s*==|\.bf16\s*==")
    hits = [f"{p.relative_to(CPU)}:{i}" for p in CPU.rglob("*.py") if "isa" not in p.parts
            for i, line in enumerate(p.read_text().splitlines(), 1) if bad.search(line)]
    assert hits == []


@njit
def _lanes(isa, x):
    out = np.empty(8, np.float32)
    for i in range(8):
        out[i] = isa.expf_v(x[i])
    return isa.EXPF_LANES, isa.FMA, isa.madd(np.float32(1 + 2.0 ** -12), np.float32(1 + 2.0 ** -12),
                                              np.float32(-(1 + 2.0 ** -11))), out


def test_kernels_take_the_chain_as_an_argument():
    x = np.linspace(-3, 3, 8).astype(np.float32)
    got = {name: _lanes(PROFILES[name].isa, x) for name in ("scalar", "avx2", "avx512")}
    assert [g[0] for g in got.values()] == [4, 8, 16]
    assert [g[1] for g in got.values()] == [False, True, True]
    # madd: one rounding with FMA (2^-24 survives), two without (0)
    assert [float(g[2]) for g in got.values()] == [0.0, 2.0 ** -24, 2.0 ** -24]
    # three builds' exponentials: all close to exp, not all the same bits
    for g in got.values():
        assert np.allclose(g[3], np.exp(x.astype(np.float64)), rtol=3e-7)
    assert len({g[3].tobytes() for g in got.values()}) > 1
    assert len(_lanes.signatures) == 3          # one compilation per chain


def test_one_traits_row_per_multiplied_type():
    assert vec_dot_type(T.Q4_1) == T.Q8_1 and vec_dot_type(T.IQ4_NL) == T.Q8_0
    assert vec_dot_type(T.Q6_K) == vec_dot_type(T.TQ2_0) == T.Q8_K and vec_dot_type(T.BF16) == T.BF16
    for t in TRAITS:
        assert hasattr(family(t), "pack"), t
    with pytest.raises(ValueError, match="no mat-mul for I8 weights"):
        traits(T.I8)


_A2, _A5, _SC = (PROFILES[n].isa for n in ("avx2", "avx512", "scalar"))


@pytest.mark.parametrize("isa, t, n, repacked, rows, cols, mmid, want", [
    # ggml_compute_forward_mul_mat: repack first, then tiled (8+ rows), then
    # llamafile (2+ rows, never for MUL_MAT_ID), else vec_dot
    (_A2, T.Q4_K, 1, True, 64, 256, False, ("repack", "q4_K_8x8")),
    (_A2, T.Q6_K, 8, False, 64, 256, False, ("tiled", "tiled")),
    (_A2, T.Q6_K, 7, False, 64, 256, False, ("vec_dot", "x86")),
    (_A2, T.Q8_0, 2, False, 64, 256, False, ("tinyblas", "x86")),
    (_A2, T.Q8_0, 2, False, 64, 256, True, ("vec_dot", "x86")),
    (_A2, T.IQ4_NL, 3, False, 36, 256, False, ("tinyblas", "tinyblas_q0")),
    (_A2, T.Q4_1, 5, False, 64, 256, False, ("vec_dot", "x86")),
    (_A2, T.Q2_0, 1, False, 64, 256, False, ("vec_dot", "generic")),
    (_A5, T.Q2_K, 3, True, 64, 256, False, ("repack", "q2_K_8x8")),
    (_A2, T.F16, 2, False, 64, 264, False, ("tinyblas", "tinyblas")),
    (_A5, T.F16, 2, False, 64, 264, False, ("vec_dot", "vec_dot")),    # 264 % 16
    (_A5, T.BF16, 2, False, 64, 272, False, ("vec_dot", "vec_dot")),   # 272 % 32
    (_A5, T.BF16, 2, False, 64, 288, False, ("tinyblas", "tinyblas")),
    (_A2, T.BF16, 2, False, 62, 288, False, ("vec_dot", "vec_dot")),   # rows % 4
    (_SC, T.Q4_K, 16, False, 64, 256, False, ("vec_dot", "generic")),
    (_SC, T.F32, 16, False, 64, 256, False, ("vec_dot", "vec_dot")),
])
def test_mm_path_is_ggml_dispatch(isa, t, n, repacked, rows, cols, mmid, want):
    path = mm_path(isa, t, n, repacked, rows, cols, mmid)
    assert (path, kernel(isa, t, path)) == want


@pytest.mark.parametrize("profile, t, want_cont, want_perm", [
    # ggml tries llamafile on float32 activations only when contiguous, and
    # on the converted copy only when one was made: F32 weights (nothing to
    # convert) never take it for a permuted view, F16 weights not on the
    # NEON builds whose tinyBLAS wants float32 activations (armv8.0,
    # dotprod), but do where it takes the F16 copy (x86, FP16 arithmetic)
    ("avx2", T.F32, "tinyblas", "vec_dot"),
    ("armv8.0", T.F32, "tinyblas", "vec_dot"),
    ("avx2", T.F16, "tinyblas", "tinyblas"),
    ("armv8.0", T.F16, "tinyblas", "vec_dot"),
    ("armv8.2-dotprod", T.F16, "tinyblas", "vec_dot"),
    ("armv8.2-fp16", T.F16, "tinyblas", "tinyblas"),
    ("armv8.2-dotprod", T.Q8_0, "tinyblas", "tinyblas"),     # tinyBLAS_Q0_ARM takes the Q8_0 copy
])
def test_mm_path_of_a_permuted_activation(profile, t, want_cont, want_perm):
    isa = PROFILES[profile].isa
    assert mm_path(isa, t, 8, False, 64, 256) == want_cont
    assert mm_path(isa, t, 8, False, 64, 256, src1_cont=False) == want_perm


def test_threading_is_set_up_by_a_call_not_by_import():
    code = ("import os, strata_ref.cpu.matmul, strata_ref.infer.model, strata_ref.cpu.matvec;"
            "a = os.environ.get('GOMP_SPINCOUNT');"
            "from strata_ref._threads import configure; configure();"
            "print(a, os.environ.get('GOMP_SPINCOUNT'))")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["None", "2000"]


def test_portable_q8_1_quantizer_on_nan_follows_ggml_c():
    # ggml's quantize_row_q8_1_ref (the scalar build's activation quantizer)
    # by hand on one block: x = [1.0, NaN, 0.25 x 30]. MAX(amax, |x|) takes
    # the NaN and the next 0.25 replaces it, so amax = 0.25, d = 0.25/127,
    # id = 1/d; roundf(1.0 * id) = 508 is stored as the int8 -4 (the
    # conversion's value cut to 8 bits), the NaN as 0, the rest 127; the sum
    # is of the stored int8: -4 + 30 * 127 = 3806. Checked against the
    # scalar peer's ggml_mul_mat (Q4_1 and Q8_0 weights) when it was written.
    import numpy as np
    from strata_ref.cpu import act_quant
    x = np.full((1, 32), 0.25, np.float32)
    x[0, 0], x[0, 1] = 1.0, np.nan
    q = np.zeros((1, 32), np.int8)
    d = np.zeros((1, 1), np.float32)
    s = np.zeros((1, 1), np.float32)
    act_quant.quantize_rows_q8_ref(x, q, d, s, True)
    dd = np.float32(np.float32(0.25) / np.float32(127.0))
    assert q[0].tolist() == [-4, 0] + [127] * 30
    # d and s are kept as the float32 values of their fp16 (RNE, finite here)
    want = np.array([np.float16(dd), np.float16(np.float32(dd * np.float32(3806)))], np.float32)
    assert np.array_equal(np.array([d[0, 0], s[0, 0]], np.float32).view(np.uint32), want.view(np.uint32))
