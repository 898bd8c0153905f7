"""Mat-mul of the legacy quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on their
GGUF blocks as stored, in the float order of each CPU profile's
llama.cpp build.

The kernels read the tensor's bytes in place (a row is `row_bytes` of
blocks: fp16 `d` (and `m`), the Q5 high bits, the quants), unpack each
block into 32 int8 values in registers, and dot them with the Q8_0 / Q8_1
activations (`act_quant`). Reading the stored blocks is the least memory a
decode step can read: a 2-core machine decodes a 0.5B model at the speed
its memory delivers the weights, so unpacking them beforehand (one byte per
value) would cost up to 1.6 times the time.

Three arithmetic modes, from ggml-cpu (llama.cpp vendored by
llama-cpp-python 0.3.36):

* `LANES`, the builds with AVX2 (`ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0`,
  `ggml_vec_dot_{q4_1,q5_1}_q8_1` in `arch/x86/quants.c`, and llamafile's
  `tinyBLAS_Q0_AVX`, whose arithmetic is the same): 8 float32 lanes, lane
  L the exact integer dot of values 4L..4L+3 of a block, `acc = fma(d_w *
  d_a, lane, acc)` block after block, then `hsum_float_8`; Q4_1 / Q5_1
  also sum `m * s` per block in a scalar by FMA (GCC contracts it) and add
  it last;
* `WHOLE`, Q4_0 in ggml's CPU_REPACK layout `q4_0_8x8` (x86
  `ggml_gemv_q4_0_8x8_q8_0` / `ggml_gemm_q4_0_8x8_q8_0`): one accumulator,
  `acc = fma(float(whole block dot), d_w * d_a, acc)`;
* `GENERIC`, the baseline build (`ggml_vec_dot_*_generic`, quants.c, no
  FMA): per block the exact integer dot `si`, then `sumf += (si * d_w) *
  d_a` (Q4_0), `si * (d_w * d_a)` (Q5_0, Q8_0), or `(d_w * d_a) * si + m *
  s` (Q4_1, Q5_1).

Four weight rows run together (four independent FMA chains, as a CPU needs
to hide the FMA latency); the bits of each row are those of one row alone.
"""
from __future__ import annotations

import llvmlite.binding as llb
import numpy as np
from numba import njit

from ..types import GGMLType, block_format
from ._digest import legacy_row_kernels
from .legacy_rows import field_offset
from .fp import fma32 as _fma
from .simd import (HOST_VNNI, f8_fma, f8_hsum, f8_mul, f8_splat, f8_zero, f16_at, i8_bits16, i8_load, i8_nibbles,
                   i8_or, i8_splat, i8_xor, i8x32_dot_u, i8x32_lanes, i32_hsum, i32_neg_shl, i32_to_f8, i32_zero,
                   prefetch)

__all__ = ["LEGACY_TYPES", "LANES", "WHOLE", "GENERIC", "kernels"]

LEGACY_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0)
#: arithmetic modes (module docstring)
LANES, WHOLE, GENERIC = 0, 1, 2
#: how far ahead (bytes) the four-row kernels prefetch their weights. Four
#: rows walked together are four streams of a few hundred bytes each, too
#: short for the hardware prefetcher: without it a 40 MB Q8_0 matrix read
#: at 5-10 GB/s on one thread of a Zen 4 VM, with it (2 KiB or more ahead)
#: at 30 GB/s, above a plain sequential read's 26.
_PREFETCH = 4096
#: tiles of four weight rows by four activation rows in a pass of several
#: tokens: 16 accumulators, which need the 32 vector registers of an
#: AVX-512 CPU (its 256-bit instructions reach them too); with 16 registers
#: the tiles are four by two
_WIDE_TILES = bool(llb.get_host_cpu_features().get("avx512vl", False))



