"""C scalar rules that ggml's reference quantizers rely on, for numba code.

ggml's `quantize_row_*_ref` (ggml-org/ggml src/ggml-quants.c) mixes float32
arithmetic with a few integer conversions whose exact behaviour decides the
output bits. Each is written here once:

* `nearest_int(f)`: ggml's `nearest_int`, which adds 1.5*2^23 in float32 and
  reads the low 23 bits of the sum: round half to even for |f| <= 2^22. Outside
  that range it is reproduced literally (the same bit trick), which is what the
  C code computes when assertions are compiled out (NDEBUG).
* `cvtt_i32(f)`: a C cast float -> int on x86-64 (`cvttss2si`): truncation
  toward zero; NaN and values outside the int32 range give INT32_MIN. Casts to
  int8_t/uint8_t are the low byte of that (`& 0xFF`). C calls these undefined
  behaviour; the x86-64 result is what ggml's portable build produces.
* `roundf_f32(f)`: C `roundf`, halves away from zero, as float32.
* `lroundf_i32(f)`: glibc `lroundf` then the implicit conversion of the long
  to int, as in `int xi = lroundf(v) + 1` (NaN, Inf and |f| >= 2^63 give
  LONG_MIN, whose low 32 bits are 0).
* `f32_bits` / `bits_f32`: reinterpret float32 <-> uint32 (C `memcpy`).
* `fp16_store(b, o, f)`: `GGML_FP32_TO_FP16` (ggml's NaN rule) stored little
  endian at byte offset o (`_bytes.f16(b, o)` reads it back, `GGML_FP16_TO_FP32`).
* `fma32(a, b, c)`: a*b + c rounded once, what GCC makes of `a*b + c` where
  it contracts (the aarch64 builds of ggml-base: `strata_ref.cpu.base_quant`;
  every FMA build of ggml-cpu: `strata_ref.cpu.fp`); `mul_add(a, b, c)` is
  the same expression rounded twice, as a build without FMA computes it.

Numba promotes float32 op int64 to float64, so every function takes and
returns float32 where C has float, and callers cast integers with
`np.float32(...)` before they meet a float, as C converts them.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ..numerics import F16_TO_F32

_MAGIC = np.float32(12582912.0)          # 1.5 * 2^23


@intrinsic
def _f32_as_u32(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))
    return types.uint32(types.float32), codegen


@intrinsic
def _u32_as_f32(typingctx, u):
    if u != types.uint32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))
    return types.float32(types.uint32), codegen


@intrinsic
def fma32(typingctx, a, b, c):
    """float32 a*b + c with a single rounding (LLVM `llvm.fma.f32`)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        flt = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [flt], ir.FunctionType(flt, [flt, flt, flt]))
        return builder.call(fn, args)
    return sig, codegen


@njit(inline="always", cache=True, error_model="numpy")
def mul_add(a, b, c, fused):
    """float32 a*b + c: rounded once (fma32) when `fused` is True, else
    the product and the sum each rounded (C without contraction); a
    literal `fused` lets LLVM drop the other branch."""
    if fused:
        return fma32(np.float32(a), np.float32(b), np.float32(c))
    return np.float32(np.float32(a * b) + c)


@njit(inline="always", cache=True, error_model="numpy")
def f32_bits(f):
    """uint32 bits of float32 f, as int64."""
    return np.int64(_f32_as_u32(np.float32(f)))


@njit(inline="always", cache=True, error_model="numpy")
def bits_f32(u):
    """float32 with bits u (low 32 bits of an integer)."""
    return _u32_as_f32(np.uint32(u & 0xFFFFFFFF))


@njit(inline="always", cache=True, error_model="numpy")
def nearest_int(f):
    """ggml `nearest_int`: low mantissa bits of f + 1.5*2^23 (float32)."""
    i = f32_bits(np.float32(f) + _MAGIC)
    return (i & 0x007FFFFF) - 0x00400000


@njit(inline="always", cache=True, error_model="numpy")
def cvtt_i32(f):
    """x86-64 `cvttss2si`: C's float -> int cast, INT32_MIN when invalid."""
    v = np.float64(f)
    if v > -2147483649.0 and v < 2147483648.0:   # False for NaN
        return np.int64(v)
    return np.int64(-2147483648)


