"""ggml-cpu's float arithmetic, reproduced operation for operation (numba).

llama.cpp's CPU backend sums float terms in SIMD lanes with fused
multiply-adds, reduces the lanes in a fixed tree and computes exp with its
own polynomial, which differs between builds. Reproducing that order, not
only the formula, is what makes our results equal to its results bit for
bit. What is reproduced here, from the llama.cpp vendored by
llama-cpp-python 0.3.36 (GCC 12), per CPU profile (`profiles`):

* `fma32(a, b, c)`: a*b + c rounded once (LLVM `llvm.fma.f32`, the
  `vfmadd` instructions of `_mm256_fmadd_ps`; `lanes.fma8_into` does 8
  lanes at once).
* `hsum8(v)`: ggml's `hsum_float_8` (ggml-cpu `arch/x86/quants.c`) and
  tinyBLAS's `hsum(__m256)` (`llamafile/sgemm.cpp`): (v[4+i] + v[i]) for
  i < 4, then (s0 + s2) + (s1 + s3).
* `hsum16(v)`: GCC's `_mm512_reduce_add_ps`: (v[8+i] + v[i]) for i < 8,
  then the same steps on 8, 4 and 2 lanes: t[4+i] + t[i], u[2+i] + u[i],
  w[0] + w[1].
* `hsum4(v, off)`: the baseline (SSE2) build's 4-lane sum in
  `ggml_vec_soft_max_f32`: (v0 + v1) + (v2 + v3).
* `expf_v(x, arch)`: ggml-cpu `ggml_v_expf` (`vec.h`), the Arm
  optimized-routines exp (range reduction by 0x1.8p23 rounding, a degree-5
  polynomial), in the version of each build: AVX-512 (`_mm512_scalef_ps`
  applies 2^n), AVX2 (2^n built in the exponent bits, `fma(j, k, k)`,
  two-step scaling near over- and underflow) and SSE2 (the AVX2 algorithm
  with a separate multiply and add where AVX2 has an FMA).
* `silu_v(x, arch)`: `ggml_v_silu`: x / (1 + expf_v(-x)).

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

__all__ = ["fma32", "hsum4", "hsum8", "hsum16", "expf_avx512", "expf_avx2", "expf_sse2", "expf_v",
           "silu_avx512", "silu_v", "f32_bits", "bits_f32"]


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


_ONE_BITS = np.int32(0x3F800000)


@njit(inline="always", cache=True)
def _expf_bits(x, fused):
    # The AVX2 and SSE2 `ggml_v_expf` on one lane. fused: the AVX2 build's
    # FMAs; else the SSE2 build's MADD128 / NMADD128 (multiply, then add).
    if fused:
        z = fma32(x, _LOG2E, _R)
    else:
        z = _F32(_F32(x * _LOG2E) + _R)
    n = _F32(z - _R)
    if fused:
        b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    else:
        b = _F32(_F32(x - _F32(n * _LN2_HI)) - _F32(n * _LN2_LO))
    zb = f32_bits(z)
    e = np.int32(np.uint32(np.uint32(zb) << np.uint32(23)) & np.uint32(0xFFFFFFFF))
    k = bits_f32(np.int32(np.uint32((np.uint32(e) + np.uint32(_ONE_BITS)) & np.uint32(0xFFFFFFFF))))
    u = _F32(b * b)
    if fused:
        j = fma32(fma32(fma32(_C5, b, _C4), u, fma32(_C3, b, _C2)), u, _F32(_C1 * b))
    else:
        j = _F32(_F32(_F32(_F32(_F32(_C5 * b) + _C4) * u) + _F32(_F32(_C3 * b) + _C2)) * u)
        j = _F32(j + _F32(_C1 * b))
    an = abs(n)
    if an > _F32(192.0):
        g = np.uint32(0x82000000) if n <= _F32(0.0) else np.uint32(0)
        s1 = bits_f32(np.int32((g + np.uint32(0x7F000000)) & np.uint32(0xFFFFFFFF)))
        return _F32(s1 * s1)
    if an > _F32(126.0):
        g = np.uint32(0x82000000) if n <= _F32(0.0) else np.uint32(0)
        s1 = bits_f32(np.int32((g + np.uint32(0x7F000000)) & np.uint32(0xFFFFFFFF)))
        s2 = bits_f32(np.int32((np.uint32(e) - g) & np.uint32(0xFFFFFFFF)))
        t = fma32(s2, j, s2) if fused else _F32(_F32(s2 * j) + s2)
        return _F32(t * s1)
    return fma32(k, j, k) if fused else _F32(_F32(k * j) + k)


@njit(inline="always", cache=True)
def expf_avx2(x):
    """ggml-cpu `ggml_v_expf`, AVX2 + FMA version, on one float32 lane."""
    return _expf_bits(x, True)


@njit(inline="always", cache=True)
def expf_sse2(x):
    """ggml-cpu `ggml_v_expf`, SSE2 version without FMA (the baseline
    x86-64 build), on one float32 lane."""
    return _expf_bits(x, False)


@njit(inline="always", cache=True)
def expf_v(x, arch):
    """ggml-cpu's vector `ggml_v_expf` of the build `arch`
    (`profiles.ARCH_*`: 0 SSE2, 1 AVX2, 2 AVX-512), one float32 lane."""
    if arch == 2:
        return expf_avx512(x)
    return _expf_bits(x, arch == 1)


@njit(inline="always", cache=True)
def silu_avx512(x):
    """ggml-cpu `ggml_v_silu`, AVX-512: x / (1 + expf(-x)), float32."""
    return _F32(x / _F32(_F32(1.0) + expf_avx512(_F32(_F32(0.0) - x))))


@njit(inline="always", cache=True)
def silu_v(x, arch):
    """ggml-cpu `ggml_v_silu` of the build `arch`: x / (1 + expf_v(0 - x))."""
    return _F32(x / _F32(_F32(1.0) + expf_v(_F32(_F32(0.0) - x), arch)))

