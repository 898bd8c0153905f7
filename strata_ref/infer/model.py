"""The forward pass of decoder-only GGUF models, as llama.cpp builds it.

Architectures (`general.architecture`): llama, qwen2, qwen3 and gemma3, after
ggml-org/llama.cpp `src/models/{llama,qwen2,qwen3,gemma3}.cpp` and
`src/llama-model.cpp` (the version vendored by llama-cpp-python 0.3.36).

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

Every operation follows ggml-cpu's arithmetic, order of float operations
included, in the CPU profile the model was loaded with (`strata_ref.cpu`:
one per llama.cpp CPU build), so that the logits equal that build's bit for
bit (docs/inference.md): activation quantization and the mat-muls
(`cpu.matmul`), the F16 KV cache and the F16 rounding of q and of the
softmax probabilities that ggml's F16 mat-muls apply to their float32
operand, K q / V p in tinyBLAS or `vec_dot_f16` order, soft_max with ggml's
expf, SwiGLU, GeGLU and RoPE (`cpu.ops`); RMSNorm's sum of squares in
double (ggml `ggml_compute_forward_rms_norm_f32`). The graph below never
asks which profile runs.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from .. import cpu
from ..cpu import ops
from ..cpu.matmul import QMatrix
from ..types import PLAIN_TYPES, GGMLType, block_format
from .kv_cache import KVCache
from .tokenizer import Tokenizer

__all__ = ["Model", "HParams", "ModelLoadError", "ModelOutputError", "SUPPORTED_ARCHS",
           "check_logits", "load"]

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
# RoPE style by architecture (llama.cpp `llama_model_rope_type`): llama uses
# consecutive pairs, the others NeoX (pairs offset by n_rot / 2).
_NEOX = {"llama": False, "qwen2": True, "qwen3": True, "gemma3": True}


class ModelLoadError(ValueError):
    """A GGUF file this engine cannot run: unsupported architecture, missing
    metadata key or tensor, a hyperparameter of the wrong type or out of
    range (the message names the key and its value), or inconsistent
    shapes."""


class ModelOutputError(ValueError):
    """The forward pass gave logits that cannot be sampled (non-finite, or
    all equal): a damaged model that loaded (`check_logits`)."""


#: llama.cpp's `LLAMA_MAX_LAYERS` (src/llama-hparams.h): more layers than
#: this is a damaged file, refused before anything per layer is built
MAX_LAYERS = 512


def _shown(v) -> str:
    """repr of a metadata value for a message, at most about 80 characters
    (an array of 10^5 strings is not quoted whole)."""
    r = repr(v)
    return r if len(r) <= 80 else r[:60] + " ... " + r[-15:]


def _int_param(k: str, v, lo: int, hi: int | None = None) -> int:
    """Metadata value `v` of key `k` as an int in [lo, hi]; a bool, float,
    string or out-of-range value raises ModelLoadError naming key and value
    (llama.cpp reads these keys as integers and refuses other types)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ModelLoadError(f"`{k}` = {_shown(v)} is not an integer")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ModelLoadError(f"`{k}` = {v} is out of range (must be {rng})")
    return v


