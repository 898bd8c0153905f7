"""The gemma4 graph (Gemma 4: the dense 31B, the MoE 26B-A4B and the
E2B / E4B models with per-layer embeddings), after llama.cpp
`src/models/gemma4.cpp` (`llama_model_gemma4::load_arch_hparams`,
`load_arch_tensors`, `graph::graph`, `build_inp_per_layer`,
`project_per_layer_inputs`), `llama_model_base::load_hparams` and the
KV-cache reuse of `src/llama-model.cpp`, `llama_hparams` and
`build_attn` / `build_ffn` / `build_moe_ffn` (`src/llama-graph.cpp`) of
the llama.cpp vendored by llama-cpp-python 0.3.36.

Two kinds of layers, as `attention.sliding_window_pattern` (one BOOL per
layer) says: sliding-window ones (a window of `attention.sliding_window`
positions, heads of `attention.key_length_swa`, RoPE over
`rope.dimension_count_swa` values with base `rope.freq_base_swa`, default
10000) and full ones (heads of `attention.key_length`, RoPE over
`rope.dimension_count` values with base `rope.freq_base`, the angles
divided by the model-wide `rope_freqs` factors: the converter's 1e30 for
the pairs its "proportional" RoPE leaves unrotated). The KV head count
may differ per layer (`attention.head_count_kv` as an array); each kind
caches its own heads (`kv_cache.IswaCache`). The last
`attention.shared_kv_layers` layers store no K / V: they attend to the
cells of the last earlier layer of their kind.

One layer, x float32 (n, n_embd):

    h    = x;  x = rms_norm(x) * attn_norm
    q    = rope(rms_norm(Wq x per head) * q_norm)
    k    = rope(rms_norm(Wk x per head) * k_norm)
    v    = rms_norm(Wv x per head)      (no weight; Wv absent: the K product)
    a    = Wo softmax(K q + mask) V     (scale 1)
    a    = rms_norm(a) * attn_post_norm;  h = a + h              (attn_out)
    f    = W_down geglu(W_gate y, W_up y),  y = rms_norm(h) * ffn_norm
  MoE layers (those with `ffn_gate_inp`):
    f    = rms_norm(f) * post_ffw_norm_1
    r    = W_router ((rms_norm(h) * (1 / sqrtf(n_embd))) * ffn_gate_inp.scale)
    e    = experts(rms_norm(h) * pre_ffw_norm_2) routed by softmax(r), top k,
           weights normalized; GeGLU experts, each down product times its
           `ffn_down_exps.scale`
    f    = f + rms_norm(e) * post_ffw_norm_2
  every layer:
    x    = rms_norm(f) * post_ffw_norm + h
    x    = x + rms_norm(W_proj (gelu(W_gate_pl x) * p[il])) * post_norm   (per-layer embeddings)
    x    = x * layer_output_scale                                       (where the file has it)

The per-layer inputs p (n_layer, n, n_embd_per_layer), computed once per
pass from the scaled token embeddings e: (rms_norm((W_pl e) * (1 /
sqrtf(n_embd))) * per_layer_proj_norm + per_layer_token_embd[token] *
sqrtf(n_embd_per_layer)) * (1 / sqrtf(2)). The output head is gemma's:
RMSNorm, the (tied) output matrix, tanh soft-capping by
`final_logit_softcapping`.

Every operation is `strata_ref.cpu`'s, in ggml's order of float
operations for the model's profile: the mat-muls (`QMatrix`), the norms,
RoPE, GeGLU and GELU (ggml's F16 table), the attention (`KVCache.attend`
on each kind's cache of the `IswaCache`: F16 without flash attention, or
flash attention, or another cache type, with llama.cpp's Hadamard
rotation sized per kind by its head size; a shared layer rotates its q
and the output with its kind's rotation but stores nothing), the experts
(`moe.MoEFFN`, `cpu.moe`).

The KV caches run are those checked bit for bit against llama.cpp's
(`CHECKED_CACHES`: flash attention with F16, F32, BF16 and each block
type for K and V, F16 K with a q4_0 V, q8_0 K with a q4_1 V; without it
F16, F32, BF16, each block type for K with an F16 V, q5_1 K with a BF16 V;
the rotation off with q8_0 K and V and flash attention), on the profiles
`CACHE_PROFILES`; the F16 cache without flash attention on every profile.
Refused by name: any other cache, type pair or profile (NotEmulated), a
rotated block-type cache whose kinds' head sizes are not all multiples of
64 or all not (llama.cpp decides both caches' rotation by layer 0's head
size), a fused `attn_qkv`, per-tensor weight scales (`*.scale` tensors
other than the router's and the experts' down scale: NVFP4 files), a
sliding-window pattern that is not an array, per-layer head counts or
head sizes that differ within a kind.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._text import count
from ..cpu import ops
from ..cpu.profiles import SOURCE_BUILD_PROFILES
from . import trace as T
from .kv_cache import IswaCache, cache_type, resolve_flash_attn, rotation_disabled
from .layers import GatedFFN
from .model import (CommonHParams, ArchKeys, Model, ModelLoadError, arch_spec, common_params,
                    refuse_rope_attn_factor, swa_params)
from .moe import MoEFFN, expert_params

__all__ = ["Gemma4HParams", "Gemma4Attention", "Gemma4Model", "CHECKED_CACHES", "CACHE_PROFILES"]

_F32 = np.float32
#: this graph's module name (`archs.ArchSpec.module`)
_GRAPH = __name__.rsplit(".", 1)[-1]

#: the KV caches (type_k, type_v, flash attention) checked bit for bit
#: against llama.cpp for gemma4 (tests/data/<profile>/llama_kv_moe_gemma4*.npz,
#: tools/llama_ref.py `moekv`), besides the F16 one without flash attention
CHECKED_CACHES = frozenset(
    {("f16", "f16", True), ("f32", "f32", False), ("f32", "f32", True), ("bf16", "bf16", False),
     ("bf16", "bf16", True), ("f16", "q4_0", True), ("q8_0", "q4_1", True), ("q5_1", "bf16", False)}
    | {(t, t, True) for t in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")}
    | {(t, "f16", False) for t in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")})
#: those also checked with the Hadamard rotation off
CHECKED_NO_ROTATION = (("q8_0", "q8_0", True),)
#: the profiles the caches of CHECKED_CACHES are checked on: the x86 ones
#: (avx512's data made on a Sapphire Rapids CPU, docs/inference.md) and the
#: arm64 builds (under qemu: tools/arm_ref.py `moekv`)
CACHE_PROFILES = SOURCE_BUILD_PROFILES


def _phrase(key) -> str:
    tk, tv, fa = key
    return f"{tk}/{tv} {'with' if fa else 'without'} flash attention"


def _checked_phrase() -> str:
    """CHECKED_CACHES (and the F16 cache without flash attention) in
    words, grouped: per flash attention setting, the types with K = V, the
    K types over an f16 V, then the other K/V pairs."""
    from .._notemulated import names_in_order
    keys = CHECKED_CACHES | {("f16", "f16", False)}
    parts = []
    for fa in (True, False):
        ks = {(k, v) for k, v, f in keys if f == fa}
        same = [k for k, v in ks if k == v]
        over_f16 = [k for k, v in ks if v == "f16" and k != "f16"]
        pairs = sorted(f"{k}/{v}" for k, v in ks if k != v and v != "f16")
        words = [f"K = V of {names_in_order(same)}"] if same else []
        words += [f"K of {names_in_order(over_f16)} over an f16 V"] if over_f16 else []
        words += [f"the K/V pairs {', '.join(pairs)}"] if pairs else []
        parts.append(f"{'with' if fa else 'without'} flash attention, {'; '.join(words)}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Gemma4HParams(CommonHParams):
    """gemma4's hyperparameters (module docstring); head_dim / n_rot /
    rope_base / rope_freq_scale are the full layers', the *_swa ones the
    sliding-window layers'; n_head_kv_layers and n_ff_layers one value per
    layer; n_layer_kv the layers that store K / V (the others reuse);
    n_expert 0 for a dense file."""
    head_dim_swa: int
    n_rot_swa: int
    rope_base_swa: float
    rope_freq_scale_swa: float
    n_swa: int
    swa_layers: tuple
    n_head_kv_layers: tuple
    n_ff_layers: tuple
    n_layer_kv: int
    n_embd_per_layer: int
    embd_scale: float
    final_softcap: float
    kq_scale: float = 1.0
    neox: bool = True
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    gating: str = "softmax"
    norm_w: bool = True
    w_scale: float = 0.0

    @classmethod
    def from_metadata(cls, md) -> "Gemma4HParams":
        """The hyperparameters of a gemma4 file as llama.cpp reads them;
        ModelLoadError naming the key for a missing or bad one."""
        spec = arch_spec(md, _GRAPH)
        k = ArchKeys(md, spec.name)
        arch = spec.name
        c = common_params(k, spec, per_layer=("feed_forward_length", "attention.head_count_kv"))
        refuse_rope_attn_factor(k, None)
        n_layer, n_head = c["n_layer"], c["n_head"]
        kp = k.full("attention.sliding_window_pattern")
        if not isinstance(md.get(kp), (list, np.ndarray)):
            # llama.cpp reads it with get_arr (required)
            raise ModelLoadError(f"GGUF metadata has no `{kp}` array (one BOOL per layer)" if kp not in md
                                 else f"`{kp}` must be an array of one BOOL per layer")
        swa = swa_params(k, spec.swa, n_layer, c["rope_base"], c["rope_freq_scale"])
        hd_swa = k.int("attention.key_length_swa", required=True)
        if k.int("attention.value_length_swa", required=True) != hd_swa:
            raise ModelLoadError(f"`{arch}.attention.value_length_swa` differs from "
                                 f"`{arch}.attention.key_length_swa` (llama.cpp requires them equal)")
        # llama_model_base::load_hparams: n_rot_swa defaults to the full layers' n_rot
        if "rope.dimension_count_swa" not in k and not 2 <= c["n_rot"] <= hd_swa:
            raise ModelLoadError(f"GGUF metadata has no `{arch}.rope.dimension_count_swa`, and its default, "
                                 f"the full layers' `{arch}.rope.dimension_count` = {c['n_rot']}, does not fit "
                                 f"the sliding-window heads (`{arch}.attention.key_length_swa` = {hd_swa})")
        n_rot_swa = k.int("rope.dimension_count_swa", c["n_rot"], lo=2, hi=hd_swa)
        if n_rot_swa % 2:
            raise ModelLoadError(f"`{arch}.rope.dimension_count_swa` = {n_rot_swa} is odd (RoPE rotates pairs)")
        layers = swa["swa_layers"]
        kvs = k.ints_per_layer("attention.head_count_kv", n_layer, n_head, hi=n_head)
        for kind in (False, True):
            seen = {kvs[il] for il in range(n_layer) if layers[il] == kind}
            if len(seen) > 1:
                raise ModelLoadError(f"`{arch}.attention.head_count_kv`: the "
                                     f"{'sliding-window' if kind else 'full'} layers have different KV head "
                                     f"counts {sorted(seen)} (not supported)")
        n_ffs = k.ints_per_layer("feed_forward_length", n_layer, required=True)
        shared = k.int("attention.shared_kv_layers", 0, lo=0, hi=n_layer)
        n_kv = n_layer - shared
        if n_kv < 2:
            raise ModelLoadError(f"`{arch}.attention.shared_kv_layers` = {shared} leaves "
                                 f"{count(n_kv, 'layer')} with a KV cache of {'its' if n_kv == 1 else 'their'} "
                                 f"own (llama.cpp asserts at least 2)")
        for il in range(n_kv, n_layer):
            owner = n_kv - (2 if layers[il] else 1)
            if layers[owner] != layers[il]:
                raise ModelLoadError(f"gemma4: layer {il} would reuse the KV cells of layer {owner}, a layer "
                                     f"of the other kind (llama.cpp's reuse rule takes layer n - 2 for "
                                     f"sliding-window layers, n - 1 for full ones; not supported)")
        n_pl = k.int("embedding_length_per_layer_input", required=True, lo=0)
        softcap = k.float("final_logit_softcapping", 0.0, positive=False)
        ex = {}
        if "expert_count" in k:
            ex = expert_params(k, c["n_ff"], ff_key_required=True)
        return cls(**c, head_dim_swa=hd_swa, n_rot_swa=n_rot_swa, **swa, n_head_kv_layers=kvs,
                   n_ff_layers=n_ffs, n_layer_kv=n_kv, n_embd_per_layer=n_pl,
                   embd_scale=float(np.sqrt(_F32(c["n_embd"]))), final_softcap=softcap, **ex)

    def kind_shape(self, swa: bool) -> tuple:
        """(n_head_kv, head_dim) of the sliding-window (swa) or full layers."""
        kv = [self.n_head_kv_layers[il] for il in range(self.n_layer) if self.swa_layers[il] == swa]
        return (kv[0] if kv else 1, self.head_dim_swa if swa else self.head_dim)

    def kv_owner(self, il: int) -> int:
        """The layer whose KV cells layer il attends to (llama.cpp's reuse
        callback for gemma4: itself, or for the shared layers n_layer_kv - 2
        (sliding-window) / n_layer_kv - 1 (full))."""
        if il < self.n_layer_kv:
            return il
        return self.n_layer_kv - (2 if self.swa_layers[il] else 1)


class Gemma4Attention:
    """One gemma4 attention block (module docstring), loaded from the
    tensors of layer il (names starting with `prefix`): q / k / v of the
    layer kind's head size and KV heads, q and k RMS-normed with weights,
    v without; Wv optional (absent: V is the K product). A layer past
    `n_layer_kv` stores nothing: its `attn_k` / `attn_v` / `attn_k_norm`
    are loaded where the file has them (as llama.cpp does) and not run.

    `__call__(x, pos, cache, cos_sin, n_swa)`: x float32 (n, n_embd) the
    normed input; pos int (n,); cache an `IswaCache`; cos_sin the RoPE
    tables (n, n_rot/2) of the layer's kind. Returns float32 (n, n_embd)."""

    def __init__(self, w, prefix: str, il: int, hp, profile):
        e, H = hp.n_embd, hp.n_head
        swa = hp.swa_layers[il]
        self.hp, self.il, self.cpu = hp, il, profile
        self.hd = hd = hp.head_dim_swa if swa else hp.head_dim
        self.n_rot = hp.n_rot_swa if swa else hp.n_rot
        self.nkv = nkv = hp.n_head_kv_layers[il]
        self.has_kv = il < hp.n_layer_kv
        if w.has(prefix + "attn_qkv.weight"):
            raise ModelLoadError(f"gemma4: fused `{prefix}attn_qkv.weight` is not supported")
        self.wq = w.mat(prefix + "attn_q.weight", H * hd, e)
        self.wk = w.mat(prefix + "attn_k.weight", nkv * hd, e, required=self.has_kv)
        self.wv = w.mat(prefix + "attn_v.weight", nkv * hd, e, required=False)
        self.wo = w.mat(prefix + "attn_output.weight", e, H * hd)
        self.q_norm = w.vec(prefix + "attn_q_norm.weight", hd)
        self.k_norm = w.vec(prefix + "attn_k_norm.weight", hd, required=self.has_kv)

    def matrices(self) -> list:
        mats = [self.wq, self.wo]
        if self.has_kv:
            mats += [m for m in (self.wk, self.wv) if m is not None]
        return mats

    def __call__(self, x, pos, cache, cos_sin, n_swa=0):
        hp, il, prof = self.hp, self.il, self.cpu
        n, H, hd = x.shape[0], hp.n_head, self.hd
        cos, sin = cos_sin
        q = self.wq.matmul(x)
        T.emit("Qcur", "MUL_MAT", q, il)
        q = T.norm(q.reshape(n, H, hd), self.q_norm, hp.eps, "Qcur_normed", il)
        q = ops.rope(q, cos, sin, self.n_rot, True, prof)
        T.emit("Qcur_pos", "ROPE", q, il)
        k = v = None
        if self.has_kv:
            kc = self.wk.matmul(x)
            vc = self.wv.matmul(x) if self.wv is not None else kc
            T.emit("Kcur", "MUL_MAT", kc, il)
            T.emit("Vcur", "MUL_MAT", vc, il)
            k = T.norm(kc.reshape(n, self.nkv, hd), self.k_norm, hp.eps, "Kcur_normed", il)
            v = ops.rms_norm(vc.reshape(n, self.nkv, hd), None, hp.eps)
            T.emit("Vcur_normed", "RMS_NORM", v, il)
            k = ops.rope(k, cos, sin, self.n_rot, True, prof)
            T.emit("Kcur_pos", "ROPE", k, il)
        a = cache.attend(il, q, k, v, pos, hp.kq_scale, prof, n_swa)
        T.emit("kqv_out", "CONT", a, il)
        out = self.wo.matmul(a)
        T.emit(T.derived_name("MUL_MAT", [self.wo.name, T.node("kqv_out", il)]), "MUL_MAT", out)
        return out