@njit(inline="always", cache=True, error_model="numpy")
def to_i8(v):
    """Two's-complement int8 value of the low byte of integer v."""
    b = v & 0xFF
    return b - 256 if b >= 128 else b


@njit(inline="always", cache=True, error_model="numpy")
def roundf_f32(f):
    """C `roundf` (half away from zero) of float32 f, as float32.

    In float64, |f| + 0.5 is exact for every float32 f, so the floor is the
    correctly rounded result; NaN and Inf pass through.
    """
    v = np.float64(f)
    r = np.floor(abs(v) + 0.5)
    return np.float32(-r if v < 0.0 else r)


@njit(inline="always", cache=True, error_model="numpy")
def lroundf_i32(f):
    """glibc `lroundf(f)` converted to int (low 32 bits, two's complement)."""
    v = np.float64(f)
    if not (abs(v) < 9.223372036854775808e18):    # NaN, Inf, out of range
        return np.int64(0)                        # low half of LONG_MIN
    r = np.int64(np.floor(abs(v) + 0.5))
    if v < 0.0:
        r = -r
    r &= 0xFFFFFFFF
    return r - 0x100000000 if r >= 0x80000000 else r


@njit(inline="always", cache=True, error_model="numpy")
def fp32_to_fp16_ggml(u):
    """fp16 bits of the float32 with bits u, by ggml's float trick
    (`ggml_compute_fp32_to_fp16`): the magnitude is scaled by 2^112 then
    2^-110 and added to a float whose exponent aligns the 11-bit result, so
    the FPU's own round-to-nearest-even does the rounding (subnormal halves
    and overflow to Inf included); NaN gives sign | 0x7E00. Branch-free."""
    fb = bits_f32(u & 0x7FFFFFFF)
    base = (fb * np.float32(2.0 ** 112)) * np.float32(2.0 ** -110)
    shl1 = (u + u) & 0xFFFFFFFF
    bias = shl1 & 0xFF000000
    bias = bias if bias >= 0x71000000 else 0x71000000
    r = f32_bits(bits_f32((bias >> 1) + 0x07800000) + base)
    nonsign = ((r >> 13) & 0x7C00) + (r & 0x0FFF)
    return ((u >> 16) & 0x8000) | (0x7E00 if shl1 > 0xFF000000 else nonsign)


@njit(inline="always", cache=True, error_model="numpy")
def fp16_bits(f):
    """`GGML_FP32_TO_FP16(f)` bits: RNE, NaN -> sign | 0x7E00."""
    return fp32_to_fp16_ggml(f32_bits(f))


@njit(inline="always", cache=True, error_model="numpy")
def fp16_store(b, o, f):
    """Store `GGML_FP32_TO_FP16(f)` little endian at b[o:o+2]; returns the
    float32 value the stored half decodes to (`GGML_FP16_TO_FP32`)."""
    h = fp16_bits(f)
    b[o] = h & 0xFF
    b[o + 1] = h >> 8
    return F16_TO_F32[h]


@njit(inline="always", cache=True, error_model="numpy")
def store_u32(b, o, v):
    """Store the low 32 bits of integer v little endian at b[o:o+4]."""
    b[o] = v & 0xFF
    b[o + 1] = (v >> 8) & 0xFF
    b[o + 2] = (v >> 16) & 0xFF
    b[o + 3] = (v >> 24) & 0xFF


@njit(inline="always", cache=True, error_model="numpy")
def e8m0_half(e):
    """ggml `ggml_e8m0_to_fp32_half(e)` = 2^(e-128) as float32."""
    if e >= 2:
        return bits_f32((e - 1) << 23)
    return bits_f32(0x00200000 << e)


@njit(inline="always", cache=True, error_model="numpy")
def ue4m3_value(x):
    """ggml `ggml_ue4m3_to_fp32(x)` (half the UE4M3 value), float32.

    0x00 and 0x7F give 0; exp 0 is man*2^-9; else (1 + man/8)*2^(exp-7);
    then halved. Each step is exact, so it is built from the bits directly.
    """
    if x == 0 or x == 0x7F:
        return np.float32(0.0)
    ex = (x >> 3) & 15
    man = x & 7
    if ex == 0:
        # man * 2^-9 * 0.5 = man * 2^-10
        return np.float32(man) * np.float32(2.0 ** -10)
    # (8 + man) * 2^(ex - 10) * 0.5 = (8 + man) * 2^(ex - 11)
    return np.float32(8 + man) * bits_f32((ex - 11 + 127) << 23)


