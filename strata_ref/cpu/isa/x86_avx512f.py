"""AVX-512 without AVX512_BF16 (ggml's `skylakex` variant, and
`cannonlake`, `cascadelake`, `icelake`, whose VBMI and VNNI change no float
order): the `x86_avx512` module's build less the BF16 instructions. Placed
before `x86_avx512` in a chain, it takes back what AVX512_BF16 decides
there:

* `ggml_vec_dot_bf16` (vec.cpp, the `__AVX512F__` branch): the bf16 values
  widened to float (a 16-bit shift), two 16-lane accumulators over steps of
  32, `c = a*b + c` (`_mm512_add_ps(_mm512_mul_ps(...), c)`, contracted by
  GCC into one FMA), each accumulator's `_mm512_reduce_add_ps` added to a
  double, then the rest of the row (each product rounded to float) in
  double.
* llamafile's tinyBLAS on BF16 weights (sgemm.cpp, `__AVX512F__` without
  `__AVX512BF16__`): `tinyBLAS<16, __m512, __m512, ggml_bf16_t>`, the
  values widened, the float path's 16 FMA lanes.

Source: ggml-cpu of llama.cpp v0.4.0 (the same code in llama-cpp-python
0.3.36's). The activation's conversion to BF16 is `GGML_FP32_TO_BF16` on
every x86 build (`ggml_cpu_fp32_to_bf16`, ggml-cpu.c).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..simd import f8_fma, f8_hsum16, f8_zero
from ..vec import load8
from .x86_avx512 import tinyblas_dot

_F32 = np.float32

TINYBLAS_BF16 = 16


@njit(inline="always", cache=True)
def vec_dot_bf16(a, ao, b, bo, n, acc):
    """`ggml_vec_dot_bf16`, AVX-512F branch (a, b float32 holding bf16
    values): accumulators c1 (elements i .. i+15 of each step of 32) and c2
    (i+16 .. i+31) by FMA, `_mm512_reduce_add_ps` of each added to a
    double, the last n % 32 products added one by one."""
    l1, h1, l2, h2 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
    main = n - n % 32
    for s in range(0, main, 32):
        l1 = f8_fma(load8(a, ao + s), load8(b, bo + s), l1)
        h1 = f8_fma(load8(a, ao + s + 8), load8(b, bo + s + 8), h1)
        l2 = f8_fma(load8(a, ao + s + 16), load8(b, bo + s + 16), l2)
        h2 = f8_fma(load8(a, ao + s + 24), load8(b, bo + s + 24), h2)
    tot = np.float64(f8_hsum16(l1, h1))
    tot += np.float64(f8_hsum16(l2, h2))
    for i in range(main, n):
        tot += np.float64(_F32(a[ao + i] * b[bo + i]))
    return _F32(tot)


#: tinyBLAS<16, __m512, __m512, ggml_bf16_t>: the float path on the widened
#: values
tinyblas_bf16 = tinyblas_dot
