"""SIMD vectors as numba values: 8 float32 lanes, 8 int32 lanes, 32 int8
lanes, held in registers across a loop like the `__m256` / `__m256i`
variables of ggml-cpu's x86 code.

ggml's dots keep their accumulators in vector registers for a whole row;
a kernel that keeps them in a NumPy array reloads and stores them at every
block, which puts a store-to-load round trip on the critical path of every
FMA chain. These types make the accumulators plain SSA values: numba gives
each a variable, LLVM a register. Every operation is one LLVM vector
instruction (or a short fixed sequence) whose result per lane is exactly
the float32 / integer operation named, so a kernel written with them has
the float order it spells out, lane by lane, and nothing else: no
reassociation, no contraction (numba compiles without fastmath).

Types: `F32x8` (<8 x float>), `I32x8` (<8 x i32>), `I8x32` (<32 x i8>).
Operations (all inlined; `a` an array argument is a C-contiguous 1-D
array, `off` an element offset into it, never bounds-checked: the caller
keeps every access inside the array):

* float: `f8_zero`, `f8_splat`, `f8_load`, `f8_store`, `f8_fma(a, b, c)`
  (a*b + c rounded once per lane, `_mm256_fmadd_ps`), `f8_add`, `f8_mul`,
  `f8_lane`, `f8_hsum` (ggml `hsum_float_8`, the exact tree);
* int32: `i8x32_lanes(w, x)` (lane L = the exact sum of w[4L+j] * x[4L+j],
  j < 4: ggml's `mul_sum_i8_pairs` / `maddubs` + `madd(ones)`), `i32_zero`,
  `i32_splat`, `i32_set2(lo, hi)` (lanes 0-3 lo, 4-7 hi), `i32_add`,
  `i32_sub`, `i32_mul`, `i32_to_f8` (`_mm256_cvtepi32_ps`), `i32_hsum`
  (the exact integer sum);
* int8: `i8_load` (32 bytes), `i8_nibbles` (16 bytes -> their low nibbles,
  then their high nibbles, ggml `bytes_from_nibbles_32`), `i8_bits16(a,
  off)` (the 32 bits of a little-endian uint32 -> 32 bytes of 0 or 16, the
  Q5 high bit of each value), `i8_or`, `i8_sub`, `i8_splat`;
* scalars from raw bytes (a uint8 or int8 array, `off` in bytes):
  `f16_at` (an fp16 as float32, exact), `u32_at`, `i8_at`.

The integer lanes are exact whatever instructions compute them: on a CPU
with AVX2 ggml's own (`psign`, `pmaddubsw`, `pmaddwd`), elsewhere plain
LLVM vector arithmetic. fp16 widening uses the F16C conversion where the
CPU has it and a table otherwise; both are exact.
"""
from __future__ import annotations

import llvmlite.binding as llb
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from .._env import switch
from ..numerics import F16_TO_F32

__all__ = ["F32x8", "I32x8", "I8x32", "HOST_AVX2", "HOST_F16C",
           "f8_zero", "f8_splat", "f8_sub", "f8_div", "f8_abs", "f8_gt", "f8_le", "f8_select", "f8_bits",
           "f8_from_bits", "f8_to_i32", "f8_set", "i32_and", "i32_or", "i32_shl", "i32_select", "f8_load", "f8_store", "f8_fma", "f8_add", "f8_mul", "f8_lane", "f8_hsum", "f8_hsum16", "f8_f16_load", "f8_round_f16", "f8_f16_store", "f16_bits",
           "i8x32_lanes", "i8x32_lanes_u", "i8x32_dot_u", "i8x32_lanes_scaled", "i8_store", "HOST_VNNI", "i8_xor", "i32_neg_shl", "i32_zero", "i32_splat", "i32_set2", "i32_add", "i32_sub",
           "i32_mul", "i32_to_f8", "i32_hsum", "i32_pairsum", "i32_lane", "i32_load", "i32_pairdot", "i8_load", "i8_nibbles", "i8_bits16", "i8_or", "i8_sub",
           "i8_splat", "prefetch", "f16_at", "u16_at", "u32_at", "i8_at"]

_FEATURES = llb.get_host_cpu_features()
#: the lanes use AVX2's maddubs / madd (else portable IR); STRATA_REF_PORTABLE_LANES=1
#: forces the portable code (tests). These switches (and STRATA_REF_NO_VNNI,
#: STRATA_REF_NO_F16C below) are read at import and compiled in: set them
#: before the process imports this module (the kernels' on-disk cache is
#: keyed on them, `_digest.cpu_digest`)
HOST_AVX2 = bool(_FEATURES.get("avx2", False)) and not switch("STRATA_REF_PORTABLE_LANES")
#: fp16 values are converted by the F16C instructions (else by a table and
#: numerics' rounding; STRATA_REF_NO_F16C=1 forces those, to test them on
#: an F16C CPU)
HOST_F16C = bool(_FEATURES.get("f16c", False)) and not switch("STRATA_REF_NO_F16C")
#: the CPU has a 256-bit `vpdpbusd` (AVX512-VNNI with AVX512-VL, or
#: AVX-VNNI): the unsigned-by-signed byte lanes in one instruction, exact
#: for any bytes (no int16 pair sums to saturate); STRATA_REF_PORTABLE_LANES=1
#: turns it off with the rest, STRATA_REF_NO_VNNI=1 alone (to test the AVX2
#: code on a VNNI CPU)
HOST_VNNI = (HOST_AVX2 and not switch("STRATA_REF_NO_VNNI") and
             (bool(_FEATURES.get("avxvnni", False)) or
              (bool(_FEATURES.get("avx512vnni", False)) and bool(_FEATURES.get("avx512vl", False)))))

