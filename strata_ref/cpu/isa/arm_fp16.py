"""The arm64 build with dotprod and FP16 vector arithmetic (ggml's
`armv8.2_2` variant, `-march=armv8.2-a+dotprod+fp16`: NEON, FMA, DOTPROD,
FP16_VA): llama.cpp vendored by llama-cpp-python 0.3.36, cross-compiled by
Debian's GCC 12.2 (docs/arm64.md). Placed before `arm_dotprod`, whose
code it runs for everything but the F16 arithmetic.

What `__ARM_FEATURE_FP16_VECTOR_ARITHMETIC` changes (ggml-cpu sources):

* `simd-mappings.h`: the F16 macros compute in half precision
  (`GGML_F16_EPR` 8, `GGML_F16_STEP` 32, `vfmaq_f16`, `GGML_F16x8_REDUCE`
  adding the accumulators in binary16): `ggml_vec_dot_f16` is
  `fp16_va.vec_dot_f16` (the F16 KV cache's K q, F16 weights with fewer
  than 8 activation rows). `ggml_vec_mad_f16` / `ggml_vec_scale_f16` (flash
  attention's F16 V accumulator) too: `vfmaq_f16` / `vmulq_f16` with the
  float scalar rounded to F16 (`flash_attn._mad_f16`, `_scale_f16`, which
  read `F16_VA` and `F16_STEP`).
* llamafile (`sgemm.cpp`, `case GGML_TYPE_F16`): the F32-activation
  tinyBLAS of the plain NEON build is compiled out
  (`TINYBLAS_F16_F32B` off); F16 weights times activations converted to
  F16 take `tinyBLAS<8, float16x8_t>` (binary16 accumulators,
  `fp16_va.tinyblas_f16x8`) from 8 activation rows on
  (`TINYBLAS_F16_MIN_ROWS`; `if (n < 8) return false`), with k a multiple
  of 8 (the F16 vector's lanes, `F16_EPR`) and m of 4. F32 weights keep
  `tinyBLAS<4, float32x4_t>`.

Nothing else changes: every quantized `vec_dot`, the repacked layouts, the
activation quantizers and the other operations are `arm_dotprod`'s and
`arm_neon`'s (`ggml_mm.npz` of this build equals `armv8.2-dotprod`'s for
every type but F16).
"""
from __future__ import annotations

from .. import fp16_va

#: the F16 macros compute in binary16 (module docstring)
F16_VA = True
F16_EPR = 8
F16_STEP = 32
TINYBLAS_F16_F32B = False
TINYBLAS_F16_MIN_ROWS = 8

vec_dot_f16 = fp16_va.vec_dot_f16
