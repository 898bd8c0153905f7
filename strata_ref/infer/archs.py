"""Every architecture this engine runs, declared once: one `ArchSpec` row
per `general.architecture` in `ARCHS`, after llama.cpp vendored by
llama-cpp-python 0.3.36 (`src/llama-arch.cpp` for the names,
`src/llama-model.cpp` `llama_model_rope_type` for the RoPE kind,
`src/models/<arch>.cpp` for each architecture's hyperparameters, tensors
and graph).

A row holds the facts the shared code reads: which graph runs the
architecture (a `Model` subclass in a module of this package), the RoPE
kind and scalings, which norms and biases its layers have, the FFN's
activation, its sliding-window layers, its output head and the names its
llama.cpp graph gives the nodes that differ between architectures (for
`strata-ref trace`). The graphs (`dense`, `moe`, `hybrid`, `gemma4`), their blocks
(`layers`, `blocks`), the compiled dense layer (`compiled`), the loader
(`loader`) and `quality.rotate` read these fields; no module of the
package compares an architecture's name.

Adding an architecture is a row here and, where no graph runs its layers
yet, a graph module (docs/extending.md, "An architecture").

This module imports nothing of the package (it is the bottom of its import
graph: tests/test_infer_imports.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ArchSpec", "Swa", "Experts", "TraceNames", "ARCHS", "SUPPORTED_ARCHS", "spec_of",
           "archs_of_graph"]


@dataclass(frozen=True)
class Swa:
    """Sliding-window attention (llama.cpp `LLAMA_SWA_TYPE_STANDARD`): some
    layers attend to the last `attention.sliding_window` positions only.

    pattern: the default of `attention.sliding_window_pattern` (an array of
    one BOOL per layer, or p: layer il is local when il % p < p - 1, every
    layer when p is 0; `llama_model_base::load_swa_pattern`,
    `llama_hparams::set_swa_pattern`).
    required: the file must have `attention.sliding_window` (gpt-oss); else
    a file without it has no local layers (gemma3).
    rope_of_full: the local layers start from the full layers' RoPE base and
    scale (gpt-oss sets `rope_freq_*_train_swa` to them); else from
    llama.cpp's defaults, base 10000 and scale 1 (`llama-hparams.h`,
    gemma3). Either way `rope.freq_base_swa` replaces the base.
    disabled: llama.cpp reads `attention.sliding_window` (so a value of
    another type refuses the file) and then switches the window off, every
    layer attending to the whole context (phi3.cpp, llama.cpp PR 13676)."""
    pattern: int
    required: bool = False
    rope_of_full: bool = False
    disabled: bool = False


@dataclass(frozen=True)
class Experts:
    """The routed-expert FFN (`llm_graph_context::build_moe_ffn`).

    gating: "softmax" (probabilities over every expert, then the top k) or
    "softmax_weight" (the top k of the raw logits, then a softmax over
    them: `LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT`); norm_w: the
    selected weights are normalized to sum 1; act: "silu" (SwiGLU),
    "swiglu_oai" (gpt-oss's clamped SwiGLU, alpha 1.702, limit 7) or
    "geglu" (GELU through ggml's F16 table, gemma4); down_scale: a
    per-expert scale of the down products where the file has one
    (`ffn_down_exps.scale`, gemma4); biases:
    router and expert biases (`ffn_gate_inp.bias`, `ffn_*_exps.bias`,
    ggml `add_id`); shared: a shared expert gated by
    sigmoid(`ffn_gate_inp_shexp` x) (qwen3next); ff_required: the file
    must give `expert_feed_forward_length` (else n_ff / expert_used_count
    when it has no such key).

    glm4moe's options (`src/models/glm4-moe.cpp`): probs_bias: the
    probabilities plus `exp_probs_b.bias` choose the experts, the unbiased
    ones weigh them; shared_gated: the shared expert is multiplied by
    sigmoid(`ffn_gate_inp_shexp` x) (qwen3next) or added as it is
    (glm4moe, whose `expert_shared_count` shared experts make one FFN of
    count x n_ff_exp); weights_keys: `expert_gating_func` (1 softmax, 2
    sigmoid; absent: `gating`), `expert_weights_norm` (absent: `norm_w`),
    `expert_weights_scale`, `expert_shared_count` and
    `leading_dense_block_count` (that many first layers have the dense
    SwiGLU FFN) are read from the file; mtp: the NextN / MTP layers after
    the last (`nextn_predict_layers`) are loaded by llama.cpp and not run.
    probs_bias may be "optional" (deepseek2: `exp_probs_b` where the file
    has it, as DeepSeek V3 / Kimi files do)."""
    gating: str = "softmax"
    norm_w: bool = True
    act: str = "silu"
    biases: bool = False
    shared: bool = False
    ff_required: bool = False
    probs_bias: bool | str = False
    shared_gated: bool = True
    weights_keys: bool = False
    mtp: bool = False
    down_scale: bool = False


@dataclass(frozen=True)
class TraceNames:
    """llama.cpp's names of the graph nodes that differ between
    architectures (`cb(cur, name, il)` in `src/models/<arch>.cpp`), for
    `strata-ref trace` (docs/trace.md).

    embd: the token embeddings' GET_ROWS; attn_out: the attention output
    projection when it has a name of its own (llama: `attn_out`,
    qwen3next: `attn_output`; None: the unnamed MUL_MAT); residual: the sum
    of the attention output and the layer input (`ffn_inp`; gemma3:
    `sa_out`); gate: the attention gate's contiguous copy (qwen3next,
    qwen35moe), `{il}` standing for the layer; result_norm: the output norm's MUL; head_rows: a GET_ROWS
    after it (None: none)."""
    embd: str = "embd"
    attn_out: str | None = None
    residual: str = "ffn_inp"
    gate: str = "gate-{il} (cont)"
    result_norm: str = "result_norm"
    head_rows: str | None = None


@dataclass(frozen=True)
class ArchSpec:
    """One architecture (module docstring).

    name: `general.architecture` as llama.cpp's `LLM_ARCH_NAMES` spells it.
    graph: "module.Class", the `Model` subclass of this package that runs it.
    rope: the RoPE kind, llama.cpp's `llama_rope_type`: "norm" (consecutive
    pairs), "neox" (pairs n_rot / 2 apart) or "imrope" (interleaved M-RoPE
    over `rope.dimension_sections`; for text, NeoX with one section's pairs
    unrotated).
    rope_scaling: the `rope.scaling.type` values the graph runs ("yarn":
    `model.rope_yarn_params`).
    yarn_log_mul: the loader reads `rope.scaling.yarn_log_multiplier`
    (divided by 0.1, deepseek2's `load_arch_hparams`) into YaRN's mscale;
    for the others the key is refused.
    rope_freqs: llama3's per-pair frequency factors (`rope_freqs.weight`)
    are read when the file has them.
    qk_norm: q and k RMS-normed per head (`attn_q_norm`, `attn_k_norm`);
    "optional": where the file has them (glm4moe).
    partial_rope: `rope.dimension_count` may be below the head size (the
    first n_rot values of each head rotate); else they must agree.
    q_gate: attn_q gives per head a query and a gate; the attention output
    is multiplied by sigmoid(gate) (qwen3next).
    scale_q: q is scaled after RoPE and the softmax scale is 1:
    "f_attention_scale" (gemma3: 1/sqrt(n_embd / n_head) for the 62-layer
    model, else 1/sqrt(head_dim)) or "head" (phi3: `1.0f /
    sqrtf(n_embd_head)` in float32); "" (none): the softmax scale is
    1/sqrt(head_dim).
    fused_qkv: a layer may hold q, k and v in one matrix `attn_qkv`
    (`create_tensor_qkv`, `build_qkv`'s views of one product; phi3); else
    such a tensor is refused.
    fused_up: `ffn_up` holds the gate rows then the up rows (2 n_ff) and
    there is no `ffn_gate` (`build_ffn(..., LLM_FFN_SWIGLU, LLM_FFN_SEQ)`:
    `ggml_swiglu` of the one product's halves; phi3).
    rope_factors: LongRoPE's per-pair frequency factors, the model-wide
    `rope_factors_long` / `rope_factors_short` (each optional), chosen by
    the context (`llama_model::get_rope_factors`: long when the padded
    context exceeds `rope.scaling.original_context_length`; phi3).
    post_norms: RMSNorms after the attention and after the FFN, on the
    residual path (`post_attention_norm`, `post_ffw_norm`: gemma).
    embd_scale: token embeddings times sqrt(n_embd) (gemma).
    ffn: the dense FFN's activation, "swiglu" (`ggml_swiglu_split`) or
    "geglu" (GELU through ggml's F16 table, `ggml_geglu_split`).
    experts: the routed-expert FFN (`Experts`), None for a dense FFN.
    out_bias: the attention output projection has a bias
    (`attn_output.bias`); q / k / v biases are read wherever a file has them
    (`create_tensor_qkv`).
    sinks: one learned logit per head joins the softmax (`attn_sinks`).
    swa: sliding-window layers (`Swa`), None for none.
    softcap: `final_logit_softcapping` is read (tanh soft-capping of the
    logits).
    output: "tied" (output.weight optional: the token embedding when
    absent, llama.cpp's TENSOR_DUPLICATED) or "own" (required).
ssm: the Gated DeltaNet variant of a hybrid ("ba_repeat", qwen3next:
    beta and alpha from one matrix `ssm_ba` split per key head, key heads
    repeated; "beta_alpha_tile", qwen35moe and qwen35: from `ssm_beta` /
    `ssm_alpha`, key heads tiled).
    mla: multi-head latent attention (`infer.mla`, deepseek2): the layers'
    attention is `mla.MlaAttention`, the cached head is
    `attention.key_length` = kv_lora_rank + n_rot wide and
    `attention.value_length` (kv_lora_rank) may differ from it; files of
    older converters (`attn_kv_b`) run `mla.MlaMhaAttention`, whose V heads
    (`value_length`) may differ from the K heads (`key_length`).
    names: `TraceNames`.

    `k_first`: whether llama.cpp's graph evaluates K before V (the
    architectures built with the iSWA KV cache: those with `swa`).
    """
    name: str
    graph: str
    rope: str = "neox"
    rope_scaling: tuple = ("none", "linear")
    yarn_log_mul: bool = False
    rope_freqs: bool = False
    qk_norm: bool | str = False
    partial_rope: bool = False
    q_gate: bool = False
    scale_q: str = ""
    fused_qkv: bool = False
    fused_up: bool = False
    rope_factors: bool = False
    post_norms: bool = False
    embd_scale: bool = False
    ffn: str = "swiglu"
    experts: Experts | None = None
    out_bias: bool = False
    sinks: bool = False
    swa: Swa | None = None
    softcap: bool = False
    output: str = "tied"
    ssm: str | None = None
    mla: bool = False
    names: TraceNames = field(default_factory=TraceNames)

    @property
    def module(self) -> str:
        """The graph's module in this package (`dense`, `moe`, `hybrid`, `gemma4`)."""
        return self.graph.split(".")[0]

    @property
    def neox(self) -> bool:
        """NeoX pairs (i, i + n_rot/2), as the "neox" and "imrope" kinds rotate."""
        return self.rope != "norm"

    @property
    def k_first(self) -> bool:
        return self.swa is not None and not self.swa.disabled


_QWEN3NEXT_NAMES = TraceNames(embd="model.embed_tokens", attn_out="attn_output",
                              result_norm="h_nextn", head_rows="result_norm")

_QWEN35_NAMES = TraceNames(embd="model.input_embed", attn_out="attn_output", gate="gate_reshaped-{il}",
                           result_norm="h_nextn", head_rows="result_norm")

#: the architectures, in the order errors and help texts list them
ARCHS: dict[str, ArchSpec] = {s.name: s for s in (
    ArchSpec("llama", "dense.DenseModel", rope="norm", rope_freqs=True,
             names=TraceNames(attn_out="attn_out")),
    ArchSpec("qwen2", "dense.DenseModel"),
    ArchSpec("qwen3", "dense.DenseModel", qk_norm=True),
    ArchSpec("gemma3", "dense.DenseModel", qk_norm=True, scale_q="f_attention_scale", post_norms=True,
             embd_scale=True, ffn="geglu", swa=Swa(pattern=6), softcap=True,
             names=TraceNames(residual="sa_out")),
    ArchSpec("gemma4", "gemma4.Gemma4Model", qk_norm=True, post_norms=True, embd_scale=True, ffn="geglu",
             experts=Experts(act="geglu", ff_required=True, down_scale=True),
             swa=Swa(pattern=0, required=True), softcap=True,
             names=TraceNames(residual="attn_out", result_norm="h_nextn", head_rows="result_norm")),
    ArchSpec("phi3", "dense.DenseModel", scale_q="head", fused_qkv=True, fused_up=True,
             rope_factors=True, swa=Swa(pattern=1, disabled=True)),
    ArchSpec("qwen3moe", "moe.Qwen3MoEModel", qk_norm=True, experts=Experts()),
    ArchSpec("gpt-oss", "moe.GptOssModel", rope_scaling=("none", "linear", "yarn"),
             experts=Experts(gating="softmax_weight", norm_w=False, act="swiglu_oai", biases=True,
                             ff_required=True),
             out_bias=True, sinks=True, swa=Swa(pattern=2, required=True, rope_of_full=True),
             output="own"),
    ArchSpec("glm4moe", "moe.Glm4MoEModel", qk_norm="optional", partial_rope=True,
             experts=Experts(gating="sigmoid", norm_w=False, shared=True, ff_required=True,
                             probs_bias=True, shared_gated=False, weights_keys=True, mtp=True)),
    ArchSpec("deepseek2", "moe.DeepSeek2Model", rope="norm", partial_rope=True, mla=True,
             rope_scaling=("none", "linear", "yarn"), yarn_log_mul=True,
             experts=Experts(norm_w=False, shared=True, ff_required=True, probs_bias="optional",
                             shared_gated=False, weights_keys=True, mtp=True)),
    ArchSpec("qwen3next", "hybrid.Qwen3NextModel", qk_norm=True, q_gate=True,
             experts=Experts(shared=True), ssm="ba_repeat", names=_QWEN3NEXT_NAMES),
    ArchSpec("qwen35moe", "hybrid.Qwen3NextModel", rope="imrope", qk_norm=True, q_gate=True,
             experts=Experts(shared=True), ssm="beta_alpha_tile", names=_QWEN35_NAMES),
    ArchSpec("qwen35", "hybrid.Qwen3NextModel", rope="imrope", qk_norm=True, q_gate=True,
             ssm="beta_alpha_tile", names=_QWEN35_NAMES),
)}

SUPPORTED_ARCHS = tuple(ARCHS)


def spec_of(arch: str) -> ArchSpec:
    """The row of `arch`; KeyError for an architecture without one (the
    loader's `architecture` names the problem for a user)."""
    return ARCHS[arch]


def archs_of_graph(module: str) -> tuple:
    """The architectures whose graph lives in `module` (`dense`, `moe`,
    `hybrid`), in table order."""
    return tuple(a for a, s in ARCHS.items() if s.module == module)
