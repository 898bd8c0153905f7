"""llama.cpp release v0.4.0 as node-llama-cpp 3.21.1 ships it prebuilt
(GCC 11.4, `GGML_CPU_ALL_VARIANTS`): what it computes differently from the
llama.cpp of llama-cpp-python 0.3.36 built by GCC 12 (the other modules),
on the code a model's forward pass reaches. Placed first in the chain of a
v0.4.0 profile, over the instruction-set modules of its variant.

The differences (docs/prebuilt.md, "v0.4.0 against llama-cpp-python
0.3.36's llama.cpp", from a diff of the two source trees and a GCC 11 /
GCC 12 comparison of the compiled objects):

* `TILED`: v0.4.0 has no tiled mat-mul (`tiled/` is newer): K-quant
  weights outside a CPU_REPACK buffer take their `vec_dot` for every batch
  size. I-quant weights with rows % 8 == 0 take v0.4.0's IQ panel gemm
  (`iqp.cpp`) from 8 activation rows on builds with AVX2: the module
  `v0_4_0_avx2`, placed before this one in those chains.
* `FA_S_FMA`: GCC 11 computes flash attention's one-chunk running sum
  `S = S*ms + vs` (ops.cpp, `ggml_compute_forward_flash_attn_ext_f16_one_chunk`)
  as a rounded product and an add, where GCC 12 emits one FMA; the two
  differ once a later key raises the row maximum.

Everything else is the same source compiled the same way (the x86 kernels
of quants.c, repack.cpp, sgemm.cpp and vec.cpp are identical in both
trees).
"""
from __future__ import annotations

TILED = {}
FA_S_FMA = False
