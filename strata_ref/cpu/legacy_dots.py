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

import numba
import numpy as np
from numba import njit, prange

from ..types import GGMLType, block_format
from .fp import fma32 as _fma
from .simd import (f8_fma, f8_hsum, f8_splat, f8_zero, f16_at, i8_bits16, i8_load, i8_nibbles, i8_or,
                   i8_splat, i8_sub, i8x32_lanes, i32_hsum, i32_to_f8, prefetch)

__all__ = ["LEGACY_TYPES", "LANES", "WHOLE", "GENERIC", "matmul_legacy"]

LEGACY_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0)
#: arithmetic modes (module docstring)
LANES, WHOLE, GENERIC = 0, 1, 2
#: how far ahead (bytes) the four-row kernels prefetch their weights. Four
#: rows walked together are four streams of a few hundred bytes each, too
#: short for the hardware prefetcher: without it a 40 MB Q8_0 matrix read
#: at 5-10 GB/s on one thread of a Zen 4 VM, with it (2 KiB or more ahead)
#: at 30 GB/s, above a plain sequential read's 26.
_PREFETCH = 4096


def _offset(t: GGMLType, name: str) -> int:
    fmt = block_format(t)
    return fmt.field(name).offset if any(f.name == name for f in fmt.fields) else -1


def _make_kernels(t: GGMLType, mode: int):
    """(serial, parallel) kernels for weight type t in `mode`:
    k(raw, xq, xs, xm, out[, parts]) with raw uint8 (rows, row_bytes), xq
    int8 (n, cols), xs / xm float32 (n, cols / 32) (the activation scales
    and, for Q8_1, sums), out float32 (n, rows)."""
    T = int(t)
    BB = block_format(t).block_bytes
    D, M, QH, QS = _offset(t, "d"), _offset(t, "m"), _offset(t, "qh"), _offset(t, "qs")
    NIB = T != int(GGMLType.Q8_0)
    BIAS = {int(GGMLType.Q4_0): 8, int(GGMLType.Q5_0): 16}.get(T, 0)
    WITH_MIN = M >= 0
    MODE = mode
    Q4_0 = T == int(GGMLType.Q4_0)

    @njit(inline="always")
    def wvec(w, o):
        # the block's 32 values as signed bytes
        if NIB:
            v = i8_nibbles(w, o + QS)
            if QH >= 0:
                v = i8_or(v, i8_bits16(w, o + QH))
            if BIAS:
                v = i8_sub(v, i8_splat(BIAS))
            return v
        return i8_load(w, o + QS)

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
            lanes = i8x32_lanes(wvec(w, o), xv)
            if MODE == LANES:
                acc = f8_fma(f8_splat(d), i32_to_f8(lanes), acc)
                if WITH_MIN:
                    summs = _fma(f16_at(w, o + M), xm[t, bk], summs)
            elif MODE == WHOLE:
                whole = _fma(np.float32(i32_hsum(lanes)), d, whole)
            else:
                si = np.float32(i32_hsum(lanes))
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
    def step(acc, w, o, xv, xsb):
        return f8_fma(f8_splat(np.float32(f16_at(w, o + D) * xsb)), i32_to_f8(i8x32_lanes(wvec(w, o), xv)), acc)

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
            xsb = xs[t, bk]
            a0 = step(a0, w, o, xv, xsb)
            a1 = step(a1, w, o + rb, xv, xsb)
            a2 = step(a2, w, o + 2 * rb, xv, xsb)
            a3 = step(a3, w, o + 3 * rb, xv, xsb)
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
                for t in range(n):
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

    @njit(cache=True)
    def serial(raw, xq, xs, xm, out):
        rows(raw, xq, xs, xm, out, 0, raw.shape[0])

    @njit(parallel=True, cache=True)
    def parallel(raw, xq, xs, xm, out, parts):
        R = raw.shape[0]
        for p in prange(parts):
            rows(raw, xq, xs, xm, out, _split(R, parts, p), _split(R, parts, p + 1))

    return serial, parallel


@njit(inline="always")
def _split(R, parts, p):
    # the first row of part p of `parts`: equal parts, in whole groups of 4 rows
    return R if p >= parts else (R * p // parts) & ~3


_KERNELS = {(t, m): _make_kernels(t, m) for t in LEGACY_TYPES for m in (LANES, WHOLE, GENERIC)
            if m != WHOLE or t == GGMLType.Q4_0}


def matmul_legacy(t: GGMLType, mode: int, raw2: np.ndarray, xq: np.ndarray, xs: np.ndarray,
                  xm: np.ndarray, parallel: bool) -> np.ndarray:
    """out float32 (n, rows) = the legacy-quant weights `raw2` (uint8 (rows,
    row_bytes), the GGUF blocks of type t) times the quantized activations
    (xq int8 (n, cols), xs float32 (n, cols/32) the fp16-rounded scales, xm
    the Q8_1 sums or any float32 array of that shape), in arithmetic
    `mode` (LANES, WHOLE: Q4_0 only, GENERIC). parallel: rows split in
    equal parts over numba's threads."""
    serial, par = _KERNELS[(GGMLType(t), mode)]
    out = np.empty((xq.shape[0], raw2.shape[0]), np.float32)
    if parallel:
        par(raw2, xq, xs, xm, out, numba.get_num_threads())
    else:
        serial(raw2, xq, xs, xm, out)
    return out
