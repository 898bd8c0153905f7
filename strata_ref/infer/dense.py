"""The dense decoder graphs: llama, qwen2, qwen3, gemma3 and phi3, after
llama.cpp `src/models/{llama,qwen2,qwen3,gemma3,phi3}.cpp` and
`src/llama-model.cpp` (the version vendored by llama-cpp-python 0.3.36).

One layer, in llama.cpp's operation order:

    h   = x                                  # residual
    x   = rms_norm(x, eps) * attn_norm
    q   = Wq x (+ bq),  k = Wk x (+ bk),  v = Wv x (+ bv)
    q,k = rms_norm(q|k per head) * q_norm|k_norm        # qwen3, gemma3
    q,k = rope(q|k, pos)      # normal pairs (llama) or NeoX halves (others)
    q   = q * f_attention_scale       # gemma3; phi3: 1/sqrtf(head_dim)
    a   = softmax(q k^T * kq_scale + mask) v  per head, GQA
    x   = Wo a;  x = rms_norm(x) * attn_post_norm       # gemma3 only
    x   = x + h;  h = x
    x   = rms_norm(x) * ffn_norm
    x   = Wdown(act(Wgate x) * Wup x)     # act: SiLU; gemma3: GELU via ggml's fp16 table
    x   = rms_norm(x) * ffn_post_norm                   # gemma3 only
    x   = x + h
    logits = Wout(rms_norm(x) * output_norm)   # Wout = token_embd when tied

phi3 holds q | k | v in one matrix `attn_qkv` (or three) and gate | up
in `ffn_up` (`ggml_swiglu` of its halves), its RoPE takes LongRoPE's
frequency factors (`rope_factors_long` / `_short`, chosen by the context
length) and `rope.scaling.attn_factor` multiplies cos and sin; llama.cpp
switches its sliding window off, so every layer attends to everything.

The layer's arithmetic is written once (`blocks.dense_layer_fn`, from the
shape of its tensors and the architecture's `archs.ArchSpec`) and run
either eagerly (`eager`: every weight, cache and trace) or as one compiled
call per layer (`compiled`: stored-block matrices over an F16 cache). Each
step is `strata_ref.cpu`'s: activation quantization and the mat-muls
(`cpu.matmul`), the F16 KV cache and the F16 rounding of q and of the
softmax probabilities that ggml's F16 mat-muls apply to their float32
operand, K q / V p in tinyBLAS or `vec_dot_f16` order, soft_max with
ggml's expf, SwiGLU, GeGLU and RoPE (`cpu.ops`); RMSNorm's sum of squares
in double.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..cpu import ops
from . import blocks, eager
from . import trace as T
from .layers import Attention, GatedFFN
from .model import CommonHParams, ArchKeys, Model, ModelLoadError, arch_spec, common_params, rope_cos_sin, swa_params

__all__ = ["HParams", "DenseModel"]


@dataclass(frozen=True)
class HParams(CommonHParams):
    rope_base_swa: float
    rope_freq_scale_swa: float
    neox: bool
    n_swa: int                 # 0: no sliding window
    swa_layers: tuple          # bool per layer
    attn_scale: float          # multiplies q before attention (gemma3), else 1
    kq_scale: float
    embd_scale: float          # multiplies the token embeddings (gemma3)
    final_softcap: float       # 0: none
    rope_attn_factor: float    # multiplies RoPE's cos and sin (`rope.scaling.attn_factor`)
    n_ctx_orig: int            # LongRoPE's switch to the long factors (phi3)

    @classmethod
    def from_metadata(cls, md) -> "HParams":
        """The hyperparameters of metadata `md` of a dense architecture, read
        as its `archs.ArchSpec` says (llama.cpp `src/models/<arch>.cpp`
        `load_arch_hparams`); ModelLoadError naming the key for a bad one."""
        spec = arch_spec(md, "dense")
        k = ArchKeys(md, spec.name)
        c = common_params(k, spec)
        n_layer, n_embd, n_head, head_dim = c["n_layer"], c["n_embd"], c["n_head"], c["head_dim"]
        swa = swa_params(k, spec.swa, n_layer, c["rope_base"], c["rope_freq_scale"])
        attn_scale, kq_scale = 1.0, 1.0 / math.sqrt(head_dim)
        if spec.scale_q == "f_attention_scale":
            # gemma3.cpp: f_attention_scale 1/sqrt(n_embd/n_head) for the 27B
            # (62 layers), else 1/sqrt(head_dim); the softmax scale is then 1
            attn_scale = (1.0 / math.sqrt(float(n_embd // n_head)) if n_layer == 62
                          else 1.0 / math.sqrt(float(head_dim)))
            kq_scale = 1.0
        elif spec.scale_q == "head":
            # phi3.cpp: ggml_scale(Qcur, 1.0f / sqrtf(float(n_embd_head))), softmax scale 1
            attn_scale = float(np.float32(1.0) / np.sqrt(np.float32(head_dim)))
            kq_scale = 1.0
        softcap = k.float("final_logit_softcapping", 0.0, positive=False) if spec.softcap else 0.0
        embd_scale = float(np.sqrt(np.float32(n_embd))) if spec.embd_scale else 1.0
        # llama-context.cpp: yarn_attn_factor (1 without YaRN) times
        # `rope.scaling.attn_factor` (LongRoPE's, phi3); ggml's rope_yarn
        # multiplies cos and sin by it
        rope_attn = float(np.float32(k.float("rope.scaling.attn_factor", 1.0)))
        n_ctx_orig = k.int("rope.scaling.original_context_length", c["n_ctx_train"])
        return cls(**c, **swa, neox=spec.neox, attn_scale=attn_scale, kq_scale=kq_scale,
                   embd_scale=embd_scale, final_softcap=softcap, rope_attn_factor=rope_attn,
                   n_ctx_orig=n_ctx_orig)


def _freq_factors(w, name: str, n_rot: int):
    """The per-pair RoPE frequency factors `name` (float32 (n_rot/2,)), or
    None when the file has none; ggml divides each pair's angle by its
    factor, so each must be finite and > 0 (ModelLoadError naming the
    tensor and the value)."""
    if not w.has(name):
        return None
    f = w.vec(name, n_rot // 2)
    bad = np.flatnonzero(~(np.isfinite(f) & (f > 0)))
    if bad.size:
        i = int(bad[0])
        raise ModelLoadError(f"tensor `{name}` value [{i}] = {float(f[i])!r}: RoPE frequency "
                             f"factors must be finite and > 0")
    return f


class _Layer:
    """One dense layer's weights: attn_norm, attn (`layers.Attention`),
    attn_post_norm, ffn_norm, ffn (`layers.GatedFFN`), ffn_post_norm (the
    post norms None where the architecture has none)."""


@functools.lru_cache(maxsize=None)
def _eager_layer(shape):
    return blocks.dense_layer_fn(shape, eager.KIT)


class DenseModel(Model):
    """llama / qwen2 / qwen3 / gemma3 (module docstring)."""

    HPARAMS = HParams

    def _load_layers(self) -> None:
        hp, w, spec = self.hp, self.w, self.spec
        e = hp.n_embd
        self.rope_freqs = _freq_factors(w, "rope_freqs.weight", hp.n_rot) if spec.rope_freqs else None
        #: LongRoPE's factors (phi3), None where the file has none
        self.rope_long = _freq_factors(w, "rope_factors_long.weight", hp.n_rot) if spec.rope_factors else None
        self.rope_short = _freq_factors(w, "rope_factors_short.weight", hp.n_rot) if spec.rope_factors else None
        if w.has("blk.0.attn_qkv.weight") and not spec.fused_qkv:
            raise ModelLoadError(f"{hp.arch}: fused `attn_qkv` tensors are not supported")
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            L = _Layer()
            L.attn_norm = w.vec(p + "attn_norm.weight", e)
            L.attn = Attention(w, p, hp, spec, self.cpu)
            L.attn_post_norm = w.vec(p + "post_attention_norm.weight", e) if spec.post_norms else None
            L.ffn_norm = w.vec(p + "ffn_norm.weight", e)
            L.ffn = GatedFFN(w, p, "", e, hp.n_ff, self.cpu, gelu=spec.ffn == "geglu",
                             fused_up=spec.fused_up)
            L.ffn_post_norm = w.vec(p + "post_ffw_norm.weight", e) if spec.post_norms else None
            self.layers.append(L)
        w.check_all_used()

    def freq_factors(self, n_ctx: int):
        """float32 (n_rot/2,) RoPE frequency factors for a context of n_ctx
        cells, or None: llama3's `rope_freqs`, else LongRoPE's long factors
        when llama.cpp's context (n_ctx padded to a multiple of 256,
        `n_ctx_seq`) exceeds `rope.scaling.original_context_length`, else
        its short ones (`llama_model::get_rope_factors`)."""
        if self.rope_freqs is not None:
            return self.rope_freqs
        if -(-int(n_ctx) // 256) * 256 > self.hp.n_ctx_orig:
            return self.rope_long
        return self.rope_short

    def layer_shape(self, L) -> blocks.DenseShape:
        """The constants of layer L's function (`blocks.dense_layer_fn`)."""
        return blocks.DenseShape(L.attn.shape(), L.ffn.shape(), L.attn_post_norm is not None,
                                 self.spec.names.residual)

    #: run the layers as compiled calls where `compiled.CompiledLayers`
    #: serves the model and the cache (set False to force the eager path)
    compiled = True

    def _compiled_layers(self, cache):
        """The model's `CompiledLayers` when they apply to `cache`, else None."""
        if not self.compiled:
            return None
        from .compiled import CompiledLayers
        if not CompiledLayers.eligible(cache):
            return None
        if getattr(self, "_compiled", None) is None:
            self._compiled = CompiledLayers.build(self) or False
        return self._compiled or None

    def _matrices(self) -> list:
        mats = [self.output]
        for L in self.layers:
            mats += L.attn.matrices() + L.ffn.matrices()
        return mats

    def _forward(self, tokens, cache, all_logits):
        n = len(tokens)
        hp = self.hp
        pos = np.arange(cache.n, cache.n + n)
        rope = {}
        factors = self.freq_factors(cache.n_ctx)
        for key in {(hp.rope_base, hp.rope_freq_scale), (hp.rope_base_swa, hp.rope_freq_scale_swa)}:
            if hp.rope_attn_factor != 1.0:
                # rope_yarn with ext_factor 0: cos and sin times attn_factor
                rope[key] = ops.rope_cache(pos, hp.n_rot, key[0], key[1], factors,
                                           yarn=(0.0, hp.rope_attn_factor, 32.0, 1.0, hp.n_ctx_orig),
                                           profile=self.cpu)
            else:
                rope[key] = rope_cos_sin(pos, hp.n_rot, key[0], key[1], factors)
        keys = [(hp.rope_base_swa, hp.rope_freq_scale_swa) if hp.swa_layers[il] else
                (hp.rope_base, hp.rope_freq_scale) for il in range(hp.n_layer)]
        x = self.embed(tokens)
        # tracing takes the eager path (the compiled layers give the same
        # bits but record nothing)
        layers = None if T.on() else self._compiled_layers(cache)
        if layers is not None:
            x = layers.run(x, pos, cache, rope, keys)
        else:
            res = "inp_scaled" if hp.embd_scale != 1.0 else self.spec.names.embd   # the residual's node
            last = len(self.layers) - 1
            for il, L in enumerate(self.layers):
                c = eager.Ctx(hp, self.spec, self.cpu, il, pos, cache, il, rope[keys[il]],
                              hp.n_swa if hp.swa_layers[il] else 0, last=il == last, res_name=res)
                x = _eager_layer(self.layer_shape(L))(L, x, c)
                res = T.node("l_out", il)
        cache.n += n
        return self._head(x, all_logits)
