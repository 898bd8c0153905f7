"""The x86 builds with AVX but without AVX2, as ggml's `piledriver`
variant builds them (SSE4.2, AVX, F16C, FMA): what differs from the AVX2
build (`x86_avx2`, the next module of the chain). Sources: ggml-cpu of
llama.cpp v0.4.0 (docs/prebuilt.md), GCC 11.4.

* `arch/x86/quants.c`, `#elif defined(__AVX__)` branches: the integer
  dots are formed on 128-bit halves, exact. Most give the AVX2 kernel's
  lanes (lane L the dot of values 4L..4L+3 of a block) and accumulate them
  with `_mm256_add_ps(_mm256_mul_ps(..))`, which GCC contracts into the
  AVX2 kernel's FMA on an FMA build: Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K,
  IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_XS, NVFP4 and
  Q1_0 keep "x86". Q4_0, Q8_0, IQ4_NL and MXFP4 take blocks in pairs into
  one 8-lane accumulator (`mul_sum_i8_quad_float`,
  `quad_fp16_delta_float`, `quad_mx_delta_float`): "avx"
  (`avx_legacy.PAIRS`, `dots_small`'s `_AVX_PAIRS`). Q2_K and Q3_K keep
  the AVX2 float steps over other lanes (16-value groups 0-3 of each 128
  values in lanes 0-3, 4-7 in lanes 4-7): "avx" (`kquant_unpacked`).
  Every type is checked against the shipped library's `ggml_mul_mat`
  (tests/data/v0.4.0-piledriver/ggml_mm.npz, docs/prebuilt.md). TQ1_0
  and TQ2_0 have only an AVX2 branch: the generic C.
* `REPACK`: `ggml_repack_get_optimal_repack_type` asks
  `ggml_cpu_has_avx2()` (a compile-time answer) for every x86 layout: none.
* llamafile: tinyBLAS<8> for F32, and for F16 (F16C is on);
  `tinyBLAS_Q0_AVX` for Q8_0, Q4_0, Q5_0, IQ4_NL with the AVX loads, the
  same lanes and (FMA) the same `madd`; no BF16 tinyBLAS (`__AVX2__` only):
  BF16 weights take `ggml_vec_dot_bf16`, whose AVX branch is the AVX2 one
  with another load.
* `vec.h` / `vec.cpp`: `ggml_v_expf` / `ggml_v_silu` are the `__SSE2__`
  versions on 4 lanes (the 8-lane one needs `__AVX2__ && __FMA__`), with
  `_mm_fmadd_ps` (`MADD128`, FMA build): the same value per lane as the
  AVX2 version; `ggml_vec_soft_max_f32` sums each 4-lane vector with the
  AVX build's `movehl` + `movehdup` adds: (v0 + v2) + (v1 + v3).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ...types import GGMLType as T

_F32 = np.float32

EXPF_LANES = 4
TINYBLAS_BF16 = 0
REPACK: dict = {}
VEC_DOT = {T.Q4_0: "avx", T.Q8_0: "avx", T.IQ4_NL: "avx", T.MXFP4: "avx", T.TQ1_0: "generic",
           T.TQ2_0: "generic", T.Q2_K: "avx", T.Q3_K: "avx"}


@njit(inline="always", cache=True)
def lane_sum(w, c0):
    """`ggml_vec_soft_max_f32`'s sum of the 4 lanes w[c0:c0+4] on an AVX
    build (`_mm_movehl_ps`, add, `_mm_movehdup_ps`, `add_ss`):
    (v0 + v2) + (v1 + v3)."""
    return _F32(_F32(w[c0] + w[c0 + 2]) + _F32(w[c0 + 1] + w[c0 + 3]))
