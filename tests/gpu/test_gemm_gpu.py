"""Native GEMM routes on a real GPU (skipped without one, or without nvcc,
cffi or cuBLAS): both routes within `routes.gemm.error_bound` of the oracle,
exact answers where sums are exact, beta/ldy handling, slicing, FP16
overflow, the route policy on this card, CuPy arrays and streams."""
import warnings

import numpy as np
import pytest

from strata_ref.routes import gemm as G

pytestmark = pytest.mark.gpu

_REASON = None


def _skip_without_gpu():
    global _REASON
    if _REASON is None:
        try:
            from strata_ref.native.gemm.wrapper import load_gemm
            load_gemm()
            _REASON = ""
        except Exception as e:            # NativeUnavailable, or no cffi at all
            _REASON = f"{type(e).__name__}: {e}"
    if _REASON:
        pytest.skip(f"native GEMM unavailable: {_REASON}")


def _host(*args, **kw):
    from strata_ref.native.gemm.wrapper import gemm_host
    return gemm_host(*args, **kw)


def _q8_0_int(n, k, rng, qmax=127):
    """Q8_0 bytes with every scale 1.0: W is the int8 codes themselves."""
    nb = n * k // 32
    q = rng.integers(-qmax, qmax + 1, (nb, 32)).astype(np.int8)
    blocks = np.empty((nb, 34), np.uint8)
    blocks[:, :2] = np.full(nb, 1.0, np.float16).view(np.uint8).reshape(nb, 2)
    blocks[:, 2:] = q.view(np.uint8)
    return blocks.reshape(-1), q.astype(np.int64).reshape(n, k)


def _within_bound(route, y, x, w_raw, n, k, y_old=None):
    want = G.gemm(route, x, "Q8_0", w_raw, n, k,
                  y=None if y_old is None else y_old.copy(), beta=0 if y_old is None else 1,
                  ldy=None if y_old is None else y_old.shape[1])
    s = G.abs_sum(route, x, "Q8_0", w_raw, n, k, y_old)
    err = np.abs(y[:, :n].astype(np.float64) - want[:, :n].astype(np.float64))
    bound = G.error_bound(k, s)
    assert np.all(err <= bound), f"{route}: worst {np.max(err / np.maximum(bound, 1e-300)):.3g} x bound"
    return want


@pytest.mark.parametrize("route", G.ROUTES)
@pytest.mark.parametrize("scratch", [None, 64 * 1, 64 * 5, 64 * 33])
def test_small_integers_are_exact(route, scratch):
    """|sums| < 2^24 of integer products: any correct order gives the exact
    value, in every route and every slicing."""
    _skip_without_gpu()
    rng = np.random.default_rng(0)
    t, n, k = 19, 40, 64
    w_raw, w = _q8_0_int(n, k, rng)
    x = rng.integers(-60, 61, (t, k)).astype(np.float16)
    want = (x.astype(np.int64) @ w.T).astype(np.float32)
    y = _host(route, x, "Q8_0", w_raw, n, k, scratch_elems=scratch)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("route", G.ROUTES)
def test_random_within_bound_beta_and_ldy(route):
    from strata_ref.native.gemm.parity import f16_activations, q8_0_weights
    _skip_without_gpu()
    rng = np.random.default_rng(1)
    t, n, k, ldy = 37, 300, 512, 307
    w_raw = q8_0_weights(n, k, rng)
    x = f16_activations(t, k, rng)
    y0 = np.full((t, ldy), -12345.0, np.float32)
    y = _host(route, x, "Q8_0", w_raw, n, k, y=y0.copy(), ldy=ldy)
    _within_bound(route, y, x, w_raw, n, k)
    assert np.all(y[:, n:] == -12345.0)
    x2 = f16_activations(t, k, rng)
    y2 = _host(route, x2, "Q8_0", w_raw, n, k, y=y.copy(), beta=1, ldy=ldy)
    _within_bound(route, y2, x2, w_raw, n, k, y_old=y)
    assert np.all(y2[:, n:] == -12345.0)


@pytest.mark.parametrize("route", G.ROUTES)
def test_float32_activations(route):
    """float32 X: the FP16 route rounds it to f16, the FP32 route keeps it;
    each within the bound of its own oracle."""
    _skip_without_gpu()
    from strata_ref.native.gemm.parity import q8_0_weights
    rng = np.random.default_rng(2)
    t, n, k = 9, 64, 256
    w_raw = q8_0_weights(n, k, rng)
    x = rng.standard_normal((t, k)).astype(np.float32)
    _within_bound(route, _host(route, x, "Q8_0", w_raw, n, k), x, w_raw, n, k)


