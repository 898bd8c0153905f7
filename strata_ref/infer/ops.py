"""The float operations of attention and the FFN activation, in ggml-cpu's
order of arithmetic (numba), so that they equal llama.cpp's bit for bit.

Sources: ggml-cpu of the llama.cpp vendored by llama-cpp-python 0.3.36, built
for x86-64 with AVX-512 (and AVX512-FP16) by GCC; `ggml_fp` has the
primitives (FMA, lane reductions, ggml's exp).

* F16 mat-muls (`f16_products`): K q and V p, whose F16 operands are exact
  in float32 and whose products are exact too, so only the order of the
  additions matters. With two or more tokens ggml hands them to llamafile's
  `tinyBLAS<16, __m512, ...>` (`llamafile/sgemm.cpp`): 16 lanes, lane l
  accumulates elements l, l + 16, l + 32, ... by FMA, then
  `_mm512_reduce_add_ps`. With one token (`n < 2`, no sgemm) it is
  `ggml_vec_dot_f16` (`vec.cpp`, the AVX512-FP16 mapping of
  `simd-mappings.h`): four 16-lane accumulators over steps of 64 elements,
  then sum[0] + sum[2], sum[1] + sum[3], their sum, and
  `_mm512_reduce_add_ps`, the rest of the row (n % 64) added in double.
  V p runs over the KV length padded with zero-weighted cells (llama.cpp
  pads it to 256; a multiple of 64 sums the same).
* `soft_max` (`ggml_compute_forward_soft_max_f32`): x * scale, masked to
  -inf, max, then per 16 values `ggml_v_expf(x - max)` and the lane sum
  (`_mm512_reduce_add_ps`) added to a double; every value times
  (float)(1 / sum).
* `swiglu` (`ggml_vec_swiglu_f32`): `ggml_v_silu(g) * u`, 16 lanes at a
  time, the n % 16 values left of a row with libm's expf.
* RoPE (`ggml_rope_cache_init`, `rotate_pairs` in `ops.cpp`): angles by
  repeated float32 products, libm cosf / sinf, and the rotation as GCC
  contracts it into FMAs (`rope`).

These run on the calling thread: they are small next to the mat-muls, and a
parallel region per call costs more than it saves on a busy machine.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .act_quant import round_to_f16
from .ggml_fp import expf_avx512, fma32, hsum16, silu_avx512
from .lanes import fma8_vv

__all__ = ["attention", "f16_products", "soft_max", "swiglu", "softcap", "rope_cache", "rope"]

_F32 = np.float32


@njit(inline="always", cache=True)
def _dot_tinyblas(a, b, acc):
    # acc: 16 float32 lanes of scratch; a, b contiguous, length % 16 == 0
    for l in range(16):
        acc[l] = 0.0
    for s in range(0, a.shape[0], 16):
        fma8_vv(acc, 0, a, s, b, s)
        fma8_vv(acc, 8, a, s + 8, b, s + 8)
    return hsum16(acc)


@njit(inline="always", cache=True)
def _dot_vec_f16(a, b, acc):
    # acc: 64 float32 lanes (4 accumulators of 16); the n % 64 values past
    # the vector loop are added in double, as ggml's scalar tail does
    n = a.shape[0]
    main = n - n % 64
    for l in range(64):
        acc[l] = 0.0
    for s in range(0, main, 64):
        for k in range(0, 64, 8):
            fma8_vv(acc, k, a, s + k, b, s + k)
    for l in range(16):
        x0 = _F32(acc[l] + acc[32 + l])
        x1 = _F32(acc[16 + l] + acc[48 + l])
        acc[l] = _F32(x0 + x1)
    tot = np.float64(hsum16(acc))
    for i in range(main, n):
        tot += np.float64(_F32(a[i] * b[i]))
    return _F32(tot)


@njit(cache=True)
def _products(a, b, batched, out):
    # a (H, M, D), b (H, C, D) -> out (H, M, C)
    H, M = a.shape[0], a.shape[1]
    C = b.shape[1]
    tiny = batched and a.shape[2] % 16 == 0
    for hm in range(H * M):
        h, m = hm // M, hm % M
        acc = np.empty(64, np.float32)
        for c in range(C):
            if tiny:
                out[h, m, c] = _dot_tinyblas(a[h, m], b[h, c], acc)
            else:
                out[h, m, c] = _dot_vec_f16(a[h, m], b[h, c], acc)


def _pad_last(a, D):
    """a float32 with its last axis zero-padded to D, contiguous."""
    if a.shape[-1] == D:
        return np.ascontiguousarray(a, np.float32)
    out = np.zeros(a.shape[:-1] + (D,), np.float32)
    out[..., :a.shape[-1]] = a
    return out


def f16_products(a: np.ndarray, b: np.ndarray, batched: bool) -> np.ndarray:
    """out[h, m, c] = sum_d a[h, m, d] * b[h, c, d] as ggml-cpu's F16 mat-mul
    sums it (module docstring): `batched` (two or more tokens in the call)
    selects tinyBLAS's order when the length is a multiple of 16 (else
    llamafile declines and ggml uses `ggml_vec_dot_f16`, as for one token).

    a, b: float32 holding fp16 values, (H, M, Da) and (H, C, Db); the
    shorter rows count as zero-padded to the longer. The length summed over
    is llama.cpp's: head_dim for K q, and for V p the KV length, which
    llama.cpp pads to a multiple of 256 with zero-weighted cells (callers
    pass p padded to a multiple of 64, which sums the same). Returns float32
    (H, M, C)."""
    D = max(a.shape[2], b.shape[2])
    a, b = _pad_last(a, D), _pad_last(b, D)
    out = np.empty((a.shape[0], a.shape[1], b.shape[1]), np.float32)
    _products(a, b, bool(batched), out)
    return out


@njit(inline="always", cache=True)
def _soft_max_row(srow, T, scale, qpos, n_swa, w, out):
    # one row: srow (>= T) scores, w / out (Tp, a multiple of 16) scratch and
    # result; key c masked when c >= T, c > qpos or (n_swa and qpos - c >= n_swa)
    Tp = w.shape[0]
    mx = _F32(-np.inf)
    for c in range(Tp):
        v = _F32(-np.inf)
        if c < T and c <= qpos and not (n_swa > 0 and qpos - c >= n_swa):
            v = _F32(srow[c] * scale)
        w[c] = v
        if v > mx:
            mx = v
    tot = 0.0
    for c0 in range(0, Tp, 16):
        for l in range(16):
            w[c0 + l] = expf_avx512(_F32(w[c0 + l] - mx))
        tot += np.float64(hsum16(w[c0:c0 + 16]))
    inv = _F32(1.0 / tot)
    for c in range(Tp):
        out[c] = _F32(w[c] * inv)


@njit(cache=True)
def _soft_max_rows(s, scale, qpos, n_swa, out):
    # s (R, T) scores; qpos (R,) position of each row's query
    w = np.empty(out.shape[1], np.float32)
    for r in range(s.shape[0]):
        _soft_max_row(s[r], s.shape[1], scale, qpos[r], n_swa, w, out[r])


def soft_max(s: np.ndarray, scale: float, qpos: np.ndarray, n_swa: int = 0) -> np.ndarray:
    """ggml `soft_max_ext(s, mask, scale)` with llama.cpp's causal (and
    sliding-window) mask: s float32 (R, T) raw scores, qpos int (R,) the
    position of each row's query (key c is visible when c <= qpos and, with
    n_swa > 0, qpos - c < n_swa). Returns float32 (R, T') probabilities with
    T' = T rounded up to a multiple of 64 (the extra columns are 0)."""
    s = np.ascontiguousarray(s, np.float32)
    Tp = s.shape[1] + (-s.shape[1] % 64)
    out = np.empty((s.shape[0], Tp), np.float32)
    _soft_max_rows(s, _F32(scale), np.ascontiguousarray(qpos, np.int64), int(n_swa), out)
    return out


@njit(cache=True)
def _attention(q, kbits, vbits, f16, T, pos, kq_scale, n_swa, batched, out):
    # q (n, H, hd) float32; kbits / vbits (Hkv, >= T, hd) uint16 (the F16
    # cache); f16: float32 value of every fp16 bit pattern; out (n, H * hd)
    n, H, hd = q.shape
    Hkv = kbits.shape[0]
    G = H // Hkv
    Tp = T + (-T % 64)
    K = np.empty((T, hd), np.float32)
    Vt = np.zeros((hd, Tp), np.float32)
    qf = np.empty(hd, np.float32)
    srow = np.empty(T, np.float32)
    w = np.empty(Tp, np.float32)
    p = np.empty(Tp, np.float32)
    acc = np.empty(64, np.float32)
    tiny_kq = batched and hd % 16 == 0
    for h in range(Hkv):
        for c in range(T):
            for d in range(hd):
                K[c, d] = f16[kbits[h, c, d]]
                Vt[d, c] = f16[vbits[h, c, d]]
        for t in range(n):
            for g in range(G):
                head = h * G + g
                for d in range(hd):
                    qf[d] = round_to_f16(q[t, head, d])
                for c in range(T):
                    srow[c] = _dot_tinyblas(qf, K[c], acc) if tiny_kq else _dot_vec_f16(qf, K[c], acc)
                _soft_max_row(srow, T, kq_scale, pos[t], n_swa, w, p)
                for c in range(Tp):
                    p[c] = round_to_f16(p[c])
                for d in range(hd):
                    out[t, head * hd + d] = (_dot_tinyblas(p, Vt[d], acc) if batched
                                             else _dot_vec_f16(p, Vt[d], acc))


def attention(q: np.ndarray, kbits: np.ndarray, vbits: np.ndarray, T: int, pos: np.ndarray,
              kq_scale: float, n_swa: int = 0) -> np.ndarray:
    """softmax(K q * kq_scale + mask) V for every query head, as llama.cpp's
    non-flash attention computes it, in one call: q rounded to F16, K q
    (`f16_products` order), `soft_max` with the causal / sliding-window mask,
    p rounded to F16, V p (`f16_products` order over the KV length padded to
    a multiple of 64). Two or more tokens take the tinyBLAS order, one the
    `ggml_vec_dot_f16` order, as in ggml.

    q float32 (n, n_head, head_dim) for positions `pos` (int, n); kbits /
    vbits: the layer's F16 cache as uint16 bits (n_head_kv, >= T, head_dim),
    positions 0 .. T-1 valid; query head j uses KV head j // (n_head /
    n_head_kv). Returns float32 (n, n_head * head_dim)."""
    from ..numerics import F16_TO_F32
    q = np.ascontiguousarray(q, np.float32)
    out = np.empty((q.shape[0], q.shape[1] * q.shape[2]), np.float32)
    _attention(q, kbits, vbits, F16_TO_F32, int(T), np.ascontiguousarray(pos, np.int64),
               _F32(kq_scale), int(n_swa), q.shape[0] >= 2, out)
    return out


@njit(cache=True)
def _swiglu(g, u, out):
    # rows of n values: the first n - n % 16 through the AVX-512 SiLU, the
    # tail through the scalar `ggml_silu_f32` (libm expf; numba lowers
    # float32 math.exp to it)
    R, n = g.shape
    main = n - n % 16
    for r in range(R):
        for i in range(main):
            out[r, i] = _F32(silu_avx512(g[r, i]) * u[r, i])
        for i in range(main, n):
            x = g[r, i]
            out[r, i] = _F32(_F32(x / _F32(_F32(1.0) + math.exp(-x))) * u[r, i])


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml `swiglu` (`ggml_vec_swiglu_f32` per row): silu(g) * u with
    ggml's AVX-512 SiLU for each whole 16 values of a row, the scalar
    `ggml_silu_f32` for the rest. g, u float32 of one shape (..., n)."""
    g = np.ascontiguousarray(g, np.float32)
    u = np.ascontiguousarray(u, np.float32)
    out = np.empty_like(g)
    n = g.shape[-1]
    _swiglu(g.reshape(-1, n), u.reshape(-1, n), out.reshape(-1, n))
    return out


@njit(cache=True)
def _softcap(x, inv, c, out):
    for i in range(x.size):
        out[i] = _F32(math.tanh(_F32(x[i] * inv)) * c)


def softcap(x: np.ndarray, c: float) -> np.ndarray:
    """Final logit soft-capping as llama.cpp builds it (gemma2/3): ggml_scale
    by the float32 1/c, `ggml_tanh` (libm `tanhf`; numba lowers float32
    math.tanh to it), ggml_scale by c. x float32, any shape."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    _softcap(x.reshape(-1), _F32(_F32(1.0) / _F32(c)), _F32(c), out.reshape(-1))
    return out


def _check_n_rot(n_rot) -> int:
    """n_rot / 2 for a valid n_rot (an even int >= 2), else ValueError."""
    if isinstance(n_rot, bool) or not isinstance(n_rot, (int, np.integer)) or n_rot < 2 or n_rot % 2:
        raise ValueError(f"RoPE: n_rot must be an even integer >= 2, got {n_rot!r}")
    return int(n_rot) // 2


@njit(cache=True)
def _rope_cache(pos, n_rot, base, freq_scale, freq_factors, has_ff, cos, sin):
    ts = _F32(_F32(base) ** _F32(_F32(-2.0) / _F32(n_rot)))
    for p in range(pos.shape[0]):
        theta = _F32(pos[p])
        for i in range(n_rot // 2):
            th = _F32(theta / freq_factors[i]) if has_ff else theta
            th = _F32(_F32(freq_scale) * th)
            cos[p, i] = math.cos(th)          # libm cosf / sinf, as ggml
            sin[p, i] = math.sin(th)
            theta = _F32(theta * ts)


def rope_cache(pos: np.ndarray, n_rot: int, base: float, freq_scale: float,
               freq_factors: np.ndarray | None = None):
    """cos and sin float32 (n, n_rot/2) as ggml `ggml_rope_cache_init` (no
    YaRN): theta_scale = powf(base, -2/n_rot); theta starts at the position
    and is multiplied by theta_scale in float32 for each pair; freq_factors
    divide it (llama3 `rope_freqs`), freq_scale multiplies it; then libm's
    cosf and sinf (numba lowers float32 math.cos / math.sin to them).
    pos: int positions (n,). Raises ValueError for an odd or non-positive
    n_rot, or freq_factors not of shape (n_rot/2,)."""
    pos = np.ascontiguousarray(pos, np.int64).reshape(-1)
    half = _check_n_rot(n_rot)
    if freq_factors is not None and np.shape(freq_factors) != (half,):
        raise ValueError(f"rope_cache: freq_factors has shape {np.shape(freq_factors)}, "
                         f"expected ({half},) for n_rot = {n_rot}")
    cos = np.empty((len(pos), half), np.float32)
    sin = np.empty_like(cos)
    ff = np.ones(half, np.float32) if freq_factors is None else np.ascontiguousarray(freq_factors, np.float32)
    _rope_cache(pos, int(n_rot), _F32(base), _F32(freq_scale), ff, freq_factors is not None, cos, sin)
    return cos, sin


@njit(cache=True)
def _rope(x, cos, sin, n_rot, neox, out):
    n, H, D = x.shape
    half = n_rot // 2
    for th in range(n * H):
        t, h = th // H, th % H
        for j in range(D):
            out[t, h, j] = x[t, h, j]
        for i in range(half):
            i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
            c, s = cos[t, i], sin[t, i]
            x0, x1 = x[t, h, i0], x[t, h, i1]
            out[t, h, i0] = fma32(x0, c, -_F32(x1 * s))
            out[t, h, i1] = fma32(x0, s, _F32(x1 * c))


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
    """Rotate the first n_rot values of each head, ggml `rotate_pairs` as GCC
    compiles it (contracted): y0 = fma(x0, cos, -(x1 sin)), y1 = fma(x0,
    sin, x1 cos). Normal style pairs (2i, 2i+1), NeoX (i, i + n_rot/2).
    x float32 (n, heads, head_dim); cos, sin (n, n_rot/2). Raises
    ValueError for an odd n_rot, n_rot outside 2 .. head_dim, or cos / sin
    of another shape (the kernel indexes by them unchecked)."""
    x = np.ascontiguousarray(x, np.float32)
    half = _check_n_rot(n_rot)
    if x.ndim != 3 or n_rot > x.shape[2]:
        raise ValueError(f"rope: x must be (n, heads, head_dim) with head_dim >= n_rot = {n_rot}, "
                         f"got shape {x.shape}")
    want = (x.shape[0], half)
    if np.shape(cos) != want or np.shape(sin) != want:
        raise ValueError(f"rope: cos and sin must be {want} for x {x.shape} and n_rot = {n_rot}, "
                         f"got {np.shape(cos)} and {np.shape(sin)}")
    out = np.empty_like(x)
    _rope(x, np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32),
          int(n_rot), bool(neox), out)
    return out
