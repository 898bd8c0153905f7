"""The mixture-of-experts graphs: qwen3moe and gpt-oss (llama.cpp's
`openai-moe`), after llama.cpp `src/models/{qwen3moe,openai-moe}.cpp`,
`llm_graph_context::build_moe_ffn` (`src/llama-graph.cpp`) and
`src/llama-model.cpp` (the version vendored by llama-cpp-python 0.3.36).

qwen3moe: qwen3's attention (q / k RMSNorm per head, NeoX RoPE), then the
MoE FFN: softmax gating over `expert_count` experts, the top
`expert_used_count` by `ggml_argsort_top_k`, their probabilities
normalized to sum 1 (llama.cpp passes norm_w = true), SwiGLU experts.

gpt-oss: attention with q / k / v / output biases, a learned sink logit
per head in the softmax, sliding-window layers alternating with full
ones (pattern 2: even layers are local), YaRN RoPE; the FFN normed by
`post_attention_norm`, a router with bias, selection on the raw logits
and a softmax over the k selected ones (SOFTMAX_WEIGHT), expert biases
(`ggml_add_id`) and gpt-oss's clamped SwiGLU (`ggml_swiglu_oai`, alpha
1.702, limit 7).

The MoE arithmetic (`cpu.moe`): the router mat-mul, ggml's argsort with
libstdc++'s tie order, `ggml_mul_mat_id` per expert in ggml-cpu's code
path for that expert's row count, the weighted sum slot after slot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..cpu import moe as cmoe
from ..cpu import ops
from . import trace as T
from .layers import Attention, GatedFFN, sigmoid
from .model import ArchKeys, Model, ModelLoadError, architecture, common_params

__all__ = ["MoEHParams", "MoEFFN", "Qwen3MoEModel", "GptOssModel", "MODELS", "expert_params",
           "ExpertCheck", "check_experts"]


def expert_params(k: ArchKeys, n_ff: int, ff_key_required: bool = False) -> dict:
    """n_expert, n_expert_used and n_ff_exp as llama.cpp reads them:
    `expert_count` (> 1), `expert_used_count` (1 .. n_expert; one value
    for every layer), `expert_feed_forward_length`, else n_ff /
    n_expert_used. `expert_group_count` above 1 (DeepSeek's group-limited
    routing) is refused."""
    n_expert = k.int("expert_count", required=True, lo=1, hi=1024)
    n_used = k.int("expert_used_count", required=True, lo=1, hi=n_expert)
    if k.int("expert_group_count", 0, lo=0) > 1:
        raise ModelLoadError(f"`{k.full('expert_group_count')}` > 1 (group-limited expert "
                             f"routing) is not supported")
    if ff_key_required:
        n_ff_exp = k.int("expert_feed_forward_length", required=True)
    else:
        n_ff_exp = k.int("expert_feed_forward_length", 0, lo=0) or n_ff // n_used
        if n_ff_exp == 0:
            raise ModelLoadError(f"GGUF metadata has no `{k.full('expert_feed_forward_length')}` "
                                 f"(nor a `{k.full('feed_forward_length')}` to derive it)")
    return dict(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp)


@dataclass(frozen=True)
class MoEHParams:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_ctx_train: int
    eps: float
    rope_base: float
    rope_freq_scale: float
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    kq_scale: float
    gating: str                # "softmax" or "softmax_weight"
    norm_w: bool
    neox: bool = True
    attn_scale: float = 1.0
    n_swa: int = 0
    swa_layers: tuple = ()
    rope_base_swa: float = 0.0
    rope_freq_scale_swa: float = 1.0
    rope_yarn: tuple | None = None

    @classmethod
    def from_metadata(cls, md) -> "MoEHParams":
        arch = architecture(md)
        if arch not in ("qwen3moe", "gpt-oss"):
            raise ModelLoadError(f"architecture {arch!r} is not one of the MoE family (qwen3moe, gpt-oss)")
        k = ArchKeys(md, arch)
        gpt = arch == "gpt-oss"
        c = common_params(k, ff_required=False, yarn=gpt)
        yarn = c.pop("rope_yarn", None)
        if yarn is not None and yarn[0] == 0.0:
            yarn = None
        if gpt and c["n_rot"] != c["head_dim"]:
            raise ModelLoadError(f"gpt-oss: `{k.full('rope.dimension_count')}` = {c['n_rot']} differs "
                                 f"from the head size {c['head_dim']}")
        if arch == "qwen3moe" and c["n_rot"] != c["head_dim"]:
            raise ModelLoadError(f"qwen3moe: `{k.full('rope.dimension_count')}` = {c['n_rot']} differs "
                                 f"from the head size {c['head_dim']} (llama.cpp asserts they agree)")
        e = expert_params(k, c["n_ff"], ff_key_required=gpt)
        n_layer = c["n_layer"]
        extra = {}
        if gpt:
            n_swa = k.int("attention.sliding_window", required=True)
            pat = k.per_layer_bools("attention.sliding_window_pattern", n_layer)
            if pat is None:
                # llama.cpp load_swa_pattern(ml, 2): layer il is local when il % p < p - 1
                p = k.int("attention.sliding_window_pattern", 2, lo=0)
                pat = tuple(p == 0 or il % p < p - 1 for il in range(n_layer))
            extra = dict(n_swa=n_swa, swa_layers=pat,
                         rope_base_swa=k.float("rope.freq_base_swa", c["rope_base"]),
                         rope_freq_scale_swa=c["rope_freq_scale"], rope_yarn=yarn)
        else:
            extra = dict(swa_layers=(False,) * n_layer, rope_base_swa=c["rope_base"],
                         rope_freq_scale_swa=c["rope_freq_scale"])
        # gpt-oss: 1/sqrt(n_rot); qwen3moe: 1/sqrt(head_dim) (n_rot == head_dim)
        kq_scale = 1.0 / math.sqrt(float(c["n_rot"] if gpt else c["head_dim"]))
        return cls(**c, **e, kq_scale=kq_scale, gating="softmax_weight" if gpt else "softmax",
                   norm_w=not gpt, **extra)


def swiglu_oai(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml `swiglu_oai(g, u, 1.702, 7)` (`cpu.ops.swiglu_oai`)."""
    return ops.swiglu_oai(g, u, 1.702, 7.0)


