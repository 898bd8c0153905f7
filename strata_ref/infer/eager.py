"""The eager kit of `blocks`: each primitive one Python call that composes
`strata_ref.cpu`'s kernels and records the graph node it computes for
`strata-ref trace` (`trace.emit`, under llama.cpp's node names).

This is the path for everything the compiled layer does not take (module
docstring of `blocks`): a wrapped matrix (quality probes, `@float`
variants) is multiplied by its own `matmul`, the attention runs over any
KV cache through `KVCache.attend` (its type, rotation, flash attention),
and the nodes that ggml computes separately but the engine fuses are
recomputed for the trace only (`trace.norm`, `trace.attention_nodes`).

`Ctx` is the context of one block call: the layer, the sizes, the
positions and RoPE tables, the cache and the layer's slot in it, and the
names the trace needs from one node to the next.
"""
from __future__ import annotations

import numpy as np

from ..cpu import ops
from ..types import GGMLType
from . import trace as T

__all__ = ["Ctx", "KIT"]


class Ctx:
    """The context of one eager block call.

    hp: the graph's hyperparameters (n_head, n_head_kv, head_dim, n_rot,
    eps, kq_scale); spec: the architecture's `archs.ArchSpec`; profile:
    the `strata_ref.cpu` profile; il: the layer (-1: none); pos: int (n,)
    positions; cache, slot: the KV cache and the layer's slot in it;
    cos_sin: the RoPE tables of `pos`; n_swa: the sliding window (0:
    none); last: the model's last layer (its output rows are recorded);
    res_name: the node name of the layer's input (the residual)."""

    def __init__(self, hp, spec, profile, il=-1, pos=None, cache=None, slot=0, cos_sin=None, n_swa=0,
                 last=False, res_name=""):
        self.hp, self.spec, self.names, self.profile, self.il = hp, spec, spec.names, profile, il
        self.n_head, self.n_head_kv, self.head_dim = hp.n_head, hp.n_head_kv, hp.head_dim
        self.eps = hp.eps
        self.pos, self.cache, self.slot, self.cos_sin, self.n_swa = pos, cache, slot, cos_sin, n_swa
        self.last, self.res_name = last, res_name
        #: the node the attention output projection reads, and the name the
        #: projection's node got (set as the block runs, for the trace)
        self.src = ""
        self.out_name = ""


def _mm(W, x, c):
    return W.matmul(x)


def _mm_each(*args):
    # q, k, v (or gate, up) of one input: each its own product
    *ws, x, c = args
    return tuple(W.matmul(x) for W in ws)


def _cols(a, c0, c1):
    return a[:, c0:c1]


def _add_row(a, b):
    return a + b


def _add(x, h):
    return x + h


def _scale(x, s):
    return (x * np.float32(s)).astype(np.float32)


def _norm(x, w, c, name):
    return T.norm(x, w, c.eps, name, c.il)


def _norm_unnumbered(x, w, c, name):
    return T.norm(x, w, c.eps, name, c.il, norm_il=-1)


def _rope(x, c):
    cos, sin = c.cos_sin
    return ops.rope(x, cos, sin, c.hp.n_rot, c.spec.neox, c.profile)


def _geglu(g, u, c):
    return ops.geglu(g, u, c.profile)


def _swiglu(g, u, c):
    return ops.swiglu(g, u, c.profile)


def _attend(A, q, k, v, c):
    a = c.cache.attend(c.slot, q, k, v, c.pos, c.hp.kq_scale, c.profile, c.n_swa, sinks=A.sinks)
    c.src = _trace_attention(A, c, q, a) if T.on() else ""
    return a