#: the CPU has AVX512-BW: the K-quant super-block lanes take two 32-value
#: chunks per 512-bit `vpmaddubsw` / `vpmaddwd` (`scaled_pairs_ir`: the same
#: exact integers as two 256-bit steps); STRATA_REF_NO_AVX512=1 (or
#: STRATA_REF_PORTABLE_LANES=1) keeps the 256-bit code, to test it on such a CPU
HOST_AVX512BW = (HOST_AVX2 and not switch("STRATA_REF_NO_AVX512") and
                 bool(_FEATURES.get("avx512bw", False)) and bool(_FEATURES.get("avx512f", False)))

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V32I8 = ir.VectorType(_I8, 32)
_V16I8 = ir.VectorType(_I8, 16)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V8F = ir.VectorType(_F32, 8)


class _Vec(types.Type):
    """A numba type whose value is one LLVM vector."""

    def __init__(self, name: str, llty):
        self.llty = llty
        super().__init__(name=name)


class _F32x8Type(_Vec):
    def __init__(self):
        super().__init__("F32x8", _V8F)


class _I32x8Type(_Vec):
    def __init__(self):
        super().__init__("I32x8", _V8I32)


class _I8x32Type(_Vec):
    def __init__(self):
        super().__init__("I8x32", _V32I8)


F32x8, I32x8, I8x32 = _F32x8Type(), _I32x8Type(), _I8x32Type()


def _vec_model(cls):
    @register_model(cls)
    class _Model(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, fe_type.llty)
    return _Model


for _cls in (_F32x8Type, _I32x8Type, _I8x32Type):
    _vec_model(_cls)


# ------------------------------------------------------------ IR helpers
def _fn(builder, name, ret, args):
    m = builder.module
    return m.globals.get(name) or ir.Function(m, ir.FunctionType(ret, args), name)


def _elem_ptr(context, builder, aryty, ary, off, llty):
    """A pointer of type llty* to element `off` of array `ary`."""
    a = context.make_array(aryty)(context, builder, ary)
    return builder.bitcast(builder.gep(a.data, [off]), llty.as_pointer())


def _byte_ptr(context, builder, aryty, ary, off, llty):
    """A pointer of type llty* to byte `off` of the data of array `ary`."""
    a = context.make_array(aryty)(context, builder, ary)
    p = builder.bitcast(a.data, _I8.as_pointer())
    return builder.bitcast(builder.gep(p, [off]), llty.as_pointer())


def _splat(builder, value, vecty):
    n = vecty.count
    v = builder.insert_element(ir.Constant(vecty, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vecty, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, n), [0] * n))


def _literal(v):
    """The value of a literal integer argument, or None (numba then retries
    the call with the literal types)."""
    return v.literal_value if isinstance(v, types.IntegerLiteral) else None


def _check_array(name, ty, dtypes):
    if not (isinstance(ty, types.Array) and ty.ndim == 1 and ty.layout == "C" and ty.dtype in dtypes):
        raise TypeError(f"{name} must be a C-contiguous 1-D array of {dtypes}, got {ty}")


_BYTES = (types.uint8, types.int8)


# ------------------------------------------------------------ float32 x 8
@intrinsic
def f8_zero(typingctx):
    """F32x8 of +0.0."""
    return F32x8(), lambda c, b, s, a: ir.Constant(_V8F, [0.0] * 8)


@intrinsic
def f8_splat(typingctx, x):
    """F32x8 with every lane x (float32)."""
    def codegen(context, builder, sig, args):
        return _splat(builder, args[0], _V8F)
    return F32x8(types.float32), codegen


@intrinsic
def f8_load(typingctx, a, off):
    """F32x8 of the float32 array a[off:off + 8]."""
    _check_array("a", a, (types.float32,))

    def codegen(context, builder, sig, args):
        return builder.load(_elem_ptr(context, builder, sig.args[0], args[0], args[1], _V8F), align=4)
    return F32x8(a, types.intp), codegen


@intrinsic
def f8_store(typingctx, a, off, v):
    """a[off:off + 8] = v (a float32 array)."""
    _check_array("a", a, (types.float32,))

    def codegen(context, builder, sig, args):
        builder.store(args[2], _elem_ptr(context, builder, sig.args[0], args[0], args[1], _V8F), align=4)
        return context.get_dummy_value()
    return types.void(a, types.intp, F32x8), codegen


