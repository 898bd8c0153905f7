"""Blocks that several architecture graphs share: the attention block with
its options (llama.cpp `llm_graph_context::build_qkv` and `build_attn`,
`src/llama-graph.cpp`) and the dense gated FFN (`build_ffn`, SwiGLU or
GeGLU), each loaded from the file's tensors and run in ggml-cpu's order of
arithmetic (`strata_ref.cpu`).
"""
from __future__ import annotations

import numpy as np

from ..cpu import ops
from ..cpu.matmul import QMatrix
from . import trace as T

__all__ = ["Attention", "GatedFFN", "sigmoid"]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """ggml `sigmoid` (unary-ops.cpp `op_sigmoid`): 1 / (1 + expf(-x)),
    libm's expf, every step a float32 operation; any shape."""
    return ops.sigmoid(x)


class Attention:
    """One self-attention block: q, k, v projections (+ biases), the q / k
    RMSNorms per head, RoPE, softmax(K q * kq_scale + mask [+ sinks]) V
    over the KV cache (`KVCache.attend`: its type, rotation, flash attention or
not), the output projection (+ bias).

    Options, each as one llama.cpp architecture builds them:
    `qk_norm` (qwen3, gemma3, qwen3moe, qwen3next); `attn_scale` (gemma3:
    q times it after RoPE); `q_gate` (qwen3next: attn_q holds per head the
    query then a gate, and the attention output is multiplied by
    sigmoid(gate) before attn_output); `sinks` (gpt-oss: one learned logit
    per head added to the softmax's sum); `out_bias` (gpt-oss).

    `__call__(x, pos, cache, ci, cos_sin, n_swa)`: x float32 (n, n_embd)
    (the normed input); pos int (n,) positions; cache a KV cache with
    `store(ci, k, v)`, `k`/`v` per layer and `n` the filled positions
    (ci: this block's slot in it); cos_sin the RoPE tables of `pos`;
    n_swa > 0 a sliding window. Returns float32 (n, n_embd).
    """

    #: architectures whose llama.cpp graph evaluates K before V (the ones
    #: built with the iSWA KV cache); the others evaluate V first
    K_FIRST = ("gemma3", "gpt-oss")

    def __init__(self, w, prefix: str, hp, profile, *, qk_norm=False, q_gate=False, sinks=False,
                 out_bias=False, attn_scale=1.0):
        e, hd = hp.n_embd, hp.head_dim
        nq, nkv = hp.n_head * hd, hp.n_head_kv * hd
        self.hp, self.cpu = hp, profile
        #: the layer (for the trace's node names) and the name the output
        #: projection's node got in the last call
        self.il = int(prefix.split(".")[1]) if prefix.startswith("blk.") else -1
        self.out_name = ""
        self.q_gate, self.attn_scale = q_gate, attn_scale
        nq_rows = 2 * nq if q_gate else nq
        if w.has(prefix + "attn_qkv.weight"):
            raise _fused(hp.arch)
        self.wq = w.mat(prefix + "attn_q.weight", nq_rows, e)
        self.wk = w.mat(prefix + "attn_k.weight", nkv, e)
        self.wv = w.mat(prefix + "attn_v.weight", nkv, e)
        self.wo = w.mat(prefix + "attn_output.weight", e, nq)
        self.bq = w.vec(prefix + "attn_q.bias", nq_rows, required=False)
        self.bk = w.vec(prefix + "attn_k.bias", nkv, required=False)
        self.bv = w.vec(prefix + "attn_v.bias", nkv, required=False)
        self.bo = w.vec(prefix + "attn_output.bias", e, required=out_bias) if out_bias else None
        self.q_norm = w.vec(prefix + "attn_q_norm.weight", hd) if qk_norm else None
        self.k_norm = w.vec(prefix + "attn_k_norm.weight", hd) if qk_norm else None
        self.sinks = w.vec(prefix + "attn_sinks.weight", hp.n_head) if sinks else None
        # one kernel call for q|k|v when their types agree (rows are
        # independent: no bit changes)
        self.wqkv = (QMatrix.stack([self.wq, self.wk, self.wv], prefix + "attn_qkv")
                     if self.wq.type == self.wk.type == self.wv.type else None)

    def matrices(self) -> list:
        return ([self.wqkv] if self.wqkv is not None else [self.wq, self.wk, self.wv]) + [self.wo]

    def __call__(self, x, pos, cache, ci, cos_sin, n_swa=0):
        hp = self.hp
        n, hd = x.shape[0], hp.head_dim
        nq, nkv = hp.n_head * hd, hp.n_head_kv * hd
        nqr = 2 * nq if self.q_gate else nq
        if self.wqkv is not None:
            qkv = self.wqkv.matmul(x)
            q, k, v = qkv[:, :nqr], qkv[:, nqr:nqr + nkv], qkv[:, nqr + nkv:]
        else:
            q, k, v = self.wq.matmul(x), self.wk.matmul(x), self.wv.matmul(x)
        # the three streams in the order llama.cpp's graph evaluates them
        # (independent: the order changes no bit)
        q, gate = self._query(q, n, cos_sin)
        if hp.arch in self.K_FIRST:
            k = self._key(k, n, cos_sin)
            v = self._value(v, n)
        else:
            v = self._value(v, n)
            k = self._key(k, n, cos_sin)
        a = cache.attend(ci, q, k, v, pos, hp.kq_scale, self.cpu, n_swa, sinks=self.sinks)
        src = self._trace_attention(cache, ci, q, pos, n_swa, a, n) if T.on() else ""
        il = self.il
        if gate is not None:
            if T.on():
                T.emit(T.node("gate_reshaped", il) if hp.arch == "qwen35moe" else T.node("gate", il) + " (cont)",
                       "CONT", gate)
            sg = sigmoid(gate)
            T.emit("gate_sigmoid", "SIGMOID", sg, il)
            a = (a * sg).astype(np.float32)
            src = "attn_gated"
            T.emit(src, "MUL", a, il)
            src = T.node(src, il)
        out = self.wo.matmul(a)
        if T.on():
            # llama names the projection attn_out, qwen3next attn_output; with
            # a bias (gpt-oss) attn_out is the sum; elsewhere it is unnamed
            named = {"llama": "attn_out", "qwen3next": "attn_output", "qwen35moe": "attn_output"}.get(hp.arch)
            self.out_name = (T.node(named, il) if named and self.bo is None
                             else T.derived_name("MUL_MAT", [self.wo.name, src]))
            T.emit(self.out_name, "MUL_MAT", out)
        if self.bo is not None:
            out = out + self.bo
            self.out_name = T.node("attn_out", il)
            T.emit(self.out_name, "ADD", out)
        return out

    def _query(self, q, n, cos_sin):
        """Bias, gate split, norm, RoPE and scaling of the projected q
        (n, rows): (q (n, n_head, head_dim), gate (n, n_head * head_dim)
        or None)."""
        hp, il = self.hp, self.il
        hd = hp.head_dim
        T.emit("Qcur_full" if self.q_gate else "Qcur", "MUL_MAT", q, il)
        if self.bq is not None:
            q = q + self.bq
            T.emit("Qcur", "ADD", q, il)
        gate = None
        if self.q_gate:
            # per head: hd query values, then hd gate values (qwen3next.cpp
            # build_layer_attn's two views of Qcur_full)
            qg = q.reshape(n, hp.n_head, 2, hd)
            q, gate = qg[:, :, 0], qg[:, :, 1].reshape(n, hp.n_head * hd)
        q = q.reshape(n, hp.n_head, hd)
        if self.q_norm is not None:
            q = T.norm(q, self.q_norm, hp.eps, "Qcur_normed", il)
        cos, sin = cos_sin
        q = ops.rope(q, cos, sin, hp.n_rot, hp.neox, self.cpu)
        T.emit("Qcur", "ROPE", q, il)
        if self.attn_scale != 1.0:
            q = (q * np.float32(self.attn_scale)).astype(np.float32)
            if T.on():
                T.emit(T.derived_name("SCALE", [T.node("Qcur", il)]), "SCALE", q)
        return q, gate

    def _key(self, k, n, cos_sin):
        hp, il = self.hp, self.il
        T.emit("Kcur", "MUL_MAT", k, il)
        if self.bk is not None:
            k = k + self.bk
            T.emit("Kcur", "ADD", k, il)
        k = k.reshape(n, hp.n_head_kv, hp.head_dim)
        if self.k_norm is not None:
            k = T.norm(k, self.k_norm, hp.eps, "Kcur_normed", il)
        cos, sin = cos_sin
        k = ops.rope(k, cos, sin, hp.n_rot, hp.neox, self.cpu)
        T.emit("Kcur", "ROPE", k, il)
        return k

    def _value(self, v, n):
        hp, il = self.hp, self.il
        T.emit("Vcur", "MUL_MAT", v, il)
        if self.bv is not None:
            v = v + self.bv
            T.emit("Vcur", "ADD", v, il)
        return v.reshape(n, hp.n_head_kv, hp.head_dim)

    def _trace_attention(self, cache, ci, q, pos, n_swa, a, n) -> str:
        """The attention's nodes as llama.cpp's graph has them (an F16
        cache without flash attention: kq, kq_soft_max, kqv, then kqv_out
        (CONT); flash attention: its FLASH_ATTN_EXT node; another cache:
        kqv_out), recorded from this call's output `a` (n, n_head *
        head_dim). Returns the name of the node the output projection
        reads."""
        from ..types import GGMLType
        hp, il = self.hp, self.il
        if cache.flash_attn:
            # q is read through a view: of `Qcur` or, when scaled (gemma3),
            # of the unnamed SCALE node (`_`); sliding-window layers name
            # their mask as the others
            srcs = ["_" if self.attn_scale != 1.0 else T.node("Qcur", il), f"cache_k_l{il}",
                    f"cache_v_l{il}", "attn_inp_kq_mask"]
            if self.sinks is not None:
                srcs.append(f"blk.{il}.attn_sinks.weight")
            T.emit(T.derived_name("FLASH_ATTN_EXT", srcs), "FLASH_ATTN_EXT", a.reshape(n, hp.n_head, hp.head_dim))
            return T.node("kqv_out", il)
        if cache.type_k == cache.type_v == GGMLType.F16:
            T.attention_nodes(cache, ci, q, pos, hp.kq_scale, self.cpu, n_swa, il, self.sinks)
        name = T.node("attn_pregate" if self.q_gate else "kqv_out", il)
        if not (cache.rot_k or cache.rot_v):
            T.emit(name, "CONT", a)
        return name


