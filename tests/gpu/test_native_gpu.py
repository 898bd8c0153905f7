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
    from strata_ref.native.dequant.parity import run_parity_dequant
    lines = []
    assert run_parity_dequant(quick=True, out=lines.append) == 0, "\n".join(
        ln for ln in lines if "FAIL" in ln)
    assert lines[-1] == "parity dequant: OK"


def _q4_k_tensor(rows, cols, seed=1):
    from strata_ref.native.dequant.parity import make_blocks
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
    from strata_ref.native.dequant.wrapper import DeviceBuffer, dequant_device
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


# ---- dequant_device_many: several tensors, one wide launch -------------------------

# (rows, cols, row0, ld) per item: partial and multi-CUDA-block items, row
# slices, padded ld; Q8_0's wide kernel needs ld == cols.
_MANY_SHAPES = {
    "Q8_0": [(5, 576, 0, 576), (3, 1536, 2, 1536), (1, 32, 7, 32), (40, 1536, 3, 1536),
             (4, 96, 1, 96)],
    "K": [(5, 512, 0, 520), (3, 256, 2, 256), (1, 1536, 7, 1544), (40, 1536, 3, 1544),
          (4, 768, 1, 800)],
}
_U = {"f32": np.uint32, "f16": np.uint16, "bf16": np.uint16}
_OUT_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def _many_case(t, kind, dt, seed, shapes=None):
    """Tensors on the device, items into one guard-filled output buffer, and
    what the oracle says; returns (items, out buffer, [(offset, rows, cols,
    ld, reference)])."""
    from strata_ref import dequant as oracle
    from strata_ref.native.dequant.wrapper import DequantItem, DeviceBuffer
    from strata_ref.native.dequant.parity import make_blocks
    from strata_ref.types import block_format
    fmt = block_format(t)
    shapes = shapes or _MANY_SHAPES["Q8_0" if t == "Q8_0" else "K"]
    rng = np.random.default_rng(seed)
    size = np.dtype(_OUT_NP[dt]).itemsize
    items, expect, total, keep = [], [], 0, []
    offs = []
    for rows, cols, row0, ld in shapes:
        offs.append(total)
        total += -(-((rows - 1) * ld + cols + 8) // 8) * 8       # 8 guard elements, 16-byte steps
    out = DeviceBuffer(total, _OUT_NP[dt])
    out.fill_bytes(0x5A)
    for (rows, cols, row0, ld), off in zip(shapes, offs):
        raw = make_blocks(fmt.type, (row0 + rows) * cols // fmt.block_values, kind, rng).reshape(-1)
        blocks = DeviceBuffer(raw.size, np.uint8)
        blocks.upload(raw)
        keep.append(blocks)
        o = out.view(off * size, (rows - 1) * ld + cols, _OUT_NP[dt])
        items.append(DequantItem(t, blocks, rows, cols, o, row0=row0, ld=ld))
        ref = oracle.dequant(t, raw, rows, cols, row0, out_dtype=dt).view(_U[dt])
        expect.append((off, rows, cols, ld, ref))
    return items, out, expect, keep


def _assert_many(out, expect, dt):
    u = _U[dt]
    got = out.download(u)
    written = np.zeros(got.size, bool)
    for off, rows, cols, ld, ref in expect:
        for r in range(rows):
            seg = slice(off + r * ld, off + r * ld + cols)
            assert np.array_equal(got[seg], ref[r]), (off, r)
            written[seg] = True
    guard = np.full(1, 0x5A5A5A5A, np.uint32).view(u)[0]
    assert np.all(got[~written] == guard), "a value beyond cols (within ld or between items) was written"


@pytest.mark.parametrize("dt", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("t", ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"])
def test_dequant_many_is_bitwise_the_oracle(t, dt):
    _skip_without_gpu()
    from strata_ref.native.dequant.wrapper import dequant_device_many
    for seed, kind in enumerate(("sane", "raw")):
        items, out, expect, keep = _many_case(t, kind, dt, seed)
        run = dequant_device_many(items, dt, kernel="wide")
        assert run.one_launch, run.reason
        _assert_many(out, expect, dt)


def test_dequant_many_sixteen_items_equal_single_wide_calls():
    _skip_without_gpu()
    from strata_ref.native.dequant.wrapper import DeviceBuffer, dequant_device, dequant_device_many
    shapes = [(1 + i % 5, 32 * (1 + i % 7), i % 3, 32 * (1 + i % 7)) for i in range(16)]
    items, out, expect, keep = _many_case("Q8_0", "raw", "f16", 99, shapes)
    run = dequant_device_many(items, "f16", kernel="wide")
    assert run.one_launch and len(run.grouped) == 16
    _assert_many(out, expect, "f16")
    many = out.download(np.uint16)
    single = DeviceBuffer(out.size, np.float16)
    single.fill_bytes(0x5A)
    for it, (off, *_rest) in zip(items, expect):
        o = single.view(2 * off, it.out.size, np.float16)
        assert dequant_device("Q8_0", it.blocks, it.rows, it.cols, o, row0=it.row0, ld=it.ld,
                              kernel="wide").kernel == "wide"
    assert np.array_equal(single.download(np.uint16), many)


def test_dequant_many_refusal_writes_nothing():
    _skip_without_gpu()
    from strata_ref.native.dequant.wrapper import DequantItem, DeviceBuffer, dequant_device_many
    items, out, expect, keep = _many_case("Q4_K", "sane", "f16", 5)
    odd = DeviceBuffer(items[2].blocks.size + 8, np.uint8)
    odd.upload(items[2].blocks.download(), offset_bytes=1)
    it = items[2]
    items[2] = DequantItem(it.t, odd.view(1, it.blocks.size, np.uint8), it.rows, it.cols, it.out,
                           row0=it.row0, ld=it.ld)
    run = dequant_device_many(items, "f16", kernel="wide")
    assert run.grouped == () and "items[2]" in run.reason
    assert np.all(out.download(np.uint8) == 0x5A)


def test_dequant_weights_f16_one_launch_per_type():
    _skip_without_gpu()
    from strata_ref import dequant as oracle
    from strata_ref.native.dequant.wrapper import DeviceBuffer
    from strata_ref.native.gemm.wrapper import dequant_weights_f16
    from strata_ref.native.dequant.parity import make_blocks
    from strata_ref.types import GGMLType, block_format
    rng = np.random.default_rng(3)
    shapes = [("Q8_0", 96, 64), ("Q6_K", 40, 256), ("Q8_0", 32, 64), ("Q8_0", 64, 160)]
    weights, raws, keep = [], [], []
    for t, n, k in shapes:
        fmt = block_format(t)
        raw = make_blocks(GGMLType[t], n * k // fmt.block_values, "sane", rng).reshape(-1)
        b = DeviceBuffer(raw.size, np.uint8)
        b.upload(raw)
        weights.append((t, b, n, k))
        raws.append(raw)
    res = dequant_weights_f16(weights, kernel="wide")
    assert [len(r.grouped) for r in res.runs] == [3, 1]
    scratch = res.scratch.download(np.uint16)
    for v, raw, (t, n, k) in zip(res.views, raws, shapes):
        off = (v.ptr - res.scratch.ptr) // 2
        assert off % 8 == 0
        ref = oracle.dequant_f16(t, raw, n, k).view(np.uint16).reshape(-1)
        assert np.array_equal(scratch[off:off + n * k], ref), t
