"""Load libstrata_dequant with cffi in ABI mode; what every native library's loader shares.

The declarations are the `cdef` block of native/strata_dequant.h, read from
the header itself (`build.cdef_text`), so the ABI is stated once. `load()`
finds the GPU's compute capability through the CUDA driver (libcuda, also
via cffi), builds or reuses the cached library (`build.build(build.DEQUANT,
cc)`) and dlopens it. Every failure is a `NativeUnavailable` with a message
saying what is missing; callers fall back to the NumPy path. The GEMM and
mat-vec libraries (`gemm.wrapper.load_gemm`, `mmvq.wrapper.load_mmvq`) load
the same way through `open_library`, `driver_compute_capability` and `env_device`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from . import build as _build

__all__ = ["NativeUnavailable", "Native", "load", "cdef_text", "driver_compute_capability", "env_device",
           "unavailable_line", "new_ffi", "open_library"]


class NativeUnavailable(RuntimeError):
    """The native path cannot run here (no cffi, nvcc, GPU or driver)."""


def unavailable_line(tool: str, reason) -> str:
    """The line a command prints on stderr when the native path cannot run:
    `strata-ref: error: TOOL: native path unavailable: REASON`, the form of
    every other `strata-ref` error. TOOL names the command (`parity mmvq`,
    `hash --device cuda`); a REASON of several lines (a failed build with
    the compiler's output) is joined into one with " | ", and characters a
    terminal would act on are escaped."""
    from .._text import printable
    text = " | ".join(line.strip() for line in str(reason).splitlines() if line.strip())
    return f"strata-ref: error: {tool}: native path unavailable: {printable(text, backslash=False)}"


@dataclass(frozen=True)
class Native:
    """A loaded library: `ffi` (cffi.FFI), `lib` (its functions), `cc`
    (compute capability as major·10 + minor of the device it was built for),
    `path` (the .so)."""
    ffi: object
    lib: object
    cc: int
    path: str


def cdef_text() -> str:
    """The plain-C declarations between the cdef markers of strata_dequant.h."""
    try:
        return _build.cdef_text("strata_dequant.h")
    except _build.BuildError as e:
        raise NativeUnavailable(str(e)) from None


def open_library(library: "_build.Library", cc: int, header: str, path=None):
    """Build `library` for compute capability `cc` (or take the prebuilt
    `path`), read its cdef from native/`header` and open it with cffi.
    Returns (ffi, handle, path). Raises NativeUnavailable with the reason:
    a failed build, a missing header, no cffi, or a library dlopen refuses."""
    try:
        path = path or _build.build(library, cc)
        cdef = _build.cdef_text(header)
    except _build.BuildError as e:
        raise NativeUnavailable(str(e)) from None
    ffi = new_ffi()
    ffi.cdef(cdef)
    try:
        return ffi, ffi.dlopen(str(path)), path
    except OSError as e:
        raise NativeUnavailable(f"cannot load {path}: {e}") from None


def new_ffi():
    """A new cffi.FFI; NativeUnavailable when cffi is not installed."""
    try:
        import cffi
    except ImportError:
        raise NativeUnavailable(
            "cffi is not installed (pip install cffi; on a machine without a "
            "registry, carry its wheel: see docs/native.md)") from None
    return cffi.FFI()


def driver_compute_capability(device: int = 0) -> int:
    """major·10 + minor of CUDA device `device`, read from the driver API
    (libcuda: cuInit, cuDeviceGet, cuDeviceGetAttribute 75/76).
    Raises NativeUnavailable when there is no driver or no such device."""
    f = new_ffi()
    f.cdef("int cuInit(unsigned int flags);"
             "int cuDeviceGetCount(int *count);"
             "int cuDeviceGet(int *device, int ordinal);"
             "int cuDeviceGetAttribute(int *pi, int attrib, int dev);")
    try:
        cu = f.dlopen("libcuda.so.1")
    except OSError as e:
        raise NativeUnavailable(f"no CUDA driver (libcuda.so.1): {e}") from None
    if cu.cuInit(0) != 0:
        raise NativeUnavailable("cuInit failed: no usable CUDA device")
    n = f.new("int *")
    if cu.cuDeviceGetCount(n) != 0 or n[0] <= device:
        raise NativeUnavailable(f"CUDA device {device} not present ({n[0]} devices)")
    dev, major, minor = f.new("int *"), f.new("int *"), f.new("int *")
    if (cu.cuDeviceGet(dev, device) != 0
            or cu.cuDeviceGetAttribute(major, 75, dev[0]) != 0      # COMPUTE_CAPABILITY_MAJOR
            or cu.cuDeviceGetAttribute(minor, 76, dev[0]) != 0):    # COMPUTE_CAPABILITY_MINOR
        raise NativeUnavailable(f"cannot read the compute capability of device {device}")
    return 10 * major[0] + minor[0]


_LOCK = threading.Lock()
_CACHE: dict[int, Native] = {}


def env_device() -> int:
    """The CUDA device number in $STRATA_REF_DEVICE (default 0, also when it
    is empty). Raises NativeUnavailable naming the variable when it is not a
    number >= 0."""
    from .._env import env_value
    v = env_value("STRATA_REF_DEVICE") or "0"
    try:
        d = int(v)
    except ValueError:
        d = -1
    if d < 0:
        raise NativeUnavailable(f"STRATA_REF_DEVICE={v!r} is not a CUDA device number (0, 1, ...)")
    return d


def load(device: int | None = None) -> Native:
    """The loaded library for CUDA device `device` (default: $STRATA_REF_DEVICE
    or 0), building it on first use. Raises NativeUnavailable with the reason."""
    if device is None:
        device = env_device()
    with _LOCK:
        if device in _CACHE:
            return _CACHE[device]
        cc = driver_compute_capability(device)
        f, lib, path = open_library(_build.DEQUANT, cc, "strata_dequant.h")
        if lib.strata_set_device(device) != 0:
            raise NativeUnavailable(f"cudaSetDevice({device}) failed")
        native = Native(f, lib, cc, str(path))
        _CACHE[device] = native
        return native
