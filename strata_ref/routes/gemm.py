"""The prompt-path GEMM routes as oracles: Y[T, N] = X[T, K] · W[N, K]^T.

Two routes (../shared/spec/kernels.md §11):

* ``"f16"``, the FP16-operand route (one `cublasGemmEx`, FP16 in, FP32
  compute and out): W is dequantized to f16 by the oracle, X is rounded to
  f16 (RNE, so |x| >= 65520 becomes ±Inf).
* ``"f32"``, the FP32 route (`cublasSgemm`): the same f16 weights widened
  exactly to f32, X taken as float32 as given (f16 activations are widened
  exactly). For activations that are already f16 values both routes multiply
  the same operands; activations beyond ±65504 stay finite only here.

cuBLAS documents no summation order, so no NumPy code can give its bits
(DESIGN.md "arithmetic contract"). The oracle forms every product exactly in
float64 (f16·f16 and f32·f16 products have <= 35 significant bits), sums in
float64 and rounds once to float32; `error_bound` says how far any correct
float32-accumulating implementation may be from it.

beta = 1 accumulates: y = fl32(dot + y_old), one rounding. Columns of Y past
N (up to ldy) are never written.
"""
from __future__ import annotations

import numpy as np

from ..dequant import dequant_f16
from ..numerics import canonicalize_nan
from ..types import block_format, parse_type

__all__ = ["ROUTES", "operands", "gemm", "gemm_sliced", "slice_rows", "abs_sum",
           "error_bound", "U32"]

ROUTES = ("f16", "f32")

#: unit roundoff of float32 (RNE), 2^-24.
U32 = 2.0 ** -24


def _check_route(route: str) -> str:
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    return route


def _weights_f16(wtype, w_raw, n: int, k: int, row0: int = 0) -> np.ndarray:
    """Rows [row0, row0+n) of W (N x K, ggml type `wtype`) as f16 (n, k)."""
    return dequant_f16(wtype, w_raw, n, k, row0=row0)


def _activations(route: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.dtype not in (np.float16, np.float32):
        raise TypeError(f"X must be a 2-D float32 or float16 array, got {x.dtype} {x.shape}")
    if route == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float64)   # RNE, ±Inf beyond 65504
    return x.astype(np.float32).astype(np.float64)


