"""The AVX2 build (ggml's `haswell` variant: SSE4.2, AVX, F16C, FMA, AVX2,
BMI2): llama.cpp vendored by llama-cpp-python 0.3.36, GCC 12.

What AVX2 decides (ggml-cpu sources):

* `simd-mappings.h`: `GGML_F32_VEC` / `GGML_F32Cx8` are 8-lane `__m256`,
  `GGML_F32_STEP` 32 (four accumulators), `GGML_F32x8_REDUCE` adds them as
  (x0 + x2) + (x1 + x3), then the 8 lanes as t_i = r_i + r_{4+i} and
  (t0 + t1) + (t2 + t3); `vec.cpp`'s dots add the rest of a row in double.
  GCC 12 vectorizes the tail of `ggml_vec_dot_f32` (products of 8 / 4
  rounded, added one by one) and contracts its last elements (fewer than
  4) into FMAs.
* `vec.h`: the AVX2 + FMA `ggml_v_expf` (`x86_64.expf_bits` with FMAs) on
  8 lanes, each vector's lanes summed by `hsum_float_8`.
* FMA: GCC contracts `a * b + c` in C code.
* `arch/x86/quants.c`: `quantize_row_q8_0` / `_q8_1` with `127 / amax` and
  round half to even (`act_quant.quantize_rows_q8_x86`); every weight type
  but Q2_0 has an `__AVX2__` `vec_dot` (`VEC_DOT`).
* `ggml_vec_dot_bf16`: the AVX2 branch, four 8-lane FMA accumulators over
  steps of 32, (c1 + c3) + (c2 + c4), `hsum`, the rest in double.
* llamafile's tinyBLAS: 8 float lanes (`tinyBLAS<8, __m256, ...>`, BF16
  widened to float the same way), `tinyBLAS_Q0_AVX` for Q8_0, Q4_0, Q5_0
  and IQ4_NL; ggml's tiled K-quant / I-quant mat-mul (`tiled/`); the
  CPU_REPACK layouts `ggml_repack_get_optimal_repack_type` picks with AVX2.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ...types import GGMLType as T
from .. import act_quant
from ..fp import fma32, hsum8, sum8_halves
from ..simd import f8_add, f8_div, f8_fma, f8_hsum, f8_lane, f8_load, f8_splat, f8_store, f8_sub, f8_zero
from ..vec import load8, rest_in_double
from .x86_64 import expf8_bits, expf_bits

_F32 = np.float32

FMA = True
F32_EPR = F16_EPR = 8
F32_STEP = F16_STEP = 32
EXPF_LANES = 8
TINYBLAS = 8
TINYBLAS_BF16 = 8
F32_TAIL_FMA = 4
#: GCC 12 contracts `rotate_pairs` as y0 = fma(x0, cos, -(x1 sin)), y1 =
#: fma(x0, sin, x1 cos) (`ops.rope`)
ROPE_FMA = 1

#: the weight types with an `__AVX2__` `vec_dot` in arch/x86/quants.c (Q2_0
#: has none: arch-fallback.h aliases the generic one)
VEC_DOT = {t: "x86" for t in (
    T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
    T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.IQ4_NL, T.IQ4_XS,
    T.TQ1_0, T.TQ2_0, T.MXFP4, T.NVFP4, T.Q1_0)}
#: `ggml_tiled_supported`'s types (tiled/tiled.cpp), from 8 activation
#: rows: {type: kernel variant}
TILED = {t: "tiled" for t in (T.Q6_K, T.Q5_K, T.Q4_K, T.Q3_K, T.Q2_K, T.IQ4_XS, T.IQ2_XXS, T.IQ2_XS,
                              T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)}
#: CPU_REPACK layouts (`ggml_repack_get_optimal_repack_type`, x86 with AVX2)
REPACK = {T.Q4_0: "q4_0_8x8", T.Q4_K: "q4_K_8x8", T.IQ4_NL: "iq4_nl_8x8", T.MXFP4: "mxfp4_8x8"}
#: `llamafile_sgemm`'s quantized weight types (`tinyBLAS_Q0_AVX`)
#: (`tinyBLAS_Q0_AVX` computes what the AVX2 `vec_dot` of Q8_0, Q4_0 and Q5_0
#: computes; IQ4_NL its own order)
TINYBLAS_Q0 = {T.Q8_0: "x86", T.Q4_0: "x86", T.Q5_0: "x86", T.IQ4_NL: "tinyblas_q0"}


@njit(inline="always", cache=True)
def madd(a, b, c):
    """C's `a * b + c` contracted by GCC: one FMA."""
    return fma32(a, b, c)


