"""Reference quantizers of the I-quants: IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_S
(and, unregistered, ggml_quantize_chunk's IQ1_M).

ggml's reference quantizers (`quantize_row_*_ref`, ggml-org/ggml
src/ggml-quants.c), reimplemented with ggml's arithmetic: float32
operations in C statement order (never contracted into FMA: the pinned
build is ggml-base on x86-64 without `-march`, ../shared/spec/formats.md §8),
`nearest_int` as ggml's 1.5 * 2^23 bit trick, strict comparisons where the
first hit wins, sequential sums, and ggml's fp32 -> fp16 rounding (RNE). The
`_ref` functions pass no importance matrix, so every weight below is ggml's
fallback: `x^2` for IQ4 and IQ3, `sigma2/4 + x^2` for IQ2_S, with
`sigma2 = 2 * sum(x^2) / 256` over the super-block.

No reference quantizer (strata_ref.quantize raises, giving the reason):
IQ2_XXS, IQ2_XS and IQ1_S require an importance matrix
(`ggml_quantize_requires_imatrix`); IQ1_M has no `from_float_ref` in ggml's
type traits (only `ggml_quantize_chunk` takes it without an importance
matrix, and llama.cpp's `llama-quantize` refuses that); strata-ref follows
the type traits, and offers ggml_quantize_chunk's IQ1_M result, unregistered,
as `quantize_iq1_m_chunk`. Its one sort (`qsort` on float keys) keeps equal
keys in index order: glibc's qsort is a stable merge sort for arrays of this
size (checked against C on blocks full of ties).

IQ4_NL: ggml's `from_float_ref` (`quantize_row_iq4_nl_ref`) searches no
extra scales (ntry = -1), while `ggml_quantize_chunk` (what `llama-quantize`
runs, `quantize_iq4_nl`) tries 15 (ntry = 7). The registered quantizer is
the `_ref` one; `quantize_iq4_nl_chunk` gives the other. For a block whose
largest |x| is below 1e-15, `quantize_row_iq4_nl_ref` stores d = 0 and
leaves the codes of its stack buffer from the previous block (undefined for
the first); strata-ref stores the codes `quantize_iq4_nl` stores there
(0x88: index 8, the value nearest 0), so only those code bytes may differ.

ggml's other defects are reproduced, since they decide bits: IQ3_S does not
advance its `qs`/`signs` output positions past a sub-block whose values are
all zero, so later sub-blocks are written earlier (and the last slots stay
zero).

Errors: input that is not float32 raises TypeError; NaN or Inf input raises
ValueError (ggml's result is undefined there); a finite block for which
ggml's quantizer would abort (GGML_ASSERT: no neighbour with a finite
distance, a NaN scale) raises ValueError naming the block.

Facts about the grids (nearest-neighbour maps) are in `iq_grid_maps`.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit

from ..numerics import f32_bits_to_f16_bits
from ..types import GGMLType, block_format
from . import register_chunk_quantize, register_quantize
from ._qnum import f32_bits, mul_add, nearest_int
from .iq_grid_maps import grid_map
from .iq_tables import KVALUES_IQ4NL

__all__ = ["quantize_iq4_nl_ref", "quantize_iq4_nl_chunk", "quantize_iq4_xs_ref",
           "quantize_iq3_xxs_ref", "quantize_iq3_s_ref", "quantize_iq2_s_ref",
           "quantize_iq1_m_chunk"]

T = GGMLType

_F = np.float32
_FLT_MAX = _F(np.finfo(np.float32).max)
_HALF = _F(0.5)
_ONE = _F(1.0)
_ZERO = _F(0.0)

# status codes of a block function
_OK = 0
_NO_NEIGHBOUR = 1                 # ggml: GGML_ASSERT(grid_index >= 0)
_OFF_GRID = 2                     # ggml: "Oops: found point not on grid", abort
_BAD_SCALE = 3                    # ggml: GGML_ASSERT(scale >= 0) on a NaN scale
_ABORT_REASONS = {
    _NO_NEIGHBOUR: "GGML_ASSERT(grid_index >= 0): no grid neighbour at a finite distance",
    _OFF_GRID: "GGML_ABORT: levels not on the grid",
    _BAD_SCALE: "GGML_ASSERT(scale >= 0): the scale is NaN",
}


# ---------------------------------------------------------------- scalars

@njit(inline="always", cache=True)
def _fp16_bits(f):
    # GGML_FP32_TO_FP16: round to nearest even, NaN -> sign | 0x7E00.
    return f32_bits_to_f16_bits(f32_bits(f), True)


@njit(inline="always", cache=True)
def _put_u16(out, o, v):
    out[o] = v & 0xFF
    out[o + 1] = (v >> 8) & 0xFF


@njit(inline="always", cache=True)
def _put_u32(out, o, v):
    for i in range(4):
        out[o + i] = (v >> (8 * i)) & 0xFF


@njit(inline="always", cache=True)
def _fmax(a, b):
    # C's MAX(a, b): a > b ? a : b
    return a if a > b else b


# ---------------------------------------------------------------- IQ4_NL / IQ4_XS

@njit(inline="always", cache=True)
def _best_index(kv, x):
    """ggml `best_index_int8` over the 16 float32 values `kv` (ascending):
    bisection, then the nearer neighbour, the upper one on a tie."""
    if x <= kv[0]:
        return 0
    if x >= kv[15]:
        return 15
    ml = 0
    mu = 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < kv[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - kv[mu - 1] < kv[mu] - x else mu


@njit(cache=True)
def _iq4_sums(xb, w, kv, idv, fused):
    # sum w*q*x and sum w*q*q with q the code value nearest id*x; fused:
    # each term added by one FMA of (w*q) and x or q, as GCC contracts them
    # on aarch64 (`strata_ref.cpu.base_quant`)
    sumqx = _ZERO
    sumq2 = _ZERO
    for j in range(xb.shape[0]):
        q = kv[_best_index(kv, idv * xb[j])]
        wq = w[j] * q
        sumqx = mul_add(wq, xb[j], sumqx, fused)
        sumq2 = mul_add(wq, q, sumq2, fused)
    return sumqx, sumq2


@njit(cache=True)
def _iq4_sub_scale(xb, kv, ntry, L, fused):
    """Scale of one 32-value sub-block (ggml `quantize_row_iq4_nl_impl`,
    no importance matrix: weight = x^2). Writes the first-pass codes to L;
    returns the scale, 0 for a sub-block below GROUP_MAX_EPS (L untouched).
    fused: the weighted sums by FMA (`_iq4_sums`)."""
    n = xb.shape[0]
    w = np.empty(n, np.float32)
    amax = _ZERO
    mx = _ZERO
    for j in range(n):
        w[j] = xb[j] * xb[j]
    for j in range(n):
        ax = abs(xb[j])
        if ax > amax:
            amax = ax
            mx = xb[j]
    if amax < _F(1e-15):
        return _ZERO
    v0 = kv[0]
    d = (-mx) / v0 if ntry > 0 else mx / v0
    idv = _ONE / d
    sumqx = _ZERO
    sumq2 = _ZERO
    for j in range(n):
        lj = _best_index(kv, idv * xb[j])
        L[j] = lj
        q = kv[lj]
        wq = w[j] * q
        sumqx = mul_add(wq, xb[j], sumqx, fused)
        sumq2 = mul_add(wq, q, sumq2, fused)
    d = sumqx / sumq2 if sumq2 > _ZERO else _ZERO
    best = d * sumqx
    for itry in range(-ntry, ntry + 1):
        idv = _F(itry + np.int64(v0)) / mx
        sqx, sq2 = _iq4_sums(xb, w, kv, idv, fused)
        if sq2 > _ZERO and sqx * sqx > best * sq2:
            d = sqx / sq2
            best = d * sqx
    return d


@njit(cache=True)
def _iq4_pack(L, out, o_qs):
    for i in range(L.shape[0] // 32):
        for j in range(16):
            out[o_qs + 16 * i + j] = L[32 * i + j] | (L[32 * i + 16 + j] << 4)


@njit(cache=True)
def _iq4_nl_block(x, out, kv, ntry, o_d, o_qs, fused):
    L = np.full(32, 8, np.uint8)      # see the module docstring (ntry < 0)
    d = _iq4_sub_scale(x, kv, ntry, L, fused)
    _put_u16(out, o_d, _fp16_bits(d))
    if ntry > 0:
        idv = _ONE / d if d != _ZERO else _ZERO
        for j in range(32):
            L[j] = _best_index(kv, idv * x[j])
    _iq4_pack(L, out, o_qs)
    return _OK


@njit(cache=True)
def _iq4_xs_block(x, out, kv, o_d, o_sh, o_sl, o_qs):
    nsub = x.shape[0] // 32
    L = np.zeros(x.shape[0], np.uint8)
    scales = np.empty(nsub, np.float32)
    amax_scale = _ZERO
    max_scale = _ZERO
    for ib in range(nsub):
        d = _iq4_sub_scale(x[32 * ib:32 * ib + 32], kv, 7, L[32 * ib:32 * ib + 32], False)
        scales[ib] = d
        if abs(d) > amax_scale:
            amax_scale = abs(d)
            max_scale = d
    d = (-max_scale) / _F(32.0)
    _put_u16(out, o_d, _fp16_bits(d))
    idv = _ONE / d if d != _ZERO else _ZERO
    sh = 0
    for ib in range(nsub):
        l = nearest_int(idv * scales[ib])
        l = max(-32, min(31, l))
        dl = d * _F(l)
        idl = _ONE / dl if dl != _ZERO else _ZERO
        for j in range(32):
            L[32 * ib + j] = _best_index(kv, idl * x[32 * ib + j])
        l += 32
        if ib % 2 == 0:
            out[o_sl + ib // 2] = l & 15
        else:
            out[o_sl + ib // 2] |= (l & 15) << 4
        sh |= (l >> 4) << (2 * ib)
    _put_u16(out, o_sh, sh)
    _iq4_pack(L, out, o_qs)
    return _OK


# ---------------------------------------------------------------- grid search (IQ3, IQ2_S)

@njit(inline="always", cache=True)
def _best_neighbour(u, gpos, nb_start, nb_count, nb, xval, waux, scale, L):
    """ggml `iq2_find_best_neighbour` / `iq3_find_best_neighbour`: among the
    neighbours of lattice point u, the row with the least weighted squared
    error (first wins); writes its levels to L. Returns -1 where ggml
    asserts (no neighbour, or none with d2 < FLT_MAX)."""
    n = xval.shape[0]
    best_d2 = _FLT_MAX
    gi = -1
    s = nb_start[u]
    for k in range(nb_count[u]):
        g = nb[s + k]
        d2 = _ZERO
        for i in range(n):
            diff = scale * _F(gpos[g, i]) - xval[i]
            d2 += waux[i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            gi = g
    if gi >= 0:
        for i in range(n):
            L[i] = (gpos[gi, i] - 1) // 2
    return gi


@njit(inline="always", cache=True)
def _lattice_index(xg, idv, bits, lmax, L):
    # levels nearest_int(0.5*(id*x - 1)) clamped to 0..lmax, and their index
    u = 0
    for i in range(xg.shape[0]):
        l = nearest_int(_HALF * (idv * xg[i] - _ONE))
        l = max(0, min(lmax, l))
        L[i] = l
        u |= l << (bits * i)
    return u


@njit(inline="always", cache=True)
def _level_sums(xval, weight, L):
    sumqx = _ZERO
    sumq2 = _ZERO
    for i in range(xval.shape[0]):
        q = _F(2 * L[i] + 1)
        sumqx += weight[i] * xval[i] * q
        sumq2 += weight[i] * q * q
    return sumqx, sumq2


@njit(cache=True)
def _grid_scale(xval, weight, waux, mx, L, gpos, kmap, nb_start, nb_count, nb,
                n, bits, kmaxq, nstep, step, on_grid_init, skip_on_grid):
    """The scale search shared by ggml's IQ3_XXS, IQ3_S and IQ2_S quantizers.

    xval: |x| of one sub-block (groups of n values), weight / waux: weights
    and their square roots, mx: max(xval). Tries ids (2*kmaxq - 1 + is*step)
    / mx for is in -nstep..nstep, mapping each group to the lattice and,
    off the grid, to its best neighbour; keeps the id with the largest
    sumqx^2 / sumq2. Then groups off the grid are mapped again with the
    kept scale, and the scale is refitted. Writes the levels to L (each
    group a grid row) and returns (scale, status)."""
    ng = xval.shape[0] // n
    lmax = kmaxq - 1
    laux = np.zeros(xval.shape[0], np.int64)
    on_grid = np.empty(ng, np.bool_)
    on_grid_aux = np.empty(ng, np.bool_)
    for k in range(ng):
        on_grid[k] = on_grid_init
    for i in range(xval.shape[0]):
        L[i] = 0
    best = _ZERO
    scale = mx / _F(2 * kmaxq - 1)
    for st in range(-nstep, nstep + 1):
        idv = (_F(2 * kmaxq - 1) + _F(st) * step) / mx
        this_scale = _ONE / idv
        for k in range(ng):
            g = slice(n * k, n * k + n)
            u = _lattice_index(xval[g], idv, bits, lmax, laux[g])
            on_grid_aux[k] = True
            if kmap[u] < 0:
                on_grid_aux[k] = False
                if _best_neighbour(u, gpos, nb_start, nb_count, nb, xval[g],
                                   waux[g], this_scale, laux[g]) < 0:
                    return scale, _NO_NEIGHBOUR
        sumqx, sumq2 = _level_sums(xval, weight, laux)
        if sumq2 > _ZERO and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            L[:] = laux
            on_grid[:] = on_grid_aux
    n_off = 0
    for k in range(ng):
        if not on_grid[k]:
            n_off += 1
    if n_off > 0 and scale > _ZERO:
        idv = _ONE / scale
        for k in range(ng):
            if skip_on_grid and on_grid[k]:
                continue
            g = slice(n * k, n * k + n)
            u = _lattice_index(xval[g], idv, bits, lmax, L[g])
            if kmap[u] < 0:
                if _best_neighbour(u, gpos, nb_start, nb_count, nb, xval[g],
                                   waux[g], scale, L[g]) < 0:
                    return scale, _NO_NEIGHBOUR
        sumqx, sumq2 = _level_sums(xval, weight, L)
        if sumq2 > _ZERO:
            scale = sumqx / sumq2
    return scale, _OK


@njit(cache=True)
def _grid_row(L, kmap, bits):
    # grid row of the levels L (a grid point by construction), -1 if not
    u = 0
    for i in range(L.shape[0]):
        u |= L[i] << (bits * i)
    return kmap[u]


@njit(cache=True)
def _abs_and_signs(xb, xval):
    # xval = |x| as ggml forms it (x >= 0 keeps x, so -0 stays -0), and the
    # sign bit of each negative x, 8 values per byte
    signs = np.zeros(xb.shape[0] // 8, np.int64)
    for i in range(xb.shape[0]):
        if xb[i] >= _ZERO:
            xval[i] = xb[i]
        else:
            xval[i] = -xb[i]
            signs[i // 8] |= 1 << (i % 8)
    return signs


@njit(cache=True)
def _scale_code(idv, s):
    # 4-bit sub-block scale: nearest_int(0.5*(id*s - 1)) clamped to 0..15
    return max(0, min(15, nearest_int(_HALF * (idv * s - _ONE))))


@njit(cache=True)
def _iq3_xxs_block(x, out, gpos, kmap, nb_start, nb_count, nb, o_d, o_qs, o_sas):
    nsub = x.shape[0] // 32
    scales = np.zeros(nsub, np.float32)
    sas = np.zeros(nsub, np.int64)
    weight = np.empty(32, np.float32)
    waux = np.empty(32, np.float32)
    xval = np.empty(32, np.float32)
    L = np.zeros(32, np.int64)
    max_scale = _ZERO
    for ib in range(nsub):
        xb = x[32 * ib:32 * ib + 32]
        for i in range(32):
            weight[i] = xb[i] * xb[i]
        for i in range(32):
            waux[i] = np.sqrt(weight[i])
        signs = _abs_and_signs(xb, xval)
        for k in range(4):
            # an odd count of negatives: flip the least important value, so
            # the 7 stored bits imply the 8th (even parity)
            nflip = 0
            for i in range(8):
                nflip += (signs[k] >> i) & 1
            if nflip % 2 == 1:
                imin = 0
                vmin = weight[8 * k] * xb[8 * k] * xb[8 * k]
                for i in range(1, 8):
                    a = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i]
                    if a < vmin:
                        vmin = a
                        imin = i
                xval[8 * k + imin] = -xval[8 * k + imin]
                signs[k] ^= 1 << imin
            signs[k] &= 127
        mx = xval[0]
        for i in range(1, 32):
            mx = _fmax(mx, xval[i])
        if mx < _F(1e-8):
            scales[ib] = _ZERO
            continue
        scale, st = _grid_scale(xval, weight, waux, mx, L, gpos, kmap, nb_start,
                                nb_count, nb, 4, 3, 8, 15, _F(0.2), True, True)
        if st != _OK:
            return st
        if scale < _ZERO:
            scale = -scale
            for k in range(4):
                signs[k] = (~signs[k]) & 127
        for k in range(8):
            g = _grid_row(L[4 * k:4 * k + 4], kmap, 3)
            if g < 0:
                return _OFF_GRID
            out[o_qs + 8 * ib + k] = g
        sas[ib] = signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21)
        if not scale >= _ZERO:
            return _BAD_SCALE
        scales[ib] = scale
        max_scale = _fmax(max_scale, scale)
    if max_scale == _ZERO:
        out[:] = 0
        return _OK
    d = max_scale / _F(31.0)
    _put_u16(out, o_d, _fp16_bits(d * _F(1.0125)))
    idv = _ONE / d
    for ib in range(nsub):
        _put_u32(out, o_sas + 4 * ib, sas[ib] | (_scale_code(idv, scales[ib]) << 28))
    return _OK


@njit(cache=True)
def _iq3_s_block(x, out, gpos, kmap, nb_start, nb_count, nb,
                 o_d, o_qs, o_qh, o_signs, o_scales):
    nsub = x.shape[0] // 32
    scales = np.zeros(nsub, np.float32)
    weight = np.empty(32, np.float32)
    waux = np.empty(32, np.float32)
    xval = np.empty(32, np.float32)
    L = np.zeros(32, np.int64)
    max_scale = _ZERO
    qs = o_qs          # ggml advances these only past non-zero sub-blocks
    sg = o_signs
    for ib in range(nsub):
        xb = x[32 * ib:32 * ib + 32]
        for i in range(32):
            weight[i] = xb[i] * xb[i]
        for i in range(32):
            waux[i] = np.sqrt(weight[i])
        signs = _abs_and_signs(xb, xval)
        mx = xval[0]
        for i in range(1, 32):
            mx = _fmax(mx, xval[i])
        if mx == _ZERO:
            scales[ib] = _ZERO
            continue
        scale, st = _grid_scale(xval, weight, waux, mx, L, gpos, kmap, nb_start,
                                nb_count, nb, 4, 3, 8, 9, _F(0.2), False, False)
        if st != _OK:
            return st
        if scale < _ZERO:
            scale = -scale
            for k in range(4):
                signs[k] = (~signs[k]) & 255
        for k in range(8):
            g = _grid_row(L[4 * k:4 * k + 4], kmap, 3)
            if g < 0:
                return _OFF_GRID
            out[qs + k] = g & 255
            out[o_qh + (8 * ib + k) // 8] |= (g >> 8) << ((8 * ib + k) % 8)
        qs += 8
        for k in range(4):
            out[sg + k] = signs[k]
        sg += 4
        if not scale >= _ZERO:
            return _BAD_SCALE
        scales[ib] = scale
        max_scale = _fmax(max_scale, scale)
    if max_scale == _ZERO:
        return _OK
    d = max_scale / _F(31.0)
    _put_u16(out, o_d, _fp16_bits(d * _F(1.033)))
    idv = _ONE / d
    for ib in range(0, nsub, 2):
        out[o_scales + ib // 2] = (_scale_code(idv, scales[ib])
                                   | (_scale_code(idv, scales[ib + 1]) << 4))
    return _OK


@njit(cache=True)
def _iq2_s_block(x, out, gpos, kmap, nb_start, nb_count, nb,
                 o_d, o_qs, o_signs, o_qh, o_scales):
    nsub = x.shape[0] // 16
    scales = np.zeros(nsub, np.float32)
    weight = np.empty(16, np.float32)
    waux = np.empty(16, np.float32)
    xval = np.empty(16, np.float32)
    L = np.zeros(16, np.int64)
    sumx2 = _ZERO
    for i in range(x.shape[0]):
        sumx2 += x[i] * x[i]
    sigma2 = _F(2.0) * sumx2 / _F(x.shape[0])
    max_scale = _ZERO
    for ib in range(nsub):
        xb = x[16 * ib:16 * ib + 16]
        for i in range(16):
            weight[i] = _F(0.25) * sigma2 + xb[i] * xb[i]
        for i in range(16):
            waux[i] = np.sqrt(weight[i])
        signs = _abs_and_signs(xb, xval)
        mx = xval[0]
        for i in range(1, 16):
            mx = _fmax(mx, xval[i])
        if mx < _F(1e-8):
            scales[ib] = _ZERO
            continue
        scale, st = _grid_scale(xval, weight, waux, mx, L, gpos, kmap, nb_start,
                                nb_count, nb, 8, 2, 3, 9, _F(0.1), True, True)
        if st != _OK:
            return st
        if scale < _ZERO:
            scale = -scale
            for k in range(2):
                signs[k] = (~signs[k]) & 255
        for k in range(2):
            g = _grid_row(L[8 * k:8 * k + 8], kmap, 2)
            if g < 0:
                return _OFF_GRID
            i8 = 2 * ib + k
            out[o_qs + i8] = g & 255
            out[o_qh + i8 // 4] |= (g >> 8) << (2 * (i8 % 4))
            out[o_signs + i8] = signs[k]
        if not scale >= _ZERO:
            return _BAD_SCALE
        scales[ib] = scale
        max_scale = _fmax(max_scale, scale)
    if max_scale == _ZERO:
        return _OK
    d = max_scale / _F(31.0)
    _put_u16(out, o_d, _fp16_bits(d * _F(0.9875)))
    idv = _ONE / d
    for ib in range(nsub):
        l = _scale_code(idv, scales[ib])
        if ib % 2 == 0:
            out[o_scales + ib // 2] = l
        else:
            out[o_scales + ib // 2] |= l << 4
    return _OK


# ---------------------------------------------------------------- IQ1_M (ggml_quantize_chunk only)

_IQ1M_DELTA = _F(0.125)
# the three code values of a group of 8, shifted up (x_p) or down (x_m)
_X_P = np.array([-1 + 0.125, 0.125, 1 + 0.125], np.float32)
_X_M = np.array([-1 - 0.125, -0.125, 1 - 0.125], np.float32)


@njit(cache=True)
def _iq1_best_neighbour(u, gpos, nb_start, nb_count, nb, xb, w, scale, xx, L):
    """ggml `iq1_find_best_neighbour2` (its candidates only): the neighbour
    row with the least sum w*(scale*xx[l] - x)^2, first wins; -1 where ggml
    would fall back to a scan that reads past its input (and asserts)."""
    best = _FLT_MAX
    gi = -1
    s = nb_start[u]
    for k in range(nb_count[u]):
        g = nb[s + k]
        d2 = _ZERO
        for i in range(8):
            diff = scale * xx[(gpos[g, i] - 1) // 2] - xb[i]
            d2 += w[i] * diff * diff
        if d2 < best:
            best = d2
            gi = g
    if gi >= 0:
        for i in range(8):
            L[i] = (gpos[gi, i] - 1) // 2
    return gi


@njit(cache=True)
def _iq1m_split(xb, w):
    """The exhaustive 3-group split of `quantize_row_iq1_m_impl`: sort the 16
    values, and for every pair of boundaries (i1 <= i2) and every choice of
    shift per half (k: 0 ++, 1 +-, 2 -+, 3 --) keep the best scale. Ties in
    the sort keep the index order (glibc's qsort is a stable merge sort for
    arrays this small). Returns (scale, i1, i2, k, order)."""
    order = np.argsort(xb, kind="mergesort")
    px = np.zeros((2, 17), np.float32)
    pw = np.zeros((2, 17), np.float32)
    for j in range(16):
        i = order[j]
        h = 0 if i < 8 else 1
        px[h, j + 1] = px[h, j] + w[i] * xb[i]
        px[1 - h, j + 1] = px[1 - h, j]
        pw[h, j + 1] = pw[h, j] + w[i]
        pw[1 - h, j + 1] = pw[1 - h, j]
    p2 = _X_P[2]
    m2 = _X_M[2]
    cp1 = _X_P[0] * _X_P[0] - _X_P[1] * _X_P[1]
    cp2 = _X_P[1] * _X_P[1] - _X_P[2] * _X_P[2]
    cm1 = _X_M[0] * _X_M[0] - _X_M[1] * _X_M[1]
    cm2 = _X_M[1] * _X_M[1] - _X_M[2] * _X_M[2]
    qx_p = np.empty(2, np.float32)
    qx_m = np.empty(2, np.float32)
    q2_p = np.empty(2, np.float32)
    q2_m = np.empty(2, np.float32)
    sqx = np.empty(4, np.float32)
    sq2 = np.empty(4, np.float32)
    best = -_FLT_MAX
    scale = _ZERO
    b1 = b2 = bk = -1
    for i1 in range(17):
        for i2 in range(i1, 17):
            for h in range(2):
                sx = px[h, i1] + px[h, i2]
                qx_p[h] = px[h, 16] * p2 - sx
                qx_m[h] = px[h, 16] * m2 - sx
                q2_p[h] = pw[h, 16] * p2 * p2 + pw[h, i1] * cp1 + pw[h, i2] * cp2
                q2_m[h] = pw[h, 16] * m2 * m2 + pw[h, i1] * cm1 + pw[h, i2] * cm2
            sqx[0] = qx_p[0] + qx_p[1]
            sqx[1] = qx_p[0] + qx_m[1]
            sqx[2] = qx_m[0] + qx_p[1]
            sqx[3] = qx_m[0] + qx_m[1]
            sq2[0] = q2_p[0] + q2_p[1]
            sq2[1] = q2_p[0] + q2_m[1]
            sq2[2] = q2_m[0] + q2_p[1]
            sq2[3] = q2_m[0] + q2_m[1]
            for k in range(4):
                if sq2[k] > _ZERO and sqx[k] * sqx[k] > best * sq2[k]:
                    scale = sqx[k] / sq2[k]
                    best = scale * sqx[k]
                    b1 = i1
                    b2 = i2
                    bk = k
    return scale, b1, b2, bk, order


@njit(inline="always", cache=True)
def _iq1m_values(shift, k):
    # group k of a sub-block: shifted by the first (k = 0) or second bit
    if k == 0:
        return _X_P if shift < 2 else _X_M
    return _X_P if shift % 2 == 0 else _X_M


@njit(cache=True)
def _iq1_m_block(x, out, gpos, kmap, nb_start, nb_count, nb, o_qs, o_qh, o_sc):
    nsub = x.shape[0] // 16
    scales = np.zeros(nsub, np.float32)
    shifts = np.zeros(nsub, np.int64)
    w = np.empty(16, np.float32)
    L = np.zeros(16, np.int64)
    index = np.zeros(2, np.int64)
    max_scale = _ZERO
    for ib in range(nsub):
        xb = x[16 * ib:16 * ib + 16]
        for i in range(16):
            w[i] = xb[i] * xb[i]
        mx = abs(xb[0])
        for i in range(1, 16):
            mx = _fmax(mx, abs(xb[i]))
        if mx < _F(1e-7):
            continue
        scale, b1, b2, bk, order = _iq1m_split(xb, w)
        if b1 < 0 or b2 < 0 or bk < 0:
            continue
        for j in range(16):
            L[order[j]] = 0 if j < b1 else (1 if j < b2 else 2)
        if scale < _ZERO:
            for j in range(16):
                L[j] = 2 - L[j]
            scale = -scale
            bk = 3 - bk
        on_grid = True
        for k in range(2):
            xx = _iq1m_values(bk, k)
            g = _grid_row(L[8 * k:8 * k + 8], kmap, 2)
            if g < 0:
                on_grid = False
                u = 0
                for j in range(8):
                    u |= L[8 * k + j] << (2 * j)
                g = _iq1_best_neighbour(u, gpos, nb_start, nb_count, nb, xb[8 * k:8 * k + 8],
                                        w[8 * k:8 * k + 8], scale, xx, L[8 * k:8 * k + 8])
                if g < 0:
                    return _NO_NEIGHBOUR
            index[k] = g
        if not on_grid:
            sqx = _ZERO
            sq2 = _ZERO
            for k in range(2):
                xx = _iq1m_values(bk, k)
                for j in range(8):
                    q = xx[(gpos[index[k], j] - 1) // 2]
                    sqx += w[8 * k + j] * q * xb[8 * k + j]
                    sq2 += w[8 * k + j] * q * q
            if sqx > _ZERO and sq2 > _ZERO:
                scale = sqx / sq2
        out[o_qs + 2 * ib] = index[0] & 255
        out[o_qs + 2 * ib + 1] = index[1] & 255
        out[o_qh + ib] = (index[0] >> 8) | ((index[1] >> 8) << 4)
        if not scale >= _ZERO:
            return _BAD_SCALE
        scales[ib] = scale
        shifts[ib] = bk
        max_scale = _fmax(max_scale, scale)
    if max_scale == _ZERO:
        return _OK
    d = max_scale / _F(15.0)
    idv = _ONE / d
    sc = np.zeros(4, np.int64)
    sqx = _ZERO
    sq2 = _ZERO
    for ib in range(nsub):
        l = max(0, min(7, nearest_int(_HALF * (idv * scales[ib] - _ONE))))
        sc[ib // 4] |= l << (3 * (ib % 4))
        # shift bits: 0x08 for the first group, 0x80 for the second
        out[o_qh + ib] |= (0x08 if shifts[ib] >= 2 else 0) | (0x80 if shifts[ib] % 2 else 0)
        xb = x[16 * ib:16 * ib + 16]
        qh = np.int64(out[o_qh + ib])
        for k in range(2):
            xx = _iq1m_values(shifts[ib], k)
            g = np.int64(out[o_qs + 2 * ib + k]) + ((qh << (8 - 4 * k)) & 0x700)
            for j in range(8):
                wj = xb[8 * k + j] * xb[8 * k + j]
                q = xx[(gpos[g, j] - 1) // 2] * _F(2 * l + 1)
                sqx += wj * q * xb[8 * k + j]
                sq2 += wj * q * q
    if sq2 > _ZERO:
        d = sqx / sq2
    h = _fp16_bits(d * _F(1.1125))
    sc[0] |= (h & 0x000F) << 12
    sc[1] |= (h & 0x00F0) << 8
    sc[2] |= (h & 0x0F00) << 4
    sc[3] |= h & 0xF000
    for i in range(4):
        _put_u16(out, o_sc + 2 * i, sc[i])
    return _OK


# ---------------------------------------------------------------- drivers

_NL = block_format(T.IQ4_NL)
_XS = block_format(T.IQ4_XS)
_3XXS = block_format(T.IQ3_XXS)
_3S = block_format(T.IQ3_S)
_2S = block_format(T.IQ2_S)
_1M = block_format(T.IQ1_M)

_KV = KVALUES_IQ4NL.astype(np.float32)


@njit(nogil=True, cache=True)
def _run_iq4_nl(x, out, status, kv, ntry, o_d, o_qs, fused):
    for i in range(x.shape[0]):
        status[i] = _iq4_nl_block(x[i], out[i], kv, ntry, o_d, o_qs, fused)


@njit(nogil=True, cache=True)
def _run_iq4_xs(x, out, status, kv, o_d, o_sh, o_sl, o_qs):
    for i in range(x.shape[0]):
        status[i] = _iq4_xs_block(x[i], out[i], kv, o_d, o_sh, o_sl, o_qs)


@njit(nogil=True, cache=True)
def _run_iq3_xxs(x, out, status, gpos, kmap, nb_start, nb_count, nb, o_d, o_qs, o_sas):
    for i in range(x.shape[0]):
        status[i] = _iq3_xxs_block(x[i], out[i], gpos, kmap, nb_start, nb_count,
                                   nb, o_d, o_qs, o_sas)


@njit(nogil=True, cache=True)
def _run_iq3_s(x, out, status, gpos, kmap, nb_start, nb_count, nb,
               o_d, o_qs, o_qh, o_signs, o_scales):
    for i in range(x.shape[0]):
        status[i] = _iq3_s_block(x[i], out[i], gpos, kmap, nb_start, nb_count,
                                 nb, o_d, o_qs, o_qh, o_signs, o_scales)


@njit(nogil=True, cache=True)
def _run_iq2_s(x, out, status, gpos, kmap, nb_start, nb_count, nb,
               o_d, o_qs, o_signs, o_qh, o_scales):
    for i in range(x.shape[0]):
        status[i] = _iq2_s_block(x[i], out[i], gpos, kmap, nb_start, nb_count,
                                 nb, o_d, o_qs, o_signs, o_qh, o_scales)


@njit(nogil=True, cache=True)
def _run_iq1_m(x, out, status, gpos, kmap, nb_start, nb_count, nb, o_qs, o_qh, o_sc):
    for i in range(x.shape[0]):
        status[i] = _iq1_m_block(x[i], out[i], gpos, kmap, nb_start, nb_count,
                                 nb, o_qs, o_qh, o_sc)


def _map_blocks(run, x, out, *args) -> np.ndarray:
    """Call the compiled driver `run(x, out, status, *args)` on chunks of
    blocks, in numba's number of Python threads (the drivers release the
    GIL; a parallel=True driver would cost more compile time than it
    saves). Blocks are independent, so the split cannot change a bit.
    Returns the per-block status."""
    n = x.shape[0]
    status = np.zeros(n, np.int8)
    nthreads = numba.get_num_threads()
    chunk = max(64, -(-n // (4 * nthreads)))
    if nthreads <= 1 or n <= chunk:
        run(x, out, status, *args)
        return status

    def task(lo):
        run(x[lo:lo + chunk], out[lo:lo + chunk], status[lo:lo + chunk], *args)

    with ThreadPoolExecutor(nthreads) as ex:
        list(ex.map(task, range(0, n, chunk)))
    return status


def _prepare(x, fmt) -> np.ndarray:
    """Check the (n_blocks, QK) float32 input of a quantizer of `fmt`."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise TypeError(f"{fmt.name} quantizer: expected a float32 numpy array, "
                        f"got {getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim != 2 or x.shape[1] != fmt.block_values:
        raise ValueError(f"{fmt.name} quantizer: expected shape (n_blocks, "
                         f"{fmt.block_values}), got {x.shape}")
    bad = ~np.isfinite(x)
    if bad.any():
        b, j = np.argwhere(bad)[0]
        raise ValueError(f"{fmt.name} quantizer: non-finite input {x[b, j]!r} "
                         f"in block {b}, value {j}; ggml's quantizer has no "
                         f"defined result for NaN or Inf")
    return np.ascontiguousarray(x)


