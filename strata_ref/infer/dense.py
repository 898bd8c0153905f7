"""The dense decoder graphs: llama, qwen2, qwen3 and gemma3, after llama.cpp
`src/models/{llama,qwen2,qwen3,gemma3}.cpp` and `src/llama-model.cpp` (the
version vendored by llama-cpp-python 0.3.36).

One layer, in llama.cpp's operation order:

    h   = x                                  # residual
    x   = rms_norm(x, eps) * attn_norm
    q   = Wq x (+ bq),  k = Wk x (+ bk),  v = Wv x (+ bv)
    q,k = rms_norm(q|k per head) * q_norm|k_norm        # qwen3, gemma3
    q,k = rope(q|k, pos)      # normal pairs (llama) or NeoX halves (others)
    q   = q * f_attention_scale                         # gemma3 only
    a   = softmax(q k^T * kq_scale + mask) v  per head, GQA
    x   = Wo a;  x = rms_norm(x) * attn_post_norm       # gemma3 only
    x   = x + h;  h = x
    x   = rms_norm(x) * ffn_norm
    x   = Wdown(act(Wgate x) * Wup x)     # act: SiLU; gemma3: GELU via ggml's fp16 table
    x   = rms_norm(x) * ffn_post_norm                   # gemma3 only
    x   = x + h
    logits = Wout(rms_norm(x) * output_norm)   # Wout = token_embd when tied

The arithmetic of each step is `strata_ref.cpu`'s (the shared blocks of
`layers`): activation quantization and the mat-muls (`cpu.matmul`), the F16
KV cache and the F16 rounding of q and of the softmax probabilities that
ggml's F16 mat-muls apply to their float32 operand, K q / V p in tinyBLAS
or `vec_dot_f16` order, soft_max with ggml's expf, SwiGLU, GeGLU and RoPE
(`cpu.ops`); RMSNorm's sum of squares in double.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import trace as T
from .layers import Attention, GatedFFN
from .model import (FAMILIES, ArchKeys, Model, ModelLoadError, _int_param, _shown, common_params,
                    rope_cos_sin)

__all__ = ["HParams", "DenseModel", "MODELS"]

DENSE_ARCHS = tuple(a for a, f in FAMILIES.items() if f == "dense")
# RoPE style by architecture (llama.cpp `llama_model_rope_type`): llama uses
# consecutive pairs, the others NeoX (pairs offset by n_rot / 2).
_NEOX = {"llama": False, "qwen2": True, "qwen3": True, "gemma3": True}


@dataclass(frozen=True)
class HParams:
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
    rope_base_swa: float
    rope_freq_scale: float
    rope_freq_scale_swa: float
    neox: bool
    n_swa: int                 # 0: no sliding window
    swa_layers: tuple          # bool per layer
    attn_scale: float          # multiplies q before attention (gemma3), else 1
    kq_scale: float
    embd_scale: float          # multiplies the token embeddings (gemma3)
    final_softcap: float       # 0: none

    @classmethod
    def from_metadata(cls, md) -> "HParams":
        from .model import architecture
        arch = architecture(md)
        if arch not in DENSE_ARCHS:
            raise ModelLoadError(f"architecture {arch!r} is not a dense one "
                                 f"({', '.join(DENSE_ARCHS)}): load it with strata_ref.infer.load")
        k = ArchKeys(md, arch)
        c = common_params(k)
        n_layer, n_embd, n_head, head_dim = c["n_layer"], c["n_embd"], c["n_head"], c["head_dim"]
        base = c["rope_base"]
        n_swa, swa_layers = 0, (False,) * n_layer
        attn_scale, kq_scale, embd_scale = 1.0, 1.0 / math.sqrt(head_dim), 1.0
        softcap = 0.0
        base_swa = base
        if arch == "gemma3":
            if "attention.sliding_window" in k:
                n_swa = k.int("attention.sliding_window")
            if n_swa > 0:
                kp = f"{arch}.attention.sliding_window_pattern"
                pattern = md.get(kp, 6)
                if isinstance(pattern, (list, np.ndarray)):
                    if not (pattern.dtype.kind in "bui" if isinstance(pattern, np.ndarray) else
                            all(isinstance(b, (bool, int, np.integer, np.bool_)) for b in pattern)):
                        raise ModelLoadError(f"`{kp}` must be an array of BOOL or integers, "
                                             f"got {_shown(pattern)}")
                    if len(pattern) != n_layer:
                        raise ModelLoadError(f"`{kp}` has {len(pattern)} values for {n_layer} layers")
                    swa_layers = tuple(bool(b) for b in pattern)
                else:
                    p = _int_param(kp, pattern, 0)  # llama.cpp set_swa_pattern: il % p < p - 1
                    swa_layers = tuple(p == 0 or il % p < p - 1 for il in range(n_layer))
                # llama.cpp's default `rope_freq_base_train_swa` is 10000
                # (llama-hparams.h), kept when the file has no key
                base_swa = k.float("rope.freq_base_swa", 10000.0)
            softcap = k.float("final_logit_softcapping", 0.0, positive=False)
            # llama.cpp: 1/sqrt(n_embd/n_head) for the 27B (62 layers), else 1/sqrt(head_dim)
            attn_scale = (1.0 / math.sqrt(float(n_embd // n_head)) if n_layer == 62
                          else 1.0 / math.sqrt(float(head_dim)))
            kq_scale = 1.0
            embd_scale = float(np.sqrt(np.float32(n_embd)))
        return cls(**c, rope_base_swa=base_swa,
                   # sliding-window layers rotate with `rope_freq_scale_train_swa`,
                   # 1 unless an architecture sets it (llama_model::get_rope_freq_scale)
                   rope_freq_scale_swa=1.0, neox=_NEOX[arch],
                   n_swa=n_swa, swa_layers=swa_layers, attn_scale=attn_scale,
                   kq_scale=kq_scale, embd_scale=embd_scale, final_softcap=softcap)


class _Layer:
    pass


class DenseModel(Model):
    """llama / qwen2 / qwen3 / gemma3 (module docstring)."""

    HPARAMS = HParams

    def _load_layers(self) -> None:
        hp, w = self.hp, self.w
        e = hp.n_embd
        ff = w.get("rope_freqs.weight", required=False)
        self.rope_freqs = w.vec("rope_freqs.weight", hp.n_rot // 2) if ff is not None else None
        if self.rope_freqs is not None:
            # ggml divides each pair's angle by its factor
            bad = np.flatnonzero(~(np.isfinite(self.rope_freqs) & (self.rope_freqs > 0)))
            if bad.size:
                i = int(bad[0])
                raise ModelLoadError(f"tensor `rope_freqs.weight` value [{i}] = "
                                     f"{float(self.rope_freqs[i])!r}: RoPE frequency factors "
                                     f"must be finite and > 0")
        qk_norm = hp.arch in ("qwen3", "gemma3")
        gemma = hp.arch == "gemma3"
        if w.has("blk.0.attn_qkv.weight"):
            raise ModelLoadError(f"{hp.arch}: fused `attn_qkv` tensors are not supported")
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            L = _Layer()
            L.attn_norm = w.vec(p + "attn_norm.weight", e)
            L.attn = Attention(w, p, hp, self.cpu, qk_norm=qk_norm, attn_scale=hp.attn_scale)
            L.attn_post_norm = w.vec(p + "post_attention_norm.weight", e) if gemma else None
            L.ffn_norm = w.vec(p + "ffn_norm.weight", e)
            L.ffn = GatedFFN(w, p, "", e, hp.n_ff, self.cpu, gelu=gemma)
            L.ffn_post_norm = w.vec(p + "post_ffw_norm.weight", e) if gemma else None
            self.layers.append(L)

    #: run the layers as compiled calls where `compiled.CompiledLayers`
    #: serves the model and the cache (set False to force the Python path)
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

    def embed(self, tokens) -> np.ndarray:
        """float32 (n, n_embd) token embeddings (times embd_scale)."""
        x = super().embed(tokens)
        if self.hp.embd_scale != 1.0:
            x = (x * np.float32(self.hp.embd_scale)).astype(np.float32)
            T.emit("inp_scaled", "SCALE", x)
        return x

    def _forward(self, tokens, cache, all_logits):
        n = len(tokens)
        hp = self.hp
        pos = np.arange(cache.n, cache.n + n)
        rope = {}
        for key in {(hp.rope_base, hp.rope_freq_scale), (hp.rope_base_swa, hp.rope_freq_scale_swa)}:
            rope[key] = rope_cos_sin(pos, hp.n_rot, key[0], key[1], self.rope_freqs)
        x = self.embed(tokens)
        # tracing takes the Python path (the compiled layers give the same
        # bits but cannot be hooked)
        layers = None if T.on() else self._compiled_layers(cache)
        if layers is not None:
            keys = [(hp.rope_base_swa, hp.rope_freq_scale_swa) if hp.swa_layers[il] else
                    (hp.rope_base, hp.rope_freq_scale) for il in range(hp.n_layer)]
            x = layers.run(x, pos, cache, rope, keys)
            cache.n += n
            return self._head(x, all_logits)
        gemma = hp.arch == "gemma3"
        res = "inp_scaled" if hp.embd_scale != 1.0 else self.EMBD_NAME   # the residual's node
        last = len(self.layers) - 1
        for il, L in enumerate(self.layers):
            swa = hp.swa_layers[il]
            h = x
            x = T.norm(x, L.attn_norm, hp.eps, "attn_norm", il)
            key = (hp.rope_base_swa, hp.rope_freq_scale_swa) if swa else (hp.rope_base, hp.rope_freq_scale)
            x = L.attn(x, pos, cache, il, rope[key], hp.n_swa if swa else 0)
            if il == last:
                self._trace_out_rows(L.attn.out_name, x)
            if L.attn_post_norm is not None:
                x = T.norm(x, L.attn_post_norm, hp.eps, "attn_post_norm", il)
            if il == last:
                self._trace_out_rows(res if res != "l_out" else T.node(res, il - 1), h)
            x = x + h
            T.emit("sa_out" if gemma else "ffn_inp", "ADD", x, il)
            h = x
            x = T.norm(x, L.ffn_norm, hp.eps, "ffn_norm", il)
            x = L.ffn(x)
            if L.ffn_post_norm is not None:
                # gemma3.cpp builds this norm with layer -1: its node is `norm`
                x = T.norm(x, L.ffn_post_norm, hp.eps, "ffn_post_norm", il, norm_il=-1)
            x = x + h
            T.emit("l_out", "ADD", x, il)
            res = "l_out"
        cache.n += n
        return self._head(x, all_logits)


MODELS = {a: DenseModel for a in DENSE_ARCHS}