def _make_kernels(t: GGMLType, mode: int):
    """The `_digest.RowKernels` (serial, parallel, span, split) for weight type t in `mode`:
    k(raw, xq, xs, xm, out[, parts]) with raw uint8 (rows, row_bytes), xq
    int8 (n, cols), xs / xm float32 (n, cols / 32) (the activation scales
    and, for Q8_1, sums), out float32 (n, rows)."""
    T = int(t)
    BB = block_format(t).block_bytes
    D, M, QH, QS = field_offset(t, "d"), field_offset(t, "m"), field_offset(t, "qh"), field_offset(t, "qs")
    NIB = T != int(GGMLType.Q8_0)
    # the integer lanes are those of unsigned weight bytes u = value + BIAS
    # (the nibbles, with the Q5 fifth bit; Q8_0's byte xor 0x80), less BIAS
    # times the activations' sums of 4 (exact): one `vpdpbusd` per block
    # with VNNI, maddubs + madd without. Q8_0 without VNNI keeps its signed
    # bytes (psign), its u up to 255 would overflow maddubs's int16 pairs.
    SIGNED = not NIB and not HOST_VNNI
    BIAS = {int(GGMLType.Q4_0): 8, int(GGMLType.Q5_0): 16, int(GGMLType.Q8_0): 128}.get(T, 0)
    SHIFT = {8: 3, 16: 4, 128: 7}.get(BIAS, 0)
    WITH_MIN = M >= 0
    MODE = mode
    Q4_0 = T == int(GGMLType.Q4_0)
    TILE4 = _WIDE_TILES

    @njit(inline="always")
    def wbytes(w, o):
        # the block's 32 weight bytes: unsigned u (or, SIGNED, the values)
        if NIB:
            v = i8_nibbles(w, o + QS)
            if QH >= 0:
                v = i8_or(v, i8_bits16(w, o + QH))
            return v
        if SIGNED:
            return i8_load(w, o + QS)
        return i8_xor(i8_load(w, o + QS), i8_splat(128))

    @njit(inline="always")
    def base(xv):
        # the lanes' starting value: -BIAS * (sums of 4 activations)
        if BIAS and not SIGNED:
            return i32_neg_shl(i8x32_dot_u(i32_zero(), i8_splat(1), xv), SHIFT)
        return i32_zero()

    @njit(inline="always")
    def lanes(wv, xv, b0):
        # the exact lanes of the block's values (module docstring) times xv
        if SIGNED:
            return i8x32_lanes(wv, xv)
        return i8x32_dot_u(b0, wv, xv)

    @njit(inline="always")
    def one_row(w, ow, x, ox, xs, xm, t):
        # one weight row (its blocks at byte ow of w) with activation row t
        # (its quants at ox of x)
        nb = xs.shape[1]
        acc = f8_zero()
        whole = np.float32(0.0)
        summs = np.float32(0.0)
        for bk in range(nb):
            o = ow + bk * BB
            xv = i8_load(x, ox + 32 * bk)
            dw = f16_at(w, o + D)
            d = np.float32(dw * xs[t, bk])
            li = lanes(wbytes(w, o), xv, base(xv))
            if MODE == LANES:
                acc = f8_fma(f8_splat(d), i32_to_f8(li), acc)
                if WITH_MIN:
                    summs = _fma(f16_at(w, o + M), xm[t, bk], summs)
            elif MODE == WHOLE:
                whole = _fma(np.float32(i32_hsum(li)), d, whole)
            else:
                si = np.float32(i32_hsum(li))
                if WITH_MIN:
                    whole = np.float32(whole + np.float32(np.float32(d * si) +
                                                          np.float32(f16_at(w, o + M) * xm[t, bk])))
                elif Q4_0:
                    whole = np.float32(whole + np.float32(np.float32(si * dw) * xs[t, bk]))
                else:
                    whole = np.float32(whole + np.float32(si * d))
        if MODE == LANES:
            return np.float32(f8_hsum(acc) + summs) if WITH_MIN else f8_hsum(acc)
        return whole

    @njit(inline="always")
    def step(acc, w, o, xv, xsb, b0):
        return f8_fma(f8_splat(np.float32(f16_at(w, o + D) * xsb)), i32_to_f8(lanes(wbytes(w, o), xv, b0)), acc)

    @njit(inline="always")
    def four_rows(w, ow, rb, x, ox, xs, xm, t):
        # `one_row` for the four rows at ow, ow + rb, ...: four independent chains
        nb = xs.shape[1]
        a0 = f8_zero()
        a1 = f8_zero()
        a2 = f8_zero()
        a3 = f8_zero()
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        for bk in range(nb):
            o = ow + bk * BB
            xv = i8_load(x, ox + 32 * bk)
            b0 = base(xv)
            xsb = xs[t, bk]
            a0 = step(a0, w, o, xv, xsb, b0)
            a1 = step(a1, w, o + rb, xv, xsb, b0)
            a2 = step(a2, w, o + 2 * rb, xv, xsb, b0)
            a3 = step(a3, w, o + 3 * rb, xv, xsb, b0)
            # the group's bytes are one stream of 4 rb: keep _PREFETCH bytes ahead of it
            pf = ow + _PREFETCH + 4 * bk * BB
            prefetch(w, pf)
            prefetch(w, pf + 64)
            prefetch(w, pf + 128)
            if WITH_MIN:
                xmb = xm[t, bk]
                s0 = _fma(f16_at(w, o + M), xmb, s0)
                s1 = _fma(f16_at(w, o + rb + M), xmb, s1)
                s2 = _fma(f16_at(w, o + 2 * rb + M), xmb, s2)
                s3 = _fma(f16_at(w, o + 3 * rb + M), xmb, s3)
        if WITH_MIN:
            return (np.float32(f8_hsum(a0) + s0), np.float32(f8_hsum(a1) + s1),
                    np.float32(f8_hsum(a2) + s2), np.float32(f8_hsum(a3) + s3))
        return f8_hsum(a0), f8_hsum(a1), f8_hsum(a2), f8_hsum(a3)

    @njit(inline="always")
    def step2(a, b, w, o, xa, xb, sa, sb, ba, bb):
        # one weight block unpacked once, dotted with two activation rows;
        # d_w * d_a as a vector product of broadcasts (each lane the same
        # float32 product: the broadcasts are shared by rows and tokens)
        wv = wbytes(w, o)
        dw = f8_splat(f16_at(w, o + D))
        a = f8_fma(f8_mul(dw, sa), i32_to_f8(lanes(wv, xa, ba)), a)
        b = f8_fma(f8_mul(dw, sb), i32_to_f8(lanes(wv, xb, bb)), b)
        return a, b

    @njit(inline="always")
    def four_rows_two_tokens(w, ow, rb, x, oa, ob, xs, xm, ta, tb, out, r):
        # `four_rows` for activation rows ta and tb at once (quants at oa and
        # ob of x): each weight block is unpacked once for both; 8 chains
        nb = xs.shape[1]
        a0 = f8_zero()
        a1 = f8_zero()
        a2 = f8_zero()
        a3 = f8_zero()
        b0 = f8_zero()
        b1 = f8_zero()
        b2 = f8_zero()
        b3 = f8_zero()
        for bk in range(nb):
            o = ow + bk * BB
            xa = i8_load(x, oa + 32 * bk)
            xb = i8_load(x, ob + 32 * bk)
            ba = base(xa)
            bb = base(xb)
            sa = f8_splat(xs[ta, bk])
            sb = f8_splat(xs[tb, bk])
            a0, b0 = step2(a0, b0, w, o, xa, xb, sa, sb, ba, bb)
            a1, b1 = step2(a1, b1, w, o + rb, xa, xb, sa, sb, ba, bb)
            a2, b2 = step2(a2, b2, w, o + 2 * rb, xa, xb, sa, sb, ba, bb)
            a3, b3 = step2(a3, b3, w, o + 3 * rb, xa, xb, sa, sb, ba, bb)
            pf = ow + _PREFETCH + 4 * bk * BB
            prefetch(w, pf)
            prefetch(w, pf + 64)
            prefetch(w, pf + 128)
        out[ta, r] = f8_hsum(a0)
        out[ta, r + 1] = f8_hsum(a1)
        out[ta, r + 2] = f8_hsum(a2)
        out[ta, r + 3] = f8_hsum(a3)
        out[tb, r] = f8_hsum(b0)
        out[tb, r + 1] = f8_hsum(b1)
        out[tb, r + 2] = f8_hsum(b2)
        out[tb, r + 3] = f8_hsum(b3)
        if WITH_MIN:
            # the m * s sums: separate scalar chains, added last
            for k in range(4):
                sa_ = np.float32(0.0)
                sb_ = np.float32(0.0)
                for bk in range(nb):
                    mw = f16_at(w, ow + k * rb + bk * BB + M)
                    sa_ = _fma(mw, xm[ta, bk], sa_)
                    sb_ = _fma(mw, xm[tb, bk], sb_)
                out[ta, r + k] = np.float32(out[ta, r + k] + sa_)
                out[tb, r + k] = np.float32(out[tb, r + k] + sb_)

    @njit(inline="always")
    def step4(a, b, c, e, w, o, xa, xb, xc, xe, sa, sb, sc, se, ba, bb, bc, be):
        # one weight block unpacked once, dotted with four activation rows
        wv = wbytes(w, o)
        dw = f8_splat(f16_at(w, o + D))
        a = f8_fma(f8_mul(dw, sa), i32_to_f8(lanes(wv, xa, ba)), a)
        b = f8_fma(f8_mul(dw, sb), i32_to_f8(lanes(wv, xb, bb)), b)
        c = f8_fma(f8_mul(dw, sc), i32_to_f8(lanes(wv, xc, bc)), c)
        e = f8_fma(f8_mul(dw, se), i32_to_f8(lanes(wv, xe, be)), e)
        return a, b, c, e

    @njit(inline="always")
    def four_rows_four_tokens(w, ow, rb, x, cols, xs, xm, t0, out, r):
        # four weight rows times activation rows t0 .. t0+3: 16 chains (a
        # CPU with 32 vector registers holds them all)
        nb = xs.shape[1]
        a0, a1, a2, a3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
        b0, b1, b2, b3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
        c0, c1, c2, c3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
        e0, e1, e2, e3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
        oa = t0 * cols
        for bk in range(nb):
            o = ow + bk * BB
            xa = i8_load(x, oa + 32 * bk)
            xb = i8_load(x, oa + cols + 32 * bk)
            xc = i8_load(x, oa + 2 * cols + 32 * bk)
            xe = i8_load(x, oa + 3 * cols + 32 * bk)
            ba, bb, bc, be = base(xa), base(xb), base(xc), base(xe)
            sa = f8_splat(xs[t0, bk])
            sb = f8_splat(xs[t0 + 1, bk])
            sc = f8_splat(xs[t0 + 2, bk])
            se = f8_splat(xs[t0 + 3, bk])
            a0, b0, c0, e0 = step4(a0, b0, c0, e0, w, o, xa, xb, xc, xe, sa, sb, sc, se, ba, bb, bc, be)
            a1, b1, c1, e1 = step4(a1, b1, c1, e1, w, o + rb, xa, xb, xc, xe, sa, sb, sc, se, ba, bb, bc, be)
            a2, b2, c2, e2 = step4(a2, b2, c2, e2, w, o + 2 * rb, xa, xb, xc, xe, sa, sb, sc, se, ba, bb, bc, be)
            a3, b3, c3, e3 = step4(a3, b3, c3, e3, w, o + 3 * rb, xa, xb, xc, xe, sa, sb, sc, se, ba, bb, bc, be)
            pf = ow + _PREFETCH + 4 * bk * BB
            prefetch(w, pf)
            prefetch(w, pf + 64)
            prefetch(w, pf + 128)
        out[t0, r], out[t0, r + 1], out[t0, r + 2], out[t0, r + 3] = f8_hsum(a0), f8_hsum(a1), f8_hsum(a2), f8_hsum(a3)
        out[t0 + 1, r], out[t0 + 1, r + 1], out[t0 + 1, r + 2], out[t0 + 1, r + 3] = (
            f8_hsum(b0), f8_hsum(b1), f8_hsum(b2), f8_hsum(b3))
        out[t0 + 2, r], out[t0 + 2, r + 1], out[t0 + 2, r + 2], out[t0 + 2, r + 3] = (
            f8_hsum(c0), f8_hsum(c1), f8_hsum(c2), f8_hsum(c3))
        out[t0 + 3, r], out[t0 + 3, r + 1], out[t0 + 3, r + 2], out[t0 + 3, r + 3] = (
            f8_hsum(e0), f8_hsum(e1), f8_hsum(e2), f8_hsum(e3))
        if WITH_MIN:
            for k in range(4):
                for tt in range(t0, t0 + 4):
                    s_ = np.float32(0.0)
                    for bk in range(nb):
                        s_ = _fma(f16_at(w, ow + k * rb + bk * BB + M), xm[tt, bk], s_)
                    out[tt, r + k] = np.float32(out[tt, r + k] + s_)

    @njit(inline="always")
    def rows(raw, xq, xs, xm, out, r0, r1):
        # flat views made once: a view per row would cost two atomic
        # reference-count updates, more than a short row's dot
        n, cols = xq.shape
        rb = raw.shape[1]
        w = raw.reshape(-1)
        x = xq.reshape(-1)
        r = r0
        if MODE == LANES:
            while r + 4 <= r1:
                t = 0
                while TILE4 and t + 4 <= n:
                    four_rows_four_tokens(w, r * rb, rb, x, cols, xs, xm, t, out, r)
                    t += 4
                while t + 2 <= n:
                    four_rows_two_tokens(w, r * rb, rb, x, t * cols, (t + 1) * cols, xs, xm, t, t + 1, out, r)
                    t += 2
                if t < n:
                    o0, o1, o2, o3 = four_rows(w, r * rb, rb, x, t * cols, xs, xm, t)
                    out[t, r] = o0
                    out[t, r + 1] = o1
                    out[t, r + 2] = o2
                    out[t, r + 3] = o3
                r += 4
        while r < r1:
            for t in range(n):
                out[t, r] = one_row(w, r * rb, x, t * cols, xs, xm, t)
            r += 1

    # closures: cached under their own names (strata_ref._jitcache)
    return legacy_row_kernels(rows, f"legacy_{t.name}_mode{mode}", _split)


