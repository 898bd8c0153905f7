"""IQ4_XS times Q8_K activations on the stored GGUF blocks: ggml's AVX2
`ggml_vec_dot_iq4_xs_q8_K` (`ggml-cpu/arch/x86/quants.c`, `__AVX2__`
branch, llama.cpp vendored by llama-cpp-python 0.3.36), bit for bit.

A block of 256 values is 136 bytes (ggml-common.h `block_iq4_xs`): fp16
d, u16 scales_h, 4 bytes scales_l, 128 bytes of nibbles. Chunk c of 32
values (c < 8) has the 6-bit scale ls = (nibble c of scales_l) | (bits 2c,
2c+1 of scales_h) << 4 and the values kvalues_iq4nl[q], q the low nibbles
of qs[16c:16c + 16], then their high nibbles. The kernel reads those bytes
as they are stored: the nibbles become signed values by a 16-entry byte
table lookup (`vpshufb`, as ggml does), the scales are decoded per
block, and the integer lanes and float steps are those of the "x86" path
of `dots_iquants` (which reads a widened copy: one int8 per value and an
int32 scale per 16 values):

    lane L = sum over the 8 chunks of (ls - 32) * (exact dot of values
             4L..4L+3 of the chunk with their activations)
    acc    = fma(d, float(lanes), acc),   d = fp16(d_w) * d_a
    result = hsum_float_8(acc)

The integer lanes are exact, so the bits equal that path's; reading 136
bytes per block instead of 256 + 32 is what makes the mat-vec faster.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..formats.iq_tables import KVALUES_IQ4NL
from ..types import GGMLType, block_format
from ._digest import jit
from .simd import (HOST_AVX2, I32x8, _BYTES, _I8, _I16, _I32, _V16I8, _V32I8, _byte_ptr, _check_array,
                   _fn, _scaled_lanes_ir, _splat, f8_fma, f8_hsum, f8_splat, f8_zero, f16_at, i32_to_f8)

__all__ = ["rows_iq4_xs", "matmul_iq4_xs"]

_FMT = block_format(GGMLType.IQ4_XS)
_BB = _FMT.block_bytes
_D, _SH, _SL, _QS = (_FMT.field(n).offset for n in ("d", "scales_h", "scales_l", "qs"))
_KV = [int(v) for v in np.asarray(KVALUES_IQ4NL, np.int8)]
if len(_KV) != 16:
    raise RuntimeError("kvalues_iq4nl must hold 16 values")

#: weight rows per task of the parallel kernel
_ROWS_PER_TASK = 64

_V8I16 = ir.VectorType(_I16, 8)


def _scales_ir(builder, sh, sl4):
    # the 8 chunk scales ls - 32 as <8 x i16>: chunk c takes the low (c
    # even) or high nibble of scales_l[c / 2] and bits 2c, 2c+1 of scales_h
    lo = builder.zext(builder.shuffle_vector(sl4, ir.Constant(sl4.type, ir.Undefined),
                                             ir.Constant(ir.VectorType(_I32, 8), [c // 2 for c in range(8)])), _V8I16)
    lo = builder.and_(builder.lshr(lo, ir.Constant(_V8I16, [4 * (c & 1) for c in range(8)])),
                      ir.Constant(_V8I16, [15] * 8))
    hi = builder.and_(builder.lshr(_splat(builder, sh, _V8I16), ir.Constant(_V8I16, [2 * c for c in range(8)])),
                      ir.Constant(_V8I16, [3] * 8))
    ls = builder.or_(lo, builder.shl(hi, ir.Constant(_V8I16, [4] * 8)))
    return builder.sub(ls, ir.Constant(_V8I16, [32] * 8))


def _values_ir(builder, idx):
    # kvalues_iq4nl[idx] for the 32 nibbles idx (<32 x i8>, 0..15): one
    # `vpshufb` of the table held in both 128-bit halves (ggml's
    # `_mm_shuffle_epi8(values128, ..)`), else a select per table entry
    if HOST_AVX2:
        pshufb = _fn(builder, "llvm.x86.avx2.pshuf.b", _V32I8, [_V32I8, _V32I8])
        return builder.call(pshufb, [ir.Constant(_V32I8, _KV + _KV), idx])
    out = ir.Constant(_V32I8, [0] * 32)
    for k, v in enumerate(_KV):
        hit = builder.icmp_unsigned("==", idx, ir.Constant(_V32I8, [k] * 32))
        out = builder.select(hit, ir.Constant(_V32I8, [v] * 32), out)
    return out


@intrinsic
def _iq4_lanes(typingctx, w, o, x, xo):
    """I32x8: the lanes of the IQ4_XS block at byte o of w (uint8) with its
    256 Q8_K quants at x[xo:] (int8): lane L = sum over the chunks c of
    (ls_c - 32) * (the exact dot of values 4L..4L+3 of chunk c)."""
    _check_array("w", w, _BYTES)
    _check_array("x", x, _BYTES)

    def codegen(context, builder, sig, args):
        W, ow, X, ox = args

        def at(arr, i, off, llty):
            p = _byte_ptr(context, builder, sig.args[i], arr, builder.add(ow if i == 0 else ox,
                                                                          ir.Constant(ow.type, off)), llty)
            return builder.load(p, align=1)
        ls = _scales_ir(builder, at(W, 0, _SH, _I16), at(W, 0, _SL, ir.VectorType(_I8, 4)))
        undef = ir.Constant(_V8I16, ir.Undefined)
        acc = None
        for c in range(8):
            q = at(W, 0, _QS + 16 * c, _V16I8)
            nib = builder.shuffle_vector(builder.and_(q, ir.Constant(_V16I8, [15] * 16)),
                                         builder.lshr(q, ir.Constant(_V16I8, [4] * 16)),
                                         ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
            s16 = builder.shuffle_vector(ls, undef, ir.Constant(ir.VectorType(_I32, 16), [c] * 16))
            m = _scaled_lanes_ir(builder, _values_ir(builder, nib), at(X, 2, 32 * c, _V32I8), s16, signed_w=True)
            acc = m if acc is None else builder.add(acc, m)
        return acc
    return I32x8(w, types.intp, x, types.intp), codegen


@njit(inline="always")
def _row_dot(w, ow, x, ox, xd, t):
    # one weight row (its blocks at byte ow of w) with activation row t
    # (quants at x[ox:], scales xd[t]): ggml_vec_dot_iq4_xs_q8_K, AVX2
    acc = f8_zero()
    for b in range(xd.shape[1]):
        o = ow + b * _BB
        d = np.float32(f16_at(w, o + _D) * xd[t, b])
        acc = f8_fma(f8_splat(d), i32_to_f8(_iq4_lanes(w, o, x, ox + 256 * b)), acc)
    return f8_hsum(acc)


@jit
def rows_iq4_xs(raw, xq, xd, out, r0, r1):
    """out[t, r] = ggml_vec_dot_iq4_xs_q8_K (AVX2) of weight row r with
    activation row t, for r0 <= r < r1 and every t. raw: uint8 (rows,
    row_bytes), the stored IQ4_XS blocks; xq: int8 (n, cols) Q8_K quants;
    xd: float32 (n, cols/256) their scales; out: float32 (n, rows)."""
    n, cols = xq.shape
    rb = raw.shape[1]
    w = raw.reshape(-1)
    x = xq.reshape(-1)
    for r in range(r0, r1):
        for t in range(n):
            out[t, r] = _row_dot(w, r * rb, x, t * cols, xd, t)


@jit(parallel=True)
def _rows_parallel(raw, xq, xd, out, r0, r1):
    for c in prange((r1 - r0 + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        a = r0 + c * _ROWS_PER_TASK
        rows_iq4_xs(raw, xq, xd, out, a, min(r1, a + _ROWS_PER_TASK))


def matmul_iq4_xs(raw, xq, xd, out, r0: int, r1: int, parallel: bool) -> None:
    """`rows_iq4_xs` over rows r0..r1-1 (the same arguments), with
    `parallel` in tasks of `_ROWS_PER_TASK` rows on numba's threads (each
    row's arithmetic is the same on any thread). ValueError where raw does
    not hold whole rows of xq's length."""
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != xq.shape[1] // 256 * _BB or xq.shape[1] % 256:
        raise ValueError(f"raw {raw.dtype} {raw.shape} is not IQ4_XS rows of {xq.shape[1]} values")
    (_rows_parallel if parallel else rows_iq4_xs)(raw, xq, xd, out, r0, r1)
