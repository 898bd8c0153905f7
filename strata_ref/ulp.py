"""Distances between float arrays in units in the last place, and where a
difference sits: the shared arithmetic of `strata-ref compare` (dequant
outputs against the oracle) and `strata-ref diff` (trace against trace).

The ulp distance of two floats of one width is the difference of their
positions on the monotone integer line of bit patterns (`ordered`: +0 and
-0 coincide, the negative patterns mirrored below zero), so 1 ulp is one
representable step, whatever the exponent. NaN has no place on that line:
a NaN against a number is counted apart, a NaN against a NaN is equal
whatever its payload (DESIGN.md's NaN policy).
"""
from __future__ import annotations

import numpy as np

__all__ = ["BITS", "ordered", "is_nan_bits", "bits_of", "compare_bits", "locate", "worst"]

#: unsigned dtype of each float dtype's bit pattern
BITS = {np.dtype("<f4"): np.dtype("<u4"), np.dtype("<f2"): np.dtype("<u2")}


def ordered(bits: np.ndarray, width: int) -> np.ndarray:
    """Monotone int64 line of float bit patterns of `width` bits (+0 and -0
    coincide): the ulp distance of two values is the difference of theirs."""
    u = bits.astype(np.int64)
    sign = np.int64(1) << (width - 1)
    return np.where(u & sign, -(u & (sign - 1)), u)


def is_nan_bits(bits: np.ndarray, width: int) -> np.ndarray:
    """Which patterns are NaN, for float32 (width 32), float16 (16) or
    bfloat16 (width 16 with bf16=True is `compare`'s own business)."""
    if width == 32:
        return (bits & 0x7FFFFFFF) > 0x7F800000
    return (bits & 0x7FFF) > 0x7C00


def bits_of(a: np.ndarray) -> tuple[np.ndarray, int]:
    """(bit patterns, width) of a float32 or float16 array."""
    a = np.ascontiguousarray(a)
    dt = BITS.get(a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype)
    if dt is None:
        raise ValueError(f"ulp distances need float32 or float16 values, got {a.dtype}")
    return a.view(dt), 8 * dt.itemsize


def compare_bits(a: np.ndarray, b: np.ndarray) -> dict:
    """Compare two float arrays of one shape and dtype element by element.

    Returns a dict: n (values), n_diff (pairs not equal: different bits,
    NaN against NaN counting equal), nan_vs_number, ulps (int64 ulp
    distance of each differing number pair, in flat order), diff_index
    (their flat indices), first (flat index of the first differing pair or
    None)."""
    ab, width = bits_of(a)
    bb, _ = bits_of(b)
    na, nb = is_nan_bits(ab, width), is_nan_bits(bb, width)
    diff = (ab != bb) & ~(na & nb)
    idx = np.flatnonzero(diff.reshape(-1))
    num = ~(na | nb).reshape(-1)[idx]
    ulps = np.abs(ordered(ab.reshape(-1)[idx[num]], width) - ordered(bb.reshape(-1)[idx[num]], width))
    return {"n": int(ab.size), "n_diff": int(idx.size), "nan_vs_number": int((~num).sum()),
            "ulps": ulps, "diff_index": idx[num], "first": int(idx[0]) if idx.size else None}


def locate(index: int, shape, block: int) -> dict:
    """Where flat `index` of an array of `shape` (NumPy order) sits: its
    multi-index, its row (every dimension but the last, flattened), column,
    and the block of `block` values of the row it falls in with its offset
    (ggml's blocks run along ne[0], NumPy's last axis)."""
    shape = tuple(int(s) for s in shape) or (1,)
    cols = shape[-1]
    row, col = divmod(int(index), cols)
    return {"index": int(index), "at": [int(i) for i in np.unravel_index(int(index), shape)],
            "row": row, "col": col, "block": col // block, "offset": col % block}


def worst(ulps: np.ndarray, index: np.ndarray, k: int) -> list:
    """The k largest ulp distances, largest first (ties: the earlier index
    first): a list of (flat index, ulps)."""
    if ulps.size == 0 or k <= 0:
        return []
    order = np.lexsort((index, -ulps))[:k]
    return [(int(index[i]), int(ulps[i])) for i in order]
