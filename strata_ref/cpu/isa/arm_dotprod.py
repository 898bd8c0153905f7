"""The arm64 build with dotprod (ggml's `armv8.2_1` variant,
`-march=armv8.2-a+dotprod`: NEON, FMA, DOTPROD, no FP16 vector
arithmetic): llama.cpp vendored by llama-cpp-python 0.3.36, cross-compiled
by Debian's GCC 12.2 (docs/arm64.md). Placed before `arm_neon`, whose
float code it shares.

What `__ARM_FEATURE_DOTPROD` changes (ggml-cpu sources):

* `ggml_vdotq_s32` is `vdotq_s32`: lane L of the legacy quants' integer
  dots sums values 4L..4L+3 (and 16 further on), so their `vec_dot`s put
  other integers into the same float steps (`VEC_DOT` "dotprod",
  `neon_legacy`); Q1_0's and Q2_0's likewise (`dots_small`). The
  K-quant, I-quant and other `vec_dot`s reduce their lanes as integers
  first and do not change.
* llamafile's `tinyBLAS_Q0_ARM` for Q8_0 and Q4_0 weights from 2
  activation rows (`TINYBLAS_Q0`).
* CPU_REPACK (`ggml_repack_get_optimal_repack_type`, `repack.cpp`, on
  `ggml_cpu_has_dotprod()`): Q4_0, Q8_0, Q1_0, IQ4_NL, MXFP4 as `4x4`
  (rows % 4), Q4_K, Q5_K, Q6_K as `8x4` (rows % 8); the stored data's
  `repack` key lists what the build chose (docs/arm64.md "Repack layouts
  by variant"). Emulated: `q4_0_4x4`, `q8_0_4x4` (`neon_legacy`),
  `iq4_nl_4x4`, `mxfp4_4x4` (`dots_small`), the K-quant `8x4` ones
  (`kquant_dots`); not yet `q1_0_4x4`.
"""
from __future__ import annotations

from ...types import GGMLType as T

VEC_DOT = {t: "dotprod" for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q1_0, T.Q2_0)}
TINYBLAS_Q0 = {T.Q8_0: "tinyblas_q0_arm", T.Q4_0: "tinyblas_q0_arm"}
REPACK = {T.Q4_0: "q4_0_4x4", T.Q8_0: "q8_0_4x4", T.Q1_0: "q1_0_4x4", T.IQ4_NL: "iq4_nl_4x4",
          T.MXFP4: "mxfp4_4x4", T.Q4_K: "q4_K_8x4", T.Q5_K: "q5_K_8x4", T.Q6_K: "q6_K_8x4"}
