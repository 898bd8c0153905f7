"""ggml-cpu's float arithmetic, reproduced operation for operation (numba).

llama.cpp's CPU backend sums float terms in SIMD lanes with fused
multiply-adds, reduces the lanes in a fixed tree and computes exp with its
own polynomial. Reproducing that order, not only the formula, is what makes
our results equal to its results bit for bit. What is reproduced here, from
the llama.cpp vendored by llama-cpp-python 0.3.36 built for an x86-64 CPU
with AVX-512 (GCC 12):

* `fma32(a, b, c)`: a*b + c rounded once (LLVM `llvm.fma.f32`, the
  `vfmadd` instructions of `_mm256_fmadd_ps`; `lanes.fma8_into` does 8
  lanes at once).
* `hsum8(v)`: ggml's `hsum_float_8` (ggml-cpu `arch/x86/quants.c`) and
  tinyBLAS's `hsum(__m256)` (`llamafile/sgemm.cpp`): (v[4+i] + v[i]) for
  i < 4, then (s0 + s2) + (s1 + s3).
* `hsum16(v)`: GCC's `_mm512_reduce_add_ps`: (v[8+i] + v[i]) for i < 8,
  then the same steps on 8, 4 and 2 lanes: t[4+i] + t[i], u[2+i] + u[i],
  w[0] + w[1].
* `expf_avx512(x)`: ggml-cpu `ggml_v_expf` (`vec.h`, AVX-512 version): the
  Arm optimized-routines exp with range reduction by 0x1.8p23 rounding,
  a degree-5 polynomial evaluated by FMAs and `_mm512_scalef_ps`.
* `silu_avx512(x)`: `ggml_v_silu`: x / (1 + expf(-x)).

Every function takes and returns float32 scalars; they are inlined into the
kernels that use them. None of them may be compiled with `fastmath` (that
would let LLVM reorder or contract the operations this module fixes).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_F32 = np.float32

__all__ = ["fma32", "hsum8", "hsum16", "expf_avx512", "silu_avx512"]


@intrinsic
def fma32(typingctx, a, b, c):
    """float32 a*b + c with a single rounding (LLVM `llvm.fma.f32`)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        flt = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [flt], ir.FunctionType(flt, [flt, flt, flt]))
        return builder.call(fn, args)
    return sig, codegen


@njit(inline="always", cache=True)
def hsum8(v):
    """ggml `hsum_float_8` of the float32 lanes v[0..7]."""
    s0 = np.float32(v[4] + v[0])
    s1 = np.float32(v[5] + v[1])
    s2 = np.float32(v[6] + v[2])
    s3 = np.float32(v[7] + v[3])
    return np.float32(np.float32(s0 + s2) + np.float32(s1 + s3))


@njit(inline="always", cache=True)
def hsum16(v):
    """GCC `_mm512_reduce_add_ps` of the float32 lanes v[0..15]."""
    t0 = np.float32(v[8] + v[0])
    t1 = np.float32(v[9] + v[1])
    t2 = np.float32(v[10] + v[2])
    t3 = np.float32(v[11] + v[3])
    t4 = np.float32(v[12] + v[4])
    t5 = np.float32(v[13] + v[5])
    t6 = np.float32(v[14] + v[6])
    t7 = np.float32(v[15] + v[7])
    u0 = np.float32(t4 + t0)
    u1 = np.float32(t5 + t1)
    u2 = np.float32(t6 + t2)
    u3 = np.float32(t7 + t3)
    w0 = np.float32(u2 + u0)
    w1 = np.float32(u3 + u1)
    return np.float32(w0 + w1)


# ggml_v_expf's constants, from their hexadecimal spelling in vec.h
_R = _F32(float.fromhex("0x1.8p23"))
_LOG2E = _F32(float.fromhex("0x1.715476p+0"))
_LN2_HI = _F32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = _F32(float.fromhex("0x1.7f7d1cp-20"))
_C5 = _F32(float.fromhex("0x1.0e4020p-7"))
_C4 = _F32(float.fromhex("0x1.573e2ep-5"))
_C3 = _F32(float.fromhex("0x1.555e66p-3"))
_C2 = _F32(float.fromhex("0x1.fffdb6p-2"))
_C1 = _F32(float.fromhex("0x1.ffffecp-1"))
_ONE = _F32(1.0)


@njit(inline="always", cache=True)
def expf_avx512(x):
    """ggml-cpu `ggml_v_expf`, AVX-512 version, on one float32 lane."""
    z = fma32(x, _LOG2E, _R)
    n = _F32(z - _R)
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    u = _F32(b * b)
    j = fma32(fma32(fma32(_C5, b, _C4), u, fma32(_C3, b, _C2)), u, fma32(_C1, b, _ONE))
    if abs(n) > _F32(192.0):
        return _F32(np.inf) if n > 0 else _F32(0.0)
    # _mm512_scalef_ps(j, n) = j * 2^floor(n), n integral here; one rounding
    return _F32(np.ldexp(np.float64(j), int(n)))


@njit(inline="always", cache=True)
def silu_avx512(x):
    """ggml-cpu `ggml_v_silu`, AVX-512: x / (1 + expf(-x)), float32."""
    return _F32(x / _F32(_F32(1.0) + expf_avx512(_F32(_F32(0.0) - x))))

