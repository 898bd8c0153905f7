"""A legacy-quant weight row (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) widened to one
int8 value per weight, with its blocks' d (and m) as float32: the form the
kernels that form their integer lanes in plain loops read
(`neon_legacy`, `avx_legacy`). The block layouts are `types.block_format`'s;
the values are those of ggml's `dequantize_row_*` before the scales: Q4_0
`nibble - 8`, Q5_0 `(nibble | fifth bit << 4) - 16`, Q8_0 the byte, and
Q4_1 / Q5_1 the unsigned values (their m is added apart)."""
from __future__ import annotations

import numpy as np
from numba import njit

from ..types import GGMLType, block_format
from .simd import f16_at

__all__ = ["field_offset", "row_widener"]


def field_offset(t, name: str) -> int:
    """Byte offset of field `name` in a block of type t, -1 where the type
    has no such field."""
    fmt = block_format(t)
    return fmt.field(name).offset if any(f.name == name for f in fmt.fields) else -1


def row_widener(t):
    """The numba function widen(raw, r, wv, dw, mw) of legacy type t: the
    values of weight row r of raw (uint8 (rows, row_bytes)) into wv (int8
    or int32, at least 32 * nb), each block's d into dw (float32 (nb,)) and,
    for Q4_1 / Q5_1, m into mw."""
    T = int(t)
    BB = block_format(t).block_bytes
    D, M, QH, QS = (field_offset(t, n) for n in ("d", "m", "qh", "qs"))
    NIB = T != int(GGMLType.Q8_0)
    BIAS = {int(GGMLType.Q4_0): 8, int(GGMLType.Q5_0): 16}.get(T, 0)

    @njit(inline="always")
    def widen(raw, r, wv, dw, mw):
        for b in range(dw.shape[0]):
            o = b * BB
            dw[b] = f16_at(raw[r], o + D)
            if M >= 0:
                mw[b] = f16_at(raw[r], o + M)
            qh = np.uint32(0)
            if QH >= 0:
                qh = (np.uint32(raw[r, o + QH]) | (np.uint32(raw[r, o + QH + 1]) << np.uint32(8))
                      | (np.uint32(raw[r, o + QH + 2]) << np.uint32(16))
                      | (np.uint32(raw[r, o + QH + 3]) << np.uint32(24)))
            for j in range(16):
                if NIB:
                    lo = np.int32(raw[r, o + QS + j] & 15)
                    hi = np.int32(raw[r, o + QS + j] >> 4)
                    if QH >= 0:
                        lo |= np.int32((qh >> np.uint32(j)) & np.uint32(1)) << 4
                        hi |= np.int32((qh >> np.uint32(j + 16)) & np.uint32(1)) << 4
                    wv[32 * b + j] = lo - BIAS
                    wv[32 * b + 16 + j] = hi - BIAS
                else:
                    wv[32 * b + j] = np.int8(raw[r, o + QS + j])
                    wv[32 * b + 16 + j] = np.int8(raw[r, o + QS + 16 + j])
    return widen
