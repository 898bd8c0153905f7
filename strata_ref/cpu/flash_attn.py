"""ggml-cpu's flash attention (`GGML_OP_FLASH_ATTN_EXT`) over a KV cache of
any type, in each CPU profile's float order, bit for bit.

Source: llama.cpp vendored by llama-cpp-python 0.3.36,
`ggml_compute_forward_flash_attn_ext_f16` and the functions it calls in
ggml/src/ggml-cpu/ops.cpp, with `vec.h`, `vec.cpp`, `simd-gemm.h` and
`simd-mappings.h`; llama.cpp builds the node in `build_attn_mha`
(src/llama-graph.cpp), casting an F32 cache to F16 first. ggml picks one of
three paths (`fa_path`):

* "vec" (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`): every other
  case, and the only one for bf16 and block-type caches. Per query row:
  q converted by the `from_float` of K's `vec_dot_type` (F16 RNE, BF16
  ggml's rule, Q8_0 / Q8_1 by the profile's activation quantizer), then for
  each unmasked key in cell order s = vec_dot(K row, q) * scale and the
  online softmax with libm's `expf`: a new maximum M rescales the
  accumulator by ms = expf(M_old - M) (and vs = 1), else vs = expf(s - M);
  the accumulator gets V's row times vs, and S = S * ms + vs. With an F16
  V the accumulator is F16 (`ggml_vec_scale_f16`, `ggml_vec_mad_f16`:
  every step rounded back to F16), otherwise float32 with V converted by
  its `to_float` (`ggml_vec_mad_f32`). At the end the F32 value times
  (1 / S) (0 when S is 0).
* "tiled" (`ggml_compute_forward_flash_attn_ext_tiled`): K and V both F16
  (or F32), 64 or more query tokens (`GGML_FA_TILE_Q`). Tiles of 64 keys
  (`GGML_FA_TILE_KV`): the scores in float32 from the unrounded q and the
  widened K (`simd_gemm`: one FMA chain over head_dim, a plain multiply
  and add on the baseline build), times scale, masked to -inf; a tile whose
  scores are all -inf leaves the row alone; else M_new = fmaxf(M, tile
  max), a rise rescales the accumulator and S by expf(M - M_new), the
  tile's probabilities are `ggml_v_expf(s - M_new)` (the vector exp of the
  build) with their lane sums added in double to S, and the accumulator
  (float32) gets the tile's probabilities times V (`simd_gemm` again: one
  FMA chain over the 64 keys per output value).
* "split" (`use_split_kv_path`): one query token, K and V both F16 (or
  F32), 512 or more KV cells: the cells cut into one chunk per thread
  (ceil(n_kv / n_threads) each; the result depends on llama.cpp's thread
  count), each chunk run as "vec" without the final division, and the
  chunks merged in order (`ggml_flash_attn_ext_reduce_partials`).

What differs between profiles: the dots and q's conversion (as the
mat-muls: `attention.cache_dots`), FMA or separate multiply and add where
GCC contracts on FMA builds (the accumulator updates, S's update, the
tiled GEMMs; the baseline build has no FMA), the tiled path's vector
exp and lane sums (16 / 8 / 4 lanes, as `ops.soft_max`), and on Arm's
FP16 vector arithmetic (`F16_VA`: the armv8.2-fp16 and armv8.6-i8mm
builds) the F16 accumulator of the "vec" path: `ggml_vec_mad_f16` /
`ggml_vec_scale_f16` become `vfmaq_f16` / `vmulq_f16` on binary16 lanes,
the float vs / ms rounded to F16 first (`vdupq_n_f16`), for the first
head_dim - head_dim % `GGML_F16_STEP` values (`_mad_f16`, `_scale_f16`).
The K q dots are the one-row `vec_dot` (`nrc` 1) whatever the build
offers for more rows (tinyBLAS_Q0, the i8mm two-row code).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._digest import jit
from ..types import GGMLType as T
from .act_quant import round_to_f16
from .attention import cache_dots, check_attention_args
from .fp import fma32
from .fp16_va import fma16, mul16

__all__ = ["flash_attn_ext", "fa_path", "FA_TILE_Q", "FA_TILE_KV", "SPLIT_KV_MIN"]

_F32 = np.float32
#: ggml-cpu `GGML_FA_TILE_Q`, `GGML_FA_TILE_KV` (common.h)
FA_TILE_Q = 64
FA_TILE_KV = 64
#: the KV length from which one query token takes the split-KV path
SPLIT_KV_MIN = 512


def fa_path(type_k, type_v, n_tokens: int, n_kv: int) -> str:
    """Which of ggml-cpu's flash-attention paths runs (module docstring):
    "split", "tiled" or "vec", for the cache types as llama.cpp passes
    them (an F32 cache is cast to F16 first, so counts as F16)."""
    kv16 = T(type_k) in (T.F16, T.F32) and T(type_v) in (T.F16, T.F32)
    if kv16 and n_tokens == 1 and n_kv >= SPLIT_KV_MIN:
        return "split"
    if kv16 and n_tokens >= FA_TILE_Q:
        return "tiled"
    return "vec"


@njit(inline="always", cache=True)
def _visible(c, qpos, n_swa):
    return c <= qpos and not (n_swa > 0 and qpos - c >= n_swa)


@njit(inline="always", cache=True)
def _add_sink(acc, S, M, sink, fused):
    # the sink logit after the loop (`sinks` in both flash-attention
    # kernels): a larger sink rescales the float32 accumulator and S by
    # expf(M - sink) and becomes the maximum (the one-chunk kernel keeps it
    # as M for the partials), else adds expf(sink - M) to S. Returns (S,
    # M). fused: `S = S*ms + vs` contracted into one FMA; the one-chunk
    # kernel's is not, on any build (llama.cpp's own output with sinks,
    # tests/data/avx2/llama_trace_tiny_gpt-oss_fa.npz: only the rows whose
    # sink exceeds M differ, by 1 or 2 ulp, when it is contracted)
    ms = _F32(1.0)
    vs = _F32(1.0)
    if sink > M:
        ms = math.exp(_F32(M - sink))
        M = sink
        for d in range(acc.shape[0]):
            acc[d] = _F32(acc[d] * ms)
    else:
        vs = math.exp(_F32(sink - M))
    S = fma32(S, ms, vs) if fused else _F32(_F32(S * ms) + vs)
    return S, M


@njit(inline="always", cache=True)
def _scale_f16(acc, ms, h16):
    # ggml_vec_scale_f16 of the F16 accumulator acc (float32 holding binary16
    # values) by ms. h16 = 0: the F16 macros widen to float32 (x86 F16C,
    # NEON without FP16 vector arithmetic): each product in float32, rounded
    # to F16. h16 > 0 (`GGML_F16_STEP` of Arm's FP16 vector arithmetic):
    # the first DV - DV % h16 values by `vmulq_f16` with ms rounded to F16
    # (`vdupq_n_f16`), the rest the scalar float32 leftover loop
    DV = acc.shape[0]
    main = DV - DV % h16 if h16 > 0 else 0
    m16 = round_to_f16(ms)
    for d in range(main):
        acc[d] = mul16(acc[d], m16)
    for d in range(main, DV):
        acc[d] = round_to_f16(_F32(acc[d] * ms))


@njit(inline="always", cache=True)
def _mad_f16(acc, v, hk, c, vs, fused, h16):
    # ggml_vec_mad_f16: acc += V row c of head hk times vs, acc F16. h16 as
    # `_scale_f16`: widened, each step a float32 FMA (or multiply and add
    # without FMA) rounded to F16; or `vfmaq_f16` with vs rounded to F16 on
    # the first DV - DV % h16 values and the leftover loop in float32
    DV = acc.shape[0]
    main = DV - DV % h16 if h16 > 0 else 0
    v16s = round_to_f16(vs)
    for d in range(main):
        acc[d] = fma16(v[hk, c, d], v16s, acc[d])
    for d in range(main, DV):
        if fused:
            a = fma32(v[hk, c, d], vs, acc[d])
        else:
            a = _F32(acc[d] + _F32(v[hk, c, d] * vs))
        acc[d] = round_to_f16(a)


@jit
def _vec_rows(s, v, v16, h16, scale, pos, n_swa, c0, c1, fused, fused_s, final, out, Ms, Ss, has_sinks,
              sinks):
    # ggml_compute_forward_flash_attn_ext_f16_one_chunk over keys c0 .. c1-1
    # for every (token t, head). s (n, H, T) the raw K q dots; v (Hkv, T, DV)
    # float32 V values (F16 ones exact); v16: the accumulator is F16; h16:
    # its binary16 arithmetic (`_scale_f16`, `_mad_f16`).
    # fused: the accumulator update contracted; fused_s: `S = S*ms + vs`
    # final: divide by S into out (n, H, DV); else leave the partials:
    # out = the float32 accumulator, Ms / Ss (n, H) = M and S.
    n, H, _ = s.shape
    Hkv, _, DV = v.shape
    G = H // Hkv
    acc = np.empty(DV, np.float32)
    for t in range(n):
        for hq in range(H):
            hk = hq // G
            S = _F32(0.0)
            M = _F32(-np.inf)
            for d in range(DV):
                acc[d] = 0.0
            for c in range(c0, c1):
                if not _visible(c, pos[t], n_swa):
                    continue
                x = _F32(s[t, hq, c] * scale)
                x = _F32(x + _F32(0.0))               # the mask value, 0 where visible
                Mold = M
                ms = _F32(1.0)
                vs = _F32(1.0)
                if x > M:
                    M = x
                    ms = math.exp(_F32(Mold - M))      # libm expf
                    if v16:
                        _scale_f16(acc, ms, h16)
                    else:
                        for d in range(DV):
                            acc[d] = _F32(acc[d] * ms)
                else:
                    vs = math.exp(_F32(x - M))
                if v16:
                    _mad_f16(acc, v, hk, c, vs, fused, h16)
                else:
                    for d in range(DV):
                        if fused:
                            acc[d] = fma32(v[hk, c, d], vs, acc[d])
                        else:
                            acc[d] = _F32(acc[d] + _F32(v[hk, c, d] * vs))
                S = fma32(S, ms, vs) if fused_s else _F32(_F32(S * ms) + vs)
            if has_sinks and c0 == 0:
                S, M = _add_sink(acc, S, M, sinks[hq], False)
            if final:
                inv = _F32(0.0) if S == 0.0 else _F32(_F32(1.0) / S)
                for d in range(DV):
                    out[t, hq, d] = _F32(acc[d] * inv)
            else:
                for d in range(DV):
                    out[t, hq, d] = acc[d]
                Ms[t, hq] = M
                Ss[t, hq] = S


@jit
def _reduce_split(parts, Ms, Ss, fused, out):
    # ggml_flash_attn_ext_reduce_partials: parts (C, H, DV), Ms / Ss (C, H),
    # chunk after chunk; out (H, DV)
    C, H, DV = parts.shape
    for h in range(H):
        Mf = _F32(-np.inf)
        Sf = _F32(0.0)
        for d in range(DV):
            out[h, d] = 0.0
        for c in range(C):
            Sc = Ss[c, h]
            if Sc == 0.0:
                continue
            Mc = Ms[c, h]
            Mn = max(Mf, Mc)
            so = math.exp(_F32(Mf - Mn))
            sn = math.exp(_F32(Mc - Mn))
            for d in range(DV):
                if fused:
                    out[h, d] = fma32(out[h, d], so, _F32(parts[c, h, d] * sn))
                else:
                    out[h, d] = _F32(_F32(out[h, d] * so) + _F32(parts[c, h, d] * sn))
            Sf = fma32(Sf, so, _F32(Sc * sn)) if fused else _F32(_F32(Sf * so) + _F32(Sc * sn))
            Mf = Mn
        if Sf != 0.0:
            inv = _F32(_F32(1.0) / Sf)
            for d in range(DV):
                out[h, d] = _F32(out[h, d] * inv)


@jit
def _tiled_rows(q, k, v, scale, pos, n_swa, T_, isa, fused, out, has_sinks, sinks):
    # ggml_compute_forward_flash_attn_ext_tiled, one query row at a time
    # (a row's arithmetic does not depend on the rows it shares a tile
    # with). q (n, H, DK) float32 unrounded; k (Hkv, T, DK), v (Hkv, T, DV)
    # float32 values of the F16 cells; out (n, H, DV).
    n, H, DK = q.shape
    Hkv, _, DV = v.shape
    G = H // Hkv
    KV = 64
    kq = np.empty(KV, np.float32)
    acc = np.empty(DV, np.float32)
    width = isa.EXPF_LANES
    n_tiles = (T_ + KV - 1) // KV
    for t in range(n):
        for hq in range(H):
            hk = hq // G
            M = _F32(-np.inf)
            S = _F32(0.0)
            for d in range(DV):
                acc[d] = 0.0
            for tile in range(n_tiles):
                c0 = tile * KV
                any_visible = False
                for j in range(KV):
                    c = c0 + j
                    if c < T_ and _visible(c, pos[t], n_swa):
                        any_visible = True
                if not any_visible:
                    continue
                for j in range(KV):
                    c = c0 + j
                    if c < T_ and _visible(c, pos[t], n_swa):
                        a = _F32(0.0)
                        for dk in range(DK):
                            if fused:
                                a = fma32(k[hk, c, dk], q[t, hq, dk], a)
                            else:
                                a = _F32(a + _F32(q[t, hq, dk] * k[hk, c, dk]))
                        kq[j] = _F32(_F32(a * scale) + _F32(0.0))
                    else:
                        kq[j] = _F32(-np.inf)
                tmax = _F32(-np.inf)
                for j in range(KV):
                    if kq[j] > tmax:
                        tmax = kq[j]
                Mn = max(M, tmax)
                if Mn > M:
                    ms = math.exp(_F32(M - Mn))
                    for d in range(DV):
                        acc[d] = _F32(acc[d] * ms)
                    S = _F32(S * ms)
                M = Mn
                tot = 0.0
                for j0 in range(0, KV, width):
                    for l in range(width):
                        kq[j0 + l] = isa.expf_v(_F32(kq[j0 + l] - Mn))
                    tot += np.float64(isa.lane_sum(kq, j0))
                S = _F32(np.float64(S) + tot)
                for d in range(DV):
                    a = acc[d]
                    for j in range(KV):
                        c = c0 + j
                        vv = v[hk, c, d] if c < T_ else _F32(0.0)
                        if fused:
                            a = fma32(vv, kq[j], a)
                        else:
                            a = _F32(a + _F32(kq[j] * vv))
                    acc[d] = a
            if has_sinks:
                S, M = _add_sink(acc, S, M, sinks[hq], fused)
            inv = _F32(0.0) if S == 0.0 else _F32(_F32(1.0) / S)
            for d in range(DV):
                out[t, hq, d] = _F32(acc[d] * inv)


def _f16_values(data: np.ndarray, T_: int) -> np.ndarray:
    """Cells 0 .. T_-1 of an F16 cache (Hkv, >= T_, D) as float32 values."""
    from ..numerics import F16_TO_F32
    return F16_TO_F32[np.ascontiguousarray(data[:, :T_]).view(np.uint16)]


def _v_to_float(t, data: np.ndarray, T_: int, D: int) -> np.ndarray:
    """V cells 0 .. T_-1 (Hkv, >= T_, ...) by ggml's `to_float` of type t
    (exact widening for F16 / BF16, ggml's dequantizers for block types),
    float32 (Hkv, T_, D)."""
    from ..dequant import dequant_f32
    from ..numerics import F16_TO_F32, bf16_bits_to_f32
    d = np.ascontiguousarray(data[:, :T_])
    Hkv = d.shape[0]
    if t == T.F16:
        return F16_TO_F32[d.view(np.uint16)]
    if t == T.BF16:
        return bf16_bits_to_f32(d.view(np.uint16)).reshape(Hkv, T_, D)
    if T_ == 0:
        return np.zeros((Hkv, 0, D), np.float32)
    return dequant_f32(t, d.reshape(-1), Hkv * T_, D).reshape(Hkv, T_, D)


def flash_attn_ext(q: np.ndarray, type_k, kdata: np.ndarray, type_v, vdata: np.ndarray, T_: int,
                   n_kv: int, pos: np.ndarray, scale: float, profile, n_swa: int = 0,
                   n_threads: int = 2, sinks: np.ndarray | None = None,
                   v_width: int | None = None) -> np.ndarray:
    """llama.cpp's flash attention over one layer's cache on `profile`
    (module docstring; `fa_path` picks the path as ggml does).

    q float32 (n, n_head, head_dim) at positions `pos` (int, n); kdata /
    vdata the layer's K and V cells as stored, (n_head_kv, >= T_, ...) (f16:
    float16, bf16: uint16 bits, f32: float32, block types: uint8 row bytes),
    cells 0 .. T_-1 filled; n_kv: llama.cpp's KV length (>= T_; it decides
    the split path); scale: the KQ scale; n_swa > 0: sliding window;
    n_threads: llama.cpp's thread count (it decides the split path's
    chunks); sinks: float32 (n_head,) attention-sink logits
    (`ggml_flash_attn_ext_add_sinks`, taken after the keys, by the first
    chunk only in the split path) or None. Query head j reads KV head j //
    (n_head / n_head_kv). Returns float32 (n, n_head * head_dim).

    v_width (None: head_dim): V's head size DV where it is smaller than
    K's DK, as ggml's kernels allow (all three paths loop over DV for V and
    the accumulator, over DK for the K q dots): MLA's absorbed attention
    (deepseek2), whose V is a view of the first DV values of each K cell
    (`build_attn` with `llm_graph_input_attn_k`: vdata is then the cells'
    first DV values, or for a block type their first DV / block_values
    blocks, and type_v is type_k). The result is (n, n_head * DV).
    ValueError from `attention.check_attention_args`, and for a v_width
    outside 1 .. head_dim."""
    check_attention_args(q, kdata, vdata, T_, pos, n_swa)
    type_k, type_v = T(type_k), T(type_v)
    n, H, DK = q.shape
    D = DK if v_width is None else int(v_width)
    if not 1 <= D <= DK:
        raise ValueError(f"flash_attn_ext: v_width {v_width} is outside 1 .. head_dim {DK}")
    Hkv = kdata.shape[0]
    G = H // Hkv
    q = np.ascontiguousarray(q, np.float32)
    pos = np.ascontiguousarray(pos, np.int64)
    fused = bool(profile.fma)
    # GCC 11 leaves the one-chunk kernel's `S = S*ms + vs` apart (FA_S_FMA)
    fused_s = fused and bool(profile.isa.resolve("FA_S_FMA"))
    out = np.empty((n, H, D), np.float32)
    has_sinks = sinks is not None
    sk = np.zeros(H, np.float32) if sinks is None else np.ascontiguousarray(sinks, np.float32)
    # an F32 cache reaches ggml's kernel cast to F16 (`build_attn_mha`)
    if type_k == T.F32:
        type_k, kdata = T.F16, _f16_cells(kdata, T_)
    if type_v == T.F32:
        type_v, vdata = T.F16, _f16_cells(vdata, T_)
    path = fa_path(type_k, type_v, n, n_kv)
    if path == "tiled":
        k = _f16_values(kdata, T_)
        v = _f16_values(vdata, T_)
        _tiled_rows(q, k, v, _F32(scale), pos, int(n_swa), int(T_), profile.isa, fused, out,
                    has_sinks, sk)
        return out.reshape(n, H * D)
    s = np.empty((n, H, max(T_, 1)), np.float32)
    for h in range(Hkv):
        qg = q[:, h * G:(h + 1) * G].reshape(n * G, DK)
        s[:, h * G:(h + 1) * G, :T_] = cache_dots(type_k, kdata[h, :T_], DK, qg, profile, "vec_dot",
                                                 one_row=True).reshape(n, G, T_)
    v = _v_to_float(type_v, vdata, T_, D)
    v16 = type_v == T.F16
    # Arm's FP16 vector arithmetic: the F16 accumulator in binary16 steps of GGML_F16_STEP
    h16 = int(profile.isa.resolve("F16_STEP")) if profile.isa.resolve("F16_VA") else 0
    if path == "split":
        nth = max(1, int(n_threads))
        chunk = -(-int(n_kv) // nth)
        parts = np.zeros((nth, H, D), np.float32)
        Ms = np.full((nth, H), -np.inf, np.float32)
        Ss = np.zeros((nth, H), np.float32)
        for c in range(nth):
            c0, c1 = c * chunk, min((c + 1) * chunk, T_)
            if c0 < c1:
                _vec_rows(s, v, v16, h16, _F32(scale), pos, int(n_swa), c0, c1, fused, fused_s, False,
                          parts[c:c + 1], Ms[c:c + 1], Ss[c:c + 1], has_sinks, sk)
        _reduce_split(parts, Ms, Ss, fused, out[0])
        return out.reshape(n, H * D)
    dummy = np.empty((1, 1), np.float32)
    _vec_rows(s, v, v16, h16, _F32(scale), pos, int(n_swa), 0, int(T_), fused, fused_s, True, out,
              dummy, dummy, has_sinks, sk)
    return out.reshape(n, H * D)


def _f16_cells(data: np.ndarray, T_: int) -> np.ndarray:
    """F32 cells (Hkv, >= T_, D) cast to F16 as ggml_cast does (RNE)."""
    return np.ascontiguousarray(data[:, :T_], np.float32).astype(np.float16)
