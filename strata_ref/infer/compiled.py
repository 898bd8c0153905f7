"""The dense decoder layer (llama, qwen2, qwen3, gemma3) as one compiled
call: `blocks.dense_layer_fn` over this module's kit, the same kernels as
the eager path as numba functions, inlined, so that a layer costs one call
from Python instead of about twenty (norms, projections, RoPE, cache
stores, attention, GLU, each with its array checks and allocations).

It covers the common case: every matrix of a type multiplied on its stored
blocks (`cpu.matvec`: Q4_0 ... Q8_0, Q4_K, Q5_K, Q6_K; projections stacked
or not), the F16 KV cache without flash attention or rotation (llama.cpp's
default), no attention sinks or gate. For anything else `build` /
`eligible` say no and the graph runs its eager path; both run the one
function of `blocks` and give the same bits (tests/test_infer_compiled.py
and the llama.cpp reference data run both).

One compiled function serves every layer of one shape: the weight types
of its matrices (each slot's `cpu.matvec` runner) and the constants of
`blocks.DenseShape` are closure constants, cached on disk under a name
that spells them out, keyed on the sources of `cpu/`, `blocks` and this
module (`_digest`).
"""
from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import numpy as np
from numba import njit

from .._jitcache import cached, sources_digest
from .._threads import threads
from ..cpu import matvec
from ..cpu._digest import cpu_digest
from ..cpu.f16_attention import _attention
from ..cpu.fp import f32_bits
from ..cpu.matmul import PARALLEL_MIN_MACS, QMatrix
from ..cpu.ops import _geglu, _rms_norm_rows, _rope, _swiglu
from ..cpu.simd import HOST_F16C, f8_f16_store, f8_load, f16_bits
from ..numerics import f32_bits_to_f16_bits
from ..types import GGMLType
from . import blocks
from .kv_cache import KVCache

__all__ = ["CompiledLayers", "kit"]

_F32 = np.float32
_inline = njit(inline="always")

#: what the compiled kit's primitives read: a matrix is (blocks, repacked)
_AttnW = namedtuple("_AttnW", "wqkv wq wk wv wo bq bk bv bo q_norm k_norm attn_scale")
_FfnW = namedtuple("_FfnW", "w_gate_up w_gate w_up w_down")
_LayerW = namedtuple("_LayerW", "attn_norm attn attn_post_norm ffn_norm ffn ffn_post_norm")
_Ctx = namedtuple("_Ctx", "eps n_head n_head_kv head_dim n_rot neox cos sin pos n0 kq_scale n_swa "
                          "kbits vbits threads isa gelu")


# ------------------------------------------------------------------ the kit
@_inline
def _cols(a, c0, c1):
    # columns c0..c1 of a (n, m) as a contiguous array
    n = a.shape[0]
    out = np.empty((n, c1 - c0), np.float32)
    for t in range(n):
        for j in range(c1 - c0):
            out[t, j] = a[t, c0 + j]
    return out


@_inline
def _add_row(a, b):
    # a (n, m) + b (m,), ggml `add` with a broadcast row, float32
    out = np.empty_like(a)
    for t in range(a.shape[0]):
        for j in range(a.shape[1]):
            out[t, j] = _F32(a[t, j] + b[j])
    return out


@_inline
def _add(x, h):
    # x + h of one shape (n, m), ggml `add`, float32
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[t, j] = _F32(x[t, j] + h[t, j])
    return out


@_inline
def _scale(x, s):
    # x (n, H, D) * s, ggml `scale`, float32
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            for d in range(x.shape[2]):
                out[t, h, d] = _F32(x[t, h, d] * s)
    return out


@_inline
def _norm(x, w, c, name):
    # rms_norm over the last axis, times w (`ops.rms_norm`)
    x2 = x.reshape(-1, x.shape[-1])
    out = np.empty_like(x2)
    _rms_norm_rows(x2, w, c.eps, out)
    return out.reshape(x.shape)


@_inline
def _rope_c(x, c):
    out = np.empty_like(x)
    _rope(x, c.cos, c.sin, c.n_rot, c.neox, c.isa.ROPE_FMA, out)
    return out


@_inline
def _geglu_c(g, u, c):
    out = np.empty_like(g)
    _geglu(g.reshape(-1), u.reshape(-1), c.gelu, out.reshape(-1))
    return out


@_inline
def _swiglu_c(g, u, c):
    out = np.empty_like(g)
    _swiglu(g, u, c.isa, out)
    return out


@_inline
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


