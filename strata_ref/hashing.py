"""FNV-1a 64 over output bytes, with the NaN policy of ../shared/DESIGN.md.

FNV-1a 64: offset basis 0xcbf29ce484222325, prime 0x100000001b3; for each
byte `h ^= byte; h *= prime (mod 2^64)` (Fowler, Noll, Vo; the constants of
../shared/spec/kernels.md §5).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .numerics import canonicalize_nan

__all__ = ["FNV64_OFFSET", "FNV64_PRIME", "fnv1a64", "fnv1a64_pair",
           "canonical_bytes", "hash_array"]

FNV64_OFFSET = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3


@njit(cache=True, nogil=True)
def _fnv(data, h):
    p = np.uint64(FNV64_PRIME)
    for i in range(data.size):
        h = (h ^ np.uint64(data[i])) * p
    return h


@njit(cache=True, nogil=True)
def _fnv_pair(data, h1, h2):
    # Two independent states over the same bytes in one pass: the per-tensor
    # hash and the chained hash over the whole file.
    p = np.uint64(FNV64_PRIME)
    for i in range(data.size):
        b = np.uint64(data[i])
        h1 = (h1 ^ b) * p
        h2 = (h2 ^ b) * p
    return h1, h2


def _as_u8(data) -> np.ndarray:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, np.uint8)
    a = np.asarray(data)
    if a.dtype != np.uint8:
        raise TypeError(f"fnv1a64 hashes bytes or uint8 arrays, got {a.dtype}; "
                        "use hash_array for typed arrays")
    return np.ascontiguousarray(a).reshape(-1)


def _state(h) -> np.uint64:
    """A hash state: an int in [0, 2**64). TypeError for another type (a
    float would be truncated), ValueError outside the range."""
    if isinstance(h, (bool, np.bool_)) or not isinstance(h, (int, np.integer)):
        raise TypeError(f"an FNV-1a 64 state is an int in [0, 2**64), got {h!r}")
    if not 0 <= int(h) < 1 << 64:
        raise ValueError(f"an FNV-1a 64 state is an int in [0, 2**64), got {int(h)}")
    return np.uint64(int(h))


def fnv1a64(data, h: int = FNV64_OFFSET) -> int:
    """FNV-1a 64 of bytes (or a uint8 array), continuing from state `h` (an
    int in [0, 2**64); TypeError / ValueError otherwise)."""
    return int(_fnv(_as_u8(data), _state(h)))


def fnv1a64_pair(data, h1: int = FNV64_OFFSET, h2: int = FNV64_OFFSET) -> tuple[int, int]:
    """Two FNV-1a 64 states advanced over the same bytes in one pass."""
    a, b = _fnv_pair(_as_u8(data), _state(h1), _state(h2))
    return int(a), int(b)


def canonical_bytes(a: np.ndarray) -> np.ndarray:
    """uint8 view of the canonical bytes of `a`: NaNs canonical (float32
    0x7FFFFFFF, float16/bf16 0x7FFF, float64 0x7FFF...F), little-endian,
    C order; complex values part by part. Raises TypeError for object
    arrays and for extended-precision floats (np.longdouble and its complex
    form), whose padding bytes hold no defined value."""
    a = np.asarray(a)
    if a.dtype.hasobject:
        raise TypeError("cannot hash an object array")
    if a.dtype.kind in "fc" and a.dtype.itemsize > (8 if a.dtype.kind == "f" else 16):
        raise TypeError(f"cannot hash {a.dtype} values: extended precision has padding "
                        "bytes of no defined value; convert to float64 first")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    a = canonicalize_nan(a)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def hash_array(a: np.ndarray, h: int = FNV64_OFFSET) -> int:
    """FNV-1a 64 of the canonical little-endian bytes of `a` (row-major)."""
    return fnv1a64(canonical_bytes(a), h)


# ---------------------------------------------------------------------------
# Hashing dequantized tensors (the numbers of `strata-ref hash` and of the
# golden model files).

#: The output dtypes a tensor hash can be taken of.
HASH_DTYPES = ("f32", "f16", "bf16")

_CHUNK_VALUES = 1 << 22


def _tensor_chunks(t, raw: np.ndarray, rows: int, cols: int, out_dtypes):
    """Yield {dtype: canonical uint8 bytes} per chunk of rows, in row order."""
    from . import numerics
    from .dequant import dequant_f32
    from .types import PLAIN_TYPES, parse_type
    tt = parse_type(t)
    if rows * cols == 0:
        return          # an empty tensor: empty output, the hash of no bytes
    if tt in PLAIN_TYPES:
        # Plain integer/f64 arrays are not converted: every dtype hashes the
        # element bytes themselves (NaNs of F64 canonical).
        from .types import block_format
        vals = raw.view(block_format(tt).field("v").dtype)
        b = canonical_bytes(vals)
        yield {d: b for d in out_dtypes}
        return
    step = max(1, _CHUNK_VALUES // max(cols, 1))
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        f32 = dequant_f32(tt, raw, n, cols, row0=r0)
        out = {}
        for d in out_dtypes:
            if d == "f32":
                out[d] = f32.reshape(-1).view(np.uint8)
            elif d == "f16":
                out[d] = numerics.f32_to_f16_bits(f32).reshape(-1).view(np.uint8)
            else:
                out[d] = numerics.f32_to_bf16_bits(f32).reshape(-1).view(np.uint8)
        yield out


def hash_tensor(t, raw, rows: int, cols: int, out_dtypes=HASH_DTYPES,
                chain: dict | None = None, progress=None) -> dict[str, int]:
    """FNV-1a 64 of the dequantized output of one tensor, per out dtype.

    t: ggml type; raw: the tensor's bytes (uint8, whole rows); rows x cols:
    its 2-D shape (cols = ne0). Hashes the canonical bytes of the rows x cols
    output in row-major order (NaNs canonical, no padding). If `chain` is
    given ({dtype: state}), each state is advanced over the same bytes (the
    file's chained hash). `progress(nbytes)` is called per chunk of input.
    Plain I8..I64 and F64 tensors are not converted: every out dtype hashes
    their element bytes (F64 NaNs canonical), so an F32 tensor retagged I32
    keeps its f32 hash and only the recorded type tells them apart. An
    empty tensor (rows or cols 0) hashes no bytes: every hash is
    FNV64_OFFSET and `chain` is unchanged.
    Returns {dtype: hash}.
    """
    from .dequant import as_bytes
    raw = as_bytes(raw)
    states = {d: FNV64_OFFSET for d in out_dtypes}
    chunks = _tensor_chunks(t, raw, rows, cols, out_dtypes)
    done_rows = 0
    step = max(1, _CHUNK_VALUES // max(cols, 1))

    def advance(d, b):
        # The FNV loops release the GIL, so the dtypes' streams run in parallel.
        if chain is not None:
            states[d], chain[d] = fnv1a64_pair(b, states[d], chain[d])
        else:
            states[d] = fnv1a64(b, states[d])

    for part in chunks:
        if len(part) > 1 and sum(b.size for b in part.values()) >= 1 << 20:
            list(_pool().map(lambda kv: advance(*kv), part.items()))
        else:
            for d, b in part.items():
                advance(d, b)
        if progress is not None:
            done = min(rows, done_rows + step)
            progress((done - done_rows) * raw.size // max(rows, 1))
            done_rows = done
    return states


_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
        import concurrent.futures
        import os
        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=min(3, os.cpu_count() or 1))
    return _POOL
