"""The Gated DeltaNet operations of ggml-cpu (Qwen3-Next's linear-attention
layers), per CPU profile, in ggml's order of arithmetic.

Sources (llama.cpp vendored by llama-cpp-python 0.3.36): the graph in
`src/models/qwen3next.cpp` (`build_layer_attn_linear`) and
`src/models/delta-net-base.cpp`; the kernels in `ggml/src/ggml-cpu/`:

* `ssm_conv` (ops.cpp `ggml_compute_forward_ssm_conv_f32`): the causal
  short convolution, per channel and token a float sum of d_conv products
  in order, `sumf += s * c`, as GCC compiled it: the products of whole
  vectors (8 or 4 lanes on AVX2, 16 or 8 on AVX-512) rounded and added one
  by one, the remaining terms as contracted FMAs (so d_conv = 4 is four
  multiplies and adds on AVX2 and four FMAs on AVX-512), no FMA on the
  baseline build.
* `gated_delta_net` (ops.cpp `ggml_compute_forward_gated_delta_net_f32`,
  the fused op llama.cpp builds by default: `cparams.fused_gdn_ar` and
  `fused_gdn_ch` are true, so the prompt pass and each decode step run
  this same token-by-token recurrence; the chunked graph of
  `build_delta_net_chunking` is only taken when the fused op is switched
  off). Per head, the S_v x S_v state is kept transposed (row j = column j
  of S); per token: every value times expf(g) (`ggml_vec_scale_f32`), then
  for each row j delta_j = (v_j - dot(row j, k)) * beta, then row j +=
  k * delta_j (`ggml_vec_mad_f32`: an FMA per value on FMA builds), then
  out_j = dot(row j, q) * (1 / sqrtf(S_v)); the dots are
  `ggml_vec_dot_f32`.
* the L2 norm of q and k (`build_gdn_l2_norm`): ggml `rms_norm` with eps /
  n, then `ggml_scale` by 1 / sqrtf(n).
"""
from __future__ import annotations

import math

import numpy as np

from ._digest import jit
from .fp import fma32
from .ops import rms_norm

__all__ = ["ssm_conv", "gated_delta_net", "l2_norm"]

_F32 = np.float32


@jit
def _ssm_conv(xin, w, n_vec, out):
    # xin (C, d_conv - 1 + T), w (C, d_conv), out (T, C); the first n_vec
    # products rounded and added in order, the rest by FMA (`ssm_conv`)
    C, W = xin.shape
    nc = w.shape[1]
    for t in range(W - nc + 1):
        for c in range(C):
            s = _F32(0.0)
            for i in range(nc):
                if i < n_vec:
                    s = _F32(s + _F32(xin[c, t + i] * w[c, i]))
                else:
                    s = fma32(xin[c, t + i], w[c, i], s)
            out[t, c] = s


def _vectorized_products(n: int, profile) -> int:
    # GCC 12 vectorizes the float sum `sumf += s[i] * c[i]` over i (read off
    # the disassembly of both builds' ggml_compute_forward_ssm_conv_f32):
    # the products of whole vectors are rounded and added one by one in
    # order (16 then 8 lanes on AVX-512, 8 then 4 on AVX2), so the first n -
    # n % 8 (AVX-512) or n - n % 4 (AVX2) terms are a multiply and an add;
    # the rest are contracted FMAs. The baseline build has no FMA at all.
    if not profile.fma:
        return n
    narrow = profile.isa.resolve("F32_TAIL_FMA")
    return n - n % narrow


def ssm_conv(xin: np.ndarray, w: np.ndarray, profile) -> np.ndarray:
    """ggml `ssm_conv(xin, w)` (module docstring) in `profile`'s order: xin
    float32 (channels, d_conv - 1 + T), each channel's previous d_conv - 1
    inputs then its T new ones; w float32 (channels, d_conv). Returns
    float32 (T, channels)."""
    xin = np.ascontiguousarray(xin, np.float32)
    w = np.ascontiguousarray(w, np.float32)
    if xin.ndim != 2 or w.ndim != 2 or xin.shape[0] != w.shape[0] or xin.shape[1] < w.shape[1]:
        raise ValueError(f"ssm_conv: xin {xin.shape} and w {w.shape} do not fit")
    out = np.empty((xin.shape[1] - w.shape[1] + 1, xin.shape[0]), np.float32)
    _ssm_conv(xin, w, _vectorized_products(w.shape[1], profile), out)
    return out


@jit
def _gated_delta_net(q, k, v, g, beta, state, isa, out, new_state):
    T, H, S = v.shape
    scale = _F32(_F32(1.0) / _F32(math.sqrt(_F32(S))))
    acc = np.empty(64, np.float32)
    delta = np.empty(S, np.float32)
    for h in range(H):
        M = new_state[h]
        for j in range(S):
            for i in range(S):
                M[j, i] = state[h, j, i]
        for t in range(T):
            eg = _F32(math.exp(g[t, h]))
            for j in range(S):
                for i in range(S):
                    M[j, i] = _F32(M[j, i] * eg)
            kt = k[t, h]
            for j in range(S):
                s = isa.vec_dot_f32(M[j], 0, kt, 0, S, acc)
                delta[j] = _F32(_F32(v[t, h, j] - s) * beta[t, h])
            for j in range(S):
                dj = delta[j]
                for i in range(S):
                    M[j, i] = isa.madd(kt[i], dj, M[j, i])
            qt = q[t, h]
            for j in range(S):
                out[t, h, j] = _F32(isa.vec_dot_f32(M[j], 0, qt, 0, S, acc) * scale)


def gated_delta_net(q, k, v, g, beta, state, profile):
    """ggml `gated_delta_net(q, k, v, g, beta, state)` with one snapshot
    slot (module docstring), in `profile`'s order.

    q, k, v: float32 (T, H, S) (q and k already repeated to the H value
    heads); g, beta: float32 (T, H) (g scalar per head: not the KDA form);
    state: float32 (H, S, S), row j of head h holding column j of its state
    (ggml's layout). Returns (out float32 (T, H, S), new state (H, S, S)).
    The dots are the build's `ggml_vec_dot_f32`, the state update
    `s += k * delta` as GCC compiles it (contracted on FMA builds). Raises
    ValueError on shapes that do not fit."""
    q, k, v = (np.ascontiguousarray(a, np.float32) for a in (q, k, v))
    g, beta = np.ascontiguousarray(g, np.float32), np.ascontiguousarray(beta, np.float32)
    state = np.ascontiguousarray(state, np.float32)
    T, H, S = v.shape
    if q.shape != v.shape or k.shape != v.shape or g.shape != (T, H) or beta.shape != (T, H) \
            or state.shape != (H, S, S):
        raise ValueError(f"gated_delta_net: q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, "
                         f"beta {beta.shape}, state {state.shape} do not fit")
    out = np.empty((T, H, S), np.float32)
    new_state = np.empty_like(state)
    _gated_delta_net(q, k, v, g, beta, state, profile.isa, out, new_state)
    return out, new_state


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """`build_gdn_l2_norm` (src/models/models.h): ggml `rms_norm(x, eps /
    n)` then `ggml_scale(x, 1 / sqrtf(n))` over the last axis of x (float32
    (..., n)); eps / n and 1 / sqrtf(n) in float32."""
    n = _F32(x.shape[-1])
    y = rms_norm(x, None, _F32(_F32(eps) / n))
    return (y * _F32(_F32(1.0) / _F32(np.sqrt(n)))).astype(np.float32)
