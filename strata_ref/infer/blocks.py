"""The arithmetic of the attention block, the gated FFN and the dense
decoder layer, written once: each is a function built by a factory from
the block's *shape* (constants: which tensors it has, the options its
architecture's `archs.ArchSpec` sets) and a *kit* (the primitives it is
composed of), in the subset of Python that numba compiles.

Two kits run the same functions:

* `eager.KIT`: one Python call per primitive, each composing
  `strata_ref.cpu`'s kernels (`QMatrix.matmul`, `cpu.ops`,
  `KVCache.attend`) and recording its graph node for `strata-ref trace`
  (`emit`, the `cb(cur, name, il)` of llama.cpp's graph). It runs every
  weight (quality probes' wrapped matrices included), every KV cache type,
  flash attention, and the MoE and hybrid graphs' attention.
* `compiled.kit(...)`: the same kernels as numba functions, inlined into
  one compiled call per layer (`compiled.CompiledLayers`), for the common
  case of the dense graphs (stored-block matrices, an F16 cache without
  flash attention); its `emit` records nothing.

A branch on a shape constant is resolved when the function is built
(numba prunes the other side before typing it), so a compiled layer holds
only its own options' code. Both kits give the same bits
(tests/test_infer_compiled.py, and every llama.cpp reference test runs
whichever applies).

The block weights are read as attributes (`A.wq`, `A.bq`, `F.w_down`,
`L.attn_norm`: the `layers.Attention` / `GatedFFN` objects, or the
compiled kit's named tuples); the context `c` gives the sizes (`c.n_head`,
`c.n_head_kv`, `c.head_dim`) and whatever the kit's primitives need
(positions, RoPE tables, the cache, the layer index).

Sources: llama.cpp vendored by llama-cpp-python 0.3.36,
`llm_graph_context::build_qkv`, `build_attn`, `build_ffn`
(`src/llama-graph.cpp`) and `src/models/{llama,qwen2,qwen3,gemma3}.cpp`
for the order of operations and the node names.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AttnShape", "FfnShape", "DenseShape", "attention_fn", "ffn_fn", "dense_layer_fn"]


@dataclass(frozen=True)
class AttnShape:
    """The constants of one attention block: stacked (one q|k|v matrix),
    bq / bk / bv / bo (biases), qk_norm, q_gate, scale_q (q times
    `attn_scale` after RoPE), k_first (K evaluated before V: the order of
    the trace's nodes)."""
    stacked: bool
    bq: bool
    bk: bool
    bv: bool
    bo: bool
    qk_norm: bool
    q_gate: bool
    scale_q: bool
    k_first: bool

    @property
    def key(self) -> str:
        """The constants spelled out (a compiled function's cache name)."""
        return "".join(k[0] + str(int(getattr(self, k))) for k in
                       ("stacked", "bq", "bk", "bv", "bo", "qk_norm", "q_gate", "scale_q", "k_first"))


@dataclass(frozen=True)
class FfnShape:
    """The constants of one gated FFN: stacked (one gate|up matrix), gelu
    (GeGLU, else SwiGLU), down: the down projection's node name (ffn_out;
    ffn_shexp for a shared expert)."""
    stacked: bool
    gelu: bool
    down: str = "ffn_out"

    @property
    def key(self) -> str:
        return f"s{int(self.stacked)}g{int(self.gelu)}"


@dataclass(frozen=True)
class DenseShape:
    """One dense decoder layer: its attention and FFN shapes, post_norms
    (gemma's norms on the residual path) and residual: the node name of
    the first residual sum (`TraceNames.residual`)."""
    attn: AttnShape
    ffn: FfnShape
    post_norms: bool
    residual: str = "ffn_inp"

    @property
    def key(self) -> str:
        return f"a{self.attn.key}_f{self.ffn.key}_p{int(self.post_norms)}"


def attention_fn(s: AttnShape, k):
    """The attention block of shape `s` over kit `k` (a dict of
    primitives): `attention(A, x, c)`, x float32 (n, n_embd), the normed
    layer input; returns float32 (n, n_embd).

        q, k, v = Wq x (+ bq), Wk x (+ bk), Wv x (+ bv)   (one stacked product or three)
        q, gate = the query and gate halves of each head   (q_gate)
        q, k    = rms_norm per head * q_norm | k_norm      (qk_norm)
        q, k    = rope(q), rope(k)
        q       = q * attn_scale                           (scale_q)
        a       = softmax(K q * kq_scale + mask [+ sinks]) V over the cache, per head
        a       = a * sigmoid(gate)                        (q_gate)
        out     = Wo a (+ bo)
    """
    STACKED, BQ, BK, BV, BO = s.stacked, s.bq, s.bk, s.bv, s.bo
    QK_NORM, Q_GATE, SCALE_Q, K_FIRST = s.qk_norm, s.q_gate, s.scale_q, s.k_first
    Q_MM = "Qcur_full" if Q_GATE else "Qcur"
    jit = k["jit"]
    mm_qkv, mm_q_k_v, mm_o = k["mm_qkv"], k["mm_q_k_v"], k["mm_o"]
    cols, add_row, norm, rope, scale = k["cols"], k["add_row"], k["norm"], k["rope"], k["scale"]
    attend, split_gate, gate_mul = k["attend"], k["split_gate"], k["gate_mul"]
    emit, emit_scaled, emit_out, emit_out_sum = k["emit"], k["emit_scaled"], k["emit_out"], k["emit_out_sum"]

    def key(A, kv, c):
        n = kv.shape[0]
        emit(kv, "Kcur", "MUL_MAT", c)
        if BK:
            kv = add_row(kv, A.bk)
            emit(kv, "Kcur", "ADD", c)
        kv = kv.reshape(n, c.n_head_kv, c.head_dim)
        if QK_NORM:
            kv = norm(kv, A.k_norm, c, "Kcur_normed")
        kv = rope(kv, c)
        emit(kv, "Kcur", "ROPE", c)
        return kv

    def value(A, v, c):
        n = v.shape[0]
        emit(v, "Vcur", "MUL_MAT", c)
        if BV:
            v = add_row(v, A.bv)
            emit(v, "Vcur", "ADD", c)
        return v.reshape(n, c.n_head_kv, c.head_dim)

    key, value = jit(key), jit(value)

    def attention(A, x, c):
        n = x.shape[0]
        nq = c.n_head * c.head_dim
        nkv = c.n_head_kv * c.head_dim
        nqr = 2 * nq if Q_GATE else nq
        if STACKED:
            qkv = mm_qkv(A.wqkv, x, c)
            q = cols(qkv, 0, nqr)
            kk = cols(qkv, nqr, nqr + nkv)
            v = cols(qkv, nqr + nkv, nqr + 2 * nkv)
        else:
            q, kk, v = mm_q_k_v(A.wq, A.wk, A.wv, x, c)
        # the three streams in the order llama.cpp's graph evaluates them
        # (independent: the order changes no bit, only the trace's order)
        emit(q, Q_MM, "MUL_MAT", c)
        if BQ:
            q = add_row(q, A.bq)
            emit(q, "Qcur", "ADD", c)
        if Q_GATE:
            q, gate = split_gate(q, c)
        q = q.reshape(n, c.n_head, c.head_dim)
        if QK_NORM:
            q = norm(q, A.q_norm, c, "Qcur_normed")
        q = rope(q, c)
        emit(q, "Qcur", "ROPE", c)
        if SCALE_Q:
            q = scale(q, A.attn_scale)
            emit_scaled(q, "Qcur", c)
        if K_FIRST:
            kk = key(A, kk, c)
            v = value(A, v, c)
        else:
            v = value(A, v, c)
            kk = key(A, kk, c)
        a = attend(A, q, kk, v, c)
        if Q_GATE:
            a = gate_mul(a, gate, c)
        out = mm_o(A.wo, a, c)
        emit_out(A, out, BO, c)
        if BO:
            out = add_row(out, A.bo)
            emit_out_sum(out, c)
        return out

    return jit(attention)


def ffn_fn(s: FfnShape, k):
    """The gated FFN of shape `s` over kit `k`: `ffn(F, x, c)`, x float32
    (n, n_embd) the normed input; returns float32 (n, n_embd):
    down(act(gate x) * up x), act SiLU (`ggml_swiglu_split`) or GELU
    through ggml's F16 table (`ggml_geglu_split`) (llama.cpp `build_ffn`
    with LLM_FFN_PAR)."""
    STACKED, GELU, DOWN = s.stacked, s.gelu, s.down
    ACT, ACT_OP = ("ffn_geglu", "GEGLU") if GELU else ("ffn_swiglu", "SWIGLU")
    mm_gu, mm_gate_up, mm_d = k["mm_gu"], k["mm_gate_up"], k["mm_d"]
    cols, geglu, swiglu, emit = k["cols"], k["geglu"], k["swiglu"], k["emit"]

    def ffn(F, x, c):
        if STACKED:
            gu = mm_gu(F.w_gate_up, x, c)
            n_ff = gu.shape[1] // 2
            g = cols(gu, 0, n_ff)
            u = cols(gu, n_ff, 2 * n_ff)
        else:
            g, u = mm_gate_up(F.w_gate, F.w_up, x, c)
        emit(g, "ffn_gate", "MUL_MAT", c)
        emit(u, "ffn_up", "MUL_MAT", c)
        if GELU:
            a = geglu(g, u, c)
        else:
            a = swiglu(g, u, c)
        emit(a, ACT, ACT_OP, c)
        out = mm_d(F.w_down, a, c)
        emit(out, DOWN, "MUL_MAT", c)
        return out

    return k["jit"](ffn)


def dense_layer_fn(s: DenseShape, k):
    """The dense decoder layer of shape `s` over kit `k`: `layer(L, x, c)`,
    x float32 (n, n_embd) the layer input; returns the layer output
    (llama.cpp `src/models/{llama,qwen2,qwen3,gemma3}.cpp`):

        h = x;  x = rms_norm(x) * attn_norm;  x = attention(x)
        x = rms_norm(x) * attn_post_norm                    (post_norms)
        x = x + h;  h = x;  x = rms_norm(x) * ffn_norm;  x = ffn(x)
        x = rms_norm(x) * ffn_post_norm                     (post_norms)
        x = x + h
    """
    POST_NORMS, RESIDUAL = s.post_norms, s.residual
    attention, ffn = attention_fn(s.attn, k), ffn_fn(s.ffn, k)
    norm, norm_unnumbered, add, emit = k["norm"], k["norm_unnumbered"], k["add"], k["emit"]
    out_rows = k["out_rows"]

    def layer(L, x, c):
        h = x
        x = norm(x, L.attn_norm, c, "attn_norm")
        x = attention(L.attn, x, c)
        out_rows(x, False, c)
        if POST_NORMS:
            x = norm(x, L.attn_post_norm, c, "attn_post_norm")
        out_rows(h, True, c)
        x = add(x, h)
        emit(x, RESIDUAL, "ADD", c)
        h = x
        x = norm(x, L.ffn_norm, c, "ffn_norm")
        x = ffn(L.ffn, x, c)
        if POST_NORMS:
            # gemma3.cpp builds this norm with layer -1: its RMS_NORM node is `norm`
            x = norm_unnumbered(x, L.ffn_post_norm, c, "ffn_post_norm")
        x = add(x, h)
        emit(x, "l_out", "ADD", c)
        return x

    return k["jit"](layer)
