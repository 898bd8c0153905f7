"""Recording the intermediate tensors of a forward pass under the names and
in the order of llama.cpp's graph (`strata-ref trace`, docs/trace.md).

The graphs (`dense`, `moe`, `hybrid`, `layers`, `model`) call `emit(name,
op, x)` at each node llama.cpp's graph has, with its llama.cpp name (`node`
adds the layer suffix: `attn_norm-3`) and ggml op (`MUL_MAT`, `RMS_NORM`,
...). Outside `recording` every call returns at once: the hook costs one
global test per node. Nodes that ggml computes separately but this engine
fuses (the RMS norm before its weight multiply, the scores and softmax of
the F16 attention) are computed for the trace only (`wants` says whether
anyone listens), with the unfused functions of `strata_ref.cpu` that
tests/test_infer_ggml_ops.py checks bit for bit against llama.cpp's nodes.
Tracing runs the Python path of every layer (`compiled.CompiledLayers`
gives the same bits but cannot be hooked).

`run_trace(model, ids, path, split=...)` runs a pass and streams every
recorded node into a trace container (`strata_ref.tracefile`).
"""
from __future__ import annotations

import fnmatch
from contextlib import contextmanager

import numpy as np

from ..tracefile import TraceWriter, derived_name, model_info

__all__ = ["on", "wants", "emit", "node", "recording", "Recorder", "run_trace", "derived_name",
           "norm", "attention_nodes", "trace_calls", "pass_ctx"]

#: the active Recorder (None: not tracing)
_REC = None


def on() -> bool:
    """Whether a forward pass is being recorded."""
    return _REC is not None


def node(name: str, il: int | None = None) -> str:
    """llama.cpp's node name: `name-il` for a layer's node (ggml's `cb(cur,
    name, il)`), `name` for il None or < 0."""
    return name if il is None or il < 0 else f"{name}-{il}"


def wants(name: str) -> bool:
    """Whether a node of this name would be written (tracing, and the
    `--tensors` patterns let it through): the test before computing a node
    only the trace needs."""
    return _REC is not None and _REC.wants(name)


def emit(name: str, op: str, x, il: int | None = None) -> None:
    """Record node `name` (with il: `node(name, il)`; op `op`, values x:
    float32 / int32 array in NumPy order) when tracing; nothing otherwise
    (the name is formatted only when tracing)."""
    if _REC is not None:
        _REC.emit(name if il is None else node(name, il), op, x)


class Recorder:
    """Where `emit` sends nodes while `recording`: `sink(call, op, name,
    array)` for each node whose name matches one of `patterns`
    (fnmatch globs; None: all). `call` is the decode call being run."""

    def __init__(self, sink, patterns=None):
        self.sink = sink
        self.patterns = list(patterns) if patterns else None
        self.call = 0
        self.count = 0

    def wants(self, name: str) -> bool:
        return self.patterns is None or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def emit(self, name: str, op: str, x) -> None:
        if self.wants(name):
            self.sink(self.call, op, name, np.asarray(x))
            self.count += 1


@contextmanager
def recording(sink, patterns=None):
    """Record the nodes of every forward pass run inside the block (one
    recorder at a time: RuntimeError when nested)."""
    global _REC
    if _REC is not None:
        raise RuntimeError("a forward pass is already being recorded")
    rec = Recorder(sink, patterns)
    _REC = rec
    try:
        yield rec
    finally:
        _REC = None


# ------------------------------------------------------------------ shared nodes
def norm(x, w, eps: float, name: str | None, il: int | None, norm_il: int | None = None):
    """rms_norm(x) * w as the graphs compute it (`cpu.ops.rms_norm`),
    recording llama.cpp's two nodes `norm-<il>` (RMS_NORM, the plain norm)
    and `<name>-<il>` (MUL; name None: the unnamed `MUL(norm-<il>,<weight>)`
    is the caller's to record); norm_il: the layer of the `norm` node when
    it differs (gemma3's ffn_post_norm names it `norm`, without a layer)."""
    from ..cpu import ops
    if _REC is not None:
        n = node("norm", il if norm_il is None else norm_il)
        if _REC.wants(n):
            _REC.emit(n, "RMS_NORM", ops.rms_norm(x, None, eps))
    y = ops.rms_norm(x, w, eps)
    if _REC is not None and name is not None:
        _REC.emit(node(name, il), "MUL", y)
    return y


