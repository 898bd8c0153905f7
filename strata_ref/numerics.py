"""Scalar number rules shared by every format, route and kernel.

Each rule is written once, as a numba-compiled scalar function (usable from
other compiled code) and, where arrays need it, a vectorised wrapper over the
same scalar function. Sources:

* fp16 -> f32: ggml `ggml_compute_fp16_to_fp32` (ggml-org/ggml src/ggml-impl.h):
  exact for every non-NaN half; a signalling NaN is quieted (0x7C01 ->
  0x7FC02000), unlike numpy's `astype(float32)`.
* f32 -> f16: IEEE round-to-nearest-even, the bits of CUDA `__float2half_rn`
  (±Inf from |x| >= 65520, correct subnormals). NaN -> 0x7FFF (what the H200
  returns for every NaN, ../shared/DESIGN.md "NaN policy"); `ggml_nan=True`
  gives ggml's `sign | 0x7E00` instead.
* f32 -> bf16: ggml `ggml_compute_fp32_to_bf16`: NaN -> (u >> 16) | 0x40,
  otherwise (u + 0x7FFF + ((u >> 16) & 1)) >> 16 in uint32.
* E8M0 half (`ggml_e8m0_to_fp32_half`) and UE4M3 (`ggml_ue4m3_to_fp32`), as in
  ../shared/spec/formats.md §4.
* Canonical NaN: f32 0x7FFFFFFF, f16 0x7FFF, bf16 0x7FFF.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
from numba import njit, prange

from . import _jitcache  # noqa: F401  (numba's cache, locked across processes)
__all__ = [
    "F32_CANONICAL_NAN", "F16_CANONICAL_NAN", "BF16_CANONICAL_NAN",
    "F16_TO_F32", "bfloat16",
    "f16_bits_to_f32", "bf16_bits_to_f32", "f32_to_f16_bits", "f32_to_bf16_bits",
    "e8m0_half_to_f32", "ue4m3_to_f32", "canonicalize_nan", "round_half_away",
    "fma_f32", "ulp_distance_f32", "widen_to_f32",
    "f16_scalar_to_f32", "f32_bits_to_f16_bits", "f32_bits_to_bf16_bits",
]

F32_CANONICAL_NAN = np.uint32(0x7FFFFFFF)
F16_CANONICAL_NAN = np.uint16(0x7FFF)
BF16_CANONICAL_NAN = np.uint16(0x7FFF)

#: numpy dtype used for bf16 arrays (ml_dtypes.bfloat16, 2 bytes, raw bf16 bits).
bfloat16 = np.dtype(ml_dtypes.bfloat16)


def _build_f16_table() -> np.ndarray:
    # Every non-NaN half widens exactly, so numpy's widening is the rule;
    # NaNs get the quiet bit, as ggml's 2^-112 multiply gives them.
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    t = bits.view(np.float16).astype(np.float32).view(np.uint32).copy()
    nan = (bits & 0x7C00) == 0x7C00
    nan &= (bits & 0x03FF) != 0
    t[nan] |= np.uint32(0x00400000)
    t.setflags(write=False)
    return t.view(np.float32)


#: float32[65536]: ggml's fp16 -> f32 value of each half bit pattern.
F16_TO_F32 = _build_f16_table()


@njit(inline="always", cache=True)
def f16_scalar_to_f32(h):
    """f32 value of fp16 bits `h` (int), by ggml's rule (table lookup)."""
    return F16_TO_F32[h & 0xFFFF]


