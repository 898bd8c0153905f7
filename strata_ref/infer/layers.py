"""Blocks that several architecture graphs share, loaded from the file's
tensors: the attention block with its options (llama.cpp
`llm_graph_context::build_qkv` and `build_attn`, `src/llama-graph.cpp`)
and the dense gated FFN (`build_ffn`, SwiGLU or GeGLU). Their arithmetic
is `blocks`' (written once), run here by the eager kit (`eager`); the
dense graph also runs it compiled (`compiled`).
"""
from __future__ import annotations

import functools

import numpy as np

from ..cpu import ops
from ..cpu.matmul import QMatrix
from . import blocks, eager
from .model import ModelLoadError

__all__ = ["Attention", "GatedFFN", "sigmoid"]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """ggml `sigmoid` (unary-ops.cpp `op_sigmoid`): 1 / (1 + expf(-x)),
    libm's expf, every step a float32 operation; any shape."""
    return ops.sigmoid(x)


@functools.lru_cache(maxsize=None)
def _attention(shape):
    return blocks.attention_fn(shape, eager.KIT)


@functools.lru_cache(maxsize=None)
def _ffn(shape):
    return blocks.ffn_fn(shape, eager.KIT)


def _layer_of(prefix: str) -> int:
    return int(prefix.split(".")[1]) if prefix.startswith("blk.") else -1


class Attention:
    """One self-attention block (`blocks.attention_fn`): q, k, v
    projections (+ biases), the q / k RMSNorms per head, RoPE,
    softmax(K q * kq_scale + mask [+ sinks]) V over the KV cache
    (`KVCache.attend`: its type, rotation, flash attention or not), the
    output projection (+ bias).

    Options, each as its architecture's `archs.ArchSpec` says: `qk_norm`
    (qwen3, gemma3, qwen3moe, qwen3next); `scale_q` (gemma3: q times
    hp.attn_scale after RoPE); `q_gate` (qwen3next: attn_q holds per head
    the query then a gate, and the attention output is multiplied by
    sigmoid(gate) before attn_output); `sinks` (gpt-oss: one learned logit
    per head added to the softmax's sum); `out_bias` (gpt-oss);
    `fused_qkv` (phi3: a layer's `attn_qkv` is the one q|k|v matrix,
    `wqkv`, and `wq` / `wk` / `wv` are None).

    `__call__(x, pos, cache, ci, cos_sin, n_swa)`: x float32 (n, n_embd)
    (the normed input); pos int (n,) positions; cache a KV cache with
    `attend` (ci: this block's slot in it); cos_sin the RoPE tables of
    `pos`; n_swa > 0 a sliding window. Returns float32 (n, n_embd).
    """

    def __init__(self, w, prefix: str, hp, spec, profile):
        e, hd = hp.n_embd, hp.head_dim
        nq, nkv = hp.n_head * hd, hp.n_head_kv * hd
        self.hp, self.spec, self.cpu = hp, spec, profile
        #: the layer (for the trace's node names)
        self.il = _layer_of(prefix)
        self.q_gate = spec.q_gate
        self.attn_scale = hp.attn_scale if spec.scale_q else 1.0
        nq_rows = 2 * nq if self.q_gate else nq
        fused = w.has(prefix + "attn_qkv.weight")
        if fused and not spec.fused_qkv:
            raise _fused(hp.arch)
        if fused:
            # one product, q | k | v its column views (`build_qkv`)
            self.wqkv = w.mat(prefix + "attn_qkv.weight", nq_rows + 2 * nkv, e)
            self.wq = self.wk = self.wv = None
        else:
            self.wq = w.mat(prefix + "attn_q.weight", nq_rows, e)
            self.wk = w.mat(prefix + "attn_k.weight", nkv, e)
            self.wv = w.mat(prefix + "attn_v.weight", nkv, e)
        self.wo = w.mat(prefix + "attn_output.weight", e, nq)
        self.bq = w.vec(prefix + "attn_q.bias", nq_rows, required=False)
        self.bk = w.vec(prefix + "attn_k.bias", nkv, required=False)
        self.bv = w.vec(prefix + "attn_v.bias", nkv, required=False)
        self.bo = w.vec(prefix + "attn_output.bias", e) if spec.out_bias else None
        qk_req = spec.qk_norm is True          # "optional": where the file has them
        self.q_norm = w.vec(prefix + "attn_q_norm.weight", hd, required=qk_req) if spec.qk_norm else None
        self.k_norm = w.vec(prefix + "attn_k_norm.weight", hd, required=qk_req) if spec.qk_norm else None
        if (self.q_norm is None) != (self.k_norm is None):
            raise ModelLoadError(f"{hp.arch}: layer {self.il} has one of `attn_q_norm` / `attn_k_norm` "
                                 f"without the other (not supported)")
        self.sinks = w.vec(prefix + "attn_sinks.weight", hp.n_head) if spec.sinks else None
        if not fused:
            # one kernel call for q|k|v when their types agree (rows are
            # independent: no bit changes)
            self.wqkv = (QMatrix.stack([self.wq, self.wk, self.wv], prefix + "attn_qkv")
                         if self.wq.type == self.wk.type == self.wv.type else None)

    def matrices(self) -> list:
        return ([self.wqkv] if self.wqkv is not None else [self.wq, self.wk, self.wv]) + [self.wo]

    def shape(self) -> blocks.AttnShape:
        """The block's constants as its tensors are now (a tool may unstack
        or replace matrices after loading)."""
        return blocks.AttnShape(stacked=self.wqkv is not None, bq=self.bq is not None,
                                bk=self.bk is not None, bv=self.bv is not None, bo=self.bo is not None,
                                qk_norm=self.q_norm is not None, q_gate=self.q_gate,
                                scale_q=self.attn_scale != 1.0, k_first=self.spec.k_first)

    def __call__(self, x, pos, cache, ci, cos_sin, n_swa=0):
        c = eager.Ctx(self.hp, self.spec, self.cpu, self.il, pos, cache, ci, cos_sin, n_swa)
        out = _attention(self.shape())(self, x, c)
        #: the name the output projection's node got in this call (the trace's)
        self.out_name = c.out_name
        return out


