"""Native q8_1 mat-vec and MoE experts: load, host wrappers.

libstrata_mmvq (`build.MMVQ`: native/mmvq.cu with mmvq_dots.cuh,
mmvq_lanes.cuh, strata_mmvq.h) is built by `build.build` (no fast math;
IEEE division; the generated IQ-table header) and loaded with cffi in ABI
mode from the cdef block of strata_mmvq.h. Kernels:
../shared/spec/kernels.md §§6-10; arithmetic: the NumPy oracle in
strata_ref/routes/{q8_1,mmvq,experts}.py, bit for bit.

Host wrappers copy NumPy arrays in and out (`quantize_q8_1_native`,
`mmvq_native`, `experts_native`); `MmvqNative.dev` gives device buffers
for the parity and bench tools. `STRATA_MMVQ_LIB=path` loads a prebuilt
library instead of building. Every failure to build or load raises
loader.NativeUnavailable; a failed call raises NativeError.
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

import numpy as np

from ...types import GGMLType
from .. import build as _b
from ..loader import NativeUnavailable, driver_compute_capability, env_device, open_library

__all__ = ["MmvqNative", "OnDevice", "load_mmvq", "NativeError", "quantize_q8_1_native",
           "mmvq_native", "experts_native", "NATIVE_TYPES"]

T = GGMLType
#: types with native mat-vec kernels (native/mmvq_dots.cuh `Dot<TYPE>`)
NATIVE_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.MXFP4, T.Q2_K, T.Q3_K,
                T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS,
                T.IQ3_S, T.IQ1_S, T.IQ1_M)
_STATUS = {1: "type not served", 2: "shape not served", 3: "null pointer",
           5: "bad argument (ncols, rows per warp or mode)", 6: "CUDA error"}
_HEADER = "strata_mmvq.h"


class NativeError(RuntimeError):
    """A native mat-vec call failed; the message names the call and the status."""


def _abi_version(cdef_header: str) -> int:
    """SMV_ABI_VERSION of the header the cdef comes from."""
    m = re.search(r"#define SMV_ABI_VERSION (\d+)", cdef_header)
    if m is None:
        raise _b.BuildError(f"{_HEADER} does not define SMV_ABI_VERSION")
    return int(m.group(1))


class OnDevice:
    """The cffi library `lib` with every call made on CUDA device `device`.

    The CUDA runtime's current device belongs to the host thread, so a
    handle loaded in one thread and used from another would run on that
    thread's current device (0 unless it set one). Each call through this
    wrapper first asks the calling thread's current device
    (`smv_get_device`) and, when it is another one, makes `device` current
    there (`smv_set_device`); if that fails, the call returns its status (6)
    without running. Calls that touch no device state pass straight through.
    """

    #: entry points that need no current device (process-wide settings,
    #: queries of the library, the per-thread error and device calls)
    NO_DEVICE = frozenset({"smv_abi_version", "smv_has_type", "smv_has_lanes",
                           "smv_set_plain_kernel", "smv_set_time_graph",
                           "smv_experts_scratch_bytes", "smv_last_cuda_error", "smv_set_device",
                           "smv_get_device"})

    def __init__(self, lib, device: int):
        self._lib, self.device = lib, int(device)

    def __getattr__(self, name: str):
        fn = getattr(self._lib, name)
        if name in self.NO_DEVICE or not callable(fn):
            return fn
        lib, dev = self._lib, self.device

        def on_device(*args):
            if lib.smv_get_device() != dev:
                st = lib.smv_set_device(dev)
                if st:
                    return st
            return fn(*args)

        on_device.__name__ = name
        self.__dict__[name] = on_device   # later lookups skip __getattr__
        return on_device


@dataclass
class MmvqNative:
    """The loaded library: `ffi`, `lib` (an `OnDevice` wrapper: every call
    runs on the handle's device, from any host thread), `cc` (major·10 +
    minor)."""
    ffi: object
    lib: object
    cc: int

    def check(self, status: int, what: str) -> None:
        if status == 6:
            raise NativeError(f"{what}: CUDA error {self.lib.smv_last_cuda_error()}")
        if status:
            raise NativeError(f"{what}: {_STATUS.get(status, status)}")

    def put(self, a: np.ndarray) -> "DevBuf":
        a = np.ascontiguousarray(a)
        buf = self.alloc(max(a.nbytes, 1))
        self.check(self.lib.smv_memcpy_htod(buf.ptr, self.ffi.from_buffer(a), a.nbytes), "copy in")
        return buf

    def alloc(self, nbytes: int) -> "DevBuf":
        p = self.ffi.new("void **")
        self.check(self.lib.smv_malloc(p, int(nbytes)), f"cudaMalloc({nbytes})")
        return DevBuf(self, p[0], int(nbytes))

    def get(self, buf: "DevBuf", dtype, count: int) -> np.ndarray:
        out = np.empty(count, dtype)
        self.check(self.lib.smv_memcpy_dtoh(self.ffi.from_buffer(out), buf.ptr, out.nbytes),
                   "copy out")
        return out


class DevBuf:
    """A cudaMalloc'd buffer, freed when collected."""

    def __init__(self, nat: MmvqNative, ptr, nbytes: int):
        self.nat, self.ptr, self.nbytes = nat, ptr, nbytes

    def __del__(self):
        try:
            self.nat.lib.smv_free(self.ptr)
        except Exception:       # interpreter shutdown
            pass


