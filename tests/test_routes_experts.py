"""MoE expert route oracle: the specified float32 exp and SwiGLU, the FFN's
composition, and a float64 check of the whole expert."""
import numpy as np
import pytest

from strata_ref.formats import dequantize_blocks
from strata_ref.numerics import fma_f32
from strata_ref.routes import experts as E
from strata_ref.routes.mmvq import mmvq
from strata_ref.routes.mmvq_inputs import sane_blocks
from strata_ref.routes.q8_1 import quantize_q8_1
from strata_ref.types import GGMLType, block_format

T = GGMLType


def test_exp_exact_points():
    x = np.array([0.0, -0.0, 1.0, np.log(2.0)], np.float32)
    e = E.exp_f32(x)
    assert e[0] == 1.0 and e[1] == 1.0
    # n = 0 for |x| < ln2/2: e = polynomial; for x = ln2 (float32), n = 1
    assert abs(float(e[2]) - np.e) <= 2 * np.spacing(np.float32(np.e))
    assert abs(float(e[3]) / (2 * np.exp(float(x[3]) - np.log(2.0))) - 1) < 2e-7


def test_exp_accuracy_bound():
    # Taylor degree 7 on |r| <= ln2/2: truncation r^8/8! < 5.6e-9; 10 float32
    # roundings (reduction, Horner, scaling) each <= 2^-24 relative: total
    # below 10·2^-24 + 5.6e-9 ≈ 6.0e-7.
    x = np.linspace(-87, 88, 100001).astype(np.float32)
    rel = np.abs(E.exp_f32(x) / np.exp(x.astype(np.float64)) - 1)
    assert rel.max() < 10 * 2.0 ** -24 + 5.6e-9


def test_exp_ranges_and_specials():
    e = E.exp_f32(np.array([100, 89, -104, -200, np.inf, -np.inf], np.float32))
    assert np.isinf(e[0]) and np.isinf(e[1]) and e[0] > 0
    assert e[2] >= 0 and e[2] < 2.0 ** -149 * 2
    assert e[3] == e[2]                           # clamped at -104
    assert np.isinf(e[4]) and e[5] == e[2]
    # subnormal results are reachable and nonnegative
    assert 0 < E.exp_f32(np.float32(-100.0)) < 2.0 ** -126


def test_exp_matches_its_own_operation_sequence():
    # Written out here step by step from the module docstring, with float64
    # used only where it is exact (n·LN2_HI, integer scaling).
    rng = np.random.default_rng(1)
    x = rng.uniform(-80, 80, 2000).astype(np.float32)
    n = np.rint(np.float32(x) * E.LOG2E).astype(np.float32)
    r = fma_f32(n, -E.LN2_HI, x)
    r = fma_f32(n, -E.LN2_LO, r)
    p = np.full_like(x, E.COEFFS[7])
    for c in E.COEFFS[6::-1]:
        p = fma_f32(p, r, c)
    n = n.astype(np.int64)
    n1 = np.floor_divide(n, 2)
    expect = (p * np.ldexp(np.float32(1), n1).astype(np.float32)).astype(np.float32)
    expect = (expect * np.ldexp(np.float32(1), n - n1).astype(np.float32)).astype(np.float32)
    assert np.array_equal(E.exp_f32(x).view(np.uint32), expect.view(np.uint32))


