"""The x86 builds with AVX but neither AVX2 nor FMA, as ggml's `ivybridge`
variant builds them (SSE4.2, AVX, F16C): what differs from the AVX + FMA
build (`x86_avx`, the next module of the chain). Sources: ggml-cpu of
llama.cpp v0.4.0 (docs/prebuilt.md), GCC 11.4.

Without `-mfma` GCC has no FMA instruction to contract into, and ggml's
own FMA macros fall back to a multiply and an add: `GGML_F32x8_FMA`
(simd-mappings.h) and llamafile's `madd` (`add(mul(a, b), c)` unless
`__FMA__`), the SSE2 `ggml_v_expf`'s `MADD128` / `NMADD128`. So every
`a * b + c` rounds twice, with the AVX orders of `x86_avx` otherwise:

* the float dots (`vec.cpp` `ggml_vec_dot_f16`, `_f32`, `_bf16` and
  llamafile's tinyBLAS<8>): the AVX2 build's lanes and trees, each lane
  `acc + a * b`; the scalar tail of `ggml_vec_dot_f32` unfused too;
* the quantized `vec_dot`s: the AVX lanes of Q4_1, Q5_0, Q5_1 ("lanes_nofma",
  `avx_legacy.LANES`), Q4_K, Q5_K, Q6_K ("x86_nofma",
  `kquant_dots.LANES_NOFMA`), the I-quants with Q8_K activations
  ("x86_nofma", `dots_iquants`), the pairs of Q4_0, Q8_0 ("avx_nofma") and
  of IQ4_NL, MXFP4, and NVFP4's and Q1_0's lanes (`dots_small` reads
  `FMA`), Q2_K's and Q3_K's AVX lanes (`kquant_unpacked` reads `FMA`); `tinyBLAS_Q0_AVX`
  for Q8_0, Q4_0, Q5_0 is the unfused lanes, for IQ4_NL `dots_small`'s
  tinyBLAS path without FMA;
* `ggml_v_expf` / `ggml_v_silu`: the SSE2 versions unfused (`x86_64`'s);
* RoPE's `rotate_pairs` uncontracted (`ROPE_FMA` 0).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ...types import GGMLType as T
from ..simd import f8_add, f8_hsum, f8_mul, f8_zero
from ..vec import load8, rest_in_double
from .generic import madd  # noqa: F401  (C's a * b + c, two roundings)
from .x86_64 import expf8, expf_v, silu8, silu_v  # noqa: F401  (the SSE2 exp without FMA)
from .x86_avx2 import f8_sum_halves, vec_dot_f32_tail

_F32 = np.float32

FMA = False
ROPE_FMA = 0
VEC_DOT = {T.Q4_0: "avx_nofma", T.Q8_0: "avx_nofma", T.Q4_1: "lanes_nofma", T.Q5_0: "lanes_nofma",
           T.Q5_1: "lanes_nofma", T.Q4_K: "x86_nofma", T.Q5_K: "x86_nofma", T.Q6_K: "x86_nofma",
           **{t: "x86_nofma" for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M,
                                       T.IQ4_XS)}}
TINYBLAS_Q0 = {T.Q8_0: "lanes_nofma", T.Q4_0: "lanes_nofma", T.Q5_0: "lanes_nofma",
               T.IQ4_NL: "tinyblas_q0"}


@njit(inline="always", cache=True)
def _four_acc(a, ao, b, bo, main):
    # the 4 accumulators of 8 lanes over steps of 32, acc + a * b unfused,
    # summed (x0 + x2) + (x1 + x3) lane-wise, then `hsum_float_8`'s tree
    x0, x1, x2, x3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
    for s in range(0, main, 32):
        x0 = f8_add(f8_mul(load8(a, ao + s), load8(b, bo + s)), x0)
        x1 = f8_add(f8_mul(load8(a, ao + s + 8), load8(b, bo + s + 8)), x1)
        x2 = f8_add(f8_mul(load8(a, ao + s + 16), load8(b, bo + s + 16)), x2)
        x3 = f8_add(f8_mul(load8(a, ao + s + 24), load8(b, bo + s + 24)), x3)
    return f8_add(f8_add(x0, x2), f8_add(x1, x3))


@njit(inline="always", cache=True)
def vec_dot_f16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f16` (`vec.operand` operands): x86_avx2's order with
    `GGML_F32x8_FMA` a multiply and an add; the rest of the row in double."""
    main = n - n % 32
    r = _four_acc(a, ao, b, bo, main)
    return rest_in_double(f8_sum_halves(r), a, ao, b, bo, main, n)


@njit(inline="always", cache=True)
def vec_dot_f32(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_f32`: as `vec_dot_f16` over steps of 32, the rest of
    the row added to the float sum one rounded product at a time."""
    return vec_dot_f32_tail(vec_dot_f16(a, ao, b, bo, n - n % 32, acc), a, ao, b, bo, n, 32, 1)


@njit(inline="always", cache=True)
def vec_dot_bf16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_bf16`, AVX branch without FMA (a, b float32 holding
    bf16 values): c1..c4 = c + a * b over steps of 32, (c1 + c3) + (c2 +
    c4), `hsum`, added to a double with the rest of the row."""
    main = n - n % 32
    return rest_in_double(f8_hsum(_four_acc(a, ao, b, bo, main)), a, ao, b, bo, main, n)


@njit(inline="always", cache=True)
def tinyblas_dot(a, ao, b, bo, n, acc):
    """llamafile's tinyBLAS<8> without FMA: one 8-lane accumulator, lane l
    taking the elements l, l + 8, ... as `add(mul(a, b), c)` (n a multiple
    of 8), then `hsum`."""
    x = f8_zero()
    for s in range(0, n, 8):
        x = f8_add(f8_mul(load8(a, ao + s), load8(b, bo + s)), x)
    return f8_hsum(x)
