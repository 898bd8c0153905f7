"""The parity tool and the device-array wrappers, run on the CPU against a
stand-in for the native library (no GPU).

The stand-in keeps "device memory" in one NumPy byte array (pointers are
offsets into it, 256-byte aligned like cudaMalloc) and serves
`strata_dequant` with the NumPy oracle behind the same argument checks and
wide-kernel guards as native/api.cu. That exercises everything around the
kernels: pointer and stride handling, row slices, padded ld, guard bytes,
forced-kernel refusals, the elementwise cases, the tallies and the exit
status; a planted fault must be caught. The kernels themselves are checked
by tests/gpu and by test_native_host_check.py."""
import numpy as np
import pytest

from strata_ref import dequant as oracle
from strata_ref import numerics
from strata_ref.native import loader
from strata_ref.native.dequant import policy as dispatch
from strata_ref.native.dequant import wrapper as nd
from strata_ref.native.dequant import parity
from strata_ref.types import GGMLType as T
from strata_ref.types import block_format


class _Ptr(list):
    pass


class FakeFFI:
    def new(self, decl):
        return _Ptr([0])

    def cast(self, decl, v):
        return int(v)

    def from_buffer(self, a):
        return ("host", a)

    def string(self, s):
        return s


class FakeLib:
    def __init__(self, fault=None):
        self.mem = np.zeros(1 << 26, np.uint8)
        self.top = 256
        self.fault = fault          # None, "pad" (write into ld padding) or "value"

    # memory
    def strata_malloc(self, p, n):
        if self.top + n > self.mem.size:
            return 6
        p[0] = self.top
        self.top += (n + 255) // 256 * 256
        return 0

    def strata_free(self, p):
        return 0

    def strata_memcpy_htod(self, dst, src, n):
        self.mem[dst:dst + n] = src[1].reshape(-1).view(np.uint8)[:n]
        return 0

    def strata_memcpy_dtoh(self, dst, src, n):
        dst[1].reshape(-1).view(np.uint8)[:n] = self.mem[src:src + n]
        return 0

    def strata_memset(self, p, v, n):
        self.mem[p:p + n] = v
        return 0

    def strata_synchronize(self):
        return 0

    def strata_set_device(self, d):
        return 0

    def strata_last_cuda_error(self):
        return 0

    def strata_cuda_error_string(self, e):
        return b"none"

    # kernels (the oracle behind api.cu's checks)
    def strata_dequant(self, t, b, row0, rows, cols, ld, code, o, kernel, stream):
        t = T(t)
        if t not in dispatch.GENERIC_TYPES or (kernel == 1 and t not in dispatch.WIDE_BLOCKS_ALIGN):
            return 1
        fmt = block_format(t)
        if rows <= 0 or cols <= 0 or ld < cols or cols % fmt.block_values:
            return 2
        if kernel == 1 and (ld % 8 or o % 16 or b % dispatch.WIDE_BLOCKS_ALIGN[t]
                            or (t == T.Q8_0 and ld != cols)):
            return 4
        dt = ("f32", "f16", "bf16")[code]
        size = 4 if dt == "f32" else 2
        row_bytes = cols // fmt.block_values * fmt.block_bytes
        src = self.mem[b:b + (row0 + rows) * row_bytes]
        ref = oracle.dequant(t, src, rows, cols, row0, out_dtype=dt)
        u = np.uint32 if size == 4 else np.uint16
        dst = self.mem[o:o + ((rows - 1) * ld + cols) * size].view(u)
        for r in range(rows):
            dst[r * ld:r * ld + cols] = ref[r].view(u)
        if self.fault == "pad" and ld > cols and rows > 1:
            dst[cols] = 0
        if self.fault == "value":
            dst[0] ^= 1
        return 0

    def _conv(self, src, dst, n, fn):
        x = self.mem[src:src + 4 * n].view(np.float32)
        self.mem[dst:dst + 2 * n].view(np.uint16)[:] = fn(x)
        return 0

    def strata_f32_to_bf16(self, src, dst, n, s):
        return self._conv(src, dst, n, numerics.f32_to_bf16_bits)

    def strata_f32_to_f16(self, src, dst, n, s):
        return self._conv(src, dst, n, numerics.f32_to_f16_bits)


@pytest.fixture
def fake(monkeypatch):
    def install(fault=None):
        nat = loader.Native(FakeFFI(), FakeLib(fault), 90, "<fake>")
        monkeypatch.setattr(loader, "load", lambda device=None: nat)
        monkeypatch.setattr(nd, "load", lambda device=None: nat)
        return nat
    return install


