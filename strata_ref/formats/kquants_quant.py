"""Reference quantizers of the K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.

Each follows ggml `quantize_row_<type>_ref` (ggml-org/ggml src/ggml-quants.c
@ d99724f2) with its helpers `make_qx_quants` (rmse_type 1, no weights),
`make_q3_quants` (with the RMSE search), `make_qkx2_quants` and
`get_scale_min_k4`, statement by statement in float32 and without FMA
contraction: every `a*b + c` is two roundings, sums run sequentially in the
C loop order, an int meets a float as `(float)int`, divisions stay divisions
and reciprocals stay `1/x` followed by a multiply. The searches compare with
the C operators (strict `<`, `>`), so ties resolve as in C. ggml builds that
contract to FMA give other bytes for 0.02 %-29 % of blocks
(../shared/spec/formats.md §8); this module pins the portable build.

Scratch arrays hold ggml's `L` values as int64; their C types (int8/uint8)
never wrap here because every value is clamped to a small range first.
"""
import numpy as np
from numba import njit

from ..blocks import scale_min_k4
from ..types import GGMLType, block_format
from ._bytes import f16 as f16_value
from ._qdrive import register_block_quantizer
from ._qnum import f32_bits, fp16_store, nearest_int, store_u32, to_i8

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_GROUP_MAX_EPS = np.float32(1e-15)        # ggml GROUP_MAX_EPS (1e-15f)
_TENTH = np.float32(0.1)                   # the 0.1f of ggml's scale searches

_Q2 = block_format(GGMLType.Q2_K)
_Q3 = block_format(GGMLType.Q3_K)
_Q4 = block_format(GGMLType.Q4_K)
_Q5 = block_format(GGMLType.Q5_K)
_Q6 = block_format(GGMLType.Q6_K)
_Q8 = block_format(GGMLType.Q8_K)

Q2_SC, Q2_QS, Q2_D, Q2_DMIN = (_Q2.offset(f) for f in ("scales", "qs", "d", "dmin"))
Q3_HM, Q3_QS, Q3_SC, Q3_D = (_Q3.offset(f) for f in ("hmask", "qs", "scales", "d"))
Q4_D, Q4_DMIN, Q4_SC, Q4_QS = (_Q4.offset(f) for f in ("d", "dmin", "scales", "qs"))
Q5_D, Q5_DMIN, Q5_SC, Q5_QH, Q5_QS = (_Q5.offset(f) for f in ("d", "dmin", "scales", "qh", "qs"))
Q6_QL, Q6_QH, Q6_SC, Q6_D = (_Q6.offset(f) for f in ("ql", "qh", "scales", "d"))
Q8_D, Q8_QS, Q8_BS = (_Q8.offset(f) for f in ("d", "qs", "bsums"))
Q3_NHM = _Q3.field("hmask").count          # 32: high bits of 8 runs of 32


@njit(inline="always", cache=True, error_model="numpy")
def clamp(v, lo, hi):
    """ggml's `MAX(lo, MIN(hi, v))`."""
    return max(lo, min(hi, v))


@njit(inline="always", cache=True, error_model="numpy")
def f(v):
    """An integer as the float32 C converts it to (exact: |v| < 2^24)."""
    return np.float32(v)


# ---------------------------------------------------------------- helpers

@njit(inline="always", cache=True, error_model="numpy")
def signed_amax(x):
    """(amax, max): `if (ax > amax) { amax = ax; max = x[i]; }` from 0."""
    amax = _F0
    mx = _F0
    for i in range(x.shape[0]):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    return amax, mx


