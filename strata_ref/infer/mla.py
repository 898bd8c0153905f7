"""Multi-head latent attention (MLA), the attention of llama.cpp's
`deepseek2` architecture (DeepSeek V2 / V3 / R1, Kimi K2, GLM lite), after
`src/models/deepseek2.cpp` (`llama_model_deepseek2::load_arch_hparams`,
`load_arch_tensors`, `graph::graph`) and `llm_graph_context::build_attn`
(with `llm_graph_input_attn_k`) / `build_attn_mha` (`src/llama-graph.cpp`)
of the llama.cpp vendored by llama-cpp-python 0.3.36.

Sizes: H heads; the compressed KV of R = `attention.kv_lora_rank` values
per token; r = `rope.dimension_count` rotated values per head (shared by
the heads on the key side); d_nope = `attention.key_length_mla` - r
unrotated query / key values per head; d_v = `attention.value_length_mla`
values per head. The file's `attention.key_length` is R + r and
`value_length` R: the width of the one KV "head" llama.cpp caches.

The absorbed path llama.cpp takes for files with `attn_k_b` / `attn_v_b`
(what the converter writes), x float32 (n, n_embd) the normed layer input:

    q      = W_q x, or W_qb (rms_norm(W_qa x) * q_a_norm)    (n, H, d_nope + r)
    c, kpe = W_kv_a x, split at R                           (n, R), (n, r)
    kpe    = rope(kpe)                  normal pairs, positions of the tokens
    c      = rms_norm(c) * kv_a_norm
    qn, qp = q split at d_nope per head; qp = rope(qp)
    qa[h]  = W_kb[h] qn[h]              per head: (R x d_nope) times (n, d_nope)
    Q      = qa | qp  (n, H, R + r)     K = c | kpe  (n, 1, R + r)
    a      = softmax(K Q * kq_scale + mask) V    V = the first R values of K's cells
    o[h]   = W_vb[h] a[h]               per head: (d_v x R) times (n, R)
    out    = W_o o                      (n, n_embd)

Every product is `cpu.matmul`'s (`W_kb`, `W_vb`: one F16 (or other type)
matrix per head, the 2-D products ggml's batched mul_mat makes of a 3-D
weight: the same kernel choice per head, never repacked; on x86 builds
ggml converts the permuted q_nope to F16 before tinyBLAS either way, an
ARM build whose tinyBLAS takes F16 weights with F32 activations
(`TINYBLAS_F16_F32B`) could differ and is not checked), the attention
`KVCache.attend` over a cache whose V is a view of K (`kv_cache`, F16
without flash attention as llama-cpp-python runs it), the norms and RoPE
`cpu.ops`'.

kq_scale (deepseek2.cpp): mscale^2 / sqrtf(d_nope + r) in float32, mscale =
attn_factor_org * (1 + 0.1 yarn_log_mul logf(1 / freq_scale)),
attn_factor_org = attn_factor * (1 + 0.1 logf(1 / freq_scale)): 1 /
sqrtf(d_nope + r) without RoPE scaling; `rope.scaling.yarn_log_multiplier`
is read (divided by 0.1 as llama.cpp undoes the converter's factor).

For `strata-ref trace` the block records a subset of deepseek2.cpp's node
names (q, kv_cmpr_pe, k_pe, kv_cmpr, q_pe, Qcur, Kcur, kqv_out and the
output projection), not checked against a llama.cpp dump; the attention's
inner nodes (kq, kq_soft_max, kqv, kqv_mla) are not recorded.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cpu import ops
from ..cpu.matmul import QMatrix
from ..types import block_format
from . import trace as T
from .model import ArchKeys, ModelLoadError, _logf

__all__ = ["MlaParams", "mla_params", "MlaAttention"]


@dataclass(frozen=True)
class MlaParams:
    """MLA's sizes (module docstring): n_lora_q (0: q by `attn_q` directly,
    llama.cpp's lite variants), n_lora_kv (R), d_nope, d_rope (r), d_v, and
    kq_scale (float32 value)."""
    n_lora_q: int
    n_lora_kv: int
    d_nope: int
    d_rope: int
    d_v: int
    kq_scale: float


def _n_vocab(k: ArchKeys) -> int:
    """`vocab_size`, else the length of `tokenizer.ggml.tokens`
    (`load_arch_hparams`' n_vocab)."""
    if "vocab_size" in k:
        return k.int("vocab_size", lo=0)
    toks = k.md.get("tokenizer.ggml.tokens")
    return len(toks) if toks is not None else 0


def mla_params(k: ArchKeys, c: dict) -> MlaParams:
    """MLA's hyperparameters of a deepseek2 file as
    `llama_model_deepseek2::load_arch_hparams` reads them, c the common
    ones (`model.common_params`: head_dim is `attention.key_length`, n_rot
    `rope.dimension_count`, n_layer without the MTP layers).

    `attention.q_lora_rank` is required except for llama.cpp's lite
    variants (26 or 27 layers, or 48 with 128256 tokens); the
    `attention.kv_lora_rank`, `attention.key_length_mla` and
    `value_length_mla` keys are required (files without the MLA lengths
    are the old non-absorbed layout, refused), and so is
    `expert_shared_count`; `attention.temperature_scale` (mistral-large's
    temperature tuning) and the GLM-4.7-Lite default gating (a file without
    `expert_gating_func`, 47 or 48 layers, 154880 tokens: llama.cpp takes
    sigmoid) are refused. Every problem is a ModelLoadError naming the key."""
    n_layer = c["n_layer"]
    n_vocab = _n_vocab(k)
    lite = n_layer in (26, 27) or (n_layer == 48 and n_vocab == 128256)
    n_lora_q = 0 if lite else k.int("attention.q_lora_rank", required=True)
    n_lora_kv = k.int("attention.kv_lora_rank", required=True)
    have_k, have_v = "attention.key_length_mla" in k, "attention.value_length_mla" in k
    if not (have_k and have_v):
        raise ModelLoadError(f"GGUF metadata has no `{k.full('attention.key_length_mla')}` / "
                             f"`{k.full('attention.value_length_mla')}`: the non-absorbed MLA layout "
                             f"of older converters (`attn_kv_b`) is not supported (reconvert the model)")
    d_k = k.int("attention.key_length_mla")
    d_v = k.int("attention.value_length_mla")
    r = c["n_rot"]
    if d_k - r < 1:
        raise ModelLoadError(f"`{k.full('attention.key_length_mla')}` = {d_k} must exceed "
                             f"`{k.full('rope.dimension_count')}` = {r} (llama.cpp asserts it)")
    if c["head_dim"] != n_lora_kv + r:
        raise ModelLoadError(f"`{k.full('attention.key_length')}` = {c['head_dim']} is not "
                             f"kv_lora_rank + rope.dimension_count = {n_lora_kv + r}")
    if k.int("attention.value_length", n_lora_kv) != n_lora_kv:
        raise ModelLoadError(f"`{k.full('attention.value_length')}` is not "
                             f"`{k.full('attention.kv_lora_rank')}` = {n_lora_kv}")
    if c["n_head_kv"] != 1:
        raise ModelLoadError(f"`{k.full('attention.head_count_kv')}` = {c['n_head_kv']}: MLA caches "
                             f"one KV head (the converter writes 1)")
    if "expert_shared_count" not in k:
        raise ModelLoadError(f"GGUF metadata has no `{k.full('expert_shared_count')}`")
    if k.float("attention.temperature_scale", 0.0, positive=False) != 0.0:
        raise ModelLoadError(f"`{k.full('attention.temperature_scale')}` (attention temperature "
                             f"tuning) is not supported")
    if not k.int("expert_gating_func", 0, lo=0) and n_layer in (47, 48) and n_vocab == 154880:
        raise ModelLoadError(f"GGUF metadata has no `{k.full('expert_gating_func')}` and looks like "
                             f"GLM-4.7-Lite (llama.cpp's sigmoid default for it is not supported)")
    f = np.float32
    log_mul = f(k.float("rope.scaling.yarn_log_multiplier", 0.0, positive=False)) / f(0.1)
    # deepseek2.cpp: attn_factor 1 (llama-cpp-python's; `rope.scaling.attn_factor`
    # other than 1 is refused by the MoE graph), freq_scale from the RoPE scaling
    lg = _logf(f(1.0) / f(c["rope_freq_scale"]))
    org = f(1.0) * f(f(1.0) + f(f(0.1) * lg))
    mscale = f(org * f(f(1.0) + f(f(f(0.1) * f(log_mul)) * lg)))
    kq_scale = f(f(f(f(1.0) * mscale) * mscale) / np.sqrt(f(d_k)))
    return MlaParams(n_lora_q=n_lora_q, n_lora_kv=n_lora_kv, d_nope=d_k - r, d_rope=r, d_v=d_v,
                     kq_scale=float(kq_scale))


def _per_head(w, name: str, n_head: int, rows: int, cols: int, profile) -> list:
    """The 3-D tensor `name` of ggml shape {cols, rows, n_head} as one
    `QMatrix` of rows x cols per head (ggml's mul_mat of a 3-D weight runs
    one 2-D product per head; such a tensor never sits in the repack
    buffer)."""
    t = w.get(name)
    w.checked(name, t, (cols, rows, n_head))
    fmt = block_format(t.type)
    if cols % fmt.block_values:
        raise ModelLoadError(f"tensor `{name}`: row length {cols} is not a multiple of the "
                             f"{t.type.name} block of {fmt.block_values}")
    size = rows * cols // fmt.block_values * fmt.block_bytes
    raw = np.asarray(t.data, np.uint8).reshape(-1)
    mats = []
    for h in range(n_head):
        m = QMatrix(t.type, raw[h * size:(h + 1) * size], rows, cols, f"{name}[{h}]", profile)
        m.repackable = False
        mats.append(m)
    return mats


class MlaAttention:
    """One MLA block (module docstring), loaded from the tensors of the
    layer whose names start with `prefix`; hp has n_embd, n_head, eps and
    `mla` (`MlaParams`).

    `__call__(x, pos, cache, ci, cos_sin, n_swa=0)`: x float32 (n,
    n_embd); pos int (n,) positions; cache a `KVCache` made with `v_of_k`
    = R (ci: this layer's slot); cos_sin the RoPE tables (n, r/2) of `pos`.
    Returns float32 (n, n_embd). A missing tensor, or one of another shape,
    is a ModelLoadError naming it; a file with `attn_kv_b` (the
    non-absorbed layout) is refused."""

    def __init__(self, w, prefix: str, hp, spec, profile):
        m = hp.mla
        e, H = hp.n_embd, hp.n_head
        R, r, dn, dv = m.n_lora_kv, m.d_rope, m.d_nope, m.d_v
        self.hp, self.m, self.cpu = hp, m, profile
        self.il = int(prefix.split(".")[1]) if prefix.startswith("blk.") else -1
        if w.has(prefix + "attn_kv_b.weight"):
            raise ModelLoadError(f"{hp.arch}: tensor `{prefix}attn_kv_b.weight` (the non-absorbed MLA "
                                 f"layout of older converters) is not supported")
        if m.n_lora_q:
            self.wq = None
            self.wq_a = w.mat(prefix + "attn_q_a.weight", m.n_lora_q, e)
            self.q_a_norm = w.vec(prefix + "attn_q_a_norm.weight", m.n_lora_q)
            self.wq_b = w.mat(prefix + "attn_q_b.weight", H * (dn + r), m.n_lora_q)
        else:
            self.wq_a = self.q_a_norm = self.wq_b = None
            self.wq = w.mat(prefix + "attn_q.weight", H * (dn + r), e)
        self.wkv_a = w.mat(prefix + "attn_kv_a_mqa.weight", R + r, e)
        self.kv_a_norm = w.vec(prefix + "attn_kv_a_norm.weight", R)
        self.wk_b = _per_head(w, prefix + "attn_k_b.weight", H, R, dn, profile)
        self.wv_b = _per_head(w, prefix + "attn_v_b.weight", H, dv, R, profile)
        self.wo = w.mat(prefix + "attn_output.weight", e, H * dv)
        #: the name of the output projection's node (the trace's)
        self.out_name = T.derived_name("MUL_MAT", [self.wo.name, T.node("kqv_out", self.il)])

    def matrices(self) -> list:
        qs = [self.wq] if self.wq is not None else [self.wq_a, self.wq_b]
        return qs + [self.wkv_a] + self.wk_b + self.wv_b + [self.wo]

    def __call__(self, x, pos, cache, ci, cos_sin, n_swa=0):
        hp, m, il, prof = self.hp, self.m, self.il, self.cpu
        n, H = x.shape[0], hp.n_head
        R, r, dn = m.n_lora_kv, m.d_rope, m.d_nope
        cos, sin = cos_sin
        if self.wq is None:
            q = self.wq_a.matmul(x)
            T.emit("q", "MUL_MAT", q, il)
            q = T.norm(q, self.q_a_norm, hp.eps, "q", il)
            q = self.wq_b.matmul(q)
        else:
            q = self.wq.matmul(x)
        T.emit("q", "MUL_MAT", q, il)
        q = q.reshape(n, H, dn + r)
        kv_pe = self.wkv_a.matmul(x)
        T.emit("kv_cmpr_pe", "MUL_MAT", kv_pe, il)
        k_pe = ops.rope(kv_pe[:, R:].reshape(n, 1, r), cos, sin, r, False, prof)
        T.emit("k_pe", "ROPE", k_pe, il)
        kv = T.norm(np.ascontiguousarray(kv_pe[:, :R]), self.kv_a_norm, hp.eps, "kv_cmpr", il)
        q_pe = ops.rope(q[:, :, dn:], cos, sin, r, False, prof)
        T.emit("q_pe", "ROPE", q_pe, il)
        q_nope = q[:, :, :dn]
        q_abs = np.empty((n, H, R), np.float32)
        for h in range(H):
            q_abs[:, h] = self.wk_b[h].matmul(q_nope[:, h])
        T.emit("q_nope_absorbed_perm", "PERMUTE", q_abs, il)
        Q = np.concatenate([q_abs, q_pe], axis=2)
        K = np.concatenate([kv.reshape(n, 1, R), k_pe], axis=2)
        T.emit("Qcur", "CONCAT", Q, il)
        T.emit("Kcur", "CONCAT", K, il)
        a = cache.attend(ci, Q, K, None, pos, m.kq_scale, prof, n_swa).reshape(n, H, R)
        o = np.empty((n, H, m.d_v), np.float32)
        for h in range(H):
            o[:, h] = self.wv_b[h].matmul(a[:, h])
        o = o.reshape(n, H * m.d_v)
        T.emit("kqv_out", "CONT", o, il)
        out = self.wo.matmul(o)
        T.emit(self.out_name, "MUL_MAT", out)
        return out