def _fused(arch):
    from .model import ModelLoadError
    return ModelLoadError(f"{arch}: fused `attn_qkv` tensors are not supported")


class GatedFFN:
    """The dense gated FFN, llama.cpp `build_ffn(..., LLM_FFN_PAR)`:
    down(act(gate x) * up x) with act SiLU (`ggml_swiglu_split`) or GELU
    through ggml's F16 table (`ggml_geglu_split`, gemma3). `__call__(x)`:
    float32 (n, n_embd) -> (n, n_embd)."""

    def __init__(self, w, prefix: str, suffix: str, n_embd: int, n_ff: int, profile, gelu=False):
        self.cpu, self.gelu, self.n_ff = profile, gelu, n_ff
        self.il = int(prefix.split(".")[1]) if prefix.startswith("blk.") else -1
        #: llama.cpp's name of the down projection's node: ffn_out, or
        #: ffn_shexp for a shared expert
        self.down_name = "ffn_out" if suffix == "" else "ffn" + suffix
        self.w_gate = w.mat(f"{prefix}ffn_gate{suffix}.weight", n_ff, n_embd)
        self.w_up = w.mat(f"{prefix}ffn_up{suffix}.weight", n_ff, n_embd)
        self.w_down = w.mat(f"{prefix}ffn_down{suffix}.weight", n_embd, n_ff)
        # one kernel call for gate|up when their types agree
        self.w_gate_up = (QMatrix.stack([self.w_gate, self.w_up], f"{prefix}ffn_gate_up{suffix}")
                          if self.w_gate.type == self.w_up.type else None)

    def matrices(self) -> list:
        return ([self.w_gate_up] if self.w_gate_up is not None else [self.w_gate, self.w_up]) + [self.w_down]

    def __call__(self, x):
        if self.w_gate_up is not None:
            gu = self.w_gate_up.matmul(x)
            g, u = gu[:, :self.n_ff], gu[:, self.n_ff:]
        else:
            g, u = self.w_gate.matmul(x), self.w_up.matmul(x)
        il = self.il
        T.emit("ffn_gate", "MUL_MAT", g, il)
        T.emit("ffn_up", "MUL_MAT", u, il)
        act = ops.geglu(g, u, self.cpu) if self.gelu else ops.swiglu(g, u, self.cpu)
        T.emit("ffn_geglu" if self.gelu else "ffn_swiglu", "GEGLU" if self.gelu else "SWIGLU", act, il)
        out = self.w_down.matmul(act)
        T.emit(self.down_name, "MUL_MAT", out, il)
        return out