def _check(status, fmt) -> None:
    if status.any():
        b = int(np.flatnonzero(status)[0])
        raise ValueError(f"{fmt.name} quantizer: ggml's quantizer aborts on block "
                         f"{b} ({_ABORT_REASONS[int(status[b])]})")


def _quantize_iq4_nl(x, ntry, fused=False):
    x = _prepare(x, _NL)
    out = np.zeros((x.shape[0], _NL.block_bytes), np.uint8)
    _check(_map_blocks(_run_iq4_nl, x, out, _KV, ntry, _NL.offset("d"), _NL.offset("qs"), fused), _NL)
    return out


@register_quantize(T.IQ4_NL)
def quantize_iq4_nl_ref(x: np.ndarray) -> np.ndarray:
    """IQ4_NL blocks of x, ggml `quantize_row_iq4_nl_ref` (ntry = -1).

    x: float32 (n_blocks, 32), finite. Returns uint8 (n_blocks, 18) in the
    IQ4_NL layout. Per block: d0 = max/-127 with max the first value of
    largest |x|; codes = nearest of `kvalues_iq4nl` to x/d0; d = the
    weighted (x^2) least-squares scale of those codes, stored as fp16. A
    block with max |x| < 1e-15 gets d = 0 and codes 0x88 (see the module
    docstring). Errors: TypeError for a non-float32 array, ValueError for a
    bad shape or NaN/Inf input.
    """
    return _quantize_iq4_nl(x, -1)