@njit(inline="always", cache=True)
def expf_v(x):
    return expf_bits(x, True)


@njit(inline="always", cache=True)
def silu_v(x):
    return _F32(x / _F32(_F32(1.0) + expf_bits(_F32(_F32(0.0) - x), True)))


@njit(inline="always", cache=True)
def expf8(v):
    return expf8_bits(v, True)


@njit(inline="always", cache=True)
def silu8(v):
    return f8_div(v, f8_add(f8_splat(_F32(1.0)), expf8_bits(f8_sub(f8_zero(), v), True)))


@njit(inline="always", cache=True)
def lane_sum(w, c0):
    """`hsum_float_8` of w[c0:c0+8]."""
    return f8_hsum(f8_load(w, c0))


@njit(inline="always", cache=True)
def f8_sum_halves(r):
    """`fp.sum8_halves` of the lanes of the F32x8 r (the end of
    `GGML_F32x8_REDUCE`)."""
    t0 = _F32(f8_lane(r, 0) + f8_lane(r, 4))
    t1 = _F32(f8_lane(r, 1) + f8_lane(r, 5))
    t2 = _F32(f8_lane(r, 2) + f8_lane(r, 6))
    t3 = _F32(f8_lane(r, 3) + f8_lane(r, 7))
    return _F32(_F32(t0 + t1) + _F32(t2 + t3))


@njit(inline="always", cache=True)
def reduce_f32(acc):
    """`GGML_F32x8_REDUCE` of four 8-lane accumulators acc[0:32] (acc[8k:8k
    + 8] is x_k): r = (x0 + x2) + (x1 + x3) lane-wise, then t_i = r_i +
    r_{4+i} and (t0 + t1) + (t2 + t3)."""
    for lane in range(8):
        acc[lane] = _F32(_F32(acc[lane] + acc[16 + lane]) + _F32(acc[8 + lane] + acc[24 + lane]))
    return sum8_halves(acc)


@njit(inline="always", cache=True)
def reduce_f32_cols(acc, d, dst):
    """`reduce_f32` of the columns d..d+7 of acc (32, m) into dst[d:d+8]."""
    for lane in range(8):
        x = f8_add(f8_add(f8_load(acc[lane], d), f8_load(acc[16 + lane], d)),
                   f8_add(f8_load(acc[8 + lane], d), f8_load(acc[24 + lane], d)))
        f8_store(acc[lane], d, x)
    t0 = f8_add(f8_load(acc[0], d), f8_load(acc[4], d))
    t1 = f8_add(f8_load(acc[1], d), f8_load(acc[5], d))
    t2 = f8_add(f8_load(acc[2], d), f8_load(acc[6], d))
    t3 = f8_add(f8_load(acc[3], d), f8_load(acc[7], d))
    f8_store(dst, d, f8_add(f8_add(t0, t1), f8_add(t2, t3)))


@njit(inline="always", cache=True)
def hsum(acc):
    """tinyBLAS's `hsum(__m256)` of acc[0:8] (= `hsum_float_8`)."""
    return hsum8(acc)


@njit(inline="always", cache=True)
def hsum_cols(acc, d, dst):
    """`hsum` of the columns d..d+7 of acc (8, m) into dst[d:d+8]."""
    s0 = f8_add(f8_load(acc[4], d), f8_load(acc[0], d))
    s1 = f8_add(f8_load(acc[5], d), f8_load(acc[1], d))
    s2 = f8_add(f8_load(acc[6], d), f8_load(acc[2], d))
    s3 = f8_add(f8_load(acc[7], d), f8_load(acc[3], d))
    f8_store(dst, d, f8_add(f8_add(s0, s2), f8_add(s1, s3)))


