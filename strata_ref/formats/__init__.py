"""The oracle: one module per format family, each format registered by type.

A format module declares, for each of its types, a numba-compiled *block
function* `dequant_<type>(b, y)`: `b` is one block's bytes (uint8[B], the
layout of `strata_ref.types.block_format`), `y` the block's QK float32
outputs. The body is the formula of ../shared/spec/formats.md §5, written in
C operation order (float32 arithmetic, products in the C order), so that the
result is ggml's `dequantize_row_*` bit for bit on valid data.

This package runs the block functions over tensors (`dequantize_blocks`),
in parallel over blocks, and applies the NaN policy of ../shared/DESIGN.md:
every NaN output becomes the canonical float32 NaN 0x7FFFFFFF.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import numpy as np
from numba import njit, prange

from .._jitcache import cached, sources_digest
from ..types import PLAIN_FLOAT_TYPES, GGMLType, UnsupportedTypeError, block_format, parse_type
from . import _stream
from ._stream import sfence, stream4

__all__ = ["register_dequant", "register_quantize", "register_chunk_quantize",
           "dequantize_blocks", "dequant_types", "quantize_types", "chunk_quantize_types",
           "oracle_types", "get_quantizer"]

_DEQUANT: dict[GGMLType, Callable] = {}
_DRIVERS: dict[GGMLType, Callable] = {}
_QUANT: dict[GGMLType, Callable] = {}
_CHUNK_QUANT: dict[GGMLType, Callable] = {}
_LOCK = threading.Lock()

# float32 whose bits are the canonical NaN; assigned by load/store, which
# keeps the payload (a float literal might not).
_CANON = np.array([0x7FFFFFFF], dtype=np.uint32).view(np.float32)


def register_dequant(t: GGMLType):
    """Decorator: register a numba block function `fn(b, y)` for type `t`."""
    def deco(fn):
        _DEQUANT[GGMLType(t)] = fn
        return fn
    return deco


def register_quantize(t: GGMLType):
    """Decorator: register a quantizer `fn(x: float32[n, QK]) -> uint8[n, B]`."""
    def deco(fn):
        _QUANT[GGMLType(t)] = fn
        return fn
    return deco


def register_chunk_quantize(t: GGMLType):
    """Decorator: register `fn(x: float32[n, QK]) -> uint8[n, B]` as type
    `t`'s quantizer when ggml's only way to make `t` without an importance
    matrix is `ggml_quantize_chunk` (no `from_float_ref` in its type traits:
    IQ1_M). Not used by `strata_ref.quantize`; the quantizer vectors cover it."""
    def deco(fn):
        _CHUNK_QUANT[GGMLType(t)] = fn
        return fn
    return deco


_CHUNK = 512   # blocks per parallel work item: amortises the scheduling cost

#: Below this many output values a call runs the serial driver: starting
#: numba's thread pool costs microseconds on an idle machine but whole
#: scheduler time slices (measured: about 7 ms a call) on a loaded one,
#: where the pool's second thread must wait for a core; the golden corpus
#: makes thousands of such small calls.
SERIAL_VALUES = 1 << 16


#: From this many output values on, a call into a caller's output that
#: allows it streams its stores past the cache (formats._stream). Below,
#: the output stays in cache and ordinary stores are faster. Measured on the
#: project's 2-vCPU Xeon (4 MiB L2, a large shared L3), one thread, Q4_K /
#: Q8_0 into a preallocated output, streamed vs ordinary M values/s: 4 Mi
#: values 3843 / 4328 and 3314 / 3723, 8 Mi 3936 / 4304 and 3334 / 3641,
#: 10 Mi 3829 / 3310 and 3110 / 2577, 16 Mi 3903 / 2101 and 3292 / 2083.
STREAM_VALUES = 9 << 20


def _digest() -> str:
    # Everything a driver inlines: this package's modules (block functions,
    # field readers, tables), numerics (the fp16 table), types (offsets) and
    # blocks (the integer rules).
    here = Path(__file__).resolve().parent
    return sources_digest(here, here.parent / "numerics.py", here.parent / "types.py",
                          here.parent / "blocks.py")


def _make_driver(block_fn, name: str):
    # One driver per format with the block function as a closure constant, so
    # numba inlines it; passed as an argument it would be a real call per
    # block (views built and reference-counted), about 2x slower.
    @njit(inline="always")
    def chunk(blocks, out, canon, c):
        # blocks: (R, NB, B) uint8; out: (R, NB, QK) float32, any strides.
        nb = blocks.shape[1]
        qk = out.shape[2]
        total = blocks.shape[0] * nb
        k0 = c * _CHUNK
        r = k0 // nb
        i = k0 - r * nb
        for _ in range(k0, min(total, k0 + _CHUNK)):
            y = out[r, i]
            block_fn(blocks[r, i], y)
            # NaNs come only from non-finite scales: test the block with
            # a branch-free reduction, rewrite it only when one is there.
            bad = False
            for j in range(qk):
                bad |= y[j] != y[j]
            if bad:
                for j in range(qk):
                    if y[j] != y[j]:
                        y[j] = canon[0]
            # the next block without a division per block (measured: Q8_0
            # 1.2x faster)
            i += 1
            if i == nb:
                i = 0
                r += 1

    @njit(inline="always")
    def chunk_stream(blocks, out, canon, c):
        # As chunk, through an L1-resident block of scratch that is then
        # streamed to `out` (formats._stream); out[r, i] contiguous and
        # 16-byte aligned, QK a multiple of 4.
        nb = blocks.shape[1]
        qk = out.shape[2]
        total = blocks.shape[0] * nb
        tmp = np.empty(qk, np.float32)
        k0 = c * _CHUNK
        r = k0 // nb
        i = k0 - r * nb
        for _ in range(k0, min(total, k0 + _CHUNK)):
            block_fn(blocks[r, i], tmp)
            bad = False
            for j in range(qk):
                bad |= tmp[j] != tmp[j]
            if bad:
                for j in range(qk):
                    if tmp[j] != tmp[j]:
                        tmp[j] = canon[0]
            y = out[r, i]
            for j in range(0, qk, 4):
                stream4(y, tmp, j)
            i += 1
            if i == nb:
                i = 0
                r += 1
        sfence()

    def drive_stream(blocks, out, canon):
        for c in prange((blocks.shape[0] * blocks.shape[1] + _CHUNK - 1) // _CHUNK):
            chunk_stream(blocks, out, canon, c)

    def drive(blocks, out, canon):
        for c in prange((blocks.shape[0] * blocks.shape[1] + _CHUNK - 1) // _CHUNK):
            chunk(blocks, out, canon, c)

    def drive_serial(blocks, out, canon):
        for c in range((blocks.shape[0] * blocks.shape[1] + _CHUNK - 1) // _CHUNK):
            chunk(blocks, out, canon, c)

    drivers = []
    for fn, parallel, what in ((drive, True, "drive"), (drive_serial, False, "drive_serial"),
                               (drive_stream, True, "drive_stream")):
        # one driver per format, a closure over its block function: its own
        # on-disk cache (strata_ref._jitcache)
        drivers.append(cached(njit(parallel=parallel, nogil=True)(fn), f"{what}_{name}", _digest))
    return tuple(drivers)


def _streamable(out: np.ndarray) -> bool:
    # every block's QK outputs contiguous and 16-byte aligned
    return (_stream.AVAILABLE and out.size >= STREAM_VALUES and out.strides[2] == 4
            and out.shape[2] % 4 == 0 and out.ctypes.data % 16 == 0
            and out.strides[0] % 16 == 0 and out.strides[1] % 16 == 0)


def _driver(t: GGMLType, out: np.ndarray, stream: bool = True):
    """The compiled driver of type t for the (R, NB, QK) output `out`."""
    drv = _DRIVERS.get(t)
    if drv is None:
        with _LOCK:
            drv = _DRIVERS.get(t)
            if drv is None:
                drv = _DRIVERS[t] = _make_driver(_DEQUANT[t], t.name)
    if out.size < SERIAL_VALUES:
        return drv[1]
    return drv[2] if stream and _streamable(out) else drv[0]


_LOADED = False


def _load_families() -> None:
    # Importing a family module registers its formats (dequantizers and
    # quantizers); every module of this package is a family or its helper.
    global _LOADED
    if _LOADED:
        return
    import importlib
    import pkgutil
    with _LOCK:
        for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            importlib.import_module(f"{__name__}.{m.name}")
        _LOADED = True


def dequant_types() -> list[GGMLType]:
    """Quantized types the oracle can dequantize, in id order."""
    _load_families()
    return sorted(_DEQUANT)


def quantize_types() -> list[GGMLType]:
    """Types the oracle has a reference quantizer for, in id order."""
    _load_families()
    return sorted(_QUANT)


def chunk_quantize_types() -> list[GGMLType]:
    """Types quantized here only as `ggml_quantize_chunk` does
    (`register_chunk_quantize`), in id order."""
    _load_families()
    return sorted(_CHUNK_QUANT)


def oracle_types() -> tuple[GGMLType, ...]:
    """Every type the oracle converts to float: the plain float types F32,
    F16, BF16, then every type with a registered block dequantizer in id
    order. The golden corpus covers exactly these, in this order, and each
    has a generic CUDA kernel."""
    return PLAIN_FLOAT_TYPES + tuple(dequant_types())


def get_quantizer(t) -> Callable:
    """The registered quantizer of type `t`; UnsupportedTypeError if none."""
    _load_families()
    tt = parse_type(t)
    try:
        return _QUANT[tt]
    except KeyError:
        raise UnsupportedTypeError(
            f"no reference quantizer for {tt.name}") from None


def dequantize_blocks(t, blocks: np.ndarray, out: np.ndarray | None = None, *,
                      stream: bool = True) -> np.ndarray:
    """Dequantize blocks of a quantized type to float32.

    blocks: uint8 array of shape (n, B) or (rows, n, B), B = the type's block
    bytes. out: optional float32 array of shape (n, QK) or (rows, n, QK) with
    any strides (a view into a wider buffer); written in place and returned.
    Returns float32 of shape blocks.shape[:-1] + (QK,). Every NaN output is
    the canonical NaN 0x7FFFFFFF.

    stream: a large `out` (STREAM_VALUES values or more, each block's
    values contiguous and 16-byte aligned) may be written with non-temporal
    stores, which never changes a bit; pass False when `out` was just
    allocated: its pages are faulted in and zeroed by the kernel on first
    touch, which leaves them in cache, where ordinary stores are faster
    (measured: Q4_K into a fresh 119 MB output 735 M values/s streamed,
    1098 ordinary). An output this function allocates is never streamed.

    Raises UnsupportedTypeError for a type without a block dequantizer,
    ValueError for shapes that do not match the format.
    """
    _load_families()
    tt = parse_type(t)
    fmt = block_format(tt)
    fn = _DEQUANT.get(tt)
    if fn is None:
        raise UnsupportedTypeError(f"{tt.name} has no block dequantizer")
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8 or blocks.ndim not in (2, 3) or blocks.shape[-1] != fmt.block_bytes:
        raise ValueError(f"{tt.name}: blocks must be uint8 of shape (..., "
                         f"{fmt.block_bytes}), got {blocks.dtype} {blocks.shape}")
    b3 = blocks if blocks.ndim == 3 else blocks[None]
    if out is None:
        out = np.empty(blocks.shape[:-1] + (fmt.block_values,), np.float32)
        stream = False
    if out.dtype != np.float32 or out.shape != blocks.shape[:-1] + (fmt.block_values,):
        raise ValueError(f"{tt.name}: out must be float32 of shape "
                         f"{blocks.shape[:-1] + (fmt.block_values,)}, got {out.dtype} {out.shape}")
    o3 = out if out.ndim == 3 else out[None]
    if b3.size:
        _driver(tt, o3, stream)(b3, o3, _CANON)
    return out