class MoEFFN:
    """The routed-expert FFN of `build_moe_ffn` (+ qwen3next's gated shared
    expert), loaded from the tensors of one layer.

    `__call__(x)`: x float32 (n, n_embd) (the normed FFN input); returns
    float32 (n, n_embd). `last_x`, `last_ids` / `last_weights` keep the input
    and the routing of the last call (int32 / float32 (n, n_expert_used)),
    for tools (`check_experts`).
    """

    def __init__(self, w, prefix: str, hp, profile, *, act: str = "silu", biases: bool = False,
                 shared: bool = False, n_ff_shexp: int = 0):
        e, E, F = hp.n_embd, hp.n_expert, hp.n_ff_exp
        self.hp, self.cpu, self.act, self.n_ff = hp, profile, act, F
        self.il = int(prefix.split(".")[1]) if prefix.startswith("blk.") else -1
        self.router = w.mat(prefix + "ffn_gate_inp.weight", E, e)
        self.router_bias = w.vec(prefix + "ffn_gate_inp.bias", E) if biases else None
        if w.has(prefix + "ffn_gate_up_exps.weight"):
            self.gate_up = w.experts(prefix + "ffn_gate_up_exps.weight", E, 2 * F, e)
            self.gate = self.up = None
        else:
            self.gate = w.experts(prefix + "ffn_gate_exps.weight", E, F, e)
            self.up = w.experts(prefix + "ffn_up_exps.weight", E, F, e)
            self.gate_up = (cmoe.ExpertMatrix.stack([self.gate, self.up], prefix + "ffn_gate_up_exps")
                            if self.gate.type == self.up.type else None)
        self.down = w.experts(prefix + "ffn_down_exps.weight", E, e, F)
        self.b_gate = self.b_up = self.b_down = None
        if biases:
            self.b_gate = w.table(prefix + "ffn_gate_exps.bias", E, F)
            self.b_up = w.table(prefix + "ffn_up_exps.bias", E, F)
            self.b_down = w.table(prefix + "ffn_down_exps.bias", E, e)
        self.shared = None
        if shared:
            self.shared = GatedFFN(w, prefix, "_shexp", e, n_ff_shexp, profile)
            self.shared_gate = w.mat(prefix + "ffn_gate_inp_shexp.weight", 1, e)
        self.last_x = self.last_ids = self.last_weights = None

    def matrices(self) -> list:
        mats = [self.router] + ([self.gate_up] if self.gate_up is not None else [self.gate, self.up])
        mats.append(self.down)
        if self.shared is not None:
            mats += self.shared.matrices() + [self.shared_gate]
        return mats

    def route(self, x):
        """(ids, weights) of `build_moe_ffn` for x float32 (n, n_embd)."""
        hp = self.hp
        logits = self.router.matmul(x)
        ids, w = cmoe.routing_weights(logits, hp.n_expert_used, hp.gating, hp.norm_w, 0.0, self.cpu,
                                      bias=self.router_bias)
        if T.on():
            self._trace_route(logits, w)
        return ids, w

    def _trace_route(self, logits, w) -> None:
        """The routing nodes of llama.cpp's `build_moe_ffn` up to the final
        weights `w` (the engine's), its intermediate ones recomputed with
        `cpu.moe`'s own steps: logits, probabilities (or the biased
        logits), the full ARGSORT (int32, descending, ggml's tie order), the
        selected weights, their sum, clamped sum, normalized weights."""
        hp, il = self.hp, self.il
        n, k = w.shape
        T.emit("ffn_moe_logits", "MUL_MAT", logits, il)
        if self.router_bias is not None:
            probs = (logits + self.router_bias).astype(np.float32)
            T.emit("ffn_moe_probs", "ADD", probs, il)
        else:
            probs = ops.soft_max_rows(logits, self.cpu)
            T.emit("ffn_moe_probs", "SOFT_MAX", probs, il)
        order = cmoe.argsort_desc(probs).astype(np.int32)
        T.emit("ffn_moe_argsort", "ARGSORT", order, il)
        sel = np.take_along_axis(probs, order[:, :k], axis=1)
        T.emit("ffn_moe_weights", "GET_ROWS", sel.reshape(n, k, 1), il)
        if hp.gating == "softmax_weight":
            T.emit(T.derived_name("SOFT_MAX", [T.node("ffn_moe_weights", il)]), "SOFT_MAX", w)
        if hp.norm_w:
            s = ops.sum_rows(sel)
            T.emit("ffn_moe_weights_sum", "SUM_ROWS", s.reshape(n, 1), il)
            s = np.where(s < np.float32(np.inf), s, np.float32(np.inf))
            s = np.where(s > cmoe.WEIGHTS_SUM_MIN, s, cmoe.WEIGHTS_SUM_MIN).astype(np.float32)
            T.emit("ffn_moe_weights_sum_clamped", "CLAMP", s.reshape(n, 1), il)
            T.emit("ffn_moe_weights_norm", "DIV", w, il)

    def experts(self, x, ids, weights):
        """The routed part for given ids / weights: float32 (n, n_embd)."""
        F = self.n_ff
        il = self.il
        xe = x[:, None, :]
        if self.gate_up is not None:
            gu = self.gate_up.mul_mat_id(xe, ids)
            g, u = gu[:, :, :F], gu[:, :, F:]
        else:
            # ggml computes up first, then gate; each is its own mul_mat_id
            u = self.up.mul_mat_id(xe, ids)
            g = self.gate.mul_mat_id(xe, ids)
        T.emit("ffn_moe_gate", "MUL_MAT_ID", g, il)
        if self.b_gate is not None:
            g = (g + self.b_gate[ids]).astype(np.float32)         # ggml_add_id
            T.emit("ffn_moe_gate_biased", "ADD_ID", g, il)
        T.emit("ffn_moe_up", "MUL_MAT_ID", u, il)
        if self.b_up is not None:
            u = (u + self.b_up[ids]).astype(np.float32)
            T.emit("ffn_moe_up_biased", "ADD_ID", u, il)
        if self.act == "swiglu_oai":
            a = swiglu_oai(g, u)
            T.emit("ffn_moe_swiglu_oai", "SWIGLU_OAI", a, il)
        else:
            a = ops.swiglu(g, u, self.cpu)
            T.emit("ffn_moe_swiglu", "SWIGLU", a, il)
        y = self.down.mul_mat_id(a, ids)
        T.emit("ffn_moe_down", "MUL_MAT_ID", y, il)
        if self.b_down is not None:
            y = (y + self.b_down[ids]).astype(np.float32)
            T.emit("ffn_moe_down_biased", "ADD_ID", y, il)
        out = cmoe.expert_sum(y, weights)
        if T.on():
            self._trace_sum(y, weights, out)
        return out

    def _trace_sum(self, y, weights, out) -> None:
        """`ffn_moe_weighted` (MUL) and the slot additions of
        `build_moe_ffn` (`cpu.moe.expert_sum`'s steps): the first k - 2
        unnamed, the last `ffn_moe_out` (the engine's sum, `out`)."""
        il = self.il
        yw = (y * weights[:, :, None]).astype(np.float32)
        w_name = T.node("ffn_moe_weighted", il)
        T.emit(w_name, "MUL", yw)
        acc, acc_name = yw[:, 0], w_name
        for j in range(1, yw.shape[1] - 1):
            acc = (acc + yw[:, j]).astype(np.float32)
            acc_name = T.derived_name("ADD", [acc_name, w_name])
            T.emit(acc_name, "ADD", acc)
        T.emit("ffn_moe_out", "ADD", out, il)

    def __call__(self, x):
        ids, weights = self.route(x)
        self.last_x, self.last_ids, self.last_weights = x, ids, weights
        out = self.experts(x, ids, weights)
        if self.shared is not None:
            il = self.il
            s = self.shared(x)
            logit = self.shared_gate.matmul(x)
            T.emit("shared_expert_gate", "MUL_MAT", logit, il)
            gate = sigmoid(logit)                                # (n, 1)
            T.emit("shared_expert_gate_sigmoid", "SIGMOID", gate, il)
            sg = (s * gate).astype(np.float32)
            T.emit("ffn_shexp_gated", "MUL", sg, il)
            out = (out + sg).astype(np.float32)
            T.emit("ffn_out", "ADD", out, il)
        return out


