"""Seeded test inputs for the mat-vec routes: "sane" random weight blocks.

kernels.md §13: random bytes with every fp16 scale replaced by a finite fp16
whose exponent field is 5..9 (about 2^-10 .. 2^-6), so that no block is Inf
or NaN by construction; MXFP4's E8M0 byte is drawn from 118..136; IQ1_M's
fp16 scale, spread over the top nibbles of its four scale words, is rebuilt
the same way. The draws are `strata_ref.synth`'s "narrow" range.
"""
from __future__ import annotations

import numpy as np

from .. import synth
from ..synth import finite_f16_narrow as sane_f16_bits
from ..types import GGMLType, block_format

__all__ = ["sane_f16_bits", "sane_blocks", "inf_dot_blocks", "ones_q8_1"]


def sane_blocks(t, n: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (n, block_bytes): random blocks of type t with sane scales
    (`synth.blocks(t, n, rng, "narrow")`)."""
    return synth.blocks(t, n, rng, "narrow")


def inf_dot_blocks(t, n: int) -> np.ndarray:
    """uint8 (n, block_bytes): Q4_K, Q6_K or IQ4_XS blocks whose every
    thread dot against positive q8_1 ints (`ones_q8_1`) is +inf: d = +inf,
    positive scales and quants (Q4_K with dmin = 0, so its min term is 0).
    A dot against zero q8_1 ints (d8 = 0) is inf·0 = NaN, which is how the
    lanes tests see a dot that should have been discarded. Field layouts of
    ggml-common.h: block_q4_K (d, dmin, scales[12], qs[128]), block_q6_K
    (ql[128], qh[64], scales[16], d), block_iq4_xs (d, scales_h,
    scales_l[4], qs[128]).

    Raises ValueError for another type."""
    t = GGMLType(t)
    b = np.zeros((n, block_format(t).block_bytes), np.uint8)
    inf16 = np.frombuffer(np.uint16(0x7C00).tobytes(), np.uint8)
    if t == GGMLType.Q4_K:      # scale and min 1 for sub-blocks 0-3, scale 1 and min 0 for 4-7
        b[:, 0:2], b[:, 4:16], b[:, 16:] = inf16, 0x01, 0xFF
    elif t == GGMLType.Q6_K:    # quants 63 (q - 32 = 31), scales 1
        b[:, :192], b[:, 192:208], b[:, 208:210] = 0xFF, 0x01, inf16
    elif t == GGMLType.IQ4_XS:  # scales 63 (ls - 32 = 31), nibbles 15 (kvalue 113)
        b[:, 0:2], b[:, 2:] = inf16, 0xFF
    else:
        raise ValueError(f"inf_dot_blocks: {t.name} is not Q4_K, Q6_K or IQ4_XS")
    return b


def ones_q8_1(k: int) -> np.ndarray:
    """uint8 (k // 32, 36): a q8_1 column of k values, d = 1.0, s = 0 and
    every quant 1 (k a positive multiple of 32, else ValueError)."""
    if k <= 0 or k % 32:
        raise ValueError(f"ones_q8_1: k = {k} is not a positive multiple of 32")
    q8 = np.zeros((k // 32, 36), np.uint8)
    q8[:, 0:2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    q8[:, 4:] = 1
    return q8
