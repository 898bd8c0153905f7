"""ggml-cpu's AMX extra buffer (`ggml-cpu/amx/`), compiled where
`__AMX_INT8__ && __AVX512VNNI__`: ggml's `sapphirerapids` variant (zen4's
options plus AMX_TILE and AMX_INT8). Placed first in that profile's chain,
over the zen4 one; it decides nothing but which weights the AMX buffer
takes (`AMX`), and everything it does not take computes as the rest of the
chain says (CPU_REPACK, then the plain CPU buffer).

`AMX`: {weight type: the row length K must be a multiple of} of
`extra_buffer_type::supports_op` (ggml-cpu/amx/amx.cpp): Q4_0, Q4_1, Q8_0
(TILE_K, 32), Q4_K, Q5_K, Q6_K, IQ4_XS (QK_K, 256), F16 (16). The rest of
that predicate (a MUL_MAT, weight rows a multiple of 32) is
`traits.amx_buffer`; the arithmetic is `strata_ref.cpu.amx`.
"""
from __future__ import annotations

from ...types import GGMLType as T

AMX = {T.Q4_0: 32, T.Q4_1: 32, T.Q8_0: 32, T.Q4_K: 256, T.Q5_K: 256, T.Q6_K: 256, T.IQ4_XS: 256,
       T.F16: 16}
