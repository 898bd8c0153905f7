"""Native dequant kernels on a real GPU (skipped without one, or without nvcc
and cffi): the quick parity suite, the host convenience, refusals that launch
nothing, and zero-copy use of CuPy arrays when CuPy is installed."""
import numpy as np
import pytest

import strata_ref.native as native

pytestmark = pytest.mark.gpu

_REASON = None


def _skip_without_gpu():
    global _REASON
    if _REASON is None:
        _REASON = native.unavailable_reason() or ""
    if _REASON:
        pytest.skip(f"native path unavailable: {_REASON}")


def test_quick_parity_is_bitwise():
    _skip_without_gpu()
    from strata_ref.native.parity import run_parity_dequant
    lines = []
    assert run_parity_dequant(quick=True, out=lines.append) == 0, "\n".join(
        ln for ln in lines if "FAIL" in ln)
    assert lines[-1] == "parity dequant: OK"


def _q4_k_tensor(rows, cols, seed=1):
    from strata_ref.native.parity import make_blocks
    from strata_ref.types import GGMLType
    return make_blocks(GGMLType.Q4_K, rows * cols // 256, "sane",
                       np.random.default_rng(seed)).reshape(-1)


@pytest.mark.parametrize("kernel", ["auto", "generic", "wide"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_host_convenience_matches_oracle(kernel, dt):
    _skip_without_gpu()
    from strata_ref import dequant as oracle
    raw = _q4_k_tensor(12, 512)
    got = native.dequant_host("Q4_K", raw, 5, 512, row0=6, ld=520, out_dtype=dt, kernel=kernel)
    ref = oracle.dequant("Q4_K", raw, 5, 512, row0=6, ld=520, out_dtype=dt)
    u = np.uint32 if dt == "f32" else np.uint16
    assert got.shape == (5, 520)
    assert np.array_equal(got[:, :512].view(u), ref[:, :512].view(u))
    assert np.all(got[:, 512:].view(u) == 0)


def test_refusals_launch_nothing():
    _skip_without_gpu()
    from strata_ref.native.dequant import DeviceBuffer, dequant_device
    raw = _q4_k_tensor(2, 512)
    blocks = DeviceBuffer(raw.size, np.uint8)
    blocks.upload(raw)
    out = DeviceBuffer(4 * 512, np.float32)
    out.fill_bytes(0x5A)
    # cols not a multiple of QK; a type with no kernel; wide Q8_0 with ld != cols;
    # wide Q4_K on a misaligned blocks pointer
    assert dequant_device("Q4_K", blocks, 1, 300, out).kernel is None
    assert dequant_device("I32", blocks, 1, 256, out).kernel is None
    q8 = DeviceBuffer(34 * 16, np.uint8)
    q8.fill_bytes(0)
    assert dequant_device("Q8_0", q8, 1, 256, out, ld=264, kernel="wide").kernel is None
    odd = DeviceBuffer(raw.size + 8, np.uint8)
    assert dequant_device("Q4_K", odd.view(1, raw.size, np.uint8), 1, 512, out,
                          kernel="wide").kernel is None
    native.NativeError  # noqa: B018  (exported)
    assert np.all(out.download(np.uint8) == 0x5A)
    with pytest.raises(ValueError, match="blocks holds"):
        dequant_device("Q4_K", blocks, 3, 512, out)        # only 2 rows of blocks
    with pytest.raises(ValueError, match="out holds"):
        dequant_device("Q4_K", blocks, 2, 512, out, ld=4096)


def test_cupy_arrays_zero_copy():
    _skip_without_gpu()
    cp = pytest.importorskip("cupy")
    from strata_ref import dequant as oracle
    raw = _q4_k_tensor(8, 1024, seed=5)
    blocks = cp.asarray(raw)
    out16 = cp.full((8, 1024), 7, cp.float16)
    sel = native.dequant_device("Q4_K", blocks, 8, 1024, out16, stream=cp.cuda.get_current_stream())
    assert sel.kernel in ("generic", "wide")
    ref = oracle.dequant_f16("Q4_K", raw, 8, 1024)
    assert np.array_equal(cp.asnumpy(out16).view(np.uint16), ref.view(np.uint16))
    outbf = cp.zeros((8, 1024), cp.uint16)
    native.dequant_device("Q4_K", blocks, 8, 1024, outbf, out_dtype="bf16", kernel="wide")
    assert np.array_equal(cp.asnumpy(outbf), oracle.dequant_bf16("Q4_K", raw, 8, 1024).view(np.uint16))
    with pytest.raises(ValueError, match="out_dtype"):
        native.dequant_device("Q4_K", blocks, 8, 1024, outbf)