@intrinsic
def f8_fma(typingctx, a, b, c):
    """a*b + c per lane, rounded once (`llvm.fma.v8f32`)."""
    def codegen(context, builder, sig, args):
        return builder.call(_fn(builder, "llvm.fma.v8f32", _V8F, [_V8F] * 3), args)
    return F32x8(F32x8, F32x8, F32x8), codegen


@intrinsic
def f8_add(typingctx, a, b):
    """a + b per lane."""
    return F32x8(F32x8, F32x8), lambda c, b, s, a: b.fadd(a[0], a[1])


@intrinsic
def f8_mul(typingctx, a, b):
    """a * b per lane."""
    return F32x8(F32x8, F32x8), lambda c, b, s, a: b.fmul(a[0], a[1])


@intrinsic
def f8_lane(typingctx, v, i):
    """Lane i of v (float32)."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], builder.trunc(args[1], _I32))
    return types.float32(F32x8, types.intp), codegen


@intrinsic
def f8_set(typingctx, a, b, c, d, e, f, g, h):
    """F32x8 of the 8 float32 values, lane 0 first."""
    def codegen(context, builder, sig, args):
        v = ir.Constant(_V8F, ir.Undefined)
        for i, x in enumerate(args):
            v = builder.insert_element(v, x, ir.Constant(_I32, i))
        return v
    return F32x8(*([types.float32] * 8)), codegen


@intrinsic
def f8_hsum(typingctx, v):
    """ggml `hsum_float_8` (and tinyBLAS's `hsum(__m256)`): (v[4+i] + v[i])
    for i < 4, then (s0 + s2) + (s1 + s3); float32."""
    def codegen(context, builder, sig, args):
        e = [builder.extract_element(args[0], ir.Constant(_I32, i)) for i in range(8)]
        s = [builder.fadd(e[4 + i], e[i]) for i in range(4)]
        return builder.fadd(builder.fadd(s[0], s[2]), builder.fadd(s[1], s[3]))
    return types.float32(F32x8), codegen


@intrinsic
def f8_f16_load(typingctx, a, off):
    """F32x8 of the 8 fp16 values a[off:off + 8] (a uint16 array of fp16
    bits), widened exactly (`vcvtph2ps`; needs F16C: `HOST_F16C`)."""
    _check_array("a", a, (types.uint16, types.int16))

    def codegen(context, builder, sig, args):
        h = builder.load(_elem_ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(ir.HalfType(), 8)),
                         align=2)
        return builder.fpext(h, _V8F)
    return F32x8(a, types.intp), codegen


@intrinsic
def f8_round_f16(typingctx, v):
    """Each lane rounded to the nearest fp16 (ties to even; overflow to
    infinity) and back to float32 (`vcvtps2ph` / `vcvtph2ps`; needs F16C)."""
    def codegen(context, builder, sig, args):
        h = builder.fptrunc(args[0], ir.VectorType(ir.HalfType(), 8))
        return builder.fpext(h, _V8F)
    return F32x8(F32x8), codegen


@intrinsic
def f8_hsum16(typingctx, lo, hi):
    """GCC's `_mm512_reduce_add_ps` of the 16 lanes lo (0-7) and hi (8-15):
    (v[8+i] + v[i]) for i < 8, then the same halving on 8, 4 and 2 lanes."""
    def codegen(context, builder, sig, args):
        lo, hi = args
        t = builder.fadd(hi, lo)
        e = [builder.extract_element(t, ir.Constant(_I32, i)) for i in range(8)]
        u = [builder.fadd(e[4 + i], e[i]) for i in range(4)]
        w = [builder.fadd(u[2 + i], u[i]) for i in range(2)]
        return builder.fadd(w[0], w[1])
    return types.float32(F32x8, F32x8), codegen


@intrinsic
def f8_sub(typingctx, a, b):
    """a - b per lane."""
    return F32x8(F32x8, F32x8), lambda c, b, s, a: b.fsub(a[0], a[1])


@intrinsic
def f8_div(typingctx, a, b):
    """a / b per lane (IEEE division)."""
    return F32x8(F32x8, F32x8), lambda c, b, s, a: b.fdiv(a[0], a[1])


@intrinsic
def f8_abs(typingctx, a):
    """|a| per lane (the sign bit cleared)."""
    def codegen(context, builder, sig, args):
        return builder.call(_fn(builder, "llvm.fabs.v8f32", _V8F, [_V8F]), args)
    return F32x8(F32x8), codegen


def _f8_cmp(op):
    def typer(typingctx, a, b):
        def codegen(context, builder, sig, args):
            return builder.sext(builder.fcmp_ordered(op, args[0], args[1]), _V8I32)
        return I32x8(F32x8, F32x8), codegen
    return typer


f8_gt = intrinsic(_f8_cmp(">"))
f8_gt.__doc__ = "I32x8 mask: -1 where a > b (ordered: false for NaN), else 0."
f8_le = intrinsic(_f8_cmp("<="))
f8_le.__doc__ = "I32x8 mask: -1 where a <= b (ordered: false for NaN), else 0."


@intrinsic
def f8_select(typingctx, m, a, b):
    """a where the I32x8 mask m is nonzero, else b, per lane."""
    def codegen(context, builder, sig, args):
        on = builder.icmp_signed("!=", args[0], ir.Constant(_V8I32, [0] * 8))
        return builder.select(on, args[1], args[2])
    return F32x8(I32x8, F32x8, F32x8), codegen


@intrinsic
def i32_select(typingctx, m, a, b):
    """a where the I32x8 mask m is nonzero, else b, per lane."""
    def codegen(context, builder, sig, args):
        on = builder.icmp_signed("!=", args[0], ir.Constant(_V8I32, [0] * 8))
        return builder.select(on, args[1], args[2])
    return I32x8(I32x8, I32x8, I32x8), codegen


@intrinsic
def f8_bits(typingctx, v):
    """The int32 bit patterns of the lanes (a bitcast)."""
    return I32x8(F32x8), lambda c, b, s, a: b.bitcast(a[0], _V8I32)


@intrinsic
def f8_from_bits(typingctx, v):
    """The float32 lanes whose bit patterns are v (a bitcast)."""
    return F32x8(I32x8), lambda c, b, s, a: b.bitcast(a[0], _V8F)


@intrinsic
def f8_to_i32(typingctx, v):
    """int32 of each lane, truncated toward zero (`cvttps2dq`; for
    integral values in range, exact)."""
    return I32x8(F32x8), lambda c, b, s, a: b.fptosi(a[0], _V8I32)


@intrinsic
def i32_and(typingctx, a, b):
    """a & b per lane."""
    return I32x8(I32x8, I32x8), lambda c, b, s, a: b.and_(a[0], a[1])


@intrinsic
def i32_or(typingctx, a, b):
    """a | b per lane."""
    return I32x8(I32x8, I32x8), lambda c, b, s, a: b.or_(a[0], a[1])


@intrinsic
def i32_shl(typingctx, v, k):
    """v << k per lane (k a literal; bits shifted out are lost)."""
    kk = _literal(k)
    if kk is None:
        return None

    def codegen(context, builder, sig, args):
        return builder.shl(args[0], ir.Constant(_V8I32, [kk] * 8))
    return I32x8(I32x8, k), codegen


@intrinsic
def f8_f16_store(typingctx, a, off, v):
    """a[off:off + 8] = the fp16 bits of v's lanes (a uint16 array; round to
    nearest even, `vcvtps2ph`; needs F16C: `HOST_F16C`)."""
    _check_array("a", a, (types.uint16, types.int16))

    def codegen(context, builder, sig, args):
        h = builder.fptrunc(args[2], ir.VectorType(ir.HalfType(), 8))
        builder.store(h, _elem_ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(ir.HalfType(), 8)),
                      align=2)
        return context.get_dummy_value()
    return types.void(a, types.intp, F32x8), codegen


@intrinsic
def f16_bits(typingctx, x):
    """The fp16 bits (uint16) of the float32 x, rounded to nearest even
    (`vcvtps2ph`; needs F16C)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), _I16)
    return types.uint16(types.float32), codegen


