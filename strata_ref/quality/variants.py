"""Model variants for the quality measurements: the same GGUF file computed
with other weights or other activation arithmetic.

A variant is named by a suffix on the model argument:

| spec | weights | activations into every linear |
|---|---|---|
| `FILE` | the file's quantized weights | as llama.cpp's CPU build of the profile (its activation blocks: Q8_0 / Q8_1 / Q8_K) |
| `FILE@float` | dequantized to float32 (the oracle, ggml's `to_float`) | float32, no quantization |
| `FILE@TYPE` (`@Q4_K`, `@IQ4_XS` ...) | every 2-D weight requantized from its dequantized values by the reference quantizer of TYPE (`strata_ref.quantize`, ggml's `quantize_row_*_ref`), with llama.cpp's fallback type where a row length does not fit TYPE's block (`fallback_type`) | as llama.cpp runs such a file |
| `FILE@a8token` | dequantized to float32 | per token (row), symmetric int8 with one scale: d = amax / 127 (float32), q = round half to even (x / d) |

Every other operation (norms, RoPE, attention, the FFN activation) is the
profile's own. The float products (`@float`, `@a8token`) are summed in
float64 over float32 operands, in a fixed order (`_float_mm`: 8 partial sums
of the products at positions j mod 8, then ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)),
the rest added last) and rounded once to float32, so they do not depend on
a BLAS library's order and run at vector speed. `load_variant(spec, profile)`
returns a `strata_ref.infer` model with its matrices replaced; the model
graph does not change.
"""
from __future__ import annotations

import os

import numpy as np
from numba import njit, prange

from ..types import GGMLType, block_format

__all__ = ["parse_spec", "load_variant", "fallback_type", "FloatMatrix", "A8TokenMatrix",
           "VariantError", "linear_matrices", "replace_matrices"]

#: the plain suffixes; anything else after "@" must be a ggml type name
KINDS = ("float", "a8token")
#: types ggml uses only for quantized activations (`vec_dot_type`), never as
#: weights of a CPU mat-mul (ggml-cpu `type_traits_cpu`)
ACTIVATION_ONLY = (GGMLType.Q8_1, GGMLType.Q8_K)


class VariantError(ValueError):
    """A variant spec that names no known variant, or a type that cannot be
    made without an importance matrix."""


def parse_spec(spec: str):
    """(model, kind) of "MODEL@SUFFIX": kind is None (the file as llama.cpp
    runs it), "float", "a8token" or a GGMLType. A path that exists as given
    is never split (so a file name containing "@" works). Raises
    VariantError naming an unknown suffix."""
    spec = str(spec)
    if "@" not in spec or os.path.exists(spec):
        return spec, None
    model, _, suffix = spec.rpartition("@")
    if not model:
        raise VariantError(f"{spec!r}: no model before '@'")
    low = suffix.lower()
    if low in KINDS:
        return model, low
    try:
        t = GGMLType[suffix.upper()]
    except KeyError:
        raise VariantError(f"{spec!r}: unknown variant {suffix!r} (float, a8token or a ggml "
                           f"type name such as Q4_K)") from None
    if t in ACTIVATION_ONLY:
        raise VariantError(f"{spec!r}: {t.name} is an activation block type (a vec_dot_type); "
                           f"ggml-cpu has no mat-mul with {t.name} weights")
    return model, t


# llama.cpp's fallback when a row length does not fit the block
# (src/llama-quant.cpp `tensor_type_fallback`, llama-cpp-python 0.3.36)
_FALLBACK = {**{t: GGMLType.IQ4_NL for t in (GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.IQ2_XXS,
                                              GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS,
                                              GGMLType.IQ3_S, GGMLType.IQ4_XS)},
             **{t: GGMLType.Q4_0 for t in (GGMLType.Q2_0, GGMLType.Q2_K, GGMLType.Q3_K,
                                            GGMLType.TQ1_0, GGMLType.TQ2_0)},
             GGMLType.Q4_K: GGMLType.Q5_0, GGMLType.Q5_K: GGMLType.Q5_1, GGMLType.Q6_K: GGMLType.Q8_0}