def _float_param(k: str, v, positive: bool = True) -> float:
    """Metadata value `v` of key `k` as a finite float, > 0 when `positive`
    else >= 0; anything else raises ModelLoadError naming key and value."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ModelLoadError(f"`{k}` = {_shown(v)} is not a number")
    f = float(v)
    if not math.isfinite(f) or f < 0.0 or (positive and f == 0.0):
        raise ModelLoadError(f"`{k}` = {f!r} must be finite and {'> 0' if positive else '>= 0'}")
    return f


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
        arch = md.get("general.architecture")
        if arch is None:
            raise ModelLoadError("GGUF metadata has no `general.architecture`")
        if not isinstance(arch, str):
            raise ModelLoadError(f"`general.architecture` = {_shown(arch)} is not a string")
        if arch not in SUPPORTED_ARCHS:
            raise ModelLoadError(f"unsupported architecture {arch!r} "
                                 f"(supported: {', '.join(SUPPORTED_ARCHS)})")

        def key(name, default=None, required=False):
            k = f"{arch}.{name}"
            if k in md:
                v = md[k]
                if isinstance(v, np.ndarray):
                    if v.size and np.all(v == v.flat[0]):
                        return v.flat[0].item()
                    raise ModelLoadError(f"per-layer values of `{k}` are not supported")
                return v
            if required:
                raise ModelLoadError(f"GGUF metadata has no `{k}`")
            return default

        def ikey(name, default=None, required=False, lo=1, hi=None):
            return _int_param(f"{arch}.{name}", key(name, default, required), lo, hi)

        def fkey(name, default=None, required=False, positive=True):
            return _float_param(f"{arch}.{name}", key(name, default, required), positive)

        n_layer = ikey("block_count", required=True, hi=MAX_LAYERS)
        n_embd = ikey("embedding_length", required=True)
        n_ff = ikey("feed_forward_length", required=True)
        n_head = ikey("attention.head_count", required=True)
        n_head_kv = ikey("attention.head_count_kv", n_head, hi=n_head)
        if n_head % n_head_kv:
            raise ModelLoadError(f"`{arch}.attention.head_count` = {n_head} is not a multiple of "
                                 f"`{arch}.attention.head_count_kv` = {n_head_kv}")
        if f"{arch}.attention.key_length" not in md and n_embd % n_head:
            # llama.cpp's default head size is n_embd / n_head
            raise ModelLoadError(f"`{arch}.embedding_length` = {n_embd} is not a multiple of "
                                 f"`{arch}.attention.head_count` = {n_head} (and there is no "
                                 f"`{arch}.attention.key_length`)")
        head_dim = ikey("attention.key_length", n_embd // n_head)
        if ikey("attention.value_length", head_dim) != head_dim:
            raise ModelLoadError(f"`{arch}.attention.value_length` differs from key_length: not supported")
        n_rot = ikey("rope.dimension_count", head_dim, lo=2, hi=head_dim)
        if n_rot % 2:
            raise ModelLoadError(f"`{arch}.rope.dimension_count` = {n_rot} is odd (RoPE rotates pairs)")
        n_ctx_train = ikey("context_length", 2048)
        eps = fkey("attention.layer_norm_rms_epsilon", required=True)
        base = fkey("rope.freq_base", 10000.0)
        scaling = key("rope.scaling.type", "none")
        if not isinstance(scaling, str):
            raise ModelLoadError(f"`{arch}.rope.scaling.type` = {_shown(scaling)} is not a string")
        factor = fkey("rope.scaling.factor", 0.0, positive=False)
        if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
            raise ModelLoadError(f"RoPE scaling `{arch}.rope.scaling.type` = {scaling!r} is not supported")
        freq_scale = 1.0 / factor if scaling == "linear" and factor > 0 else 1.0
        n_swa, swa_layers = 0, (False,) * n_layer
        attn_scale, kq_scale, embd_scale = 1.0, 1.0 / math.sqrt(head_dim), 1.0
        softcap = 0.0
        base_swa = base
        if arch == "gemma3":
            if f"{arch}.attention.sliding_window" in md:
                n_swa = ikey("attention.sliding_window")
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
                base_swa = fkey("rope.freq_base_swa", 10000.0)
            softcap = fkey("final_logit_softcapping", 0.0, positive=False)
            # llama.cpp: 1/sqrt(n_embd/n_head) for the 27B (62 layers), else 1/sqrt(head_dim)
            attn_scale = (1.0 / math.sqrt(float(n_embd // n_head)) if n_layer == 62
                          else 1.0 / math.sqrt(float(head_dim)))
            kq_scale = 1.0
            embd_scale = float(np.sqrt(np.float32(n_embd)))
        return cls(arch=arch, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                   n_head_kv=n_head_kv, head_dim=head_dim,
                   n_rot=n_rot, n_ctx_train=n_ctx_train, eps=eps, rope_base=base,
                   rope_base_swa=base_swa, rope_freq_scale=freq_scale,
                   # sliding-window layers rotate with `rope_freq_scale_train_swa`,
                   # 1 unless an architecture sets it (llama_model::get_rope_freq_scale)
                   rope_freq_scale_swa=1.0, neox=_NEOX[arch],
                   n_swa=n_swa, swa_layers=swa_layers, attn_scale=attn_scale,
                   kq_scale=kq_scale, embd_scale=embd_scale, final_softcap=softcap)


# ------------------------------------------------------------------ ops
#: ggml `rms_norm` then `mul`, the same in every build (`cpu.ops.rms_norm`)
rms_norm = ops.rms_norm


def rope_cos_sin(pos: np.ndarray, n_rot: int, base: float, freq_scale: float,
                 freq_factors: np.ndarray | None = None):
    """cos and sin float32 (n, n_rot/2) as ggml `ggml_rope_cache_init`
    (`ops.rope_cache`): theta starts at the position and is multiplied by
    powf(base, -2/n_rot) in float32 for each pair; freq_factors divide it
    (llama3 `rope_freqs`); libm cosf / sinf."""
    return ops.rope_cache(pos, n_rot, base, freq_scale, freq_factors)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool,
               profile=None) -> np.ndarray:
    """Rotate the first n_rot values of each head. x (n, heads, head_dim);
    cos, sin (n, n_rot/2). Normal style pairs (2i, 2i+1); NeoX pairs
    (i, i + n_rot/2) (ggml `rotate_pairs` as the profile's build compiles
    it: `ops.rope`). profile: a `strata_ref.cpu` profile or name (None:
    `cpu.select()`)."""
    return ops.rope(x, cos, sin, n_rot, neox, cpu.select(profile))


# ------------------------------------------------------------------ model
class _Layer:
    pass


class Model:
    """A loaded GGUF model: `hp` (HParams), `tokenizer`, weights.

    `forward(tokens, cache, all_logits=False)` runs the tokens (int list)
    at positions cache.n .. cache.n + len - 1, appends their K/V to `cache`,
    and returns float32 logits (n_vocab,) of the last token, or
    (len, n_vocab) for every token when `all_logits`.
    """

    def __init__(self, gf, path=None, profile=None):
        self.path = path
        #: the CPU profile (`strata_ref.cpu.Profile`) whose arithmetic runs
        self.cpu = cpu.select(profile)
        md = gf.metadata
        self.metadata = md
        self.hp = hp = HParams.from_metadata(md)
        self.tokenizer = Tokenizer.from_metadata(md)
        tensors = {t.name: t for t in gf.tensors}

        def get(name, required=True):
            t = tensors.get(name)
            if t is None and required:
                raise ModelLoadError(f"{hp.arch}: missing tensor `{name}`")
            return t

        def checked(name, t, ne):
            # llama.cpp `create_tensor`: the ggml shape is exactly `ne`, the
            # dimensions beyond it 1 (a (64, 32, 2) tensor is not 64 x 64)
            have = tuple(t.shape) + (1,) * (4 - len(t.shape))
            want = tuple(ne) + (1,) * (4 - len(ne))
            if have != want:
                raise ModelLoadError(f"tensor `{name}` has ggml shape {list(t.shape)}, expected "
                                     f"{list(ne)}")
            if t.type in PLAIN_TYPES:
                raise ModelLoadError(f"tensor `{name}` is of type {t.type.name}, a plain "
                                     f"{block_format(t.type).field('v').kind} array; model "
                                     f"weights are float or quantized types")
            return t

        def vec(name, n, required=True):
            t = get(name, required)
            if t is None:
                return None
            checked(name, t, (n,))
            if t.type != GGMLType.F32:
                from ..dequant import dequant_f32
                return dequant_f32(t.type, t.data, 1, n)[0]
            return np.array(t.data.view(np.float32))

        def mat(name, rows, cols, required=True):
            t = get(name, required)
            if t is None:
                return None
            checked(name, t, (cols, rows))
            return QMatrix(t.type, t.data, rows, cols, name, self.cpu)

        e, hd = hp.n_embd, hp.head_dim
        nq, nkv = hp.n_head * hd, hp.n_head_kv * hd
        # the vocabulary is the tokenizer's (llama.cpp: n_vocab = the number
        # of tokens); the embedding and the output have exactly that many rows
        self.n_vocab = nv = self.tokenizer.n_vocab
        for name in ("token_embd.weight", "output.weight"):
            t = get(name, required=name == "token_embd.weight")
            if t is not None and len(t.shape) == 2 and t.cols == e and t.rows != nv:
                raise ModelLoadError(f"tensor `{name}` has {t.rows} rows, but the vocabulary "
                                     f"(`tokenizer.ggml.tokens`) has {nv} tokens")
        self.tok_embd = mat("token_embd.weight", nv, e)
        self.output_norm = vec("output_norm.weight", e)
        out = mat("output.weight", nv, e, required=False)
        self.output = out if out is not None else self.tok_embd
        ff = get("rope_freqs.weight", required=False)
        self.rope_freqs = vec("rope_freqs.weight", hp.n_rot // 2) if ff is not None else None
        if self.rope_freqs is not None:
            # ggml divides each pair's angle by its factor
            bad = np.flatnonzero(~(np.isfinite(self.rope_freqs) & (self.rope_freqs > 0)))
            if bad.size:
                i = int(bad[0])
                raise ModelLoadError(f"tensor `rope_freqs.weight` value [{i}] = "
                                     f"{float(self.rope_freqs[i])!r}: RoPE frequency factors "
                                     f"must be finite and > 0")
        qk_norm = hp.arch in ("qwen3", "gemma3")
        post_norms = hp.arch == "gemma3"
        if f"blk.0.attn_qkv.weight" in tensors:
            raise ModelLoadError(f"{hp.arch}: fused `attn_qkv` tensors are not supported")
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            L = _Layer()
            L.attn_norm = vec(p + "attn_norm.weight", e)
            L.wq = mat(p + "attn_q.weight", nq, e)
            L.wk = mat(p + "attn_k.weight", nkv, e)
            L.wv = mat(p + "attn_v.weight", nkv, e)
            L.wo = mat(p + "attn_output.weight", e, nq)
            L.bq = vec(p + "attn_q.bias", nq, required=False)
            L.bk = vec(p + "attn_k.bias", nkv, required=False)
            L.bv = vec(p + "attn_v.bias", nkv, required=False)
            L.q_norm = vec(p + "attn_q_norm.weight", hd) if qk_norm else None
            L.k_norm = vec(p + "attn_k_norm.weight", hd) if qk_norm else None
            L.attn_post_norm = vec(p + "post_attention_norm.weight", e) if post_norms else None
            L.ffn_norm = vec(p + "ffn_norm.weight", e)
            L.w_gate = mat(p + "ffn_gate.weight", hp.n_ff, e)
            L.w_up = mat(p + "ffn_up.weight", hp.n_ff, e)
            L.w_down = mat(p + "ffn_down.weight", e, hp.n_ff)
            L.ffn_post_norm = vec(p + "post_ffw_norm.weight", e) if post_norms else None
            # one kernel call for q|k|v and for gate|up when their types agree
            L.wqkv = (QMatrix.stack([L.wq, L.wk, L.wv], p + "attn_qkv")
                      if L.wq.type == L.wk.type == L.wv.type else None)
            L.w_gate_up = (QMatrix.stack([L.w_gate, L.w_up], p + "ffn_gate_up")
                           if L.w_gate.type == L.w_up.type else None)
            self.layers.append(L)

    # -------------------------------------------------------------- API
    def prepare(self) -> None:
        """Pack every matrix the forward pass multiplies now rather than at
        its first use (so that timings exclude it)."""
        mats = [self.output]
        for L in self.layers:
            mats += [L.wqkv] if L.wqkv is not None else [L.wq, L.wk, L.wv]
            mats += [L.wo, L.w_down]
            mats += [L.w_gate_up] if L.w_gate_up is not None else [L.w_gate, L.w_up]
        for q in mats:
            q.prepare()

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        """An empty F16 KV cache for n_ctx positions (default: the training
        context, at most 4096).

        Raises ValueError, before allocating anything, when n_ctx is below 1
        or above the model's training context (`<arch>.context_length`, the
        limit of `strata-ref generate --ctx`: this engine has no context
        extension), or when the cache would need more bytes than this
        machine's physical memory (`KVCache.bytes_needed`)."""
        hp = self.hp
        n_ctx = min(hp.n_ctx_train, 4096) if n_ctx is None else int(n_ctx)
        if not 1 <= n_ctx <= hp.n_ctx_train:
            raise ValueError(f"context length (--ctx) {n_ctx} is outside 1 .. {hp.n_ctx_train}, "
                             f"the model's training context (`{hp.arch}.context_length`)")
        need = KVCache.bytes_needed(hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx)
        have = _physical_memory()
        if have and need > have:
            raise ValueError(f"context length (--ctx) {n_ctx}: the KV cache would take "
                             f"{need / 2**30:.1f} GiB, more than this machine's "
                             f"{have / 2**30:.1f} GiB of memory")
        return KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx)

    def embed(self, tokens) -> np.ndarray:
        """float32 (n, n_embd) token embeddings (times embd_scale)."""
        x = np.stack([self.tok_embd.row_f32(int(t)) for t in tokens])
        if self.hp.embd_scale != 1.0:
            x = (x * np.float32(self.hp.embd_scale)).astype(np.float32)
        return x

    def forward(self, tokens, cache: KVCache, all_logits: bool = False) -> np.ndarray:
        # A damaged model (NaN epsilon, wrong tensor type) overflows or makes
        # NaN in numpy steps; the caller checks the logits (`check_logits`)
        # and names the problem once, instead of a RuntimeWarning per step.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._forward_chunks(tokens, cache, all_logits)

    def _forward_chunks(self, tokens, cache, all_logits):
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("forward needs at least one token")
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {self.n_vocab})")
        n = len(tokens)
        if cache.n + n > cache.n_ctx:
            raise ValueError(f"context full: {cache.n} + {n} tokens exceed n_ctx = {cache.n_ctx}")
        if n > self.CHUNK:
            # Long inputs run in chunks, as llama.cpp splits a batch into
            # ubatches of n_ubatch (512 by default) tokens. ggml's code path
            # depends on the number of tokens in a pass (one token or more;
            # 8 or more for the tiled K-quants; whole groups of 4 for the
            # repacked gemm), so a chunk can differ from one pass in the
            # last bits where those counts change.
            parts = [self._forward_chunks(tokens[i:i + self.CHUNK], cache, all_logits)
                     for i in range(0, n, self.CHUNK)]
            return np.concatenate(parts) if all_logits else parts[-1]
        return self._forward(tokens, cache, all_logits)

    #: tokens per internal pass of `forward` (llama.cpp's default n_ubatch)
    CHUNK = 512

    def _forward(self, tokens, cache, all_logits):
        n = len(tokens)
        hp = self.hp
        pos = np.arange(cache.n, cache.n + n)
        rope = {}
        for key in {(hp.rope_base, hp.rope_freq_scale), (hp.rope_base_swa, hp.rope_freq_scale_swa)}:
            rope[key] = rope_cos_sin(pos, hp.n_rot, key[0], key[1], self.rope_freqs)
        x = self.embed(tokens)
        for il, L in enumerate(self.layers):
            swa = hp.swa_layers[il]
            h = x
            x = rms_norm(x, L.attn_norm, hp.eps)
            key = (hp.rope_base_swa, hp.rope_freq_scale_swa) if swa else (hp.rope_base, hp.rope_freq_scale)
            a = self._attention(L, il, x, pos, cache, rope[key], hp.n_swa if swa else 0)
            x = L.wo.matmul(a)
            if L.attn_post_norm is not None:
                x = rms_norm(x, L.attn_post_norm, hp.eps)
            x = x + h
            h = x
            x = rms_norm(x, L.ffn_norm, hp.eps)
            if L.w_gate_up is not None:
                gu = L.w_gate_up.matmul(x)
                g, u = gu[:, :hp.n_ff], gu[:, hp.n_ff:]
            else:
                g, u = L.w_gate.matmul(x), L.w_up.matmul(x)
            x = L.w_down.matmul(ops.geglu(g, u, self.cpu) if hp.arch == "gemma3"
                                else ops.swiglu(g, u, self.cpu))
            if L.ffn_post_norm is not None:
                x = rms_norm(x, L.ffn_post_norm, hp.eps)
            x = x + h
        cache.n += n
        if not all_logits:
            x = x[-1:]
        x = rms_norm(x, self.output_norm, hp.eps)
        logits = self.output.matmul(x)
        if hp.final_softcap:
            logits = ops.softcap(logits, hp.final_softcap)
        return logits if all_logits else logits[0]

    def _attention(self, L, il, x, pos, cache, cos_sin, n_swa):
        hp = self.hp
        n, hd = x.shape[0], hp.head_dim
        if L.wqkv is not None:
            nq, nkv = hp.n_head * hd, hp.n_head_kv * hd
            qkv = L.wqkv.matmul(x)
            q, k, v = qkv[:, :nq], qkv[:, nq:nq + nkv], qkv[:, nq + nkv:]
        else:
            q, k, v = L.wq.matmul(x), L.wk.matmul(x), L.wv.matmul(x)
        if L.bq is not None:
            q = q + L.bq
        if L.bk is not None:
            k = k + L.bk
        if L.bv is not None:
            v = v + L.bv
        q = q.reshape(n, hp.n_head, hd)
        k = k.reshape(n, hp.n_head_kv, hd)
        v = v.reshape(n, hp.n_head_kv, hd)
        if L.q_norm is not None:
            q = rms_norm(q, L.q_norm, hp.eps)
            k = rms_norm(k, L.k_norm, hp.eps)
        cos, sin = cos_sin
        q = ops.rope(q, cos, sin, hp.n_rot, hp.neox, self.cpu)
        k = ops.rope(k, cos, sin, hp.n_rot, hp.neox, self.cpu)
        if hp.attn_scale != 1.0:
            q = (q * np.float32(hp.attn_scale)).astype(np.float32)
        cache.store(il, k, v)
        return ops.attention(q, cache.k[il].view(np.uint16), cache.v[il].view(np.uint16),
                             cache.n + n, pos, hp.kq_scale, self.cpu, n_swa)