class _Layer:
    pass


class Qwen3MoEModel(Model):
    """qwen3moe (module docstring)."""

    HPARAMS = MoEHParams

    def _load_layers(self) -> None:
        hp, w = self.hp, self.w
        e = hp.n_embd
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            L = _Layer()
            L.attn_norm = w.vec(p + "attn_norm.weight", e)
            L.attn = Attention(w, p, hp, self.cpu, qk_norm=True)
            L.ffn_norm = w.vec(p + "ffn_norm.weight", e)
            L.moe = MoEFFN(w, p, hp, self.cpu)
            self.layers.append(L)
        w.check_all_used()

    def _matrices(self) -> list:
        mats = [self.output]
        for L in self.layers:
            mats += L.attn.matrices() + L.moe.matrices()
        return mats

    def _rope(self, pos):
        hp = self.hp
        return {False: ops.rope_cache(pos, hp.n_rot, hp.rope_base, hp.rope_freq_scale)}

    def _forward(self, tokens, cache, all_logits):
        n = len(tokens)
        hp = self.hp
        pos = np.arange(cache.n, cache.n + n)
        rope = self._rope(pos)
        x = self.embed(tokens)
        res, last = self.EMBD_NAME, len(self.layers) - 1
        for il, L in enumerate(self.layers):
            h = x
            x = T.norm(x, L.attn_norm, hp.eps, "attn_norm", il)
            x = L.attn(x, pos, cache, il, rope[False])
            if il == last:
                self._trace_out_rows(L.attn.out_name, x)
                self._trace_out_rows(res if res != "l_out" else T.node(res, il - 1), h)
            x = x + h
            T.emit("ffn_inp", "ADD", x, il)
            h = x
            x = T.norm(x, L.ffn_norm, hp.eps, "ffn_norm", il)
            x = L.moe(x)
            x = x + h
            T.emit("l_out", "ADD", x, il)
            res = "l_out"
        cache.n += n
        return self._head(x, all_logits)


