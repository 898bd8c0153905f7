"""Activation quantization to q8_1 for the CUDA mat-vec routes.

The canonical rule (../shared/spec/kernels.md §6, the IEEE-division build of
Strata's `quantize_q8_1_rows`, itself llama.cpp's `quantize_q8_1` of
ggml-cuda/quantize.cu with exact divisions), per run of 32 values, one warp
lane per value:

* amax = max |x| (the warp `fmaxf` butterfly, which skips NaN lanes; max
  is exact in any order),
* sum = the XOR butterfly (offsets 16, 8, 4, 2, 1) of `+` over the original
  float32 values: v = v[:h] + v[h:] for h = 16, 8, 4, 2, 1,
* d = amax / 127 (one IEEE float32 division),
* q = 0 when amax == 0, else roundf(x / d): the quotient is one float32
  division, the rounding is half away from zero and is done in float64
  (adding 0.5 in float32 could round 0.49999997 up to 1),
* q is stored as int8 the way nvcc compiles ggml's `int8_t q = roundf(...)`
  (and strata-ref's kernel): `cvt.rzi.s32.f32` (saturating to int32, NaN to
  0), then the low byte. Only a subnormal amax can take q out of
  [-127, 127]; there it wraps,
* the 36-byte block: half2 ds (fp16 RNE of d, then of sum) at byte 0, then
  qs int8[32] at byte 4 (the layout of `block_format(Q8_1)`).

Dot products use fp16(d) while q was computed with the float32 d.
"""
from __future__ import annotations

import numpy as np

from ..numerics import f32_to_f16_bits
from ..types import GGMLType, block_format

__all__ = ["QK8_1", "butterfly_sum", "quantize_q8_1", "q8_1_fields"]

_FMT = block_format(GGMLType.Q8_1)
QK8_1 = _FMT.block_values


def butterfly_sum(v: np.ndarray) -> np.ndarray:
    """Warp XOR-butterfly sum over the last axis (32 lanes), float32.

    v: float32 (..., 32). Returns float32 (...): the value every lane holds
    after `v += shfl_xor(v, h)` for h = 16, 8, 4, 2, 1.
    """
    v = np.asarray(v, np.float32)
    if v.shape[-1] != 32:
        raise ValueError(f"butterfly_sum needs 32 lanes, got {v.shape[-1]}")
    h = 16
    with np.errstate(invalid="ignore", over="ignore"):   # IEEE: Inf + -Inf = NaN, overflow = Inf
        while h >= 1:
            v = v[..., :h] + v[..., h:2 * h]
            h //= 2
    return v[..., 0]


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """q8_1 blocks of float32 activations, by the canonical rule above.

    x: float32 array whose size is a multiple of 32 (columns are contiguous
    and quantize as one vector). Returns uint8 (n/32, 36). Raises TypeError
    for a non-float32 input, ValueError for a size not a multiple of 32.
    Non-finite inputs follow the CUDA kernel (and ggml's): amax is a
    `fmaxf` reduction, which skips NaN (quiet or signalling), so a block with some NaN values gets
    the d of its other values; a value whose x/d is not finite (NaN, or
    Inf/Inf) has q = 0, as CUDA's float -> int conversion gives; the sum
    carries NaN / Inf into s (fp16 NaN = 0x7FFF). amax = Inf gives d = Inf.
    A subnormal amax (d rounds to 0 or loses bits) can give |x/d| > 127.5:
    q is then the low byte of the int32-saturated value, as on the GPU
    (x/d = +Inf gives 0x7FFFFFFF, so q = -1; -Inf gives q = 0).
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"q8_1 quantizes float32 activations, got {x.dtype}")
    if x.size % QK8_1:
        raise ValueError(f"{x.size} values is not a multiple of the q8_1 block size {QK8_1}")
    v = np.ascontiguousarray(x).reshape(-1, QK8_1)
    amax = _fmaxf_reduce(np.abs(v))
    s = butterfly_sum(v)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = (amax / np.float32(127)).astype(np.float32)
        r = (v / d[:, None]).astype(np.float32).astype(np.float64)
        q = np.sign(r) * np.floor(np.abs(r) + 0.5)
    q = np.where((amax == 0)[:, None] | np.isnan(q), 0, q)
    q = _low_byte(np.clip(q, -2.0 ** 31, 2.0 ** 31 - 1).astype(np.int64))
    out = np.empty((v.shape[0], _FMT.block_bytes), np.uint8)
    ds = np.stack([f32_to_f16_bits(d), f32_to_f16_bits(s.astype(np.float32))], axis=1)
    out[:, _FMT.offset("d"):_FMT.offset("d") + 2] = ds[:, :1].astype("<u2").view(np.uint8)
    out[:, _FMT.offset("s"):_FMT.offset("s") + 2] = ds[:, 1:].astype("<u2").view(np.uint8)
    out[:, _FMT.offset("qs"):] = q.view(np.uint8)
    return out


def _fmaxf_reduce(a: np.ndarray) -> np.ndarray:
    """Max over the last axis as CUDA's fmaxf reduces it: NaN lanes (quiet
    or signalling) are skipped, and only an all-NaN row gives NaN. (NumPy's
    fmax.reduce may not skip a signalling NaN on SIMD builds.)"""
    nan = np.isnan(a)
    m = np.where(nan, np.float32(-np.inf), a).max(axis=-1)
    return np.where(nan.all(axis=-1), np.float32(np.nan), m).astype(np.float32)


def _low_byte(q: np.ndarray) -> np.ndarray:
    """int8 of the low byte (two's complement) of integer values."""
    return (q & 0xFF).astype(np.uint8).view(np.int8)


def q8_1_fields(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d, s, qs) of q8_1 blocks: d and s as float32 widened from fp16
    (shape (n,)), qs as int8 (n, 32)."""
    from ..numerics import f16_bits_to_f32
    f = _FMT.split(blocks)
    return f16_bits_to_f32(f["d"][:, 0]), f16_bits_to_f32(f["s"][:, 0]), f["qs"]
