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
  llamafile (two or more tokens, eight with Arm's FP16 arithmetic;
  `ops.tinyblas_takes`). With FP16 arithmetic (`F16_VA`) both dots run in
  binary16 (`fp16_va`), V p one dimension at a time.
* V p, one dot per (query head, dimension) over the cells: the same two
  orders, where lane k of the dot of dimension d takes the cells c = k mod
  lanes. The kernel runs all dimensions at once: for cell c it adds p[c] *
  V[c, :] into the accumulator row of lane c mod lanes, a vector over d,
  then reduces the lanes of every d in the build's tree. Each (d, lane)
  gets the same FMAs in the same order as ggml's dot of d.

F16 values widen exactly (`vcvtph2ps`), q and p are rounded to F16 (RNE)
as ggml's F16 mat-mul converts its float32 operand; on a chain with
`TINYBLAS_F16_F32B` (ARM NEON without FP16 arithmetic, whose tinyBLAS
takes F16 weights only with F32 activations) K q takes `ggml_vec_dot_f16`
and a V p on tinyBLAS keeps p in float32. The K and V rows are
read from the cache's F16 bits in place: nothing is converted ahead.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._digest import jit
from ..numerics import F16_TO_F32
from .act_quant import round_to_f16
from .fp import fma32
from .attention import check_attention_args
from .ops import _soft_max_row, f16_tinyblas_dot, tinyblas_takes
from .simd import HOST_F16C, f8_add, f8_fma, f8_load, f8_mul, f8_round_f16, f8_splat, f8_store, f8_zero
from .vec import load8

__all__ = ["attention"]

_F32 = np.float32
_TABLE = F16_TO_F32


@njit(inline="always", cache=True)
def _round_row_f16(src, dst, n):
    """dst[:n] = src[:n] rounded to fp16 (RNE) as float32 values."""
    main = n - n % 8 if HOST_F16C else 0
    for i in range(0, main, 8):
        f8_store(dst, i, f8_round_f16(f8_load(src, i)))
    for i in range(main, n):
        dst[i] = round_to_f16(src[i])


@njit(inline="always", cache=True)
def _kq_dot(q, k, ko, hd, isa, tiny, acc):
    """K q of one cell: q float32 (hd,) holding fp16 values, the cell's K at
    k[ko:ko + hd] (fp16 bits), in the order of the build (module
    docstring); float32."""
    if tiny:
        return f16_tinyblas_dot(isa, q, 0, k, ko, hd, acc)
    return isa.vec_dot_f16(q, 0, k, ko, hd, acc)


@njit(inline="always", cache=True)
def _vp(p, Tp, T, v, vo, row, hd, isa, tiny, acc, out, oo, vrow):
    """V p of one query head for every dimension: p float32 (Tp,) holding
    fp16 values (Tp a multiple of 64), V's cell c < T at v[vo + c * row:
    + hd] (fp16 bits), zero for the cells T..Tp-1 (as in ggml's padded
    view); out[oo:oo + hd] = the dots in the build's order (module
    docstring). acc: float32 scratch (64, hd); vrow: float32 scratch
    (hd,)."""
    if isa.F16_STEP == 0:
        # no GGML_SIMD: every product added in double, cell after cell
        tot = np.zeros(hd, np.float64)
        for c in range(Tp):
            pc = p[c]
            for d in range(hd):
                vv = _TABLE[v[vo + c * row + d]] if c < T else _F32(0.0)
                tot[d] += np.float64(_F32(pc * vv))
        for d in range(hd):
            out[oo + d] = _F32(tot[d])
        return
    if isa.F16_VA:
        _vp_f16_va(p, Tp, T, v, vo, row, hd, isa, tiny, out, oo)
        return
    lanes = isa.TINYBLAS if tiny else isa.F16_STEP
    hd8 = hd - hd % 8 if HOST_F16C else 0
    for k in range(lanes):
        for d in range(hd):
            acc[k, d] = 0.0
    for c in range(Tp):
        pc = p[c]
        pv = f8_splat(pc)
        a = acc[c % lanes]
        for d in range(0, hd8, 8):
            vv = load8(v, vo + c * row + d) if c < T else f8_zero()
            if isa.FMA:
                f8_store(a, d, f8_fma(pv, vv, f8_load(a, d)))
            else:                       # a build without FMA: mul, then add
                f8_store(a, d, f8_add(f8_mul(pv, vv), f8_load(a, d)))
        for d in range(hd8, hd):
            vs = _TABLE[v[vo + c * row + d]] if c < T else _F32(0.0)
            a[d] = fma32(pc, vs, a[d]) if isa.FMA else _F32(a[d] + _F32(pc * vs))
    # the lanes of every d reduced in the build's tree, 8 columns at a time
    for d in range(0, hd8, 8):
        if tiny:
            isa.hsum_cols(acc, d, vrow)
        else:
            isa.reduce_f32_cols(acc, d, vrow)
    col = np.empty(64, np.float32)
    for d in range(hd8, hd):
        # the same trees on one column (no whole vector of columns left)
        for k in range(lanes):
            col[k] = acc[k, d]
        vrow[d] = isa.hsum(col) if tiny else isa.reduce_f32(col)
    for d in range(hd):
        out[oo + d] = vrow[d]


