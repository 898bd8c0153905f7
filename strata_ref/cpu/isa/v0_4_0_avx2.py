"""llama.cpp v0.4.0 on its builds with AVX2 (the haswell, skylakex, zen4
variants and the ones aliased to them): what it computes there that its
other builds do not. Placed before `v0_4_0` in those chains.

* `TILED`: the IQ panel gemm (ggml-cpu/iqp.cpp, `ggml_cpu_iqp_supports_mul_mat`
  / `_mul_mat_id`; `ggml_compute_forward_mul_mat` tries it right after the
  activations are quantized to q8_K). It takes the 256-value I-quants
  (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_XS) when the
  build has AVX2 (`ggml_cpu_has_avx2`, a compile-time answer, so the
  pre-AVX2 variants never take it), the weight tensor's rows are a multiple
  of 8 (`IQP_NB_ROWS`) and there are 8 or more activation rows
  (`GGML_IQP_MIN_BATCH`; for a MUL_MAT_ID, 8 or more rows routed to the
  expert, `GGML_IQP_MIN_BATCH_ID`). Its arithmetic is
  `strata_ref.cpu.dots_iquants`'s "iqp" kernel: one exact integer per
  super-block and `sumf = fma(float(sumi), dfac * d_a, sumf)`.
"""
from __future__ import annotations

from ...types import GGMLType as T

#: {type: kernel variant} from 8 activation rows
TILED = {t: "iqp" for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M,
                            T.IQ4_XS)}