# ------------------------------------------------------------ int32 x 8
def _lanes_ir(builder, wv, xv, unsigned_w: bool):
    """<8 x i32>: lane L = sum_{j<4} w[4L+j] * x[4L+j], exactly. unsigned_w:
    the bytes of w are unsigned (0..255); else signed. |x| <= 127 and the
    products fit maddubs's int16 pairs (ggml's quants)."""
    if HOST_AVX2:
        maddubs = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        maddwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
        if unsigned_w:
            p16 = builder.call(maddubs, [wv, xv])
        else:
            psign = _fn(builder, "llvm.x86.avx2.psign.b", _V32I8, [_V32I8, _V32I8])
            p16 = builder.call(maddubs, [builder.call(psign, [wv, wv]), builder.call(psign, [xv, wv])])
        return builder.call(maddwd, [p16, ir.Constant(_V16I16, [1] * 16)])
    v32i32 = ir.VectorType(_I32, 32)
    w32 = builder.zext(wv, v32i32) if unsigned_w else builder.sext(wv, v32i32)
    p = builder.mul(w32, builder.sext(xv, v32i32))
    undef = ir.Constant(v32i32, ir.Undefined)
    parts = [builder.shuffle_vector(p, undef, ir.Constant(_V8I32, [4 * L + j for L in range(8)]))
             for j in range(4)]
    return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))


