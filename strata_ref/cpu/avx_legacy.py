"""Mat-mul of the legacy quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) in the float
order of ggml-cpu's x86 builds without AVX2: the `#elif defined(__AVX__)`
and `#elif defined(__SSSE3__)` branches of `arch/x86/quants.c` and
llamafile's `tinyBLAS_Q0_AVX` on AVX only (llama.cpp v0.4.0 as
node-llama-cpp 3.21.1 ships it prebuilt, GCC 11.4; docs/prebuilt.md).

The AVX branches form their integers on 128-bit halves (`_mm_maddubs_epi16`
+ `_mm_madd_epi16`), exact; what follows is float32:

* `PAIRS` (`ggml_vec_dot_q4_0_q8_0`, `ggml_vec_dot_q8_0_q8_0`, AVX): blocks
  taken in pairs into one 8-lane accumulator, lanes 0-3 the even block,
  lanes 4-7 the odd one; lane L of a block sums the products of values
  4L..4L+3 and 16+4L..16+4L+3 (`mul_sum_i8_quad_float`); `acc = acc +
  deltas * p` with `deltas` the rounded `d_w * d_a` of each block
  (`quad_fp16_delta_float`), one FMA on FMA builds (GCC contracts the
  `_mm256_mul_ps` / `_mm256_add_ps` pair), two roundings otherwise; then
  `hsum_float_8`. An odd last block is the scalar C after it: Q4_0
  `sumf += sumi * d_w * d_a`, Q8_0 `sumf += sumi * (d_w * d_a)` (contracted
  on FMA builds).
* `LANES` (`ggml_vec_dot_q4_1_q8_1`, `_q5_1_q8_1`, `_q5_0_q8_0`, AVX, and
  `tinyBLAS_Q0_AVX`): 8 lanes per block, lane L the exact dot of values
  4L..4L+3, `acc = acc + d * lane` block after block, `hsum_float_8`;
  Q4_1 / Q5_1 add `summs` (`summs += m_w * s_a` per block) last. On FMA
  builds these are the AVX2 kernels' bits (`legacy_dots.LANES`); this mode
  is the unfused order of the builds without FMA.
* `SSSE3` (`ggml_vec_dot_q4_0_q8_0`, SSSE3 branch; the other legacy types
  have none there and take the generic C): four 4-lane accumulators over
  pairs of blocks, acc_0 / acc_1 the even block's values 0..15 / 16..31,
  acc_2 / acc_3 the odd block's, lane L the dot of 4 values, `acc = acc +
  d * lane` (no FMA on that build); `hsum_float_4x4` (`_mm_hadd_ps` thrice:
  ((A + B) + (C + D)) with A = (a0 + a1) + (a2 + a3) per accumulator); an
  odd last block as the generic C, `sumf += (sumi * d_w) * d_a`.

The kernels widen one weight row to int8 values once and dot it with every
activation row, the integer lanes formed in plain loops (exact whatever
instructions the host has).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..types import GGMLType
from ._digest import legacy_row_kernels
from .fp import fma32, hsum8
from .legacy_rows import field_offset, row_widener

__all__ = ["PAIRS", "LANES", "SSSE3", "VARIANTS", "variant_kernels"]

PAIRS, LANES, SSSE3 = 0, 1, 2
_F32 = np.float32



@njit(inline="always", cache=True)
def _madd(a, b, c, fused):
    # a * b + c as GCC compiles it: one FMA on FMA builds, else two roundings
    if fused:
        return fma32(a, b, c)
    return _F32(_F32(a * b) + c)


def _make_kernels(t: GGMLType, mode: int, fused: bool):
    """The `_digest.RowKernels` (serial, parallel, span, split) k(raw, xq, xs, xm, out[, parts]) of
    `legacy_dots.kernels`' interface for weight type t in `mode`."""
    T = int(t)
    M = field_offset(t, "m")
    Q4_0 = T == int(GGMLType.Q4_0)
    MODE = mode
    FUSED = fused

    widen = row_widener(t)

    @njit(inline="always")
    def dot4(wv, xq, t, o):
        # the exact dot of the 4 values at o
        s = np.int32(0)
        for p in range(4):
            s += np.int32(wv[o + p]) * np.int32(xq[t, o + p])
        return s

    @njit(inline="always")
    def whole(wv, xq, t, b):
        s = np.int32(0)
        for p in range(32):
            s += np.int32(wv[32 * b + p]) * np.int32(xq[t, 32 * b + p])
        return s

    @njit(inline="always")
    def pairs(wv, dw, xq, xs, t, acc):
        nb = dw.shape[0]
        for L in range(8):
            acc[L] = _F32(0.0)
        b = 0
        while b + 1 < nb:
            for h in range(2):
                d = _F32(dw[b + h] * xs[t, b + h])
                o = 32 * (b + h)
                for L in range(4):
                    p = _F32(dot4(wv, xq, t, o + 4 * L) + dot4(wv, xq, t, o + 16 + 4 * L))
                    acc[4 * h + L] = _madd(d, p, acc[4 * h + L], FUSED)
            b += 2
        s = hsum8(acc)
        if b < nb:
            si = _F32(whole(wv, xq, t, b))
            if Q4_0:
                s = _madd(_F32(si * dw[b]), xs[t, b], s, FUSED)
            else:
                s = _madd(si, _F32(dw[b] * xs[t, b]), s, FUSED)
        return s

    @njit(inline="always")
    def lanes(wv, dw, mw, xq, xs, xm, t, acc):
        for L in range(8):
            acc[L] = _F32(0.0)
        summs = _F32(0.0)
        for b in range(dw.shape[0]):
            if M >= 0:
                summs = _madd(mw[b], xm[t, b], summs, FUSED)
            d = _F32(dw[b] * xs[t, b])
            for L in range(8):
                acc[L] = _madd(d, _F32(dot4(wv, xq, t, 32 * b + 4 * L)), acc[L], FUSED)
        s = hsum8(acc)
        return _F32(s + summs) if M >= 0 else s

    @njit(inline="always")
    def ssse3(wv, dw, xq, xs, t, acc):
        nb = dw.shape[0]
        for L in range(16):
            acc[L] = _F32(0.0)
        b = 0
        while b + 1 < nb:
            for h in range(2):
                d = _F32(dw[b + h] * xs[t, b + h])
                o = 32 * (b + h)
                for k in range(2):
                    for L in range(4):
                        a = 8 * h + 4 * k + L
                        acc[a] = _F32(acc[a] + _F32(d * _F32(dot4(wv, xq, t, o + 16 * k + 4 * L))))
            b += 2
        q = np.empty(4, np.float32)
        for a in range(4):
            q[a] = _F32(_F32(acc[4 * a] + acc[4 * a + 1]) + _F32(acc[4 * a + 2] + acc[4 * a + 3]))
        s = _F32(_F32(q[0] + q[1]) + _F32(q[2] + q[3]))
        while b < nb:
            s = _F32(s + _F32(_F32(_F32(whole(wv, xq, t, b)) * dw[b]) * xs[t, b]))
            b += 1
        return s

    @njit(inline="always")
    def rows(raw, xq, xs, xm, out, r0, r1):
        n, cols = xq.shape
        nb = cols // 32
        wv = np.empty(cols, np.int8)
        dw = np.empty(nb, np.float32)
        mw = np.empty(nb, np.float32)
        acc = np.empty(16, np.float32)
        for r in range(r0, r1):
            widen(raw, r, wv, dw, mw)
            for t in range(n):
                if MODE == PAIRS:
                    out[t, r] = pairs(wv, dw, xq, xs, t, acc)
                elif MODE == LANES:
                    out[t, r] = lanes(wv, dw, mw, xq, xs, xm, t, acc)
                else:
                    out[t, r] = ssse3(wv, dw, xq, xs, t, acc)

    return legacy_row_kernels(rows, f"avx_legacy_{t.name}_mode{mode}_{'fma' if fused else 'nofma'}")


#: kernel variants an instruction-set chain names (`traits.kernel`): (mode,
#: fused). "avx": the AVX `vec_dot` of Q4_0 / Q8_0 on an FMA build (the
#: other legacy types compute the AVX2 bits there: `legacy_dots`'s "x86");
#: the "_nofma" ones the same code on a build without FMA; "ssse3" Q4_0's
#: SSSE3 `vec_dot`
VARIANTS = {"avx": (PAIRS, True), "avx_nofma": (PAIRS, False), "lanes_nofma": (LANES, False),
            "ssse3": (SSSE3, False)}
_KERNELS: dict = {}


def variant_kernels(t, variant: str):
    """The `_digest.RowKernels` (serial, parallel, span, split) of weight type t in `variant` (a key of
    `VARIANTS`), made at the first use: serial(raw, xq, xs, xm, out),
    parallel(raw, xq, xs, xm, out, parts), arguments as
    `legacy_dots.kernels`. KeyError for another variant."""
    key = (GGMLType(t), variant)
    k = _KERNELS.get(key)
    if k is None:
        mode, fused = VARIANTS[variant]
        k = _KERNELS[key] = _make_kernels(GGMLType(t), mode, fused)
    return k
