"""One mixture-of-experts layer of a real model two ways, to check a CUDA
engine's expert output on it (`strata-ref experts`): the routed experts as
llama.cpp's CPU build computes them (`moe.MoEFFN`) and through the mode-8
expert route (`routes.experts.moe_ffn`), which the CUDA expert kernels
reproduce bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import ModelLoadError

__all__ = ["ExpertCheck", "check_experts"]


@dataclass
class ExpertCheck:
    """The routed-expert FFN of one layer computed two ways (`check_experts`).

    x: float32 (n, n_embd), the FFN input (after the layer's FFN norm);
    ids int32 / weights float32 (n, k): llama.cpp's routing of x (ggml-cpu's
    order); cpu float32 (n, n_embd): the routed experts' weighted sum as
    llama.cpp's CPU build computes it (`profile`); route float32 (n, n_embd):
    the same experts and weights through `routes.experts.moe_ffn`, the
    mode-8 expert oracle that the CUDA expert kernels reproduce bit for bit.
    (The shared expert of qwen3next is not part of either.)"""
    arch: str
    layer: int
    profile: str
    x: np.ndarray
    ids: np.ndarray
    weights: np.ndarray
    cpu: np.ndarray
    route: np.ndarray

    def agreement(self) -> dict:
        """How far `cpu` and `route` agree, with the NaN rule of the hashes
        (`hashing.canonical_bytes`: any NaN equals any NaN). Returns
        {"equal_values": the fraction of values of equal bits or NaN on
        both sides, "max_abs_diff": max |cpu - route| over the other pairs
        of numbers (0.0 when there are none; float64), "max_rel_diff": that
        over max |cpu| of the numbers, "nan_both": NaN on both sides,
        "nan_vs_number": NaN on one side only}."""
        a, b = self.cpu, self.route
        na, nb = np.isnan(a), np.isnan(b)
        same = (a.view(np.uint32) == b.view(np.uint32)) | (na & nb)
        differ = ~same & ~na & ~nb
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(a[differ].astype(np.float64) - b[differ])
        top = float(np.abs(a[~na]).max()) if (~na).any() else 0.0
        max_abs = float(d.max()) if d.size else 0.0
        return {"equal_values": float(same.mean()) if same.size else 1.0, "max_abs_diff": max_abs,
                "max_rel_diff": max_abs / max(top, float(np.finfo(np.float32).tiny)),
                "nan_both": int((na & nb).sum()), "nan_vs_number": int((na ^ nb).sum())}


def _expert_rows(em, e: int) -> np.ndarray:
    """Expert e's bytes of an ExpertMatrix as uint8 (rows, row bytes)."""
    q = em.experts[e]
    return np.asarray(q.raw).reshape(q.rows, -1)


def check_experts(m, layer: int, x: np.ndarray | None = None, prompt: str | None = None) -> ExpertCheck:
    """The routed experts of `layer` of model `m` (a loaded `model.Model`)
    for activations x (float32 (n, n_embd), the FFN
    input), or for the FFN input llama.cpp's graph has at that layer when
    it runs `prompt` (tokenized as `strata-ref generate` does), computed
    the llama.cpp-CPU way and through the mode-8 route (`ExpertCheck`).

    Raises ValueError for a layer out of range, x of the wrong shape, both
    or neither of x / prompt, and ModelLoadError for an architecture whose
    expert FFN is not the route's SwiGLU (gpt-oss: clamped SwiGLU, biases),
    or expert types the route has no kernel for (`routes.mmvq`)."""
    from ..routes import experts as route_experts
    from ..routes.mmvq import SUPPORTED_TYPES
    hp = m.hp
    if m.spec.experts is None:
        raise ModelLoadError(f"{hp.arch}: not a mixture-of-experts model")
    if not 0 <= int(layer) < hp.n_layer:
        raise ValueError(f"layer {layer} is outside 0 .. {hp.n_layer - 1}")
    moe = m.layers[int(layer)].moe
    if not hasattr(moe, "router"):
        raise ValueError(f"layer {layer} of this {hp.arch} model has a dense FFN, no experts")
    if moe.act != "silu" or moe.b_up is not None or moe.down_scale is not None:
        what = {"swiglu_oai": "clamped SwiGLU with biases", "geglu": "GeGLU"}.get(moe.act, "SwiGLU")
        what += " and per-expert down scales" if moe.down_scale is not None else ""
        raise ModelLoadError(f"{hp.arch}: its expert FFN ({what}) is not the "
                             f"SwiGLU of the mode-8 expert route")
    if (x is None) == (prompt is None):
        raise ValueError("check_experts takes activations x or a prompt, not both or neither")
    if prompt is not None:
        ids = m.tokenizer.encode(prompt, add_special=True, parse_special=False)
        if not ids:
            raise ValueError("the prompt has no tokens")
        moe.last_x = None
        m.forward(ids, m.new_cache(len(ids)), all_logits=False)
        x = moe.last_x
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] != hp.n_embd or x.shape[0] == 0:
        raise ValueError(f"activations must be float32 (n, {hp.n_embd}), got {x.shape}")
    if moe.gate_up is not None and moe.gate is None:
        gate = [_expert_rows(moe.gate_up, e)[:moe.n_ff] for e in range(hp.n_expert)]
        up = [_expert_rows(moe.gate_up, e)[moe.n_ff:] for e in range(hp.n_expert)]
        t_gu = moe.gate_up.type
    else:
        gate = [_expert_rows(moe.gate, e) for e in range(hp.n_expert)]
        up = [_expert_rows(moe.up, e) for e in range(hp.n_expert)]
        if moe.gate.type != moe.up.type:
            raise ModelLoadError(f"{hp.arch} layer {layer}: gate ({moe.gate.type.name}) and up "
                                 f"({moe.up.type.name}) experts of different types: the route "
                                 f"takes one type for both")
        t_gu = moe.gate.type
    down = [_expert_rows(moe.down, e) for e in range(hp.n_expert)]
    for t in (t_gu, moe.down.type):
        if t not in SUPPORTED_TYPES:
            raise ModelLoadError(f"{hp.arch} layer {layer}: expert type {t.name} has no mode-8 "
                                 f"route (routes.mmvq types: "
                                 f"{', '.join(s.name for s in SUPPORTED_TYPES)})")
    with np.errstate(over="ignore", invalid="ignore"):
        ids, weights = moe.route(x)
        cpu_out = moe.experts(x, ids, weights)
        route_out = route_experts.moe_ffn(x, ids, weights, gate, up, down, t_gu, moe.down.type)
    return ExpertCheck(hp.arch, int(layer), m.cpu.name, x, ids, weights, cpu_out, route_out)
