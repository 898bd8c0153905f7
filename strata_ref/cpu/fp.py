"""ggml-cpu's float primitives, reproduced operation for operation (numba).

llama.cpp's CPU backend sums float terms in SIMD lanes with fused
multiply-adds and reduces the lanes in a fixed tree. Reproducing that
order, not only the formula, is what makes our results equal to its
results bit for bit. The primitives every instruction set's code is built
from (llama.cpp vendored by llama-cpp-python 0.3.36, GCC 12); which of
them a build uses is its instruction-set module's choice
(`strata_ref.cpu.isa`):

* `fma32(a, b, c)`: a*b + c rounded once (LLVM `llvm.fma.f32`, the
  `vfmadd` instructions of `_mm256_fmadd_ps`; `lanes.fma8_into` does 8
  lanes at once).
* `hsum8(v)`: ggml's `hsum_float_8` (ggml-cpu `arch/x86/quants.c`) and
  tinyBLAS's `hsum(__m256)` (`llamafile/sgemm.cpp`): (v[4+i] + v[i]) for
  i < 4, then (s0 + s2) + (s1 + s3).
* `hsum16(v)`: GCC's `_mm512_reduce_add_ps`: (v[8+i] + v[i]) for i < 8,
  then the same steps on 8, 4 and 2 lanes: t[4+i] + t[i], u[2+i] + u[i],
  w[0] + w[1].
* `hsum4(v, off)`: the SSE2 4-lane sum in `ggml_vec_soft_max_f32`: (v0 +
  v1) + (v2 + v3).
* `f32_bits` / `bits_f32`: bitcasts.
* the constants of `ggml_v_expf` (`vec.h`), from their hexadecimal
  spelling there; each build's version of the exponential is in its
  instruction-set module.

Every function takes and returns float32 scalars; they are inlined into the
kernels that use them. None of them may be compiled with `fastmath` (that
would let LLVM reorder or contract the operations this module fixes).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ..formats._qnum import fma32   # float32 a*b + c rounded once (LLVM `llvm.fma.f32`)

_F32 = np.float32

__all__ = ["fma32", "hsum4", "hsum8", "hsum16", "f32_bits", "bits_f32", "R", "LOG2E", "LN2_HI",
           "LN2_LO", "C1", "C2", "C3", "C4", "C5", "ONE", "ONE_BITS"]


@njit(inline="always", cache=True)
def hsum4(v, off):
    """The SSE2 build's sum of the float32 lanes v[off..off+3]
    (`ggml_vec_soft_max_f32`: shuffle, add, movehl, add_ss)."""
    return np.float32(np.float32(v[off] + v[off + 1]) + np.float32(v[off + 2] + v[off + 3]))


@njit(inline="always", cache=True)
def hsum8(v):
    """ggml `hsum_float_8` of the float32 lanes v[0..7]."""
    s0 = np.float32(v[4] + v[0])
    s1 = np.float32(v[5] + v[1])
    s2 = np.float32(v[6] + v[2])
    s3 = np.float32(v[7] + v[3])
    return np.float32(np.float32(s0 + s2) + np.float32(s1 + s3))


@njit(inline="always", cache=True)
def sum8_halves(v):
    """(v0 + v4 + (v1 + v5)) + (v2 + v6 + (v3 + v7)) of the float32 lanes
    v[0..7], each sum rounded: the end of `GGML_F32x8_REDUCE` (AVX) and
    NEON's `vaddvq_f32` of the two 4-lane halves added."""
    t0 = np.float32(v[0] + v[4])
    t1 = np.float32(v[1] + v[5])
    t2 = np.float32(v[2] + v[6])
    t3 = np.float32(v[3] + v[7])
    return np.float32(np.float32(t0 + t1) + np.float32(t2 + t3))


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
R = _F32(float.fromhex("0x1.8p23"))
LOG2E = _F32(float.fromhex("0x1.715476p+0"))
LN2_HI = _F32(float.fromhex("0x1.62e4p-1"))
LN2_LO = _F32(float.fromhex("0x1.7f7d1cp-20"))
C5 = _F32(float.fromhex("0x1.0e4020p-7"))
C4 = _F32(float.fromhex("0x1.573e2ep-5"))
C3 = _F32(float.fromhex("0x1.555e66p-3"))
C2 = _F32(float.fromhex("0x1.fffdb6p-2"))
C1 = _F32(float.fromhex("0x1.ffffecp-1"))
ONE = _F32(1.0)


@intrinsic
def f32_bits(typingctx, x):
    """The int32 bit pattern of a float32 (a bitcast)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return sig, codegen


@intrinsic
def bits_f32(typingctx, b):
    """The float32 whose bit pattern is the int32 b (a bitcast)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return sig, codegen


ONE_BITS = np.int32(0x3F800000)
