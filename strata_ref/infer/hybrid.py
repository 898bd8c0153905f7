"""The hybrid graphs: qwen3next (Qwen3-Next), qwen35moe (Qwen3.5 MoE) and
qwen35 (Qwen3.5 dense), after llama.cpp
`src/models/{qwen3next,qwen35moe,qwen35}.cpp` and
`delta-net-base.cpp`, `src/llama-model.cpp` (the version vendored by
llama-cpp-python 0.3.36).

Layers are Gated DeltaNet (linear attention) layers, except every
`full_attention_interval`-th one (or as `attention.recurrent_layers` says),
which is gated full attention. Every layer then has the routed-expert FFN
with a gated shared expert, normed by `post_attention_norm`:

    h = x;  x = rms_norm(x) * attn_norm
    x = linear_attention(x)  or  gated_attention(x);  x = x + h;  h = x
    x = rms_norm(x) * post_attention_norm
    x = moe(x) + shared(x) * sigmoid(ffn_gate_inp_shexp x);  x = x + h

Gated attention: attn_q gives per head a query and a gate; q / k RMSNorm
per head, NeoX RoPE over the first `rope.dimension_count` values, the F16
KV cache, then the attention output times sigmoid(gate), attn_output.

Gated DeltaNet (`build_layer_attn_linear`), with H_k key heads and H_v
value heads of size S:

    qkv = attn_qkv x,  z = attn_gate x       (or the legacy ssm_in, split per key head)
    b, a = ssm_ba x, split per key head;  beta = sigmoid(b)
    g = softplus(a + ssm_dt) * ssm_a
    c = silu(ssm_conv([conv state | qkv]))   (conv state: the last d_conv - 1 inputs)
    q, k, v = c split;  q, k = l2_norm(q), l2_norm(k), repeated to H_v heads
    o, state = gated_delta_net(q, k, v, g, beta, state)
    x = ssm_out((rms_norm(o) * ssm_norm) * silu(z))

qwen35moe is the same graph but for three things: beta and alpha come from
two matrices (`ssm_beta`, `ssm_alpha`) instead of one split per key head;
value head h reads key head h % H_k (the fused op's broadcast; qwen3next
repeats each key head for H_v / H_k consecutive value heads); the full
attention layers rotate with interleaved M-RoPE (`rope.dimension_sections`),
which for text tokens is NeoX RoPE except that the pairs of the fourth
section stream keep angle 0 (`cpu.ops.imrope_text_pairs`).

qwen35 is qwen35moe with the dense SwiGLU FFN (`layers.GatedFFN`:
ffn_gate / ffn_up / ffn_down, `feed_forward_length` wide) in place of the
experts, normed by the same `post_attention_norm`.

The recurrent state lives in the cache next to the KV cache
(`kv_cache.HybridCache`); llama.cpp's default context runs the fused
`gated_delta_net` op for the prompt pass and for each decode step alike
(`cpu.ssm`), so both agree with its two paths.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..cpu import ops, ssm
from . import trace as T
from .kv_cache import HybridCache
from .layers import Attention, GatedFFN, sigmoid
from .model import (CommonHParams, ArchKeys, Model, ModelLoadError, arch_spec, common_params,
                    refuse_rope_attn_factor)
from .moe import MoEFFN, expert_params

__all__ = ["HybridHParams", "Qwen3NextModel"]


@dataclass(frozen=True)
class HybridHParams(CommonHParams):
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    kq_scale: float
    recurrent: tuple          # bool per layer
    d_conv: int
    d_inner: int
    d_state: int
    n_v_heads: int            # ssm.time_step_rank
    n_k_heads: int            # ssm.group_count
    n_layer_all: int          # with the MTP layers, which the main pass skips
    rope_sections: tuple | None = None     # qwen35moe's interleaved M-RoPE
    gating: str = "softmax"
    norm_w: bool = True
    neox: bool = True
    attn_scale: float = 1.0
    w_scale: float = 0.0      # expert_weights_scale (not read by these graphs: none)

    @classmethod
    def from_metadata(cls, md) -> "HybridHParams":
        spec = arch_spec(md, "hybrid")
        arch = spec.name
        k = ArchKeys(md, arch)
        c = common_params(k, spec, ff_required=spec.experts is None)
        refuse_rope_attn_factor(k, None)
        n_all = c["n_layer"]
        nextn = k.int("nextn_predict_layers", 0, lo=0, hi=n_all - 1)
        c["n_layer"] = n_layer = n_all - nextn
        if spec.experts is None:
            # qwen35: the dense SwiGLU FFN of n_ff
            e, n_ff_shexp = dict(n_expert=0, n_expert_used=0, n_ff_exp=0), 0
        else:
            e = expert_params(k, c["n_ff"])
            n_ff_shexp = k.int("expert_shared_feed_forward_length", 0, lo=0) or c["n_ff"]
        if n_ff_shexp == 0 and spec.experts is not None:
            raise ModelLoadError(f"GGUF metadata has no `{k.full('expert_shared_feed_forward_length')}` "
                                 f"(nor a `{k.full('feed_forward_length')}`)")
        d_conv = k.int("ssm.conv_kernel", required=True, lo=2)
        d_inner = k.int("ssm.inner_size", required=True)
        d_state = k.int("ssm.state_size", required=True)
        nv = k.int("ssm.time_step_rank", required=True)
        nk = k.int("ssm.group_count", required=True)
        if nv % nk:
            raise ModelLoadError(f"`{k.full('ssm.time_step_rank')}` = {nv} is not a multiple of "
                                 f"`{k.full('ssm.group_count')}` = {nk}")
        if d_inner != d_state * nv:
            raise ModelLoadError(f"`{k.full('ssm.inner_size')}` = {d_inner} is not "
                                 f"`ssm.state_size` x `ssm.time_step_rank` = {d_state * nv}")
        rec = k.per_layer_bools("attention.recurrent_layers", n_all)
        if rec is None:
            interval = k.int("full_attention_interval", 4)
            rec = tuple((i + 1) % interval != 0 for i in range(n_all))
        rec = tuple(rec[i] and i < n_layer for i in range(n_layer))
        sections = None
        if spec.rope == "imrope":
            ks = k.full("rope.dimension_sections")
            v = md.get(ks)
            if v is None:
                raise ModelLoadError(f"GGUF metadata has no `{ks}`")
            if not isinstance(v, (list, np.ndarray)) or len(v) != 4 or not all(
                    isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in v):
                raise ModelLoadError(f"`{ks}` = {v!r} must be an array of 4 integers")
            sections = tuple(int(x) for x in v)
            try:
                ops.imrope_text_pairs(c["n_rot"], sections, c["head_dim"])
            except ValueError as err:
                raise ModelLoadError(f"`{ks}`: {err}") from None
        # llama.cpp: f_attention_scale (not read for these) is 0, so 1/sqrt(head_dim)
        kq_scale = 1.0 / math.sqrt(float(c["head_dim"]))
        return cls(**c, **e, n_ff_shexp=n_ff_shexp, kq_scale=kq_scale, recurrent=rec,
                   d_conv=d_conv, d_inner=d_inner, d_state=d_state, n_v_heads=nv, n_k_heads=nk,
                   n_layer_all=n_all, rope_sections=sections,
                   gating=spec.experts.gating if spec.experts else "",
                   norm_w=spec.experts.norm_w if spec.experts else False, neox=spec.neox)


class _Layer:
    pass


class DeltaNet:
    """One Gated DeltaNet layer (module docstring) with its tensors;
    `__call__(x, cache, ri)`: x float32 (n, n_embd) normed input, ri the
    layer's recurrent slot in the cache. Returns float32 (n, n_embd)."""

    def __init__(self, w, prefix: str, hp, spec, profile):
        e, S, nk, nv = hp.n_embd, hp.d_state, hp.n_k_heads, hp.n_v_heads
        self.hp, self.cpu = hp, profile
        self.il = int(prefix.split(".")[1])
        key_dim, value_dim = S * nk, S * nv
        self.conv_dim = 2 * key_dim + value_dim
        #: the qwen35moe / qwen35 variant (`archs.ArchSpec.ssm`): ssm_beta / ssm_alpha,
        #: key heads tiled over the value heads
        self.q35 = spec.ssm == "beta_alpha_tile"
        if w.has(prefix + "attn_qkv.weight") or self.q35:
            self.wqkv = w.mat(prefix + "attn_qkv.weight", self.conv_dim, e)
            self.wz = w.mat(prefix + "attn_gate.weight", value_dim, e)
            self.w_in = None
        else:
            self.w_in = w.mat(prefix + "ssm_in.weight", 2 * key_dim + 2 * value_dim, e)
            self.wqkv = self.wz = None
        if self.q35:
            self.w_beta = w.mat(prefix + "ssm_beta.weight", nv, e)
            self.w_alpha = w.mat(prefix + "ssm_alpha.weight", nv, e)
            self.w_ba = None
        else:
            self.w_ba = w.mat(prefix + "ssm_ba.weight", 2 * nv, e)
        self.conv = w.table(prefix + "ssm_conv1d.weight", self.conv_dim, hp.d_conv)
        self.dt = w.vec(prefix + "ssm_dt.bias", nv)
        self.a = w.vec(prefix + "ssm_a", nv)
        self.norm = w.vec(prefix + "ssm_norm.weight", S)
        self.w_out = w.mat(prefix + "ssm_out.weight", e, value_dim)

    def matrices(self) -> list:
        m = [self.wqkv, self.wz] if self.w_in is None else [self.w_in]
        m += [self.w_beta, self.w_alpha] if self.w_ba is None else [self.w_ba]
        return m + [self.w_out]

    def _qkvz(self, x):
        hp = self.hp
        n, S, nk, nv = x.shape[0], hp.d_state, hp.n_k_heads, hp.n_v_heads
        if self.w_in is None:
            return self.wqkv.matmul(x), self.wz.matmul(x)
        # legacy ssm_in: per key head [q (S), k (S), v (S r), z (S r)]
        r = nv // nk
        m = self.w_in.matmul(x).reshape(n, nk, 2 * S + 2 * S * r)
        q = m[:, :, :S].reshape(n, -1)
        k = m[:, :, S:2 * S].reshape(n, -1)
        v = m[:, :, 2 * S:2 * S + S * r].reshape(n, -1)
        z = m[:, :, 2 * S + S * r:].reshape(n, -1)
        return np.concatenate([q, k, v], axis=1), np.ascontiguousarray(z)

    def __call__(self, x, cache, ri):
        hp, il = self.hp, self.il
        n, S, nk, nv = x.shape[0], hp.d_state, hp.n_k_heads, hp.n_v_heads
        r = nv // nk
        qkv, z = self._qkvz(x)
        tracing = T.on()
        if tracing and self.w_in is None:
            T.emit(T.derived_name("MUL_MAT", [self.wqkv.name, T.node("attn_norm", il)]), "MUL_MAT", qkv)
        # the short convolution over [state | new inputs], per channel
        xin = np.concatenate([cache.conv[ri], qkv.T], axis=1)
        T.emit("conv_input", "CONCAT", xin, il)
        cache.conv[ri] = xin[:, n:]
        raw = ssm.ssm_conv(xin, self.conv, self.cpu)
        T.emit("conv_output_raw", "SSM_CONV", raw, il)
        c = ops.silu(raw, self.cpu)      # (n, conv_dim)
        T.emit("conv_output_silu", "SILU", c, il)
        kd = S * nk
        q = self._l2(c[:, :kd].reshape(n, nk, S), "q_conv", r)
        k = self._l2(c[:, kd:2 * kd].reshape(n, nk, S), "k_conv", r)
        v = c[:, 2 * kd:].reshape(n, nv, S)
        g, beta = self._gates(x, n)
        if r > 1 and self.q35:
            # value head h reads key head h % H_k (gated_delta_net's broadcast)
            q = np.tile(q, (1, r, 1))
            k = np.tile(k, (1, r, 1))
        elif r > 1:
            # value head h reads key head h // r (ggml_repeat_4d of the graph)
            q = np.repeat(q, r, axis=1)
            k = np.repeat(k, r, axis=1)
        o, cache.ssm[ri] = ssm.gated_delta_net(q, k, v, g, beta, cache.ssm[ri], self.cpu)
        if T.on():
            srcs = [T.node(f"{a}_conv_predelta", il) for a in "qkv"] + [
                T.node("gate", il), T.node("beta_sigmoid", il) if self.q35 else "_", T.node("state_predelta", il)]
            T.emit(T.derived_name("GATED_DELTA_NET", srcs), "GATED_DELTA_NET",
                   np.concatenate([o.reshape(n, nv * S), cache.ssm[ri].reshape(-1, nv * S)]))
        o = T.norm(o, self.norm, hp.eps, None, il)
        normed = T.derived_name("MUL", [T.node("norm", il), f"blk.{il}.ssm_norm.weight"]) if tracing else ""
        T.emit(normed, "MUL", o)
        T.emit("z", "MUL_MAT", z, il)
        sz = ops.silu(z.reshape(n, nv, S), self.cpu)
        silu = T.derived_name("SILU", [T.node("z", il)]) if tracing else ""
        T.emit(silu, "SILU", sz)
        o = (o * sz).astype(np.float32)
        if tracing:
            T.emit(T.derived_name("MUL", [normed, silu]), "MUL", o)
        out = self.w_out.matmul(o.reshape(n, nv * S))
        T.emit("linear_attn_out", "MUL_MAT", out, il)
        return out

    def _l2(self, x, name: str, r: int):
        """`ssm.l2_norm` of q or k (n, H_k, S), recording llama.cpp's
        RMS_NORM and SCALE nodes (and qwen3next's REPEAT to the value
        heads)."""
        hp, il = self.hp, self.il
        y = ssm.l2_norm(x, hp.eps)
        if T.on():
            rn = T.derived_name("RMS_NORM", [T.node(name, il)])
            n_ = np.float32(x.shape[-1])
            T.emit(rn, "RMS_NORM", ops.rms_norm(x, None, np.float32(np.float32(hp.eps) / n_)))
            T.emit(T.node(f"{name}_predelta", il) if self.q35 else T.derived_name("SCALE", [rn]), "SCALE", y)
            if r > 1 and not self.q35:
                T.emit("REPEAT(_)", "REPEAT", np.repeat(y, r, axis=1).reshape(y.shape[0], y.shape[1], r, -1))
        return y

    def _gates(self, x, n):
        """(g, beta) float32 (n, H_v): the decay and the delta rule's
        beta, from ssm_ba (split per key head) or ssm_beta / ssm_alpha."""
        hp, il = self.hp, self.il
        nk, nv = hp.n_k_heads, hp.n_v_heads
        r = nv // nk
        tracing = T.on()
        if self.w_ba is None:
            alpha = self.w_alpha.matmul(x)
            if tracing:
                T.emit(T.derived_name("MUL_MAT", [self.w_alpha.name, T.node("attn_norm", il)]), "MUL_MAT", alpha)
            a_name = T.node("alpha", il)
        else:
            ba = self.w_ba.matmul(x)
            T.emit("linear_attn_mixed_ba", "MUL_MAT", ba, il)
            ba = ba.reshape(n, nk, 2 * r)
            b = ba[:, :, :r]
            alpha = np.ascontiguousarray(ba[:, :, r:].reshape(n, nv))
            a_name = T.node("a", il) + " (cont)"
            T.emit(a_name, "CONT", alpha)
        ad = (alpha + self.dt).astype(np.float32)
        if tracing:
            T.emit(T.derived_name("ADD", [a_name, f"blk.{il}.ssm_dt.bias"]), "ADD", ad)
        sp = ops.softplus(ad)
        T.emit("a_softplus", "SOFTPLUS", sp, il)
        g = (sp * self.a).astype(np.float32)
        T.emit("gate", "MUL", g, il)
        if self.w_ba is None:
            bl = self.w_beta.matmul(x)
            if tracing:
                T.emit(T.derived_name("MUL_MAT", [self.w_beta.name, T.node("attn_norm", il)]), "MUL_MAT", bl)
            beta = sigmoid(bl)
            T.emit("beta_sigmoid", "SIGMOID", beta.reshape(n, nv, 1), il)
        else:
            beta = sigmoid(b.reshape(n, nv))
            if tracing:
                T.emit(T.node("b", il) + " (cont)", "CONT", b)
                T.emit(T.derived_name("SIGMOID", [T.node("b", il) + " (cont)"]), "SIGMOID", beta.reshape(n, nk, r))
        return g, beta


