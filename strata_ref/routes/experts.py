"""MoE FFN over selected experts, bitwise the native expert modes.

For each token x_t (float32, H values) with expert ids e_tj and router
weights p_tj (j = 0..k-1, in the given order):

1. xq = q8_1(x_t) (routes/q8_1.py, the canonical rule);
2. g = mmvq(gate[e], xq), u = mmvq(up[e], xq) (routes/mmvq.py, canonical order);
3. h = swiglu(g, u) with the float32 sequence of `swiglu` (own exp, below);
4. hq = q8_1(h); y = mmvq(down[e], hq);
5. out_t = fma(p_tj, y, out_t) for j = 0..k-1, from out_t = +0.0f.

Expert mode 0 (one warp per row, separate kernels) and mode 8 (fused gate/up,
SwiGLU and q8_1 epilogue, then down) are layouts of this one arithmetic and
must give these bits (../shared/spec/kernels.md §10; strata-ref replaces
Strata's `__expf` by `exp_f32`, so the oracle is exact, not a tolerance).

`exp_f32(x)`, every step a float32 operation (CUDA: __fmul_rn, rintf,
__fmaf_rn, __int_as_float; no MUFU.EX2):

    xc = fminf(fmaxf(x, -104), 100)            (NaN x gives -104, see swiglu)
    n  = rintf(xc · LOG2E)                     (RNE to integer, |n| <= 150)
    r  = fma(n, -LN2_HI, xc); r = fma(n, -LN2_LO, r)   (Cody-Waite)
    p  = C7; p = fma(p, r, C_k) for k = 6..0   (Taylor 1/k!, as float32)
    n1 = n >> 1 (floor), n2 = n - n1           (each within [-75, 73])
    e  = (p · 2^n1) · 2^n2                     (two multiplies by exact powers)

LN2_HI = 0.693145751953125 (few bits, so n·LN2_HI is exact), LN2_LO =
1.428606765330187e-06. The relative error against exp is below 1e-6 on
[-87, 88] (tests/test_routes_experts.py measures it); the value is fixed by
the sequence, not by a library.
"""
from __future__ import annotations

import numpy as np

from ..numerics import fma_f32
from ..types import GGMLType, block_format
from .mmvq import mmvq
from .q8_1 import quantize_q8_1

__all__ = ["exp_f32", "swiglu", "moe_ffn", "EXP_CONSTANTS"]

_F = np.float32
LOG2E = _F(1.4426950408889634)
LN2_HI = _F(0.693145751953125)
LN2_LO = _F(1.428606765330187e-06)
#: Horner coefficients C0..C7 = 1/k! rounded to float32
COEFFS = tuple(_F(1.0 / f) for f in (1, 1, 2, 6, 24, 120, 720, 5040))
EXP_CONSTANTS = {"LOG2E": LOG2E, "LN2_HI": LN2_HI, "LN2_LO": LN2_LO, "COEFFS": COEFFS}


def _pow2(n: np.ndarray) -> np.ndarray:
    """2^n as float32 for integer n in [-126, 127] (exact bits)."""
    return ((n.astype(np.int32) + 127) << 23).astype(np.uint32).view(_F)


def exp_f32(x) -> np.ndarray:
    """The specified float32 exp of the module docstring; float32 array in,
    float32 array (same shape) out."""
    x = np.asarray(x, _F)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        xc = np.fmin(np.fmax(x, _F(-104.0)), _F(100.0))       # C fmaxf/fminf: NaN -> other
        n = np.rint(np.multiply(xc, LOG2E, dtype=_F)).astype(_F)
        r = fma_f32(n, -LN2_HI, xc)
        r = fma_f32(n, -LN2_LO, r)
        p = np.full(x.shape, COEFFS[7], _F)
        for c in COEFFS[6::-1]:
            p = fma_f32(p, r, c)
        ni = n.astype(np.int32)
        n1 = ni >> 1
        n2 = ni - n1
        return np.multiply(np.multiply(p, _pow2(n1), dtype=_F), _pow2(n2), dtype=_F)


def swiglu(g, u) -> np.ndarray:
    """h = (g / (1 + exp_f32(-g))) · u, float32, each step one IEEE float32
    operation (negation exact, __fadd_rn, __fdiv_rn, __fmul_rn)."""
    g = np.asarray(g, _F)
    u = np.asarray(u, _F)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        den = np.add(_F(1.0), exp_f32(-g), dtype=_F)
        return np.multiply(np.divide(g, den, dtype=_F), u, dtype=_F)


def _check(x, ids, weights, gate, up, down, t_gu, t_down):
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 2:
        raise TypeError(f"x must be float32 (tokens, H), got {x.dtype} {x.shape}")
    ids = np.asarray(ids)
    weights = np.asarray(weights)
    if ids.ndim != 2 or ids.shape[0] != x.shape[0] or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be integer (tokens, k) with {x.shape[0]} tokens, got {ids.shape}")
    if weights.dtype != np.float32 or weights.shape != ids.shape:
        raise ValueError(f"router weights must be float32 {ids.shape}, got "
                         f"{weights.dtype} {weights.shape}")
    n_exp = len(gate)
    if len(up) != n_exp or len(down) != n_exp:
        raise ValueError("gate, up and down need one matrix per expert")
    if ids.size and (ids.min() < 0 or ids.max() >= n_exp):
        raise ValueError(f"expert ids must lie in [0, {n_exp}), got {ids.min()}..{ids.max()}")
    h = x.shape[1]
    ff = np.asarray(gate[0]).shape[0]
    bg, bd = block_format(t_gu), block_format(t_down)
    if h % bg.block_values or ff % bd.block_values or ff % 32:
        raise ValueError(f"H = {h} must be a multiple of {bg.block_values}, FF = {ff} of "
                         f"{bd.block_values} and 32")
    return x, ids, weights


def moe_ffn(x, ids, weights, gate, up, down, t_gu, t_down) -> np.ndarray:
    """MoE FFN output, float32 (tokens, H).

    x: float32 (tokens, H); ids: int (tokens, k) expert ids; weights: float32
    (tokens, k) router weights; gate, up: per expert uint8 (FF, row bytes of
    H values of type t_gu); down: per expert uint8 (H, row bytes of FF values
    of type t_down). Raises TypeError / ValueError on bad shapes or ids.
    """
    x, ids, weights = _check(x, ids, weights, gate, up, down, GGMLType(t_gu), GGMLType(t_down))
    out = np.zeros(x.shape, _F)
    for tok in range(x.shape[0]):
        xq = quantize_q8_1(x[tok]).reshape(1, -1, 36)
        for j in range(ids.shape[1]):
            e = int(ids[tok, j])
            g = mmvq(t_gu, gate[e], xq)[0]
            u = mmvq(t_gu, up[e], xq)[0]
            hq = quantize_q8_1(swiglu(g, u)).reshape(1, -1, 36)
            y = mmvq(t_down, down[e], hq)[0]
            out[tok] = fma_f32(weights[tok, j], y, out[tok])
    return out
