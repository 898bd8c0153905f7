"""Weights and activations for the AMX mat-mul tests (tests/test_cpu_amx.py)
and for tools/amx_mm.py, which stores ggml's own output for them.

`big_blocks(t, n, rng)`: random blocks of a 256-value AMX type with every
scale at its largest and the quants biased up, so that against activations
near +1 (`positive_rows`) each super-block's exact integer I_b (module
docstring of `strata_ref.cpu.amx`) is above 2^24 and `float(I_b)` rounds.
Field layouts of ggml-common.h: block_q4_K (d, dmin, scales[12], qs[128]),
block_q5_K (d, dmin, scales[12], qh[32], qs[128]), block_q6_K (ql[128],
qh[64], scales[16], d), block_iq4_xs (d, scales_h, scales_l[4], qs[128]).
"""
from __future__ import annotations

import numpy as np

from strata_ref import synth
from strata_ref.types import GGMLType as T
from strata_ref.types import block_format

#: the 256-value types `big_blocks` makes
BIG_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)


def _put(b, fmt, name, values):
    f = fmt.field(name)
    b[:, f.offset:f.offset + f.nbytes] = values


def _high_nibbles(rng, n, nbytes, lo):
    # bytes whose two nibbles are each in lo..15
    a = rng.integers(lo, 16, (n, nbytes))
    c = rng.integers(lo, 16, (n, nbytes))
    return (a | (c << 4)).astype(np.uint8)


def big_blocks(t, n: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (n, block_bytes): blocks of type t (one of `BIG_TYPES`) whose
    I_b against activations near +1 passes 2^24: Q4_K / Q5_K every 6-bit
    scale and min 63 (all 12 bytes 0xFF), nibbles 10..15 (Q5_K: the fifth
    bit set, 26..31); Q6_K scales 127, quants 48..63 (qh all ones); IQ4_XS
    ls = 63 (ls - 32 = 31), nibbles 12..15 (kvalues 53, 69, 89, 113). d
    (and dmin) random fp16 of the synth's sane range."""
    t = T(t)
    fmt = block_format(t)
    b = synth.blocks(t, n, rng, "narrow").copy()
    if t in (T.Q4_K, T.Q5_K):
        _put(b, fmt, "scales", 0xFF)
        _put(b, fmt, "qs", _high_nibbles(rng, n, 128, 10))
        if t == T.Q5_K:
            _put(b, fmt, "qh", 0xFF)
    elif t == T.Q6_K:
        _put(b, fmt, "scales", 127)
        _put(b, fmt, "ql", rng.integers(0, 256, (n, 128)).astype(np.uint8))
        _put(b, fmt, "qh", 0xFF)
    elif t == T.IQ4_XS:
        _put(b, fmt, "scales_h", 0xFF)
        _put(b, fmt, "scales_l", 0xFF)
        _put(b, fmt, "qs", _high_nibbles(rng, n, 128, 12))
    else:
        raise ValueError(f"no big blocks for {t.name}")
    return b


def positive_rows(n: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """float32 (n, cols) uniform in [0.9, 1): quantized to q8 values of 114
    to 127, so that `big_blocks` give integer sums above 2^24."""
    return rng.uniform(0.9, 1.0, (n, cols)).astype(np.float32)
