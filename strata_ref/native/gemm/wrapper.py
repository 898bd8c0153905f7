"""Prompt-path GEMM on the GPU: the FP16-operand and FP32 cuBLAS routes.

Y[T, N] = X[T, K] · W[N, K]^T (+ Y when beta = 1), Y float32 with row stride
ldy >= N (columns [N, ldy) never written); ../shared/spec/kernels.md §11,
oracle in `strata_ref.routes.gemm`.

* `gemm.policy.select_route(cc, env, route)` chooses the route (the
  FP16-operand one unless a 6.x card opts into FP32).
* `gemm_device(...)` runs the prompt path on `__cuda_array_interface__`
  arrays (CuPy, numba, torch, `DeviceBuffer`): W dequantized to f16 by the
  native dequant kernels into a scratch, in slices of floor(scratch/K) rows
  when W does not fit, one GEMM per slice.
* `gemm_dense_device(...)` is one GEMM over weights already in f16.
* `dequant_weights_f16(...)` dequantizes several weights (a layer's q, k,
  v, o, gate, up, down) into one f16 scratch with one wide launch per ggml
  type (`dequant.dequant_device_many`), for `gemm_dense_device` to use:
  small projections pay one launch instead of seven.
* `gemm_host(...)` copies NumPy data in and out (signature of the oracle's
  `gemm_sliced`).

The library (`build.GEMM`) and its cuBLAS handle and 32 MiB workspace are
loaded and created once per device (`load_gemm`). cuBLAS documents no
summation order: results are judged against the oracle with
`routes.gemm.error_bound`, never bitwise.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from ...routes.gemm import ROUTES, slice_rows
from ...types import UnsupportedTypeError, block_format, parse_type
from .. import build as _build
from ..cai import device_array, stream_handle
from ..loader import Native, NativeUnavailable, env_device, load, open_library
from .policy import notice_once, select_route

__all__ = ["GemmNative", "load_gemm", "GemmRun", "gemm_device", "gemm_dense_device", "gemm_host",
           "cublas_version", "LayerWeights", "dequant_weights_f16"]
_ROUTE_CODE = {"f16": 0, "f32": 1}
_X_CODE = {"f4": 0, "f2": 1}                 # typestr suffix -> strata_gemm_x_dtype
_STATUS = {2: "shape not served (t, n or k <= 0, ldy < n, a size past INT_MAX, or a "
              "scratch below one row)",
           3: "null pointer", 5: "bad route, x dtype, beta or dequant kernel",
           6: "CUDA error", 7: "cuBLAS error", 8: "strata_dequant refused a slice"}


@dataclass(frozen=True)
class GemmRun:
    """What `gemm_device` ran: the route and why, the dequant kernel kind,
    the rows per slice and the number of slices."""
    route: str
    reason: str
    kernel: str
    rows_per_slice: int
    slices: int


@dataclass(frozen=True)
class GemmNative:
    """A loaded GEMM library with its per-device context: `ffi`, `lib`, `ctx`
    (the strata_gemm_ctx pointer, created once and kept for the process),
    `dequant` (the dequant library's Native), `cc`, `path`."""
    ffi: object
    lib: object
    ctx: object
    dequant: Native
    cc: int
    path: str


_LOCK = threading.Lock()
_CACHE: dict[int, GemmNative] = {}


def load_gemm(device: int | None = None) -> GemmNative:
    """The GEMM library and context for CUDA device `device` (default
    $STRATA_REF_DEVICE or 0), building the library on first use. It is
    separate from the dequant library because it links cuBLAS; it reaches
    the dequant kernels at run time through the address of `strata_dequant`,
    taken from the dequant library that `loader.load` opened. The context
    (cuBLAS handle, 32 MiB workspace) lives until the process ends. Raises
    NativeUnavailable with the reason (no GPU, cffi, nvcc or cuBLAS)."""
    if device is None:
        device = env_device()
    dq = load(device)
    with _LOCK:
        if device in _CACHE:
            return _CACHE[device]
        ffi, lib, path = open_library(_build.GEMM, dq.cc, "strata_gemm.h")
        dequant_addr = int(dq.ffi.cast("uintptr_t", dq.lib.strata_dequant))
        pctx = ffi.new("strata_gemm_ctx **")
        st = lib.strata_gemm_create(device, ffi.cast("void *", dequant_addr), pctx)
        if st != 0:
            err = lib.strata_gemm_last_error()
            text = ffi.string(lib.strata_gemm_error_string(st, err)).decode()
            raise NativeUnavailable(f"strata_gemm_create failed: status {st}, {err} ({text})")
        g = GemmNative(ffi, lib, pctx[0], dq, dq.cc, str(path))
        _CACHE[device] = g
        return g


def _raise_status(g, status: int, what: str) -> None:
    if status == 0:
        return
    from ..dequant.wrapper import NativeError
    err = g.lib.strata_gemm_last_error()
    detail = g.ffi.string(g.lib.strata_gemm_error_string(status, err)).decode()
    raise NativeError(f"{what}: {_STATUS.get(status, status)} ({err}: {detail})")


def _operands(x, y, n: int, k: int, t: int | None, ldy: int | None, beta: int):
    """Checked (x, y, t, ldy, x dtype code) of a call; ValueError/TypeError
    name the argument."""
    n, k = int(n), int(k)
    if n <= 0 or k <= 0:
        raise ValueError(f"N and K must be positive, got N={n}, K={k}")
    if beta not in (0, 1):
        raise ValueError(f"beta must be 0 or 1, got {beta!r}")
    xd, yd = device_array(x, "x"), device_array(y, "y", writable=True)
    if xd.typestr[1:] not in _X_CODE:
        raise TypeError(f"x must be float32 or float16, got {xd.typestr}")
    if yd.typestr[1:] != "f4":
        raise TypeError(f"y must be float32, got {yd.typestr}")
    if t is None:
        if len(xd.shape) != 2 or xd.shape[1] != k:
            raise ValueError(f"x must have shape (T, K={k}) or t= must be given, got {xd.shape}")
        t = xd.shape[0]
    t = int(t)
    if t <= 0 or xd.size < t * k:
        raise ValueError(f"x holds {xd.size} values; T={t}, K={k} need {t * k}")
    if ldy is None:
        ldy = yd.shape[1] if len(yd.shape) == 2 else n
    ldy = int(ldy)
    if ldy < n:
        raise ValueError(f"ldy={ldy} is smaller than N={n}")
    if yd.size < (t - 1) * ldy + n:
        raise ValueError(f"y holds {yd.size} values; T={t}, N={n}, ldy={ldy} need "
                         f"{(t - 1) * ldy + n}")
    return xd, yd, t, ldy, _X_CODE[xd.typestr[1:]]


def gemm_dense_device(w_f16, n: int, k: int, x, y, *, route: str, t: int | None = None,
                      ldy: int | None = None, beta: int = 0, stream=None,
                      device: int | None = None) -> None:
    """One GEMM over weights already in f16: Y = X · W^T (+ Y if beta = 1).

    w_f16: device float16 (or 2-byte) array of N·K values, row-major N x K.
    x: device (T, K) float32 or float16 (1-D with `t=`). y: device float32,
    (T, ldy) or at least (T−1)·ldy + N values. route: "f16" or "f32"
    (explicit: the policy applies to the prompt path, `gemm_device`).
    Asynchronous on `stream`. Raises TypeError/ValueError for bad arrays,
    NativeUnavailable without a GPU path, NativeError when CUDA or cuBLAS fails.
    """
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    xd, yd, t, ldy, xcode = _operands(x, y, n, k, t, ldy, beta)
    wd = device_array(w_f16, "w_f16")
    if wd.typestr[1:] not in ("f2", "u2", "i2") or wd.size < n * k:
        raise ValueError(f"w_f16 must hold N·K={n * k} 2-byte values, got {wd.typestr} "
                         f"x {wd.size}")
    g = load_gemm(device)
    c = g.ffi.cast
    st = g.lib.strata_gemm_dense(g.ctx, _ROUTE_CODE[route], c("void *", wd.ptr), n, k,
                                 c("void *", xd.ptr), xcode, t, c("float *", yd.ptr), ldy,
                                 beta, c("void *", stream_handle(stream)))
    _raise_status(g, st, f"gemm ({route} route)")


def _scratch_buffer(scratch, scratch_elems, rows: int, k: int, device):
    if scratch is None:
        from ..dequant.wrapper import DeviceBuffer
        buf = DeviceBuffer(rows * k, np.float16, device)
        return buf, device_array(buf, "scratch")
    sd = device_array(scratch, "scratch")
    if sd.typestr[1:] not in ("f2", "u2", "i2"):
        raise TypeError(f"scratch must hold 2-byte values, got {sd.typestr}")
    if sd.size < rows * k:
        raise ValueError(f"scratch holds {sd.size} halves; slices of {rows} rows of K={k} "
                         f"need {rows * k}")
    return scratch, sd


def gemm_device(wtype, w_blocks, n: int, k: int, x, y, *, t: int | None = None,
                ldy: int | None = None, beta: int = 0, scratch=None,
                scratch_elems: int | None = None, route: str | None = None,
                kernel: str = "auto", stream=None, device: int | None = None) -> GemmRun:
    """The prompt path on the GPU: Y = X · W^T (+ Y if beta = 1), W quantized.

    wtype: ggml type of W (GGMLType, id or name). w_blocks: device uint8
    array holding W (N rows of K values) from row 0. x: device (T, K)
    float32 or float16 (1-D with `t=`). y: device float32, (T, ldy) or at
    least (T−1)·ldy + N values; columns [N, ldy) are never written.
    scratch / scratch_elems: f16 scratch (device, 2-byte) and its budget in
    elements; W is dequantized whole when N·K <= budget, else in slices of
    floor(budget / K) rows (`routes.gemm.slice_rows`). With no scratch, one
    of min(N·K, budget) halves is allocated for the call. route: None/"auto"
    (`select_route` with this card and os.environ) or "f16"/"f32" (forced).
    kernel: the dequant kernel, "auto" (`dequant.policy.select`), "generic"
    or "wide". Asynchronous on `stream`.

    Returns the GemmRun. Raises ValueError for a scratch below one row, bad
    shapes or a type without a native dequant kernel; TypeError for wrong
    array kinds; NativeUnavailable / NativeError as `gemm_dense_device`.
    """
    from ..dequant import policy as kpolicy
    from ..dequant.wrapper import NativeError
    xd, yd, t, ldy, xcode = _operands(x, y, n, k, t, ldy, beta)
    n, k = int(n), int(k)
    try:
        tt = parse_type(wtype)
        fmt = block_format(tt)
    except UnsupportedTypeError as e:
        raise ValueError(f"W: {e}") from None
    if k % fmt.block_values:
        raise ValueError(f"K={k} is not a multiple of the {tt.name} block size {fmt.block_values}")
    bd = device_array(w_blocks, "w_blocks")
    if bd.typestr[1:] not in ("u1", "i1"):
        raise TypeError(f"w_blocks must be a uint8 device array, got {bd.typestr}")
    need = n * (k // fmt.block_values) * fmt.block_bytes
    if bd.size < need:
        raise ValueError(f"w_blocks holds {bd.size} bytes; N={n} rows of {tt.name} with K={k} "
                         f"need {need}")
    if scratch_elems is None:
        scratch_elems = device_array(scratch, "scratch").size if scratch is not None else n * k
    rows = slice_rows(int(scratch_elems), n, k)            # ValueError below one row
    g = load_gemm(device)
    sel = notice_once(select_route(g.cc, os.environ, route))
    keep, sd = _scratch_buffer(scratch, scratch_elems, rows, k, device)
    if kernel == "auto":
        ksel = kpolicy.warn_once(kpolicy.select(g.cc, tt, rows, k, k, bd.ptr, sd.ptr, "f16",
                                                  os.environ))
    elif kernel in ("generic", "wide"):
        ksel = kpolicy.Selection(kernel, "forced")
    else:
        raise ValueError(f"kernel must be 'auto', 'generic' or 'wide', got {kernel!r}")
    if ksel.kernel is None:
        raise ValueError(f"no native dequant kernel for W ({tt.name}): {ksel.reason}")
    c = g.ffi.cast
    st = g.lib.strata_gemm_quant(g.ctx, _ROUTE_CODE[sel.route], int(tt), c("void *", bd.ptr),
                                 n, k, c("void *", xd.ptr), xcode, t, c("float *", yd.ptr), ldy,
                                 beta, c("void *", sd.ptr), int(scratch_elems),
                                 {"generic": 0, "wide": 1}[ksel.kernel],
                                 c("void *", stream_handle(stream)))
    if st == 8:
        raise NativeError(f"dequant of W ({tt.name}, {ksel.kernel} kernel) refused a slice: "
                          f"status {g.lib.strata_gemm_last_error()}")
    if scratch is None and st == 0 and g.dequant.lib.strata_synchronize() != 0:
        # The scratch allocated here must outlive the asynchronous launches.
        raise NativeError("cudaDeviceSynchronize failed after the GEMM")
    del keep
    _raise_status(g, st, f"gemm ({sel.route} route)")
    return GemmRun(sel.route, sel.reason, ksel.kernel, rows, -(-n // rows))


@dataclass(frozen=True)
class LayerWeights:
    """What `dequant_weights_f16` produced: `views` (per weight, a device
    float16 array of N·K values, row-major N x K, inside the scratch: the
    `w_f16` of `gemm_dense_device`), `runs` (the ManyRun of each
    `dequant_device_many` call, one per type and 16 weights) and `scratch`
    (the buffer holding them; keep it alive while the views are used)."""
    views: tuple
    runs: tuple
    scratch: object


def dequant_weights_f16(weights, scratch=None, *, kernel: str = "auto", stream=None,
                        device: int | None = None) -> LayerWeights:
    """Dequantize several quantized weights to f16 into one scratch, one wide
    launch per ggml type (`dequant.dequant_device_many`; up to 16 weights a
    launch).

    weights: sequence of (wtype, w_blocks, n, k): ggml type, device uint8
    array holding W (N rows of K values) from row 0, N, K. scratch: device
    2-byte array with room for every W, each placed at a multiple of 8
    halves (16 bytes; the wide kernels' store alignment) in the given
    order; None allocates one. kernel: "auto" or "wide", as in
    `dequant_device_many`. Asynchronous on `stream`; an allocated scratch is
    returned in the result and must outlive the launches.

    Returns LayerWeights. Raises ValueError for a small scratch, bad shapes
    or a weight no native kernel served (a forced "wide" kernel refused:
    nothing of that type was launched), TypeError for wrong array kinds,
    NativeUnavailable / NativeError as `dequant_device_many`.
    """
    from ..dequant.wrapper import DequantItem, DeviceBuffer, _View, dequant_device_many, split_by_type
    weights = list(weights)
    offsets, total = [], 0
    for wtype, _, n, k in weights:
        offsets.append(total)
        total += -(-int(n) * int(k) // 8) * 8
    if not offsets:
        raise ValueError("weights is empty")
    if scratch is None:
        scratch = DeviceBuffer(total, np.float16, device)
    sd = device_array(scratch, "scratch")
    if sd.typestr[1:] not in ("f2", "u2", "i2"):
        raise TypeError(f"scratch must hold 2-byte values, got {sd.typestr}")
    if sd.size < total:
        raise ValueError(f"scratch holds {sd.size} halves; the {len(offsets)} weights need {total}")
    views = tuple(_View(scratch, sd.ptr + 2 * off, int(n) * int(k), np.dtype(np.float16))
                  for off, (_, _, n, k) in zip(offsets, weights))
    items = [DequantItem(wtype, blocks, int(n), int(k), v)
             for (wtype, blocks, n, k), v in zip(weights, views)]
    runs = []
    for group in split_by_type(items):
        run = dequant_device_many(group, "f16", kernel=kernel, stream=stream, device=device)
        for it, sel in zip(group, run.selections):
            if sel.kernel is None:
                raise ValueError(f"weights[{items.index(it)}] ({parse_type(it.t).name}): no native "
                                 f"dequant kernel served it: {sel.reason}")
        runs.append(run)
    return LayerWeights(views, tuple(runs), scratch)


def gemm_host(route: str | None, x: np.ndarray, wtype, w_raw, n: int, k: int,
              scratch_elems: int | None = None, y: np.ndarray | None = None, beta: int = 0,
              ldy: int | None = None, kernel: str = "auto",
              device: int | None = None) -> np.ndarray:
    """Host convenience with the oracle's arguments (`routes.gemm.gemm_sliced`):
    copies X, W and Y to the GPU, runs `gemm_device`, returns Y (float32,
    T x ldy). route None/"auto" applies `select_route`. y is required for
    beta = 1; its columns [N, ldy) come back unchanged. Raises as `gemm_device`.
    """
    from ... import dequant as oracle
    from ..dequant.wrapper import DeviceBuffer
    x = np.ascontiguousarray(x)
    if x.ndim != 2 or x.dtype not in (np.float16, np.float32):
        raise TypeError(f"X must be a 2-D float32 or float16 array, got {x.dtype} {x.shape}")
    t = x.shape[0]
    ldy = n if ldy is None else int(ldy)
    if y is None:
        if beta:
            raise ValueError("beta=1 needs the Y to accumulate into")
        y = np.zeros((t, ldy), np.float32)
    if not isinstance(y, np.ndarray) or y.dtype != np.float32 or y.shape != (t, ldy):
        raise ValueError(f"Y must be float32 of shape ({t}, {ldy})")
    raw = oracle.as_bytes(w_raw)
    xb = DeviceBuffer(x.size, x.dtype, device)
    xb.upload(x)
    wb = DeviceBuffer(raw.size, np.uint8, device)
    wb.upload(raw)
    yb = DeviceBuffer(y.size, np.float32, device)
    yb.upload(y)
    gemm_device(wtype, wb, n, k, xb, yb, t=t, ldy=ldy, beta=beta, scratch_elems=scratch_elems,
                route=route, kernel=kernel, device=device)
    return yb.download().reshape(t, ldy)


def cublas_version(device: int | None = None) -> int:
    """cublasGetVersion of the device's handle (e.g. 130100 for 13.1.0)."""
    g = load_gemm(device)
    v = g.ffi.new("int *")
    _raise_status(g, g.lib.strata_gemm_cublas_version(g.ctx, v), "cublasGetVersion")
    return int(v[0])
