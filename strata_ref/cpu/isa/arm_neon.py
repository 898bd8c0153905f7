"""The arm64 NEON build without dotprod (ggml's `armv8.0_1` variant,
`-march=armv8-a`: NEON and FMA, no DOTPROD, no FP16 vector arithmetic):
llama.cpp vendored by llama-cpp-python 0.3.36, cross-compiled by Debian's
GCC 12.2 (docs/arm64.md; `tools/arm_ref.py` builds it).

What NEON decides (ggml-cpu sources; docs/arm64.md says how each was
established):

* FMA is part of the AArch64 baseline: GCC contracts C's `a * b + c`
  (`FMA`), as in the x86 FMA builds.
* `simd-mappings.h`: `GGML_F32_VEC` is a 4-lane `float32x4_t`,
  `GGML_F32_STEP` 16 (four accumulators), `GGML_F32_VEC_FMA` =
  `vfmaq_f32` (fused); `GGML_F32x4_REDUCE` adds x0 += x2, x1 += x3, x0 +=
  x1 lane-wise, then `vaddvq_f32`, two `faddp`: (v0 + v1) + (v2 + v3).
  Without FP16 vector arithmetic the F16 macros widen to the same F32
  vectors (`GGML_F32Cx4`, `GGML_F16_STEP` 16). GCC 12 vectorizes the tail
  of `ggml_vec_dot_f32` as on x86 (`F32_TAIL_FMA` 4).
* `vec.h`: the NEON `ggml_v_expf` / `ggml_v_silu` are the AVX2+FMA
  polynomial with the same fused steps (`x86_64.expf_bits(fused=True)`),
  on 4 lanes, each vector of `ggml_vec_soft_max_f32` summed by
  `vaddvq_f32`; the `n % 4` values left go through libm's `expf`.
* `ggml_vec_dot_bf16` has no ARM SIMD path: the generic double sum.
* `arch/arm/quants.c`: `quantize_row_q8_0` / `_q8_1` with `id = 1 / (amax
  / 127)` and `vcvtnq_s32_f32` (round half to even)
  (`act_quant.quantize_rows_q8_arm`); the legacy quants' `vec_dot`s keep
  two 4-lane float accumulators (even and odd blocks), whose integer lanes
  here come from `ggml_vdotq_s32`'s `vmull_s8` + `vpaddlq_s16` (`VEC_DOT`
  "neon", `neon_legacy`).
* llamafile: `tinyBLAS<4, float32x4_t>` for F32 weights from 4 activation
  rows (`TINYBLAS_F32_MIN_ROWS`) and for F16 weights times the F32
  activations as they are (`TINYBLAS_F16_F32B`: no F16 tinyBLAS on a
  build without FP16 vector arithmetic, so a product whose activations
  had to be converted first takes `ggml_vec_dot_f16`); no BF16 tinyBLAS,
  no `tinyBLAS_Q0` without dotprod.
* `rotate_pairs` (RoPE, ops.cpp): GCC contracts the other product of y0
  than on x86 in the loop it vectorizes (`ROPE_FMA` 2).
* No CPU_REPACK layout without dotprod, no tiled mat-mul (x86 only).
* ggml-base, compiled for the same FMA baseline, contracts the Q8_K
  reference quantizer's `iscale * x + 1.5 * 2^23` (`Q8_K_FMA`).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import act_quant
from ..fp import fma32, hsum4
from ..vec import operand, rest_in_double
from . import generic as _generic
from . import x86_avx2 as _avx2

_F32 = np.float32

FMA = True
#: aarch64's base instruction set has FMA, so ggml-base's reference quantizers
#: are contracted too (`strata_ref.cpu.base_quant`)
BASE_FMA = True
F32_EPR = F16_EPR = 4
F32_STEP = F16_STEP = 16
EXPF_LANES = 4
TINYBLAS = 4
TINYBLAS_BF16 = 0
F32_TAIL_FMA = 4
TINYBLAS_F32_MIN_ROWS = 4
TINYBLAS_F16_F32B = True
#: `rotate_pairs` (ops.cpp): GCC vectorizes the normal-style loop (pairs 2i,
#: 2i+1) with y0 = fma(-x1, sin, round(x0 cos)), y1 = fma(x0, sin,
#: round(x1 cos)) (disassembly: `fmul`, `fmls` / `fmla`; SmolLM2's logits);
#: the NeoX loop stays scalar, taken as on x86 (its y1 is not pinned by
#: the stored data yet: the tiny NeoX models give llama.cpp's bits either way)
ROPE_FMA = 2
#: `quantize_row_q8_K_ref` (ggml-quants.c; ggml-base is built with the same
#: FMA baseline): GCC vectorizes `nearest_int(iscale * x)` as `fmla` of
#: 1.5 * 2^23 and iscale * x (disassembly), so each q is the exact product
#: rounded half to even, not the rounded product (smollm2-q2_k's logits)
Q8_K_FMA = BASE_FMA
#: aarch64 glibc's `expm1f` (under `tanhf`) is contracted by GCC too
#: (`libm.a` disassembly: `fmadd` / `fmsub` / `fnmsub`; `cpu.libm`)
LIBM_FMA = BASE_FMA

#: every quantized weight type has a NEON `vec_dot` in arch/arm/quants.c
#: (the legacy quants' over `ggml_vdotq_s32`'s lanes: `neon_legacy`); a
#: family without a "neon" kernel for a type says so when asked
VEC_DOT = {t: "neon" for t in _generic.VEC_DOT}
TILED = {}
REPACK: dict = {}
TINYBLAS_Q0: dict = {}


# `madd` (GCC contracts C's `a * b + c`: one FMA) and the FMA `ggml_v_expf` /
# `ggml_v_silu` polynomial, one lane and on an F32x8, are the AVX2+FMA
# build's: the NEON code of vec.h runs the same fused steps
madd, expf_v, silu_v, expf8, silu8 = (_avx2.madd, _avx2.expf_v, _avx2.silu_v, _avx2.expf8,
                                      _avx2.silu8)


@njit(inline="always", cache=True)
def lane_sum(w, c0):
    """`vaddvq_f32` of w[c0:c0+4]: (v0 + v1) + (v2 + v3)."""
    return hsum4(w, c0)


@njit(inline="always", cache=True)
def reduce_f32(acc):
    """`GGML_F32x4_REDUCE` of four 4-lane accumulators acc[0:16] (acc[4k:4k
    + 4] is x_k): r = (x0 + x2) + (x1 + x3) lane-wise, then `vaddvq_f32`."""
    for lane in range(4):
        acc[lane] = _F32(_F32(acc[lane] + acc[8 + lane]) + _F32(acc[4 + lane] + acc[12 + lane]))
    return hsum4(acc, 0)


@njit(inline="always", cache=True)
def reduce_f32_cols(acc, d, dst):
    """`reduce_f32` of the columns d..d+7 of acc (16, m) into dst[d:d+8]."""
    for j in range(d, d + 8):
        r0 = _F32(_F32(acc[0, j] + acc[8, j]) + _F32(acc[4, j] + acc[12, j]))
        r1 = _F32(_F32(acc[1, j] + acc[9, j]) + _F32(acc[5, j] + acc[13, j]))
        r2 = _F32(_F32(acc[2, j] + acc[10, j]) + _F32(acc[6, j] + acc[14, j]))
        r3 = _F32(_F32(acc[3, j] + acc[11, j]) + _F32(acc[7, j] + acc[15, j]))
        dst[j] = _F32(_F32(r0 + r1) + _F32(r2 + r3))


@njit(inline="always", cache=True)
def hsum(acc):
    """tinyBLAS's `hsum(float32x4_t)` = `vaddvq_f32` of acc[0:4]."""
    return hsum4(acc, 0)


