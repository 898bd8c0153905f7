"""Attention over a KV cache of any type that llama.cpp's CPU backend
stores (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl), without
flash attention, in each CPU profile's float order.

Source: llama.cpp vendored by llama-cpp-python 0.3.36,
`llm_graph_context::build_attn_mha` (src/llama-graph.cpp), flash attention
off: kq = ggml_mul_mat(K, q), soft_max_ext with the causal (sliding-window)
mask, kqv = ggml_mul_mat(V^T, kq). Both products are ordinary ggml-cpu
mat-muls (`ggml_compute_forward_mul_mat`) whose "weight" is a view of the
cache, so they take ggml's dispatch (`traits.mm_path`) with the cache as
src0: q (and for V^T the probabilities) converted to the cache type's
`vec_dot_type` by its `from_float` (Q8_0 / Q8_1 by the profile's activation
quantizer, F16 by RNE, BF16 by ggml's rule), then the type's `vec_dot` or,
from two tokens on, llamafile's tinyBLAS where the build has it. A cache
view is never in the CPU_REPACK buffer. ggml's m for K q is the KV length
llama.cpp passes (`n_kv`, a multiple of 256), for V^T p it is head_dim; the
V p product runs over all n_kv cells, the unused ones with probability 0.
One exception: q is a permuted view, which ggml converts to K's
vec_dot_type before llamafile sees it; an F32 K has no conversion, and
llamafile refuses a non-contiguous src1, so K q with an F32 cache is always
vec_dot (found with tools/llama_dump.py on an f32 cache).

The F16 / F16 case is `f16_attention.attention` (one numba call per layer); this
module runs every other pair through `matmul.QMatrix` per KV head, the
query heads of one group stacked (rows are independent, and the path is
the one ggml takes for the call's token count).
"""
from __future__ import annotations

import numpy as np

from ..types import GGMLType as T
from .matmul import QMatrix
from .ops import soft_max
from .mmla import TWO_ROW_VARIANTS
from .traits import kernel, mm_path

__all__ = ["cache_dots", "cache_raw", "attention_mm"]


def cache_raw(data: np.ndarray) -> np.ndarray:
    """The bytes of cache rows as stored (float16 / uint16 bf16 bits /
    float32 values, or uint8 blocks), flat uint8."""
    return np.ascontiguousarray(data).view(np.uint8).reshape(-1)


def cache_dots(t, data: np.ndarray, cols: int, x: np.ndarray, profile, path: str,
               one_row: bool = False) -> np.ndarray:
    """out[i, r] = ggml-cpu's dot of cache row r (type t; `data` the rows
    as stored, (rows, ...)) with activation row i of x (float32 (n, cols)),
    on the ggml `path` ("vec_dot" or "tinyblas", `traits.mm_path`), the
    activation first converted to t's vec_dot_type as ggml does. one_row:
    every dot by the one-row `vec_dot` (`nrc` 1), as flash attention calls
    it: never llamafile's tinyBLAS_Q0 nor the i8mm two-row code (a
    MUL_MAT_ID's rule, `matmul.QMatrix.matmul`'s mmid). Returns float32
    (n, rows)."""
    rows = data.shape[0]
    qm = QMatrix(t, cache_raw(data), rows, cols, "kv cache", profile)
    qm.repackable = False
    qm.path = path
    return qm.matmul(np.ascontiguousarray(x, np.float32), mmid=one_row)


def check_attention_args(q, kdata, vdata, T_, pos, n_swa, n_kv=None) -> None:
    """ValueError naming the argument when the attention kernels' inputs
    disagree (they index the cache by them, so a wrong value would read
    outside it): q float32 (n, n_head, head_dim), n >= 1; kdata / vdata
    arrays (n_head_kv, cells, ...) with n_head a multiple of n_head_kv;
    1 <= T_ <= cells; n_kv (when given) >= T_; pos n positions in
    0 .. T_-1; n_swa >= 0."""
    q = np.asarray(q)
    if q.ndim != 3 or 0 in q.shape:
        raise ValueError(f"attention: q must be (n, n_head, head_dim), got {q.shape}")
    n, n_head = q.shape[0], q.shape[1]
    for name, a in (("K", kdata), ("V", vdata)):
        if not isinstance(a, np.ndarray) or a.ndim < 2:
            raise ValueError(f"attention: the {name} cells must be an array (n_head_kv, cells, ...)")
    if kdata.shape[:2] != vdata.shape[:2]:
        raise ValueError(f"attention: K cells {kdata.shape[:2]} and V cells {vdata.shape[:2]} differ")
    n_head_kv, cells = kdata.shape[0], kdata.shape[1]
    if n_head_kv == 0 or n_head % n_head_kv:
        raise ValueError(f"attention: n_head {n_head} is not a multiple of n_head_kv {n_head_kv}")
    if not 1 <= int(T_) <= cells:
        raise ValueError(f"attention: T = {T_} is outside 1 .. {cells} (the cache's cells)")
    if n_kv is not None and int(n_kv) < int(T_):
        raise ValueError(f"attention: n_kv = {n_kv} is below T = {T_}")
    p = np.asarray(pos)
    if p.shape != (n,) or p.min() < 0 or p.max() >= int(T_):
        raise ValueError(f"attention: pos must be {n} positions in 0 .. {int(T_) - 1}")
    if int(n_swa) < 0:
        raise ValueError(f"attention: n_swa must be >= 0, got {n_swa}")