@njit(cache=True)
def f32_bits_to_f16_bits(u, ggml_nan=False):
    """fp16 bits (int) of the f32 with bits `u` (uint32 as int), RNE.

    NaN gives 0x7FFF, or ggml's `sign | 0x7E00` when `ggml_nan`.
    """
    u = u & 0xFFFFFFFF
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        return (sign | 0x7E00) if ggml_nan else 0x7FFF
    if a >= 0x477FF000:            # >= 65520: rounds to (or is) infinity
        return sign | 0x7C00
    if a >= 0x38800000:            # normal half: rebias, round off 13 bits
        h = a - 0x38000000
        h = (h + 0x0FFF + ((h >> 13) & 1)) >> 13
        return sign | h
    if a <= 0x33000000:            # <= 2^-25: the tie at 2^-25 goes to even 0
        return sign
    e = a >> 23
    m = (a & 0x7FFFFF) | 0x800000
    s = 126 - e                    # value = m * 2^(e-150) = k * 2^-24
    k = m >> s
    rem = m & ((1 << s) - 1)
    half = 1 << (s - 1)
    if rem > half or (rem == half and (k & 1) == 1):
        k += 1
    return sign | k


@njit(inline="always", cache=True)
def f32_bits_to_bf16_bits(u):
    """bf16 bits (int) of the f32 with bits `u`, by ggml's rule."""
    u = u & 0xFFFFFFFF
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


@njit(inline="always", cache=True)
def _f32_to_f16_at(src, dst, ggml_nan, i):
    dst[i] = f32_bits_to_f16_bits(np.int64(src[i]), ggml_nan)


@njit(inline="always", cache=True)
def _f32_to_bf16_at(src, dst, i):
    dst[i] = f32_bits_to_bf16_bits(np.int64(src[i]))


@njit(parallel=True, cache=True)
def _f32_to_f16_loop(src, dst, ggml_nan):
    for i in prange(src.size):
        _f32_to_f16_at(src, dst, ggml_nan, i)


@njit(cache=True)
def _f32_to_f16_serial(src, dst, ggml_nan):
    for i in range(src.size):
        _f32_to_f16_at(src, dst, ggml_nan, i)


@njit(parallel=True, cache=True)
def _f32_to_bf16_loop(src, dst):
    for i in prange(src.size):
        _f32_to_bf16_at(src, dst, i)


@njit(cache=True)
def _f32_to_bf16_serial(src, dst):
    for i in range(src.size):
        _f32_to_bf16_at(src, dst, i)


#: Below this many values the element loops run serially: on a loaded
#: machine, starting numba's thread pool costs milliseconds a call
#: (strata_ref.formats.SERIAL_VALUES).
SERIAL_VALUES = 1 << 16


def _as_f32_bits(x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"expected a float32 array, got dtype {a.dtype}")
    return np.ascontiguousarray(a).reshape(-1).view(np.uint32)


def f32_to_f16_bits(x, *, ggml_nan: bool = False) -> np.ndarray:
    """uint16 fp16 bits of a float32 array (same shape), round-to-nearest-even.

    NaN -> 0x7FFF (`__float2half_rn` on the H200) or, with `ggml_nan`,
    ggml's `sign | 0x7E00`. Raises TypeError for a non-float32 input.
    """
    a = np.asarray(x)
    src = _as_f32_bits(a)
    dst = np.empty(src.size, np.uint16)
    (_f32_to_f16_serial if src.size < SERIAL_VALUES else _f32_to_f16_loop)(src, dst, ggml_nan)
    return dst.reshape(a.shape)


def f32_to_bf16_bits(x) -> np.ndarray:
    """uint16 bf16 bits of a float32 array (same shape), ggml's rule
    (RNE with carry into ±Inf; NaN -> (u >> 16) | 0x40).
    Raises TypeError for a non-float32 input."""
    a = np.asarray(x)
    src = _as_f32_bits(a)
    dst = np.empty(src.size, np.uint16)
    (_f32_to_bf16_serial if src.size < SERIAL_VALUES else _f32_to_bf16_loop)(src, dst)
    return dst.reshape(a.shape)


_F16_TO_F32_BITS = F16_TO_F32.view(np.uint32)