class Qwen3NextModel(Model):
    """qwen3next, qwen35moe and qwen35 (module docstring)."""

    HPARAMS = HybridHParams

    def _load_layers(self) -> None:
        hp, w = self.hp, self.w
        e = hp.n_embd
        self.layers = []
        self.attn_slot, self.recr_slot = {}, {}
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            L = _Layer()
            L.attn_norm = w.vec(p + "attn_norm.weight", e)
            if hp.recurrent[i]:
                self.recr_slot[i] = len(self.recr_slot)
                L.mixer = DeltaNet(w, p, hp, self.spec, self.cpu)
                L.attn = None
            else:
                self.attn_slot[i] = len(self.attn_slot)
                L.attn = Attention(w, p, hp, self.spec, self.cpu)
                L.mixer = None
            L.post_norm = w.vec(p + "post_attention_norm.weight", e)
            if self.spec.experts is None:
                # qwen35: the dense SwiGLU FFN (`build_ffn`, LLM_FFN_SILU, LLM_FFN_PAR)
                L.ffn, L.moe = GatedFFN(w, p, "", e, hp.n_ff, self.cpu), None
            else:
                L.ffn = L.moe = MoEFFN(w, p, hp, self.spec, self.cpu)
            self.layers.append(L)
        # the MTP layers (blk.n_layer and after) are loaded by llama.cpp but not run
        w.check_all_used(ignore=lambda name: name.startswith("blk.") and
                         int(name.split(".")[1]) >= hp.n_layer)

    def _matrices(self) -> list:
        mats = [self.output]
        for L in self.layers:
            mats += (L.attn.matrices() if L.attn is not None else L.mixer.matrices()) + L.ffn.matrices()
        return mats

    def _cache_bytes(self, n_ctx: int, **options) -> int:
        hp = self.hp
        conv = (2 * hp.d_state * hp.n_k_heads + hp.d_inner) * (hp.d_conv - 1)
        return HybridCache.bytes_needed(len(self.attn_slot), hp.n_head_kv, hp.head_dim, n_ctx,
                                        len(self.recr_slot), conv, hp.n_v_heads * hp.d_state ** 2,
                                        options.get("type_k", "f16"), options.get("type_v", "f16"))

    def _make_cache(self, n_ctx: int, **options):
        hp = self.hp
        return HybridCache(len(self.attn_slot), hp.n_head_kv, hp.head_dim, n_ctx, len(self.recr_slot),
                           2 * hp.d_state * hp.n_k_heads + hp.d_inner, hp.d_conv, hp.n_v_heads,
                           hp.d_state, **options)

    def _forward(self, tokens, cache, all_logits):
        n = len(tokens)
        hp = self.hp
        pos = np.arange(cache.n, cache.n + n)
        rope = ops.rope_cache(pos, hp.n_rot, hp.rope_base, hp.rope_freq_scale,
                              sections=hp.rope_sections)
        x = self.embed(tokens)
        for il, L in enumerate(self.layers):
            h = x
            x = T.norm(x, L.attn_norm, hp.eps, "attn_norm", il)
            if L.attn is None:
                x = L.mixer(x, cache, self.recr_slot[il])
            else:
                x = L.attn(x, pos, cache, self.attn_slot[il], rope)
            x = x + h
            T.emit("attn_residual", "ADD", x, il)
            h = x
            x = T.norm(x, L.post_norm, hp.eps, "attn_post_norm", il)
            x = L.ffn(x)
            x = x + h
            T.emit("l_out", "ADD", x, il)
        cache.n += n
        return self._head(x, all_logits)

