"""The x86 build with AVX but neither F16C, FMA nor AVX2, as ggml's
`sandybridge` variant builds it (SSE4.2, AVX): what differs from the AVX
build without FMA (`x86_avx_nofma`, the next module of the chain).
Sources: ggml-cpu of llama.cpp v0.4.0 (docs/prebuilt.md), GCC 11.4.

* llamafile takes F16 weights only where `(__AVX__ || __AVX2__) &&
  __F16C__` (`llamafile_sgemm`, GGML_TYPE_F16): here never, so F16
  weights and the attention's K q and V p over an F16 cache take
  `ggml_vec_dot_f16` for every batch (F32 weights keep tinyBLAS<8>).
* The F16 loads and stores of `simd-mappings.h` convert in software
  (`__avx_f32cx8_load` / `_store` over `GGML_CPU_FP16_TO_FP32` /
  `_FP32_TO_FP16`): widening is exact and the narrowing rounds to nearest
  even as `vcvtps2ph` does, so the values are F16C's.
"""
from __future__ import annotations

TINYBLAS_F16 = False
