"""ggml-cpu's 8-lane integer dots of one block of 32 int8 values, as LLVM
vector code inlined into numba kernels.

ggml's x86 dot products (`arch/x86/quants.c`, AVX2) multiply 32 weight
bytes with 32 activation bytes by `maddubs` + `madd(ones)` (or VNNI
`dpbusd`), which leaves 8 int32 lanes: lane L is the exact sum of the
products of values 4L..4L+3. Every float operation that follows works on
these lanes, so reproducing ggml bit for bit needs the lanes, not only their
total. The integer results are exact, so any instruction sequence that
computes them exactly is equivalent: on a CPU with AVX2 we use ggml's own
(`psign`, `pmaddubsw`, `pmaddwd`: one block in a few instructions), on
other CPUs plain LLVM vector arithmetic (sign-extend, multiply, add the four
interleaved parts).

Contract, for every function: w and x are contiguous 1-D int8 arrays
(packed 4-bit weights too: their bytes viewed as int8), checked at typing;
the block starts at w[woff] and x[xoff] and is not bounds-checked; products must not
overflow int16 in pairs (|w| <= 128, |x| <= 127: ggml's quants) .
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .simd import HOST_AVX2, _fn, _lanes_ir, _splat

__all__ = ["HOST_AVX2", "q8_block_dot", "lanes_scaled_add",
           "lanes8_scaled_add", "fma8_into", "fma8_vv"]

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V32I8 = ir.VectorType(_I8, 32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V8F = ir.VectorType(ir.FloatType(), 8)


def _check(**arrays):
    """Typing guard: each argument must be a C-contiguous 1-D array of the
    given dtype (the intrinsics read raw memory through its data pointer)."""
    for name, (ty, dtype) in arrays.items():
        if not (isinstance(ty, types.Array) and ty.ndim == 1 and ty.layout == "C" and ty.dtype == dtype):
            raise TypeError(f"{name} must be a contiguous 1-D {dtype} array, got {ty}")


def _ptr(context, builder, aryty, ary, off, vecty):
    a = context.make_array(aryty)(context, builder, ary)
    p = a.data if off is None else builder.gep(a.data, [off])
    return builder.bitcast(p, vecty.as_pointer())


def _lanes(builder, wv, xv):
    """<8 x i32>: lane L = sum_{j<4} w[4L+j] * x[4L+j], exactly (signed)."""
    return _lanes_ir(builder, wv, xv, False)


@intrinsic
def q8_block_dot(typingctx, w, woff, x, xoff):
    """The exact integer dot (int32) of the 32 int8 weights at w[woff] with
    the 32 int8 activations at x[xoff] (ggml's generic `vec_dot`s sum a
    block's products in one int)."""
    _check(w=(w, types.int8), x=(x, types.int8))
    sig = types.int32(w, types.intp, x, types.intp)

    def codegen(context, builder, signature, args):
        W, wo, X, xo = args
        tw, _, tx, _ = signature.args
        wv = builder.load(_ptr(context, builder, tw, W, wo, _V32I8), align=1)
        xv = builder.load(_ptr(context, builder, tx, X, xo, _V32I8), align=1)
        lanes = _lanes(builder, wv, xv)
        tot = builder.extract_element(lanes, ir.Constant(_I32, 0))
        for L in range(1, 8):
            tot = builder.add(tot, builder.extract_element(lanes, ir.Constant(_I32, L)))
        return tot
    return sig, codegen


@intrinsic
def lanes8_scaled_add(typingctx, sumi, w, woff, x, xoff, s_lo, s_hi):
    """sumi[l] += s_lo * (w[l] x[l] + w[8+l] x[8+l]) + s_hi * (w[16+l]
    x[16+l] + w[24+l] x[24+l]) for l < 8 (int32; the 32 int8 values at
    w[woff] and x[xoff]): the lanes of ggml's generic K-quant `vec_dot`s
    (`quants.c`), where lane l of `aux32` sums the products at positions
    l mod 8, each 16 values with their sub-block scale. sumi: int32 array of
    8. Products and sums are exact (|w| <= 63, |x| <= 127)."""
    _check(sumi=(sumi, types.int32), w=(w, types.int8), x=(x, types.int8))
    sig = types.void(sumi, w, types.intp, x, types.intp, types.int32, types.int32)

    def codegen(context, builder, signature, args):
        S, W, wo, X, xo, lo, hi = args
        ts, tw, _, tx, _, _, _ = signature.args
        wv = builder.load(_ptr(context, builder, tw, W, wo, _V32I8), align=1)
        xv = builder.load(_ptr(context, builder, tx, X, xo, _V32I8), align=1)
        v32i32 = ir.VectorType(_I32, 32)
        p = builder.mul(builder.sext(wv, v32i32), builder.sext(xv, v32i32))
        undef = ir.Constant(v32i32, ir.Undefined)
        part = [builder.shuffle_vector(p, undef, ir.Constant(_V8I32, [8 * j + L for L in range(8)]))
                for j in range(4)]
        first = builder.add(part[0], part[1])
        second = builder.add(part[2], part[3])
        ps = _ptr(context, builder, ts, S, None, _V8I32)
        out = builder.add(builder.load(ps, align=4),
                          builder.add(builder.mul(first, _splat(builder, lo, _V8I32)),
                                      builder.mul(second, _splat(builder, hi, _V8I32))))
        builder.store(out, ps, align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def lanes_scaled_add(typingctx, sumi, w, woff, x, xoff, s_lo, s_hi):
    """sumi[0:4] += s_lo * lanes[0:4]; sumi[4:8] += s_hi * lanes[4:8]
    (int32; lanes as in `q8_lanes_fma`): ggml's K-quant step
    `madd(scales, maddubs(q, q8))` accumulated with `add_epi32`, where
    the first 16 values of the block have one sub-block scale and the last
    16 another (Q6_K), or both the same (Q4_K). sumi: int32 array of 8."""
    _check(sumi=(sumi, types.int32), w=(w, types.int8), x=(x, types.int8))
    sig = types.void(sumi, w, types.intp, x, types.intp, types.int32, types.int32)

    def codegen(context, builder, signature, args):
        S, W, wo, X, xo, lo, hi = args
        ts, tw, _, tx, _, _, _ = signature.args
        wv = builder.load(_ptr(context, builder, tw, W, wo, _V32I8), align=1)
        xv = builder.load(_ptr(context, builder, tx, X, xo, _V32I8), align=1)
        sc = ir.Constant(_V8I32, ir.Undefined)
        for L in range(8):
            sc = builder.insert_element(sc, lo if L < 4 else hi, ir.Constant(_I32, L))
        ps = _ptr(context, builder, ts, S, None, _V8I32)
        out = builder.add(builder.load(ps, align=4), builder.mul(_lanes(builder, wv, xv), sc))
        builder.store(out, ps, align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def fma8_into(typingctx, acc, lanes, off, d):
    """acc[0:8] = fma(d, lanes[off:off+8], acc[0:8]) on float32 arrays, one
    8-lane vector FMA (`llvm.fma.v8f32`; per lane exactly a float32 fma):
    ggml's `_mm256_fmadd_ps(d, lanes, acc)`."""
    _check(acc=(acc, types.float32), lanes=(lanes, types.float32))
    sig = types.void(acc, lanes, types.intp, types.float32)

    def codegen(context, builder, signature, args):
        A, Lv, off, dd = args
        pa = _ptr(context, builder, signature.args[0], A, None, _V8F)
        pl = _ptr(context, builder, signature.args[1], Lv, off, _V8F)
        fma = _fn(builder, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
        builder.store(builder.call(fma, [_splat(builder, dd, _V8F), builder.load(pl, align=4),
                                         builder.load(pa, align=4)]), pa, align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def fma8_vv(typingctx, acc, accoff, a, aoff, b, boff):
    """acc[accoff:+8] = fma(a[aoff:+8], b[boff:+8], acc[accoff:+8]) on
    float32 arrays: 8 lanes of a float32 fma each (`llvm.fma.v8f32`), the
    `_mm256_fmadd_ps` / half of a `_mm512_fmadd_ps` of ggml's F16 dots."""
    _check(acc=(acc, types.float32), a=(a, types.float32), b=(b, types.float32))
    sig = types.void(acc, types.intp, a, types.intp, b, types.intp)

    def codegen(context, builder, signature, args):
        A, ao, X, xo, Y, yo = args
        pa = _ptr(context, builder, signature.args[0], A, ao, _V8F)
        px = _ptr(context, builder, signature.args[2], X, xo, _V8F)
        py = _ptr(context, builder, signature.args[4], Y, yo, _V8F)
        fma = _fn(builder, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
        builder.store(builder.call(fma, [builder.load(px, align=4), builder.load(py, align=4),
                                         builder.load(pa, align=4)]), pa, align=4)
        return context.get_dummy_value()
    return sig, codegen
