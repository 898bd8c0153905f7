"""ggml-cpu's portable C code: what a build computes where no instruction
set overrides it (the `*_generic` functions of `quants.c`, `vec.cpp` and
`vec.h` without `GGML_SIMD`, the reference quantizers of `ggml-quants.c`),
llama.cpp vendored by llama-cpp-python 0.3.36, GCC 12.

Every other instruction-set module falls back to this one
(`arch-fallback.h`), so it defines every name of the package's interface
(`strata_ref.cpu.isa`): the vector constants say "no SIMD" (0 lanes), the
float dots add each product to a double in order (`ggml_float`), the
exponential is libm's `expf` one value at a time, `a * b + c` rounds twice
(the x86-64 baseline has no FMA instruction for GCC to contract into), and
every weight type's `vec_dot` is its generic C function.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ...types import GGMLType as T
from .. import act_quant
from ..simd import f8_lane, f8_set
from ..vec import rest_in_double

_F32 = np.float32

FMA = False
#: whether GCC contracts `a*b + c` in ggml-base (ggml-quants.c, compiled without the
#: variant's flags): no FMA there on x86 (`strata_ref.cpu.base_quant`)
BASE_FMA = False
F32_EPR = F32_STEP = F16_EPR = F16_STEP = 0
#: the vector exp is libm's expf on one value at a time
EXPF_LANES = 1
TINYBLAS = 0
#: where the build has a tinyBLAS, llamafile takes F16 weights too (x86
#: needs F16C for it: `x86_avx_nof16c`)
TINYBLAS_F16 = True
TINYBLAS_BF16 = 0
F32_TAIL_FMA = 0
#: whether an FMA build contracts the flash-attention one-chunk kernel's
#: running sum `S = S*ms + vs` (ops.cpp): GCC 12 does (`FMA` decides)
FA_S_FMA = True
#: `rotate_pairs` (ops.cpp) without contraction (`ops.rope`)
ROPE_FMA = 0
#: `quantize_row_q8_K_ref` (ggml-quants.c, in ggml-base) rounds the product
#: `iscale * x` to float before `nearest_int` adds 1.5 * 2^23 (x86 builds
#: compile ggml-base without FMA: no contraction)
Q8_K_FMA = BASE_FMA
#: the C library's float functions (`cpu.libm`: glibc 2.36's `tanhf` over
#: `expm1f`) are x86-64 glibc's, compiled without FMA
LIBM_FMA = BASE_FMA
#: llamafile takes F32 weights from 2 activation rows (`llamafile_sgemm`)
TINYBLAS_F32_MIN_ROWS = 2
#: llamafile's F16 tinyBLAS multiplies F16 activations (converted first)
TINYBLAS_F16_F32B = False
#: the F16 vector macros compute in float32 (operands widened); True:
#: Arm's FP16 vector arithmetic, in binary16 (`isa.arm_fp16`, `fp16_va`)
F16_VA = False
#: llamafile takes F16 weights from 2 activation rows
TINYBLAS_F16_MIN_ROWS = 2

#: every quantized weight type's `ggml_vec_dot_*_generic` (quants.c)
VEC_DOT = {t: "generic" for t in (
    T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
    T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.IQ4_NL, T.IQ4_XS,
    T.TQ1_0, T.TQ2_0, T.MXFP4, T.NVFP4, T.Q1_0, T.Q2_0)}
#: no tiled mat-mul, no CPU_REPACK layouts, no llamafile
TILED = {}
REPACK: dict = {}
TINYBLAS_Q0: dict = {}
#: no AMX buffer (`x86_amx`)
AMX: dict = {}


@njit(inline="always", cache=True)
def madd(a, b, c):
    """C's `a * b + c` in float32 without contraction: two roundings."""
    return _F32(_F32(a * b) + c)


@njit(inline="always", cache=True)
def expf_v(x):
    """libm's expf (numba lowers float32 `math.exp` to it)."""
    return _F32(math.exp(x))


@njit(inline="always", cache=True)
def silu_v(x):
    """ggml `ggml_silu_f32`: x / (1 + expf(-x)), libm's expf."""
    return _F32(x / _F32(_F32(1.0) + _F32(math.exp(-x))))


@njit(inline="always", cache=True)
def expf8(v):
    """`expf_v` on each lane of an F32x8."""
    return f8_set(expf_v(f8_lane(v, 0)), expf_v(f8_lane(v, 1)), expf_v(f8_lane(v, 2)),
                  expf_v(f8_lane(v, 3)), expf_v(f8_lane(v, 4)), expf_v(f8_lane(v, 5)),
                  expf_v(f8_lane(v, 6)), expf_v(f8_lane(v, 7)))


@njit(inline="always", cache=True)
def silu8(v):
    """`silu_v` on each lane of an F32x8."""
    return f8_set(silu_v(f8_lane(v, 0)), silu_v(f8_lane(v, 1)), silu_v(f8_lane(v, 2)),
                  silu_v(f8_lane(v, 3)), silu_v(f8_lane(v, 4)), silu_v(f8_lane(v, 5)),
                  silu_v(f8_lane(v, 6)), silu_v(f8_lane(v, 7)))


@njit(inline="always", cache=True)
def lane_sum(w, c0):
    """One value: the scalar loop of `ggml_vec_soft_max_f32` adds each
    exponential to the double sum by itself."""
    return w[c0]


@njit(inline="always", cache=True)
def reduce_f32(acc):
    """Unused without GGML_SIMD (F32_STEP 0): the lanes summed in order."""
    s = _F32(0.0)
    for i in range(acc.shape[0]):
        s = _F32(s + acc[i])
    return s


@njit(inline="always", cache=True)
def reduce_f32_cols(acc, d, dst):
    """Unused without GGML_SIMD: `reduce_f32` of 8 columns."""
    for j in range(8):
        s = _F32(0.0)
        for i in range(acc.shape[0]):
            s = _F32(s + acc[i, d + j])
        dst[d + j] = s


hsum = reduce_f32
hsum_cols = reduce_f32_cols


@njit(inline="always", cache=True)
def vec_dot_f16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f16` without GGML_SIMD: each product of a[ao:ao+n] and
    b[bo:bo+n] (float32 holding fp16 values, or fp16 bits: `vec.operand`)
    rounded to float32 and added to a double, in order."""
    return rest_in_double(_F32(0.0), a, ao, b, bo, 0, n)


#: `ggml_vec_dot_f32` / `ggml_vec_dot_bf16` without SIMD: the same loop
#: over float32 operands (bf16 values held as float32)
vec_dot_f32 = vec_dot_bf16 = vec_dot_f16
#: no llamafile without SIMD (TINYBLAS 0): never called
tinyblas_dot = tinyblas_bf16 = vec_dot_f16

#: `quantize_row_q8_0_ref` / `quantize_row_q8_1_ref` (ggml-quants.c)
quantize_rows_q8 = act_quant.quantize_rows_q8_ref