@njit(inline="always")
def _split(R, parts, p):
    # the first row of part p of `parts`: equal parts, in whole groups of 4 rows
    return R if p >= parts else (R * p // parts) & ~3


_KERNELS = {(t, m): _make_kernels(t, m) for t in LEGACY_TYPES for m in (LANES, WHOLE, GENERIC)
            if m != WHOLE or t == GGMLType.Q4_0}


def kernels(t, mode: int):
    """The `_digest.RowKernels` (serial, parallel, span, split) of weight type t in `mode`
    (LANES, WHOLE: Q4_0 only, GENERIC): serial(raw, xq, xs, xm, out),
    parallel(raw, xq, xs, xm, out, parts) with raw uint8 (rows, row_bytes)
    the GGUF blocks of type t, xq int8 (n, cols) and xs float32 (n,
    cols/32) the activations quantized to Q8_0 / Q8_1 (xs the fp16-rounded
    scales), xm the Q8_1 sums (any float32 array of that shape for Q8_0),
    out float32 (n, rows); parts: the rows split in that many equal parts
    over numba's threads. KeyError for another type or mode."""
    return _KERNELS[(GGMLType(t), mode)]


#: the mode of each kernel variant an instruction-set chain names
#: (`strata_ref.cpu.traits.kernel`): the AVX2 `vec_dot` (= tinyBLAS_Q0_AVX),
#: the generic C code, Q4_0's repacked `q4_0_8x8`
VARIANTS = {"x86": LANES, "generic": GENERIC, "q4_0_8x8": WHOLE}


def variant_kernels(t, variant: str):
    """`kernels(t, VARIANTS[variant])`; the arm64 variants from
    `neon_legacy`, the x86 ones without AVX2 from `avx_legacy`.
    NotImplementedError for a variant no module has."""
    if variant in VARIANTS:
        return kernels(t, VARIANTS[variant])
    from . import avx_legacy, neon_legacy
    if variant in neon_legacy.VARIANTS:
        return neon_legacy.variant_kernels(t, variant)
    if variant in avx_legacy.VARIANTS:
        return avx_legacy.variant_kernels(t, variant)
    raise NotImplementedError(f"{GGMLType(t).name}: ggml's {variant} kernel is not emulated yet")
