"""The arm64 build with dotprod, FP16 vector arithmetic and i8mm
(`-march=armv8.6-a+dotprod+fp16+i8mm`: what ggml's `apple_m2_m3` variant
asks for plus FP16, and what `GGML_NATIVE` gives on an i8mm core without
SVE; no ggml Linux variant has exactly these features): llama.cpp vendored
by llama-cpp-python 0.3.36, cross-compiled by Debian's GCC 12.2
(docs/arm64.md). Placed before `arm_fp16`, whose code it runs for
everything else.

What `__ARM_FEATURE_MATMUL_INT8` changes (ggml-cpu sources):

* llamafile is compiled out (`#undef GGML_USE_LLAMAFILE`, ggml-cpu.c):
  no tinyBLAS for F32 / F16 (`TINYBLAS` 0) nor `tinyBLAS_Q0_ARM`
  (`TINYBLAS_Q0` entries None): every plain product takes `vec_dot`.
* `type_traits_cpu[].nrows = 2` for Q4_0, Q4_1, Q8_0, Q4_K, Q6_K: their
  `vec_dot`s take 2 weight rows x 2 activation rows through `vmmlaq_s32`
  where ggml's chunking allows it (`mmla.two_rows`, for llama.cpp's thread
  count `mmla.THREADS`, 2, the stored data's), in another float order
  (`VEC_DOT` "i8mm": `neon_legacy` mode PAIRS_MMLA; "neon_i8mm":
  `arm_kquant`).
* CPU_REPACK (`ggml_repack_get_optimal_repack_type`): Q4_0, Q8_0, Q1_0 as
  `4x8` (rows % 4), Q4_K, Q5_K, Q6_K as `8x8` (rows % 8); IQ4_NL, MXFP4
  stay `4x4`. Emulated: `q4_0_4x8`, `q8_0_4x8` (`neon_legacy`
  REPACK_4X8), the K-quant `8x8` ones (`arm_kquant`, named `arm_q4_K_8x8`
  ... here: x86's `q4_K_8x8` is another kernel); not `q1_0_4x8`.
"""
from __future__ import annotations

from ...types import GGMLType as T

TINYBLAS = 0
TINYBLAS_Q0 = {T.Q8_0: None, T.Q4_0: None}
#: Q5_0: dotprod's code, with GCC 12.2's `usdot` in the odd last block
#: (`neon_legacy`)
VEC_DOT = {T.Q4_0: "i8mm", T.Q4_1: "i8mm", T.Q8_0: "i8mm", T.Q4_K: "neon_i8mm", T.Q6_K: "neon_i8mm",
           T.Q5_0: "i8mm_usdot"}
REPACK = {T.Q4_0: "q4_0_4x8", T.Q8_0: "q8_0_4x8", T.Q1_0: "q1_0_4x8", T.IQ4_NL: "iq4_nl_4x4",
          T.MXFP4: "mxfp4_4x4", T.Q4_K: "arm_q4_K_8x8", T.Q5_K: "arm_q5_K_8x8", T.Q6_K: "arm_q6_K_8x8"}