def _scaled_lanes_ir(builder, wv, xv, s16, signed_w: bool = False):
    """<8 x i32>: lane L = s * (the exact dot of values 4L..4L+3 of the
    unsigned bytes wv with the signed xv), s = s16[0] for lanes 0-3 and
    s16[8] for lanes 4-7 (<16 x i16> holding those two values in its
    halves). On AVX2 ggml's `madd(maddubs(w, x), scales)`: exact while the
    pair sums fit int16 (unsigned weights below 64 times |x| <= 127).
    signed_w: the bytes of wv are signed (|w| <= 127), multiplied as
    ggml's `mul_add_epi8` does (maddubs of |w| and x with w's sign; exact
    for |x| <= 127), then the same madd."""
    if HOST_AVX2:
        maddubs = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        maddwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
        if signed_w:
            psign = _fn(builder, "llvm.x86.avx2.psign.b", _V32I8, [_V32I8, _V32I8])
            wv, xv = builder.call(psign, [wv, wv]), builder.call(psign, [xv, wv])
        return builder.call(maddwd, [builder.call(maddubs, [wv, xv]), s16])
    s32 = builder.sext(builder.shuffle_vector(s16, ir.Constant(_V16I16, ir.Undefined),
                                              ir.Constant(_V8I32, [0, 2, 4, 6, 8, 10, 12, 14])), _V8I32)
    return builder.mul(_lanes_ir(builder, wv, xv, not signed_w), s32)


def scaled_pairs_ir(builder, chunks, xs, sv, idx):
    """<8 x i32>: the sum over the chunks c of the exact lanes of the
    unsigned bytes chunks[c] (<32 x i8>) with the signed xs[c], scaled:
    lane L = sum over c of s * (the dot of values 4L..4L+3), s the i16
    element idx[c][0] of `sv` (a <K x i16> vector of scales) for lanes 0-3
    and idx[c][1] for lanes 4-7 (`_scaled_lanes_ir` per chunk). With
    `HOST_AVX512BW` two chunks go through one 512-bit maddubs / madd: the
    same byte pairs, so the same int16 pair sums (exact under the same
    condition) and the same integers; otherwise one 256-bit step per chunk."""
    undef = ir.Constant(sv.type, ir.Undefined)
    acc = None
    if HOST_AVX512BW and len(chunks) % 2 == 0:
        v64, v32, v16 = ir.VectorType(_I8, 64), ir.VectorType(_I16, 32), ir.VectorType(_I32, 16)
        maddubs = _fn(builder, "llvm.x86.avx512.pmaddubs.w.512", v32, [v64, v64])
        maddwd = _fn(builder, "llvm.x86.avx512.pmaddw.d.512", v16, [v32, v32])
        both = ir.Constant(ir.VectorType(_I32, 64), list(range(64)))
        for c in range(0, len(chunks), 2):
            w = builder.shuffle_vector(chunks[c], chunks[c + 1], both)
            x = builder.shuffle_vector(xs[c], xs[c + 1], both)
            mask = [idx[c][0]] * 8 + [idx[c][1]] * 8 + [idx[c + 1][0]] * 8 + [idx[c + 1][1]] * 8
            s32 = builder.shuffle_vector(sv, undef, ir.Constant(ir.VectorType(_I32, 32), mask))
            m = builder.call(maddwd, [builder.call(maddubs, [w, x]), s32])
            acc = m if acc is None else builder.add(acc, m)
        u16 = ir.Constant(v16, ir.Undefined)
        return builder.add(builder.shuffle_vector(acc, u16, ir.Constant(_V8I32, list(range(8)))),
                           builder.shuffle_vector(acc, u16, ir.Constant(_V8I32, list(range(8, 16)))))
    for c in range(len(chunks)):
        mask = [idx[c][0]] * 8 + [idx[c][1]] * 8
        s16 = builder.shuffle_vector(sv, undef, ir.Constant(ir.VectorType(_I32, 16), mask))
        m = _scaled_lanes_ir(builder, chunks[c], xs[c], s16)
        acc = m if acc is None else builder.add(acc, m)
    return acc


def _mod8_ir(builder, wv, xv):
    """(h0, h1) <8 x i32>: lane l of h0 = w[l] x[l] + w[8+l] x[8+l], of h1 the
    same for positions 16 + l and 24 + l (signed bytes; exact)."""
    v32 = ir.VectorType(_I32, 32)
    p = builder.mul(builder.sext(wv, v32), builder.sext(xv, v32))
    undef = ir.Constant(v32, ir.Undefined)
    g = [builder.shuffle_vector(p, undef, ir.Constant(_V8I32, [8 * k + l for l in range(8)])) for k in range(4)]
    return builder.add(g[0], g[1]), builder.add(g[2], g[3])


def _dot_u_ir(builder, acc, wv, xv):
    """acc + <8 x i32> lanes of the unsigned bytes wv times the signed xv:
    `vpdpbusd` where the CPU has it, else maddubs, madd(ones), add (then
    exact only while the pair sums fit int16: wv below 128)."""
    if HOST_VNNI:
        fn = _fn(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [_V8I32, _V8I32, _V8I32])
        return builder.call(fn, [acc, builder.bitcast(wv, _V8I32), builder.bitcast(xv, _V8I32)])
    return builder.add(acc, _lanes_ir(builder, wv, xv, True))