def fallback_type(t: GGMLType, ncols: int) -> GGMLType:
    """The type llama.cpp's quantizer gives a tensor of row length `ncols`
    when asked for `t`: t when ncols is a multiple of its block, else the
    fallback of `_FALLBACK` (F16 when that does not fit either). Raises
    VariantError for a type with no fallback that does not fit."""
    t = GGMLType(t)
    qk = block_format(t).block_values
    if ncols % qk == 0:
        return t
    if t not in _FALLBACK:
        if qk <= 32:
            return GGMLType.F16
        raise VariantError(f"no fallback type for {t.name} (rows of {ncols} values)")
    f = _FALLBACK[t]
    return f if ncols % block_format(f).block_values == 0 else GGMLType.F16


@njit(parallel=True, cache=True)
def _float_mm(x, w, out):
    # out[t, r] = float32(sum_k float64(x[t, k]) * float64(w[r, k])) in the
    # order of the module docstring (8 partial sums), rows in parallel
    n, k = x.shape
    k8 = k - k % 8
    for r in prange(w.shape[0]):
        acc = np.empty(8, np.float64)
        for t in range(n):
            for l in range(8):
                acc[l] = 0.0
            for j in range(0, k8, 8):
                for l in range(8):
                    acc[l] += np.float64(x[t, j + l]) * np.float64(w[r, j + l])
            tot = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
            for j in range(k8, k):
                tot += np.float64(x[t, j]) * np.float64(w[r, j])
            out[t, r] = np.float32(tot)


class FloatMatrix:
    """A weight matrix dequantized to float32 (rows, cols) and multiplied
    in float64 with float32 activations (`@float`); `.matmul(x)` float32
    (n, cols) -> (n, rows), `.row_f32(i)`, `.prepare()` as QMatrix's."""

    def __init__(self, qm):
        self.type, self.rows, self.cols, self.name = qm.type, qm.rows, qm.cols, qm.name
        self.profile = qm.profile
        self._qm = qm
        self._w = None

    def _weights(self):
        if self._w is None:
            from ..dequant import dequant_f32
            if self.type == GGMLType.F32:
                self._w = np.ascontiguousarray(self._qm.raw.view(np.float32).reshape(self.rows, self.cols))
            else:
                self._w = np.ascontiguousarray(dequant_f32(self.type, self._qm.raw, self.rows, self.cols))
        return self._w

    def prepare(self):
        self._weights()

    def row_f32(self, i):
        return self._weights()[int(i)].copy()

    def rows_f32(self, ids):
        """float32 (len(ids), cols): the rows `ids` (ggml `get_rows`);
        IndexError for an id outside the matrix."""
        from ..cpu.matmul import row_ids
        return self._weights()[row_ids(ids, self.rows, self.name)]

    def _activations(self, x):
        return x

    def matmul(self, x, mmid=False):
        # mmid (an expert's routed rows, `QMatrix.matmul`) changes nothing
        # in a float64 product
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self.cols:
            raise ValueError(f"{self.name}: activations must be (n, {self.cols}), got {x.shape}")
        out = np.empty((x.shape[0], self.rows), np.float32)
        _float_mm(np.ascontiguousarray(self._activations(x), np.float32), self._weights(), out)
        return out


@njit(cache=True)
def _a8_rows(x, out):
    # per row: d = amax / 127 (float32), q = rint(x / d) in [-127, 127]; out = q * d
    for t in range(x.shape[0]):
        amax = np.float32(0.0)
        for j in range(x.shape[1]):
            a = abs(x[t, j])
            if a > amax:
                amax = a
        d = np.float32(amax / np.float32(127.0))
        for j in range(x.shape[1]):
            if d == 0:
                out[t, j] = 0.0
            else:
                q = np.rint(np.float32(x[t, j] / d))
                q = min(max(q, -127.0), 127.0)
                out[t, j] = np.float32(np.float32(q) * d)


