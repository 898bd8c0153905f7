"""Optional CUDA kernels, built with nvcc and loaded with cffi.

One folder per kernel family, each with the same modules (`policy`: the
selection as a pure function, `wrapper`: load and entry points, `parity`:
bitwise against the oracle, `bench`): `dequant` (generic and wide dequant
kernels), `gemm` (the cuBLAS prompt-path routes), `mmvq` (q8_1 mat-vec and
MoE experts). Shared by all: `build` (the one nvcc build function and the
library declarations), `loader` (driver queries, the dequant library),
`cai` (device arrays and streams of other libraries); `hash_device` is
`strata-ref hash --device cuda`.

* `available()` says whether the native path can run here (cffi, nvcc or a
  cached build, a CUDA GPU); `unavailable_reason()` says why not.
* `select(...)` is the dequant kernel-selection policy as a pure function
  (`dequant.policy.select`; no GPU needed).
* `dequant_device(...)` runs on `__cuda_array_interface__` arrays;
  `dequant_host(...)` copies NumPy data in and out (falling back to the NumPy
  oracle when no kernel serves the call).

Nothing here is imported by the rest of strata_ref unless asked for: without
a GPU, the NumPy path keeps working. Build and kernel details:
docs/native.md and ../shared/spec/kernels.md §§2-5, 12.
"""
from __future__ import annotations

from .dequant.policy import Selection, select
from .loader import NativeUnavailable

__all__ = ["available", "unavailable_reason", "select", "Selection", "NativeUnavailable",
           "dequant_device", "dequant_host", "f32_to_bf16_device", "f32_to_f16_device",
           "DeviceBuffer", "NativeError", "dequant_device_many", "DequantItem", "ManyRun",
           "split_by_type"]


def unavailable_reason() -> str | None:
    """None when the native library loads on this machine, else the reason
    (no cffi, no CUDA driver or GPU, no nvcc, a failed build). The first call
    may build the library (nvcc, tens of seconds)."""
    from .loader import load
    try:
        load()
    except NativeUnavailable as e:
        return str(e)
    return None


def available() -> bool:
    """True when the native kernels can run here (see unavailable_reason)."""
    return unavailable_reason() is None


def __getattr__(name):
    # The wrappers import numpy-side helpers lazily, keeping `import
    # strata_ref.native` cheap and GPU-free.
    if name in ("dequant_device", "dequant_host", "f32_to_bf16_device", "f32_to_f16_device",
                "DeviceBuffer", "NativeError", "dequant_device_many", "DequantItem", "ManyRun",
                "split_by_type"):
        from .dequant import wrapper
        return getattr(wrapper, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