class GptOssModel(Model):
    """gpt-oss, llama.cpp's openai-moe (module docstring)."""

    HPARAMS = MoEHParams

    def _load_io(self, output_required: bool = True) -> None:
        super()._load_io(output_required=True)

    def _load_layers(self) -> None:
        hp, w = self.hp, self.w
        e = hp.n_embd
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            L = _Layer()
            L.attn_norm = w.vec(p + "attn_norm.weight", e)
            L.attn = Attention(w, p, hp, self.cpu, sinks=True, out_bias=True)
            L.post_norm = w.vec(p + "post_attention_norm.weight", e)
            L.moe = MoEFFN(w, p, hp, self.cpu, act="swiglu_oai", biases=True)
            self.layers.append(L)
        w.check_all_used()

    def _matrices(self) -> list:
        mats = [self.output]
        for L in self.layers:
            mats += L.attn.matrices() + L.moe.matrices()
        return mats

    def _forward(self, tokens, cache, all_logits):
        n = len(tokens)
        hp = self.hp
        pos = np.arange(cache.n, cache.n + n)
        rope = {}
        for swa in set(hp.swa_layers):
            base = hp.rope_base_swa if swa else hp.rope_base
            scale = hp.rope_freq_scale_swa if swa else hp.rope_freq_scale
            rope[swa] = ops.rope_cache(pos, hp.n_rot, base, scale, yarn=hp.rope_yarn, profile=self.cpu)
        x = self.embed(tokens)
        for il, L in enumerate(self.layers):
            swa = hp.swa_layers[il]
            h = x
            x = T.norm(x, L.attn_norm, hp.eps, "attn_norm", il)
            x = L.attn(x, pos, cache, il, rope[swa], hp.n_swa if swa else 0)
            x = x + h
            T.emit("ffn_inp", "ADD", x, il)
            h = x
            x = T.norm(x, L.post_norm, hp.eps, "attn_post_norm", il)
            x = L.moe(x)
            x = x + h
            T.emit("l_out", "ADD", x, il)
        # openai-moe.cpp selects the output rows after the last layer
        self._trace_out_rows(T.node("l_out", len(self.layers) - 1), x)
        cache.n += n
        return self._head(x, all_logits)


