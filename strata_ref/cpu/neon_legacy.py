"""Mat-mul of the legacy quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) in the float
order of ggml-cpu's arm64 builds (`arch/arm/quants.c`, `arch/arm/repack.cpp`,
`llamafile/sgemm.cpp` of llama.cpp vendored by llama-cpp-python 0.3.36,
compiled by GCC 12.2; docs/arm64.md).

The NEON code splits each 32-value block into its values 0..15 and
16..31 (two 16-byte vectors) and reduces each pair of vectors to 4 int32
lanes. With dotprod (`vdotq_s32`) lane L sums the products of values
4L..4L+3 and 16+4L..16+4L+3; without it (`ggml_vdotq_s32`: `vmull_s8`
then `vpaddlq_s16`, ggml-cpu-impl.h) lane L sums values 2L, 2L+1, 8+2L,
9+2L and the same 16 further on. The lanes are exact; what follows is
float32:

* `PAIRS`, the `vec_dot`s: two 4-lane accumulators, one for the even and
  one for the odd blocks, `acc = acc + round(float(lane) * (d_w * d_a))`
  (`vmlaq_n_f32`: GCC 12 does not fuse it), the result `vaddvq(even) +
  vaddvq(odd)` (`vaddvq_f32` = (l0 + l1) + (l2 + l3)). Q4_1 adds `summs`,
  one float per pair of blocks, `summs + fma(m0, s0, round(m1 * s1))`;
  Q5_1 two, `summs0 = fma(m0, s0, summs0)`, `summs1` likewise, added last
  in that order. An odd last block is scalar C as GCC contracted it
  (disassembly): Q4_0 `fma(float(sumi) * d_w, d_a, sum)`, Q8_0
  `fma(float(sumi), d, sum)`, Q5_0 `fma(d, float(sumi), sum)`, Q4_1 / Q5_1
  `sum + fma(d, float(sumi), round(m * s))`. The i8mm build's Q5_0
  (`VEC_DOT` "i8mm_usdot") is the same but for that last block's integer
  sum: GCC 12.2 vectorizes the scalar loop with `usdot` (unsigned by
  signed bytes) over the bytes of `(int8_t)(q - 16)`, so a negative weight
  value v counts as v + 256 (disassembly of `ggml_vec_dot_q5_0_q8_0` in
  that build: `add` of -16 to the bytes, then `usdot`; ggml's own
  `ggml_mul_mat` of a Q5_0 row of 5 blocks gives those bits, the other
  builds the exact sum). Rows of an even number of blocks never reach it;
  MLA's cached head of 160 values (5 blocks) does.
* `ONE_ACC`, llamafile's `tinyBLAS_Q0_ARM` (dotprod builds, Q4_0 and Q8_0,
  two or more activation rows): the dotprod lanes into one 4-lane
  accumulator over all blocks, unfused as above, then `vaddvq_f32`.
* `REPACK_4X4`, the CPU_REPACK layouts `q4_0_4x4` and `q8_0_4x4` (dotprod
  builds): the gemv / gemm keep one float per output and add each block's
  whole exact integer dot I. `ggml_gemv_q4_0_4x4_q8_0`, the inline-assembly
  `ggml_gemm_q4_0_4x4_q8_0` and `ggml_gemv_q8_0_4x4_q8_0`: `acc = fma(float(I),
  d_a * d_w, acc)` (`vfmaq_f32`; Q4_0's I is computed on nibbles shifted
  left by 4 and scaled back by `vcvtq_n_f32_s32(.., 4)`, exact);
  `ggml_gemm_q8_0_4x4_q8_0`: `acc = acc + round(d_w * d_a * float(I))`
  (`vmlaq_f32`, unfused). The gemm takes the activation rows in whole
  groups of 4, the gemv the rest (repack.cpp `forward_mul_mat`).

* `PAIRS_MMLA`, the i8mm build's `vec_dot`s of Q4_0, Q4_1, Q8_0: where
  ggml takes the two-row (`vmmlaq_s32`) code (`mmla.two_rows`), per output
  one float lane, `acc = acc + round(float(I) * (d_w * d_a))` block by
  block (`vmlaq_f32`); Q4_1 adds the vector of rounded `m_w * s_a`, summed
  block by block, at the end; elsewhere `PAIRS` with dotprod lanes.
* `REPACK_4X8`, the i8mm build's `q4_0_4x8` and `q8_0_4x8`: gemv (dotprod
  code) and gemm (i8mm) alike `acc = fma(float(I), d_a * d_w, acc)`
  (`vfmaq_f32`).

The kernels widen one weight row to int8 values once and dot it with
every activation row; the integer lanes are formed in plain loops (exact
whatever instructions a host has).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..types import GGMLType
from ._digest import legacy_row_kernels
from .fp import fma32, hsum4
from .mmla import THREADS, two_rows
from .legacy_rows import row_widener

__all__ = ["PAIRS", "ONE_ACC", "REPACK_4X4", "PAIRS_MMLA", "REPACK_4X8", "VARIANTS", "variant_kernels", "LANE_DOTPROD", "LANE_NEON",
           "GEMM_NOT_GEMV"]

PAIRS, ONE_ACC, REPACK_4X4, PAIRS_MMLA, REPACK_4X8 = 0, 1, 2, 3, 4
_F32 = np.float32

#: the int32 lane each of a block's 32 values goes to: dotprod's `vdotq_s32`
#: and the build without it (`vmull_s8` + `vpaddlq_s16`)
LANE_DOTPROD = np.array([(p % 16) // 4 for p in range(32)], np.int64)
LANE_NEON = np.array([(p % 16 % 8) // 2 for p in range(32)], np.int64)



def _make_kernels(t: GGMLType, mode: int, dotprod: bool, usdot_tail: bool = False):
    """The `_digest.RowKernels` (serial, parallel, span, split) k(raw, xq, xs, xm, out[, parts]) of
    `legacy_dots.kernels`' interface for weight type t in `mode`;
    usdot_tail: the odd last block's weights read as unsigned bytes (module
    docstring, Q5_0 of the i8mm build)."""
    T = int(t)
    USDOT = usdot_tail
    MIN_PAIR = T == int(GGMLType.Q4_1)          # one summs per pair of blocks
    MIN_TWO = T == int(GGMLType.Q5_1)           # summs0 / summs1
    TAIL = {int(GGMLType.Q4_0): 0, int(GGMLType.Q8_0): 1, int(GGMLType.Q5_0): 2}.get(T, 3)
    MODE = mode
    Q8_GEMM_ADD = T == int(GGMLType.Q8_0)       # q8_0_4x4's gemm: vmlaq_f32, unfused
    LANE = LANE_DOTPROD if dotprod else LANE_NEON

    widen = row_widener(t)

    @njit(inline="always")
    def lanes(wv, xq, t, b, ln):
        for L in range(4):
            ln[L] = 0
        for p in range(32):
            ln[LANE[p]] += np.int32(wv[32 * b + p]) * np.int32(xq[t, 32 * b + p])

    @njit(inline="always")
    def whole(wv, xq, t, b):
        s = np.int32(0)
        for p in range(32):
            s += np.int32(wv[32 * b + p]) * np.int32(xq[t, 32 * b + p])
        return s

    @njit(inline="always")
    def whole_u8(wv, xq, t, b):
        # the weight bytes as `usdot` reads them: unsigned
        s = np.int32(0)
        for p in range(32):
            s += (np.int32(wv[32 * b + p]) & 0xFF) * np.int32(xq[t, 32 * b + p])
        return s

    @njit(inline="always")
    def vec_dot(wv, dw, mw, xq, xs, xm, t, ln, ae, ao):
        nb = dw.shape[0]
        for L in range(4):
            ae[L] = _F32(0.0)
            ao[L] = _F32(0.0)
        summs = _F32(0.0)
        summs1 = _F32(0.0)
        b = 0
        while b + 1 < nb:
            if MIN_PAIR:
                summs = _F32(summs + fma32(mw[b], xm[t, b], _F32(mw[b + 1] * xm[t, b + 1])))
            elif MIN_TWO:
                summs = fma32(mw[b], xm[t, b], summs)
                summs1 = fma32(mw[b + 1], xm[t, b + 1], summs1)
            d0 = _F32(dw[b] * xs[t, b])
            lanes(wv, xq, t, b, ln)
            for L in range(4):
                ae[L] = _F32(ae[L] + _F32(_F32(ln[L]) * d0))
            d1 = _F32(dw[b + 1] * xs[t, b + 1])
            lanes(wv, xq, t, b + 1, ln)
            for L in range(4):
                ao[L] = _F32(ao[L] + _F32(_F32(ln[L]) * d1))
            b += 2
        s = _F32(hsum4(ae, 0) + hsum4(ao, 0))
        if MIN_PAIR:
            s = _F32(s + summs)
        elif MIN_TWO:
            s = _F32(_F32(s + summs) + summs1)
        if b < nb:
            si = _F32(whole_u8(wv, xq, t, b) if USDOT else whole(wv, xq, t, b))
            d = _F32(dw[b] * xs[t, b])
            if TAIL == 0:
                s = fma32(_F32(si * dw[b]), xs[t, b], s)
            elif TAIL == 1:
                s = fma32(si, d, s)
            elif TAIL == 2:
                s = fma32(d, si, s)
            else:
                s = _F32(s + fma32(d, si, _F32(mw[b] * xm[t, b])))
        return s

    @njit(inline="always")
    def one_acc(wv, dw, xq, xs, t, ln, ae):
        for L in range(4):
            ae[L] = _F32(0.0)
        for b in range(dw.shape[0]):
            d = _F32(dw[b] * xs[t, b])
            lanes(wv, xq, t, b, ln)
            for L in range(4):
                ae[L] = _F32(ae[L] + _F32(_F32(ln[L]) * d))
        return hsum4(ae, 0)

    @njit(inline="always")
    def repacked(wv, dw, xq, xs, t, gemm):
        acc = _F32(0.0)
        for b in range(dw.shape[0]):
            i = _F32(whole(wv, xq, t, b))
            if gemm and Q8_GEMM_ADD and MODE == REPACK_4X4:
                acc = _F32(acc + _F32(_F32(dw[b] * xs[t, b]) * i))
            else:
                acc = fma32(i, _F32(xs[t, b] * dw[b]), acc)
        return acc

    @njit(inline="always")
    def mmla(wv, dw, mw, xq, xs, xm, t):
        # the i8mm two-row vec_dot's lane of this output: per block acc +
        # round(float(I) * (d_w * d_a)) (vmlaq_f32), Q4_1's summs a vector
        # of rounded m_w * s_a added block by block, added last
        acc = _F32(0.0)
        summs = _F32(0.0)
        for b in range(dw.shape[0]):
            acc = _F32(acc + _F32(_F32(whole(wv, xq, t, b)) * _F32(dw[b] * xs[t, b])))
            if MIN_PAIR:
                summs = _F32(summs + _F32(mw[b] * xm[t, b]))
        return _F32(acc + summs) if MIN_PAIR else acc

    @njit(inline="always")
    def rows(raw, xq, xs, xm, out, r0, r1):
        n, cols = xq.shape
        nb = cols // 32
        wv = np.empty(cols, np.int8)
        dw = np.empty(nb, np.float32)
        mw = np.empty(nb, np.float32)
        ln = np.empty(4, np.int32)
        ae = np.empty(4, np.float32)
        ao = np.empty(4, np.float32)
        n_gemm = n - n % 4
        for r in range(r0, r1):
            widen(raw, r, wv, dw, mw)
            for t in range(n):
                if MODE == PAIRS or (MODE == PAIRS_MMLA and not two_rows(r, t, raw.shape[0], n, THREADS)):
                    out[t, r] = vec_dot(wv, dw, mw, xq, xs, xm, t, ln, ae, ao)
                elif MODE == PAIRS_MMLA:
                    out[t, r] = mmla(wv, dw, mw, xq, xs, xm, t)
                elif MODE == ONE_ACC:
                    out[t, r] = one_acc(wv, dw, xq, xs, t, ln, ae)
                else:
                    out[t, r] = repacked(wv, dw, xq, xs, t, t < n_gemm)

    return legacy_row_kernels(rows, f"neon_legacy_{t.name}_mode{mode}_{'dotprod' if dotprod else 'neon'}"
                                    f"{'_usdot' if usdot_tail else ''}")


#: repacked layouts whose gemm rounds otherwise than their gemv: a MUL_MAT_ID
#: (ggml runs the gemv for every row) is not served by these kernels
GEMM_NOT_GEMV = frozenset({"q8_0_4x4"})
#: the one-row vec_dot variant of a two-row one: what ggml runs where the
#: two-row code is not taken (a MUL_MAT_ID)
ONE_ROW = {"i8mm": "dotprod"}
#: kernel variants an instruction-set chain names (`traits.kernel`): (mode,
#: dotprod lanes)
VARIANTS = {"neon": (PAIRS, False), "dotprod": (PAIRS, True), "i8mm_usdot": (PAIRS, True, True),
            "tinyblas_q0_arm": (ONE_ACC, True),
            "i8mm": (PAIRS_MMLA, True), "q4_0_4x8": (REPACK_4X8, True), "q8_0_4x8": (REPACK_4X8, True),
            "q4_0_4x4": (REPACK_4X4, True), "q8_0_4x4": (REPACK_4X4, True)}
_KERNELS: dict = {}


def variant_kernels(t, variant: str):
    """The `_digest.RowKernels` (serial, parallel, span, split) of weight type t in `variant` (a key of
    `VARIANTS`), made at the first use: serial(raw, xq, xs, xm, out),
    parallel(raw, xq, xs, xm, out, parts), arguments as
    `legacy_dots.kernels`. KeyError for another variant."""
    key = (GGMLType(t), variant)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = _make_kernels(GGMLType(t), *VARIANTS[variant])
    return k