@njit(inline="always", cache=True)
def hsum_cols(acc, d, dst):
    """`hsum` of the columns d..d+7 of acc (4, m) into dst[d:d+8]."""
    for j in range(d, d + 8):
        dst[j] = _F32(_F32(acc[0, j] + acc[1, j]) + _F32(acc[2, j] + acc[3, j]))


@njit(inline="always", cache=True)
def _main16(a, ao, b, bo, main, acc):
    # the SIMD part of the F32 / F16 dots: four 4-lane FMA accumulators
    # over steps of 16 (acc[4k + lane] is lane `lane` of accumulator k),
    # then GGML_F32x4_REDUCE
    for i in range(16):
        acc[i] = _F32(0.0)
    for s in range(0, main, 16):
        for i in range(16):
            acc[i] = fma32(operand(a, ao + s + i), operand(b, bo + s + i), acc[i])
    return reduce_f32(acc)


@njit(inline="always", cache=True)
def vec_dot_f16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f16` without FP16 vector arithmetic (`vec.cpp`, the
    `GGML_F32Cx4` macros) of a[ao:ao+n] and b[bo:bo+n] (`vec.operand`): the
    operands widened to F32, four 4-lane FMA accumulators over steps of 16,
    `reduce_f32`, the result and then the rest of the row (each product
    rounded to float) added in double."""
    main = n - n % 16
    return rest_in_double(_main16(a, ao, b, bo, main, acc), a, ao, b, bo, main, n)


@njit(inline="always", cache=True)
def vec_dot_f32(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f32`, NEON: the SIMD part as `vec_dot_f16`, kept in
    float, then GCC's vectorized tail (products of 4 rounded and added one
    by one, the last `n % 4` contracted into FMAs; the x86 builds' rule,
    `x86_avx2.vec_dot_f32_tail`)."""
    main = n - n % 16
    s = _main16(a, ao, b, bo, main, acc)
    fused = n - (n - main) % 4
    for i in range(main, n):
        if i < fused:
            s = _F32(s + _F32(a[ao + i] * b[bo + i]))
        else:
            s = fma32(a[ao + i], b[bo + i], s)
    return s


@njit(inline="always", cache=True)
def tinyblas_dot(a, ao, b, bo, n, acc):
    """llamafile's `tinyBLAS<4, float32x4_t>`: one 4-lane accumulator, lane l
    taking the elements l, l + 4, ... by FMA (`vfmaq_f32`; n a multiple of
    4), then `vaddvq_f32`."""
    for i in range(4):
        acc[i] = _F32(0.0)
    for s in range(0, n, 4):
        for i in range(4):
            acc[i] = fma32(operand(a, ao + s + i), operand(b, bo + s + i), acc[i])
    return hsum4(acc, 0)


#: `quantize_row_q8_0` / `_q8_1`, `arch/arm/quants.c` (`__ARM_NEON`)
quantize_rows_q8 = act_quant.quantize_rows_q8_arm