@njit(inline="always", cache=True)
def vec_dot_f16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f16` of a[ao:ao+n] and b[bo:bo+n] (`vec.operand`):
    four 8-lane FMA accumulators over steps of 32, `reduce_f32`'s tree,
    the rest of the row added in double."""
    x0, x1, x2, x3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
    main = n - n % 32
    for s in range(0, main, 32):
        x0 = f8_fma(load8(a, ao + s), load8(b, bo + s), x0)
        x1 = f8_fma(load8(a, ao + s + 8), load8(b, bo + s + 8), x1)
        x2 = f8_fma(load8(a, ao + s + 16), load8(b, bo + s + 16), x2)
        x3 = f8_fma(load8(a, ao + s + 24), load8(b, bo + s + 24), x3)
    r = f8_add(f8_add(x0, x2), f8_add(x1, x3))
    return rest_in_double(f8_sum_halves(r), a, ao, b, bo, main, n)


@njit(inline="always", cache=True)
def vec_dot_f32_tail(main_dot, a, ao, b, bo, n, step, tail_fma):
    """`ggml_vec_dot_f32` with GGML_SIMD, `main_dot` the SIMD part of the
    first n - n % step values: the rest added to the float sum as GCC 12
    vectorized that loop (disassembly of the avx2 and avx512 builds):
    products rounded, added one by one in order, the last n % tail_fma
    ones contracted into FMAs."""
    main = n - n % step
    s = main_dot
    fused = n - (n - main) % tail_fma
    for i in range(main, n):
        if i < fused:
            s = _F32(s + _F32(a[ao + i] * b[bo + i]))
        else:
            s = fma32(a[ao + i], b[bo + i], s)
    return s


@njit(inline="always", cache=True)
def vec_dot_f32(a, ao, b, bo, n, acc):
    return vec_dot_f32_tail(vec_dot_f16(a, ao, b, bo, n - n % 32, acc), a, ao, b, bo, n, 32, 4)


@njit(inline="always", cache=True)
def vec_dot_bf16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_bf16`, AVX2 branch (a, b float32 holding bf16 values):
    four 8-lane FMA accumulators c1..c4 over steps of 32, (c1 + c3) + (c2 +
    c4), `hsum`, added to a double with the rest of the row."""
    c0, c1, c2, c3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
    main = n - n % 32
    for s in range(0, main, 32):
        c0 = f8_fma(f8_load(a, ao + s), f8_load(b, bo + s), c0)
        c1 = f8_fma(f8_load(a, ao + s + 8), f8_load(b, bo + s + 8), c1)
        c2 = f8_fma(f8_load(a, ao + s + 16), f8_load(b, bo + s + 16), c2)
        c3 = f8_fma(f8_load(a, ao + s + 24), f8_load(b, bo + s + 24), c3)
    return rest_in_double(f8_hsum(f8_add(f8_add(c0, c2), f8_add(c1, c3))), a, ao, b, bo, main, n)


@njit(inline="always", cache=True)
def tinyblas_dot(a, ao, b, bo, n, acc):
    """llamafile's tinyBLAS<8>: one 8-lane accumulator, lane l taking the
    elements l, l + 8, ... by FMA (n a multiple of 8), then `hsum`."""
    x = f8_zero()
    for s in range(0, n, 8):
        x = f8_fma(load8(a, ao + s), load8(b, bo + s), x)
    return f8_hsum(x)


#: tinyBLAS on BF16 weights (`tinyBLAS<8, __m256, __m256, ggml_bf16_t>`):
#: the bf16 values widened to float, the same FMA lanes
tinyblas_bf16 = tinyblas_dot

#: `quantize_row_q8_0` / `_q8_1`, `arch/x86/quants.c` (`__AVX2__ || __AVX__`)
quantize_rows_q8 = act_quant.quantize_rows_q8_x86
