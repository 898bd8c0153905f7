"""ggml-cpu's dots of the 256-value I-quants (IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_XS) with Q8_K activations, per CPU
profile, bit for bit.

Which ggml-cpu code each path follows (llama.cpp vendored by
llama-cpp-python 0.3.36), the path chosen by `traits.mm_path` and the
variant by the instruction-set chain (`traits.kernel`):

* "x86", the `vec_dot` of the AVX2 builds (avx2 and avx512: the AVX-512
  build compiles the `__AVX2__` branch): `ggml_vec_dot_<type>_q8_K`
  of `ggml-cpu/arch/x86/quants.c`. Every type has the same float skeleton:
  8 int32 lanes per super-block, lane L = sum over the 8 chunks of 32
  values of (sub-block scale) x (exact dot of values 4L..4L+3 of the
  chunk), i.e. `madd(maddubs(..), scale)` summed with `add_epi32`;
  acc = fma(d, float(lanes), acc) with d = fp16(d_w) * d_a; the result is
  `hsum_float_8(acc)` times 0.125 (IQ2_*), 0.25 (IQ3_XXS) or 1 (IQ3_S,
  IQ4_XS). IQ4_XS runs this path on its stored blocks (`iq4_rows`: the
  same lanes and float steps, half the bytes read). IQ1_S adds a scalar `accum1 = fma(d, float(sumi1), accum1)` of
  the delta terms (sumi1 = sum of scale * delta * bsums, exact) and returns
  `fma(0.125, accum1, hsum)` (GCC contracts both); IQ1_M keeps the delta
  terms in a second set of 8 lanes (lane L: scale * delta * the sum of
  activations 4L..4L+3) with their own FMA accumulator and returns
  `hsum(acc1) + 0.125 * hsum(acc2)`, contracted to one fma.
* "generic", the `vec_dot` of the baseline build (scalar, no FMA): the `_generic`
  functions of `ggml-cpu/quants.c`: one exact integer per super-block and
  `sumf += d * float(bsum)` (a multiply and an add), times 0.125 / 0.25 at
  the end; IQ1_S / IQ1_M `sumf += d * (float(sumi) + 0.125 * float(delta
  sum))`; IQ4_XS one step per 32 values, `sumf += (d * float(ls - 32)) *
  float(dot)`.
* "tiled" (8 or more activation rows, avx2 and avx512): ggml's tiled
  mat-mul (`tiled/tiled.cpp` unpacks each type into biased uint8 codes with
  integer scales, `tiled/tiled-kernel.cpp` runs the AVX2 or AVX512-VNNI
  microkernel). Both kernels compute the exact integer s = sum over the
  super-block of scale * value * q8 (their biases cancel exactly), then
  r = float(s) * d_tile and out = fma(r, d_a, out), block after block.
  d_tile = fp16(d) * 0.125 (IQ2_*), * 0.25 (IQ3_XXS), * 1 (IQ3_S, IQ4_XS);
  IQ1_S / IQ1_M store 8 * grid + delta as the value and fp16(d) * 0.125.
* "iqp" (llama.cpp v0.4.0's builds with AVX2, 8 or more activation rows,
  weight rows % 8 == 0): v0.4.0's IQ panel gemm (`iqp.cpp`: 8 weight rows
  decoded into int8 panels with integer sub-block scales, the same values
  and scales as the tiled unpacking, so the same exact integer s per
  super-block), then `sumf = fma(float(s), dfac * d_a, sumf)`
  (`iqp_gemm_tile_4` and `iqp_gemv_8x8_q8_K` alike), dfac = the tiled
  d_tile: the rounded product is the scale pair, not float(s) * d_tile.
* "neon", the `vec_dot` of every arm64 NEON build (`ggml-cpu/arch/arm/quants.c`;
  the lanes are reduced as integers, so dotprod changes nothing), as GCC
  12 contracted it (disassembly, docs/arm64.md): per super-block, d =
  fp16(d_w) * d_a and the exact integer I = sum scale * dot; IQ2_XS, IQ2_S,
  IQ3_S, IQ4_XS `sumf = fma(float(I), d, sumf)`; IQ2_XXS / IQ3_XXS keep
  two floats, the even and the odd chunks of 32, `sumf1 = fma(float(dot),
  0.5 + s, sumf1)`, then `sumf = fma(sumf1 + sumf2, d, sumf)`; IQ1_S /
  IQ1_M `sumf = fma(d, fma(float(delta sum), 0.125, float(I)), sumf)`; the
  result times 0.125 (IQ2_XS, IQ2_S), 0.25 (IQ2_XXS), 0.5 (IQ3_XXS).

The integer parts are exact and computed with `lanes` (ggml's own
maddubs / madd on AVX2 CPUs, portable LLVM vector code elsewhere); every
float operation is written out in ggml's order with explicit `fma32` /
`fma8_into`, no fastmath.

Layout (`IQuantFamily.pack`, once per matrix): the signed weight values
widened to int8 (grid magnitude times sign for IQ2 / IQ3, `kvalues_iq4nl`
for IQ4_XS, the grid's -1 / 0 / +1 for IQ1; no float copy of the weights),
the sub-block scales as int32 per 16 values (2 * s + 1, or ls - 32 for
IQ4_XS), fp16 d as float32 per super-block, and for IQ1 the product of
scale and delta sign (+-1..15) per 4 values as int8, so that the delta
terms are one small integer dot with the activations' sums of 4.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._digest import jit
from ..numerics import F16_TO_F32
from ..formats.iq_tables import (IQ1S_GRID_BYTES, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID,
                                 IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS, KVALUES_IQ4NL)
from ..types import GGMLType as T
from ..types import block_format
from . import act_quant, iq4_rows
from .traits import Family, kernel
from .fp import fma32, hsum8
from .lanes import _check, _ptr, fma8_into, lanes_scaled_add, q8_block_dot

__all__ = ["FAMILY", "IQ_TYPES", "pack_iquant"]

#: kernel modes: how a type's integer parts are formed
_GRID, _IQ4, _IQ1S, _IQ1M = 0, 1, 2, 3
#: kernel paths
_AVX2, _GEN, _TILED, _NEON, _IQP = 0, 1, 2, 3, 4
#: the AVX2 path's lanes with `acc + d * lane` unfused: the AVX (no AVX2)
#: branch of a build without FMA (IQ4_XS on v0.4.0's ivybridge)
_AVX_NOFMA = 5

# per type: mode, factor of the vec_dot result (ggml's `0.125f *
# hsum_float_8(...)` etc.), factor folded into the tiled d (tiled.cpp)
_TYPE_CONST = {
    T.IQ2_XXS: (_GRID, 0.125, 0.125),
    T.IQ2_XS: (_GRID, 0.125, 0.125),
    T.IQ2_S: (_GRID, 0.125, 0.125),
    T.IQ3_XXS: (_GRID, 0.25, 0.25),
    T.IQ3_S: (_GRID, 1.0, 1.0),
    T.IQ4_XS: (_IQ4, 1.0, 1.0),
    T.IQ1_S: (_IQ1S, 1.0, 0.125),
    T.IQ1_M: (_IQ1M, 1.0, 0.125),
}
IQ_TYPES = frozenset(_TYPE_CONST)
#: the NEON code's factor of the result where it differs from `_TYPE_CONST`'s
#: (its chunk scales are 0.5 + s, not 2 s + 1)
_NEON_POST = {T.IQ2_XXS: 0.25, T.IQ3_XXS: 0.5}

_IQ1_DELTA = np.float32(0.125)      # IQ1S_DELTA = IQ1M_DELTA (ggml-common.h)

#: weight rows per task of the parallel kernel
_ROWS_PER_TASK = 64


# ---------------------------------------------------------------- packing

def _field(raw3, t, name):
    """Field `name` of every block, (rows, nb, count) in its storage dtype."""
    f = block_format(t).field(name)
    b = np.ascontiguousarray(raw3[:, :, f.offset:f.offset + f.nbytes])
    return b.view(f.dtype)


def _fp16(bits):
    return F16_TO_F32[np.asarray(bits, np.uint16)]


# byte j of _SIGN_MASK[s] is 0xFF where bit j of the sign byte s is set
# (ggml's `kmask_iq2xs[j]` test: value j negated)
_SIGN_MASK = np.array([sum(0xFF << (8 * j) for j in range(8) if s >> j & 1) for s in range(256)],
                      np.uint64)
_BYTE_ONES = np.uint64(0x0101010101010101)
# `_signed` needs grid magnitudes of at least 1 (spec/formats.md §7: the
# IQ2 grids' bytes are 8, 25, 43, IQ3_XXS's 4..62, IQ3_S's 1..15)
if not all(np.all(g.astype(g.dtype.newbyteorder("<")).view(np.uint8) != 0)
           for g in (IQ2XXS_GRID, IQ2XS_GRID, IQ2S_GRID, IQ3XXS_GRID, IQ3S_GRID)):
    raise RuntimeError("an IQ2 / IQ3 grid holds a zero magnitude")


def _signed(rows8, signs):
    """Grid rows of 8 magnitudes as integers (uint64, byte j = value j) and
    their sign bytes -> int8 (..., 8). Each marked byte m becomes -m by
    (m ^ 0xFF) + 1 on the whole word: the IQ2 / IQ3 grids hold no zero
    magnitude, so no byte carries into the next."""
    m = _SIGN_MASK[signs]
    v = (rows8 ^ m) + (m & _BYTE_ONES)
    return np.ascontiguousarray(v.astype("<u8")).view(np.int8).reshape(v.shape + (8,))


def _rows_of_two(grid4, i1, i2):
    """IQ3 rows of 8: the 4 values of grid4[i1] (uint32 entries), then
    grid4[i2]'s, as one uint64."""
    return grid4[i1].astype(np.uint64) | (grid4[i2].astype(np.uint64) << np.uint64(32))