def attention_nodes(cache, ci: int, q, pos, kq_scale: float, profile, n_swa: int, il: int,
                    sinks=None) -> None:
    """llama.cpp's `kq-il` (MUL_MAT, float32 (n_head, n, n_kv)),
    `kq_soft_max-il` (SOFT_MAX, the same shape) and `kqv-il` (MUL_MAT,
    (n_head, n, head_dim)) of the attention over an F16 KV cache without
    flash attention, after `cache.attend` stored this pass's K and V in
    slot ci: q float32 (n, n_head, head_dim) (after RoPE and scaling), pos
    the positions. n_kv is llama.cpp's padded KV length (`kv_length`); the
    cells past the filled ones are zero, as in llama.cpp's cleared cache.
    The products are `cpu.ops.f16_products` (q and the probabilities
    rounded to F16, ggml's F16 mat-mul) and `cpu.ops.soft_max`."""
    from ..cpu import ops
    from .kv_cache import kv_length
    names = [node(k, il) for k in ("kq", "kq_soft_max", "kqv")]
    if not any(wants(n) for n in names):
        return
    n, H, D = q.shape
    T = cache.n + n
    n_kv = kv_length(T)
    kc = cache.k[ci]
    Hkv = kc.shape[0]
    G = H // Hkv
    K = np.zeros((Hkv, n_kv, D), np.float32)
    V = np.zeros((Hkv, D, n_kv), np.float32)
    K[:, :T] = kc[:, :T].astype(np.float32)
    V[:, :, :T] = cache.v[ci][:, :T].astype(np.float32).transpose(0, 2, 1)
    batched = n      # the token count decides tinyBLAS (`ops.tinyblas_takes`)
    qh = np.asarray(q, np.float32).astype(np.float16).astype(np.float32).transpose(1, 0, 2)   # (H, n, D)
    kq = np.concatenate([ops.f16_products(qh[h * G:(h + 1) * G].reshape(1, G * n, D), K[h][None], batched,
                                          profile, m_rows=n_kv).reshape(G, n, n_kv) for h in range(Hkv)])
    emit(names[0], "MUL_MAT", kq)
    sk = None if sinks is None else np.repeat(np.asarray(sinks, np.float32), n)
    p = ops.soft_max(kq[:, :, :T].reshape(H * n, T), kq_scale, np.tile(np.asarray(pos), H), profile,
                     n_swa, sinks=sk)[:, :T]
    prob = np.zeros((H, n, n_kv), np.float32)
    prob[:, :, :T] = p.reshape(H, n, T)
    emit(names[1], "SOFT_MAX", prob)
    ph = prob.astype(np.float16).astype(np.float32)
    kqv = np.concatenate([ops.f16_products(ph[h * G:(h + 1) * G].reshape(1, G * n, n_kv), V[h][None], batched,
                                           profile, m_rows=D).reshape(G, n, D) for h in range(Hkv)])
    emit(names[2], "MUL_MAT", kqv)


# ------------------------------------------------------------------ a pass
def trace_calls(ids, split: int | None) -> list:
    """The decode calls of a pass: all ids at once (split None), or the
    first `split` ids and then one id per call."""
    ids = [int(t) for t in ids]
    if split is None or split >= len(ids):
        return [ids]
    if split < 1:
        raise ValueError(f"--split must be >= 1, got {split}")
    return [ids[:split]] + [[t] for t in ids[split:]]


def pass_ctx(m, n_tokens: int, n_ctx: int | None = None, what: str = "n_ctx") -> int:
    """The context length (tokens) a pass of `n_tokens` ids through model
    `m` runs with: `n_ctx` where given, else what the reference drivers
    use (tools/llama_ref.py, tools/llama_trace.c): 512, or the next
    multiple of 256 that holds the ids, at most the model's training
    context. The length is part of the arithmetic where the model's RoPE
    depends on it: phi3's LongRoPE takes its short factors for a context up
    to `rope.scaling.original_context_length` and the long ones above it
    (llama.cpp `llm_build_phi3`, `model.get_rope_factors`), so logits made
    at another n_ctx are reproduced only at that n_ctx. Raises ValueError,
    its message naming the value as `what`, for an n_ctx that is not an
    int >= 1, is more than the training context, or holds fewer than
    `n_tokens` ids."""
    train = m.hp.n_ctx_train
    if n_ctx is None:
        n_ctx = min(train, max(512, -(-n_tokens // 256) * 256))
    elif isinstance(n_ctx, bool) or not isinstance(n_ctx, (int, np.integer)) or n_ctx < 1:
        raise ValueError(f"{what} {n_ctx!r} is not a context length (an int >= 1)")
    elif n_ctx > train:
        raise ValueError(f"{what} {n_ctx} is more than the model's training context of {train} "
                         f"(`{m.hp.arch}.context_length`)")
    if n_tokens > n_ctx:
        raise ValueError(f"{what} {n_ctx} holds fewer than the {n_tokens} token ids (at least {n_tokens})")
    return int(n_ctx)


def run_trace(m, ids, path, split: int | None = None, patterns=None, producer: str = "strata-ref trace",
              options: dict | None = None, compress: bool = False, progress=None,
              n_ctx: int | None = None) -> int:
    """Run `ids` through model `m` (a loaded `infer` model) with every
    logit row computed, recording each node llama.cpp's graph names into
    the trace container `path` (`tracefile.TraceWriter`, streamed: one
    tensor in memory at a time). split: evaluate the first `split` ids in
    one call, then one id per call (None: one batched call). patterns:
    fnmatch globs of node names to keep (None: all). Returns the number of
    nodes written. n_ctx: the context length (`pass_ctx`; None: the
    drivers' default), stored in the trace's options. Raises ValueError
    for ids outside the vocabulary, an empty list, or more ids than the
    context (`pass_ctx`)."""
    from .. import gguf
    ids = [int(t) for t in ids]
    if not ids:
        raise ValueError("no token ids to trace")
    bad = [t for t in ids if not 0 <= t < m.n_vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {m.n_vocab})")
    calls = trace_calls(ids, split)
    n_ctx = pass_ctx(m, len(ids), n_ctx)
    info = model_info(gguf.read(m.path)) if m.path else {}
    cache = m.new_cache(n_ctx)
    opts = {"cpu": m.cpu.name, "flash_attn": bool(getattr(cache, "flash_attn", False)),
            "type_k": getattr(cache, "type_k", None) and cache.type_k.name.lower(),
            "type_v": getattr(cache, "type_v", None) and cache.type_v.name.lower(), "n_ctx": n_ctx,
            **(options or {})}
    with TraceWriter(path, ids, [len(c) for c in calls], info, producer, opts, compress) as w:
        with recording(w.add, patterns) as rec:
            for i, c in enumerate(calls):
                rec.call = i
                m.forward(c, cache, all_logits=True)
                if progress is not None:
                    progress(len(c))
        if w.n == 0:
            raise ValueError(f"--tensors {','.join(patterns or [])!r} matches no node of the graph (names "
                             f"as llama.cpp's: attn_norm-0, Qcur-0, ffn_out-3, result_output, ...)")
        return w.n
