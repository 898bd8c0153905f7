"""The mixture-of-experts block of ggml-cpu, in its order of arithmetic:
expert selection, the routing weights, `ggml_mul_mat_id` over 3-D expert
tensors and the sum over the selected experts.

Sources (llama.cpp vendored by llama-cpp-python 0.3.36): `build_moe_ffn` in
`src/llama-graph.cpp` (the graph), and in `ggml/src/ggml-cpu/`:

* selection, `ggml_argsort_top_k` (ggml.c): `ggml_argsort` in descending
  order, then a view of its first k columns. The CPU argsort
  (ops.cpp `ggml_compute_forward_argsort_f32`) is `std::sort` of the
  indices 0..n-1 with the comparison `x[a] > x[b]`; `std::sort` is not
  stable, so ties go the way GCC's libstdc++ introsort leaves them
  (`argsort_desc` runs the same algorithm: for n <= 16 its insertion sort,
  which keeps the lower index first; above, median-of-three partitioning).
* `ggml_mul_mat_id` (ggml-cpu.c `ggml_compute_forward_mul_mat_id`): the
  activation rows are quantized to the weight's `vec_dot_type` row by row,
  then grouped by expert (token-major, slot-minor order), and each expert
  with routed rows multiplies them: ggml's tiled kernel when the expert's
  type has it and at least 8 rows are routed to it
  (`ggml_compute_forward_mul_mat_id_tiled`, `ggml_tiled_min_batch`), else
  `vec_dot` row by row; never llamafile's tinyBLAS. Weights in the
  CPU_REPACK buffer (Q4_0, Q4_K, IQ4_NL, MXFP4 with rows % 8 == 0 on AVX2
  builds, Q2_K on AVX-512, and only 3-D tensors: n_expert > 1) take
  repack.cpp `forward_mul_mat_id`: the repacked gemv for every routed row,
  activations from the plain `from_float`. `QMatrix.matmul(x, mmid=True)`
  computes one expert's rows so; each row's result does not depend on the
  other rows routed with it, only on their number.
* group-limited routing (DeepSeek V3: `expert_group_count` > 1, the
  block under "select top n_group_used expert groups" in `build_moe_ffn`):
  the selection scores viewed as n_group rows of n_expert / n_group; each
  group's score is the `sum_rows` (double) of its two largest scores (an
  `argsort_top_k` of 2, then `get_rows`), the `argsort_top_k` of
  n_group_used over the group scores picks the groups, and the scores of
  the other groups become -inf (`ggml_fill` then `ggml_set_rows`) before
  the top k of the experts (`group_limited`).
* the weights: `soft_max` of the router logits (or of the k selected
  logits for gpt-oss's SOFTMAX_WEIGHT), `ggml_get_rows` of the selected
  probabilities, with `norm_w` their `sum_rows` (double), clamped to at
  least 6.103515625e-5, and a division; `ggml_scale` by w_scale when it is
  neither 0 nor 1.
* `ggml_add_id` (the per-expert biases of gpt-oss): one float add per value.
* the sum: the down-projections times their weight (`ggml_mul`), then
  added slot after slot, ((e0 + e1) + e2) + ..., each a float32 add.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ._digest import jit
from . import ops
from .matmul import QMatrix
from ..types import block_format

__all__ = ["argsort_desc", "top_k", "group_limited", "routing_weights", "ExpertMatrix", "expert_sum"]

_F32 = np.float32
_THRESHOLD = 16          # libstdc++ `_S_threshold`


@njit(inline="always", cache=True)
def _gt(x, a, b):
    # the argsort comparison of ggml (GGML_SORT_ORDER_DESC): x[a] > x[b]
    return x[a] > x[b]


@njit(inline="always", cache=True)
def _adjust_heap(x, v, first, hole, length, value):
    # libstdc++ std::__adjust_heap then std::__push_heap (bits/stl_heap.h)
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if _gt(x, v[first + child], v[first + child - 1]):
            child -= 1
        v[first + hole] = v[first + child]
        hole = child
    if (length & 1) == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        v[first + hole] = v[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and _gt(x, v[first + parent], value):
        v[first + hole] = v[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    v[first + hole] = value


@njit(inline="always", cache=True)
def _heap_sort(x, v, first, last):
    # std::__partial_sort(first, last, last): make_heap, then sort_heap
    length = last - first
    if length >= 2:
        parent = (length - 2) // 2
        while True:
            _adjust_heap(x, v, first, parent, length, v[first + parent])
            if parent == 0:
                break
            parent -= 1
    while last - first > 1:
        last -= 1
        value = v[last]
        v[last] = v[first]
        _adjust_heap(x, v, first, 0, last - first, value)


@njit(inline="always", cache=True)
def _median_to_first(x, v, result, a, b, c):
    # std::__move_median_to_first
    if _gt(x, v[a], v[b]):
        if _gt(x, v[b], v[c]):
            m = b
        elif _gt(x, v[a], v[c]):
            m = c
        else:
            m = a
    elif _gt(x, v[a], v[c]):
        m = a
    elif _gt(x, v[b], v[c]):
        m = c
    else:
        m = b
    t = v[result]
    v[result] = v[m]
    v[m] = t


@njit(inline="always", cache=True)
def _partition_pivot(x, v, first, last):
    # std::__unguarded_partition_pivot: median of (first + 1, mid, last - 1)
    # moved to first, then the unguarded partition of [first + 1, last)
    mid = first + (last - first) // 2
    _median_to_first(x, v, first, first + 1, mid, last - 1)
    lo, hi = first + 1, last
    pivot = v[first]
    while True:
        while _gt(x, v[lo], pivot):
            lo += 1
        hi -= 1
        while _gt(x, pivot, v[hi]):
            hi -= 1
        if not lo < hi:
            return lo
        t = v[lo]
        v[lo] = v[hi]
        v[hi] = t
        lo += 1


@njit(inline="always", cache=True)
def _insertion_sort(x, v, first, last, guarded):
    # std::__insertion_sort (guarded) / std::__unguarded_insertion_sort
    start = first + 1 if guarded else first
    for i in range(start, last):
        val = v[i]
        if guarded and _gt(x, val, v[first]):
            for j in range(i, first, -1):
                v[j] = v[j - 1]
            v[first] = val
            continue
        j = i
        while _gt(x, val, v[j - 1]):
            v[j] = v[j - 1]
            j -= 1
        v[j] = val


@jit
def _std_sort_desc(x, v):
    # libstdc++'s std::sort (bits/stl_algo.h, GCC 12): introsort with depth
    # limit 2 floor(log2 n), ranges of at most 16 left to the final
    # insertion sort; the recursion on the right part kept on a stack (the
    # order ranges are finished in does not change the result)
    n = v.shape[0]
    if n < 2:
        return
    lg = 0
    while (1 << (lg + 1)) <= n:
        lg += 1
    stack_first = np.empty(2 * 64, np.int64)
    stack_last = np.empty(2 * 64, np.int64)
    stack_depth = np.empty(2 * 64, np.int64)
    sp = 0
    stack_first[0], stack_last[0], stack_depth[0] = 0, n, 2 * lg
    sp = 1
    while sp > 0:
        sp -= 1
        first, last, depth = stack_first[sp], stack_last[sp], stack_depth[sp]
        while last - first > _THRESHOLD:
            if depth == 0:
                _heap_sort(x, v, first, last)
                break
            depth -= 1
            cut = _partition_pivot(x, v, first, last)
            stack_first[sp], stack_last[sp], stack_depth[sp] = cut, last, depth
            sp += 1
            last = cut
    if n > _THRESHOLD:
        _insertion_sort(x, v, 0, _THRESHOLD, True)
        _insertion_sort(x, v, _THRESHOLD, n, False)
    else:
        _insertion_sort(x, v, 0, n, True)


@jit
def _argsort_rows(x, out):
    for r in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[r, j] = j
        _std_sort_desc(x[r], out[r])


def argsort_desc(x: np.ndarray) -> np.ndarray:
    """ggml `argsort(x, GGML_SORT_ORDER_DESC)` on the CPU (module docstring):
    for each row of x (float32 (R, n)) the indices 0..n-1 in the order
    libstdc++'s `std::sort` leaves them under `x[a] > x[b]`, ties and NaNs
    included. Returns int32 (R, n)."""
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2:
        raise ValueError(f"argsort_desc: x must be (rows, n), got shape {x.shape}")
    out = np.empty(x.shape, np.int32)
    _argsort_rows(x, out)
    return out


def top_k(x: np.ndarray, k: int) -> np.ndarray:
    """ggml `argsort_top_k(x, k)`: the first k columns of `argsort_desc`,
    int32 (R, k) (the experts a token is routed to, in ggml's slot order)."""
    if not 1 <= k <= np.shape(x)[-1]:
        raise ValueError(f"top_k: k = {k} is outside 1 .. {np.shape(x)[-1]}")
    return np.ascontiguousarray(argsort_desc(x)[:, :k])


#: `build_moe_ffn`'s floor for the sum of the weights (the smallest normal F16)
WEIGHTS_SUM_MIN = _F32(6.103515625e-5)


def selection_scores(logits: np.ndarray, gating: str, profile, bias: np.ndarray | None = None,
                     probs_bias: np.ndarray | None = None):
    """(probs, selection) float32 (n_tokens, n_expert) of `build_moe_ffn`:
    the probabilities the weights are taken from and the scores the top k
    is chosen by (`routing_weights` has the arguments)."""
    logits = np.ascontiguousarray(logits, np.float32)
    if bias is not None:
        logits = (logits + bias).astype(np.float32)
    if gating == "softmax":
        probs = ops.soft_max_rows(logits, profile)
    elif gating == "softmax_weight":
        probs = logits
    elif gating == "sigmoid":
        probs = ops.sigmoid(logits)
    else:
        raise ValueError(f"expert gating {gating!r} is not supported (softmax, softmax_weight, sigmoid)")
    selection = probs if probs_bias is None else (probs + probs_bias).astype(np.float32)
    return probs, selection


def group_limited(selection: np.ndarray, n_group: int, n_group_used: int):
    """The selection scores of group-limited routing (module docstring;
    llama.cpp `build_moe_ffn`, src/llama-graph.cpp): selection float32
    (n_tokens, n_expert), the experts in n_group consecutive groups of
    n_expert / n_group (at least 2: `ggml_argsort_top_k` asserts it).
    Returns (masked float32 (n_tokens, n_expert): the scores of the groups
    not chosen set to -inf, groups int32 (n_tokens, n_group_used): the
    chosen groups in ggml's order, group_scores float32 (n_tokens,
    n_group)). Raises ValueError for sizes llama.cpp refuses."""
    sel = np.ascontiguousarray(selection, np.float32)
    n, E = sel.shape
    if not 1 < n_group < E or E % n_group or E // n_group < 2 or not 0 < n_group_used < n_group:
        raise ValueError(f"group_limited: {E} experts in {n_group} groups, {n_group_used} used")
    per = E // n_group
    rows = sel.reshape(n * n_group, per)
    top2 = np.take_along_axis(rows, top_k(rows, 2), axis=1)
    # ggml_sum_rows of the two (ggml_vec_sum_f32: in double, then float)
    scores = ops.sum_rows(top2).reshape(n, n_group)
    groups = top_k(scores, n_group_used)
    masked = np.full((n, n_group, per), -np.inf, np.float32)
    g3 = sel.reshape(n, n_group, per)
    for t in range(n):
        masked[t, groups[t]] = g3[t, groups[t]]
    return masked.reshape(n, E), groups.astype(np.int32), scores


def routing_weights(logits: np.ndarray, k: int, gating: str, norm_w: bool, w_scale: float,
                    profile, bias: np.ndarray | None = None, probs_bias: np.ndarray | None = None,
                    groups: tuple | None = None):
    """Expert selection and weights of `build_moe_ffn` (module docstring).

    logits: float32 (n_tokens, n_expert), the router mat-mul's output;
    bias: float32 (n_expert,) added first (gpt-oss's router bias) or None;
    gating: "softmax" (probabilities = soft_max(logits), qwen3moe,
    qwen3next), "softmax_weight" (selection on the logits, the k selected
    logits soft-maxed: gpt-oss) or "sigmoid" (probabilities =
    sigmoid(logits), ggml's `op_sigmoid`: glm4moe); probs_bias: float32
    (n_expert,) added to the probabilities for the selection only
    (`exp_probs_b`, glm4moe), the weights are the unbiased probabilities;
    w_scale: the weights times it unless 0 or 1 (`expert_weights_scale`);
    groups: (n_group, n_group_used) of group-limited routing
    (`group_limited`, applied to the selection scores) or None.
    Returns (ids int32 (n_tokens, k), weights float32 (n_tokens, k)).
    Raises ValueError for another gating."""
    probs, selection = selection_scores(logits, gating, profile, bias, probs_bias)
    if groups is not None and len(selection):
        selection = group_limited(selection, *groups)[0]
    ids = top_k(selection, k)
    w = np.take_along_axis(probs, ids, axis=1)
    if gating == "softmax_weight":
        w = ops.soft_max_rows(w, profile)
    if norm_w:
        s = ops.sum_rows(w)
        # ggml_clamp(s, 6.1e-5, INFINITY) is MAX(MIN(s, INFINITY), 6.1e-5)
        # with C's comparisons: a NaN sum becomes +inf there, not NaN
        s = np.where(s < np.float32(np.inf), s, np.float32(np.inf))
        s = np.where(s > WEIGHTS_SUM_MIN, s, WEIGHTS_SUM_MIN).astype(np.float32)
        w = (w / s[:, None]).astype(np.float32)
    if w_scale != 0.0 and w_scale != 1.0:
        w = (w * _F32(w_scale)).astype(np.float32)
    return ids, np.ascontiguousarray(w, np.float32)


class ExpertMatrix:
    """A 3-D expert tensor: ggml shape {cols, rows, n_expert}, expert e's
    rows x cols matrix at bytes e * rows * row_bytes, one `QMatrix` each
    (packed at its first use). `mul_mat_id` is ggml's `ggml_mul_mat_id`
    with it (module docstring)."""

    def __init__(self, t, raw, n_expert: int, rows: int, cols: int, name: str = "", profile=None):
        raw = np.asarray(raw, np.uint8).reshape(-1)
        fmt = block_format(t)
        per = rows * (cols // fmt.block_values) * fmt.block_bytes
        if cols % fmt.block_values or raw.size != n_expert * per:
            raise ValueError(f"{name}: {raw.size} bytes do not hold {n_expert} x {rows} x {cols} {fmt.name}")
        self.n_expert, self.rows, self.cols, self.name = int(n_expert), int(rows), int(cols), name
        self.experts = [QMatrix(t, raw[e * per:(e + 1) * per], rows, cols, f"{name}[{e}]", profile)
                        for e in range(n_expert)]
        if n_expert == 1:
            # a 2-D MUL_MAT_ID weight is not taken by the CPU_REPACK buffer
            # (its supports_op asks for 3 dimensions)
            for q in self.experts:
                q.repackable = False
        self.type = self.experts[0].type
        self.profile = self.experts[0].profile

    @classmethod
    def stack(cls, mats: list["ExpertMatrix"], name: str = "") -> "ExpertMatrix":
        """One expert tensor holding, per expert, the rows of `mats` in order
        (gate | up: one activation quantization and one kernel call per
        expert; rows are independent, so no bit changes)."""
        out = cls.__new__(cls)
        out.n_expert, out.cols, out.name = mats[0].n_expert, mats[0].cols, name
        out.rows = sum(m.rows for m in mats)
        out.experts = [QMatrix.stack([m.experts[e] for m in mats], f"{name}[{e}]", mmid=True)
                       for e in range(out.n_expert)]
        out.type, out.profile = mats[0].type, mats[0].profile
        return out

    def prepare(self) -> None:
        for q in self.experts:
            q.prepare()

    def mul_mat_id(self, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """ggml `mul_mat_id(W, x, ids)`: out[t, j] = W[ids[t, j]] @ x[t, j %
        n_src]. x float32 (n_tokens, n_src, cols) with n_src 1 (one
        activation per token, broadcast to every slot) or k; ids int
        (n_tokens, k) in [0, n_expert). Returns float32 (n_tokens, k, rows)."""
        x = np.ascontiguousarray(x, np.float32)
        ids = np.asarray(ids)
        T, k = ids.shape
        if x.ndim != 3 or x.shape[0] != T or x.shape[1] not in (1, k) or x.shape[2] != self.cols:
            raise ValueError(f"{self.name}: activations must be ({T}, 1 or {k}, {self.cols}), got {x.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_expert):
            raise ValueError(f"{self.name}: expert ids must lie in [0, {self.n_expert})")
        out = np.empty((T, k, self.rows), np.float32)
        flat = ids.reshape(-1)              # token-major, slot-minor: ggml's grouping order
        tok = np.repeat(np.arange(T), k)
        slot = np.tile(np.arange(k), T)
        src = slot % x.shape[1]
        for e in np.unique(flat):
            sel = np.flatnonzero(flat == e)
            y = self.experts[int(e)].matmul(x[tok[sel], src[sel]], mmid=True)
            out[tok[sel], slot[sel]] = y
        return out


def expert_sum(y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The last steps of `build_moe_ffn`: `ggml_mul(experts, weights)`, then
    the k slots added in order (((y0 w0 + y1 w1) + y2 w2) + ...), float32
    throughout. y float32 (n_tokens, k, n_embd); weights (n_tokens, k).
    Returns float32 (n_tokens, n_embd)."""
    yw = (y * weights[:, :, None]).astype(np.float32)
    out = yw[:, 0].copy()
    for j in range(1, yw.shape[1]):
        out = (out + yw[:, j]).astype(np.float32)
    return out