MODELS = {"qwen3moe": Qwen3MoEModel, "gpt-oss": GptOssModel}


# ------------------------------------------------------------------ GPU route link
@dataclass
class ExpertCheck:
    """The routed-expert FFN of one layer computed two ways (`check_experts`).

    x: float32 (n, n_embd), the FFN input (after the layer's FFN norm);
    ids int32 / weights float32 (n, k): llama.cpp's routing of x (ggml-cpu's
    order); cpu float32 (n, n_embd): the routed experts' weighted sum as
    llama.cpp's CPU build computes it (`profile`); route float32 (n, n_embd):
    the same experts and weights through `routes.experts.moe_ffn`, the
    mode-8 expert oracle that the CUDA expert kernels reproduce bit for bit.
    (The shared expert of qwen3next is not part of either.)"""
    arch: str
    layer: int
    profile: str
    x: np.ndarray
    ids: np.ndarray
    weights: np.ndarray
    cpu: np.ndarray
    route: np.ndarray

    def agreement(self) -> dict:
        """How far `cpu` and `route` agree, with the NaN rule of the hashes
        (`hashing.canonical_bytes`: any NaN equals any NaN). Returns
        {"equal_values": the fraction of values of equal bits or NaN on
        both sides, "max_abs_diff": max |cpu - route| over the other pairs
        of numbers (0.0 when there are none; float64), "max_rel_diff": that
        over max |cpu| of the numbers, "nan_both": NaN on both sides,
        "nan_vs_number": NaN on one side only}."""
        a, b = self.cpu, self.route
        na, nb = np.isnan(a), np.isnan(b)
        same = (a.view(np.uint32) == b.view(np.uint32)) | (na & nb)
        differ = ~same & ~na & ~nb
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(a[differ].astype(np.float64) - b[differ])
        top = float(np.abs(a[~na]).max()) if (~na).any() else 0.0
        max_abs = float(d.max()) if d.size else 0.0
        return {"equal_values": float(same.mean()) if same.size else 1.0, "max_abs_diff": max_abs,
                "max_rel_diff": max_abs / max(top, float(np.finfo(np.float32).tiny)),
                "nan_both": int((na & nb).sum()), "nan_vs_number": int((na ^ nb).sum())}


