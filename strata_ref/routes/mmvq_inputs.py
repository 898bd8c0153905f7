"""Seeded test inputs for the mat-vec routes: "sane" random weight blocks.

kernels.md §13: random bytes with every fp16 scale replaced by a finite fp16
whose exponent field is 5..9 (about 2^-10 .. 2^-6, either sign for d-like
fields), so that no block is Inf or NaN by construction. MXFP4's E8M0 byte is
drawn from 118..136; IQ1_M's fp16 scale, spread over the top nibbles of its
four scale words, is rebuilt the same way.
"""
from __future__ import annotations

import numpy as np

from ..types import GGMLType, block_format

__all__ = ["sane_f16_bits", "sane_blocks"]


def sane_f16_bits(rng: np.random.Generator, n: int, *, signed: bool = False) -> np.ndarray:
    """uint16 (n,): fp16 patterns with exponent field 5..9, random mantissa
    (and random sign if `signed`)."""
    e = rng.integers(5, 10, n).astype(np.uint16)
    m = rng.integers(0, 1024, n).astype(np.uint16)
    s = (rng.integers(0, 2, n).astype(np.uint16) << 15) if signed else np.uint16(0)
    return (s | (e << 10) | m).astype(np.uint16)


def sane_blocks(t, n: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (n, block_bytes): random blocks of type t with sane scales."""
    fmt = block_format(t)
    b = rng.integers(0, 256, (n, fmt.block_bytes), dtype=np.uint8)
    for f in fmt.fields:
        if f.kind == "f16":
            bits = sane_f16_bits(rng, n * f.count).reshape(n, f.count)
            b[:, f.offset:f.offset + f.nbytes] = bits.astype("<u2").view(np.uint8)
        elif f.kind == "e8m0":
            b[:, f.offset] = rng.integers(118, 137, n)
    if GGMLType(t) == GGMLType.IQ1_M:
        off = fmt.offset("scales")
        sc = b[:, off:off + 8].copy().view("<u2").astype(np.uint16)
        d = sane_f16_bits(rng, n)
        for k in range(4):
            nib = (d >> (4 * k)) & 15
            sc[:, k] = (sc[:, k] & 0x0FFF) | (nib << 12)
        b[:, off:off + 8] = sc.astype("<u2").view(np.uint8)
    return b
