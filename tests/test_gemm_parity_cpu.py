"""The gemm_f32_parity harness on the CPU: NumPy stands in for CuPy and a
float32 NumPy GEMM for cuBLAS, so every line of the tool runs without a GPU;
a faulty stand-in must make it fail. The real run is on the GPU
(tests/gpu/test_gemm_gpu.py, docs/gemm.md)."""
import types

import numpy as np
import pytest

from strata_ref.dequant import dequant_f16
from strata_ref.native.gemm import parity as P
from strata_ref.routes.gemm import slice_rows


def _ratio(y, r, bd):
    y64, r64 = y.astype(np.float64), r.astype(np.float64)
    d = np.abs(y64 - r64)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(bd > 0, d / np.where(bd > 0, bd, 1.0), np.where(d == 0, 0.0, 1e300))
    return np.where(np.isnan(y64) | np.isnan(r64), 1e300, q).max()


NP_CUPY = types.SimpleNamespace(
    asarray=lambda a: np.array(a), asnumpy=np.asarray, empty=np.empty, full=np.full,
    abs=np.abs, stack=np.stack, array_equal=np.array_equal, float16=np.float16,
    float32=np.float32, float64=np.float64, uint32=np.uint32,
    ReductionKernel=lambda *args: _ratio,
    cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        getDeviceProperties=lambda d: {"name": b"stand-in"})),
    get_default_memory_pool=lambda: types.SimpleNamespace(free_all_blocks=lambda: None))


class StandIn:
    """float32 GEMM in NumPy: each output a float32 BLAS dot, within the bound."""
    cc = 90
    scale = 1.0          # a faulty stand-in scales its results
    spill = False        # a faulty stand-in writes past N

    def cublas_version(self):
        return 120804

    def _product(self, route, w16, x, y, c0, beta):
        xs = x.astype(np.float32)
        p = xs @ w16.astype(np.float32).T * np.float32(self.scale)
        m = w16.shape[0]
        y[:, c0:c0 + m] = p + (y[:, c0:c0 + m] if beta else 0)
        if self.spill and y.shape[1] > c0 + m:
            y[:, c0 + m] = 0

    def dense(self, route, w16, n, k, x, y, ldy=None, beta=0):
        self._product(route, w16[:n * k].reshape(n, k), x, y, 0, beta)

    def quant(self, route, wdev, n, k, x, y, scratch, scratch_elems, ldy=None, beta=0):
        rows = slice_rows(scratch_elems, n, k)
        for r0 in range(0, n, rows):
            m = min(rows, n - r0)
            self._product(route, dequant_f16("Q8_0", wdev, m, k, row0=r0), x, y, r0, beta)


SHAPES = [("tiny a", 40, 64, False), ("tiny head", 24, 32, True)]
SPEC = [(33, 8, 96, 11), (5, 1, 64, None)]
SIZES = [1, 2, 7, 33, 40]


def _run(backend, shapes=SHAPES, sizes=SIZES):
    lines = []
    status = P.run_parity_gemm(quick=True, out=lines.append, shapes=shapes, spec_shapes=SPEC,
                               sizes=sizes, _cp=NP_CUPY, _backend=backend)
    return status, lines


def test_harness_passes_a_correct_gemm_and_reports():
    status, lines = _run(StandIn(), shapes=[("tiny a", 8, 32, False)], sizes=None)
    text = "\n".join(lines)
    assert status == 0, text
    assert lines[0].startswith("gemm_f32_parity: cuBLAS 120804 (12.8.4), stand-in")
    assert lines[-1] == "gemm_f32_parity: OK"
    # f16 activations: both routes multiply the same operands in the same
    # NumPy order, so they are equal at every one of the 200 sizes.
    assert "routes bitwise equal at 200/200 (shape, T) pairs" in text
    assert "tiny a" in text and "T 1..4096 (200 sizes)" in text
    assert "33x8x96 ldy=11" in text and "guard columns intact" in text
    assert "slicing (T in [1, 37, 512], rows/slice [4, 3, 1])" in text


def test_harness_fails_an_inaccurate_gemm():
    bad = StandIn()
    bad.scale = 1.0 + 2.0 ** -10          # far beyond (2(K+1)u + ...)·S
    status, lines = _run(bad)
    assert status == 1
    assert lines[-1] == "gemm_f32_parity: FAILED"
    assert any("FAIL tiny a f16 route" in ln for ln in lines)


def test_harness_catches_writes_past_n():
    bad = StandIn()
    bad.spill = True
    status, lines = _run(bad)
    assert status == 1
    assert any("columns past N were written" in ln for ln in lines)


def test_size_sets():
    q = P.quick_sizes()
    assert len(q) == 200 and len(set(q)) == 200
    assert q[:64] == list(range(1, 65)) and max(q) == 4096
    f = P.full_sizes()
    assert f == list(range(1, 5121))
    assert P.slice_rows_set(576) == [288, 256, 193, 100, 17, 1]
    assert P.slice_rows_set(151936) == [75968, 50646, 256, 100]
    assert P.slice_rows_set(1) == []


def test_model_shapes():
    s = {(label, n, k) for label, n, k, _ in P.model_shapes()}
    assert ("Qwen2.5-0.5B down", 896, 4864) in s and ("SmolLM2-135M k,v", 192, 576) in s
    assert ("Qwen2.5-0.5B head", 151936, 896) in s
    assert all(k % 32 == 0 for _, _, k, _ in P.model_shapes())      # Q8_0 rows


def test_q8_0_weights_follow_the_layout():
    rng = np.random.default_rng(0)
    raw = P.q8_0_weights(2, 64, rng)
    assert raw.size == 4 * 34
    w = dequant_f16("Q8_0", raw, 2, 64).astype(np.float64)
    d = raw.reshape(4, 34)[:, :2].copy().view(np.float16).astype(np.float64).reshape(4, 1)
    q = raw.reshape(4, 34)[:, 2:].view(np.int8).astype(np.float64)
    assert np.array_equal(w.reshape(4, 32), (d * q).astype(np.float16).astype(np.float64))