@intrinsic
def i8x32_dot_u(typingctx, acc, w, x):
    """acc + the I32x8 lanes of w (unsigned bytes) times x (signed bytes):
    lane L gets the exact sum of w[4L+j] * x[4L+j], j < 4. Exact for any
    bytes where `HOST_VNNI`; otherwise w must stay below 128 (pairs summed
    in int16 by maddubs)."""
    def codegen(context, builder, sig, args):
        return _dot_u_ir(builder, *args)
    return I32x8(I32x8, I8x32, I8x32), codegen


@intrinsic
def i8x32_lanes_scaled(typingctx, w, x, s_lo, s_hi):
    """I32x8: lanes 0-3 = s_lo * (the exact dot lanes of the unsigned bytes w
    with the signed x), lanes 4-7 the same times s_hi (integers; ggml's
    K-quant `madd(maddubs(q, q8), scales)`; exact while w < 64 and |s| <
    2^15)."""
    def codegen(context, builder, sig, args):
        lo = builder.trunc(args[2], _I16) if args[2].type.width > 16 else builder.sext(args[2], _I16)
        hi = builder.trunc(args[3], _I16) if args[3].type.width > 16 else builder.sext(args[3], _I16)
        # two broadcasts and one blend, not sixteen inserts
        s16 = builder.shuffle_vector(_splat(builder, lo, _V16I16), _splat(builder, hi, _V16I16),
                                     ir.Constant(ir.VectorType(_I32, 16), list(range(8)) + list(range(24, 32))))
        return _scaled_lanes_ir(builder, args[0], args[1], s16)
    if not (isinstance(s_lo, types.Integer) and isinstance(s_hi, types.Integer)):
        raise TypeError("i8x32_lanes_scaled takes two integer scales")
    return I32x8(I8x32, I8x32, s_lo, s_hi), codegen


@intrinsic
def i8_store(typingctx, a, off, v):
    """a[off:off + 32] = the 32 bytes of v (a uint8 or int8 array)."""
    _check_array("a", a, _BYTES)

    def codegen(context, builder, sig, args):
        builder.store(args[2], _byte_ptr(context, builder, sig.args[0], args[0], args[1], _V32I8), align=1)
        return context.get_dummy_value()
    return types.void(a, types.intp, I8x32), codegen


@intrinsic
def i8x32_lanes(typingctx, w, x):
    """I32x8: lane L = the exact sum of w[4L+j] * x[4L+j], j < 4, of two
    I8x32 of signed bytes (|w| <= 128, |x| <= 127)."""
    def codegen(context, builder, sig, args):
        return _lanes_ir(builder, args[0], args[1], False)
    return I32x8(I8x32, I8x32), codegen


@intrinsic
def i8x32_lanes_u(typingctx, w, x):
    """`i8x32_lanes` with the bytes of w unsigned (0..255; ggml's K-quant
    dots feed the unsigned quants to `maddubs` directly)."""
    def codegen(context, builder, sig, args):
        return _lanes_ir(builder, args[0], args[1], True)
    return I32x8(I8x32, I8x32), codegen


@intrinsic
def i32_zero(typingctx):
    """I32x8 of 0."""
    return I32x8(), lambda c, b, s, a: ir.Constant(_V8I32, [0] * 8)


@intrinsic
def i32_splat(typingctx, x):
    """I32x8 with every lane x (an integer, truncated to int32)."""
    def codegen(context, builder, sig, args):
        v = args[0]
        v = builder.trunc(v, _I32) if v.type.width > 32 else (builder.sext(v, _I32) if v.type.width < 32 else v)
        return _splat(builder, v, _V8I32)
    if not isinstance(x, types.Integer):
        raise TypeError(f"i32_splat takes an integer, got {x}")
    return I32x8(x), codegen


