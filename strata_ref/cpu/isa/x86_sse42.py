"""The x86 build with SSE4.2 and no AVX, as ggml's `sse42` variant builds
it (llama.cpp v0.4.0, GCC 11.4; docs/prebuilt.md): 4-lane SSE vectors and
no FMA. Its chain is this module, then `x86_64` (the SSE2 `ggml_v_expf`
on 4 lanes, unfused, and its lane sum: no AVX, so
`ggml_vec_soft_max_f32` adds each vector as (v0 + v1) + (v2 + v3)), then
`generic`: none of the AVX modules, whose tables it must not inherit.

* `simd-mappings.h`, `__SSE3__` branch: `GGML_F32_VEC` / `GGML_F32Cx4` are
  4-lane `__m128`, `GGML_F32_STEP` = `GGML_F16_STEP` = 32 (eight
  accumulators), `GGML_F32x4_FMA` a multiply and an add (no `__FMA__`),
  the F16 values widened in software (exact). `GGML_F32x4_REDUCE` adds
  the accumulators as x_i + x_{4+i}, then x_i + x_{i+2}, then x_0 + x_1,
  then `_mm_hadd_ps` twice: (l0 + l1) + (l2 + l3). `ggml_vec_dot_f16`
  adds the rest of a row in double, `ggml_vec_dot_f32` in the float sum.
* `ggml_vec_dot_bf16` has no SSE branch: the portable loop (`generic`).
* llamafile: none (its F32 and F16 tinyBLAS and `tinyBLAS_Q0_AVX` need
  `__AVX__`); no CPU_REPACK (`ggml_cpu_has_avx2()`).
* `arch/x86/quants.c`: `quantize_row_q8_0` / `_q8_1` are the references
  (their SIMD code needs `__AVX__`); only Q4_0 ("ssse3",
  `avx_legacy.SSSE3`) and Q1_0 ("ssse3", `dots_small`'s `_SSSE3_Q1`) have
  an SSSE3 `vec_dot`, every other weight type the generic C (checked
  against the shipped library's `ggml_mul_mat`,
  tests/data/v0.4.0-sse42/ggml_mm.npz).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ...types import GGMLType as T
from ..vec import operand, rest_in_double

_F32 = np.float32

F32_EPR = F16_EPR = 4
F32_STEP = F16_STEP = 32
VEC_DOT = {T.Q4_0: "ssse3", T.Q1_0: "ssse3"}


@njit(inline="always", cache=True)
def reduce_f32(acc):
    """`GGML_F32x4_REDUCE` of eight 4-lane accumulators acc[0:32] (acc[4j:4j
    + 4] is x_j): x_i + x_{4+i}, x_i + x_{i+2}, x_0 + x_1 lane-wise, then
    (l0 + l1) + (l2 + l3)."""
    for i in range(16):
        acc[i] = _F32(acc[i] + acc[16 + i])
    for i in range(8):
        acc[i] = _F32(acc[i] + acc[8 + i])
    for i in range(4):
        acc[i] = _F32(acc[i] + acc[4 + i])
    return _F32(_F32(acc[0] + acc[1]) + _F32(acc[2] + acc[3]))


@njit(inline="always", cache=True)
def reduce_f32_cols(acc, d, dst):
    """`reduce_f32` of the columns d..d+7 of acc (32, m) into dst[d:d+8]."""
    for j in range(8):
        c = d + j
        x = np.empty(32, np.float32)
        for i in range(32):
            x[i] = acc[i, c]
        dst[c] = reduce_f32(x)


@njit(inline="always", cache=True)
def _dot_main(a, ao, b, bo, main, acc):
    # the eight 4-lane accumulators: element e of a step of 32 in lane e,
    # acc + a * b unfused, then the reduction
    for i in range(32):
        acc[i] = _F32(0.0)
    for s in range(0, main, 32):
        for i in range(32):
            acc[i] = _F32(acc[i] + _F32(operand(a, ao + s + i) * operand(b, bo + s + i)))
    return reduce_f32(acc)


@njit(inline="always", cache=True)
def vec_dot_f16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f16` (`vec.operand` operands; acc a float32 scratch of
    at least 32): `_dot_main` over steps of 32, the rest in double."""
    main = n - n % 32
    return rest_in_double(_dot_main(a, ao, b, bo, main, acc), a, ao, b, bo, main, n)


@njit(inline="always", cache=True)
def vec_dot_f32(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f32`: `_dot_main` over steps of 32, the rest added to
    the float sum one rounded product at a time."""
    main = n - n % 32
    s = _dot_main(a, ao, b, bo, main, acc)
    for i in range(main, n):
        s = _F32(s + _F32(a[ao + i] * b[bo + i]))
    return s