TYPES = [T.Q8_0, T.Q4_K, T.IQ4_XS, T.F16]


def test_parity_passes_and_counts(fake):
    fake()
    lines = []
    assert parity.run_parity_dequant(quick=True, types=TYPES, out=lines.append) == 0
    assert lines[-1] == "parity dequant: OK"
    total = [ln for ln in lines if "values compared" in ln][0]
    compared = int(total.split(":")[1].split()[0])
    # 16x512 tensors: per (set, dtype) full + padded + misalign (3 x 8192)
    # + slice (8 rows) + tail (1 row) values, per kernel run
    per = 3 * 8192 + 8 * 512 + 512
    runs_q8 = 2 * 3 * (per + 8192 + 8 * 512)   # generic, and wide: full + slice
    runs_k = 2 * 3 * (per + 8192 + 8 * 512 + 512)
    assert compared > runs_q8 + 2 * runs_k
    assert any("refused" in ln for ln in lines)
    assert any("elementwise 4096 patterns" in ln and "f32->bf16" in ln for ln in lines)


@pytest.mark.parametrize("fault", ["pad", "value"])
def test_parity_catches_planted_faults(fake, fault):
    fake(fault)
    lines = []
    assert parity.run_parity_dequant(quick=True, types=[T.Q4_K], out=lines.append) == 1
    assert lines[-1] == "parity dequant: FAILED"
    assert any("<-- FAIL" in ln for ln in lines)


def test_missing_kernel_fails(fake, monkeypatch):
    fake()
    monkeypatch.setattr(dispatch, "GENERIC_TYPES", dispatch.GENERIC_TYPES - {T.Q2_0})
    lines = []
    assert parity.run_parity_dequant(quick=True, types=[T.Q2_0], out=lines.append) == 1


def test_unavailable_native_returns_2(monkeypatch, capsys):
    def boom(device=None):
        raise loader.NativeUnavailable("no GPU here")
    monkeypatch.setattr(loader, "load", boom)
    lines = []
    assert parity.run_parity_dequant(quick=True, out=lines.append) == 2
    assert lines == [] and "no GPU here" in capsys.readouterr().err


def test_host_convenience_with_fallback(fake):
    fake()
    rng = np.random.default_rng(3)
    raw = parity.make_blocks(T.Q6_K, 4 * 2, "sane", rng).reshape(-1)
    for kernel in ("auto", "generic", "wide"):
        got = nd.dequant_host("Q6_K", raw, 2, 512, row0=1, ld=520, out_dtype="bf16", kernel=kernel)
        ref = oracle.dequant("Q6_K", raw, 2, 512, row0=1, ld=520, out_dtype="bf16")
        assert np.array_equal(got[:, :512].view(np.uint16), ref[:, :512].view(np.uint16))
    # forced wide Q8_0 with padded ld cannot run natively: the oracle serves it
    q8 = parity.make_blocks(T.Q8_0, 16, "sane", rng).reshape(-1)
    got = nd.dequant_host("Q8_0", q8, 2, 256, ld=264, out_dtype="f16", kernel="wide")
    ref = oracle.dequant("Q8_0", q8, 2, 256, ld=264, out_dtype="f16")
    assert np.array_equal(got.view(np.uint16), ref.view(np.uint16))


def test_device_array_checks(fake):
    fake()
    b = nd.DeviceBuffer(144 * 4, np.uint8)
    o = nd.DeviceBuffer(1024, np.float32)
    with pytest.raises(TypeError, match="__cuda_array_interface__"):
        nd.dequant_device("Q4_K", np.zeros(10, np.uint8), 1, 256, o)
    with pytest.raises(TypeError, match="uint8"):
        nd.dequant_device("Q4_K", o, 1, 256, o)
    with pytest.raises(ValueError, match="kernel"):
        nd.dequant_device("Q4_K", b, 1, 256, o, kernel="fast")
    with pytest.raises(ValueError, match="does not match"):
        nd.dequant_device("Q4_K", b, 1, 256, o, out_dtype="f16")
    u16 = nd.DeviceBuffer(1024, np.uint16)
    with pytest.raises(ValueError, match="out_dtype"):
        nd.dequant_device("Q4_K", b, 1, 256, u16)
    assert nd.dequant_device("Q4_K", b, 1, 256, u16, out_dtype="bf16").kernel == "generic"
    assert nd.dequant_device("Q4_K", b, 4, 256, o).kernel == "generic"
    assert nd.dequant_device("Q4_K", b, 1, 250, o).kernel is None
    with pytest.raises(ValueError):
        nd.DeviceBuffer(0, np.uint8)