@intrinsic
def i32_set2(typingctx, lo, hi):
    """I32x8 with lanes 0-3 = lo and lanes 4-7 = hi (integers)."""
    def codegen(context, builder, sig, args):
        vals = []
        for v in args:
            vals.append(builder.trunc(v, _I32) if v.type.width > 32 else
                        (builder.sext(v, _I32) if v.type.width < 32 else v))
        out = ir.Constant(_V8I32, ir.Undefined)
        for L in range(8):
            out = builder.insert_element(out, vals[L // 4], ir.Constant(_I32, L))
        return out
    if not (isinstance(lo, types.Integer) and isinstance(hi, types.Integer)):
        raise TypeError("i32_set2 takes two integers")
    return I32x8(lo, hi), codegen


@intrinsic
def i32_add(typingctx, a, b):
    """a + b per int32 lane."""
    return I32x8(I32x8, I32x8), lambda c, b, s, a: b.add(a[0], a[1])


@intrinsic
def i32_sub(typingctx, a, b):
    """a - b per int32 lane."""
    return I32x8(I32x8, I32x8), lambda c, b, s, a: b.sub(a[0], a[1])


@intrinsic
def i32_mul(typingctx, a, b):
    """a * b per int32 lane (the low 32 bits, `_mm256_mullo_epi32`)."""
    return I32x8(I32x8, I32x8), lambda c, b, s, a: b.mul(a[0], a[1])


@intrinsic
def i32_neg_shl(typingctx, v, k):
    """-(v << k) per int32 lane (k a literal)."""
    kk = _literal(k)
    if kk is None:
        return None

    def codegen(context, builder, sig, args):
        sh = builder.shl(args[0], ir.Constant(_V8I32, [kk] * 8))
        return builder.sub(ir.Constant(_V8I32, [0] * 8), sh)
    return I32x8(I32x8, k), codegen


@intrinsic
def i32_pairsum(typingctx, v):
    """I32x8 with lanes i < 4 = v[2i] + v[2i+1] and lanes 4-7 = 0."""
    def codegen(context, builder, sig, args):
        undef = ir.Constant(_V8I32, ir.Undefined)
        zero = ir.Constant(_V8I32, [0] * 8)
        ev = builder.shuffle_vector(args[0], zero, ir.Constant(_V8I32, [0, 2, 4, 6, 8, 8, 8, 8]))
        od = builder.shuffle_vector(args[0], zero, ir.Constant(_V8I32, [1, 3, 5, 7, 8, 8, 8, 8]))
        del undef
        return builder.add(ev, od)
    return I32x8(I32x8), codegen


@intrinsic
def i32_to_f8(typingctx, v):
    """float32 of each int32 lane, rounded to nearest even
    (`_mm256_cvtepi32_ps`)."""
    return F32x8(I32x8), lambda c, b, s, a: b.sitofp(a[0], _V8F)


@intrinsic
def i32_hsum(typingctx, v):
    """The sum of the 8 int32 lanes, as int64; computed in int32 (a
    shuffle-and-add tree), so exact when the sum fits int32, which every
    caller's bounds guarantee (ggml's own dots sum in int32 too)."""
    def codegen(context, builder, sig, args):
        fn = _fn(builder, "llvm.vector.reduce.add.v8i32", _I32, [_V8I32])
        return builder.sext(builder.call(fn, [args[0]]), ir.IntType(64))
    return types.int64(I32x8), codegen


@intrinsic
def i32_lane(typingctx, v, i):
    """Lane i of v (int32, returned as int64)."""
    def codegen(context, builder, sig, args):
        return builder.sext(builder.extract_element(args[0], builder.trunc(args[1], _I32)), ir.IntType(64))
    return types.int64(I32x8, types.intp), codegen


@intrinsic
def i32_load(typingctx, a, off):
    """I32x8 of the int32 array a[off:off + 8]."""
    _check_array("a", a, (types.int32,))

    def codegen(context, builder, sig, args):
        return builder.load(_elem_ptr(context, builder, sig.args[0], args[0], args[1], _V8I32), align=4)
    return I32x8(a, types.intp), codegen


@intrinsic
def i32_pairdot(typingctx, a, off, b, boff):
    """I32x8, lane L = a[2L] b[2L] + a[2L+1] b[2L+1] for the 16 signed bytes
    at byte `off` of a and the int32 array b[boff:boff + 16], whose values
    must fit int16 (ggml's K-quant scales times the bsums of 16 int8
    activations, |bsum| <= 2048): exact. On AVX2 the b values are narrowed
    to int16 and the pairs summed by one `vpmaddwd`."""
    _check_array("a", a, _BYTES)
    _check_array("b", b, (types.int32,))

    def codegen(context, builder, sig, args):
        v16 = ir.VectorType(_I32, 16)
        a16 = builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], _V16I8), align=1)
        sb = builder.load(_elem_ptr(context, builder, sig.args[2], args[2], args[3], v16), align=4)
        if HOST_AVX2:
            maddwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
            return builder.call(maddwd, [builder.sext(a16, _V16I16), builder.trunc(sb, _V16I16)])
        sa = builder.sext(a16, v16)
        p = builder.mul(sa, sb)
        undef = ir.Constant(v16, ir.Undefined)
        even = builder.shuffle_vector(p, undef, ir.Constant(_V8I32, [2 * L for L in range(8)]))
        odd = builder.shuffle_vector(p, undef, ir.Constant(_V8I32, [2 * L + 1 for L in range(8)]))
        return builder.add(even, odd)
    return I32x8(a, types.intp, b, types.intp), codegen


# ------------------------------------------------------------ int8 x 32
@intrinsic
def i8_load(typingctx, a, off):
    """I8x32 of the 32 bytes a[off:off + 32] (a uint8 or int8 array)."""
    _check_array("a", a, _BYTES)

    def codegen(context, builder, sig, args):
        return builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], _V32I8), align=1)
    return I8x32(a, types.intp), codegen