def _physical_memory() -> int:
    """Bytes of physical memory, 0 when the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def check_logits(logits: np.ndarray, where: str, spread: bool = True) -> None:
    """Raise ModelOutputError when `logits` (float32, (n_vocab,)) cannot be
    sampled: any NaN or infinite value, or (`spread`) every value equal,
    which a working model never gives and a damaged one (NaN or zero
    weights, a tensor read as the wrong type) does. `where` names the pass
    in the message ("the prompt pass", "decode step 3"). O(n_vocab)."""
    bad = ~np.isfinite(logits)
    if bad.any():
        n_nan = int(np.isnan(logits).sum())
        raise ModelOutputError(f"the logits of {where} have {int(bad.sum())} non-finite values "
                               f"of {logits.size} ({n_nan} NaN): the model file is damaged "
                               f"(NaN or huge weights or metadata, e.g. the RMS epsilon)")
    if spread and logits.size > 1 and logits.min() == logits.max():
        raise ModelOutputError(f"the logits of {where} are all equal ({float(logits[0])!r}): "
                               f"the model file is damaged (zero weights, or a tensor stored "
                               f"with the wrong type)")


def load(path, profile=None) -> Model:
    """Load a GGUF model file (via `strata_ref.gguf.read`) to run in the CPU
    profile `profile` (a name or `strata_ref.cpu.Profile`; None:
    `strata_ref.cpu.select()`). Raises ModelLoadError for what the engine
    cannot run, GGUFError for a malformed file, ValueError for an unknown
    profile."""
    from .. import gguf
    prof = cpu.select(profile)
    gf = gguf.read(path)
    return Model(gf, path=str(path), profile=prof)
