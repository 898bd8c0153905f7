"""Python entry points of the native dequant kernels.

`dequant_device` works on device arrays that export
`__cuda_array_interface__` (CuPy, numba device arrays, torch, or this
module's `DeviceBuffer`), without copies: it reads their pointers and hands
them to `strata_dequant` (native/strata_dequant.h). `dequant_device_many`
dequantizes up to 16 tensors of one type (a layer's projections) with one
wide-kernel launch (`strata_dequant_many`), for small tensors whose single
launches cost more latency than bandwidth. `dequant_host` is the
convenience for NumPy data: it copies the rows in, runs the kernel, copies the
result out, and falls back to the NumPy oracle (`strata_ref.dequant`) when no
kernel can serve the call.

The semantics are those of the oracle (`strata_ref.dequant.dequant`,
../shared/spec/kernels.md §2): output row r is tensor row row0 + r, value c
goes to out[r·ld + c], columns [cols, ld) are never written, NaNs canonical.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ...types import GGMLType, UnsupportedTypeError, block_format, parse_type
from ..cai import DeviceArray, device_array, stream_handle
from ..loader import Native, NativeUnavailable, load
from . import policy

__all__ = ["dequant_device", "dequant_device_many", "DequantItem", "ManyRun", "MANY_MAX",
           "split_by_type", "dequant_host", "f32_to_bf16_device", "f32_to_f16_device",
           "DeviceBuffer", "NativeError", "device_cc"]

_OUT_CODE = {"f32": 0, "f16": 1, "bf16": 2}
_OUT_SIZE = {"f32": 4, "f16": 2, "bf16": 2}
_KERNEL_CODE = {"generic": 0, "wide": 1}
_STATUS = {0: "ok", 1: "no kernel for this type and output dtype",
           2: "shape not served (rows/cols 0, cols % QK, ld < cols)", 3: "null pointer",
           4: "wide kernel guard failed (ld or pointer alignment)",
           5: "bad output dtype or kernel kind", 6: "CUDA error",
           7: "item count outside 1..STRATA_DEQUANT_MANY_MAX"}
#: Tensors per `dequant_device_many` call (STRATA_DEQUANT_MANY_MAX, native/strata_dequant.h).
MANY_MAX = 16


class NativeError(RuntimeError):
    """A CUDA call inside the native library failed (message has the CUDA error)."""


def _check(nat: Native, status: int, what: str) -> None:
    if status == 6:
        err = nat.lib.strata_last_cuda_error()
        text = nat.ffi.string(nat.lib.strata_cuda_error_string(err)).decode()
        raise NativeError(f"{what}: CUDA error {err} ({text})")
    if status != 0:
        raise NativeError(f"{what}: {_STATUS.get(status, status)}")


def device_cc(device: int | None = None) -> int:
    """Compute capability (major·10 + minor) the library was built for."""
    return load(device).cc


def _out_dtype(arr: DeviceArray, out_dtype: str | None) -> str:
    t = arr.typestr[1:]
    if t == "f4":
        kind = "f32"
    elif t == "f2":
        kind = "f16"
    elif t in ("u4", "i4"):
        if out_dtype != "f32":
            raise ValueError(f"out holds 4-byte integers ({arr.typestr}); pass out_dtype='f32' "
                             "to receive float32 bits")
        return out_dtype
    elif t in ("u2", "i2", "V2"):
        if out_dtype not in ("f16", "bf16"):
            raise ValueError(f"out holds 2-byte values of type {arr.typestr}; pass "
                             "out_dtype='f16' or 'bf16'")
        return out_dtype
    else:
        raise TypeError(f"out must hold float32, float16 or 2-byte bf16 bits, got {arr.typestr}")
    if out_dtype is not None and out_dtype != kind:
        raise ValueError(f"out_dtype={out_dtype!r} does not match out's dtype {arr.typestr}")
    return kind


def dequant_device(t, blocks, rows: int, cols: int, out, *, row0: int = 0,
                   ld: int | None = None, out_dtype: str | None = None, stream=None,
                   kernel: str = "auto", device: int | None = None) -> policy.Selection:
    """Dequantize rows [row0, row0 + rows) of a quantized tensor on the GPU.

    t: ggml type (GGMLType, id or name). blocks: device uint8 array, C-
    contiguous, holding the tensor from row 0 (at least (row0 + rows) rows of
    (cols/QK)·B bytes). out: device array, C-contiguous, of float32, float16
    or 2-byte bf16 bits (uint16; then out_dtype="bf16"), with at least
    (rows − 1)·ld + cols elements (uint32 with out_dtype="f32" receives the
    float32 bits). ld: output row stride in elements
    (default cols). stream: None (legacy default stream), an int handle or a
    stream object with `.ptr` (CuPy). kernel: "auto" (policy.select with
    this device's compute capability and os.environ), or "generic" / "wide"
    to force one (no fallback).

    Returns the Selection that ran; `kernel is None` means nothing was
    launched (the type or shape is not served natively, or a forced wide
    kernel's guard failed) and the caller should use the NumPy path.
    The launch is asynchronous on `stream`.

    Raises TypeError / ValueError for arrays of the wrong kind or size,
    NativeUnavailable when the library cannot be loaded, NativeError when a
    CUDA call fails.
    """
    nat = load(device)
    b = device_array(blocks, "blocks")
    o = device_array(out, "out", writable=True)
    if b.typestr[1:] not in ("u1", "i1"):
        raise TypeError(f"blocks must be a uint8 device array, got {b.typestr}")
    kind = _out_dtype(o, out_dtype)
    rows, cols, row0 = int(rows), int(cols), int(row0)
    ld = cols if ld is None else int(ld)
    try:
        fmt = block_format(parse_type(t))
    except UnsupportedTypeError as e:
        return policy.Selection(None, f"no kernel: {e}")
    tt = fmt.type
    if kernel == "auto":
        sel = policy.warn_once(policy.select(nat.cc, tt, rows, cols, ld, b.ptr, o.ptr,
                                                 kind, os.environ))
    elif kernel in _KERNEL_CODE:
        sel = policy.Selection(kernel, "forced")
    else:
        raise ValueError(f"kernel must be 'auto', 'generic' or 'wide', got {kernel!r}")
    if sel.kernel is None:
        return sel
    if rows <= 0 or cols <= 0 or row0 < 0 or ld < cols or cols % fmt.block_values:
        return policy.Selection(None, f"shape not served (rows={rows}, cols={cols}, "
                                        f"row0={row0}, ld={ld})")
    row_bytes = cols // fmt.block_values * fmt.block_bytes
    if (row0 + rows) * row_bytes > b.nbytes:
        raise ValueError(f"blocks holds {b.nbytes} bytes; rows [{row0}, {row0 + rows}) of "
                         f"{row_bytes} bytes each need {(row0 + rows) * row_bytes}")
    need = (rows - 1) * ld + cols
    if o.size < need:
        raise ValueError(f"out holds {o.size} values; rows={rows}, cols={cols}, ld={ld} "
                         f"need {need}")
    st = nat.lib.strata_dequant(int(tt), nat.ffi.cast("void *", b.ptr), row0, rows, cols, ld,
                                _OUT_CODE[kind], nat.ffi.cast("void *", o.ptr),
                                _KERNEL_CODE[sel.kernel],
                                nat.ffi.cast("void *", stream_handle(stream)))
    if st in (1, 2, 4):
        return policy.Selection(None, f"{sel.kernel} kernel: {_STATUS[st]}", sel.warning)
    _check(nat, st, f"dequant {tt.name}")
    return sel


@dataclass(frozen=True, eq=False)     # compared by identity: it holds device arrays
class DequantItem:
    """One tensor of a `dequant_device_many` call, with the arguments of
    `dequant_device`: t (ggml type: GGMLType, id or name), blocks (device
    uint8 array holding the tensor from row 0), rows, cols, out (device
    array of the call's output dtype, at least (rows − 1)·ld + cols
    elements), row0 (first tensor row, default 0), ld (output row stride in
    elements, default cols)."""
    t: object
    blocks: object
    rows: int
    cols: int
    out: object
    row0: int = 0
    ld: int | None = None


@dataclass(frozen=True)
class ManyRun:
    """What `dequant_device_many` ran. selections: per item, the Selection
    that served it (kernel None: nothing was launched for it, use the NumPy
    path). grouped: indices of the items dequantized together by the one
    wide launch. reason: why, in words."""
    selections: tuple
    grouped: tuple
    reason: str

    @property
    def one_launch(self) -> bool:
        """True when every item went through the one wide launch."""
        return len(self.grouped) == len(self.selections)


@dataclass(frozen=True)
class _Checked:
    b: DeviceArray
    o: DeviceArray
    rows: int
    cols: int
    row0: int
    ld: int


def _int_arg(name: str, v) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{name} must be an integer, got {v!r}")
    return int(v)


def _item_type(i: int, it) -> GGMLType:
    if not isinstance(it, DequantItem):
        raise TypeError(f"items[{i}] must be a DequantItem, got {type(it).__name__}")
    try:
        return block_format(parse_type(it.t)).type
    except UnsupportedTypeError as e:
        raise UnsupportedTypeError(f"items[{i}]: {e}") from None


def _check_item(i: int, it: DequantItem, fmt, kind: str | None) -> tuple[_Checked, str]:
    w = f"items[{i}]"
    rows, cols, row0 = (_int_arg(f"{w}.{n}", getattr(it, n)) for n in ("rows", "cols", "row0"))
    ld = cols if it.ld is None else _int_arg(f"{w}.ld", it.ld)
    if rows <= 0 or cols <= 0 or row0 < 0:
        raise ValueError(f"{w}: rows={rows} and cols={cols} must be positive, row0={row0} >= 0")
    if ld < cols:
        raise ValueError(f"{w}: ld={ld} < cols={cols}")
    if cols % fmt.block_values:
        raise ValueError(f"{w}: cols={cols} is not a multiple of {fmt.type.name}'s "
                         f"QK={fmt.block_values}")
    b = device_array(it.blocks, f"{w}.blocks")
    if b.typestr[1:] not in ("u1", "i1"):
        raise TypeError(f"{w}.blocks must be a uint8 device array, got {b.typestr}")
    row_bytes = cols // fmt.block_values * fmt.block_bytes
    if (row0 + rows) * row_bytes > b.nbytes:
        raise ValueError(f"{w}.blocks holds {b.nbytes} bytes; rows [{row0}, {row0 + rows}) of "
                         f"{row_bytes} bytes each need {(row0 + rows) * row_bytes}")
    o = device_array(it.out, f"{w}.out", writable=True)
    try:
        kind = _out_dtype(o, kind)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{w}.out: {e}") from None
    if o.size < (rows - 1) * ld + cols:
        raise ValueError(f"{w}.out holds {o.size} values; rows={rows}, cols={cols}, ld={ld} "
                         f"need {(rows - 1) * ld + cols}")
    return _Checked(b, o, rows, cols, row0, ld), kind


def _check_many(items, out_dtype: str | None):
    """(type, output dtype, checked items) of a `dequant_device_many` call;
    no GPU needed. Raises as documented there."""
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"items must be a list or tuple of DequantItem, got {type(items).__name__}")
    if not items:
        raise ValueError(f"items is empty: give 1 to {MANY_MAX} tensors")
    if len(items) > MANY_MAX:
        raise ValueError(f"{len(items)} items; one call takes at most {MANY_MAX} "
                         "(STRATA_DEQUANT_MANY_MAX): split the list (split_by_type)")
    if out_dtype is not None and out_dtype not in _OUT_CODE:
        raise ValueError(f"out_dtype must be one of {tuple(_OUT_CODE)}, got {out_dtype!r}")
    types = [_item_type(i, it) for i, it in enumerate(items)]
    for i, tt in enumerate(types):
        if tt != types[0]:
            raise ValueError(f"items hold mixed types: items[0] is {types[0].name}, items[{i}] "
                             f"is {tt.name}; one call per type (split_by_type)")
    fmt = block_format(types[0])
    checked, kind = [], out_dtype
    for i, it in enumerate(items):
        c, kind = _check_item(i, it, fmt, kind)
        checked.append(c)
    return types[0], kind, checked


def split_by_type(items) -> list[list[DequantItem]]:
    """`items` grouped by ggml type, in order of first appearance, each group
    cut into lists of at most MANY_MAX: the `dequant_device_many` calls for
    a layer whose projections have mixed types. Raises TypeError /
    UnsupportedTypeError for a non-DequantItem or an unknown type."""
    groups: dict[GGMLType, list[DequantItem]] = {}
    for i, it in enumerate(items):
        groups.setdefault(_item_type(i, it), []).append(it)
    return [g[j:j + MANY_MAX] for g in groups.values() for j in range(0, len(g), MANY_MAX)]


def dequant_device_many(items, out_dtype: str | None = None, *, kernel: str = "auto",
                        stream=None, device: int | None = None) -> ManyRun:
    """Dequantize several tensors of one ggml type with one wide-kernel launch.

    items: list or tuple of 1 … MANY_MAX (16) `DequantItem`s, all of one type;
    each item behaves exactly as `dequant_device(item.t, item.blocks,
    item.rows, item.cols, item.out, row0=item.row0, ld=item.ld)` (rows
    [row0, row0 + rows) of its tensor, value c of output row r at
    out[r·ld + c], columns [cols, ld) never written), bit for bit: the
    launch (`strata_dequant_many`, native/strata_dequant.h) runs the
    single-tensor wide kernel's device code for each tensor. out_dtype:
    "f32", "f16", "bf16" or None (from the first item's out array, which
    then fixes it for all). Outputs must not overlap. kernel:
    * "auto": each item's kernel by `policy.select` (this device's compute
      capability, os.environ: Q8_0 wide whenever its guard holds, the
      K-quants and IQ4_XS wide on 6.1 or with STRATA_DEQUANT_WIDE=1); the
      items that select the wide kernel share one launch, every other item
      gets its own `dequant_device` launch (generic kernel, or none);
    * "wide": all items in one wide launch, or, when the type has no wide
      kernel or an item fails its wide guard (ld % 8, Q8_0's ld == cols,
      pointer alignment), nothing is launched and every selection is None.
    Asynchronous on `stream`. Returns the ManyRun.

    Raises TypeError / ValueError before anything runs (no GPU needed) for:
    items not a list/tuple of DequantItem, 0 or more than MANY_MAX items,
    unknown type (UnsupportedTypeError), mixed types, rows/cols <= 0,
    row0 < 0, ld < cols, cols not a multiple of QK, blocks not uint8 or too
    short, out of the wrong dtype or too short, out dtypes that differ, a
    bad kernel or out_dtype. NativeUnavailable without the library,
    NativeError when CUDA fails.
    """
    if kernel not in ("auto", "wide"):
        raise ValueError(f"kernel must be 'auto' or 'wide', got {kernel!r} (the one-launch path "
                         "exists for the wide kernels)")
    tt, kind, args = _check_many(items, out_dtype)
    nat = load(device)
    env = {policy.ENV_WIDE: "1"} if kernel == "wide" else os.environ
    sels = [policy.select(nat.cc, tt, a.rows, a.cols, a.ld, a.b.ptr, a.o.ptr, kind, env)
            for a in args]
    if kernel == "auto":
        sels = [policy.warn_once(s) for s in sels]
    grouped = tuple(i for i, s in enumerate(sels) if s.kernel == "wide")
    other = [i for i in range(len(args)) if i not in grouped]
    if kernel == "wide" and other:
        why = f"items[{other[0]}]: {sels[other[0]].reason}; nothing launched"
        return ManyRun(tuple(policy.Selection(None, why) for _ in args), (), why)
    if grouped:
        _launch_many(nat, tt, kind, [args[i] for i in grouped], grouped, stream)
    for i in other:
        if sels[i].kernel is not None:
            it, a = items[i], args[i]
            ran = dequant_device(tt, it.blocks, a.rows, a.cols, it.out, row0=a.row0, ld=a.ld,
                                 out_dtype=kind, stream=stream, kernel=sels[i].kernel,
                                 device=device)
            if ran.kernel is None:           # the library refused it: say why
                sels[i] = ran
    if not other:
        why = f"one wide launch for {len(args)} {tt.name} tensors"
    else:
        why = (f"{len(grouped)} of {len(args)} {tt.name} tensors in one wide launch; "
               f"items[{other[0]}]: {sels[other[0]].reason} (launched alone)")
    return ManyRun(tuple(sels), grouped, why)


def _launch_many(nat: Native, tt: GGMLType, kind: str, args: list, index: tuple,
                 stream) -> None:
    ffi = nat.ffi
    arr = ffi.new("strata_dequant_item[]", len(args))
    for k, a in enumerate(args):
        arr[k].blocks = ffi.cast("void *", a.b.ptr)
        arr[k].out = ffi.cast("void *", a.o.ptr)
        arr[k].row0, arr[k].rows, arr[k].cols, arr[k].ld = a.row0, a.rows, a.cols, a.ld
    bad = ffi.new("int *")
    st = nat.lib.strata_dequant_many(int(tt), arr, len(args), _OUT_CODE[kind], bad,
                                     ffi.cast("void *", stream_handle(stream)))
    if st not in (0, 6):
        # The checks above mirror api.cu's, so a refusal here is a bug of one side.
        where = f"items[{index[bad[0]]}]" if 0 <= bad[0] < len(index) else "the call"
        raise NativeError(f"strata_dequant_many {tt.name} refused {where}: "
                          f"{_STATUS.get(st, st)}")
    _check(nat, st, f"dequant_many {tt.name}")


def _convert(fn_name: str, src, dst, stream) -> None:
    nat = load()
    s, d = device_array(src, "in"), device_array(dst, "out", writable=True)
    if s.typestr[1:] != "f4":
        raise TypeError(f"input must be float32, got {s.typestr}")
    if d.nbytes < 2 * s.size:
        raise ValueError(f"output holds {d.nbytes} bytes; {s.size} values need {2 * s.size}")
    if s.size == 0:
        return
    fn = getattr(nat.lib, fn_name)
    _check(nat, fn(nat.ffi.cast("void *", s.ptr), nat.ffi.cast("void *", d.ptr), s.size,
                   nat.ffi.cast("void *", stream_handle(stream))), fn_name)


def f32_to_bf16_device(src, dst, stream=None) -> None:
    """Elementwise float32 -> bf16 bits on the GPU, ggml's rule (NaN payload
    kept, quiet bit forced; RNE on bit 16). src: float32 device array;
    dst: 2-byte device array with at least src.size elements."""
    _convert("strata_f32_to_bf16", src, dst, stream)


def f32_to_f16_device(src, dst, stream=None) -> None:
    """Elementwise float32 -> fp16 bits on the GPU (`__float2half_rn`, every
    NaN -> 0x7FFF). src: float32 device array; dst: 2-byte device array."""
    _convert("strata_f32_to_f16", src, dst, stream)


class DeviceBuffer:
    """A cudaMalloc'd device buffer with `__cuda_array_interface__` (1-D,
    `dtype`, `size` elements), freed when garbage-collected. For hosts with
    no CuPy: the host convenience and the parity tool use it."""

    def __init__(self, size: int, dtype, device: int | None = None):
        self.dtype = np.dtype(dtype)
        self.size = int(size)
        if self.size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        self._nat = load(device)
        p = self._nat.ffi.new("void **")
        _check(self._nat, self._nat.lib.strata_malloc(p, self.size * self.dtype.itemsize),
               "cudaMalloc")
        self.ptr = int(self._nat.ffi.cast("uintptr_t", p[0]))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        ts = self.dtype.str if self.dtype.kind != "V" else f"<V{self.dtype.itemsize}"
        return {"shape": (self.size,), "typestr": ts, "data": (self.ptr, False),
                "version": 3, "strides": None}

    def view(self, offset_bytes: int, size: int, dtype) -> "_View":
        """A device-array view of `size` elements of `dtype` starting
        `offset_bytes` into this buffer (for misaligned-pointer tests)."""
        dt = np.dtype(dtype)
        if offset_bytes < 0 or offset_bytes + size * dt.itemsize > self.nbytes:
            raise ValueError("view beyond the buffer")
        return _View(self, self.ptr + offset_bytes, size, dt)

    def upload(self, host: np.ndarray, offset_bytes: int = 0) -> None:
        a = np.ascontiguousarray(host)
        if offset_bytes + a.nbytes > self.nbytes:
            raise ValueError(f"{a.nbytes} bytes do not fit at offset {offset_bytes}")
        _check(self._nat, self._nat.lib.strata_memcpy_htod(
            self._nat.ffi.cast("void *", self.ptr + offset_bytes),
            self._nat.ffi.from_buffer(a), a.nbytes), "cudaMemcpy HtoD")

    def download(self, dtype=None, size: int | None = None, offset_bytes: int = 0) -> np.ndarray:
        dt = self.dtype if dtype is None else np.dtype(dtype)
        n = (self.nbytes - offset_bytes) // dt.itemsize if size is None else int(size)
        host = np.empty(n, dt)
        _check(self._nat, self._nat.lib.strata_memcpy_dtoh(
            self._nat.ffi.from_buffer(host),
            self._nat.ffi.cast("void *", self.ptr + offset_bytes), host.nbytes),
            "cudaMemcpy DtoH")
        return host

    def fill_bytes(self, value: int) -> None:
        _check(self._nat, self._nat.lib.strata_memset(
            self._nat.ffi.cast("void *", self.ptr), value, self.nbytes), "cudaMemset")

    def __del__(self):
        ptr, nat = getattr(self, "ptr", 0), getattr(self, "_nat", None)
        if ptr and nat is not None:
            nat.lib.strata_free(nat.ffi.cast("void *", ptr))
            self.ptr = 0


class _View:
    def __init__(self, owner: DeviceBuffer, ptr: int, size: int, dtype: np.dtype):
        self._owner, self.ptr, self.size, self.dtype = owner, ptr, size, dtype

    @property
    def __cuda_array_interface__(self) -> dict:
        ts = self.dtype.str if self.dtype.kind != "V" else f"<V{self.dtype.itemsize}"
        return {"shape": (self.size,), "typestr": ts, "data": (self.ptr, False),
                "version": 3, "strides": None}


def dequant_host(t, blocks, rows: int, cols: int, row0: int = 0, ld: int | None = None,
                 out_dtype: str = "f32", kernel: str = "auto",
                 device: int | None = None) -> np.ndarray:
    """Host convenience: dequantize with the GPU, copying in and out.

    Arguments as `strata_ref.dequant.dequant` (blocks: bytes or a uint8 array
    holding the tensor from row 0). Returns a (rows, ld) array of float32,
    float16 or ml_dtypes.bfloat16; columns [cols, ld) are zero. When no
    kernel can serve the call it returns the NumPy oracle's result instead.
    Raises NativeUnavailable when there is no GPU path at all.
    """
    from ... import dequant as oracle
    tt = parse_type(t)
    fmt = block_format(tt)
    ld = cols if ld is None else int(ld)
    raw = oracle.as_bytes(blocks)
    if rows <= 0 or cols % fmt.block_values or ld < cols or tt not in policy.GENERIC_TYPES:
        return oracle.dequant(tt, raw, rows, cols, row0, ld, None, out_dtype)
    row_bytes = cols // fmt.block_values * fmt.block_bytes
    if raw.size % fmt.block_bytes or (row0 + rows) * row_bytes > raw.size:
        return oracle.dequant(tt, raw, rows, cols, row0, ld, None, out_dtype)  # raises
    src = np.ascontiguousarray(raw[row0 * row_bytes:(row0 + rows) * row_bytes])
    dbuf = DeviceBuffer(src.size, np.uint8, device)
    dbuf.upload(src)
    odt = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[out_dtype]
    obuf = DeviceBuffer(rows * ld, odt, device)
    obuf.fill_bytes(0)
    sel = dequant_device(tt, dbuf, rows, cols, obuf, ld=ld, out_dtype=out_dtype,
                         kernel=kernel, device=device)
    if sel.kernel is None:
        return oracle.dequant(tt, raw, rows, cols, row0, ld, None, out_dtype)
    _check(obuf._nat, obuf._nat.lib.strata_synchronize(), "cudaDeviceSynchronize")
    res = obuf.download().reshape(rows, ld)
    return res.view(oracle.OUT_DTYPES[out_dtype])
