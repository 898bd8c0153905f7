"""Device arrays and streams of other libraries, read once for every kernel family.

`device_array(a, name)` reads an object's `__cuda_array_interface__`
(CuPy, numba device arrays, torch, `dequant.wrapper.DeviceBuffer`; protocol
version 3, https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html)
into a `DeviceArray`: pointer, shape, typestr, element count and bytes. Only
C-contiguous arrays are accepted (the kernels take a pointer and a length),
and an output must not be marked read-only. `stream_handle(s)` turns None,
an int or a stream object into the raw `cudaStream_t` value.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DeviceArray", "device_array", "stream_handle"]


@dataclass(frozen=True)
class DeviceArray:
    """`ptr` (int), `shape` (tuple of int), `typestr` (e.g. "<f4", "<V2"),
    `size` (elements), `nbytes`."""
    ptr: int
    shape: tuple
    typestr: str
    size: int
    nbytes: int


def device_array(a, name: str, *, writable: bool = False) -> DeviceArray:
    """The device array `a` exports. `name` is the argument's name in error
    messages; `writable`: `a` is an output, so a read-only export is refused.
    Raises TypeError when `a` exports no `__cuda_array_interface__`,
    ValueError when it is not C-contiguous or is a read-only output."""
    try:
        cai = a.__cuda_array_interface__
    except AttributeError:
        raise TypeError(f"{name} must export __cuda_array_interface__ (a device array), "
                        f"got {type(a).__name__}") from None
    shape = tuple(int(s) for s in cai["shape"])
    typestr = cai["typestr"]
    item = np.dtype(typestr).itemsize if typestr[1] != "V" else int(typestr[2:])
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    strides = cai.get("strides")
    if strides is not None and size > 1:
        acc = item
        for n, s in zip(reversed(shape), reversed(tuple(strides))):
            if n > 1 and s != acc:
                raise ValueError(f"{name} must be C-contiguous (strides {strides})")
            acc *= n
    ptr, readonly = cai["data"]
    if readonly and writable:
        raise ValueError(f"{name} is read-only")
    return DeviceArray(int(ptr), shape, typestr, size, size * item)


def stream_handle(stream) -> int:
    """The `cudaStream_t` of `stream`: None -> 0 (the legacy default stream),
    an int as it is, or a stream object's `ptr`, `handle` or `cuda_stream`
    attribute (CuPy, numba, torch). Raises TypeError for anything else."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("ptr", "handle", "cuda_stream"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream must be None, an int handle or a stream object, got {stream!r}")