def _per32_to_16(s):
    """A scale per 32 values (rows, nb, 8) -> per 16 (rows, nb, 16)."""
    return np.repeat(s.astype(np.int32), 2, axis=2)


def _pack_iq2_xxs(raw3, t):
    # per 32 values: 4 grid-index bytes, then a u32 of 4 x 7-bit sign indices
    # and the 4-bit scale in its top nibble (ggml `dequantize_row_iq2_xxs`)
    q = _field(raw3, t, "qs").view(np.uint8).reshape(*raw3.shape[:2], 8, 8)
    a1 = np.ascontiguousarray(q[..., 4:]).view("<u4")[..., 0].astype(np.uint32)
    signs = KSIGNS_IQ2XS[(a1[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127]
    wq = _signed(IQ2XXS_GRID[q[..., :4]], signs)                          # (r, nb, 8, 4, 8)
    return wq, _per32_to_16(2 * (a1 >> 28) + 1), _fp16(_field(raw3, t, "d")[..., 0]), None


def _pack_iq2_xs(raw3, t):
    # u16 per 8 values: 9-bit grid index, 7-bit sign index; scale nibbles per 16
    q = _field(raw3, t, "qs").astype(np.int64)                            # (r, nb, 32)
    wq = _signed(IQ2XS_GRID[q & 511], KSIGNS_IQ2XS[q >> 9])
    s = _field(raw3, t, "scales").astype(np.int32)                        # (r, nb, 8)
    sc = np.stack([2 * (s & 15) + 1, 2 * (s >> 4) + 1], axis=3).reshape(*s.shape[:2], 16)
    return wq, sc, _fp16(_field(raw3, t, "d")[..., 0]), None


def _pack_iq2_s(raw3, t):
    # 10-bit grid index qs[4ib + l] | ((qh[ib] >> 2l) & 3) << 8; the sign
    # byte of group k is signs[k]; scale nibbles per 16
    qs = _field(raw3, t, "qs").astype(np.int64).reshape(*raw3.shape[:2], 8, 4)
    qh = _field(raw3, t, "qh").astype(np.int64)
    idx = qs | (((qh[..., None] >> (2 * np.arange(4))) & 3) << 8)
    wq = _signed(IQ2S_GRID[idx], _field(raw3, t, "signs").reshape(idx.shape))
    s = _field(raw3, t, "scales").astype(np.int32)
    sc = np.stack([2 * (s & 15) + 1, 2 * (s >> 4) + 1], axis=3).reshape(*s.shape[:2], 16)
    return wq, sc, _fp16(_field(raw3, t, "d")[..., 0]), None


def _pack_iq3_xxs(raw3, t):
    # group l of 8 values: 4 from iq3xxs_grid[qs[8ib + 2l]], 4 from
    # iq3xxs_grid[qs[8ib + 2l + 1]]; u32 per 32: 4 x 7-bit sign indices and
    # the scale nibble on top
    qs = _field(raw3, t, "qs").astype(np.int64).reshape(*raw3.shape[:2], 8, 4, 2)
    a = _field(raw3, t, "scales_and_signs").astype(np.uint32)             # (r, nb, 8)
    signs = KSIGNS_IQ2XS[(a[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127]
    wq = _signed(_rows_of_two(IQ3XXS_GRID, qs[..., 0], qs[..., 1]), signs)
    return wq, _per32_to_16(2 * (a >> 28) + 1), _fp16(_field(raw3, t, "d")[..., 0]), None


def _pack_iq3_s(raw3, t):
    # 9-bit indices: qs[8ib + k] | bit k of qh[ib] << 8, 4 values each; the
    # sign byte of group l is signs[4ib + l]; scale nibble per 32
    qs = _field(raw3, t, "qs").astype(np.int64).reshape(*raw3.shape[:2], 8, 8)
    qh = _field(raw3, t, "qh").astype(np.int64)
    idx = qs | (((qh[..., None] >> np.arange(8)) & 1) << 8)
    rows8 = _rows_of_two(IQ3S_GRID, idx[..., 0::2], idx[..., 1::2])      # (r, nb, 8, 4)
    wq = _signed(rows8, _field(raw3, t, "signs").reshape(*raw3.shape[:2], 8, 4))
    s = _field(raw3, t, "scales").astype(np.int32)                        # (r, nb, 4)
    per32 = np.stack([s & 15, s >> 4], axis=3).reshape(*s.shape[:2], 8)
    return wq, _per32_to_16(2 * per32 + 1), _fp16(_field(raw3, t, "d")[..., 0]), None


def _pack_iq1_s(raw3, t):
    # u16 qh per 32: 3 index bits per group of 8 (bits 3l..3l+2), scale in
    # bits 12-14, delta sign in bit 15
    qs = _field(raw3, t, "qs").astype(np.int64).reshape(*raw3.shape[:2], 8, 4)
    qh = _field(raw3, t, "qh").astype(np.int64)                           # (r, nb, 8)
    idx = qs | (((qh[..., None] >> (3 * np.arange(4))) & 7) << 8)
    wq = IQ1S_GRID_BYTES[idx]
    dl = np.repeat(np.where(qh & 0x8000, -1, 1).astype(np.int8), 4, axis=2)   # per 8 values
    return wq, _per32_to_16(2 * ((qh >> 12) & 7) + 1), _fp16(_field(raw3, t, "d")[..., 0]), dl


def _pack_iq1_m(raw3, t):
    # group l of 32-chunk ib: index qs[4ib + l] | 3 bits of qh[2ib + l/2]
    # (low or high nibble) << 8, delta sign the nibble's bit 3; 3-bit
    # scales per 16 in the four u16 scale words, whose top nibbles form fp16 d
    qs = _field(raw3, t, "qs").astype(np.int64).reshape(*raw3.shape[:2], 8, 4)
    qh = _field(raw3, t, "qh").astype(np.int64).reshape(*raw3.shape[:2], 8, 2)
    nib = np.stack([qh & 15, qh >> 4], axis=-1).reshape(*qh.shape[:2], 8, 4)
    wq = IQ1S_GRID_BYTES[qs | ((nib & 7) << 8)]
    dl = np.where(nib & 8, -1, 1).astype(np.int8).reshape(*qh.shape[:2], 32)
    sw = _field(raw3, t, "scales").astype(np.int64)                       # (r, nb, 4)
    sh = 3 * np.arange(4)
    sc = (2 * ((sw[..., None] >> sh) & 7) + 1).reshape(*sw.shape[:2], 16).astype(np.int32)
    bits = ((sw[..., 0] >> 12) | ((sw[..., 1] >> 8) & 0x00F0) | ((sw[..., 2] >> 4) & 0x0F00)
            | (sw[..., 3] & 0xF000))
    return wq, sc, _fp16(bits), dl


def _pack_iq4_xs(raw3, t):
    # value 32ib + j = kvalues[qs[16ib + j] & 15], 32ib + 16 + j the high
    # nibble; 6-bit scale: nibble ib of scales_l, 2 bits of scales_h
    qs = _field(raw3, t, "qs").reshape(*raw3.shape[:2], 8, 1, 16)
    v = np.concatenate([qs & 15, qs >> 4], axis=3)
    wq = KVALUES_IQ4NL[v]
    sl = _field(raw3, t, "scales_l").astype(np.int32)
    shh = _field(raw3, t, "scales_h").astype(np.int32)                    # (r, nb, 1)
    lo = np.stack([sl & 15, sl >> 4], axis=3).reshape(*sl.shape[:2], 8)
    hi = (shh >> (2 * np.arange(8))) & 3
    return wq, _per32_to_16((lo | (hi << 4)) - 32), _fp16(_field(raw3, t, "d")[..., 0]), None


_PACKERS = {T.IQ2_XXS: _pack_iq2_xxs, T.IQ2_XS: _pack_iq2_xs, T.IQ2_S: _pack_iq2_s,
            T.IQ3_XXS: _pack_iq3_xxs, T.IQ3_S: _pack_iq3_s, T.IQ1_S: _pack_iq1_s,
            T.IQ1_M: _pack_iq1_m, T.IQ4_XS: _pack_iq4_xs}


def pack_iquant(t, raw, rows: int, cols: int):
    """Decode `rows` x `cols` weights of I-quant type t (raw: uint8 bytes of
    whole blocks) into the kernel layout: (wq int8 (rows, cols) signed
    values, sc int32 (rows, cols/256, 16) scale per 16 values, d float32
    (rows, cols/256) fp16 d, dq4 int8 (rows, cols/4) IQ1 scale times delta
    sign per 4 values, or None). ValueError for a type outside `IQ_TYPES`
    or a size mismatch."""
    t = T(t)
    if t not in _PACKERS:
        raise ValueError(f"{t.name} is not a 256-value I-quant")
    fmt = block_format(t)
    raw = np.asarray(raw, np.uint8).reshape(-1)
    if cols % 256 or raw.size != rows * (cols // 256) * fmt.block_bytes:
        raise ValueError(f"{raw.size} bytes do not hold {rows} x {cols} {fmt.name}")
    raw3 = raw.reshape(rows, cols // 256, fmt.block_bytes)
    wq, sc, d, dl = _PACKERS[t](raw3, t)
    c = np.ascontiguousarray
    dq4 = None
    if dl is not None:
        # per 4 values: the scale of their 16 times the delta sign of their 8
        dq4 = np.repeat(sc, 4, axis=2) * np.repeat(dl.reshape(rows, -1, 32), 2, axis=2)
        dq4 = c(dq4.reshape(rows, cols // 4), np.int8)
    return c(wq.reshape(rows, cols), np.int8), c(sc, np.int32), c(d, np.float32), dq4


# ---------------------------------------------------------------- kernels

_V8I8 = ir.VectorType(ir.IntType(8), 8)
_V8I32 = ir.VectorType(ir.IntType(32), 8)


@intrinsic
def _madd8(typingctx, acc, a, aoff, b, boff):
    """acc[0:8] += a[aoff:aoff+8] * b[boff:boff+8] (int32 lanes; a int8
    sign-extended, b int32; contiguous 1-D arrays, not bounds-checked):
    the IQ1 delta lanes, kept in int32 (numba would widen the products to
    int64, which AVX2 cannot multiply in vectors)."""
    _check(acc=(acc, types.int32), a=(a, types.int8), b=(b, types.int32))
    sig = types.void(acc, a, types.intp, b, types.intp)

    def codegen(context, builder, signature, args):
        A, X, xo, Y, yo = args
        ta, tx, _, ty, _ = signature.args
        pa = _ptr(context, builder, ta, A, None, _V8I32)
        xv = builder.sext(builder.load(_ptr(context, builder, tx, X, xo, _V8I8), align=1), _V8I32)
        yv = builder.load(_ptr(context, builder, ty, Y, yo, _V8I32), align=4)
        builder.store(builder.add(builder.load(pa, align=4), builder.mul(xv, yv)), pa, align=4)
        return context.get_dummy_value()
    return sig, codegen


@njit(inline="always", cache=True)
def _grid_lanes(w, x, sc, b, sumi):
    # sumi = the 8 int32 lanes of super-block b: per chunk c of 32 values,
    # scale(first 16) times lanes 0-3 and scale(last 16) times lanes 4-7
    # (a per-32 scale is stored twice)
    for L in range(8):
        sumi[L] = 0
    for c in range(8):
        o = b * 256 + c * 32
        lanes_scaled_add(sumi, w, o, x, o, sc[b, 2 * c], sc[b, 2 * c + 1])


@njit(inline="always", cache=True)
def _delta_lanes(dq4, xs4, b, sumd):
    # IQ1: sumd[L] = sum over the chunks c of super-block b of scale * delta
    # sign * (the sum of activations 4L..4L+3 of chunk c), exact: ggml's
    # AVX2 IQ1_M delta lanes; their total is the delta sum of every path
    for L in range(8):
        sumd[L] = 0
    for c in range(8):
        _madd8(sumd, dq4, b * 64 + 8 * c, xs4, b * 64 + 8 * c)


@njit(inline="always", cache=True)
def _delta_total(dq4, xs4, b, sumd):
    _delta_lanes(dq4, xs4, b, sumd)
    tot = 0
    for L in range(8):
        tot += sumd[L]
    return tot


@njit(inline="always", cache=True)
def _dot_avx2(mode, post, w, x, sc, d, dq4, xd, xs4, sumi, sumd, lf, acc, acc2, fused):
    # ggml_vec_dot_<type>_q8_K, `__AVX2__` branch (module docstring); not
    # fused: the AVX branch without FMA, acc + d * lane in two roundings
    # (the AVX branches give the AVX2 lanes, on 128-bit halves)
    for L in range(8):
        acc[L] = 0.0
        acc2[L] = 0.0
    accum1 = np.float32(0.0)
    for b in range(d.shape[0]):
        _grid_lanes(w, x, sc, b, sumi)
        db = np.float32(d[b] * xd[b])
        for L in range(8):
            lf[L] = np.float32(sumi[L])
        if fused:
            fma8_into(acc, lf, 0, db)
        else:
            for L in range(8):
                acc[L] = np.float32(acc[L] + np.float32(db * lf[L]))
        if mode == _IQ1S:
            t = np.float32(_delta_total(dq4, xs4, b, sumd))
            accum1 = fma32(db, t, accum1) if fused else np.float32(accum1 + np.float32(db * t))
        elif mode == _IQ1M:
            _delta_lanes(dq4, xs4, b, sumd)
            for L in range(8):
                lf[L] = np.float32(sumd[L])
            if fused:
                fma8_into(acc2, lf, 0, db)
            else:
                for L in range(8):
                    acc2[L] = np.float32(acc2[L] + np.float32(db * lf[L]))
    h = hsum8(acc)
    if mode == _IQ1S or mode == _IQ1M:
        # hsum + IQ1*_DELTA * (accum1 or the delta lanes' hsum)
        t = accum1 if mode == _IQ1S else hsum8(acc2)
        return fma32(_IQ1_DELTA, t, h) if fused else np.float32(h + np.float32(_IQ1_DELTA * t))
    return np.float32(post * h)


@njit(inline="always", cache=True)
def _dot_generic(mode, post, w, x, sc, d, dq4, xd, xs4, sumi, sumd):
    # ggml_vec_dot_<type>_q8_K_generic (quants.c), no FMA
    sumf = np.float32(0.0)
    for b in range(d.shape[0]):
        db = np.float32(d[b] * xd[b])
        if mode == _IQ4:
            for c in range(8):
                d1 = np.float32(db * np.float32(sc[b, 2 * c]))
                dot = q8_block_dot(w, b * 256 + c * 32, x, b * 256 + c * 32)
                sumf = np.float32(sumf + np.float32(d1 * np.float32(dot)))
            continue
        _grid_lanes(w, x, sc, b, sumi)
        tot = 0
        for L in range(8):
            tot += sumi[L]
        if mode == _GRID:
            sumf = np.float32(sumf + np.float32(db * np.float32(tot)))
        else:
            dsum = np.float32(_IQ1_DELTA * np.float32(_delta_total(dq4, xs4, b, sumd)))
            sumf = np.float32(sumf + np.float32(db * np.float32(np.float32(tot) + dsum)))
    return np.float32(post * sumf)


@njit(inline="always", cache=True)
def _dot_neon(mode, post, halves, w, x, sc, d, dq4, xd, xs4, sumi, sumd):
    # ggml_vec_dot_<type>_q8_K of arch/arm/quants.c (module docstring);
    # halves: IQ2_XXS / IQ3_XXS's two float sums of (0.5 + s) * dot
    sumf = np.float32(0.0)
    for b in range(d.shape[0]):
        db = np.float32(d[b] * xd[b])
        if halves:
            f1 = np.float32(0.0)
            f2 = np.float32(0.0)
            for c in range(0, 8, 2):
                o = b * 256 + c * 32
                f1 = fma32(np.float32(q8_block_dot(w, o, x, o)), np.float32(sc[b, 2 * c]) * np.float32(0.5), f1)
                f2 = fma32(np.float32(q8_block_dot(w, o + 32, x, o + 32)),
                           np.float32(sc[b, 2 * c + 2]) * np.float32(0.5), f2)
            sumf = fma32(np.float32(f1 + f2), db, sumf)
            continue
        _grid_lanes(w, x, sc, b, sumi)
        tot = 0
        for L in range(8):
            tot += sumi[L]
        if mode == _IQ1S or mode == _IQ1M:
            inner = fma32(np.float32(_delta_total(dq4, xs4, b, sumd)), _IQ1_DELTA, np.float32(tot))
            sumf = fma32(db, inner, sumf)
        else:
            sumf = fma32(np.float32(tot), db, sumf)
    return np.float32(post * sumf)


@njit(inline="always", cache=True)
def _dot_tiled(mode, iqp, tfac, w, x, sc, d, dq4, xd, xs4, sumi, sumd):
    # ggml's tiled mat-mul (tiled.cpp / tiled-kernel.cpp), or with iqp
    # v0.4.0's IQ panel gemm (iqp.cpp): the same integers, the float step
    # rounded elsewhere (module docstring)
    out = np.float32(0.0)
    for b in range(d.shape[0]):
        _grid_lanes(w, x, sc, b, sumi)
        s = 0
        for L in range(8):
            s += sumi[L]
        if mode == _IQ1S or mode == _IQ1M:
            s = 8 * s + _delta_total(dq4, xs4, b, sumd)     # codes 8 * grid + delta
        dt = np.float32(d[b] * tfac)
        if iqp:
            out = fma32(np.float32(s), np.float32(dt * xd[b]), out)
        else:
            out = fma32(np.float32(np.float32(s) * dt), xd[b], out)
    return out


@jit
def _rows_iq(mode, path, post, tfac, halves, wq, sc, d, dq4, xq, xd, xs4, out, r0, r1):
    """out[t, r] for weight rows r0 <= r < r1 and every activation row t
    (module docstring for the arguments and paths; halves: the NEON code
    of IQ2_XXS / IQ3_XXS, `_dot_neon`)."""
    sumi = np.empty(8, np.int32)
    sumd = np.empty(8, np.int32)
    lf = np.empty(8, np.float32)
    acc = np.empty(8, np.float32)
    acc2 = np.empty(8, np.float32)
    iq1 = mode == _IQ1S or mode == _IQ1M
    for r in range(r0, r1):
        w = wq[r]
        dq4r = dq4[r] if iq1 else dq4[0]
        for t in range(xq.shape[0]):
            if path == _GEN:
                v = _dot_generic(mode, post, w, xq[t], sc[r], d[r], dq4r, xd[t], xs4[t], sumi, sumd)
            elif path == _TILED or path == _IQP:
                v = _dot_tiled(mode, path == _IQP, tfac, w, xq[t], sc[r], d[r], dq4r, xd[t], xs4[t], sumi, sumd)
            elif path == _NEON:
                v = _dot_neon(mode, post, halves, w, xq[t], sc[r], d[r], dq4r, xd[t], xs4[t], sumi,
                              sumd)
            else:
                v = _dot_avx2(mode, post, w, xq[t], sc[r], d[r], dq4r, xd[t], xs4[t], sumi, sumd,
                              lf, acc, acc2, path != _AVX_NOFMA)
            out[t, r] = v


@jit(parallel=True)
def _mm_iq(mode, path, post, tfac, halves, wq, sc, d, dq4, xq, xd, xs4, out, r0, r1):
    """`_rows_iq` over the weight rows r0..r1-1, tasks of `_ROWS_PER_TASK`
    rows in parallel (each row's arithmetic is the same on any thread)."""
    for c in prange((r1 - r0 + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        a = r0 + c * _ROWS_PER_TASK
        _rows_iq(mode, path, post, tfac, halves, wq, sc, d, dq4, xq, xd, xs4, out, a,
                 min(r1, a + _ROWS_PER_TASK))


_NO_DELTA = np.ones((1, 1), np.int8)


#: the kernel path of each variant an instruction-set chain names
_PATH_OF_VARIANT = {"x86": _AVX2, "x86_nofma": _AVX_NOFMA, "generic": _GEN, "tiled": _TILED, "neon": _NEON,
                    "iqp": _IQP}


class IQuantFamily(Family):
    """The 256-value I-quants (`IQ_TYPES`) with Q8_K activations, in the
    order of ggml-cpu's vec_dot (AVX2, generic or NEON), tiled and IQ
    panel paths (module docstring)."""

    def pack(self, qm):
        """`pack_iquant` of the QMatrix's raw bytes."""
        return pack_iquant(qm.type, qm.raw, qm.rows, qm.cols)

    def matmul(self, qm, packed, x, segments, parallel, mmid):
        """float32 (n, cols) activations -> float32 (n, rows), on the
        variant the chain names for each segment's path."""
        wq, sc, d, dq4 = packed
        n = x.shape[0]
        mode, post, tfac = _TYPE_CONST[qm.type]
        xq, xd, _ = act_quant.q8_k_fields(x, isa=qm.profile.isa)
        if dq4 is None:
            dq4, xs4 = _NO_DELTA, np.zeros((n, 1), np.int32)
        else:
            xs4 = np.ascontiguousarray(xq.reshape(n, -1, 4).sum(axis=2, dtype=np.int32))
        out = np.empty((n, qm.rows), np.float32)
        isa = qm.profile.isa
        for r0, r1, path in segments:
            variant = kernel(isa, qm.type, path)
            if variant not in _PATH_OF_VARIANT:
                raise NotImplementedError(f"{qm.type.name}: ggml's {variant} kernel is not emulated yet")
            kpath = _PATH_OF_VARIANT[variant]
            # the NEON code has its own result factor (`_NEON_POST`)
            kpost = _NEON_POST.get(qm.type, post) if kpath == _NEON else post
            if qm.type == T.IQ4_XS and kpath == _AVX2:
                # the same bits from the stored blocks (`iq4_rows`), which
                # a mat-vec reads at half the bytes of the widened copy
                iq4_rows.matmul_iq4_xs(qm.raw.reshape(qm.rows, -1), xq, xd, out, r0, r1, parallel)
                continue
            args = (mode, kpath, np.float32(kpost), np.float32(tfac), qm.type in _NEON_POST, wq, sc, d,
                    dq4, xq, xd, xs4, out)
            if parallel:
                _mm_iq(*args, r0, r1)
            else:
                _rows_iq(*args, r0, r1)
        return out


FAMILY = IQuantFamily()