@njit(inline="always", cache=True)
def _vp_f16_va(p, Tp, T, v, vo, row, hd, isa, tiny, out, oo):
    """`_vp` with Arm's FP16 vector arithmetic (`F16_VA`): per dimension d
    the binary16 dot of p and V's column d over the Tp cells (zero past T),
    by tinyBLAS<8, float16x8_t> or `ggml_vec_dot_f16` (`fp16_va`)."""
    col = np.empty(Tp, np.float32)
    sc = np.empty(64, np.float32)
    for d in range(hd):
        for c in range(Tp):
            col[c] = _TABLE[v[vo + c * row + d]] if c < T else _F32(0.0)
        if tiny:
            out[oo + d] = f16_tinyblas_dot(isa, p, 0, col, 0, Tp, sc)
        else:
            out[oo + d] = isa.vec_dot_f16(p, 0, col, 0, Tp, sc)


@jit
def _head(q, kf, vf, head, G, ctx, row, vctx, vrs, hv, T, pos, kq_scale, n_swa, isa, sinks, has_sinks,
          tiny_kq, tiny_vp, f32b, out):
    # every token of query head `head` (of KV head head // G): q rounded to
    # F16, K q for the T cells, soft_max, p rounded to F16, V p into
    # out[t, head * hv:]
    n, H, hd = q.shape
    h = head // G
    base = h * ctx * row
    vbase = h * vctx * vrs
    Tp = T + (-T % 64)
    qf = np.empty(hd, np.float32)
    srow = np.empty(max(T, 1), np.float32)
    w = np.empty(Tp, np.float32)
    p = np.empty(Tp, np.float32)
    acc = np.empty((64, hv), np.float32)
    vrow = np.empty(hv, np.float32)
    qrow = np.empty(hd, np.float32)
    kacc = np.empty(64, np.float32)
    for t in range(n):
        for d in range(hd):
            qrow[d] = q[t, head, d]
        _round_row_f16(qrow, qf, hd)
        for c in range(T):
            srow[c] = _kq_dot(qf, kf, base + c * row, hd, isa, tiny_kq, kacc)
        _soft_max_row(srow, T, kq_scale, pos[t], n_swa, w, p, isa, has_sinks, sinks[head])
        if not (tiny_vp and f32b):
            _round_row_f16(p, p, Tp)
        _vp(p, Tp, T, vf, vbase, vrs, hv, isa, tiny_vp, acc, out[t], head * hv, vrow)


