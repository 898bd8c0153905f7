"""The mixture-of-experts graphs: qwen3moe, glm4moe, deepseek2 and gpt-oss
(llama.cpp's `openai-moe`), after llama.cpp
`src/models/{qwen3moe,glm4-moe,deepseek2,openai-moe}.cpp`,
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

glm4moe (GLM-4.5): attention with q / k / v biases, q / k norms where
the file has them, NeoX RoPE over the first `rope.dimension_count`
values of each head; `post_attention_norm` before the FFN; the first
`leading_dense_block_count` layers have a dense SwiGLU FFN, the others
sigmoid routing (`expert_gating_func`), the experts chosen by the
probabilities plus `exp_probs_b` and weighed by the unbiased ones
(normalized if `expert_weights_norm`, times `expert_weights_scale`), plus
an ungated shared expert; the NextN / MTP layers after the last are
loaded and not run.

deepseek2 (DeepSeek V2 / V3 / R1, Kimi K2): multi-head latent attention
(`mla`: q LoRA, the compressed KV with its shared RoPE part, the absorbed
`attn_k_b` / `attn_v_b`, or older converters' `attn_kv_b` run as plain
multi-head attention), normal-pair RoPE; `ffn_norm` before the FFN;
the first `leading_dense_block_count` layers dense SwiGLU, the others
routed experts gated per `expert_gating_func` (softmax when absent), the
selection biased by `exp_probs_b` where the file has it, limited to the
best `expert_group_used_count` of `expert_group_count` expert groups
where that is above 1 (DeepSeek V3's group-limited routing,
`cpu.moe.group_limited`; the other graphs here run it too, as
`build_moe_ffn` is shared), weights normalized if `expert_weights_norm`,
times `expert_weights_scale`, plus the ungated shared expert
(`src/models/deepseek2.cpp`); YaRN RoPE where the file scales by it
(`mla`).

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
from .mla import MLA_FLASH_ATTN_PROFILES, MLA_HEAD64_PROFILES, mla_attention, mla_params
from .kv_cache import KVCache, _is_block, cache_type
from .model import (CommonHParams, ArchKeys, Model, ModelLoadError, arch_spec, common_params,
                    refuse_rope_attn_factor, swa_params)

__all__ = ["MoEHParams", "MoEFFN", "Qwen3MoEModel", "Glm4MoEModel", "DeepSeek2Model", "GptOssModel",
           "expert_params"]


def expert_params(k: ArchKeys, n_ff: int, ff_key_required: bool = False, groups: bool = False) -> dict:
    """n_expert, n_expert_used and n_ff_exp as llama.cpp reads them:
    `expert_count` (> 1), `expert_used_count` (1 .. n_expert; one value
    for every layer), `expert_feed_forward_length`, else n_ff /
    n_expert_used. With `groups` (the graphs of this module) also
    n_expert_groups / n_group_used, DeepSeek V3's group-limited routing:
    `expert_group_count` (0 or 1: none) and `expert_group_used_count`,
    checked as `llama_model_base::load_hparams` (src/llama-model.cpp)
    asserts them (fewer groups than experts, n_expert a multiple of the
    group count, 0 < used < groups) and with at least 2 experts per group
    (`ggml_argsort_top_k` of 2 in `build_moe_ffn`); without `groups`
    (hybrid, gemma4) `expert_group_count` above 1 is refused. Every
    problem is a ModelLoadError naming the key."""
    n_expert = k.int("expert_count", required=True, lo=1, hi=1024)
    n_used = k.int("expert_used_count", required=True, lo=1, hi=n_expert)
    n_groups = k.int("expert_group_count", 0, lo=0)
    out = {}
    if n_groups > 1 and not groups:
        raise ModelLoadError(f"`{k.full('expert_group_count')}` > 1 (group-limited expert "
                             f"routing) is not supported by the {k.arch} graph")
    if groups:
        kg, ku = k.full("expert_group_count"), k.full("expert_group_used_count")
        if n_groups >= n_expert:
            raise ModelLoadError(f"`{kg}` = {n_groups} must be below `{k.full('expert_count')}` = "
                                 f"{n_expert} (llama.cpp asserts it)")
        n_group_used = 0
        if n_groups > 1:
            if n_expert % n_groups:
                raise ModelLoadError(f"`{k.full('expert_count')}` = {n_expert} is not a multiple of "
                                     f"`{kg}` = {n_groups}")
            if n_expert // n_groups < 2:
                raise ModelLoadError(f"`{kg}` = {n_groups}: groups of {n_expert // n_groups} expert; "
                                     f"group-limited routing scores each group by its top 2")
            if ku not in k.md:
                raise ModelLoadError(f"GGUF metadata has no `{ku}` (`{kg}` = {n_groups})")
            n_group_used = k.int("expert_group_used_count", lo=0)
            if not 0 < n_group_used < n_groups:
                raise ModelLoadError(f"`{ku}` = {n_group_used} is out of range (must be in "
                                     f"[1, {n_groups - 1}]: below `{kg}` = {n_groups})")
        out = dict(n_expert_groups=n_groups if n_groups > 1 else 0, n_group_used=n_group_used)
    if ff_key_required:
        n_ff_exp = k.int("expert_feed_forward_length", required=True)
    else:
        n_ff_exp = k.int("expert_feed_forward_length", 0, lo=0) or n_ff // n_used
        if n_ff_exp == 0:
            raise ModelLoadError(f"GGUF metadata has no `{k.full('expert_feed_forward_length')}` "
                                 f"(nor a `{k.full('feed_forward_length')}` to derive it)")
    return dict(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp, **out)


@dataclass(frozen=True)
class MoEHParams(CommonHParams):
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
    probs_bias: bool = False
    w_scale: float = 0.0       # expert_weights_scale (0: none)
    n_ff_shexp: int = 0        # the ungated shared expert's width (glm4moe), 0: none
    n_dense_lead: int = 0      # leading layers with the dense FFN
    n_layer_all: int = 0       # with the MTP layers, which the main pass skips
    mla: object = None         # `mla.MlaParams` (deepseek2), None: plain attention
    n_expert_groups: int = 0   # group-limited routing (`expert_group_count`), 0: none
    n_group_used: int = 0      # `expert_group_used_count`

    @classmethod
    def from_metadata(cls, md) -> "MoEHParams":
        """The hyperparameters of metadata `md` of a mixture-of-experts
        architecture, read as its `archs.ArchSpec` says (llama.cpp
        `src/models/{qwen3moe,openai-moe}.cpp`); ModelLoadError naming the
        key for a bad one."""
        spec = arch_spec(md, "moe")
        arch, ex = spec.name, spec.experts
        k = ArchKeys(md, arch)
        c = common_params(k, spec, ff_required=False)
        yarn = c.pop("rope_yarn", None)
        if yarn is not None and yarn[0] == 0.0:
            yarn = None
        refuse_rope_attn_factor(k, yarn)
        if c["n_rot"] != c["head_dim"] and not spec.partial_rope:
            raise ModelLoadError(f"{arch}: `{k.full('rope.dimension_count')}` = {c['n_rot']} differs "
                                 f"from the head size {c['head_dim']} (llama.cpp asserts they agree)")
        # llama_model_base::load_hparams: n_layer = block_count - nextn_predict_layers
        n_all = c["n_layer"]
        c["n_layer"] = n_all - k.int("nextn_predict_layers", 0, lo=0, hi=n_all - 1)
        e = expert_params(k, c["n_ff"], ff_key_required=ex.ff_required, groups=True)
        swa = swa_params(k, spec.swa, c["n_layer"], c["rope_base"], c["rope_freq_scale"])
        # 1/sqrt(head_dim) (gpt-oss: 1/sqrt(n_rot), the same here)
        kq_scale = 1.0 / math.sqrt(float(c["head_dim"]))
        opts = dict(gating=ex.gating, norm_w=ex.norm_w, probs_bias=bool(ex.probs_bias))
        if spec.mla:
            opts["mla"] = mla_params(k, c, yarn)
            kq_scale = opts["mla"].kq_scale
        if ex.weights_keys:
            opts.update(_weights_keys(k, ex, e["n_ff_exp"], c["n_layer"]))
            if opts["n_dense_lead"] and not c["n_ff"]:
                raise ModelLoadError(f"GGUF metadata has no `{k.full('feed_forward_length')}` "
                                     f"(the leading dense layers' FFN width)")
        return cls(**c, **e, **swa, **opts, kq_scale=kq_scale, neox=spec.neox, rope_yarn=yarn,
                   n_layer_all=n_all)


#: llama.cpp's `llama_expert_gating_func_type` values the graphs run
_GATING_FUNC = {1: "softmax", 2: "sigmoid"}


def _weights_keys(k: ArchKeys, ex, n_ff_exp: int, n_layer: int) -> dict:
    """glm4moe's expert keys (`llama_model_glm4_moe::load_arch_hparams`):
    `expert_gating_func` (absent or 0: the architecture's gating),
    `expert_weights_norm`, `expert_weights_scale`, `expert_shared_count`
    (the shared FFN is count x n_ff_exp wide), `leading_dense_block_count`;
    the MTP files' `rope.dimension_sections` (M-RoPE, not run here) is
    refused. ModelLoadError naming the key."""
    f = k.int("expert_gating_func", 0, lo=0)
    if f and f not in _GATING_FUNC:
        raise ModelLoadError(f"`{k.full('expert_gating_func')}` = {f} is not supported "
                             f"(1 softmax, 2 sigmoid)")
    norm = k.value("expert_weights_norm", ex.norm_w)
    if not isinstance(norm, (bool, np.bool_)):
        raise ModelLoadError(f"`{k.full('expert_weights_norm')}` = {norm!r} is not a BOOL")
    ks = k.full("rope.dimension_sections")
    sec = k.md.get(ks)
    if sec is not None and len(sec) >= 2 and sec[0] > 0 and sec[1] > 0:
        raise ModelLoadError(f"`{ks}`: multimodal RoPE sections are not supported")
    return dict(gating=_GATING_FUNC.get(f, ex.gating), norm_w=bool(norm),
                w_scale=k.float("expert_weights_scale", 0.0, positive=False),
                n_ff_shexp=n_ff_exp * k.int("expert_shared_count", 0, lo=0, hi=64),
                n_dense_lead=k.int("leading_dense_block_count", 0, lo=0, hi=n_layer))


def swiglu_oai(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml `swiglu_oai(g, u, 1.702, 7)` (`cpu.ops.swiglu_oai`)."""
    return ops.swiglu_oai(g, u, 1.702, 7.0)


class MoEFFN:
    """The routed-expert FFN of `build_moe_ffn` (+ qwen3next's gated shared
    expert), loaded from the tensors of one layer.

    `__call__(x)`: x float32 (n, n_embd) (the normed FFN input); returns
    float32 (n, n_embd). `last_x`, `last_ids` / `last_weights` keep the input
    and the routing of the last call (int32 / float32 (n, n_expert_used)),
    for tools (`check_experts`); `last_router_x` the router's input (x,
    except in gemma4, whose router reads its own: `route_logits`).
    """

    def __init__(self, w, prefix: str, hp, spec, profile):
        """The FFN of the layer whose tensors start with `prefix`, with the
        options of `spec.experts` (`archs.Experts`)."""
        e, E, F = hp.n_embd, hp.n_expert, hp.n_ff_exp
        ex = spec.experts
        biases, shared = ex.biases, ex.shared
        self.hp, self.cpu, self.act, self.n_ff = hp, profile, ex.act, F
        self.il = int(prefix.split(".")[1]) if prefix.startswith("blk.") else -1
        self.router = w.mat(prefix + "ffn_gate_inp.weight", E, e)
        self.router_bias = w.vec(prefix + "ffn_gate_inp.bias", E) if biases else None
        self.probs_bias = (w.vec(prefix + "exp_probs_b.bias", E, required=ex.probs_bias is True)
                           if ex.probs_bias else None)
        if not w.has(prefix + "ffn_gate_up_exps.weight") and not w.has(prefix + "ffn_gate_exps.weight"):
            # llama.cpp takes either (the fused one first): name both
            raise ModelLoadError(f"{hp.arch}: missing tensor `{prefix}ffn_gate_up_exps.weight` (the fused "
                                 f"gate and up experts), or `{prefix}ffn_gate_exps.weight` and "
                                 f"`{prefix}ffn_up_exps.weight`")
        if w.has(prefix + "ffn_gate_up_exps.weight"):
            self.gate_up = w.experts(prefix + "ffn_gate_up_exps.weight", E, 2 * F, e)
            self.gate = self.up = None
        else:
            self.gate = w.experts(prefix + "ffn_gate_exps.weight", E, F, e)
            self.up = w.experts(prefix + "ffn_up_exps.weight", E, F, e)
            self.gate_up = (cmoe.ExpertMatrix.stack([self.gate, self.up], prefix + "ffn_gate_up_exps")
                            if self.gate.type == self.up.type else None)
        self.down = w.experts(prefix + "ffn_down_exps.weight", E, e, F)
        #: float32 (n_expert,) the per-expert scale of the down products
        #: (`ffn_down_exps.scale`, gemma4's per_expert_scale), None: none
        self.down_scale = w.vec(prefix + "ffn_down_exps.scale", E, required=False) if ex.down_scale else None
        self.b_gate = self.b_up = self.b_down = None
        if biases:
            self.b_gate = w.table(prefix + "ffn_gate_exps.bias", E, F)
            self.b_up = w.table(prefix + "ffn_up_exps.bias", E, F)
            self.b_down = w.table(prefix + "ffn_down_exps.bias", E, e)
        self.shared = self.shared_gate = None
        if shared and hp.n_ff_shexp:
            self.shared = GatedFFN(w, prefix, "_shexp", e, hp.n_ff_shexp, profile)
            if ex.shared_gated:
                self.shared_gate = w.mat(prefix + "ffn_gate_inp_shexp.weight", 1, e)
        self.last_x = self.last_ids = self.last_weights = self.last_router_x = None

    def matrices(self) -> list:
        mats = [self.router] + ([self.gate_up] if self.gate_up is not None else [self.gate, self.up])
        mats.append(self.down)
        if self.shared is not None:
            mats += self.shared.matrices() + ([self.shared_gate] if self.shared_gate is not None else [])
        return mats

    def route(self, x):
        """(ids, weights) of `build_moe_ffn` for x float32 (n, n_embd)."""
        return self.route_logits(self.router.matmul(x))

    def route_logits(self, logits):
        """(ids, weights) of `build_moe_ffn` for router logits float32 (n,
        n_expert) computed by the caller (`probs_in`: gemma4's router reads
        another input than the experts)."""
        hp = self.hp
        ng = getattr(hp, "n_expert_groups", 0)
        ids, w = cmoe.routing_weights(logits, hp.n_expert_used, hp.gating, hp.norm_w, hp.w_scale, self.cpu,
                                      bias=self.router_bias, probs_bias=self.probs_bias,
                                      groups=(ng, hp.n_group_used) if ng > 1 else None)
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
        elif hp.gating == "sigmoid":
            probs = ops.sigmoid(logits)
            T.emit("ffn_moe_probs", "SIGMOID", probs, il)
        else:
            probs = ops.soft_max_rows(logits, self.cpu)
            T.emit("ffn_moe_probs", "SOFT_MAX", probs, il)
        chosen, src = probs, "ffn_moe_probs"
        if self.probs_bias is not None:
            chosen, src = (probs + self.probs_bias).astype(np.float32), "ffn_moe_probs_biased"
            T.emit("ffn_moe_probs_biased", "ADD", chosen, il)
        ng = getattr(hp, "n_expert_groups", 0)
        if ng > 1 and n:
            chosen = self._trace_groups(chosen, T.node(src, il), ng, hp.n_group_used)
        order = cmoe.argsort_desc(chosen).astype(np.int32)
        T.emit("ffn_moe_argsort", "ARGSORT", order, il)
        sel = np.take_along_axis(probs, order[:, :k], axis=1)
        T.emit("ffn_moe_weights", "GET_ROWS", sel.reshape(n, k, 1), il)
        if hp.gating == "softmax_weight":
            T.emit(T.derived_name("SOFT_MAX", [T.node("ffn_moe_weights", il)]), "SOFT_MAX", w)
        scaled = hp.w_scale not in (0.0, 1.0)
        if hp.norm_w:
            s = ops.sum_rows(sel)
            T.emit("ffn_moe_weights_sum", "SUM_ROWS", s.reshape(n, 1), il)
            s = np.where(s < np.float32(np.inf), s, np.float32(np.inf))
            s = np.where(s > cmoe.WEIGHTS_SUM_MIN, s, cmoe.WEIGHTS_SUM_MIN).astype(np.float32)
            T.emit("ffn_moe_weights_sum_clamped", "CLAMP", s.reshape(n, 1), il)
            # ggml_div, before `expert_weights_scale` (the engine's w is after)
            T.emit("ffn_moe_weights_norm", "DIV", (sel / s.reshape(n, 1)).astype(np.float32) if scaled else w, il)
        if scaled:
            T.emit("ffn_moe_weights_scaled", "SCALE", w.reshape(n, k, 1), il)

    def _trace_groups(self, chosen, src: str, n_group: int, n_used: int):
        """The group-limited selection's nodes of `build_moe_ffn` (names
        as llama.cpp's graph leaves them: derived from `src`, the node of
        the selection scores; `ffn_moe_group_topk` a view, not written),
        recomputed with `cpu.moe`'s steps; returns the masked scores."""
        n, E = chosen.shape
        per = E // n_group
        rows = chosen.reshape(n * n_group, per)
        T.emit(T.derived_name("ARGSORT", [src]), "ARGSORT",
               cmoe.argsort_desc(rows).astype(np.int32).reshape(n, n_group, per))
        top2 = np.take_along_axis(rows, cmoe.top_k(rows, 2), axis=1)
        T.emit(T.derived_name("GET_ROWS", [src, "_"]), "GET_ROWS", top2.reshape(n, n_group, 2, 1))
        masked, groups, scores = cmoe.group_limited(chosen, n_group, n_used)
        T.emit(T.derived_name("SUM_ROWS", ["_"]), "SUM_ROWS", scores.reshape(n, n_group, 1))
        T.emit(T.derived_name("ARGSORT", ["_"]), "ARGSORT", cmoe.argsort_desc(scores).astype(np.int32))
        kept = np.take_along_axis(chosen.reshape(n, n_group, per), groups[:, :, None].astype(np.intp), axis=1)
        T.emit(T.derived_name("GET_ROWS", [src, T.node("ffn_moe_group_topk", self.il)]), "GET_ROWS", kept)
        T.emit(T.derived_name("FILL", [src]), "FILL", np.full((n, n_group, per), -np.inf, np.float32))
        return masked

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
        elif self.act == "geglu":
            a = ops.geglu(g, u, self.cpu)
            T.emit("ffn_moe_geglu", "GEGLU", a, il)
        else:
            a = ops.swiglu(g, u, self.cpu)
            T.emit("ffn_moe_swiglu", "SWIGLU", a, il)
        y = self.down.mul_mat_id(a, ids)
        T.emit("ffn_moe_down", "MUL_MAT_ID", y, il)
        if self.down_scale is not None:
            # build_lora_mm_id: the product times its expert's scale (ggml_mul)
            y = (y * self.down_scale[ids][:, :, None]).astype(np.float32)
            T.emit("ffn_moe_down_scaled", "MUL", y, il)
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
        self.last_router_x = x
        out = self.experts(x, ids, weights)
        if self.shared is not None and self.shared_gate is None:
            # glm4moe: routed + shared, ungated
            s = self.shared(x)
            out = (out + s).astype(np.float32)
            T.emit("ffn_out", "ADD", out, self.il)
        elif self.shared is not None:
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


class _MoELayers(Model):
    """The layer shape both MoE families share: attn_norm, attention, a norm
    before the experts (tensor `blk.N.<FFN_NORM>.weight`, kept as
    `ffn_norm`) and the experts."""

    HPARAMS = MoEHParams
    FFN_NORM = "ffn_norm"
    #: the attention block's class (`layers.Attention`; deepseek2: `mla.mla_attention`)
    ATTENTION = Attention

    def _load_layers(self) -> None:
        hp, w = self.hp, self.w
        e = hp.n_embd
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            L = _Layer()
            L.attn_norm = w.vec(p + "attn_norm.weight", e)
            L.attn = self.ATTENTION(w, p, hp, self.spec, self.cpu)
            L.ffn_norm = w.vec(f"{p}{self.FFN_NORM}.weight", e)
            if i < hp.n_dense_lead:
                # glm4moe's leading dense layers (`build_ffn`, SwiGLU)
                L.moe = GatedFFN(w, p, "", e, hp.n_ff, self.cpu)
            else:
                L.moe = MoEFFN(w, p, hp, self.spec, self.cpu)
            self.layers.append(L)
        if self.spec.experts.mtp:
            # the NextN / MTP layers (blk.n_layer and after): loaded, not run
            w.check_all_used(ignore=lambda name: name.startswith("blk.") and
                             int(name.split(".")[1]) >= hp.n_layer)
        else:
            w.check_all_used()

    def _matrices(self) -> list:
        mats = [self.output]
        for L in self.layers:
            mats += L.attn.matrices() + L.moe.matrices()
        return mats


class Qwen3MoEModel(_MoELayers):
    """qwen3moe (module docstring)."""

    def _rope(self, pos):
        hp = self.hp
        return {False: ops.rope_cache(pos, hp.n_rot, hp.rope_base, hp.rope_freq_scale)}

    def _forward(self, tokens, cache, all_logits):
        n = len(tokens)
        hp = self.hp
        pos = np.arange(cache.n, cache.n + n)
        rope = self._rope(pos)
        x = self.embed(tokens)
        res, last = self.spec.names.embd, len(self.layers) - 1
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


class Glm4MoEModel(Qwen3MoEModel):
    """glm4moe, GLM-4.5 (module docstring)."""

    FFN_NORM = "post_attention_norm"     # glm4-moe.cpp's norm before the FFN


class DeepSeek2Model(Qwen3MoEModel):
    """deepseek2 (module docstring): qwen3moe's layer loop with MLA
    attention over a cache of one K head of kv_lora_rank + n_rot values
    whose first kv_lora_rank values are V (`KVCache` `v_of_k`); files of
    the non-absorbed layout (`attn_kv_b`, `mla.MlaMhaAttention`) cache
    n_head K heads of d_nope + n_rot and V heads of d_v."""

    ATTENTION = staticmethod(mla_attention)

    def _rope(self, pos):
        # deepseek2.cpp's q_pe / k_pe ropes: normal pairs, with YaRN where
        # the file scales by it (`MoEHParams.rope_yarn`)
        hp = self.hp
        return {False: ops.rope_cache(pos, hp.n_rot, hp.rope_base, hp.rope_freq_scale, yarn=hp.rope_yarn,
                                      profile=self.cpu)}

    def _cache_shape(self) -> tuple:
        """(n_head_kv, head_dim, options) of the layout's cache."""
        hp, m = self.hp, self.hp.mla
        if m.absorbed:
            return 1, hp.head_dim, {"v_of_k": m.n_lora_kv}
        return hp.n_head, m.d_nope + m.d_rope, {"head_dim_v": m.d_v}

    def _cache_bytes(self, n_ctx: int, **options) -> int:
        hkv, d, opt = self._cache_shape()
        return KVCache.bytes_needed(self.hp.n_layer, hkv, d, n_ctx, **opt)

    def _make_cache(self, n_ctx: int, **options):
        from .._notemulated import NotEmulated, types_on_profiles
        hkv, d, opt = self._cache_shape()
        try:
            cache = KVCache(self.hp.n_layer, hkv, d, n_ctx, **opt, **options)
        except NotEmulated as e:
            tk = cache_type(options.get("type_k", "f16"), "type_k").name.lower()
            if "v_of_k" not in opt or tk in MLA_FLASH_ATTN_PROFILES.get(self.cpu.name, ()):
                raise
            # a type emulated with flash attention only, but not on this
            # profile: flash attention is no way out here
            raise NotEmulated(f"the MLA cache (deepseek2) of type {tk} is emulated with flash attention "
                              f"only, and that is checked against llama.cpp for the cache types "
                              f"{types_on_profiles(MLA_FLASH_ATTN_PROFILES)} only, not {tk} on "
                              f"{self.cpu.name}: use an f16 cache here", e.what, e.where) from None
        tk = cache.type_k.name.lower()
        if cache.v_of_k and cache.flash_attn and tk not in MLA_FLASH_ATTN_PROFILES.get(self.cpu.name, ()):
            # checked against llama.cpp only on the profiles and types listed
            where = types_on_profiles(MLA_FLASH_ATTN_PROFILES)
            raise NotEmulated(f"flash attention over the MLA cache (deepseek2) is checked against "
                              f"llama.cpp for the cache types {where} only, not {tk} on "
                              f"{self.cpu.name}: pass --flash-attn off (with an f16 cache)",
                              "flash attention", f"for the MLA cache (deepseek2) of type {tk} on {self.cpu.name}")
        if (cache.v_of_k and _is_block(cache.type_k) and d % 64 == 0
                and tk not in MLA_HEAD64_PROFILES.get(self.cpu.name, ())):
            # the head size at which llama.cpp decides a rotation it never
            # applies to MLA: checked per profile (MLA_HEAD64_PROFILES)
            from .._notemulated import cache_phrase
            where = types_on_profiles(MLA_HEAD64_PROFILES)
            raise NotEmulated(f"a block-type MLA cache (deepseek2) with heads of kv_lora_rank + n_rot a "
                              f"multiple of 64 (here {d}) is checked against llama.cpp for the cache "
                              f"types {where} only, not {tk} on {self.cpu.name}; use an f16 cache",
                              cache_phrase(cache.type_k, cache.type_v, False),
                              f"for the MLA cache (deepseek2) with heads of {d} on {self.cpu.name}")
        return cache


class GptOssModel(_MoELayers):
    """gpt-oss, llama.cpp's openai-moe (module docstring)."""

    FFN_NORM = "post_attention_norm"     # openai-moe.cpp's norm before the experts

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
            x = T.norm(x, L.ffn_norm, hp.eps, "attn_post_norm", il)
            x = L.moe(x)
            x = x + h
            T.emit("l_out", "ADD", x, il)
        # openai-moe.cpp selects the output rows after the last layer
        self._trace_out_rows(T.node("l_out", len(self.layers) - 1), x)
        cache.n += n
        return self._head(x, all_logits)
