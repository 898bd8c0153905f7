"""Random blocks of any ggml type: raw bytes, or with every scale in a range.

`blocks(t, n, rng, scales)` draws n blocks of type t: uniformly random bytes
(`scales=None`, "raw": NaN/Inf scales, every code), then, for a scale
range, every scale of the block (`types.BlockFormat.scales`, IQ1_M's fp16 d
spread over its scale words included) redrawn from that range. A plain
float type (F32, F16, BF16), whose one field is its value, is drawn from the
range alone. `put_scale` writes given bits into one scale (the golden
corpus' special values).

Scale ranges, per storage kind (fp16, bf16, f32, E8M0, UE4M3):

* "full": every finite value, either sign, uniform over the bit patterns
  (subnormals and ±0 included); E8M0 2..253, UE4M3 0..0x7E. The golden
  corpus' "sane" family (`strata_ref.golden`).
* "narrow": ../shared/spec/kernels.md §13, the mat-vec inputs: fp16 scales
  positive with exponent field 5..9 (about 2^-10 .. 2^-6), E8M0 118..136;
  f32, bf16 and UE4M3 fields keep their random bytes
  (`routes.mmvq_inputs`).
* "valid": every value `ggml_validate_row_data` accepts, fp16 scales half
  from the narrow exponents and half from the full range, either sign;
  bf16 and f32 finite, E8M0 0..254 (so MXFP4's f32 subnormals appear), UE4M3
  0..0x7E. The native parity runs (`native.dequant.parity`) and the format tests.

Each range is a table of draws; a draw's exact sequence of `rng` calls is
part of what it makes (the corpus' input hashes, the stored llama.cpp logits
of the tests' tiny models depend on it), so a change to one is a change of
CORPUS_VERSION or of that stored data.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .blocks import put_iq1_m_d
from .types import Scale, block_format, parse_type

__all__ = ["blocks", "draw_scales", "put_scale", "RANGES", "finite_f16_narrow"]


def _signed(rng, size, lim: int, sign_bit: int) -> np.ndarray:
    # uniform over [0, lim) with a random sign bit: every finite pattern
    return (rng.integers(0, lim, size) | (rng.integers(0, 2, size) << sign_bit)).astype(np.uint64)


def finite_f16_narrow(rng: np.random.Generator, size: int, *, signed: bool = False) -> np.ndarray:
    """uint16 (size,): fp16 patterns with exponent field 5..9, random
    mantissa (and random sign if `signed`): kernels.md §13's scales."""
    e = rng.integers(5, 10, size).astype(np.uint16)
    m = rng.integers(0, 1024, size).astype(np.uint16)
    s = (rng.integers(0, 2, size).astype(np.uint16) << 15) if signed else np.uint16(0)
    return (s | (e << 10) | m).astype(np.uint16)


def _f16_valid(rng, size) -> np.ndarray:
    # half exponent 5..9, half the whole finite range (0..30), either sign
    sign = rng.integers(0, 2, size, dtype=np.uint16) << 15
    narrow = rng.integers(5, 10, size, dtype=np.uint16)
    wide = rng.integers(0, 31, size, dtype=np.uint16)
    e = np.where(rng.integers(0, 2, size) == 0, narrow, wide).astype(np.uint16)
    return (sign | (e << 10) | rng.integers(0, 1024, size, dtype=np.uint16)).astype(np.uint16)


def _float_valid(exp_bits: int, man_bits: int):
    # finite bits of a float with these widths: any sign, exponent below all-ones
    total = 1 + exp_bits + man_bits

    def draw(rng, size):
        sign = rng.integers(0, 2, size, dtype=np.uint64) << np.uint64(total - 1)
        e = rng.integers(0, (1 << exp_bits) - 1, size, dtype=np.uint64) << np.uint64(man_bits)
        m = rng.integers(0, 1 << man_bits, size, dtype=np.uint64)
        return sign | e | m
    return draw