@njit(inline="always", cache=True)
def _widen_row(src, dst, bf16, r):
    # src: (R, C) uint16 element bits; dst: (R, C) uint32 f32 bits, any
    # strides. uint32 throughout: with int64 the vectorised loop holds half
    # the lanes; `bf16` is tested outside the loop so that each loop is one
    # straight body (measured together: bf16 1.2x faster).
    if bf16:
        for c in range(src.shape[1]):
            v = np.uint32(src[r, c]) << np.uint32(16)
            if (v & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                v = np.uint32(0x7FFFFFFF)
            dst[r, c] = v
    else:
        for c in range(src.shape[1]):
            v = _F16_TO_F32_BITS[np.uint32(src[r, c])]
            if (v & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                v = np.uint32(0x7FFFFFFF)
            dst[r, c] = v


@njit(parallel=True, cache=True)
def _widen_loop(src, dst, bf16):
    for r in prange(src.shape[0]):
        _widen_row(src, dst, bf16, r)


@njit(cache=True)
def _widen_serial(src, dst, bf16):
    for r in range(src.shape[0]):
        _widen_row(src, dst, bf16, r)


@njit(inline="always", cache=True)
def _canon_f32_row(src, dst, r):
    for c in range(src.shape[1]):
        v = np.int64(src[r, c])
        if (v & 0x7FFFFFFF) > 0x7F800000:
            v = 0x7FFFFFFF
        dst[r, c] = v


@njit(parallel=True, cache=True)
def _canon_f32_loop(src, dst):
    for r in prange(src.shape[0]):
        _canon_f32_row(src, dst, r)


@njit(cache=True)
def _canon_f32_serial(src, dst):
    for r in range(src.shape[0]):
        _canon_f32_row(src, dst, r)


def widen_to_f32(kind: str, src: np.ndarray, dst: np.ndarray) -> None:
    """Widen 2-D element bits to float32 bits in place, NaNs canonical.

    kind: "f32" (src uint32 f32 bits, copied), "f16" (ggml's fp16 -> f32) or
    "bf16" (`bits << 16`). src: (R, C) uint16/uint32; dst: (R, C) uint32,
    any strides (e.g. a view of a padded float32 output).
    """
    serial = src.size < SERIAL_VALUES
    if kind == "f32":
        (_canon_f32_serial if serial else _canon_f32_loop)(src, dst)
    else:
        (_widen_serial if serial else _widen_loop)(src, dst, kind == "bf16")


def f16_bits_to_f32(bits) -> np.ndarray:
    """float32 values of an array of fp16 bit patterns (ggml's rule)."""
    return F16_TO_F32[np.asarray(bits).astype(np.uint16, copy=False)]


def bf16_bits_to_f32(bits) -> np.ndarray:
    """float32 values of bf16 bit patterns: `(u32)h << 16`, exact."""
    b = np.asarray(bits).astype(np.uint32)
    return (b << 16).view(np.float32)


def e8m0_half_to_f32(e) -> np.ndarray:
    """ggml `ggml_e8m0_to_fp32_half`: 2^(e-128) as float32 for uint8 `e`.

    Bits `(e-1) << 23` for e >= 2, `0x00200000 << e` for e < 2 (subnormals);
    e = 255 gives 2^127, not NaN.
    """
    e = np.asarray(e).astype(np.uint32)
    bits = np.where(e >= 2, (e - 1) << 23, np.uint32(0x00200000) << e)
    return bits.astype(np.uint32).view(np.float32)


def ue4m3_to_f32(x) -> np.ndarray:
    """ggml `ggml_ue4m3_to_fp32`: half the UE4M3 value of uint8 `x`, float32.

    0x00 and 0x7F give 0; bit 7 is otherwise ignored (0xFF gives 240).
    raw = man·2^-9 (exp 0) or (1 + man/8)·2^(exp-7); every step is exact.
    """
    x = np.asarray(x).astype(np.int64)
    ex = (x >> 3) & 15
    man = (x & 7).astype(np.float64)
    raw = np.where(ex == 0, man * 2.0 ** -9, (1.0 + man / 8.0) * np.exp2(ex - 7.0))
    raw = np.where((x == 0) | (x == 0x7F), 0.0, raw)
    return (raw * 0.5).astype(np.float32)


def canonicalize_nan(a: np.ndarray) -> np.ndarray:
    """Copy of `a` with every NaN replaced by the canonical NaN of its dtype
    (float32 0x7FFFFFFF, float16 0x7FFF, bfloat16 0x7FFF, float64
    0x7FFFFFFFFFFFFFFF); other values, ±Inf and signed zeros are untouched.
    complex64 / complex128: the real and the imaginary part each, as float32
    / float64 (a complex NaN has either part NaN; only that part changes).
    Other dtypes are returned as is.
    """
    a = np.asarray(a)
    if a.dtype == np.complex64 or a.dtype == np.complex128:
        part = np.float32 if a.dtype == np.complex64 else np.float64
        out = np.array(a, order="C")               # a copy, 0-d kept 0-d
        parts = out.reshape(-1).view(part)          # a view into `out`
        parts[...] = canonicalize_nan(parts)
        return out
    if a.dtype == np.float32:
        out = a.copy()
        out.view(np.uint32)[np.isnan(a)] = F32_CANONICAL_NAN
        return out
    if a.dtype == np.float16 or a.dtype == bfloat16:
        out = a.copy()
        b = a.view(np.uint16)
        exp_mask = np.uint16(0x7C00 if a.dtype == np.float16 else 0x7F80)
        man_mask = np.uint16(0x03FF if a.dtype == np.float16 else 0x007F)
        nan = ((b & exp_mask) == exp_mask) & ((b & man_mask) != 0)
        out.view(np.uint16)[nan] = np.uint16(0x7FFF)
        return out
    if a.dtype == np.float64:
        out = a.copy()
        out.view(np.uint64)[np.isnan(a)] = np.uint64(0x7FFFFFFFFFFFFFFF)
        return out
    return a


def round_half_away(x) -> np.ndarray:
    """C `roundf`: round to integer, halves away from zero, as float32.

    Computed in float64, where |x| + 0.5 is exact for every float32 x, so no
    intermediate rounding can move a value across a .5 boundary.
    """
    a = np.asarray(x, dtype=np.float32).astype(np.float64)
    return (np.sign(a) * np.floor(np.abs(a) + 0.5)).astype(np.float32)


def fma_f32(a, b, c) -> np.ndarray:
    """Exact float32 fused multiply-add `a*b + c` with one rounding (RNE).

    a, b, c: float32 arrays (broadcast). The product is exact in float64
    (24 + 24 bits); the sum is formed in float64 with its exact error
    (Knuth's TwoSum) and rounded to odd, which makes the final float64 ->
    float32 rounding correct (53 >= 24 + 2 bits, also for f32 subnormals and
    overflow to ±Inf). Infinities and NaNs follow IEEE (NaN results are
    returned as the canonical float32 NaN 0x7FFFFFFF).
    """
    a64 = np.asarray(a, dtype=np.float32).astype(np.float64)
    b64 = np.asarray(b, dtype=np.float32).astype(np.float64)
    c64 = np.asarray(c, dtype=np.float32).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        p = a64 * b64
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        fix = np.isfinite(s) & (err != 0) & ((s.view(np.uint64) & 1) == 0)
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        r = np.asarray(s.astype(np.float32))
    return canonicalize_nan(r)


def ulp_distance_f32(a, b) -> np.ndarray:
    """Distance in float32 ulps between same-shaped float32 arrays, measured
    on the monotone integer line of the bit patterns (+0 and -0 are 0 apart).
    NaN positions give 0 when both are NaN, else 2^32 - 1."""
    def key(x):
        u = np.asarray(x, np.float32).view(np.uint32).astype(np.int64)
        return np.where(u & 0x80000000, -(u & 0x7FFFFFFF), u)
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    d = np.abs(key(a) - key(b))
    na, nb = np.isnan(a), np.isnan(b)
    d = np.where(na & nb, 0, np.where(na | nb, 2**32 - 1, d))
    return d.astype(np.uint64)