_LOCK = threading.Lock()
_LIB: dict[int, MmvqNative] = {}


def load_mmvq(device: int | None = None) -> MmvqNative:
    """Build (once, cached) and load libstrata_mmvq for a CUDA device
    (default: $STRATA_REF_DEVICE or 0). The handle may be used from any host
    thread: every call through `.lib` runs on `device` (`OnDevice`).
    Raises NativeUnavailable with the reason when that cannot be done."""
    if device is None:
        device = env_device()
    with _LOCK:
        if device in _LIB:
            return _LIB[device]
        cc = driver_compute_capability(device)
        # the header is read even when STRATA_MMVQ_LIB skips the build
        ffi, lib, path = open_library(_b.MMVQ, cc, _HEADER, os.environ.get("STRATA_MMVQ_LIB"))
        want = _abi_version((_b.source_dir() / _HEADER).read_text())
        if lib.smv_abi_version() != want:
            raise NativeUnavailable(f"{path}: ABI version {lib.smv_abi_version()}, this package "
                                    f"needs {want} (rebuild it or unset STRATA_MMVQ_LIB)")
        nat = MmvqNative(ffi, OnDevice(lib, device), cc)
        st = lib.smv_set_device(device)
        if st:   # no usable device: the tools' "native path unavailable" case
            raise NativeUnavailable(f"cudaSetDevice({device}) failed: CUDA error "
                                    f"{lib.smv_last_cuda_error()}")
        _LIB[device] = nat
        return nat


def quantize_q8_1_native(x: np.ndarray, nat: MmvqNative | None = None) -> np.ndarray:
    """q8_1 blocks of float32 x on the GPU: uint8 (n/32, 36)."""
    nat = nat or load_mmvq()
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    dx = nat.put(x)
    dq = nat.alloc(x.size // 32 * 36)
    nat.check(nat.lib.smv_quantize_q8_1(nat.ffi.cast("float *", dx.ptr), dq.ptr, x.size,
                                        nat.ffi.NULL), "quantize_q8_1")
    return nat.get(dq, np.uint8, x.size // 32 * 36).reshape(-1, 36)


def mmvq_native(t, w: np.ndarray, q8: np.ndarray, *, rows_per_warp: int = 0,
                nat: MmvqNative | None = None) -> np.ndarray:
    """GPU mat-vec: w uint8 (rows, row_bytes), q8 uint8 (ncols, K/32, 36)
    -> float32 (ncols, rows). rows_per_warp 0: for 1 column the lanes kernel
    (Q4_K, Q6_K, IQ4_XS with 16-byte aligned weights) or the plain kernel,
    for 2..8 columns the plain kernel; 1/2/4: the warp kernel. The bits are
    the same for every choice."""
    nat = nat or load_mmvq()
    t = GGMLType(t)
    q8 = np.asarray(q8, np.uint8)
    q8 = q8[None] if q8.ndim == 2 else q8
    ncols, k = q8.shape[0], q8.shape[1] * 32
    rows = w.shape[0]
    dw, dq = nat.put(w), nat.put(q8)
    dy = nat.alloc(ncols * rows * 4)
    nat.check(nat.lib.smv_mmvq(int(t), dw.ptr, rows, k, dq.ptr, ncols,
                               nat.ffi.cast("float *", dy.ptr), rows_per_warp, nat.ffi.NULL),
              f"mmvq {t.name}")
    return nat.get(dy, np.float32, ncols * rows).reshape(ncols, rows)


def experts_native(mode: int, x, ids, wts, gate, up, down, t_gu, t_down, *,
                   nat: MmvqNative | None = None) -> np.ndarray:
    """GPU MoE FFN (routes/experts.moe_ffn arguments; gate/up/down lists of
    per-expert uint8 matrices) in expert mode 0 or 8 -> float32 (tokens, H)."""
    nat = nat or load_mmvq()
    x = np.ascontiguousarray(x, np.float32)
    ids = np.ascontiguousarray(ids, np.int32)
    wts = np.ascontiguousarray(wts, np.float32)
    n_tok, h = x.shape
    ff = np.asarray(gate[0]).shape[0]
    bufs = [nat.put(np.stack(m)) for m in (gate, up, down)]
    dx, di, dw = nat.put(x), nat.put(ids), nat.put(wts)
    dout = nat.alloc(x.nbytes)
    k = ids.shape[1]
    scratch = nat.alloc(nat.lib.smv_experts_scratch_bytes(h, ff, n_tok, k))
    f = nat.ffi
    nat.check(nat.lib.smv_experts(mode, int(t_gu), int(t_down), bufs[0].ptr, bufs[1].ptr,
                                  bufs[2].ptr, h, ff, f.cast("float *", dx.ptr), n_tok,
                                  f.cast("int *", di.ptr), f.cast("float *", dw.ptr), k,
                                  f.cast("float *", dout.ptr), scratch.ptr, f.NULL),
              f"experts mode {mode}")
    return nat.get(dout, np.float32, x.size).reshape(x.shape)