def _trace_attention(A, c, q, a) -> str:
    """The attention's nodes as llama.cpp's graph has them (an F16 cache
    without flash attention: kq, kq_soft_max, kqv, then kqv_out (CONT);
    flash attention: its FLASH_ATTN_EXT node; another cache: kqv_out),
    recorded from this call's output `a` (n, n_head * head_dim). Returns
    the name of the node the output projection reads."""
    hp, il, cache = c.hp, c.il, c.cache
    n = q.shape[0]
    if cache.flash_attn:
        # q is read through a view: of `Qcur` or, when scaled (gemma3),
        # of the unnamed SCALE node (`_`); sliding-window layers name
        # their mask as the others
        srcs = ["_" if A.attn_scale != 1.0 else T.node("Qcur", il), f"cache_k_l{il}",
                f"cache_v_l{il}", "attn_inp_kq_mask"]
        if A.sinks is not None:
            srcs.append(f"blk.{il}.attn_sinks.weight")
        T.emit(T.derived_name("FLASH_ATTN_EXT", srcs), "FLASH_ATTN_EXT", a.reshape(n, hp.n_head, hp.head_dim))
        return T.node("kqv_out", il)
    if cache.type_k == cache.type_v == GGMLType.F16:
        T.attention_nodes(cache, c.slot, q, c.pos, hp.kq_scale, c.profile, c.n_swa, il, A.sinks)
    name = T.node("attn_pregate" if A.q_gate else "kqv_out", il)
    if not (cache.rot_k or cache.rot_v):
        T.emit(name, "CONT", a)
    return name


def _split_gate(q, c):
    # per head: head_dim query values, then head_dim gate values
    # (qwen3next.cpp build_layer_attn's two views of Qcur_full)
    n, H, hd = q.shape[0], c.n_head, c.head_dim
    qg = q.reshape(n, H, 2, hd)
    return qg[:, :, 0], qg[:, :, 1].reshape(n, H * hd)


def _gate_mul(a, gate, c):
    il = c.il
    if T.on():
        T.emit(c.names.gate.format(il=il), "CONT", gate)
    sg = ops.sigmoid(gate)
    T.emit("gate_sigmoid", "SIGMOID", sg, il)
    a = (a * sg).astype(np.float32)
    T.emit("attn_gated", "MUL", a, il)
    c.src = T.node("attn_gated", il)
    return a


def _emit(x, name, op, c):
    T.emit(name, op, x, c.il)


def _emit_scaled(x, src, c):
    if T.on():
        T.emit(T.derived_name("SCALE", [T.node(src, c.il)]), "SCALE", x)


def _emit_out(A, out, biased, c):
    # llama names the projection attn_out, qwen3next attn_output; with a
    # bias (gpt-oss) attn_out is the sum; elsewhere it is unnamed
    if T.on():
        named = c.names.attn_out
        c.out_name = (T.node(named, c.il) if named and not biased
                      else T.derived_name("MUL_MAT", [A.wo.name, c.src]))
        T.emit(c.out_name, "MUL_MAT", out)


def _emit_out_sum(out, c):
    c.out_name = T.node("attn_out", c.il)
    T.emit(c.out_name, "ADD", out)


def _out_rows(x, residual, c):
    # the `get_rows(x, inp_out_ids)` llama.cpp's graph takes of the last
    # layer's tensors (every row in a trace: all logits are computed)
    if c.last and T.on():
        name = c.res_name if residual else c.out_name
        T.emit(T.derived_name("GET_ROWS", [name, "out_ids"]), "GET_ROWS", x)


#: the primitives `blocks` composes, eagerly
KIT = dict(
    jit=lambda f: f,
    mm_qkv=_mm, mm_q_k_v=_mm_each, mm_o=_mm, mm_gu=_mm, mm_gate_up=_mm_each, mm_d=_mm,
    cols=_cols, add_row=_add_row, add=_add, scale=_scale, norm=_norm, norm_unnumbered=_norm_unnumbered,
    rope=_rope, geglu=_geglu, swiglu=_swiglu, attend=_attend, split_gate=_split_gate, gate_mul=_gate_mul,
    emit=_emit, emit_scaled=_emit_scaled, emit_out=_emit_out, emit_out_sum=_emit_out_sum, out_rows=_out_rows,
)