@njit(cache=True, error_model="numpy")
def ue4m3_encode(x):
    """ggml `ggml_fp32_to_ue4m3(x)` for float32 x: the UE4M3 byte.

    Not positive (or NaN) -> 0; clamped to 448; exponent below the normal
    range -> subnormal `(int)(x*512 + 0.5)` capped at 7; the mantissa is
    rounded half up from fp32 bit 19; overflow past exponent 14 -> 0x7E.
    """
    x = np.float32(x)
    if not (x > np.float32(0.0)):
        return 0
    if x > np.float32(448.0):
        x = np.float32(448.0)
    bits = f32_bits(x)
    fexp = ((bits >> 23) & 0xFF) - 127
    fman = (bits >> 20) & 0x7
    uexp = fexp + 7
    if uexp <= 0:
        man = cvtt_i32(x * np.float32(512.0) + np.float32(0.5))
        if man > 7:
            man = 7
        if man < 1:
            return 0
        return man
    if uexp >= 15:
        return 0x7E
    uman = fman + ((bits >> 19) & 1)
    if uman > 7:
        uman = 0
        uexp += 1
        if uexp >= 15:
            return 0x7E
    return (uexp << 3) | uman


# ---- fast forms, exact when the caller can promise the range ------------------
# A block quantizer knows after its scan whether every x*id is finite and far
# inside the int32 range (id finite and the scale finite: |x*id| <= nmax*(1+2^-20)).
# It then passes safe=True and the conversions below become plain, vectorisable
# instructions with the same results; otherwise they fall back to the x86 rules.

@njit(inline="always", cache=True, error_model="numpy")
def c_trunc_int(v, safe):
    """C `(int)v` (truncation), INT32_MIN when invalid; `safe`: |v| < 2^31."""
    if safe:
        return np.int64(np.int32(v))     # f32 -> i32: vectorisable
    return cvtt_i32(v)


@njit(inline="always", cache=True, error_model="numpy")
def c_roundf_int(v, safe):
    """C `(int)roundf(v)` (half away from zero); `safe`: |v| < 2^31, not NaN.
    Then also equal to `lroundf_i32(v)`."""
    if safe:
        a = np.float64(v)
        r = np.int64(np.int32(abs(a) + 0.5))   # exact in float64; truncation = floor here
        return -r if a < 0.0 else r
    return cvtt_i32(roundf_f32(v))


@njit(inline="always", cache=True, error_model="numpy")
def abs_bits(v):
    """Bits of |v| as int64: for non-NaN floats their order is the order of |v|."""
    return f32_bits(v) & 0x7FFFFFFF


@njit(inline="always", cache=True, error_model="numpy")
def abs_max_bits(x):
    """max |x[j]| as bits (integer max: vectorisable). For non-NaN input this is
    ggml's `amax = MAX(amax, fabsf(v))` from 0.0f (+0 when all are ±0)."""
    m = 0
    for j in range(x.shape[0]):
        a = abs_bits(x[j])
        m = m if m > a else a
    return m


@njit(inline="always", cache=True, error_model="numpy")
def first_signed_absmax(x):
    """ggml's `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` from
    amax = max = 0.0f: (amax, max), max the first element of largest magnitude
    (+0.0 when every element is ±0). For non-NaN input and blocks of at most
    256 values: one integer max over keys |x[i]| bits << 8 | (255 - i), whose
    maximum is the largest magnitude at its first position (vectorisable)."""
    best = 0
    for i in range(x.shape[0]):
        k = (abs_bits(x[i]) << 8) | (255 - i)
        best = best if best > k else k
    m = best >> 8
    if m == 0:
        return np.float32(0.0), np.float32(0.0)
    return bits_f32(m), x[255 - (best & 255)]


@njit(inline="always", cache=True, error_model="numpy")
def c_lroundf_int(v, safe):
    """`lroundf_i32(v)`; `safe`: |v| < 2^31 and not NaN (then it is roundf)."""
    if safe:
        return c_roundf_int(v, True)
    return lroundf_i32(v)