def _expert_rows(em, e: int) -> np.ndarray:
    """Expert e's bytes of an ExpertMatrix as uint8 (rows, row bytes)."""
    q = em.experts[e]
    return np.asarray(q.raw).reshape(q.rows, -1)


def check_experts(model, layer: int, x: np.ndarray | None = None, prompt: str | None = None,
                  profile=None) -> ExpertCheck:
    """The routed experts of `layer` of `model` (a loaded Model, a registry
    name or a GGUF path) for activations x (float32 (n, n_embd), the FFN
    input), or for the FFN input llama.cpp's graph has at that layer when
    it runs `prompt` (tokenized as `strata-ref generate` does), computed
    the llama.cpp-CPU way and through the mode-8 route (`ExpertCheck`).

    Raises ValueError for a layer out of range, x of the wrong shape, both
    or neither of x / prompt, and ModelLoadError for an architecture whose
    expert FFN is not the route's SwiGLU (gpt-oss: clamped SwiGLU, biases),
    or expert types the route has no kernel for (`routes.mmvq`)."""
    from ..routes import experts as route_experts
    from ..routes.mmvq import SUPPORTED_TYPES
    from . import load
    m = model if isinstance(model, Model) else load(model, cpu=profile)
    hp = m.hp
    if not hasattr(hp, "n_expert"):
        raise ModelLoadError(f"{hp.arch}: not a mixture-of-experts model")
    if not 0 <= int(layer) < hp.n_layer:
        raise ValueError(f"layer {layer} is outside 0 .. {hp.n_layer - 1}")
    moe = m.layers[int(layer)].moe
    if moe.act != "silu" or moe.b_up is not None:
        raise ModelLoadError(f"{hp.arch}: its expert FFN (clamped SwiGLU with biases) is not the "
                             f"SwiGLU of the mode-8 expert route")
    if (x is None) == (prompt is None):
        raise ValueError("check_experts takes activations x or a prompt, not both or neither")
    if prompt is not None:
        ids = m.tokenizer.encode(prompt, add_special=True, parse_special=False)
        if not ids:
            raise ValueError("the prompt has no tokens")
        moe.last_x = None
        m.forward(ids, m.new_cache(len(ids)), all_logits=False)
        x = moe.last_x
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] != hp.n_embd or x.shape[0] == 0:
        raise ValueError(f"activations must be float32 (n, {hp.n_embd}), got {x.shape}")
    if moe.gate_up is not None and moe.gate is None:
        gate = [_expert_rows(moe.gate_up, e)[:moe.n_ff] for e in range(hp.n_expert)]
        up = [_expert_rows(moe.gate_up, e)[moe.n_ff:] for e in range(hp.n_expert)]
        t_gu = moe.gate_up.type
    else:
        gate = [_expert_rows(moe.gate, e) for e in range(hp.n_expert)]
        up = [_expert_rows(moe.up, e) for e in range(hp.n_expert)]
        if moe.gate.type != moe.up.type:
            raise ModelLoadError(f"{hp.arch} layer {layer}: gate ({moe.gate.type.name}) and up "
                                 f"({moe.up.type.name}) experts of different types: the route "
                                 f"takes one type for both")
        t_gu = moe.gate.type
    down = [_expert_rows(moe.down, e) for e in range(hp.n_expert)]
    for t in (t_gu, moe.down.type):
        if t not in SUPPORTED_TYPES:
            raise ModelLoadError(f"{hp.arch} layer {layer}: expert type {t.name} has no mode-8 "
                                 f"route (routes.mmvq types: "
                                 f"{', '.join(s.name for s in SUPPORTED_TYPES)})")
    with np.errstate(over="ignore", invalid="ignore"):
        ids, weights = moe.route(x)
        cpu_out = moe.experts(x, ids, weights)
        route_out = route_experts.moe_ffn(x, ids, weights, gate, up, down, t_gu, moe.down.type)
    return ExpertCheck(hp.arch, int(layer), m.cpu.name, x, ids, weights, cpu_out, route_out)
