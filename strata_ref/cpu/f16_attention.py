"""Attention over an F16 KV cache without flash attention, as llama.cpp's
`build_attn_mha` computes it on the CPU (`ggml_mul_mat` of the F16 K and V
with q and the softmax probabilities rounded to F16, `ggml_soft_max_ext`),
in the float order of each CPU profile's build, vectorized.

The dots (`ops.f16_products` states the orders; ggml-cpu `vec.cpp`
`ggml_vec_dot_f16` and llamafile `tinyBLAS`):

* K q, one dot per (query head, cell) over head_dim, in the lanes of the
  build: `ggml_vec_dot_f16` (four accumulators of 8 lanes over steps of 32
  on AVX2, of 16 over steps of 64 on AVX-512, reduced as
  `GGML_F32x8_REDUCE` / `GGML_F32x16_REDUCE`, the rest of the row in
  double; every product in double on the baseline build), or tinyBLAS (8 or
  16 lanes, one FMA per element, `hsum`) when ggml hands the product to
  llamafile (two or more tokens; `ops._tinyblas_takes`).
* V p, one dot per (query head, dimension) over the cells: the same two
  orders, where lane k of the dot of dimension d takes the cells c = k mod
  lanes. The kernel runs all dimensions at once: for cell c it adds p[c] *
  V[c, :] into the accumulator row of lane c mod lanes, a vector over d,
  then reduces the lanes of every d in the build's tree. Each (d, lane)
  gets the same FMAs in the same order as ggml's dot of d.

F16 values widen exactly (`vcvtph2ps`), q and p are rounded to F16 (RNE)
as ggml's F16 mat-mul converts its float32 operand. The K and V rows are
read from the cache's F16 bits in place: nothing is converted ahead.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..numerics import F16_TO_F32
from .act_quant import round_to_f16
from .fp import fma32, hsum8, hsum16
from .attention import check_attention_args
from .ops import _reduce_f32x8, _soft_max_row, _tinyblas_takes
from .simd import (HOST_F16C, f8_add, f8_f16_load, f8_fma, f8_hsum, f8_hsum16, f8_lane, f8_load,
                   f8_round_f16, f8_splat, f8_store, f8_zero)

__all__ = ["attention"]

_F32 = np.float32
_TABLE = F16_TO_F32


@njit(inline="always", cache=True)
def _h8(a, off):
    """F32x8 of the fp16 bits a[off:off + 8] (uint16)."""
    if HOST_F16C:
        return f8_f16_load(a, off)
    t = np.empty(8, np.float32)
    for i in range(8):
        t[i] = _TABLE[a[off + i]]
    return f8_load(t, 0)


@njit(inline="always", cache=True)
def _round_row_f16(src, dst, n):
    """dst[:n] = src[:n] rounded to fp16 (RNE) as float32 values."""
    main = n - n % 8 if HOST_F16C else 0
    for i in range(0, main, 8):
        f8_store(dst, i, f8_round_f16(f8_load(src, i)))
    for i in range(main, n):
        dst[i] = round_to_f16(src[i])


@njit(inline="always", cache=True)
def _reduce8x4(a0, a1, a2, a3):
    """`GGML_F32x8_REDUCE` of four 8-lane accumulators: lanes (a0 + a2) +
    (a1 + a3), then t_i = r[i] + r[4 + i] and (t0 + t1) + (t2 + t3)."""
    r = f8_add(f8_add(a0, a2), f8_add(a1, a3))
    t0 = _F32(f8_lane(r, 0) + f8_lane(r, 4))
    t1 = _F32(f8_lane(r, 1) + f8_lane(r, 5))
    t2 = _F32(f8_lane(r, 2) + f8_lane(r, 6))
    t3 = _F32(f8_lane(r, 3) + f8_lane(r, 7))
    return _F32(_F32(t0 + t1) + _F32(t2 + t3))


@njit(inline="always", cache=True)
def _kq_dot(q, k, ko, hd, arch, tiny):
    """K q of one cell: q float32 (hd,) holding fp16 values, the cell's K at
    k[ko:ko + hd] (fp16 bits), in the order of the build (module
    docstring); float32."""
    if arch == 0:
        tot = 0.0
        for i in range(hd):
            tot += np.float64(_F32(q[i] * _TABLE[k[ko + i]]))
        return _F32(tot)
    if tiny:
        if arch == 2:               # tinyBLAS<16>: 16 lanes, hsum = _mm512_reduce_add_ps
            lo = f8_zero()
            hi = f8_zero()
            for s in range(0, hd, 16):
                lo = f8_fma(f8_load(q, s), _h8(k, ko + s), lo)
                hi = f8_fma(f8_load(q, s + 8), _h8(k, ko + s + 8), hi)
            return f8_hsum16(lo, hi)
        acc = f8_zero()             # tinyBLAS<8>: hsum(__m256)
        for s in range(0, hd, 8):
            acc = f8_fma(f8_load(q, s), _h8(k, ko + s), acc)
        return f8_hsum(acc)
    if arch == 2:                   # four accumulators of 16 lanes over steps of 64
        step = 64
        l0, l1, l2, l3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
        h0, h1, h2, h3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
        main = hd - hd % step
        for s in range(0, main, step):
            l0 = f8_fma(f8_load(q, s), _h8(k, ko + s), l0)
            h0 = f8_fma(f8_load(q, s + 8), _h8(k, ko + s + 8), h0)
            l1 = f8_fma(f8_load(q, s + 16), _h8(k, ko + s + 16), l1)
            h1 = f8_fma(f8_load(q, s + 24), _h8(k, ko + s + 24), h1)
            l2 = f8_fma(f8_load(q, s + 32), _h8(k, ko + s + 32), l2)
            h2 = f8_fma(f8_load(q, s + 40), _h8(k, ko + s + 40), h2)
            l3 = f8_fma(f8_load(q, s + 48), _h8(k, ko + s + 48), l3)
            h3 = f8_fma(f8_load(q, s + 56), _h8(k, ko + s + 56), h3)
        # GGML_F32x16_REDUCE: (x0 + x2) + (x1 + x3) lane-wise, then the lane sum
        tot = np.float64(f8_hsum16(f8_add(f8_add(l0, l2), f8_add(l1, l3)),
                                   f8_add(f8_add(h0, h2), f8_add(h1, h3))))
    else:                           # four accumulators of 8 lanes over steps of 32
        step = 32
        a0, a1, a2, a3 = f8_zero(), f8_zero(), f8_zero(), f8_zero()
        main = hd - hd % step
        for s in range(0, main, step):
            a0 = f8_fma(f8_load(q, s), _h8(k, ko + s), a0)
            a1 = f8_fma(f8_load(q, s + 8), _h8(k, ko + s + 8), a1)
            a2 = f8_fma(f8_load(q, s + 16), _h8(k, ko + s + 16), a2)
            a3 = f8_fma(f8_load(q, s + 24), _h8(k, ko + s + 24), a3)
        tot = np.float64(_reduce8x4(a0, a1, a2, a3))
    for i in range(main, hd):
        tot += np.float64(_F32(q[i] * _TABLE[k[ko + i]]))
    return _F32(tot)


@njit(inline="always", cache=True)
def _vp(p, Tp, T, v, vo, row, hd, arch, tiny, acc, out, oo, vrow):
    """V p of one query head for every dimension: p float32 (Tp,) holding
    fp16 values (Tp a multiple of 64), V's cell c < T at v[vo + c * row:
    + hd] (fp16 bits), zero for the cells T..Tp-1 (as in ggml's padded
    view); out[oo:oo + hd] = the dots in the build's order (module
    docstring). acc: float32 scratch (64, hd); vrow: float32 scratch
    (hd,)."""
    if arch == 0:
        # the baseline build: every product added in double, cell after cell
        tot = np.zeros(hd, np.float64)
        for c in range(Tp):
            pc = p[c]
            for d in range(hd):
                vv = _TABLE[v[vo + c * row + d]] if c < T else _F32(0.0)
                tot[d] += np.float64(_F32(pc * vv))
        for d in range(hd):
            out[oo + d] = _F32(tot[d])
        return
    lanes = (16 if arch == 2 else 8) if tiny else (64 if arch == 2 else 32)
    hd8 = hd - hd % 8 if HOST_F16C else 0
    for k in range(lanes):
        for d in range(hd):
            acc[k, d] = 0.0
    for c in range(Tp):
        pc = p[c]
        pv = f8_splat(pc)
        a = acc[c % lanes]
        for d in range(0, hd8, 8):
            vv = _h8(v, vo + c * row + d) if c < T else f8_zero()
            f8_store(a, d, f8_fma(pv, vv, f8_load(a, d)))
        for d in range(hd8, hd):
            vs = _TABLE[v[vo + c * row + d]] if c < T else _F32(0.0)
            a[d] = fma32(pc, vs, a[d])
    # the lanes of every d reduced in the build's tree, 8 columns at a time
    for d in range(0, hd8, 8):
        if tiny:
            if arch == 2:
                _hsum16_rows(acc, d, vrow)
            else:
                _hsum8_rows(acc, d, vrow)
        elif arch == 2:
            # GGML_F32x16_REDUCE: x_l = (A[l] + A[32+l]) + (A[16+l] + A[48+l]), then hsum16
            for l in range(16):
                x = f8_add(f8_add(f8_load(acc[l], d), f8_load(acc[32 + l], d)),
                           f8_add(f8_load(acc[16 + l], d), f8_load(acc[48 + l], d)))
                f8_store(acc[l], d, x)
            _hsum16_rows(acc, d, vrow)
        else:
            # GGML_F32x8_REDUCE: r_l = (A[l] + A[16+l]) + (A[8+l] + A[24+l]), then
            # t_i = r_i + r_{4+i}, (t0 + t1) + (t2 + t3)
            for l in range(8):
                x = f8_add(f8_add(f8_load(acc[l], d), f8_load(acc[16 + l], d)),
                           f8_add(f8_load(acc[8 + l], d), f8_load(acc[24 + l], d)))
                f8_store(acc[l], d, x)
            t0 = f8_add(f8_load(acc[0], d), f8_load(acc[4], d))
            t1 = f8_add(f8_load(acc[1], d), f8_load(acc[5], d))
            t2 = f8_add(f8_load(acc[2], d), f8_load(acc[6], d))
            t3 = f8_add(f8_load(acc[3], d), f8_load(acc[7], d))
            f8_store(vrow, d, f8_add(f8_add(t0, t1), f8_add(t2, t3)))
    col = np.empty(64, np.float32)
    for d in range(hd8, hd):
        # the same trees on one column (no whole vector of columns left)
        for k in range(lanes):
            col[k] = acc[k, d]
        if tiny:
            vrow[d] = hsum16(col) if arch == 2 else hsum8(col)
        elif arch == 2:
            for l in range(16):
                col[l] = _F32(_F32(col[l] + col[32 + l]) + _F32(col[16 + l] + col[48 + l]))
            vrow[d] = hsum16(col)
        else:
            vrow[d] = _reduce_f32x8(col)
    for d in range(hd):
        out[oo + d] = vrow[d]


@njit(inline="always", cache=True)
def _hsum8_rows(acc, d, dst):
    """dst[d:d+8] = hsum_float_8 of acc[0..7, d:d+8], per column: s_i =
    v[4+i] + v[i], (s0 + s2) + (s1 + s3)."""
    s0 = f8_add(f8_load(acc[4], d), f8_load(acc[0], d))
    s1 = f8_add(f8_load(acc[5], d), f8_load(acc[1], d))
    s2 = f8_add(f8_load(acc[6], d), f8_load(acc[2], d))
    s3 = f8_add(f8_load(acc[7], d), f8_load(acc[3], d))
    f8_store(dst, d, f8_add(f8_add(s0, s2), f8_add(s1, s3)))


@njit(inline="always", cache=True)
def _hsum16_rows(acc, d, dst):
    """dst[d:d+8] = `_mm512_reduce_add_ps` of acc[0..15, d:d+8], per column:
    t_i = v[8+i] + v[i], u_i = t[4+i] + t[i], w_i = u[2+i] + u[i], w0 +
    w1."""
    t0 = f8_add(f8_load(acc[8], d), f8_load(acc[0], d))
    t1 = f8_add(f8_load(acc[9], d), f8_load(acc[1], d))
    t2 = f8_add(f8_load(acc[10], d), f8_load(acc[2], d))
    t3 = f8_add(f8_load(acc[11], d), f8_load(acc[3], d))
    t4 = f8_add(f8_load(acc[12], d), f8_load(acc[4], d))
    t5 = f8_add(f8_load(acc[13], d), f8_load(acc[5], d))
    t6 = f8_add(f8_load(acc[14], d), f8_load(acc[6], d))
    t7 = f8_add(f8_load(acc[15], d), f8_load(acc[7], d))
    u0 = f8_add(t4, t0)
    u1 = f8_add(t5, t1)
    u2 = f8_add(t6, t2)
    u3 = f8_add(t7, t3)
    f8_store(dst, d, f8_add(f8_add(u2, u0), f8_add(u3, u1)))


@njit(cache=True)
def _attention(q, kbits, vbits, T, pos, kq_scale, n_swa, batched, arch, sinks, has_sinks, out):
    # q (n, H, hd) float32; kbits / vbits (Hkv, >= T, row) uint16, the
    # layer's F16 cache; out (n, H * hd). One query head at a time: q
    # rounded to F16, K q for the T cells, soft_max, p rounded to F16, V p.
    n, H, hd = q.shape
    Hkv, ctx, row = kbits.shape
    G = H // Hkv
    Tp = T + (-T % 64)
    kf = kbits.reshape(-1)
    vf = vbits.reshape(-1)
    qf = np.empty(hd, np.float32)
    srow = np.empty(max(T, 1), np.float32)
    w = np.empty(Tp, np.float32)
    p = np.empty(Tp, np.float32)
    acc = np.empty((64, hd), np.float32)
    vrow = np.empty(hd, np.float32)
    qrow = np.empty(hd, np.float32)
    # K q: ggml's m is the KV length (a multiple of 256 in llama.cpp); V p:
    # m is head_dim, k the padded KV length
    tiny_kq = _tinyblas_takes(arch, batched, hd, 256)
    tiny_vp = _tinyblas_takes(arch, batched, Tp, hd)
    for h in range(Hkv):
        base = h * ctx * row
        for t in range(n):
            for g in range(G):
                head = h * G + g
                for d in range(hd):
                    qrow[d] = q[t, head, d]
                _round_row_f16(qrow, qf, hd)
                for c in range(T):
                    srow[c] = _kq_dot(qf, kf, base + c * row, hd, arch, tiny_kq)
                _soft_max_row(srow, T, kq_scale, pos[t], n_swa, w, p, arch, has_sinks, sinks[head])
                _round_row_f16(p, p, Tp)
                _vp(p, Tp, T, vf, base, row, hd, arch, tiny_vp, acc, out[t], head * hd, vrow)


def _check_f16_args(q, kbits, vbits, T, pos, n_swa) -> None:
    for name, a in (("kbits", kbits), ("vbits", vbits)):
        if not isinstance(a, np.ndarray) or a.dtype != np.uint16 or a.ndim != 3:
            got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
            raise ValueError(f"attention: {name} must be uint16 (n_head_kv, cells, head_dim), got {got}")
    check_attention_args(q, kbits, vbits, T, pos, n_swa)
    if kbits.shape[2] != q.shape[2] or vbits.shape[2] != q.shape[2]:
        raise ValueError(f"attention: K / V head_dim {kbits.shape[2]} / {vbits.shape[2]} "
                         f"is not q's {q.shape[2]}")


def attention(q: np.ndarray, kbits: np.ndarray, vbits: np.ndarray, T: int, pos: np.ndarray,
              kq_scale: float, profile, n_swa: int = 0, sinks: np.ndarray | None = None) -> np.ndarray:
    """softmax(K q * kq_scale + mask) V for every query head, as llama.cpp's
    non-flash attention computes it on `profile`, in one call: q rounded to
    F16, K q (`ops.f16_products` order), `ops.soft_max` with the causal /
    sliding-window mask, p rounded to F16, V p (`ops.f16_products` order
    over the KV length padded to a multiple of 64). Two or more tokens take
    the tinyBLAS order where the build has it, one the `ggml_vec_dot_f16`
    order, as in ggml.

    q float32 (n, n_head, head_dim) for positions `pos` (int, n); kbits /
    vbits: the layer's F16 cache as uint16 bits (n_head_kv, >= T,
    head_dim), positions 0 .. T-1 valid; query head j uses KV head j //
    (n_head / n_head_kv). sinks: float32 (n_head,) attention-sink logits
    (`ggml_soft_max_add_sinks`, gpt-oss) or None. Returns float32 (n,
    n_head * head_dim). ValueError for arrays of other shapes or dtypes
    (q not 3-D, K and V bits not uint16 (n_head_kv, cells, head_dim) with
    n_head a multiple of n_head_kv, sinks not (n_head,)), for T outside
    1 .. cells and for a position outside 0 .. T-1."""
    q = np.ascontiguousarray(q, np.float32)
    _check_f16_args(q, kbits, vbits, T, pos, n_swa)
    out = np.empty((q.shape[0], q.shape[1] * q.shape[2]), np.float32)
    if sinks is not None and np.shape(sinks) != (q.shape[1],):
        raise ValueError(f"attention: sinks must be ({q.shape[1]},), got {np.shape(sinks)}")
    sk = np.zeros(q.shape[1], np.float32) if sinks is None else np.ascontiguousarray(sinks, np.float32)
    _attention(q, np.ascontiguousarray(kbits), np.ascontiguousarray(vbits), int(T),
               np.ascontiguousarray(pos, np.int64), _F32(kq_scale), int(n_swa), q.shape[0] >= 2,
               int(profile.arch), sk, sinks is not None, out)
    return out