class A8TokenMatrix(FloatMatrix):
    """`@a8token`: float32 weights (as FloatMatrix) times the activations
    quantized per token to int8 with one float32 scale d = amax / 127 and
    q = round half to even (x / d) (module docstring). The product q * d is
    exact in float32, so the float64 sum equals d * sum(q w) up to one
    rounding."""

    def _activations(self, x):
        out = np.empty_like(x)
        _a8_rows(x, out)
        return out


def linear_matrices(model):
    """[(owner, attribute, matrix)] of every weight matrix a model
    multiplies: in each layer and in its blocks (attention, FFN, MoE,
    linear attention: objects with a `matrices()` method), the attributes
    whose value has `.matmul` (q, k, v, output, gate, up, down, stacked
    ones) and each expert's matrix of an expert tensor (owner: the list of
    experts, attribute: the index); then the model's output and token
    embedding."""
    out = []

    def walk(obj):
        for k, v in vars(obj).items():
            if v is None:
                continue
            if hasattr(v, "matmul") and hasattr(v, "rows"):
                out.append((obj, k, v))
            elif hasattr(v, "mul_mat_id") and isinstance(getattr(v, "experts", None), list):
                out.extend((v.experts, i, q) for i, q in enumerate(v.experts))
            elif hasattr(v, "matrices") and not isinstance(v, type):
                walk(v)

    for L in model.layers:
        walk(L)
    for k in ("output", "tok_embd"):
        v = getattr(model, k, None)
        if v is not None and hasattr(v, "matmul"):
            out.append((model, k, v))
    return out


def replace_matrices(model, make):
    """Replace every matrix of `linear_matrices(model)` by `make(qm)` (one
    replacement per distinct matrix, so a tied output stays the embedding).
    Stacked matrices (`wqkv`, `w_gate_up`) are replaced as well; their rows
    are the parts' rows in order, so the results are the same as the parts'."""
    done = {}
    for owner, attr, qm in linear_matrices(model):
        if id(qm) not in done:
            done[id(qm)] = make(qm)
        if isinstance(owner, list):
            owner[attr] = done[id(qm)]
        else:
            setattr(owner, attr, done[id(qm)])
    return model


def _requantized(qm, t: GGMLType):
    """A QMatrix of qm's weights requantized to t (or its fallback type for
    qm's row length), by the reference quantizer, in qm's profile."""
    from ..cpu.matmul import QMatrix
    from ..dequant import dequant_f32
    from ..quantize import quantize
    tt = fallback_type(t, qm.cols)
    if qm.type == GGMLType.F32:
        x = qm.raw.view(np.float32).reshape(qm.rows, qm.cols)
    else:
        x = dequant_f32(qm.type, qm.raw, qm.rows, qm.cols)
    if tt == GGMLType.F32:
        raw = np.ascontiguousarray(x, np.float32).view(np.uint8).reshape(-1)
    else:
        try:
            raw = np.asarray(quantize(x, tt), np.uint8).reshape(-1)
        except ValueError as e:
            raise VariantError(f"@{t.name}: {e}") from None
    out = QMatrix(tt, raw, qm.rows, qm.cols, qm.name, qm.profile)
    out.repackable = getattr(qm, "repackable", True)
    if hasattr(qm, "part_rows"):
        out.part_rows = qm.part_rows
    return out


def load_variant(spec, profile=None):
    """A model for variant spec "MODEL[@float|@a8token|@TYPE]" (module
    docstring), loaded to run in CPU profile `profile`. Raises VariantError
    for an unknown suffix or a type without a reference quantizer, and what
    `strata_ref.infer.load` raises for the model."""
    from ..infer import load
    model, kind = parse_spec(spec)
    m = load(model, cpu=profile)
    m.variant = kind.name if isinstance(kind, GGMLType) else (kind or "file")
    if kind == "float":
        replace_matrices(m, FloatMatrix)
    elif kind == "a8token":
        replace_matrices(m, A8TokenMatrix)
    elif isinstance(kind, GGMLType):
        replace_matrices(m, lambda qm: _requantized(qm, kind))
    return m