@njit(cache=True, error_model="numpy")
def make_qx_quants_rmse1(x, nmax, L):
    """ggml `make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL)`: weights x²,
    a start at -nmax/max, then 18 trial scales -(nmax + 0.1·is)/max, is = ±1..±9,
    kept when sumlx² > best·suml2. L[i] gets the code + nmax. Returns the scale."""
    n = x.shape[0]
    amax, mx = signed_amax(x)
    if amax < _GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    iscale = f(-nmax) / mx
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1)
        L[i] = l + nmax
        w = x[i] * x[i]
        sumlx += w * x[i] * f(l)
        suml2 += w * f(l) * f(l)
    scale = sumlx / suml2 if suml2 != _F0 else _F0
    best = scale * sumlx
    for k in range(-9, 10):
        if k == 0:
            continue
        iscale = -(f(nmax) + _TENTH * f(k)) / mx
        sumlx = _F0
        suml2 = _F0
        for i in range(n):
            l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1)
            w = x[i] * x[i]
            sumlx += w * x[i] * f(l)
            suml2 += w * f(l) * f(l)
        if suml2 > _F0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1)
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True, error_model="numpy")
def make_q3_quants_rmse(x, nmax, L):
    """ggml `make_q3_quants(n, nmax, x, L, do_rmse=true)`: codes at -nmax/max,
    then up to 5 passes that move single codes when the weighted (x²) fit
    improves. L[i] gets the code + nmax. Returns the scale."""
    n = x.shape[0]
    amax, mx = signed_amax(x)
    if amax < _GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    iscale = f(-nmax) / mx
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1)
        L[i] = l
        w = x[i] * x[i]
        sumlx += w * x[i] * f(l)
        suml2 += w * f(l) * f(l)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            slx = sumlx - w * x[i] * f(L[i])
            if slx > _F0:
                sl2 = suml2 - w * f(L[i]) * f(L[i])
                new_l = clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1)
                if new_l != L[i]:
                    slx += w * x[i] * f(new_l)
                    sl2 += w * f(new_l) * f(new_l)
                    if sl2 > _F0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > _F0 else _F0


