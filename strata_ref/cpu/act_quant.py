"""Activation quantization as ggml's CPU backend does it before a quantized
mat-vec: Q8_0, Q8_1 and Q8_K (the `vec_dot_type` of the weight type).

Which code we follow (llama.cpp vendored by llama-cpp-python 0.3.36): the
builds with AVX (the avx2 and avx512 profiles) take the AVX versions of
`quantize_row_q8_0` and `quantize_row_q8_1` in ggml-cpu `arch/x86/quants.c`
(`ref=False` here); the baseline x86-64 build (the scalar profile) calls
`quantize_row_q8_0_ref` / `quantize_row_q8_1_ref` of ggml-quants.c
(`ref=True`). The two differ in two ways:

* the multiplier is `id = 127 / amax` (one division), where the reference
  uses `1 / (amax / 127)`;
* `x * id` is rounded half to even (`_mm256_round_ps`, nearest), where the
  reference uses `roundf` (half away from zero).

Per 32 values: amax = max |x|, d = amax / 127 (float32), stored as fp16
(RNE); id = 127 / amax (0 when amax is 0), or for the reference 1 / d;
q = rne(x * id), or roundf(x * id), as int8. Q8_1 also stores s = fp16(d *
sum(q)) with the float32 d (not the fp16 one), in both.

`quantize_row_q8_K` is the reference `quantize_row_q8_K_ref` in every build
(x86 and arm64): per 256 values, max = the value of largest magnitude (the
first on ties), iscale = -127 / max, q = min(127, nearest_int(iscale * x))
(round half to even, by adding 1.5 * 2^23), d = 1 / iscale (float32), and
bsums = the sums of q over each 16 values. The x86 builds round the product
iscale * x to float first; the arm64 builds' GCC contracts the product and
the addition into one FMA (`fmla`), so there q is the exact product rounded
half to even (the chain's `Q8_K_FMA`; a value between the two roundings
gets another q).

The kernels take the fields as separate arrays (`*_fields` functions, numba);
`quantize_q8_0_act` / `quantize_q8_1_act` / `quantize_q8_k_act` return the
ggml block bytes (layout of `strata_ref.types.block_format`), for tests
against ggml's C.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._digest import jit
from ..numerics import f32_to_f16_bits
from ..types import GGMLType, block_format

__all__ = ["quantize_q8_0_act", "quantize_q8_1_act", "quantize_q8_k_act",
           "q8_0_fields", "q8_1_fields", "q8_k_fields", "round_to_f16", "quantize_rows_q8_ref",
           "quantize_rows_q8_x86", "quantize_rows_q8_arm"]


@njit(inline="always", cache=True)
def round_to_f16(v):
    """The float32 value of fp16(v) (round to nearest even), for finite v.
    Overflow gives +-inf. Powers of two scale exactly, so rint does the RNE."""
    a = abs(v)
    if a == 0.0 or a != a:
        return np.float32(v)
    m, e = math.frexp(a)            # a = m * 2^e, m in [0.5, 1)
    ulp_e = max(e - 11, -24)        # fp16: 11 significant bits, min ulp 2^-24
    ulp = math.ldexp(1.0, ulp_e)
    r = np.rint(a / ulp) * ulp
    if r > 65504.0:
        r = np.inf
    return np.float32(r if v > 0 else -r)


@njit(inline="always", cache=True)
def _q8_32(x, q, d, s, with_sum, ref, inv_d=False):
    # x: (n, k) float32; q: (n, k) int8; d, s: (n, k/32) float32; ref:
    # roundf and id = 1 / d; else round half to even and id = 127 / amax,
    # or with inv_d (ARM NEON) id = 1 / d
    n, k = x.shape
    for t in range(n):
        for i in range(k // 32):
            amax = np.float32(0.0)
            for j in range(32):
                a = abs(x[t, i * 32 + j])
                if ref:       # ggml's MAX(amax, a): a NaN a is taken, and the next a replaces it
                    amax = amax if amax > a else a
                elif a > amax:
                    amax = a
            dd = np.float32(amax / np.float32(127.0))
            if ref or inv_d:
                idd = np.float32(np.float32(1.0) / dd) if dd != 0 else np.float32(0.0)
            else:
                idd = np.float32(np.float32(127.0) / amax) if amax != 0 else np.float32(0.0)
            tot = 0
            for j in range(32):
                xv = np.float32(x[t, i * 32 + j] * idd)
                if ref:       # roundf: half away from zero (exact in double)
                    v = math.copysign(math.floor(abs(np.float64(xv)) + 0.5), xv)
                else:
                    v = np.rint(xv)
                iv = int(v)
                q[t, i * 32 + j] = iv
                # the portable code sums the int8 it stored (a NaN stores 0
                # where the conversion's overflow value is cut to 8 bits)
                tot += q[t, i * 32 + j] if ref else iv
            d[t, i] = round_to_f16(dd)
            if with_sum:
                s[t, i] = round_to_f16(np.float32(dd * np.float32(tot)))


@jit
def quantize_rows_q8_ref(x, q, d, s, with_sum):
    """ggml `quantize_row_q8_0_ref` (with_sum False) / `quantize_row_q8_1_ref`
    (True) of each row of x (float32 (n, k), k % 32 == 0) into q int8 (n,
    k), d and s float32 (n, k/32) (s untouched without the sum): the
    portable quantizer (`isa.generic`)."""
    _q8_32(x, q, d, s, with_sum, True)


@jit
def quantize_rows_q8_x86(x, q, d, s, with_sum):
    """ggml-cpu's x86 `quantize_row_q8_0` / `quantize_row_q8_1` (the
    `__AVX2__ || __AVX__` code of `arch/x86/quants.c`), as
    `quantize_rows_q8_ref` otherwise (`isa.x86_avx2`)."""
    _q8_32(x, q, d, s, with_sum, False)


@jit
def quantize_rows_q8_arm(x, q, d, s, with_sum):
    """ggml-cpu's arm64 `quantize_row_q8_0` / `quantize_row_q8_1` (the
    `__ARM_NEON` code of `arch/arm/quants.c`): d = amax / 127, id = 1 / d
    (0 when d is 0), q = `vcvtnq_s32_f32(x * id)` (round half to even);
    otherwise as `quantize_rows_q8_ref` (`isa.arm_neon`)."""
    _q8_32(x, q, d, s, with_sum, False, True)


def _rows_q8(ref: bool, isa):
    if isa is not None:
        return isa.resolve("quantize_rows_q8")
    return quantize_rows_q8_ref if ref else quantize_rows_q8_x86


def _check(x, qk):
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"activations must be float32, got {x.dtype}")
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2 or x.shape[1] % qk:
        raise ValueError(f"activations must be (n, k) with k a multiple of {qk}, got {x.shape}")
    return np.ascontiguousarray(x)


def q8_0_fields(x, qdtype=np.int8, ref: bool = False, isa=None):
    """ggml-cpu's AVX `quantize_row_q8_0` (ref: `quantize_row_q8_0_ref`; isa:
    the quantizer of that instruction-set chain, `strata_ref.cpu.isa`) of
    each row of x (float32 (n, k), k % 32 == 0): returns q (n, k) and d
    float32 (n, k/32) holding the fp16-rounded scales. q is int8, or the same
    integers as `qdtype` (float32 for the kernels)."""
    x = _check(x, 32)
    q = np.empty(x.shape, np.int8)
    d = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    _rows_q8(ref, isa)(x, q, d, d, False)
    return q.astype(qdtype, copy=False), d


def q8_1_fields(x, qdtype=np.int8, ref: bool = False, isa=None):
    """ggml-cpu's AVX `quantize_row_q8_1` (ref: `quantize_row_q8_1_ref`;
    isa: that chain's): q (n, k) as int8 (or `qdtype`), d and s float32 (n,
    k/32), both fp16-rounded (s = fp16(d * sum q))."""
    x = _check(x, 32)
    q = np.empty(x.shape, np.int8)
    d = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    s = np.empty_like(d)
    _rows_q8(ref, isa)(x, q, d, s, True)
    return q.astype(qdtype, copy=False), d, s


@jit
def _q8_k(x, q, d, bsums, pos_rows, fused=False):
    n, k = x.shape
    for t in range(n):
        for i in range(k // 256):
            base = i * 256
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for j in range(256):
                a = abs(x[t, base + j])
                if a > amax:
                    amax = a
                    mx = x[t, base + j]
            if t < pos_rows:
                # ggml_quantize_mat_q8_K_4x8: +amax wins a tie with -amax
                for j in range(256):
                    if x[t, base + j] == amax:
                        mx = amax
            if amax == 0:
                d[t, i] = 0.0
                for j in range(256):
                    q[t, base + j] = 0
                for j in range(16):
                    bsums[t, i * 16 + j] = 0
                continue
            iscale = np.float32(np.float32(-127.0) / mx)
            for j in range(256):
                if fused:
                    # fma(iscale, x, 1.5 * 2^23): the exact product (a
                    # double holds it) rounded half to even
                    v = int(np.rint(np.float64(iscale) * np.float64(x[t, base + j])))
                else:
                    v = int(np.rint(np.float32(iscale * x[t, base + j])))
                q[t, base + j] = min(127, v)
            for j in range(16):
                tot = 0
                for jj in range(16):
                    tot += int(q[t, base + j * 16 + jj])
                bsums[t, i * 16 + j] = tot
            if iscale == 0:
                # an infinite amax: C's 1 / +-0 is +-inf (numba's division
                # would raise ZeroDivisionError)
                d[t, i] = np.float32(np.copysign(np.inf, iscale))
            else:
                d[t, i] = np.float32(np.float32(1.0) / iscale)


def q8_k_fields(x, qdtype=np.int8, mat_rows: int = 0, isa=None):
    """ggml `quantize_row_q8_K_ref` of each row of x (float32 (n, k), k % 256
    == 0): q (n, k) as int8 (or `qdtype`), d float32 (n, k/256), bsums int32
    (n, k/16). The first `mat_rows` rows follow ggml-cpu's x86
    `ggml_quantize_mat_q8_K_4x8` instead (the repacked Q4_K path quantizes
    whole groups of 4 rows with it): the same except that when +amax and
    -amax both occur in a super-block, +amax is the maximum (the reference
    takes the first one). isa: the instruction-set chain whose build is
    followed (its `Q8_K_FMA`; None: x86's rounding)."""
    x = _check(x, 256)
    q = np.empty(x.shape, qdtype)
    d = np.empty((x.shape[0], x.shape[1] // 256), np.float32)
    bsums = np.empty((x.shape[0], x.shape[1] // 16), np.int32)
    _q8_k(x, q, d, bsums, int(mat_rows), bool(isa.resolve("Q8_K_FMA")) if isa is not None else False)
    return q, d, bsums


def _pack(t, parts):
    fmt = block_format(t)
    n = next(iter(parts.values())).shape[0]
    out = np.zeros((n, fmt.block_bytes), np.uint8)
    for name, arr in parts.items():
        f = fmt.field(name)
        out[:, f.offset:f.offset + f.nbytes] = np.ascontiguousarray(arr).view(np.uint8).reshape(n, -1)
    return out


def quantize_q8_0_act(x, ref: bool = False, isa=None) -> np.ndarray:
    """Q8_0 blocks (uint8 (k/32, 34)) of a float32 vector x, by ggml-cpu's
    AVX `quantize_row_q8_0` (ref: the reference quantizer; isa: that
    instruction-set chain's; module docstring). TypeError / ValueError for
    a non-float32 input or a length not a multiple of 32."""
    q, d = q8_0_fields(np.asarray(x).reshape(1, -1), ref=ref, isa=isa)
    return _pack(GGMLType.Q8_0, {"d": f32_to_f16_bits(d.reshape(-1)),
                                 "qs": q.reshape(-1, 32)})


def quantize_q8_1_act(x, ref: bool = False, isa=None) -> np.ndarray:
    """Q8_1 blocks (uint8 (k/32, 36)) by ggml-cpu's AVX `quantize_row_q8_1`
    (ref: `quantize_row_q8_1_ref`; isa: that chain's)."""
    q, d, s = q8_1_fields(np.asarray(x).reshape(1, -1), ref=ref, isa=isa)
    return _pack(GGMLType.Q8_1, {"d": f32_to_f16_bits(d.reshape(-1)),
                                 "s": f32_to_f16_bits(s.reshape(-1)),
                                 "qs": q.reshape(-1, 32)})


def quantize_q8_k_act(x, isa=None) -> np.ndarray:
    """Q8_K blocks (uint8 (k/256, 292)) by ggml `quantize_row_q8_K_ref` as
    the build of instruction-set chain `isa` compiled it (None: x86)."""
    q, d, bsums = q8_k_fields(np.asarray(x).reshape(1, -1), isa=isa)
    return _pack(GGMLType.Q8_K, {"d": d.reshape(-1), "qs": q.reshape(-1, 256),
                                 "bsums": bsums.reshape(-1, 16).astype(np.int16)})