@jit(parallel=True)
def _attention(q, kbits, vbits, hv, T, pos, kq_scale, n_swa, n_tok, isa, sinks, has_sinks, out):
    # q (n, H, hd) float32; kbits / vbits (Hkv, >= T, row) uint16, the
    # layer's F16 cache, V the first hv values of each vbits cell; out (n,
    # H * hv). The query heads are independent: numba's threads take them
    # (`_head`, a function of its own: see `_digest`'s note on prange
    # bodies); each head's arithmetic is the same on any thread.
    n, H, hd = q.shape
    Hkv, ctx, row = kbits.shape
    vctx, vrs = vbits.shape[1], vbits.shape[2]
    G = H // Hkv
    Tp = T + (-T % 64)
    kf = kbits.reshape(-1)
    vf = vbits.reshape(-1)
    # K q: ggml's m is the KV length (a multiple of 256 in llama.cpp); V p:
    # m is head_dim, k the padded KV length
    # where tinyBLAS takes F16 weights only with unconverted F32 activations
    # (TINYBLAS_F16_F32B: ARM NEON), K q never takes it (q is a permuted,
    # non-contiguous view that ggml converts to F16 first) and V p takes
    # the probabilities p unrounded (contiguous F32)
    f32b = isa.TINYBLAS_F16_F32B
    tiny_kq = tinyblas_takes(isa, n_tok, hd, 256) and not f32b
    tiny_vp = tinyblas_takes(isa, n_tok, Tp, hv)
    for head in prange(H):
        _head(q, kf, vf, head, G, ctx, row, vctx, vrs, hv, T, pos, kq_scale, n_swa, isa, sinks, has_sinks,
              tiny_kq, tiny_vp, f32b, out)


def _check_f16_args(q, kbits, vbits, T, pos, n_swa, v_width) -> None:
    for name, a in (("kbits", kbits), ("vbits", vbits)):
        if not isinstance(a, np.ndarray) or a.dtype != np.uint16 or a.ndim != 3:
            got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
            raise ValueError(f"attention: {name} must be uint16 (n_head_kv, cells, head_dim), got {got}")
    check_attention_args(q, kbits, vbits, T, pos, n_swa)
    if v_width is not None:
        if kbits.shape[2] != q.shape[2] or not 1 <= v_width <= vbits.shape[2]:
            raise ValueError(f"attention: K head_dim {kbits.shape[2]} is not q's {q.shape[2]}, or "
                             f"v_width {v_width} is outside 1 .. {vbits.shape[2]} (V's cells)")
    elif kbits.shape[2] != q.shape[2] or vbits.shape[2] != q.shape[2]:
        raise ValueError(f"attention: K / V head_dim {kbits.shape[2]} / {vbits.shape[2]} "
                         f"is not q's {q.shape[2]}")


def attention(q: np.ndarray, kbits: np.ndarray, vbits: np.ndarray, T: int, pos: np.ndarray,
              kq_scale: float, profile, n_swa: int = 0, sinks: np.ndarray | None = None,
              v_width: int | None = None) -> np.ndarray:
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
    n_head * head_dim). v_width: V is the first v_width values of each
    vbits cell (vbits may be kbits: MLA's absorbed attention, whose V is a
    view of the K cache, `llm_graph_context::build_attn` with
    `llm_graph_input_attn_k`, made contiguous by `ggml_cont` before the V p
    mul_mat, which copies F16 bits unchanged); the output is then (n,
    n_head * v_width). ValueError for arrays of other shapes or dtypes
    (q not 3-D, K and V bits not uint16 (n_head_kv, cells, head_dim) with
    n_head a multiple of n_head_kv, sinks not (n_head,)), for T outside
    1 .. cells and for a position outside 0 .. T-1."""
    q = np.ascontiguousarray(q, np.float32)
    _check_f16_args(q, kbits, vbits, T, pos, n_swa, v_width)
    hv = q.shape[2] if v_width is None else int(v_width)
    out = np.empty((q.shape[0], q.shape[1] * hv), np.float32)
    if sinks is not None and np.shape(sinks) != (q.shape[1],):
        raise ValueError(f"attention: sinks must be ({q.shape[1]},), got {np.shape(sinks)}")
    sk = np.zeros(q.shape[1], np.float32) if sinks is None else np.ascontiguousarray(sinks, np.float32)
    _attention(q, np.ascontiguousarray(kbits), np.ascontiguousarray(vbits), hv, int(T),
               np.ascontiguousarray(pos, np.int64), _F32(kq_scale), int(n_swa), q.shape[0],
               profile.isa, sk, sinks is not None, out)
    return out
