"""GEMM route oracles on the CPU: exact cases, beta/ldy, slicing, FP16 overflow, the bound."""
import numpy as np
import pytest

from strata_ref.routes import gemm as G


def _q8_0_weights(n, k, rng, d=1.0, qmax=127):
    """Q8_0 bytes of an N x K weight with every scale d and int8 codes; also
    the exact values as float64."""
    nb = n * k // 32
    q = rng.integers(-qmax, qmax + 1, (nb, 32)).astype(np.int8)
    blocks = np.empty((nb, 34), np.uint8)
    blocks[:, :2] = np.full(nb, d, np.float16).view(np.uint8).reshape(nb, 2)
    blocks[:, 2:] = q.view(np.uint8)
    return blocks.reshape(-1), (q.astype(np.float64) * d).reshape(n, k)


@pytest.mark.parametrize("route", G.ROUTES)
def test_small_integers_are_exact_in_every_route(route):
    rng = np.random.default_rng(0)
    t, n, k = 9, 24, 96
    w_raw, w = _q8_0_weights(n, k, rng)
    x = rng.integers(-50, 51, (t, k)).astype(np.float32)
    want = (x.astype(np.int64) @ w.astype(np.int64).T)       # |sum| < 2^24: exact in f32
    y = G.gemm(route, x, "Q8_0", w_raw, n, k)
    assert np.array_equal(y, want.astype(np.float32))
    assert np.array_equal(y.view(np.uint32), want.astype(np.float32).view(np.uint32))


def test_beta_and_ldy():
    rng = np.random.default_rng(1)
    t, n, k, ldy = 5, 8, 64, 13
    w_raw, w = _q8_0_weights(n, k, rng, qmax=20)
    x = rng.integers(-9, 10, (t, k)).astype(np.float16)
    y = np.full((t, ldy), -7.0, np.float32)
    y[:, :n] = rng.integers(-100, 100, (t, n))
    old = y.copy()
    G.gemm("f16", x, "Q8_0", w_raw, n, k, y=y, beta=1, ldy=ldy)
    want = old[:, :n] + (x.astype(np.float64) @ w.T)
    assert np.array_equal(y[:, :n], want.astype(np.float32))
    assert np.all(y[:, n:] == -7.0)                           # past N untouched
    y2 = np.full((t, ldy), 3.0, np.float32)
    G.gemm("f32", x, "Q8_0", w_raw, n, k, y=y2, beta=0, ldy=ldy)
    assert np.array_equal(y2[:, :n], (x.astype(np.float64) @ w.T).astype(np.float32))
    assert np.all(y2[:, n:] == 3.0)
    with pytest.raises(ValueError, match="ldy=7 is smaller than N=8"):
        G.gemm("f16", x, "Q8_0", w_raw, n, k, ldy=7)
    with pytest.raises(ValueError, match="beta"):
        G.gemm("f16", x, "Q8_0", w_raw, n, k, y=y, beta=2, ldy=ldy)
    with pytest.raises(ValueError, match="route"):
        G.gemm("bf16", x, "Q8_0", w_raw, n, k)


@pytest.mark.parametrize("scratch", [64, 64 * 3, 64 * 7 + 5, 64 * 40, 10 ** 6])
def test_slicing_equals_whole_bit_for_bit(scratch):
    rng = np.random.default_rng(2)
    t, n, k = 7, 40, 64
    # Power-of-two scales and f16 activations with few significant bits keep
    # every float64 sum exact, so the result does not depend on the order.
    w_raw, _ = _q8_0_weights(n, k, rng, d=0.0625)
    x = (rng.integers(-64, 65, (t, k)) / 8).astype(np.float16)
    for route in G.ROUTES:
        whole = G.gemm(route, x, "Q8_0", w_raw, n, k)
        sliced = G.gemm_sliced(route, x, "Q8_0", w_raw, n, k, scratch)
        assert np.array_equal(whole.view(np.uint32), sliced.view(np.uint32))
    assert G.slice_rows(scratch, n, k) == (n if n * k <= scratch else scratch // k)


def test_scratch_below_one_row_is_an_error():
    rng = np.random.default_rng(3)
    w_raw, _ = _q8_0_weights(4, 64, rng)
    with pytest.raises(ValueError, match="holds no row of K=64"):
        G.gemm_sliced("f16", np.zeros((1, 64), np.float32), "Q8_0", w_raw, 4, 64, 63)


def test_fp16_overflow_only_in_the_f16_route():
    rng = np.random.default_rng(4)
    n, k = 4, 32
    w_raw, w = _q8_0_weights(n, k, rng, qmax=3)
    w_raw = w_raw.copy()
    w_raw[2 + 5] = 0                                          # a zero weight in row 0
    w[0, 5] = 0
    x = np.ones((2, k), np.float32)
    x[0, 5] = 70000.0                                         # beyond ±65504: Inf in f16
    x[1, 6] = -1e6
    y16 = G.gemm("f16", x, "Q8_0", w_raw, n, k)
    y32 = G.gemm("f32", x, "Q8_0", w_raw, n, k)
    # Inf · 0 = NaN in row 0 col 0 of the f16 route; the f32 route stays finite and exact.
    assert y16.view(np.uint32)[0, 0] == 0x7FFFFFFF
    assert not np.all(np.isfinite(y16))
    assert np.all(np.isfinite(y32))
    assert np.array_equal(y32, (x.astype(np.float64) @ w.T).astype(np.float32))


def test_error_bound_holds_for_float32_accumulation():
    """A float32 left-to-right accumulation (what a SIMT GEMM does per thread)
    and a float32 pairwise one stay inside the bound; the bound is not loose
    by more than a few orders of magnitude."""
    rng = np.random.default_rng(5)
    t, n, k = 6, 16, 2048
    blocks = rng.integers(0, 256, (n * k // 32, 34), dtype=np.uint8)
    blocks[:, :2] = rng.uniform(-0.05, 0.05, n * k // 32).astype(np.float16).view(np.uint8).reshape(-1, 2)
    w_raw = blocks.reshape(-1)
    x = rng.standard_normal((t, k)).astype(np.float32)
    ref = G.gemm("f32", x, "Q8_0", w_raw, n, k)
    s = G.abs_sum("f32", x, "Q8_0", w_raw, n, k)
    bound = G.error_bound(k, s)
    xo, wo = G.operands("f32", x, "Q8_0", w_raw, n, k)
    prod = (xo[:, None, :] * wo[None, :, :]).astype(np.float32)
    seq = np.zeros((t, n), np.float32)
    for i in range(k):
        seq = seq + prod[:, :, i]
    pair = prod.sum(axis=-1, dtype=np.float32)
    for y in (seq, pair):
        err = np.abs(y.astype(np.float64) - ref)
        assert np.all(err <= bound)
    assert np.max(np.abs(seq.astype(np.float64) - ref) / bound) > 1e-4
