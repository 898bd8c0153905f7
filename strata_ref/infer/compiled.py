"""The dense decoder layer (llama, qwen2, qwen3, gemma3) as one compiled
call: `dense.DenseModel`'s graph for one layer, with the same kernels in
the same order, run inside numba so that a layer costs one call from
Python instead of about twenty (norms, projections, RoPE, cache stores,
attention, GLU, each with its array checks and allocations).

It covers the common case: every matrix of a type multiplied on its stored
blocks (`cpu.matvec`: Q4_0 ... Q8_0, Q4_K, Q5_K, Q6_K; projections stacked
or not), the F16 KV cache without flash attention or rotation (llama.cpp's
default), no attention sinks. For anything else `eligible` says no and the
graph runs its Python path; both give the same bits (tests/test_infer_compiled.py
and the llama.cpp reference data run both).

One compiled function serves every layer of one *shape*: the weight types
of its matrices and its options (biases, q/k norms, gemma3's extra norms,
scaling and GeGLU) are constants of a closure (`_layer_fn`), cached on disk
under a name that spells them out.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .._jitcache import cached
from ..cpu import matvec
from ..cpu._digest import cpu_digest
from .._threads import threads
from ..cpu.f16_attention import _attention
from ..cpu.matmul import PARALLEL_MIN_MACS, QMatrix
from ..cpu.ops import _geglu, _rms_norm_rows, _rope, _swiglu
from ..cpu.simd import HOST_F16C, f8_f16_store, f8_load, f16_bits
from ..numerics import f32_bits_to_f16_bits
from ..cpu.fp import f32_bits
from ..types import GGMLType

__all__ = ["CompiledLayers"]

_F32 = np.float32


@njit(inline="always", cache=True)
def _norm(x, w, eps):
    out = np.empty_like(x)
    _rms_norm_rows(x, w, eps, out)
    return out


@njit(inline="always", cache=True)
def _mm(run, repacked, raw, x, threads):
    # one projection: quantize x, multiply (cpu.matvec); parallel from
    # PARALLEL_MIN_MACS multiply-adds on, as QMatrix.matmul decides
    macs = x.shape[0] * raw.shape[0] * x.shape[1]
    return run(repacked, False, raw, x, threads if macs >= PARALLEL_MIN_MACS else 1)


@njit(inline="always", cache=True)
def _add_residual(y, x):
    """y += x in float32 (ggml `add`), in place; returns y."""
    for t in range(y.shape[0]):
        for j in range(y.shape[1]):
            y[t, j] = _F32(y[t, j] + x[t, j])
    return y


@njit(inline="always", cache=True)
def _cols(a, c0, c1):
    # columns c0..c1 of a (n, m) as a contiguous array
    n = a.shape[0]
    out = np.empty((n, c1 - c0), np.float32)
    for t in range(n):
        for j in range(c1 - c0):
            out[t, j] = a[t, c0 + j]
    return out


@njit(inline="always", cache=True)
def _store_f16(cache, cells, src, n0):
    # cache (Hkv, ctx, hd) uint16 <- src (m, Hkv, hd) float32 at cells
    # n0 .. n0 + m - 1, fp16 round to nearest even (KVCache.store's F16)
    m, hkv, hd = src.shape
    hd8 = hd - hd % 8 if HOST_F16C else 0
    flat = cache.reshape(-1)
    for t in range(m):
        for h in range(hkv):
            o = (h * cells + n0 + t) * hd
            row = src[t, h]
            for d in range(0, hd8, 8):
                f8_f16_store(flat, o + d, f8_load(row, d))
            for d in range(hd8, hd):
                flat[o + d] = (f16_bits(row[d]) if HOST_F16C else
                               f32_bits_to_f16_bits(np.int64(f32_bits(row[d])) & 0xFFFFFFFF, False))


def _layer_fn(shape, isa):
    """The compiled layer of one shape (module docstring) on the
    instruction-set chain `isa`: `shape` = (qkv types: one for a stacked
    q|k|v or three, o type, gate|up types: one or two, down type, bias flags
    (q, k, v), qk_norm, gemma)."""
    qkv_t, o_t, gu_t, down_t, (has_bq, has_bk, has_bv), QK_NORM, GEMMA = shape
    STACKED_QKV = len(qkv_t) == 1
    STACKED_GU = len(gu_t) == 1
    rq = matvec.runner(qkv_t[0], isa)
    rk = matvec.runner(qkv_t[-2] if not STACKED_QKV else qkv_t[0], isa)
    rv = matvec.runner(qkv_t[-1], isa)
    ro = matvec.runner(o_t, isa)
    rg = matvec.runner(gu_t[0], isa)
    ru = matvec.runner(gu_t[-1], isa)
    rd = matvec.runner(down_t, isa)
    HAS_BQ, HAS_BK, HAS_BV = has_bq, has_bk, has_bv

    def layer(x, pos, threads, isa, eps,
              attn_norm, raws, repacked, bq, bk, bv, q_norm, k_norm,
              n_head, n_head_kv, head_dim, n_rot, neox, cos, sin, attn_scale,
              kbits, vbits, n0, kq_scale, n_swa, attn_post_norm, ffn_norm, ffn_post_norm, gelu):
        # x (n, E) float32, the layer's input; returns its output. raws /
        # repacked: q, k, v, o, gate, up, down (q = the stacked q|k|v and
        # gate = gate|up when stacked; the unused slots hold anything).
        n = x.shape[0]
        nq = n_head * head_dim
        nkv = n_head_kv * head_dim
        xn = _norm(x, attn_norm, eps)
        if STACKED_QKV:
            qkv = _mm(rq, repacked[0], raws[0], xn, threads)
            q = _cols(qkv, 0, nq)
            k = _cols(qkv, nq, nq + nkv)
            v = _cols(qkv, nq + nkv, nq + 2 * nkv)
        else:
            q = _mm(rq, repacked[0], raws[0], xn, threads)
            k = _mm(rk, repacked[1], raws[1], xn, threads)
            v = _mm(rv, repacked[2], raws[2], xn, threads)
        if HAS_BQ:
            for t in range(n):
                for j in range(nq):
                    q[t, j] = _F32(q[t, j] + bq[j])
        if HAS_BK:
            for t in range(n):
                for j in range(nkv):
                    k[t, j] = _F32(k[t, j] + bk[j])
        if HAS_BV:
            for t in range(n):
                for j in range(nkv):
                    v[t, j] = _F32(v[t, j] + bv[j])
        q3 = q.reshape(n, n_head, head_dim)
        k3 = k.reshape(n, n_head_kv, head_dim)
        v3 = v.reshape(n, n_head_kv, head_dim)
        if QK_NORM:
            q3 = _norm(q.reshape(n * n_head, head_dim), q_norm, eps).reshape(n, n_head, head_dim)
            k3 = _norm(k.reshape(n * n_head_kv, head_dim), k_norm, eps).reshape(n, n_head_kv, head_dim)
        qr = np.empty_like(q3)
        _rope(q3, cos, sin, n_rot, neox, isa.FMA, qr)
        kr = np.empty_like(k3)
        _rope(k3, cos, sin, n_rot, neox, isa.FMA, kr)
        if GEMMA:
            for t in range(n):
                for h in range(n_head):
                    for d in range(head_dim):
                        qr[t, h, d] = _F32(qr[t, h, d] * attn_scale)
        cells = kbits.shape[1]
        _store_f16(kbits, cells, kr, n0)
        _store_f16(vbits, cells, v3, n0)
        a = np.empty((n, nq), np.float32)
        _attention(qr, kbits, vbits, n0 + n, pos, kq_scale, n_swa, n >= 2, isa,
                   np.zeros(n_head, np.float32), False, a)
        o = _mm(ro, repacked[3], raws[3], a, threads)
        if GEMMA:
            o = _norm(o, attn_post_norm, eps)
        h1 = _add_residual(o, x)
        xn = _norm(h1, ffn_norm, eps)
        if STACKED_GU:
            gu = _mm(rg, repacked[4], raws[4], xn, threads)
            n_ff = gu.shape[1] // 2
            g = _cols(gu, 0, n_ff)
            u = _cols(gu, n_ff, 2 * n_ff)
        else:
            g = _mm(rg, repacked[4], raws[4], xn, threads)
            u = _mm(ru, repacked[5], raws[5], xn, threads)
        act = np.empty_like(g)
        if GEMMA:
            _geglu(g.reshape(-1), u.reshape(-1), gelu, act.reshape(-1))
        else:
            _swiglu(g, u, isa, act)
        d = _mm(rd, repacked[6], raws[6], act, threads)
        if GEMMA:
            d = _norm(d, ffn_post_norm, eps)
        return _add_residual(d, h1)

    name = "dense_layer_" + "_".join(
        ["-".join(GGMLType(t).name for t in qkv_t), GGMLType(o_t).name, "-".join(GGMLType(t).name for t in gu_t),
         GGMLType(down_t).name, "b" + "".join("1" if b else "0" for b in (has_bq, has_bk, has_bv)),
         "qkn" if QK_NORM else "", "gemma" if GEMMA else "", isa.key])
    return cached(njit(layer), name, cpu_digest)


_FNS = {}


def _run_info(m):
    """(blocks, repacked) of a QMatrix of a `cpu.matvec` type."""
    return m.packed.data.blocks, m.repacked()


class CompiledLayers:
    """The compiled layers of a `dense.DenseModel` (None from `build` when
    some matrix is not a plain QMatrix of a type `cpu.matvec` runs)."""

    @classmethod
    def build(cls, model):
        for L in model.layers:
            mats = L.attn.matrices() + L.ffn.matrices()
            # only plain stored-block matrices: a wrapper (a quality probe,
            # a float variant) has its own matmul, which must be called
            # and one ggml path per matrix (no stack of repacked and plain parts)
            if any(type(q) is not QMatrix or q.type not in matvec.RUN_TYPES or q.path is not None
                   or len({q.repacked(r) for r in q.part_rows}) > 1 for q in mats):
                return None
        return cls(model)

    def __init__(self, model):
        self.m = model
        hp, prof = model.hp, model.cpu
        self.isa = prof.isa
        self.gemma = hp.arch == "gemma3"
        self.layers = []
        empty = np.zeros(0, np.float32)
        gelu = empty
        if self.gemma:
            from ..cpu.ops import gelu_table
            gelu = gelu_table(prof)
        for L in model.layers:
            at, ff = L.attn, L.ffn
            qkv = [at.wqkv] if at.wqkv is not None else [at.wq, at.wk, at.wv]
            gu = [ff.w_gate_up] if ff.w_gate_up is not None else [ff.w_gate, ff.w_up]
            slots = (qkv + [qkv[0]] * (3 - len(qkv)) + [at.wo] + gu + [gu[0]] * (2 - len(gu)) + [ff.w_down])
            info = [_run_info(q) for q in slots]
            shape = (tuple(int(q.type) for q in qkv), int(at.wo.type), tuple(int(q.type) for q in gu),
                     int(ff.w_down.type), (at.bq is not None, at.bk is not None, at.bv is not None),
                     at.q_norm is not None, self.gemma)
            key = (shape, self.isa)
            if key not in _FNS:
                _FNS[key] = _layer_fn(shape, self.isa)
            vec = lambda a: empty if a is None else np.ascontiguousarray(a, np.float32)  # noqa: E731
            self.layers.append(dict(
                fn=_FNS[key], raws=tuple(r for r, _ in info), repacked=np.array([p for _, p in info], np.bool_),
                attn_norm=vec(L.attn_norm), bq=vec(at.bq), bk=vec(at.bk), bv=vec(at.bv),
                q_norm=vec(at.q_norm), k_norm=vec(at.k_norm), attn_post_norm=vec(L.attn_post_norm),
                ffn_norm=vec(L.ffn_norm), ffn_post_norm=vec(L.ffn_post_norm), gelu=gelu))

    @staticmethod
    def eligible(cache) -> bool:
        """Whether `cache` is the one the compiled layers handle: an F16 K
        and V, no flash attention, no rotation."""
        from .kv_cache import KVCache
        return (type(cache) is KVCache and cache.type_k == cache.type_v == GGMLType.F16
                and not cache.flash_attn and not cache.rot_k and not cache.rot_v)

    def run(self, x, pos, cache, rope, keys):
        """All layers on x (float32 (n, n_embd)) at positions `pos`, their
        K and V stored at cache.n ..; rope[keys[il]] = (cos, sin) of layer
        il. Returns the last layer's output; cache.n is the caller's to
        advance."""
        hp = self.m.hp
        nth = threads()
        pos64 = np.ascontiguousarray(pos, np.int64)
        x = np.ascontiguousarray(x, np.float32)
        kview = cache.k.view(np.uint16)
        vview = cache.v.view(np.uint16)
        for il, d in enumerate(self.layers):
            cos, sin = rope[keys[il]]
            n_swa = hp.n_swa if hp.swa_layers[il] else 0
            x = d["fn"](x, pos64, nth, self.isa, _F32(hp.eps),
                        d["attn_norm"], d["raws"], d["repacked"], d["bq"], d["bk"], d["bv"], d["q_norm"],
                        d["k_norm"], hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot, hp.neox, cos, sin,
                        _F32(self.m.layers[il].attn.attn_scale), kview[il], vview[il], cache.n,
                        _F32(hp.kq_scale), n_swa, d["attn_post_norm"], d["ffn_norm"], d["ffn_post_norm"],
                        d["gelu"])
        return x
