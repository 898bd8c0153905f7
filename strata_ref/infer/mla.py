"""Multi-head latent attention (MLA), the attention of llama.cpp's
`deepseek2` architecture (DeepSeek V2 / V3 / R1, Kimi K2, GLM lite), after
`src/models/deepseek2.cpp` (`llama_model_deepseek2::load_arch_hparams`,
`load_arch_tensors`, `graph::graph`) and `llm_graph_context::build_attn`
(with `llm_graph_input_attn_k`) / `build_attn_mha` (`src/llama-graph.cpp`)
of the llama.cpp vendored by llama-cpp-python 0.3.36.

Sizes: H heads; the compressed KV of R = `attention.kv_lora_rank` values
per token; r = `rope.dimension_count` rotated values per head (shared by
the heads on the key side); d_nope = `attention.key_length_mla` - r
unrotated query / key values per head; d_v = `attention.value_length_mla`
values per head. The file's `attention.key_length` is R + r and
`value_length` R: the width of the one KV "head" llama.cpp caches.

The absorbed path llama.cpp takes for files with `attn_k_b` / `attn_v_b`
(what the converter writes), x float32 (n, n_embd) the normed layer input:

    q      = W_q x, or W_qb (rms_norm(W_qa x) * q_a_norm)    (n, H, d_nope + r)
    c, kpe = W_kv_a x, split at R                           (n, R), (n, r)
    kpe    = rope(kpe)                  normal pairs, positions of the tokens
    c      = rms_norm(c) * kv_a_norm
    qn, qp = q split at d_nope per head; qp = rope(qp)
    qa[h]  = W_kb[h] qn[h]              per head: (R x d_nope) times (n, d_nope)
    Q      = qa | qp  (n, H, R + r)     K = c | kpe  (n, 1, R + r)
    a      = softmax(K Q * kq_scale + mask) V    V = the first R values of K's cells
    o[h]   = W_vb[h] a[h]               per head: (d_v x R) times (n, R)
    out    = W_o o                      (n, n_embd)

Every product is `cpu.matmul`'s (`W_kb`, `W_vb`: one F16 (or other type)
matrix per head, the 2-D products ggml's batched mul_mat makes of a 3-D
weight: the same kernel choice per head, never repacked; on x86 builds
ggml converts the permuted q_nope to F16 before tinyBLAS either way; an
ARM build whose tinyBLAS takes F16 weights only with F32 activations
(`TINYBLAS_F16_F32B`) runs `vec_dot` on a permuted view: `QMatrix.matmul`
src1_cont), the attention
`KVCache.attend` over a cache whose V is a view of K (`kv_cache`: F16
without flash attention as llama-cpp-python runs it, `cpu.f16_attention`
with a V narrower than K; with flash attention ggml's kernel with DV =
R < DK = R + r, `cpu.flash_attn` with `v_width`, over the cache types of
`MLA_FLASH_ATTN_PROFILES` on the profiles listed there; its output goes
through W_vb per head as above: llama.cpp's `build_attn_mha` multiplies
a permuted view of it, which on x86 is converted to W_vb's vec_dot type
like the contiguous one, and on `TINYBLAS_F16_F32B` builds is `vec_dot`),
the norms and RoPE `cpu.ops`'.

The non-absorbed layout of older converters (one `attn_kv_b` of ggml
shape {R, H (d_nope + d_v)} per layer, no `attention.key_length_mla` /
`value_length_mla`; llama.cpp's `hparams.is_mla()` false, so
n_embd_head_k = `attention.key_length` = d_nope + r, n_embd_head_v =
`value_length` = d_v and `head_count_kv` = H): deepseek2.cpp's `else`
branch of `is_mla`, plain multi-head attention over a cache of H K heads
of d_nope + r and H V heads of d_v (`build_attn` with
`llm_graph_input_attn_kv`):

    q, c, kpe as above                 (q by W_q or the q LoRA)
    kv     = W_kvb c                    (n, H, d_nope + d_v)
    kn, v  = kv split at d_nope per head (v made contiguous, `ggml_cont`)
    Q      = q with its last r values per head roped   (`ggml_rope_set_offset`)
    K      = kn | kpe repeated over the heads           (n, H, d_nope + r)
    out    = W_o softmax(K Q * kq_scale + mask) V

kq_scale (deepseek2.cpp `graph::graph`, the same formula in both layouts,
d_nope + r being n_embd_head_k either way): mscale^2 / sqrtf(d_nope + r) in
float32, mscale = attn_factor_org * (1 + 0.1 yarn_log_mul logf(1 /
freq_scale)), attn_factor_org = attn_factor * (1 + 0.1 logf(1 /
freq_scale)), attn_factor the context's `yarn_attn_factor`
(llama-context.cpp; `model.rope_yarn_params`), which with YaRN holds
1 / (1 + 0.1 logf(1 / freq_scale)), so attn_factor_org is about 1: 1 /
sqrtf(d_nope + r) without RoPE scaling; `rope.scaling.yarn_log_multiplier`
is read (divided by 0.1 as llama.cpp undoes the converter's factor).

YaRN (`rope.scaling.type` = yarn, DeepSeek V3 / R1 / Kimi K2): both RoPEs
(q_pe and k_pe) are `ggml_rope_ext` with the context's ext_factor (1),
attn_factor (the yarn_attn_factor above, not the mscale of kq_scale),
beta_fast 32, beta_slow 1 and n_ctx_orig
(`rope.scaling.original_context_length`): the model's RoPE tables
(`ops.rope_cache` with `yarn`).

For `strata-ref trace` the block records a subset of deepseek2.cpp's node
names (q, kv_cmpr_pe, k_pe, kv_cmpr, q_pe, Qcur, Kcur, kqv_out and the
output projection; the non-absorbed layout: kv, Vcur_cont, Qcur and Kcur
in place of q_pe, Qcur and Kcur), not checked against a llama.cpp dump;
the attention's inner nodes (kq, kq_soft_max, kqv, kqv_mla) are not
recorded.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cpu import ops
from ..cpu.matmul import QMatrix
from ..cpu.profiles import SOURCE_BUILD_PROFILES
from ..types import block_format
from . import trace as T
from .model import ArchKeys, ModelLoadError, _logf

__all__ = ["MlaParams", "mla_params", "MlaAttention", "MlaMhaAttention", "mla_attention",
           "MLA_FLASH_ATTN_PROFILES", "MLA_HEAD64_PROFILES"]

_FA_TYPES = frozenset({"f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"})
#: the CPU profiles on which flash attention over the absorbed layout's
#: cache runs, with the cache types (type_k = type_v) of each, checked
#: bitwise against the profile's llama.cpp build's logits (llama-cpp-python
#: 0.3.36, avx512's made on a Sapphire Rapids CPU, its arm64 builds under
#: qemu:
#: tests/data/<profile>/llama_ref_moe_fa[_<type>]_deepseek2*.npz;
#: prebuilt v0.4.0: tests/data/<profile>/moe_deepseek2*.npz, F16: the variants
#: a Zen 4 CPU executes, every one but sapphirerapids); any
#: other combination is refused (NotEmulated) and --flash-attn off runs
MLA_FLASH_ATTN_PROFILES = {**{p: _FA_TYPES for p in SOURCE_BUILD_PROFILES},
                           **{f"v0.4.0-{v}": frozenset({"f16"})
                              for v in ("x64", "sse42", "sandybridge", "ivybridge", "piledriver", "haswell",
                                        "skylakex", "zen4")}}
#: the block cache types (a subset of the profile's in
#: `MLA_FLASH_ATTN_PROFILES`) checked where the cached head (kv_lora_rank +
#: n_rot) is a multiple of 64, as DeepSeek V3's 576: llama.cpp decides its
#: Hadamard rotation by head size but never applies it to the MLA cache
#: (kv_cache's module docstring); checked bitwise with a head of 192
#: (tests/data/<profile>/llama_ref_moe_fa_<type>_deepseek2-r160.npz,
#: tests/test_mla_head64.py); refused elsewhere. Unquantized types (f16,
#: f32, bf16) are never rotated and need no entry.
MLA_HEAD64_PROFILES = {p: frozenset({"q8_0", "q4_0"}) for p in SOURCE_BUILD_PROFILES}


@dataclass(frozen=True)
class MlaParams:
    """MLA's sizes (module docstring): n_lora_q (0: q by `attn_q` directly,
    llama.cpp's lite variants), n_lora_kv (R), d_nope, d_rope (r), d_v,
    kq_scale (float32 value), and absorbed (the `attn_k_b` / `attn_v_b`
    layout; False: the `attn_kv_b` one of older converters)."""
    n_lora_q: int
    n_lora_kv: int
    d_nope: int
    d_rope: int
    d_v: int
    kq_scale: float
    absorbed: bool = True


def _n_vocab(k: ArchKeys) -> int:
    """`vocab_size`, else the length of `tokenizer.ggml.tokens`
    (`load_arch_hparams`' n_vocab)."""
    if "vocab_size" in k:
        return k.int("vocab_size", lo=0)
    toks = k.md.get("tokenizer.ggml.tokens")
    return len(toks) if toks is not None else 0


def mla_params(k: ArchKeys, c: dict, yarn: tuple | None = None) -> MlaParams:
    """MLA's hyperparameters of a deepseek2 file as
    `llama_model_deepseek2::load_arch_hparams` reads them, c the common
    ones (`model.common_params`: head_dim is `attention.key_length`, n_rot
    `rope.dimension_count`, n_layer without the MTP layers), yarn the
    YaRN parameters (`model.rope_yarn_params`) or None without YaRN.

    `attention.q_lora_rank` is required except for llama.cpp's lite
    variants (26 or 27 layers, or 48 with 128256 tokens);
    `attention.kv_lora_rank` and `expert_shared_count` are required.
    `attention.key_length_mla` and `value_length_mla` (both or neither)
    make the absorbed layout, whose `key_length` must be kv_lora_rank + r,
    `value_length` kv_lora_rank and `head_count_kv` 1; without them
    (`hparams.is_mla()` false: the non-absorbed layout of older converters)
    the head sizes are `key_length` (d_nope + r) and `value_length` (d_v)
    and `head_count_kv` must be `head_count` (deepseek2.cpp repeats k_pe
    over all the heads). `attention.temperature_scale` (mistral-large's
    temperature tuning) and the GLM-4.7-Lite default gating (a file without
    `expert_gating_func`, 47 or 48 layers, 154880 tokens: llama.cpp takes
    sigmoid) are refused. Every problem is a ModelLoadError naming the key."""
    n_layer = c["n_layer"]
    n_vocab = _n_vocab(k)
    lite = n_layer in (26, 27) or (n_layer == 48 and n_vocab == 128256)
    n_lora_q = 0 if lite else k.int("attention.q_lora_rank", required=True)
    n_lora_kv = k.int("attention.kv_lora_rank", required=True)
    have_k, have_v = "attention.key_length_mla" in k, "attention.value_length_mla" in k
    if have_k != have_v:
        raise ModelLoadError(f"GGUF metadata has only one of `{k.full('attention.key_length_mla')}` / "
                             f"`{k.full('attention.value_length_mla')}` (llama.cpp asserts both or neither)")
    absorbed = have_k
    r = c["n_rot"]
    if absorbed:
        d_k_key = "attention.key_length_mla"
        d_k = k.int("attention.key_length_mla")
        d_v = k.int("attention.value_length_mla")
        if c["head_dim"] != n_lora_kv + r:
            raise ModelLoadError(f"`{k.full('attention.key_length')}` = {c['head_dim']} is not "
                                 f"kv_lora_rank + rope.dimension_count = {n_lora_kv + r}")
        if k.int("attention.value_length", n_lora_kv) != n_lora_kv:
            raise ModelLoadError(f"`{k.full('attention.value_length')}` is not "
                                 f"`{k.full('attention.kv_lora_rank')}` = {n_lora_kv}")
        if c["n_head_kv"] != 1:
            raise ModelLoadError(f"`{k.full('attention.head_count_kv')}` = {c['n_head_kv']}: MLA caches "
                                 f"one KV head (the converter writes 1)")
    else:
        # llama_hparams::n_embd_head_k_mla() / n_embd_head_v_mla() fall back
        # to n_embd_head_k / n_embd_head_v (key_length / value_length)
        d_k_key = "attention.key_length"
        d_k = c["head_dim"]
        d_v = k.int("attention.value_length", d_k, lo=1)
        if c["n_head_kv"] != c["n_head"]:
            raise ModelLoadError(f"`{k.full('attention.head_count_kv')}` = {c['n_head_kv']} is not "
                                 f"`{k.full('attention.head_count')}` = {c['n_head']}: the non-absorbed "
                                 f"MLA layout (`attn_kv_b`) caches one K / V head per query head")
    if d_k - r < 1:
        raise ModelLoadError(f"`{k.full(d_k_key)}` = {d_k} must exceed "
                             f"`{k.full('rope.dimension_count')}` = {r} (llama.cpp asserts it)")
    if "expert_shared_count" not in k:
        raise ModelLoadError(f"GGUF metadata has no `{k.full('expert_shared_count')}`")
    if k.float("attention.temperature_scale", 0.0, positive=False) != 0.0:
        raise ModelLoadError(f"`{k.full('attention.temperature_scale')}` (attention temperature "
                             f"tuning) is not supported")
    if not k.int("expert_gating_func", 0, lo=0) and n_layer in (47, 48) and n_vocab == 154880:
        raise ModelLoadError(f"GGUF metadata has no `{k.full('expert_gating_func')}` and looks like "
                             f"GLM-4.7-Lite (llama.cpp's sigmoid default for it is not supported)")
    f = np.float32
    log_mul = f(k.float("rope.scaling.yarn_log_multiplier", 0.0, positive=False)) / f(0.1)
    # deepseek2.cpp `graph::graph`: attn_factor is the context's
    # yarn_attn_factor (`model.rope_yarn_params`' with YaRN; 1 without,
    # llama-cpp-python's value, as `rope.scaling.attn_factor` other than 1
    # is refused there), freq_scale the context's
    attn = f(1.0) if yarn is None else f(yarn[1])
    lg = _logf(f(1.0) / f(c["rope_freq_scale"]))
    org = f(attn * f(f(1.0) + f(f(0.1) * lg)))
    mscale = f(org * f(f(1.0) + f(f(f(0.1) * f(log_mul)) * lg)))
    kq_scale = f(f(f(f(1.0) * mscale) * mscale) / np.sqrt(f(d_k)))
    return MlaParams(n_lora_q=n_lora_q, n_lora_kv=n_lora_kv, d_nope=d_k - r, d_rope=r, d_v=d_v,
                     kq_scale=float(kq_scale), absorbed=absorbed)


def _per_head(w, name: str, n_head: int, rows: int, cols: int, profile) -> list:
    """The 3-D tensor `name` of ggml shape {cols, rows, n_head} as one
    `QMatrix` of rows x cols per head (ggml's mul_mat of a 3-D weight runs
    one 2-D product per head; such a tensor never sits in the repack
    buffer)."""
    t = w.get(name)
    w.checked(name, t, (cols, rows, n_head))
    fmt = block_format(t.type)
    if cols % fmt.block_values:
        raise ModelLoadError(f"tensor `{name}`: row length {cols} is not a multiple of the "
                             f"{t.type.name} block of {fmt.block_values}")
    size = rows * cols // fmt.block_values * fmt.block_bytes
    raw = np.asarray(t.data, np.uint8).reshape(-1)
    mats = []
    for h in range(n_head):
        m = QMatrix(t.type, raw[h * size:(h + 1) * size], rows, cols, f"{name}[{h}]", profile)
        m.repackable = False
        mats.append(m)
    return mats


class _MlaProjections:
    """What both of deepseek2's attention layouts share (module docstring),
    loaded from the tensors of the layer whose names start with `prefix`
    (hp has n_embd, n_head, eps and `mla`): q (by `attn_q`, or the q LoRA
    `attn_q_a`, `attn_q_a_norm`, `attn_q_b`), the compressed KV with its
    RoPE part (`attn_kv_a_mqa`, `attn_kv_a_norm`) and `attn_output`. A
    missing tensor, or one of another shape, is a ModelLoadError naming
    it."""

    def __init__(self, w, prefix: str, hp, spec, profile):
        m = hp.mla
        e, H = hp.n_embd, hp.n_head
        R, r, dn, dv = m.n_lora_kv, m.d_rope, m.d_nope, m.d_v
        self.hp, self.m, self.cpu = hp, m, profile
        self.il = int(prefix.split(".")[1]) if prefix.startswith("blk.") else -1
        if m.n_lora_q:
            self.wq = None
            self.wq_a = w.mat(prefix + "attn_q_a.weight", m.n_lora_q, e)
            self.q_a_norm = w.vec(prefix + "attn_q_a_norm.weight", m.n_lora_q)
            self.wq_b = w.mat(prefix + "attn_q_b.weight", H * (dn + r), m.n_lora_q)
        else:
            self.wq_a = self.q_a_norm = self.wq_b = None
            self.wq = w.mat(prefix + "attn_q.weight", H * (dn + r), e)
        self.wkv_a = w.mat(prefix + "attn_kv_a_mqa.weight", R + r, e)
        self.kv_a_norm = w.vec(prefix + "attn_kv_a_norm.weight", R)
        self.wo = w.mat(prefix + "attn_output.weight", e, H * dv)
        #: the name of the output projection's node (the trace's)
        self.out_name = T.derived_name("MUL_MAT", [self.wo.name, T.node("kqv_out", self.il)])

    def _q_matrices(self) -> list:
        return [self.wq] if self.wq is not None else [self.wq_a, self.wq_b]

    def _project(self, x, cos, sin):
        """deepseek2.cpp up to the layouts' branch: q float32 (n, H, d_nope +
        r) unroped, the normed compressed KV c (n, R) and the roped key
        part kpe (n, 1, r)."""
        hp, m, il, prof = self.hp, self.m, self.il, self.cpu
        n, H = x.shape[0], hp.n_head
        R, r, dn = m.n_lora_kv, m.d_rope, m.d_nope
        if self.wq is None:
            q = self.wq_a.matmul(x)
            T.emit("q", "MUL_MAT", q, il)
            q = T.norm(q, self.q_a_norm, hp.eps, "q", il)
            q = self.wq_b.matmul(q)
        else:
            q = self.wq.matmul(x)
        T.emit("q", "MUL_MAT", q, il)
        q = q.reshape(n, H, dn + r)
        kv_pe = self.wkv_a.matmul(x)
        T.emit("kv_cmpr_pe", "MUL_MAT", kv_pe, il)
        k_pe = ops.rope(kv_pe[:, R:].reshape(n, 1, r), cos, sin, r, False, prof)
        T.emit("k_pe", "ROPE", k_pe, il)
        kv = T.norm(np.ascontiguousarray(kv_pe[:, :R]), self.kv_a_norm, hp.eps, "kv_cmpr", il)
        return q, kv, k_pe

    def _out(self, o):
        T.emit("kqv_out", "CONT", o, self.il)
        out = self.wo.matmul(o)
        T.emit(self.out_name, "MUL_MAT", out)
        return out


class MlaAttention(_MlaProjections):
    """One MLA block of the absorbed layout (module docstring), loaded from
    the tensors of the layer whose names start with `prefix`; hp has
    n_embd, n_head, eps and `mla` (`MlaParams`).

    `__call__(x, pos, cache, ci, cos_sin, n_swa=0)`: x float32 (n,
    n_embd); pos int (n,) positions; cache a `KVCache` made with `v_of_k`
    = R (ci: this layer's slot); cos_sin the RoPE tables (n, r/2) of `pos`.
    Returns float32 (n, n_embd). A missing tensor, or one of another shape,
    is a ModelLoadError naming it."""

    def __init__(self, w, prefix: str, hp, spec, profile):
        super().__init__(w, prefix, hp, spec, profile)
        m, H = hp.mla, hp.n_head
        self.wk_b = _per_head(w, prefix + "attn_k_b.weight", H, m.n_lora_kv, m.d_nope, profile)
        self.wv_b = _per_head(w, prefix + "attn_v_b.weight", H, m.d_v, m.n_lora_kv, profile)

    def matrices(self) -> list:
        return self._q_matrices() + [self.wkv_a] + self.wk_b + self.wv_b + [self.wo]

    def __call__(self, x, pos, cache, ci, cos_sin, n_swa=0):
        hp, m, il, prof = self.hp, self.m, self.il, self.cpu
        n, H = x.shape[0], hp.n_head
        R, r, dn = m.n_lora_kv, m.d_rope, m.d_nope
        cos, sin = cos_sin
        q, kv, k_pe = self._project(x, cos, sin)
        q_pe = ops.rope(q[:, :, dn:], cos, sin, r, False, prof)
        T.emit("q_pe", "ROPE", q_pe, il)
        q_nope = q[:, :, :dn]
        # q_nope reaches W_kb as a permuted view (deepseek2.cpp
        # `q_nope_perm`), the attention's output reaches W_vb as one with
        # flash attention (`build_attn_mha` permutes it) and contiguous
        # without (kqv): `QMatrix.matmul` src1_cont
        q_abs = np.empty((n, H, R), np.float32)
        for h in range(H):
            q_abs[:, h] = self.wk_b[h].matmul(q_nope[:, h], src1_cont=False)
        T.emit("q_nope_absorbed_perm", "PERMUTE", q_abs, il)
        Q = np.concatenate([q_abs, q_pe], axis=2)
        K = np.concatenate([kv.reshape(n, 1, R), k_pe], axis=2)
        T.emit("Qcur", "CONCAT", Q, il)
        T.emit("Kcur", "CONCAT", K, il)
        a = cache.attend(ci, Q, K, None, pos, m.kq_scale, prof, n_swa).reshape(n, H, R)
        o = np.empty((n, H, m.d_v), np.float32)
        for h in range(H):
            o[:, h] = self.wv_b[h].matmul(a[:, h], src1_cont=not cache.flash_attn)
        return self._out(o.reshape(n, H * m.d_v))


class MlaMhaAttention(_MlaProjections):
    """One attention block of deepseek2's non-absorbed layout (older
    converters' `attn_kv_b`; module docstring), deepseek2.cpp's `!is_mla`
    branch: the compressed KV expanded by `attn_kv_b` (a 2-D matrix of
    ggml shape {R, H (d_nope + d_v)}) into per-head k_nope and V, K =
    k_nope | k_pe repeated over the heads, multi-head attention over a
    `KVCache` of H heads of d_nope + r (K) and d_v (V, `head_dim_v`).
    Same call as `MlaAttention`; a missing tensor, or one of another
    shape, is a ModelLoadError naming it."""

    def __init__(self, w, prefix: str, hp, spec, profile):
        super().__init__(w, prefix, hp, spec, profile)
        m = hp.mla
        self.wkv_b = w.mat(prefix + "attn_kv_b.weight", hp.n_head * (m.d_nope + m.d_v), m.n_lora_kv)

    def matrices(self) -> list:
        return self._q_matrices() + [self.wkv_a, self.wkv_b, self.wo]

    def __call__(self, x, pos, cache, ci, cos_sin, n_swa=0):
        hp, m, il, prof = self.hp, self.m, self.il, self.cpu
        n, H = x.shape[0], hp.n_head
        r, dn = m.d_rope, m.d_nope
        cos, sin = cos_sin
        q, kv, k_pe = self._project(x, cos, sin)
        kv = self.wkv_b.matmul(kv)
        T.emit("kv", "MUL_MAT", kv, il)
        kv = kv.reshape(n, H, dn + m.d_v)
        v = np.ascontiguousarray(kv[:, :, dn:])
        T.emit("Vcur_cont", "CONT", v, il)
        # ggml_rope_ext with ggml_rope_set_offset(d_nope): the last r values
        # of each head rotated, the first d_nope copied
        Q = np.concatenate([q[:, :, :dn], ops.rope(q[:, :, dn:], cos, sin, r, False, prof)], axis=2)
        T.emit("Qcur", "ROPE", Q, il)
        K = np.concatenate([kv[:, :, :dn], np.broadcast_to(k_pe, (n, H, r))], axis=2)
        T.emit("Kcur", "CONCAT", K, il)
        a = cache.attend(ci, Q, K, v, pos, m.kq_scale, prof, n_swa)
        return self._out(a)


def mla_attention(w, prefix: str, hp, spec, profile):
    """deepseek2's attention block for the layout of the file (`MlaParams`
    absorbed): `MlaAttention` or `MlaMhaAttention`."""
    cls = MlaAttention if hp.mla.absorbed else MlaMhaAttention
    return cls(w, prefix, hp, spec, profile)