class _Layer:
    """One gemma4 layer's weights (`Gemma4Model._load_layers`)."""


#: the `.scale` tensors the gemma4 graph reads; any other is a per-tensor
#: weight scale (NVFP4 files: `attn_q.scale`, `ffn_up_exps.scale`, ...)
_SCALES = ("ffn_gate_inp.scale", "ffn_down_exps.scale")


class Gemma4Model(Model):
    """gemma4 (module docstring)."""

    HPARAMS = Gemma4HParams

    def _load_layers(self) -> None:
        hp, w, spec = self.hp, self.w, self.spec
        e, P = hp.n_embd, hp.n_embd_per_layer
        for name in w.tensors:
            if name.endswith(".scale") and not name.endswith(_SCALES):
                raise ModelLoadError(f"gemma4: tensor `{name}` (a per-tensor weight scale, as NVFP4 files "
                                     f"have) is not supported")
        self.rope_freqs = None
        if not all(hp.swa_layers):
            # the full layers' "proportional" RoPE factors, one tensor for all
            f = w.vec("rope_freqs.weight", hp.head_dim // 2)
            bad = np.flatnonzero(~(np.isfinite(f) & (f > 0)))
            if bad.size:
                i = int(bad[0])
                raise ModelLoadError(f"tensor `rope_freqs.weight` value [{i}] = {float(f[i])!r}: RoPE "
                                     f"frequency factors must be finite and > 0")
            self.rope_freqs = np.ascontiguousarray(f[:hp.n_rot // 2])
        self.ple_embd = self.ple_model_proj = self.ple_proj_norm = None
        if P:
            nl = P * hp.n_layer
            self.ple_embd = w.mat("per_layer_token_embd.weight", self.n_vocab, nl)
            self.ple_model_proj = w.mat("per_layer_model_proj.weight", nl, e)
            self.ple_proj_norm = w.vec("per_layer_proj_norm.weight", P)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            L = _Layer()
            L.attn_norm = w.vec(p + "attn_norm.weight", e)
            L.attn = Gemma4Attention(w, p, i, hp, self.cpu)
            L.attn_post_norm = w.vec(p + "post_attention_norm.weight", e)
            L.out_scale = w.vec(p + "layer_output_scale.weight", 1, required=False)
            L.ffn_norm = w.vec(p + "ffn_norm.weight", e)
            L.ffn = GatedFFN(w, p, "", e, hp.n_ff_layers[i], self.cpu, gelu=True)
            L.ffn_post_norm = w.vec(p + "post_ffw_norm.weight", e)
            L.moe = None
            if w.has(p + "ffn_gate_inp.weight"):
                if not hp.n_expert:
                    raise ModelLoadError(f"gemma4: tensor `{p}ffn_gate_inp.weight` in a file without "
                                         f"`gemma4.expert_count`")
                L.router_scale = w.vec(p + "ffn_gate_inp.scale", e)
                L.pre_norm_2 = w.vec(p + "pre_ffw_norm_2.weight", e)
                L.post_norm_1 = w.vec(p + "post_ffw_norm_1.weight", e)
                L.post_norm_2 = w.vec(p + "post_ffw_norm_2.weight", e)
                L.moe = MoEFFN(w, p, hp, spec, self.cpu)
            if P:
                L.ple_gate = w.mat(p + "inp_gate.weight", P, e)
                L.ple_proj = w.mat(p + "proj.weight", e, P)
                L.ple_post_norm = w.vec(p + "post_norm.weight", e)
            self.layers.append(L)
        w.check_all_used()

    def _matrices(self) -> list:
        mats = [self.output] + ([self.ple_model_proj] if self.ple_model_proj is not None else [])
        for L in self.layers:
            mats += L.attn.matrices() + L.ffn.matrices()
            if L.moe is not None:
                mats += L.moe.matrices()
            if self.hp.n_embd_per_layer:
                mats += [L.ple_gate, L.ple_proj]
        return mats

    # ------------------------------------------------------------ cache
    def _kinds(self) -> list:
        hp = self.hp
        return [(hp.swa_layers[il], hp.kv_owner(il)) for il in range(hp.n_layer)]

    def _refuse_cache(self, options) -> None:
        """NotEmulated (a NotImplementedError) naming the cache for one not
        checked against llama.cpp for gemma4 (`CHECKED_CACHES`: on the
        profiles `CACHE_PROFILES`, and with the rotation off only where
        `CHECKED_NO_ROTATION` says; the F16 cache without flash attention on
        every profile), or for a rotated block-type cache whose layer kinds'
        head sizes are not all multiples of 64 or all not (llama.cpp decides
        the rotation of both caches by layer 0's head size: not emulated).
        ValueError for an unknown type or flash_attn value."""
        from .._notemulated import NotEmulated, cache_phrase
        hp, prof = self.hp, self.cpu
        tk = cache_type(options.get("type_k", "f16"), "type_k (--cache-type-k)")
        tv = cache_type(options.get("type_v", "f16"), "type_v (--cache-type-v)")
        fa = resolve_flash_attn(options.get("flash_attn"), tv)
        what = cache_phrase(tk, tv, fa)
        if not what:
            return
        key = (tk.name.lower(), tv.name.lower(), fa)
        # the profile first: a list of checked caches would send the user to
        # one this profile refuses as well
        if prof.name not in CACHE_PROFILES:
            default = (" (flash attention is on by default on the v0.4.0 profiles)"
                       if fa and prof.name.startswith("v0.4.0") else "")
            fix = ("the F16 cache without flash attention there (--flash-attn off)" if fa else
                   "the F16 cache there (no --cache-type-k / --cache-type-v)")
            raise NotEmulated(f"gemma4 with {what} is checked against llama.cpp on the profiles "
                              f"{', '.join(CACHE_PROFILES)} only, not on {prof.name}{default}: use {fix}",
                              what, "for gemma4 on this profile")
        if key not in CHECKED_CACHES:
            # the same types checked with flash attention the other way: say so first
            other = key[:2] + (not fa,)
            hint = (f"; these types are checked {'without' if fa else 'with'} flash attention "
                    f"(--flash-attn {'off' if fa else 'on'})" if other in CHECKED_CACHES else "")
            raise NotEmulated(f"gemma4 with {what} is not checked against llama.cpp{hint}: its checked caches "
                              f"are, {_checked_phrase()}", what, "for gemma4")
        blocks = [t for t in (tk, tv) if t.name.lower() not in ("f16", "f32", "bf16")]
        rotate = options.get("rotate")
        if blocks and (rotation_disabled() if rotate is None else not rotate) and key not in CHECKED_NO_ROTATION:
            raise NotEmulated(f"gemma4 with {what} and the Hadamard rotation off ($LLAMA_ATTN_ROT_DISABLE or "
                              f"rotate=False) is not checked against llama.cpp (checked without the rotation: "
                              f"{', '.join(_phrase(k) for k in CHECKED_NO_ROTATION)})",
                              f"{what} without the rotation", "for gemma4")
        if blocks:
            layer0 = hp.head_dim_swa if hp.swa_layers[0] else hp.head_dim
            heads = {hp.head_dim_swa if s else hp.head_dim for s in hp.swa_layers}
            if len({h % 64 == 0 for h in heads | {layer0}}) > 1:
                raise NotEmulated(f"gemma4 with {what}: the layer kinds' head sizes {sorted(heads)} are not "
                                  f"all multiples of 64 or all not (llama.cpp decides the rotation of both "
                                  f"caches by layer 0's head size {layer0}; not emulated)", what, "for gemma4")

    def _cache_bytes(self, n_ctx: int, **options) -> int:
        self._refuse_cache(options)
        hp = self.hp
        return IswaCache.bytes_needed(self._kinds(), hp.kind_shape(False), hp.kind_shape(True), n_ctx,
                                      options.get("type_k", "f16"), options.get("type_v", "f16"))

    def _make_cache(self, n_ctx: int, **options):
        self._refuse_cache(options)
        hp = self.hp
        return IswaCache(self._kinds(), hp.kind_shape(False), hp.kind_shape(True), n_ctx, **options)

    # ---------------------------------------------------------- forward
    def per_layer_inputs(self, tokens, x) -> np.ndarray:
        """float32 (n_layer, n, n_embd_per_layer): the per-layer inputs of
        the tokens, x float32 (n, n_embd) their scaled embeddings
        (`build_inp_per_layer`, `project_per_layer_inputs`)."""
        hp = self.hp
        n, P, NL = len(tokens), hp.n_embd_per_layer, hp.n_layer
        sel = self.ple_embd.rows_f32([int(t) for t in tokens])
        sel = (sel * np.sqrt(_F32(P))).astype(_F32)
        T.emit("inp_per_layer_selected", "SCALE", sel.reshape(n, NL, P))
        proj = self.ple_model_proj.matmul(x)
        proj = (proj * _F32(_F32(1.0) / np.sqrt(_F32(hp.n_embd)))).astype(_F32)
        proj = T.norm(proj.reshape(n, NL, P), self.ple_proj_norm, hp.eps, "per_layer_proj", None)
        inp = ((proj + sel.reshape(n, NL, P)) * _F32(_F32(1.0) / np.sqrt(_F32(2.0)))).astype(_F32)
        T.emit("inp_per_layer", "SCALE", inp)
        return np.ascontiguousarray(inp.transpose(1, 0, 2))

    def _moe(self, L, h, il):
        """The MoE branch of layer il: float32 (n, n_embd) from h, the
        attention's residual sum (`attn_out`)."""
        hp, moe = self.hp, L.moe
        r = ops.rms_norm(h, None, hp.eps)
        r = (r * _F32(_F32(1.0) / np.sqrt(_F32(hp.n_embd)))).astype(_F32)
        r = (r * L.router_scale).astype(_F32)
        logits = moe.router.matmul(r)
        xe = T.norm(h, L.pre_norm_2, hp.eps, "ffn_norm_2", il)
        ids, weights = moe.route_logits(logits)
        moe.last_x, moe.last_ids, moe.last_weights, moe.last_router_x = xe, ids, weights, r
        y = moe.experts(xe, ids, weights)
        return T.norm(y, L.post_norm_2, hp.eps, "ffn_moe", il)

    def _forward(self, tokens, cache, all_logits):
        n = len(tokens)
        hp, prof = self.hp, self.cpu
        pos = np.arange(cache.n, cache.n + n)
        rope = {False: ops.rope_cache(pos, hp.n_rot, hp.rope_base, hp.rope_freq_scale, self.rope_freqs),
                True: ops.rope_cache(pos, hp.n_rot_swa, hp.rope_base_swa, hp.rope_freq_scale_swa)}
        x = self.embed(tokens)
        ple = self.per_layer_inputs(tokens, x) if hp.n_embd_per_layer else None
        for il, L in enumerate(self.layers):
            swa = hp.swa_layers[il]
            h = x
            a = T.norm(x, L.attn_norm, hp.eps, "attn_norm", il)
            a = L.attn(a, pos, cache, rope[swa], hp.n_swa if swa else 0)
            a = T.norm(a, L.attn_post_norm, hp.eps, "attn_post_norm", il)
            h = a + h
            T.emit("attn_out", "ADD", h, il)
            if L.moe is not None:
                f = L.ffn(T.norm(h, L.ffn_norm, hp.eps, "ffn_norm_1", il))
                f = T.norm(f, L.post_norm_1, hp.eps, "ffn_mlp", il)
                f = f + self._moe(L, h, il)
                T.emit("ffn_moe_combined", "ADD", f, il)
            else:
                f = L.ffn(T.norm(h, L.ffn_norm, hp.eps, "ffn_norm", il))
            f = T.norm(f, L.ffn_post_norm, hp.eps, "ffn_post_norm", il, norm_il=-1)
            x = f + h
            if ple is not None:
                T.emit("pe_in", "ADD", x, il)
                g = ops.gelu(L.ple_gate.matmul(x), prof)
                g = (g * ple[il]).astype(_F32)
                g = T.norm(L.ple_proj.matmul(g), L.ple_post_norm, hp.eps, "per_layer_embd_out", il)
                x = x + g
            if L.out_scale is not None:
                x = (x * L.out_scale[0]).astype(_F32)
                T.emit("out_scaled", "MUL", x, il)
            T.emit("l_out", "ADD" if L.out_scale is None else "MUL", x, il)
        cache.n += n
        return self._head(x, all_logits)