def test_swiglu_sequence_and_specials():
    g = np.array([0.0, 1.0, -1.0, -200.0, 200.0, np.nan], np.float32)
    u = np.float32(3.0)
    h = E.swiglu(g, u)
    den = (np.float32(1) + E.exp_f32(-g)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        expect = ((g / den).astype(np.float32) * u).astype(np.float32)
    assert np.array_equal(h[:5].view(np.uint32), expect[:5].view(np.uint32))
    assert h[3] == 0.0 and np.signbit(h[3])       # -200 / Inf = -0
    assert h[4] == np.float32(600.0)
    assert np.isnan(h[5])


def _experts(rng, n_exp, h, ff, t_gu, t_down):
    fg, fd = block_format(t_gu), block_format(t_down)
    mk = lambda t, rows, k: sane_blocks(t, rows * k // block_format(t).block_values,   # noqa: E731
                                        rng).reshape(rows, -1)
    gate = [mk(t_gu, ff, h) for _ in range(n_exp)]
    up = [mk(t_gu, ff, h) for _ in range(n_exp)]
    down = [mk(t_down, h, ff) for _ in range(n_exp)]
    assert fg and fd
    return gate, up, down


def test_moe_ffn_is_the_composition():
    rng = np.random.default_rng(7)
    h, ff = 256, 64
    gate, up, down = _experts(rng, 4, h, ff, T.Q4_K, T.Q8_0)
    x = rng.standard_normal((2, h)).astype(np.float32)
    ids = np.array([[3, 1], [0, 3]])
    wts = np.array([[0.7, 0.3], [0.25, 0.75]], np.float32)
    out = E.moe_ffn(x, ids, wts, gate, up, down, T.Q4_K, T.Q8_0)
    for tok in range(2):
        acc = np.zeros(h, np.float32)
        xq = quantize_q8_1(x[tok]).reshape(1, -1, 36)
        for j in range(2):
            e = ids[tok, j]
            hh = E.swiglu(mmvq(T.Q4_K, gate[e], xq)[0], mmvq(T.Q4_K, up[e], xq)[0])
            y = mmvq(T.Q8_0, down[e], quantize_q8_1(hh).reshape(1, -1, 36))[0]
            acc = fma_f32(wts[tok, j], y, acc)
        assert np.array_equal(out[tok].view(np.uint32), acc.view(np.uint32))


def test_moe_ffn_against_float64():
    # float64 SwiGLU expert from dequantized weights and unquantized x; the
    # q8_1 steps (x and h, 8-bit) dominate the difference: kernels.md §13
    # uses relative L1 < 3e-2 for this comparison.
    rng = np.random.default_rng(9)
    h, ff = 512, 256
    gate, up, down = _experts(rng, 2, h, ff, T.Q6_K, T.Q6_K)
    x = rng.standard_normal((1, h)).astype(np.float32)
    ids = np.array([[1, 0]])
    wts = np.array([[0.6, 0.4]], np.float32)
    out = E.moe_ffn(x, ids, wts, gate, up, down, T.Q6_K, T.Q6_K)[0].astype(np.float64)
    deq = lambda m, t, k: dequantize_blocks(t, m.reshape(-1, block_format(t).block_bytes)  # noqa: E731
                                            ).astype(np.float64).reshape(-1, k)
    ref = np.zeros(h)
    for e, p in zip(ids[0], wts[0]):
        g = deq(gate[e], T.Q6_K, h) @ x[0]
        u = deq(up[e], T.Q6_K, h) @ x[0]
        with np.errstate(over="ignore"):         # random scales give |g| in the thousands
            hh = g / (1 + np.exp(-g)) * u
        ref += float(p) * (deq(down[e], T.Q6_K, ff) @ hh)
    assert np.abs(out - ref).sum() / np.abs(ref).sum() < 3e-2


def test_bad_arguments():
    rng = np.random.default_rng(0)
    gate, up, down = _experts(rng, 2, 256, 32, T.Q4_K, T.Q8_0)
    x = np.zeros((1, 256), np.float32)
    with pytest.raises(ValueError):
        E.moe_ffn(x, np.array([[2]]), np.ones((1, 1), np.float32), gate, up, down, T.Q4_K, T.Q8_0)
    with pytest.raises(TypeError):
        E.moe_ffn(x.astype(np.float64), np.array([[0]]), np.ones((1, 1), np.float32),
                  gate, up, down, T.Q4_K, T.Q8_0)
    with pytest.raises(ValueError):
        E.moe_ffn(x, np.array([[0]]), np.ones((1, 2), np.float32), gate, up, down, T.Q4_K, T.Q8_0)