def attention_mm(q: np.ndarray, type_k, kdata: np.ndarray, type_v, vdata: np.ndarray, T_: int,
                 n_kv: int, pos: np.ndarray, kq_scale: float, profile, n_swa: int = 0,
                 sinks: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's attention without flash attention over one layer's cache
    (module docstring): q float32 (n, n_head, head_dim) at positions `pos`
    (int, n); kdata / vdata the layer's K and V cells as stored, (n_head_kv,
    >= T_, ...) (f16: float16, bf16: uint16 bits, f32: float32, block types:
    uint8 row bytes), cells 0 .. T_-1 filled; n_kv: llama.cpp's KV length
    (>= T_, ggml's m for K q and the length of V p); V of type f32, f16 or
    bf16; sinks: float32 (n_head,) attention-sink logits
    (`ggml_soft_max_add_sinks`) or None. Query head j reads KV head j //
    (n_head / n_head_kv). Returns float32 (n, n_head * head_dim).
    ValueError from `check_attention_args`."""
    check_attention_args(q, kdata, vdata, T_, pos, n_swa, n_kv)
    type_k, type_v = T(type_k), T(type_v)
    n, H, D = q.shape
    Hkv = kdata.shape[0]
    G = H // Hkv
    # q reaches K q as a permuted (non-contiguous) view: ggml converts it to
    # K's vec_dot_type and hands the copy to llamafile; an F32 K has nothing
    # to convert, and llamafile's first attempt wants a contiguous src1, so
    # that product is vec_dot whatever the token count (`mm_path`
    # src1_cont). kq is contiguous: V p takes ggml's path for V's type.
    isa = profile.isa
    path_kq = mm_path(isa, type_k, n, False, n_kv, D, src1_cont=False)
    path_vp = mm_path(isa, type_v, n, False, D, n_kv)
    # a two-row `vec_dot` (i8mm, `mmla`): ggml takes it per chunk of the
    # whole product, K's n_kv rows against every query head's tokens (nr1 =
    # n * H), and only when each head has an even number of tokens (ne11)
    two_row = path_kq == "vec_dot" and kernel(isa, type_k, "vec_dot") in TWO_ROW_VARIANTS
    q_all = np.ascontiguousarray(q.transpose(1, 0, 2)).reshape(H * n, D)    # head after head
    out = np.empty((n, H, D), np.float32)
    qpos = np.tile(np.asarray(pos, np.int64), G)
    for h in range(Hkv):
        # rows (g, t): the G query heads of this KV head, token after token
        rows = slice(h * G * n, (h + 1) * G * n)
        if two_row and n % 2 == 0:
            kk = np.zeros((max(n_kv, T_),) + kdata.shape[2:], kdata.dtype)
            kk[:T_] = kdata[h, :T_]
            s = np.ascontiguousarray(cache_dots(type_k, kk, D, q_all, profile, path_kq)[rows, :T_])
        else:
            s = cache_dots(type_k, kdata[h, :T_], D, q_all[rows], profile, path_kq, one_row=two_row)
        sk = None if sinks is None else np.repeat(np.asarray(sinks, np.float32)[h * G:(h + 1) * G], n)
        p = soft_max(s, kq_scale, qpos, profile, n_swa, sk)
        pk = np.zeros((G * n, n_kv), np.float32)
        pk[:, :min(p.shape[1], n_kv)] = p[:, :n_kv]
        vt = np.zeros((D, n_kv), vdata.dtype)
        vt[:, :T_] = vdata[h, :T_].T
        o = cache_dots(type_v, vt, n_kv, pk, profile, path_vp)
        out[:, h * G:(h + 1) * G] = o.reshape(G, n, D).transpose(1, 0, 2)
    return out.reshape(n, H * D)
