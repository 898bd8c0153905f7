"""The K-quant kernels of ggml-cpu's arm64 i8mm build (`-march=armv8.6-a+
dotprod+fp16+i8mm`; llama.cpp vendored by llama-cpp-python 0.3.36,
`arch/arm/quants.c`, `arch/arm/repack.cpp`, GCC 12.2; docs/arm64.md): the
CPU_REPACK layouts `q4_K_8x8`, `q5_K_8x8`, `q6_K_8x8` and the two-row
(`vmmlaq_s32`) `vec_dot`s of Q4_K and Q6_K.

Every integer is exact: per super-block (256 values, d, dmin from fp16)
S_j = scale_j * dot_j of each 32-value sub-block j (Q4_K / Q5_K, unsigned
values), M_j = min_j * bsum_j (the sum of the 32 activation quants), I =
sum S_j, M = sum M_j; Q6_K: I = sum over the 16 chunks of 16 values of
scale_c * dot(q - 32, x). With ds = d * d_a and dm = dmin * d_a (float32
products), what follows is float32, per output (`vmlaq_f32` /
`vmlsq_f32` are not fused by GCC 12, `vfmaq_f32` is):

* `GEMV` (`ggml_gemv_q{4,5,6}_K_8x8_q8_K`, activation rows past the last
  whole group of 4): Q4_K per sub-block `acc = fma(ds, float(S_j), acc)`,
  after the super-block `acc = acc - round(float(M) * dm)`; Q5_K the same
  per sub-block, but its mins per pair of sub-blocks (64 values): `acc =
  acc - round(dm * float(M_2k + M_2k+1))` after the pair; Q6_K `acc = acc +
  round(float(I) * ds)` (`vaddq_f32` of `vmul_f32` halves).
* `GEMM` (`ggml_gemm_q{4,5,6}_K_8x8_q8_K`, i8mm, whole groups of 4 rows;
  those rows quantized by `ggml_quantize_mat_q8_K_4x8`, ARM's generic C:
  the reference's arithmetic) and `MMLA` (the two-row `vec_dot` of Q4_K and
  Q6_K, where `mmla.two_rows` says ggml takes it): per super-block Q4_K /
  Q5_K `acc = acc - round(float(M) * dm)`, then `acc = acc + round(float(I)
  * ds)`; Q6_K the second step only. Where the two-row `vec_dot` is not
  taken (odd rows or chunks, a MUL_MAT_ID), the one-row NEON `vec_dot`'s
  arithmetic (`kquant_dots` mode NEON): Q4_K `fma(float(I), ds,
  fma(-float(M), dm, sum))`, Q6_K `fma(ds, float(I), sum)`.

The kernels are plain numba loops over the stored super-blocks (GGUF
layout: the repacked layouts only interleave rows, which changes no
integer).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..types import GGMLType
from ._digest import kquant_row_kernels
from .fp import fma32
from .mmla import THREADS, two_rows
from .simd import f16_at

__all__ = ["VARIANTS", "variant_kernels", "GEMV_GEMM", "MMLA"]

GEMV_GEMM, MMLA = 0, 1
_F32 = np.float32
_BB = {GGMLType.Q4_K: 144, GGMLType.Q5_K: 176, GGMLType.Q6_K: 210}


@njit(inline="always", cache=True)
def _scale_min(sc, j):
    # ggml `get_scale_min_k4`: sub-block j's 6-bit scale and min from the
    # 12 packed bytes sc[0:12]
    if j < 4:
        return np.int32(sc[j] & 63), np.int32(sc[j + 4] & 63)
    s = np.int32((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4))
    m = np.int32((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
    return s, m


@njit(inline="always", cache=True)
def _unpack_q45(w, o, q5, v, sc, mn):
    # one Q4_K / Q5_K super-block at w[o:]: unsigned values to v[0:256],
    # scales and mins to sc[0:8], mn[0:8]
    for j in range(8):
        sc[j], mn[j] = _scale_min(w[o + 4:o + 16], j)
    qs = o + (48 if q5 else 16)
    for g in range(4):
        for l in range(32):
            b = w[qs + 32 * g + l]
            lo = np.int32(b & 0xF)
            hi = np.int32(b >> 4)
            if q5:
                h = w[o + 16 + l]
                lo += 16 if h & (1 << (2 * g)) else 0
                hi += 16 if h & (2 << (2 * g)) else 0
            v[64 * g + l] = lo
            v[64 * g + 32 + l] = hi


@njit(inline="always", cache=True)
def _unpack_q6(w, o, v, sc):
    # one Q6_K super-block at w[o:]: signed values q - 32 to v[0:256], the
    # 16 int8 scales (one per 16 values) to sc[0:16]
    for c in range(16):
        sc[c] = np.int32(np.int8(w[o + 192 + c]))
    for half in range(2):
        ql = o + 64 * half
        qh = o + 128 + 32 * half
        for l in range(32):
            h = w[qh + l]
            base = 128 * half + l
            v[base] = np.int32((w[ql + l] & 0xF) | ((h & 3) << 4)) - 32
            v[base + 32] = np.int32((w[ql + l + 32] & 0xF) | (((h >> 2) & 3) << 4)) - 32
            v[base + 64] = np.int32((w[ql + l] >> 4) | (((h >> 4) & 3) << 4)) - 32
            v[base + 96] = np.int32((w[ql + l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32


def _make_kernels(t: GGMLType, mode: int):
    """The `_digest.RowKernels` (serial, parallel, span, split) k(raw, xq, xd, xb, n_gemm, out[, parts])
    of `kquant_dots.kernels`' interface (xb unused: the activation sums are
    taken from xq). GEMV_GEMM: the gemm for activation rows < n_gemm, the
    gemv for the others; MMLA: the two-row vec_dot where ggml takes it
    (n_gemm 0: never, a MUL_MAT_ID), else the one-row NEON one."""
    BB = _BB[t]
    Q6 = t == GGMLType.Q6_K
    Q5 = t == GGMLType.Q5_K
    MODE = mode

    @njit(inline="always")
    def superblock(v, sc, mn, xq, t_, xo, S, M):
        # the exact integers of one super-block with activation row t_ at
        # column xo: S[j], M[j] per sub-block (Q6_K: S[0] = I)
        if Q6:
            tot = np.int32(0)
            for c in range(16):
                s = np.int32(0)
                for i in range(16):
                    s += v[16 * c + i] * np.int32(xq[t_, xo + 16 * c + i])
                tot += sc[c] * s
            S[0] = tot
            return
        for j in range(8):
            s = np.int32(0)
            b = np.int32(0)
            for i in range(32):
                x = np.int32(xq[t_, xo + 32 * j + i])
                s += v[32 * j + i] * x
                b += x
            S[j] = sc[j] * s
            M[j] = mn[j] * b

    @njit(inline="always")
    def fsteps(acc, S, M, ds, dm, form):
        # one super-block's float steps (module docstring); form 0: gemv,
        # 1: gemm / two-row vec_dot, 2: the one-row NEON vec_dot
        if Q6:
            if form == 2:
                return fma32(ds, _F32(S[0]), acc)
            return _F32(acc + _F32(_F32(S[0]) * ds))
        I = np.int32(0)
        Mt = np.int32(0)
        for j in range(8):
            I += S[j]
            Mt += M[j]
        if form == 2:
            return fma32(_F32(I), ds, fma32(-_F32(Mt), dm, acc))
        if form == 1:
            acc = _F32(acc - _F32(_F32(Mt) * dm))
            return _F32(acc + _F32(_F32(I) * ds))
        for k in range(4):
            acc = fma32(ds, _F32(S[2 * k]), acc)
            acc = fma32(ds, _F32(S[2 * k + 1]), acc)
            if Q5:
                acc = _F32(acc - _F32(dm * _F32(M[2 * k] + M[2 * k + 1])))
        if not Q5:
            acc = _F32(acc - _F32(_F32(Mt) * dm))
        return acc

    @njit(inline="always")
    def rows(raw, xq, xd, xb, n_gemm, out, r0, r1):        # xb: unused (the interface's)
        n = xq.shape[0]
        nb = xd.shape[1]
        R = raw.shape[0]
        v = np.empty(256 * nb, np.int32)
        sc = np.empty(16 * nb, np.int32)
        mn = np.empty(8 * nb, np.int32)
        S = np.empty(8, np.int32)
        M = np.zeros(8, np.int32)
        for r in range(r0, r1):
            w = raw[r]
            for b in range(nb):
                if Q6:
                    _unpack_q6(w, b * BB, v[256 * b:], sc[16 * b:])
                else:
                    _unpack_q45(w, b * BB, Q5, v[256 * b:], sc[8 * b:], mn[8 * b:])
            for t_ in range(n):
                if MODE == MMLA:
                    form = 1 if n_gemm > 0 and two_rows(r, t_, R, n, THREADS) else 2
                else:
                    form = 1 if t_ < n_gemm else 0
                acc = _F32(0.0)
                for b in range(nb):
                    o = b * BB
                    d = f16_at(w, o + (208 if Q6 else 0))
                    dmin = _F32(0.0) if Q6 else f16_at(w, o + 2)
                    superblock(v[256 * b:], sc[(16 if Q6 else 8) * b:], mn[8 * b:], xq, t_, 256 * b, S, M)
                    acc = fsteps(acc, S, M, _F32(d * xd[t_, b]), _F32(dmin * xd[t_, b]), form)
                out[t_, r] = acc

    return kquant_row_kernels(rows, f"arm_kquant_{t.name}_mode{mode}")


#: the kernel variants an instruction-set chain names (`traits.kernel`):
#: the i8mm build's repacked layouts and its two-row vec_dot
VARIANTS = {"arm_q4_K_8x8": GEMV_GEMM, "arm_q5_K_8x8": GEMV_GEMM, "arm_q6_K_8x8": GEMV_GEMM,
            "neon_i8mm": MMLA}
_KERNELS: dict = {}


def variant_kernels(t, variant: str):
    """The `_digest.RowKernels` (serial, parallel, span, split) of K-quant type t in `variant` (a key of
    `VARIANTS`), compiled at the first use; KeyError for another variant or
    a type the variant has no kernel for."""
    key = (GGMLType(t), VARIANTS[variant])
    if key[0] not in _BB:
        raise KeyError(f"{key[0].name} has no arm64 i8mm K-quant kernel")
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = _make_kernels(*key)
    return k