@_inline
def _attend(A, q, k, v, c):
    # KVCache.attend of an F16 cache without flash attention or rotation:
    # store K and V, then `cpu.f16_attention` (no sinks)
    n = q.shape[0]
    cells = c.kbits.shape[1]
    _store_f16(c.kbits, cells, k, c.n0)
    _store_f16(c.vbits, cells, v, c.n0)
    a = np.empty((n, c.n_head * c.head_dim), np.float32)
    _attention(q, c.kbits, c.vbits, c.head_dim, c.n0 + n, c.pos, c.kq_scale, c.n_swa, n, c.isa,
               np.zeros(c.n_head, np.float32), False, a)
    return a


@_inline
def _no_emit(x, name, op, c):
    pass


@_inline
def _no_emit_scaled(x, src, c):
    pass


@_inline
def _no_emit_out(A, out, biased, c):
    pass


@_inline
def _no_emit_out_sum(out, c):
    pass


@_inline
def _no_out_rows(x, residual, c):
    pass


def _eager_only(*args):
    # the gate of qwen3next: the compiled layers never take it (`build`),
    # so numba prunes its branch before typing this
    raise NotImplementedError("not compiled")


def _mm(runner):
    """The projection primitive of one weight slot: quantize x, multiply
    (`cpu.matvec`); parallel from PARALLEL_MIN_MACS multiply-adds on, as
    `QMatrix.matmul` decides."""
    @_inline
    def mm(W, x, c):
        raw, repacked = W
        macs = x.shape[0] * raw.shape[0] * x.shape[1]
        return runner(repacked, True, False, raw, x, c.threads if macs >= PARALLEL_MIN_MACS else 1)
    return mm


def _mm3(group):
    """q, k and v of one input in one parallel region (`matvec.group_runner`);
    parallel as `_mm` decides for the three together."""
    @_inline
    def mm(Wa, Wb, Wc, x, c):
        macs = x.shape[0] * (Wa[0].shape[0] + Wb[0].shape[0] + Wc[0].shape[0]) * x.shape[1]
        return group((Wa[1], Wb[1], Wc[1]), (Wa[0], Wb[0], Wc[0]), x,
                     c.threads if macs >= PARALLEL_MIN_MACS else 1)
    return mm


def _mm2(group):
    """gate and up of one input in one parallel region, as `_mm3`."""
    @_inline
    def mm(Wa, Wb, x, c):
        macs = x.shape[0] * (Wa[0].shape[0] + Wb[0].shape[0]) * x.shape[1]
        return group((Wa[1], Wb[1]), (Wa[0], Wb[0]), x, c.threads if macs >= PARALLEL_MIN_MACS else 1)
    return mm


def kit(types, isa) -> dict:
    """The compiled kit of `blocks` for weight slots of ggml types `types`
    (q|qkv, k, v, o, gate|gate_up, up, down: the unused slots repeat a
    used one) on the instruction-set chain `isa`."""
    mq, mo, mg, md = (_mm(matvec.runner(types[i], isa)) for i in (0, 3, 4, 6))
    q_k_v = _mm3(matvec.group_runner(types[:3], isa))
    gate_up = _mm2(matvec.group_runner(types[4:6], isa))
    return dict(jit=_inline, mm_qkv=mq, mm_q_k_v=q_k_v, mm_o=mo, mm_gu=mg, mm_gate_up=gate_up,
                mm_d=md, cols=_cols, add_row=_add_row, add=_add, scale=_scale, norm=_norm,
                norm_unnumbered=_norm, rope=_rope_c, geglu=_geglu_c, swiglu=_swiglu_c, attend=_attend,
                split_gate=_eager_only, gate_mul=_eager_only, emit=_no_emit, emit_scaled=_no_emit_scaled,
                emit_out=_no_emit_out, emit_out_sum=_no_emit_out_sum, out_rows=_no_out_rows)


def _digest() -> str:
    here = Path(__file__).resolve().parent
    return cpu_digest() + "-" + sources_digest(here / "blocks.py", here / "compiled.py")


