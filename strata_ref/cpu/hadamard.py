"""The Walsh-Hadamard rotation that llama.cpp applies around a quantized KV
cache, bit for bit (llama.cpp vendored by llama-cpp-python 0.3.36).

llama.cpp multiplies Q, K and V by an orthonormal Hadamard matrix before
they meet a quantized cache, and the attention output by it again
afterwards (`llama_mul_mat_hadamard`, `src/llama-impl.h`; the rule of when
and with which size is `strata_ref.infer.kv_cache.rotation_sizes`). Two
pieces are reproduced here:

* `gen_hadamard(n)`: the matrix llama.cpp builds (`ggml_gen_hadamard` in
  `src/llama-kv-cache.cpp`): n a power of two, entry (i, j) =
  (-1)^popcount(i & j) * c with c = (float)(1.0 / sqrtf(n)), the division
  done in double (a `1.0` literal) and rounded to float32 once; Sylvester's
  doubling [[H, H], [H, -H]], symmetric, and its own inverse.
* `fwht(x, n)`: what ggml-cpu computes for that product. The mul_mat node
  carries the hint `GGML_HINT_SRC0_IS_HADAMARD`, and
  `ggml_compute_forward_mul_mat` (`ggml-cpu.c`) then never reads the
  matrix: `ggml_compute_forward_fwht` (`ops.cpp`) scales each row of n
  values by the float32 `1.0f / sqrtf((float)n)` first and then runs the
  in-place butterflies u + v, u - v for half-widths 1, 2, 4, ..., n/2. This
  is O(n log n) per row, and its rounding is not the dense product's (the
  scale comes first, each butterfly rounds).

The butterflies are the same float operations in every CPU profile: the
baseline build runs all of them in scalar C, the AVX2 / AVX-512 builds the
half-widths below their vector width (8 / 16 lanes) in scalar C and the
rest as vectors, where the difference is `GGML_F32_VEC_FMA(u, v, -1)`,
u + v * (-1), exact in its product and so the same rounding as u - v; the
order of the passes is the same. So `fwht` takes no profile.
"""
from __future__ import annotations

import numpy as np
from ._digest import jit

__all__ = ["gen_hadamard", "fwht", "mul_mat_hadamard", "hadamard_scale"]

_F32 = np.float32


def _check_size(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two >= 1, got {n!r}")
    return int(n)


def gen_hadamard(n: int) -> np.ndarray:
    """ggml's orthonormal Hadamard matrix of size n (a power of two), float32
    (n, n), as llama.cpp's `ggml_gen_hadamard` (src/llama-kv-cache.cpp)
    fills it: c = (float)(1.0 / (double)sqrtf(n)) at (0, 0), then for s = 1,
    2, 4, ... the block at (i + s, j) and (i, j + s) copies (i, j) and the
    block at (i + s, j + s) negates it. Raises ValueError for an n that is
    not a power of two."""
    n = _check_size(n)
    c = _F32(1.0 / np.float64(np.sqrt(_F32(n))))
    i = np.arange(n, dtype=np.uint64)
    # popcount(i & j) parity: the sign Sylvester's doubling leaves at (i, j)
    a = i[:, None] & i[None, :]
    parity = np.zeros(a.shape, np.uint64)
    while a.any():
        parity ^= a & np.uint64(1)
        a = a >> np.uint64(1)
    return np.where(parity == 1, -c, c).astype(np.float32)


def hadamard_scale(n: int) -> np.float32:
    """The float32 scale ggml-cpu's fast path applies first,
    `1.0f / sqrtf((float)n)` (a float32 division; for n = 64 and 256 it is
    the matrix's own entry, for n = 128 it may differ from `gen_hadamard`'s
    double division in the last bit)."""
    n = _check_size(n)
    return _F32(_F32(1.0) / np.sqrt(_F32(n)))


@jit
def _fwht_rows(x, n, scale, out):
    # ggml_compute_forward_fwht_impl<float> on rows of n values
    R = x.shape[0]
    for r in range(R):
        for j in range(n):
            out[r, j] = _F32(x[r, j] * scale)
        ln = 1
        while ln < n:
            for i in range(0, n, 2 * ln):
                for j in range(ln):
                    u = out[r, i + j]
                    v = out[r, i + ln + j]
                    out[r, i + j] = _F32(u + v)
                    out[r, i + ln + j] = _F32(u - v)
            ln *= 2


def fwht(x: np.ndarray, n: int) -> np.ndarray:
    """ggml-cpu's fast Walsh-Hadamard path (`ggml_compute_forward_fwht`,
    ops.cpp) for the product of `gen_hadamard(n)` with every consecutive
    run of n values of x: x float32 of any shape whose size is a multiple
    of n, read in C order as rows of n; returns float32 of x's shape, each
    row scaled by `hadamard_scale(n)` and then transformed by the
    butterflies (module docstring). O(n log n) per row. Raises ValueError
    for an n that is not a power of two or a size not a multiple of n,
    TypeError for a non-float32 x."""
    n = _check_size(n)
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"fwht: x must be float32, got {x.dtype}")
    if x.size % n:
        raise ValueError(f"fwht: {x.size} values are not whole rows of {n}")
    rows = np.ascontiguousarray(x).reshape(-1, n)
    out = np.empty_like(rows)
    _fwht_rows(rows, n, hadamard_scale(n), out)
    return out.reshape(x.shape)


def mul_mat_hadamard(x: np.ndarray, n: int) -> np.ndarray:
    """llama.cpp's `llama_mul_mat_hadamard(cur, rot)` with rot of size n on
    the CPU: cur (float32, C order: the last axis is ggml's ne[0]) taken as
    rows of n consecutive values, rotated by `fwht`, in cur's shape."""
    return fwht(np.ascontiguousarray(x, np.float32), n)