def _fused(arch):
    return ModelLoadError(f"{arch}: fused `attn_qkv` tensors are not supported")


class GatedFFN:
    """The dense gated FFN (`blocks.ffn_fn`), llama.cpp `build_ffn(...,
    LLM_FFN_PAR)`: down(act(gate x) * up x) with act SiLU
    (`ggml_swiglu_split`) or GELU through ggml's F16 table
    (`ggml_geglu_split`, gemma3). With `fused_up` (phi3) the file's
    `ffn_up` holds the gate rows then the up rows (`w_gate_up`; `w_gate` /
    `w_up` None). `__call__(x)`: float32 (n, n_embd) -> (n, n_embd)."""

    def __init__(self, w, prefix: str, suffix: str, n_embd: int, n_ff: int, profile, gelu=False,
                 fused_up=False):
        self.cpu, self.gelu, self.n_ff = profile, gelu, n_ff
        self.il = _layer_of(prefix)
        #: llama.cpp's name of the down projection's node: ffn_out, or
        #: ffn_shexp for a shared expert
        self.down_name = "ffn_out" if suffix == "" else "ffn" + suffix
        self.w_down = w.mat(f"{prefix}ffn_down{suffix}.weight", n_embd, n_ff)
        if fused_up:
            # phi3: ffn_up is gate | up, one product whose halves
            # `ggml_swiglu` takes (the same op as the split form)
            self.w_gate_up = w.mat(f"{prefix}ffn_up{suffix}.weight", 2 * n_ff, n_embd)
            self.w_gate = self.w_up = None
            return
        self.w_gate = w.mat(f"{prefix}ffn_gate{suffix}.weight", n_ff, n_embd)
        self.w_up = w.mat(f"{prefix}ffn_up{suffix}.weight", n_ff, n_embd)
        # one kernel call for gate|up when their types agree
        self.w_gate_up = (QMatrix.stack([self.w_gate, self.w_up], f"{prefix}ffn_gate_up{suffix}")
                          if self.w_gate.type == self.w_up.type else None)

    def matrices(self) -> list:
        return ([self.w_gate_up] if self.w_gate_up is not None else [self.w_gate, self.w_up]) + [self.w_down]

    def shape(self) -> blocks.FfnShape:
        return blocks.FfnShape(stacked=self.w_gate_up is not None, gelu=self.gelu, down=self.down_name)

    def __call__(self, x):
        return _ffn(self.shape())(self, x, _FfnCtx(self.il, self.cpu))


class _FfnCtx:
    """What the FFN's eager primitives read of a context."""

    def __init__(self, il, profile):
        self.il, self.profile = il, profile
