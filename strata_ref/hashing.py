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


def fnv1a64(data, h: int = FNV64_OFFSET) -> int:
    """FNV-1a 64 of bytes (or a uint8 array), continuing from state `h`."""
    return int(_fnv(_as_u8(data), np.uint64(h)))


def fnv1a64_pair(data, h1: int = FNV64_OFFSET, h2: int = FNV64_OFFSET) -> tuple[int, int]:
    """Two FNV-1a 64 states advanced over the same bytes in one pass."""
    a, b = _fnv_pair(_as_u8(data), np.uint64(h1), np.uint64(h2))
    return int(a), int(b)


def canonical_bytes(a: np.ndarray) -> np.ndarray:
    """uint8 view of the canonical bytes of `a`: NaNs canonical (float32
    0x7FFFFFFF, float16/bf16 0x7FFF, float64 0x7FFF...F), little-endian,
    C order. Raises TypeError for object arrays."""
    a = np.asarray(a)
    if a.dtype.hasobject:
        raise TypeError("cannot hash an object array")
    a = canonicalize_nan(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def hash_array(a: np.ndarray, h: int = FNV64_OFFSET) -> int:
    """FNV-1a 64 of the canonical little-endian bytes of `a` (row-major)."""
    return fnv1a64(canonical_bytes(a), h)