@njit(cache=True, error_model="numpy")
def make_qkx2_quants(x, nmax, weights, L, Laux, rmin, rdelta, nstep, use_mad):
    """ggml `make_qkx2_quants`: affine codes 0..nmax for x ≈ scale·L - the_min,
    min clipped to <= 0, then nstep+1 trial scales (rmin + rdelta·is + nmax)/(max-min)
    fitted by weighted least squares, kept when the weighted error (|diff| if
    use_mad else diff²) drops. Returns (scale, the_min); the_min = -min."""
    n = x.shape[0]
    mn = x[0]
    mx = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if mn > _F0:
        mn = _F0
    if mx == mn:
        for i in range(n):
            L[i] = 0
        return _F0, -mn
    iscale = f(nmax) / (mx - mn)
    scale = _F1 / iscale
    best_error = _F0
    for i in range(n):
        L[i] = clamp(nearest_int(iscale * (x[i] - mn)), 0, nmax)
        diff = scale * f(L[i]) + mn - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_error += weights[i] * diff
    if nstep < 1:
        return scale, -mn
    for k in range(nstep + 1):
        iscale = (rmin + rdelta * f(k) + f(nmax)) / (mx - mn)
        sum_l = _F0
        sum_l2 = _F0
        sum_xl = _F0
        for i in range(n):
            l = clamp(nearest_int(iscale * (x[i] - mn)), 0, nmax)
            Laux[i] = l
            w = weights[i]
            sum_l += w * f(l)
            sum_l2 += w * f(l) * f(l)
            sum_xl += w * f(l) * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > _F0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > _F0:
                this_min = _F0
                this_scale = sum_xl / sum_l2
            cur_error = _F0
            for i in range(n):
                diff = this_scale * f(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += weights[i] * diff
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(inline="always", cache=True, error_model="numpy")
def pack_2bit(L, b, o):
    """ggml's Q2_K/Q3_K packing: byte 32h + l holds L[128h + l + 32s] in bits 2s."""
    for h in range(0, 256, 128):
        for l in range(32):
            b[o + h // 4 + l] = (L[h + l] | (L[h + l + 32] << 2) | (L[h + l + 64] << 4)
                                 | (L[h + l + 96] << 6)) & 0xFF


@njit(inline="always", cache=True, error_model="numpy")
def pack_scales_k4(b, o, j, ls, lm):
    """ggml's Q4_K/Q5_K 6-bit scale packing of (ls, lm) for sub-block j."""
    if j < 4:
        b[o + j] = ls
        b[o + j + 4] = lm
    else:
        b[o + j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
        b[o + j - 4] |= (ls >> 4) << 6
        b[o + j] |= (lm >> 4) << 6


@njit(inline="always", cache=True, error_model="numpy")
def affine_6bit_scales(x, b, nmax, rmin, nstep, o_d, o_dmin, o_sc, L):
    """The part Q4_K and Q5_K share: per 32 values weights av_x + |x| with
    av_x = sqrtf(Σx²/32), make_qkx2_quants, 6-bit scales and mins relative to
    their maxima (63/max), d = max_scale/63, dmin = max_min/63; then the codes
    are recomputed from the stored scales as nearest_int((x + dm)/d)."""
    weights = np.empty(32, np.float32)
    Laux = np.empty(32, np.int64)
    scales = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    max_scale = _F0
    max_min = _F0
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        sum_x2 = _F0
        for l in range(32):
            sum_x2 += xs[l] * xs[l]
        av_x = np.sqrt(sum_x2 / np.float32(32.0))
        for l in range(32):
            weights[l] = av_x + abs(xs[l])
        sc, mn = make_qkx2_quants(xs, nmax, weights, L[32 * j:32 * j + 32], Laux,
                                  rmin, _TENTH, nstep, False)
        scales[j] = sc
        mins[j] = mn
        if sc > max_scale:
            max_scale = sc
        if mn > max_min:
            max_min = mn
    inv_scale = np.float32(63.0) / max_scale if max_scale > _F0 else _F0
    inv_min = np.float32(63.0) / max_min if max_min > _F0 else _F0
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        pack_scales_k4(b, o_sc, j, ls, lm)
    dd = fp16_store(b, o_d, max_scale / np.float32(63.0))
    dmin = fp16_store(b, o_dmin, max_min / np.float32(63.0))
    for j in range(8):
        sc, m = scale_min_k4(b, o_sc, j)
        d = dd * f(sc)
        if d == _F0:
            continue
        dm = dmin * f(m)
        for ii in range(32):
            L[32 * j + ii] = clamp(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax)


# ---------------------------------------------------------------- block functions

@njit(cache=True, error_model="numpy")
def quant_q2_k(x, b):
    """ggml `quantize_row_q2_K_ref`, one super-block: per 16 values
    make_qkx2_quants(nmax 3, weights |x|, rmin -0.5, rdelta 0.1, 15 steps, MAD),
    4-bit scales/mins relative to their maxima (15/max), codes recomputed as
    nearest_int((x + dm)/d)."""
    L = np.zeros(256, np.int64)
    Laux = np.empty(16, np.int64)
    weights = np.empty(16, np.float32)
    scales = np.empty(16, np.float32)
    mins = np.empty(16, np.float32)
    max_scale = _F0
    max_min = _F0
    for j in range(16):
        xs = x[16 * j:16 * j + 16]
        for l in range(16):
            weights[l] = abs(xs[l])
        sc, mn = make_qkx2_quants(xs, 3, weights, L[16 * j:16 * j + 16], Laux,
                                  np.float32(-0.5), _TENTH, 15, True)
        scales[j] = sc
        mins[j] = mn
        if sc > max_scale:
            max_scale = sc
        if mn > max_min:
            max_min = mn
    q4scale = np.float32(15.0)
    if max_scale > _F0:
        iscale = q4scale / max_scale
        for j in range(16):
            b[Q2_SC + j] = nearest_int(iscale * scales[j]) & 0xFF
        fp16_store(b, Q2_D, max_scale / q4scale)
    else:
        fp16_store(b, Q2_D, _F0)
    if max_min > _F0:
        iscale = q4scale / max_min
        for j in range(16):
            b[Q2_SC + j] |= (nearest_int(iscale * mins[j]) << 4) & 0xFF
        fp16_store(b, Q2_DMIN, max_min / q4scale)
    else:
        fp16_store(b, Q2_DMIN, _F0)
    dd = f16_value(b, Q2_D)
    dmin = f16_value(b, Q2_DMIN)
    for j in range(16):
        d = dd * f(np.int64(b[Q2_SC + j]) & 0xF)
        if d == _F0:
            continue
        dm = dmin * f(np.int64(b[Q2_SC + j]) >> 4)
        for ii in range(16):
            L[16 * j + ii] = clamp(nearest_int((x[16 * j + ii] + dm) / d), 0, 3)
    pack_2bit(L, b, Q2_QS)


@njit(cache=True, error_model="numpy")
def quant_q3_k(x, b):
    """ggml `quantize_row_q3_K_ref`, one super-block: per 16 values
    make_q3_quants(nmax 4, RMSE search), signed 6-bit scales relative to the
    scale of largest magnitude (-32/max), codes recomputed as nearest_int(x/d),
    the 3rd bit of each code in hmask."""
    L = np.zeros(256, np.int64)
    scales = np.empty(16, np.float32)
    max_scale = _F0
    amax = _F0
    for j in range(16):
        scales[j] = make_q3_quants_rmse(x[16 * j:16 * j + 16], 4, L[16 * j:16 * j + 16])
        s = abs(scales[j])
        if s > amax:
            amax = s
            max_scale = scales[j]
    if max_scale != _F0:
        iscale = np.float32(-32.0) / max_scale
        for j in range(16):
            l = clamp(to_i8(nearest_int(iscale * scales[j])), -32, 31) + 32
            if j < 8:
                b[Q3_SC + j] = l & 0xF
            else:
                b[Q3_SC + j - 8] |= (l & 0xF) << 4
            l >>= 4
            b[Q3_SC + j % 4 + 8] |= l << (2 * (j // 4))
        fp16_store(b, Q3_D, _F1 / iscale)
    else:
        fp16_store(b, Q3_D, _F0)
    dd = f16_value(b, Q3_D)
    for j in range(16):
        sc = np.int64(b[Q3_SC + j]) & 0xF if j < 8 else np.int64(b[Q3_SC + j - 8]) >> 4
        sc = (sc | (((np.int64(b[Q3_SC + 8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32
        d = dd * f(sc)
        if d == _F0:
            continue
        for ii in range(16):
            L[16 * j + ii] = clamp(nearest_int(x[16 * j + ii] / d), -4, 3) + 4
    m = 0
    hm = 1
    for j in range(256):
        if L[j] > 3:
            b[Q3_HM + m] |= hm
            L[j] -= 4
        m += 1
        if m == Q3_NHM:
            m = 0
            hm <<= 1
    pack_2bit(L, b, Q3_QS)


@njit(cache=True, error_model="numpy")
def quant_q4_k(x, b):
    """ggml `quantize_row_q4_K_ref`, one super-block: make_qkx2_quants(nmax 15,
    rmin -1, rdelta 0.1, 20 steps) per 32 values, 6-bit scales and mins; two
    4-bit codes per byte (values l and l+32 of each 64)."""
    L = np.zeros(256, np.int64)
    affine_6bit_scales(x, b, 15, np.float32(-1.0), 20, Q4_D, Q4_DMIN, Q4_SC, L)
    for j in range(0, 256, 64):
        for l in range(32):
            b[Q4_QS + j // 2 + l] = L[j + l] | (L[j + l + 32] << 4)


@njit(cache=True, error_model="numpy")
def quant_q5_k(x, b):
    """ggml `quantize_row_q5_K_ref`, one super-block: make_qkx2_quants(nmax 31,
    rmin -0.5, rdelta 0.1, 15 steps) per 32 values, 6-bit scales and mins; low
    4 bits as Q4_K, the 5th bit of values n+j / n+j+32 in qh[j] bits 2c / 2c+1."""
    L = np.zeros(256, np.int64)
    affine_6bit_scales(x, b, 31, np.float32(-0.5), 15, Q5_D, Q5_DMIN, Q5_SC, L)
    m1 = 1
    m2 = 2
    for n in range(0, 256, 64):
        for j in range(32):
            l1 = L[n + j]
            if l1 > 15:
                l1 -= 16
                b[Q5_QH + j] |= m1
            l2 = L[n + j + 32]
            if l2 > 15:
                l2 -= 16
                b[Q5_QH + j] |= m2
            b[Q5_QS + n // 2 + j] = l1 | (l2 << 4)
        m1 <<= 2
        m2 <<= 2


@njit(cache=True, error_model="numpy")
def quant_q6_k(x, b):
    """ggml `quantize_row_q6_K_ref`, one super-block: make_qx_quants(nmax 32,
    rmse_type 1) per 16 values, int8 scales relative to the scale of largest
    magnitude (-128/max, capped at 127), codes recomputed as nearest_int(x/d);
    an (almost) all-zero super-block is all zero bytes."""
    L = np.zeros(256, np.int64)
    scales = np.empty(16, np.float32)
    max_scale = _F0
    max_abs = _F0
    for ib in range(16):
        s = make_qx_quants_rmse1(x[16 * ib:16 * ib + 16], 32, L[16 * ib:16 * ib + 16])
        scales[ib] = s
        if abs(s) > max_abs:
            max_abs = abs(s)
            max_scale = s
    if max_abs < _GROUP_MAX_EPS:
        fp16_store(b, Q6_D, _F0)
        return
    iscale = np.float32(-128.0) / max_scale
    dd = fp16_store(b, Q6_D, _F1 / iscale)
    for ib in range(16):
        b[Q6_SC + ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF
    for j in range(16):
        d = dd * f(to_i8(np.int64(b[Q6_SC + j])))
        if d == _F0:
            continue
        for ii in range(16):
            L[16 * j + ii] = clamp(nearest_int(x[16 * j + ii] / d), -32, 31) + 32
    for j in range(0, 256, 128):
        ql = Q6_QL + j // 2
        qh = Q6_QH + j // 4
        for l in range(32):
            q1 = L[j + l] & 0xF
            q2 = L[j + l + 32] & 0xF
            q3 = L[j + l + 64] & 0xF
            q4 = L[j + l + 96] & 0xF
            b[ql + l] = q1 | (q3 << 4)
            b[ql + l + 32] = q2 | (q4 << 4)
            b[qh + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2)
                         | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6))


@njit(cache=True, error_model="numpy")
def quant_q8_k(x, b):
    """ggml `quantize_row_q8_K_ref`, one super-block: iscale = -127/max (max =
    the first element of largest magnitude), q = min(127, nearest_int(iscale·x)),
    bsums = Σq per 16, f32 d = 1/iscale; an all-zero block gives d = 0, q = 0
    (and bsums 0 here; C leaves them untouched)."""
    amax, mx = signed_amax(x)
    if amax == _F0:
        return
    iscale = np.float32(-127.0) / mx
    for j in range(16):
        s = 0
        for ii in range(16):
            q = to_i8(min(127, nearest_int(iscale * x[16 * j + ii])))
            b[Q8_QS + 16 * j + ii] = q & 0xFF
            s += q
        b[Q8_BS + 2 * j] = s & 0xFF
        b[Q8_BS + 2 * j + 1] = (s >> 8) & 0xFF
    store_u32(b, Q8_D, f32_bits(_F1 / iscale))


for _t, _fn in ((GGMLType.Q2_K, quant_q2_k), (GGMLType.Q3_K, quant_q3_k),
                (GGMLType.Q4_K, quant_q4_k), (GGMLType.Q5_K, quant_q5_k),
                (GGMLType.Q6_K, quant_q6_k), (GGMLType.Q8_K, quant_q8_k)):
    register_block_quantizer(_t, _fn)
