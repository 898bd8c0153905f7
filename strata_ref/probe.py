"""One weight tensor through the oracle, for a kernel engineer's one-line
checks: the dequantized rows of a tensor (`strata-ref dequant`) and one
weight times given activations through a route (`strata-ref matmul`),
with an engine's result compared against it.

Routes of `route_matmul` (y[t, r] = sum_k x[t, k] W[r, k]):

| route | what | agreement |
|---|---|---|
| `cpu` | ggml-cpu's `ggml_mul_mat` of the profile (`cpu.matmul.QMatrix`) | bitwise |
| `mmvq` | the CUDA q8_1 mat-vec (`routes.mmvq.mmvq_f32`), columns of 8 | bitwise |
| `gemm-f16`, `gemm-f32` | the FP16-operand / FP32 cuBLAS routes (`routes.gemm`) | within `routes.gemm.error_bound` |
"""
from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np

from .ulp import compare_bits, locate, worst

__all__ = ["ROUTES", "open_tensor", "dequant_rows", "route_matmul", "compare_output"]

ROUTES = ("cpu", "mmvq", "gemm-f16", "gemm-f32")


def open_tensor(model, name: str):
    """(GGUF file, tensor) of `name` in MODEL (registry name, path, split
    set). ValueError naming the file and the nearest names for a tensor
    that is not there."""
    from .gguf import read
    from .models import resolve
    f = read(resolve(model))
    try:
        return f, f.tensor(name)
    except KeyError:
        near = difflib.get_close_matches(name, [t.name for t in f.tensors], n=3)
        hint = f"; nearest: {', '.join(near)}" if near else ""
        raise ValueError(f"no tensor {name!r} in {Path(f.shards[0].path).name} ({len(f.tensors)} tensors"
                         f"{hint}; `strata-ref info --tensors` lists them)") from None


def _row_range(t, row0: int, rows: int | None) -> int:
    if row0 < 0 or row0 >= max(t.rows, 1):
        raise ValueError(f"--row0 {row0} is outside the tensor's {t.rows} rows")
    if rows is not None and rows < 1:
        raise ValueError(f"--rows must be >= 1, got {rows}")
    rows = t.rows - row0 if rows is None else rows
    if row0 + rows > t.rows:
        raise ValueError(f"rows [{row0}, {row0 + rows}) are outside the tensor's {t.rows} rows")
    return rows


def dequant_rows(model, name: str, dtype: str = "f32", row0: int = 0, rows: int | None = None) -> np.ndarray:
    """The oracle's output of rows [row0, row0 + rows) of tensor `name`
    (rows None: to the end): float32, float16 or bfloat16 (`ml_dtypes`)
    (rows, cols). Raises ValueError for an unknown tensor, rows outside the
    tensor, a plain integer tensor."""
    from .dequant import dequant
    from .types import PLAIN_TYPES
    _, t = open_tensor(model, name)
    if t.type in PLAIN_TYPES:
        raise ValueError(f"tensor {name!r} is {t.type.name}, a plain integer array: it has no float output")
    if t.n_elements == 0:
        raise ValueError(f"tensor {name!r} is empty (shape {list(t.shape)})")
    rows = _row_range(t, row0, rows)
    return dequant(t.type, t.data, rows, t.cols, row0=row0, out_dtype=dtype)


def route_matmul(model, name: str, x: np.ndarray, route: str, cpu=None) -> tuple[np.ndarray, np.ndarray | None]:
    """(y, bound): the route's output float32 (T, rows) of weight `name`
    times activations x float32 (T, cols), and for the GEMM routes the
    largest difference a correct cuBLAS result may show per value
    (`routes.gemm.error_bound`, float64 (T, rows); None for the bitwise
    routes). cpu: the profile of the `cpu` route. Raises ValueError for an
    unknown route or tensor, a weight the route has no kernel for, x of
    the wrong shape."""
    if route not in ROUTES:
        raise ValueError(f"route {route!r} is not one of {', '.join(ROUTES)}")
    _, t = open_tensor(model, name)
    if len(t.shape) != 2:
        raise ValueError(f"tensor {name!r} has shape {list(t.shape)}: a weight matrix is 2-D")
    if x.ndim != 2 or x.shape[1] != t.cols:
        raise ValueError(f"activations of shape {x.shape}, the weight needs (tokens, {t.cols})")
    raw = np.asarray(t.data, np.uint8)
    if route == "cpu":
        from . import cpu as _cpu
        from .cpu.matmul import QMatrix
        q = QMatrix(t.type, raw, t.rows, t.cols, name, _cpu.select(cpu))
        return q.matmul(x), None
    if route == "mmvq":
        from .routes.mmvq import MAX_COLUMNS, SUPPORTED_TYPES, mmvq_f32
        if t.type not in SUPPORTED_TYPES:
            raise ValueError(f"the mmvq route has no kernel for {t.type.name} "
                             f"({', '.join(s.name for s in SUPPORTED_TYPES)})")
        w = raw.reshape(t.rows, -1)
        return np.concatenate([mmvq_f32(t.type, w, x[i:i + MAX_COLUMNS])
                               for i in range(0, x.shape[0], MAX_COLUMNS)]), None
    from .routes import gemm
    r = route.split("-")[1]
    y = gemm.gemm(r, x, t.type, raw, t.rows, t.cols)
    return y, gemm.error_bound(t.cols, gemm.abs_sum(r, x, t.type, raw, t.rows, t.cols))


def compare_output(y: np.ndarray, oracle: np.ndarray, bound: np.ndarray | None = None, n_worst: int = 5,
                   block: int = 32) -> dict:
    """An engine's y against the route's output (both float32 (T, rows)):
    bitwise (bound None: equal, n_diff, max / median ulp, the worst ulps
    with token and output row) or within the bound (within, the largest
    |y - oracle| / bound and where). NaN positions must agree either way."""
    if y.shape != oracle.shape:
        raise ValueError(f"the result has shape {y.shape}, the route's is {oracle.shape}")
    c = compare_bits(np.ascontiguousarray(y, np.float32), np.ascontiguousarray(oracle, np.float32))
    rep = {"n": c["n"], "n_diff": c["n_diff"], "nan_vs_number": c["nan_vs_number"]}
    if c["ulps"].size:
        rep.update(max_ulp=int(c["ulps"].max()), median_ulp=float(np.median(c["ulps"])))
    rep["worst"] = [{**locate(i, y.shape, block), "ulps": u} for i, u in worst(c["ulps"], c["diff_index"], n_worst)]
    if bound is None:
        rep["equal"] = c["n_diff"] == 0
        return rep
    with np.errstate(invalid="ignore"):
        d = np.abs(y.astype(np.float64) - oracle.astype(np.float64))
        ratio = np.where(bound > 0, d / bound, np.where(d > 0, np.inf, 0.0))
    num = np.isfinite(y) & np.isfinite(oracle)
    bad_nan = int((np.isnan(y) != np.isnan(oracle)).sum())
    r = np.where(num, ratio, 0.0)
    i = int(np.argmax(r))
    rep.update(within=bool(bad_nan == 0 and (r <= 1.0).all()), max_ratio=float(r.reshape(-1)[i]),
               at={**locate(i, y.shape, block)}, nan_mismatch=bad_nan)
    rep["equal"] = rep["within"]
    return rep