def _layer_fn(shape: blocks.DenseShape, types: tuple, isa):
    """The compiled layer of `shape` with weight slots of `types`, as a
    flat-argument entry (numba types each argument of a call; a flat list
    of arrays is the cheapest to type) that gathers the named tuples
    `blocks` reads."""
    layer = blocks.dense_layer_fn(shape, kit(types, isa))

    def enter(x, raws, repacked, attn_norm, attn_post_norm, ffn_norm, ffn_post_norm,
              bq, bk, bv, bo, q_norm, k_norm, attn_scale,
              pos, nthreads, isa, eps, n_head, n_head_kv, head_dim, n_rot, neox, cos, sin,
              kbits, vbits, n0, kq_scale, n_swa, gelu):
        q = (raws[0], repacked[0])
        gu = (raws[4], repacked[4])
        A = _AttnW(q, q, (raws[1], repacked[1]), (raws[2], repacked[2]), (raws[3], repacked[3]),
                   bq, bk, bv, bo, q_norm, k_norm, attn_scale)
        F = _FfnW(gu, gu, (raws[5], repacked[5]), (raws[6], repacked[6]))
        L = _LayerW(attn_norm, A, attn_post_norm, ffn_norm, F, ffn_post_norm)
        c = _Ctx(eps, n_head, n_head_kv, head_dim, n_rot, neox, cos, sin, pos, n0, kq_scale, n_swa,
                 kbits, vbits, nthreads, isa, gelu)
        return layer(L, x, c)

    name = "dense_layer_" + "_".join(["-".join(GGMLType(t).name for t in types), shape.key, isa.key])
    return cached(njit(enter), name, _digest)


_FNS = {}


class CompiledLayers:
    """The compiled layers of a `dense.DenseModel` (None from `build` when
    some matrix is not a plain QMatrix of a type `cpu.matvec` runs, or a
    layer has an option only the eager path runs)."""

    @classmethod
    def build(cls, model):
        for L in model.layers:
            mats = L.attn.matrices() + L.ffn.matrices()
            # only plain stored-block matrices: a wrapper (a quality probe,
            # a float variant) has its own matmul, which must be called;
            # and one ggml path per matrix (no stack of repacked and plain
            # parts); none in ggml's AMX buffer (`cpu.amx`, eager only)
            if any(type(q) is not QMatrix or q.type not in matvec.RUN_TYPES or q.path is not None
                   or len({q.repacked(r) for r in q.part_rows}) > 1 or q.amx() for q in mats):
                return None
            if L.attn.q_gate or L.attn.sinks is not None:
                return None
        return cls(model)

    def __init__(self, model):
        self.m = model
        prof = model.cpu
        self.isa = prof.isa
        self.layers = []
        empty = np.zeros(0, np.float32)
        gelu = empty
        if model.spec.ffn == "geglu":
            from ..cpu.ops import gelu_table
            gelu = gelu_table(prof)
        vec = lambda a: empty if a is None else np.ascontiguousarray(a, np.float32)  # noqa: E731
        for L in model.layers:
            at, ff = L.attn, L.ffn
            qkv = [at.wqkv] if at.wqkv is not None else [at.wq, at.wk, at.wv]
            gu = [ff.w_gate_up] if ff.w_gate_up is not None else [ff.w_gate, ff.w_up]
            slots = qkv + [qkv[0]] * (3 - len(qkv)) + [at.wo] + gu + [gu[0]] * (2 - len(gu)) + [ff.w_down]
            shape = model.layer_shape(L)
            types = tuple(int(q.type) for q in slots)
            key = (shape, types, self.isa)
            if key not in _FNS:
                _FNS[key] = _layer_fn(shape, types, self.isa)
            self.layers.append(dict(
                fn=_FNS[key], raws=tuple(q.packed.data.blocks for q in slots),
                repacked=np.array([q.repacked() for q in slots], np.bool_),
                attn_norm=vec(L.attn_norm), attn_post_norm=vec(L.attn_post_norm), ffn_norm=vec(L.ffn_norm),
                ffn_post_norm=vec(L.ffn_post_norm), bq=vec(at.bq), bk=vec(at.bk), bv=vec(at.bv),
                bo=vec(at.bo), q_norm=vec(at.q_norm), k_norm=vec(at.k_norm),
                attn_scale=_F32(at.attn_scale), gelu=gelu))

    @staticmethod
    def eligible(cache) -> bool:
        """Whether `cache` is the one the compiled layers handle: an F16 K
        and V, no flash attention, no rotation."""
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
        eps, kq_scale, neox = _F32(hp.eps), _F32(hp.kq_scale), self.m.spec.neox
        for il, d in enumerate(self.layers):
            cos, sin = rope[keys[il]]
            n_swa = hp.n_swa if hp.swa_layers[il] else 0
            x = d["fn"](x, d["raws"], d["repacked"], d["attn_norm"], d["attn_post_norm"], d["ffn_norm"],
                        d["ffn_post_norm"], d["bq"], d["bk"], d["bv"], d["bo"], d["q_norm"], d["k_norm"],
                        d["attn_scale"], pos64, nth, self.isa, eps, hp.n_head, hp.n_head_kv, hp.head_dim,
                        hp.n_rot, neox, cos, sin, kview[il], vview[il], cache.n, kq_scale, n_swa, d["gelu"])
        return x
