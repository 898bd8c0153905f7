"""The per-layer study of a quantization (`strata-ref layers MODEL --type T`).

All against the model's float baseline (`MODEL@float`: its weights
dequantized, float activations), on a calibration set of prompts whose
continuations the baseline generates (greedy):

* **Crest factor** of every layer's attention input and FFN input (the
  normed activations that enter q/k/v and gate/up): per token max|x| /
  rms(x) over the hidden dimension, the median over tokens; and the channel
  that most often sets the maximum, with how often it does and the median
  ratio of its |x| to the rms of the other channels (a massive channel shows
  as one index with a large ratio).
* **Per linear** (q, k, v, o, gate, up, down of each layer), with the
  layer's float inputs X from the calibration pass and Y = X W^T:
  `w_err`, the relative Frobenius error of W requantized to TYPE
  (`variants.fallback_type` where a row does not fit); and relative output
  errors ||Y' - Y||_F / ||Y||_F of the weight alone (`out_w`: X W_T^T),
  ggml's activation blocks alone (`out_blocks`: the dequantized Q8_0 / Q8_1
  / Q8_K blocks of TYPE's `vec_dot_type`, times W), per-token int8 alone
  (`out_a8`), and both (`out_wb`: blocks times W_T). For o and down, which
  write to the residual stream, Y is what the layer adds to it, so their
  relative error is the layer's local error against its contribution.
* **Single-layer sensitivity**: KL(baseline || model with only layer i
  requantized to TYPE) at the baseline's generated positions (as `kl`),
  twice: with float activations (`kl_weight`: the weight part) and with the
  profile's arithmetic for that layer (`kl_full`: weights and ggml's
  activation quantization); `kl_act` = kl_full - kl_weight. Beside their
  sums, the whole model requantized the same two ways. Each layer is one
  task of `strata_ref.tasks` (in process, a process pool, or dask).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np

from ..types import GGMLType
from . import variants

__all__ = ["run_layers", "LINEARS", "crest_stats"]

#: the linears of a dense layer, in graph order, and the input each reads
LINEARS = (("wq", "attn"), ("wk", "attn"), ("wv", "attn"), ("wo", "attn_out"),
           ("w_gate", "ffn"), ("w_up", "ffn"), ("w_down", "ffn_mid"))


def _owner(L, a):
    """The block of layer L that holds linear `a`: the dense graph keeps its
    attention matrices in `L.attn` and its FFN matrices in `L.ffn`
    (`strata_ref.infer.layers`)."""
    for blk in (getattr(L, "attn", None), getattr(L, "ffn", None), L):
        if blk is not None and a in vars(blk):
            return blk
    raise AttributeError(f"layer has no linear {a!r}")


def _f64mm(x, w):
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def _blocks(x, vdt: GGMLType, profile):
    """x's values after ggml's activation quantization to `vdt` (q * d,
    float32), as the profile quantizes them."""
    from ..cpu import act_quant
    isa = profile.isa
    if vdt == GGMLType.Q8_K:
        q, d, _ = act_quant.q8_k_fields(x, np.float32)
        qk = 256
    elif vdt == GGMLType.Q8_1:
        q, d, _ = act_quant.q8_1_fields(x, np.float32, isa=isa)
        qk = 32
    elif vdt == GGMLType.Q8_0:
        q, d = act_quant.q8_0_fields(x, np.float32, isa=isa)
        qk = 32
    else:
        return np.asarray(x, np.float32)        # F16 / BF16 / F32 weights: no blocks
    return (q.reshape(x.shape[0], -1, qk) * d[..., None]).reshape(x.shape)


def _a8(x):
    out = np.empty_like(x)
    variants._a8_rows(np.ascontiguousarray(x, np.float32), out)
    return out


def crest_stats(xs: np.ndarray) -> dict:
    """Crest factor statistics of token rows xs (n, d) float32 (module
    docstring): median crest, the channel that most often holds the
    maximum, its share of tokens and its median ratio to the rms of the
    other channels."""
    a = np.abs(np.asarray(xs, np.float64))
    rms = np.sqrt((a * a).mean(axis=1))
    mx = a.max(axis=1)
    crest = np.where(rms > 0, mx / np.where(rms > 0, rms, 1), 0.0)
    arg = a.argmax(axis=1)
    ch = int(np.bincount(arg).argmax())
    share = float((arg == ch).mean())
    others = np.delete(a, ch, axis=1)
    rest = np.sqrt((others * others).mean(axis=1))
    ratio = np.where(rest > 0, a[:, ch] / np.where(rest > 0, rest, 1), 0.0)
    return {"crest_median": float(np.median(crest)), "crest_max": float(crest.max()),
            "channel": ch, "channel_share": share, "channel_ratio": float(np.median(ratio))}


class _Probe:
    """Wraps a layer's FloatMatrix: passes the float product through and
    accumulates the error statistics of one linear (module docstring)."""

    def __init__(self, fm, target: GGMLType, profile, sink: dict, key: str, crest: list | None):
        from ..cpu.traits import TRAITS
        self.fm, self.sink, self.key, self.crest = fm, sink, key, crest
        self.rows, self.cols, self.type, self.name, self.profile = fm.rows, fm.cols, fm.type, fm.name, profile
        w = fm._weights()
        tq = variants.fallback_type(target, fm.cols)
        wq = variants._requantized(fm._qm, target)
        self.wq = variants.FloatMatrix(wq)._weights()
        self.vdt = TRAITS[tq].vec_dot_type if tq in TRAITS else GGMLType.F32
        d = self.wq - w
        sink.setdefault(key, {"type": tq.name, "w_err": float(np.sqrt((d.astype(np.float64) ** 2).sum()
                                                                          / max((w.astype(np.float64) ** 2).sum(), 1e-300))),
                              "y2": 0.0, "e_w": 0.0, "e_blocks": 0.0, "e_a8": 0.0, "e_wb": 0.0})

    def prepare(self):
        pass

    def row_f32(self, i):
        return self.fm.row_f32(i)

    def rows_f32(self, ids):
        return self.fm.rows_f32(ids)

    def matmul(self, x):
        y = self.fm.matmul(x)
        if self.crest is not None:
            self.crest.append(np.array(x, np.float32))
        w = self.fm._weights()
        yf = _f64mm(x, w)
        xb = _blocks(x, self.vdt, self.profile)
        s = self.sink[self.key]
        s["y2"] += float((yf ** 2).sum())
        s["e_w"] += float(((_f64mm(x, self.wq) - yf) ** 2).sum())
        s["e_blocks"] += float(((_f64mm(xb, w) - yf) ** 2).sum())
        s["e_a8"] += float(((_f64mm(_a8(x), w) - yf) ** 2).sum())
        s["e_wb"] += float(((_f64mm(xb, self.wq) - yf) ** 2).sum())
        return y


def _unstack(m):
    """Let the forward pass use q/k/v and gate/up one by one."""
    for L in m.layers:
        for blk in (getattr(L, "attn", None), getattr(L, "ffn", None), L):
            for k in ("wqkv", "w_gate_up"):
                if blk is not None and hasattr(blk, k):
                    setattr(blk, k, None)


@dataclass
class _Ref:
    spec: str
    profile: str
    tokens: list          # per prompt: (prompt ids, generated ids)
    logits_path: str      # npz of the baseline's incremental rows per prompt


_MODELS = {}


def _float_model(spec, profile):
    key = (spec, profile)
    if key not in _MODELS:
        m = variants.load_variant(spec + "@float", profile)
        _unstack(m)
        _MODELS[key] = m
    return _MODELS[key]


def _layer_task(item):
    """One layer's (or, with layer None, the whole model's) two KL
    measurements; a module-level function for `strata_ref.tasks`."""
    from ..cpu.matmul import QMatrix
    from .kl import kl_rows
    ref, layer, target = item
    target = GGMLType[target]
    m = _float_model(ref.spec, ref.profile)
    layers = range(len(m.layers)) if layer is None else [layer]
    saved = {(i, a): getattr(_owner(m.layers[i], a), a) for i in layers for a, _ in LINEARS}
    out = {}
    rl = np.load(ref.logits_path)
    try:
        for part in ("weight", "full"):
            for (i, a), fm in saved.items():
                q = variants._requantized(fm._qm, target)
                setattr(_owner(m.layers[i], a), a, variants.FloatMatrix(q) if part == "weight" else q)
            kls = []
            for j, (ids, toks) in enumerate(ref.tokens):
                cache = m.new_cache(min(m.hp.n_ctx_train, len(ids) + len(toks) + 1))
                seq = list(ids) + list(toks)
                lg = m.forward(seq[:-1], cache, all_logits=True)[len(ids) - 1:]
                kls.append(kl_rows(rl[f"p{j}"], lg, toks)["kl"])
            out[part] = float(np.concatenate(kls).mean())
    finally:
        for (i, a), fm in saved.items():
            setattr(_owner(m.layers[i], a), a, fm)
    return {"layer": layer, "kl_weight": out["weight"], "kl_full": out["full"],
            "kl_act": out["full"] - out["weight"]}


def run_layers(spec: str, target, prompts, max_tokens: int = 32, profile=None, jobs: int = 1,
               scheduler=None, progress=None) -> dict:
    """The study of the module docstring for model `spec` (a registry name
    or path, no variant suffix) and ggml type `target`; prompts: str list.
    Returns a dict: "layers" (per layer: crest factors of the attention and
    FFN inputs, the per-linear errors, the single-layer KLs), "whole" (the
    whole model's two KLs), "sum" (the single-layer sums), "floor" (the
    baseline's batched against its incremental pass), and the settings.
    Raises VariantError for a type without a reference quantizer."""
    from .. import cpu, tasks
    from ..infer.sampling import Sampler
    from .kl import kl_rows, reference_pass, teacher_forced
    target = GGMLType[target] if isinstance(target, str) else GGMLType(target)
    variants.fallback_type(target, 256)        # a type with no fallback fails here, early
    prof = cpu.select(profile)
    m = _float_model(spec, prof.name)
    if not all(getattr(L, "ffn", None) is not None for L in m.layers):
        raise variants.VariantError(f"layers: the study covers the dense architectures' linears; "
                                    f"{m.hp.arch} layers are not dense")
    nl = len(m.layers)
    # calibration: the baseline's generations, with probes on every linear
    sink = {}
    crest = {(i, k): [] for i in range(nl) for k in ("attn", "ffn")}
    originals = {}
    for i, L in enumerate(m.layers):
        for a, inp in LINEARS:
            fm = getattr(_owner(L, a), a)
            originals[(i, a)] = fm
            c = crest[(i, inp)] if a in ("wq", "w_gate") else None
            setattr(_owner(L, a), a, _Probe(fm, target, prof, sink, f"{i}.{a}", c))
    toks, floor = [], []
    tmp = tempfile.mkdtemp(prefix="strata-layers-")
    rows = {}
    try:
        sampler = Sampler(0.0)
        for j, text in enumerate(prompts):
            ids = m.tokenizer.encode(text, add_special=True, parse_special=False)
            g, rl = reference_pass(m, ids, max_tokens, sampler)
            toks.append((ids, g))
            rows[f"p{j}"] = rl
            if progress:
                progress(1)
    finally:
        for (i, a), fm in originals.items():
            setattr(_owner(m.layers[i], a), a, fm)
    for j, (ids, g) in enumerate(toks):
        floor.append(kl_rows(rows[f"p{j}"], teacher_forced(m, ids, g), g)["kl"])
    path = os.path.join(tmp, "ref.npz")
    np.savez(path, **rows)
    ref = _Ref(spec, prof.name, toks, path)
    items = [(ref, i, target.name) for i in range(nl)] + [(ref, None, target.name)]
    res = [None] * len(items)
    for idx, r in tasks.run(_layer_task, items, jobs=jobs, scheduler=scheduler):
        res[idx] = r
        if progress:
            progress(1)
    os.remove(path)
    os.rmdir(tmp)
    layers = []
    for i in range(nl):
        lin = {}
        for a, _ in LINEARS:
            s = sink[f"{i}.{a}"]
            y2 = max(s["y2"], 1e-300)
            lin[a] = {"type": s["type"], "w_err": s["w_err"],
                      "out_w": float(np.sqrt(s["e_w"] / y2)),
                      "out_blocks": float(np.sqrt(s["e_blocks"] / y2)),
                      "out_a8": float(np.sqrt(s["e_a8"] / y2)),
                      "out_wb": float(np.sqrt(s["e_wb"] / y2))}
        layers.append({"layer": i, "attn_input": crest_stats(np.concatenate(crest[(i, "attn")])),
                       "ffn_input": crest_stats(np.concatenate(crest[(i, "ffn")])),
                       "linears": lin, **{k: res[i][k] for k in ("kl_weight", "kl_full", "kl_act")}})
    whole = {k: res[-1][k] for k in ("kl_weight", "kl_full", "kl_act")}
    return {"model": spec, "type": target.name, "cpu": prof.name, "prompts": len(prompts),
            "positions": int(sum(len(g) for _, g in toks)), "layers": layers, "whole": whole,
            "sum": {k: float(sum(L[k] for L in layers)) for k in ("kl_weight", "kl_full", "kl_act")},
            "floor": float(np.concatenate(floor).mean())}