def operands(route: str, x: np.ndarray, wtype, w_raw, n: int, k: int,
             row0: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(X, W rows [row0, row0+n)) as the float64 values the route multiplies.

    x: (T, K) float32 or float16. w_raw: the quantized W (N x K) from row 0.
    Returns float64 arrays of shape (T, K) and (n, K), both exact.
    """
    _check_route(route)
    xo = _activations(route, x)
    if xo.shape[1] != k:
        raise ValueError(f"X has {xo.shape[1]} columns, K={k}")
    wo = _weights_f16(wtype, w_raw, n, k, row0).astype(np.float64)
    return xo, wo


def _out(y, t: int, n: int, ldy: int | None, beta: int) -> tuple[np.ndarray, int]:
    ldy = n if ldy is None else int(ldy)
    if ldy < n:
        raise ValueError(f"ldy={ldy} is smaller than N={n}")
    if beta not in (0, 1):
        raise ValueError(f"beta must be 0 or 1, got {beta!r}")
    if y is None:
        if beta:
            raise ValueError("beta=1 needs the Y to accumulate into")
        return np.zeros((t, ldy), np.float32), ldy
    if not isinstance(y, np.ndarray) or y.dtype != np.float32 or y.shape != (t, ldy):
        raise ValueError(f"Y must be float32 of shape ({t}, {ldy}), got "
                         f"{getattr(y, 'dtype', type(y))} {getattr(y, 'shape', '')}")
    return y, ldy


def _gemm_block(xo, wo, y, c0: int, beta: int) -> None:
    with np.errstate(invalid="ignore", over="ignore"):
        acc = xo @ wo.T                        # exact products, float64 sums
        if beta:
            acc = acc + y[:, c0:c0 + wo.shape[0]].astype(np.float64)
        y[:, c0:c0 + wo.shape[0]] = canonicalize_nan(acc.astype(np.float32))


def gemm(route: str, x: np.ndarray, wtype, w_raw, n: int, k: int, y: np.ndarray | None = None,
         beta: int = 0, ldy: int | None = None) -> np.ndarray:
    """Oracle of one route's Y[T, N] = X[T, K] · W[N, K]^T (+ Y if beta = 1).

    route: "f16" or "f32". x: (T, K) float32/float16. wtype, w_raw: ggml type
    and bytes of W (N rows of K values). y: (T, ldy) float32, required for
    beta = 1; columns [N, ldy) are left untouched. Returns Y (float32, T x ldy),
    NaNs canonical. Raises ValueError/TypeError for wrong shapes, beta or ldy.
    """
    _check_route(route)
    t = np.asarray(x).shape[0]
    y, _ = _out(y, t, n, ldy, beta)
    xo, wo = operands(route, x, wtype, w_raw, n, k)
    _gemm_block(xo, wo, y, 0, beta)
    return y


def slice_rows(scratch_elems: int, n: int, k: int) -> int:
    """Rows of W per slice for a scratch of `scratch_elems` f16 elements.

    All N rows when N·K fits, else floor(scratch_elems / K) (Strata's
    `Gemm::native`). Raises ValueError when the scratch holds less than one
    row of K values.
    """
    if n * k <= scratch_elems:
        return n
    rows = scratch_elems // k
    if rows < 1:
        raise ValueError(f"a scratch of {scratch_elems} elements holds no row of K={k} values")
    return rows


def gemm_sliced(route: str, x: np.ndarray, wtype, w_raw, n: int, k: int, scratch_elems: int,
                y: np.ndarray | None = None, beta: int = 0, ldy: int | None = None) -> np.ndarray:
    """`gemm` computed as the prompt path does it: W dequantized in slices of
    `slice_rows(scratch_elems, n, k)` rows, one product per slice into the
    matching columns of Y. Each output's dot product is the same, so the
    result equals `gemm` whenever the float64 sums are exact (and within
    `error_bound` of it always)."""
    _check_route(route)
    fmt = block_format(parse_type(wtype))
    if k % fmt.block_values:
        raise ValueError(f"K={k} is not a multiple of the {fmt.name} block size {fmt.block_values}")
    rows = slice_rows(int(scratch_elems), n, k)
    t = np.asarray(x).shape[0]
    y, _ = _out(y, t, n, ldy, beta)
    for r0 in range(0, n, rows):
        m = min(rows, n - r0)
        xo, wo = operands(route, x, wtype, w_raw, m, k, row0=r0)
        _gemm_block(xo, wo, y, r0, beta)
    return y


def abs_sum(route: str, x: np.ndarray, wtype, w_raw, n: int, k: int,
            y_old: np.ndarray | None = None) -> np.ndarray:
    """S[t, j] = Σ_k |x[t,k]·w[j,k]| (+ |y_old| for beta = 1), float64 (T, N)."""
    xo, wo = operands(route, x, wtype, w_raw, n, k)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.abs(xo) @ np.abs(wo).T
    if y_old is not None:
        s = s + np.abs(y_old[:, :n].astype(np.float64))
    return s


def error_bound(k: int, s: np.ndarray) -> np.ndarray:
    """Largest |y_gpu - y_oracle| a correct float32-accumulating GEMM may show.

    Derivation (u = 2^-24, S = Σ|x·w| (+|y_old|)): f16·f16 products are exact
    in tensor cores; in the f32 route a product of an f32 activation and an
    f16-valued weight is exact inside an FMA and errs by at most u·|p| when
    rounded on its own. In any summation order each of the K additions (one
    more for beta) errs by at most u·|partial| <= u·S (Higham, "Accuracy and
    Stability of Numerical Algorithms", §4.2), so a round-to-nearest
    implementation stays within (K + 1)·u·S, plus K·u·S for separately
    rounded products. Tensor-core accumulation is not documented to round to
    nearest, so each step is allowed 2u as well. The oracle's own float64
    error (<= K·2^-53·S) is added. Result: (2(K+1)u + K·2^-53)·S.
    """
    return (2.0 * (k + 1) * U32 + k * 2.0 ** -53) * np.asarray(s, np.float64)