@intrinsic
def i8_nibbles(typingctx, a, off):
    """I8x32 of the 16 bytes a[off:off + 16]: their low nibbles, then their
    high nibbles (0..15; ggml `bytes_from_nibbles_32`)."""
    _check_array("a", a, _BYTES)

    def codegen(context, builder, sig, args):
        raw = builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], _V16I8), align=1)
        lo = builder.and_(raw, ir.Constant(_V16I8, [15] * 16))
        hi = builder.lshr(raw, ir.Constant(_V16I8, [4] * 16))
        return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
    return I8x32(a, types.intp), codegen


@intrinsic
def i8_bits16(typingctx, a, off):
    """I8x32 from the little-endian uint32 at byte `off` of a: byte j is 16
    when bit j is set, else 0 (the fifth bit of Q5_0 / Q5_1 value j)."""
    _check_array("a", a, _BYTES)

    def codegen(context, builder, sig, args):
        # ggml's `bytes_from_bits_32` in portable IR: byte j of the result
        # looks at byte j // 8 of the word (a byte shuffle), keeps bit j % 8
        # (an AND), and becomes 16 where it is set (a compare and a select)
        w4 = builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(_I8, 4)),
                          align=1)
        spread = builder.shuffle_vector(w4, ir.Constant(ir.VectorType(_I8, 4), ir.Undefined),
                                        ir.Constant(ir.VectorType(_I32, 32), [j // 8 for j in range(32)]))
        bit = builder.and_(spread, ir.Constant(_V32I8, [1 << (j % 8) for j in range(32)]))
        on = builder.icmp_unsigned("!=", bit, ir.Constant(_V32I8, [0] * 32))
        return builder.select(on, ir.Constant(_V32I8, [16] * 32), ir.Constant(_V32I8, [0] * 32))
    return I8x32(a, types.intp), codegen


@intrinsic
def i8_or(typingctx, a, b):
    """a | b per byte."""
    return I8x32(I8x32, I8x32), lambda c, b, s, a: b.or_(a[0], a[1])


@intrinsic
def i8_xor(typingctx, a, b):
    """a ^ b per byte."""
    return I8x32(I8x32, I8x32), lambda c, b, s, a: b.xor(a[0], a[1])


@intrinsic
def i8_sub(typingctx, a, b):
    """a - b per byte (wrapping)."""
    return I8x32(I8x32, I8x32), lambda c, b, s, a: b.sub(a[0], a[1])


@intrinsic
def i8_splat(typingctx, x):
    """I8x32 with every byte x (an integer, truncated to 8 bits)."""
    def codegen(context, builder, sig, args):
        return _splat(builder, builder.trunc(args[0], _I8) if args[0].type.width > 8 else args[0], _V32I8)
    if not isinstance(x, types.Integer):
        raise TypeError(f"i8_splat takes an integer, got {x}")
    return I8x32(x), codegen


@intrinsic
def prefetch(typingctx, a, off):
    """Hint the CPU to bring byte `off` of a into the cache (`prefetcht0`);
    no effect on any value. The kernels that walk several rows at once
    need it: each row is a stream too short for the hardware prefetcher."""
    _check_array("a", a, _BYTES)

    def codegen(context, builder, sig, args):
        p = _byte_ptr(context, builder, sig.args[0], args[0], args[1], _I8)
        fn = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32])
        builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return types.void(a, types.intp), codegen


# ------------------------------------------------------------ scalars from raw bytes
_F16_TABLE = F16_TO_F32


@intrinsic
def _f16c_at(typingctx, a, off):
    _check_array("a", a, _BYTES)

    def codegen(context, builder, sig, args):
        h = builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], ir.HalfType()), align=1)
        return builder.fpext(h, _F32)
    return types.float32(a, types.intp), codegen


@intrinsic
def u16_at(typingctx, a, off):
    """The little-endian uint16 at byte `off` of a (as intp)."""
    _check_array("a", a, _BYTES)

    def codegen(context, builder, sig, args):
        h = builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], _I16), align=1)
        return builder.zext(h, ir.IntType(64))
    return types.intp(a, types.intp), codegen


@intrinsic
def u32_at(typingctx, a, off):
    """The little-endian uint32 at byte `off` of a (as int64)."""
    _check_array("a", a, _BYTES)

    def codegen(context, builder, sig, args):
        w = builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], _I32), align=1)
        return builder.zext(w, ir.IntType(64))
    return types.int64(a, types.intp), codegen


@intrinsic
def i8_at(typingctx, a, off):
    """The signed byte at `off` of a (as int32)."""
    _check_array("a", a, _BYTES)

    def codegen(context, builder, sig, args):
        b = builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1], _I8), align=1)
        return builder.sext(b, _I32)
    return types.int32(a, types.intp), codegen


if HOST_F16C:
    f16_at = _f16c_at
else:
    from numba import njit

    @njit(inline="always", cache=True)
    def f16_at(a, off):
        return _F16_TABLE[u16_at(a, off)]

f16_at.__doc__ = """The fp16 at byte `off` of a (a uint8 / int8 array) as float32
(exact; F16C or a table)."""

del cgutils