@pytest.mark.parametrize("route", G.ROUTES)
def test_slicing_within_bound_and_reported(route, capsys):
    """Every slicing stays within the bound; whether it is bitwise the
    unsliced call depends on the algorithm cuBLAS picks for each slice's
    row count (kernels.md §11), so it is printed, not asserted here (the
    parity tool reports it, docs/gemm.md records it)."""
    _skip_without_gpu()
    from strata_ref.native.gemm.parity import f16_activations, q8_0_weights
    rng = np.random.default_rng(3)
    t, n, k = 64, 384, 512
    w_raw = q8_0_weights(n, k, rng)
    x = f16_activations(t, k, rng)
    whole = _host(route, x, "Q8_0", w_raw, n, k)
    same = []
    for rows in (192, 128, 100, 64, 17, 1):
        part = _host(route, x, "Q8_0", w_raw, n, k, scratch_elems=rows * k)
        _within_bound(route, part, x, w_raw, n, k)
        same.append((rows, bool(np.array_equal(part.view(np.uint32), whole.view(np.uint32)))))
    with capsys.disabled():
        print(f"\n[gemm {route}] slicing bitwise equal to unsliced (rows/slice, equal): {same}")


def test_fp16_overflow_is_the_reason_for_the_fp32_route():
    """An activation beyond ±65504 is ±Inf in the FP16 route (NaN follows
    where an Inf meets a zero weight or one of the other sign); the FP32
    route keeps every output finite and within its bound."""
    _skip_without_gpu()
    rng = np.random.default_rng(4)
    t, n, k = 6, 32, 64
    w_raw, w = _q8_0_int(n, k, rng, qmax=3)
    x = rng.integers(-4, 5, (t, k)).astype(np.float32)
    x[1, 5] = 70000.0
    x[4, 9] = -1.0e5
    y16 = _host("f16", x, "Q8_0", w_raw, n, k)
    y32 = _host("f32", x, "Q8_0", w_raw, n, k)
    want16 = G.gemm("f16", x, "Q8_0", w_raw, n, k)
    bad = ~np.isfinite(y16)
    assert np.array_equal(bad, ~np.isfinite(want16))
    assert bad[1].all() and bad[4].all() and not bad[[0, 2, 3, 5]].any()
    # Inf·w is ±Inf with w's sign; Inf·0 is NaN (IEEE, in the oracle and the GPU).
    w5 = w[:, 5]
    assert np.all(y16[1][w5 > 0] == np.inf) and np.all(y16[1][w5 < 0] == -np.inf)
    assert np.all(np.isnan(y16[1][w5 == 0]))
    assert np.all(np.isfinite(y32))
    _within_bound("f32", y32, x, w_raw, n, k)


def test_route_policy_on_this_card(monkeypatch):
    _skip_without_gpu()
    from strata_ref.native.gemm import wrapper as NG
    from strata_ref.native.dequant.wrapper import DeviceBuffer
    from strata_ref.native.gemm.wrapper import load_gemm
    from strata_ref.native.gemm.policy import ENV_DENSE_F32
    cc = load_gemm().cc
    rng = np.random.default_rng(5)
    n, k, t = 8, 64, 3
    w_raw, _ = _q8_0_int(n, k, rng)
    wb = DeviceBuffer(w_raw.size, np.uint8)
    wb.upload(w_raw)
    xb = DeviceBuffer(t * k, np.float16)
    xb.upload(np.ones((t, k), np.float16))
    yb = DeviceBuffer(t * n, np.float32)
    monkeypatch.setenv(ENV_DENSE_F32, "1")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        run = NG.gemm_device("Q8_0", wb, n, k, xb, yb, t=t)
    assert run.route == ("f32" if 60 <= cc < 70 else "f16")
    assert NG.gemm_device("Q8_0", wb, n, k, xb, yb, t=t, route="f32").route == "f32"
    assert NG.gemm_device("Q8_0", wb, n, k, xb, yb, t=t, route="f16").route == "f16"
    r = NG.gemm_device("Q8_0", wb, n, k, xb, yb, t=t, scratch_elems=3 * k)
    assert (r.rows_per_slice, r.slices) == (3, 3)
    assert NG.cublas_version() >= 10000


def test_cupy_arrays_and_a_stream():
    _skip_without_gpu()
    cp = pytest.importorskip("cupy")
    from strata_ref.native.gemm import wrapper as NG
    from strata_ref.native.gemm.parity import f16_activations, q8_0_weights
    rng = np.random.default_rng(6)
    t, n, k = 50, 96, 256
    w_raw = q8_0_weights(n, k, rng)
    x = f16_activations(t, k, rng)
    w, xd = cp.asarray(w_raw), cp.asarray(x)
    y_default = cp.zeros((t, n), cp.float32)
    NG.gemm_device("Q8_0", w, n, k, xd, y_default, route="f16")
    s = cp.cuda.Stream(non_blocking=True)
    y_stream = cp.zeros((t, n), cp.float32)
    NG.gemm_device("Q8_0", w, n, k, xd, y_stream, route="f16", stream=s)
    s.synchronize()
    assert cp.array_equal(y_default.view(cp.uint32), y_stream.view(cp.uint32))
    _within_bound("f16", cp.asnumpy(y_stream), x, w_raw, n, k)


def test_small_parity_run_passes():
    _skip_without_gpu()
    pytest.importorskip("cupy")
    from strata_ref.native.gemm.parity import run_parity_gemm
    lines = []
    status = run_parity_gemm(quick=True, out=lines.append,
                             shapes=[("small", 192, 576, False)], spec_shapes=[(333, 128, 2560, 136)],
                             sizes=list(range(1, 40)) + [64, 255, 256, 257, 1000])
    assert status == 0, "\n".join(lines)
    assert lines[-1] == "gemm_f32_parity: OK"