Draw = Callable[[np.random.Generator, int], np.ndarray]

#: range name -> storage kind -> draw(rng, size) of `size` bit patterns; a
#: kind a range lacks keeps its random bytes.
RANGES: dict[str, dict[str, Draw]] = {
    "full": {
        "f16": lambda rng, size: _signed(rng, size, 0x7C00, 15),
        "bf16": lambda rng, size: _signed(rng, size, 0x7F80, 15),
        "f32": lambda rng, size: _signed(rng, size, 0x7F800000, 31),
        "e8m0": lambda rng, size: rng.integers(2, 254, size).astype(np.uint64),
        "ue4m3": lambda rng, size: rng.integers(0, 0x7F, size, dtype=np.uint8),
    },
    "narrow": {
        "f16": lambda rng, size: finite_f16_narrow(rng, size),
        "e8m0": lambda rng, size: rng.integers(118, 137, size),
    },
    "valid": {
        "f16": _f16_valid,
        "bf16": _float_valid(8, 7),
        "f32": _float_valid(8, 23),
        "e8m0": lambda rng, size: rng.integers(0, 255, size, dtype=np.uint8),
        "ue4m3": lambda rng, size: rng.integers(0, 0x7F, size, dtype=np.uint8),
    },
}


def put_scale(t, blocks: np.ndarray, scale: Scale, bits) -> None:
    """Write `bits` (one pattern, one per block, or (n, count) per element)
    into scale `scale` of the blocks of type t (uint8 (n, B), in place)."""
    fmt = block_format(t)
    n = len(blocks)
    if not scale.whole_field:           # IQ1_M's d in the top nibbles of its scales
        put_iq1_m_d(blocks, fmt.offset(scale.field), np.asarray(bits).reshape(-1))
        return
    f = fmt.field(scale.field)
    ut = np.dtype(f"<u{f.dtype.itemsize}")          # raw bits of the field
    v = np.asarray(bits, np.uint64).astype(ut)
    if v.ndim < 2:                                  # one per block: every element
        v = np.repeat(np.broadcast_to(v.reshape(-1), (n,))[:, None], f.count, axis=1)
    vals = np.ascontiguousarray(np.broadcast_to(v, (n, f.count)))
    blocks[:, f.offset:f.offset + f.nbytes] = vals.view(np.uint8).reshape(n, f.nbytes)


def draw_scales(t, blocks: np.ndarray, rng: np.random.Generator, scales: str = "full") -> None:
    """Redraw every scale of the blocks of type t (uint8 (n, B), in place)
    from range `scales`, in the order of `BlockFormat.scales`; a kind the
    range lacks is left as it is. KeyError for an unknown range name."""
    fmt = block_format(t)
    draws = RANGES[scales]
    n = len(blocks)
    for s in fmt.scales:
        draw = draws.get(s.kind)
        if draw is None:
            continue
        count = fmt.field(s.field).count if s.whole_field else 1
        put_scale(t, blocks, s, np.asarray(draw(rng, n * count)).reshape(n, count))


def blocks(t, n: int, rng: np.random.Generator, scales: str | None = "full") -> np.ndarray:
    """n random blocks of type t, uint8 (n, B): random bytes, every scale
    then drawn from range `scales` ("full", "narrow", "valid"; None: the
    raw bytes). Raises KeyError for an unknown range name, UnsupportedTypeError
    for a type without a block format."""
    t = parse_type(t)
    fmt = block_format(t)
    if (scales is not None and not fmt.quantized and fmt.scales
            and all(s.kind in RANGES[scales] for s in fmt.scales)):
        # a plain float type: the value is the whole block, drawn from the range alone
        b = np.empty((n, fmt.block_bytes), np.uint8)
    else:
        b = rng.integers(0, 256, (n, fmt.block_bytes), dtype=np.uint8)
    if scales is not None:
        draw_scales(t, b, rng, scales)
    return b