def quantize_iq4_nl_chunk(x: np.ndarray) -> np.ndarray:
    """IQ4_NL blocks of x as ggml `ggml_quantize_chunk` makes them without an
    importance matrix (`quantize_iq4_nl`, ntry = 7: 15 more trial scales
    (-127 + t)/max, t in -7..7, and the codes redone with the final d).

    This is what llama.cpp's `llama-quantize` writes. Shapes, dtypes and
    errors as `quantize_iq4_nl_ref`.
    """
    return _quantize_iq4_nl(x, 7)


@register_quantize(T.IQ4_XS)
def quantize_iq4_xs_ref(x: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks of x, ggml `quantize_row_iq4_xs_ref` (= `quantize_iq4_xs`
    without an importance matrix).

    x: float32 (n_blocks, 256), finite. Returns uint8 (n_blocks, 136). Each
    32-value sub-block gets a scale as IQ4_NL's chunk quantizer finds it
    (ntry = 7); d = -max_scale/32 as fp16, 6-bit sub-block scales
    nearest_int(s/d) clamped to -32..31 (stored + 32), codes redone with
    each sub-block's d*l. Errors as `quantize_iq4_nl_ref`.
    """
    x = _prepare(x, _XS)
    out = np.zeros((x.shape[0], _XS.block_bytes), np.uint8)
    _check(_map_blocks(_run_iq4_xs, x, out, _KV, _XS.offset("d"), _XS.offset("scales_h"),
                       _XS.offset("scales_l"), _XS.offset("qs")), _XS)
    return out


def _grid_args(name):
    m = grid_map(name)
    return m.pos, m.kmap, m.nb_start, m.nb_count, m.nb


@register_quantize(T.IQ3_XXS)
def quantize_iq3_xxs_ref(x: np.ndarray) -> np.ndarray:
    """IQ3_XXS blocks of x, ggml `quantize_row_iq3_xxs_ref`
    (`quantize_row_iq3_xxs_impl` with the 256-row grid, no importance matrix).

    x: float32 (n_blocks, 256), finite. Returns uint8 (n_blocks, 98). Per
    32-value sub-block (weights x^2): signs made even per 8 values by
    flipping the least important one; 31 trial scales
    (15 + 0.2*is)/max, groups of 4 levels mapped to `iq3xxs_grid` rows or
    their nearest rows; d = max_scale/31 * 1.0125 as fp16, 4-bit scales.
    Errors as `quantize_iq4_nl_ref`, plus ValueError where ggml aborts.
    """
    x = _prepare(x, _3XXS)
    out = np.zeros((x.shape[0], _3XXS.block_bytes), np.uint8)
    _check(_map_blocks(_run_iq3_xxs, x, out, *_grid_args("iq3xxs"), _3XXS.offset("d"),
                        _3XXS.offset("qs"), _3XXS.offset("scales_and_signs")), _3XXS)
    return out


@register_quantize(T.IQ3_S)
def quantize_iq3_s_ref(x: np.ndarray) -> np.ndarray:
    """IQ3_S blocks of x, ggml `quantize_row_iq3_s_ref` (`quantize_iq3_s`,
    sub-blocks of 32, the 512-row grid, no importance matrix).

    x: float32 (n_blocks, 256), finite. Returns uint8 (n_blocks, 110).
    As IQ3_XXS but with 8 raw sign bits per 8 values, 19 trial scales
    (15 + 0.2*is)/max, 9-bit grid indices (high bits in qh), and
    d = max_scale/31 * 1.033. ggml's position slip after an all-zero
    sub-block is kept (module docstring). Errors as `quantize_iq3_xxs_ref`.
    """
    x = _prepare(x, _3S)
    out = np.zeros((x.shape[0], _3S.block_bytes), np.uint8)
    _check(_map_blocks(_run_iq3_s, x, out, *_grid_args("iq3s"), _3S.offset("d"), _3S.offset("qs"),
                      _3S.offset("qh"), _3S.offset("signs"), _3S.offset("scales")), _3S)
    return out


@register_quantize(T.IQ2_S)
def quantize_iq2_s_ref(x: np.ndarray) -> np.ndarray:
    """IQ2_S blocks of x, ggml `quantize_row_iq2_s_ref` (`quantize_iq2_s`,
    no importance matrix).

    x: float32 (n_blocks, 256), finite. Returns uint8 (n_blocks, 82). Per
    16-value sub-block (weights sigma2/4 + x^2, sigma2 = 2*sum(x^2)/256):
    19 trial scales (5 + 0.1*is)/max, groups of 8 levels in 0..2 mapped to
    `iq2s_grid` rows or their nearest rows; d = max_scale/31 * 0.9875 as
    fp16, 4-bit scales. Errors as `quantize_iq3_xxs_ref`.
    """
    x = _prepare(x, _2S)
    out = np.zeros((x.shape[0], _2S.block_bytes), np.uint8)
    _check(_map_blocks(_run_iq2_s, x, out, *_grid_args("iq2s"), _2S.offset("d"), _2S.offset("qs"),
                      _2S.offset("signs"), _2S.offset("qh"), _2S.offset("scales")), _2S)
    return out


@register_chunk_quantize(T.IQ1_M)
def quantize_iq1_m_chunk(x: np.ndarray) -> np.ndarray:
    """IQ1_M blocks of x as ggml `ggml_quantize_chunk` makes them without an
    importance matrix (`quantize_iq1_m`, weights x^2). Not a registered
    reference quantizer: ggml's type traits have no `from_float_ref` for
    IQ1_M (module docstring); this is for comparison with that entry point
    (registered as a chunk quantizer).

    x: float32 (n_blocks, 256), finite. Returns uint8 (n_blocks, 56). Per
    16-value sub-block: the exhaustive best split of the sorted values into
    codes -1/0/1 with a +-1/8 shift per group of 8 (ties in the sort by
    index, as glibc's stable qsort), groups off the 2048-row grid mapped to
    their nearest rows; 3-bit scales of d = max_scale/15, the super-block
    scale refitted over all sub-blocks and stored as fp16(d * 1.1125) in
    the scales' top nibbles. Errors as `quantize_iq3_xxs_ref`.
    """
    x = _prepare(x, _1M)
    out = np.zeros((x.shape[0], _1M.block_bytes), np.uint8)
    _check(_map_blocks(_run_iq1_m, x, out, *_grid_args("iq1s"), _1M.offset("qs"),
                       _1M.offset("qh"), _1M.offset("scales")), _1M)
    return out
