"""`quantize(x, t)`: ggml's reference quantizers, bit for bit.

Semantics are those of ggml's `quantize_row_<type>_ref` (what
`ggml_quantize_chunk` runs when no importance matrix is given), from
ggml-org/ggml src/ggml-quants.c and src/ggml-impl.h @ d99724f2, in the
*portable* build: float32 arithmetic in C statement order with no FMA
contraction (ggml-base on x86-64 without -march). Builds that contract
(aarch64 GCC, -march=native) give other bytes for the K- and I-quants and
Q5_0 (../shared/spec/formats.md §8); strata-ref pins the portable build.
"""
from __future__ import annotations

import numpy as np

from .types import GGMLType, UnsupportedTypeError, block_format, parse_type

__all__ = ["quantize"]

# ggml's reasons for having no reference quantizer (spec/formats.md §3, §8).
_NO_REF = {
    GGMLType.IQ2_XXS: "ggml_quantize_requires_imatrix() is true for it",
    GGMLType.IQ2_XS: "ggml_quantize_requires_imatrix() is true for it",
    GGMLType.IQ1_S: "ggml_quantize_requires_imatrix() is true for it",
    GGMLType.IQ1_M: "ggml has no quantize_row_iq1_m_ref (it is only made with an importance matrix)",
    GGMLType.F32: "F32 is stored as is; there is nothing to quantize",
}

# float16, float32, float64 in either byte order
_ACCEPTED_SIZES = (2, 4, 8)


def _load_quantizers() -> None:
    # Importing a module registers its quantizers with strata_ref.formats.
    import importlib
    from ._env import check_numba_env
    check_numba_env()           # before numba is first imported
    from .formats import legacy_quant, kquants_quant, small_quant  # noqa: F401
    try:    # the I-quant quantizers live in their own module
        importlib.import_module(".formats.iquants_quant", __package__)
    except ImportError:
        pass


def _quantizer(t: GGMLType):
    from .formats import get_quantizer
    _load_quantizers()
    if t in _NO_REF:
        raise UnsupportedTypeError(f"no reference quantizer for {t.name}: {_NO_REF[t]}")
    return get_quantizer(t)


def _raise_nonfinite(tt: GGMLType, a: np.ndarray, a32: np.ndarray, flat: int):
    where = np.unravel_index(flat, a32.shape)
    v = a32.reshape(-1)[flat]
    what = "NaN" if np.isnan(v) else "Inf"
    extra = (" (float64 input outside the float32 range becomes Inf)"
             if a.dtype.itemsize == 8 and what == "Inf" and np.isfinite(a.reshape(-1)[flat])
             else "")
    raise ValueError(f"quantize({tt.name}): x[{', '.join(map(str, where))}] is {what}{extra}; "
                     f"ggml's {tt.name} quantizer has no defined result for NaN/Inf input") from None


def quantize(x, t) -> np.ndarray:
    """Quantize float values to ggml type `t` with ggml's reference quantizer.

    Parameters
    ----------
    x : array_like of float16, float32 or float64 (either byte order), 1-D
        (one row) or 2-D (rows, n_per_row). float64 is first rounded to float32 (RNE), as a C
        caller would; ggml's quantizers take float32. The row length must be a
        whole number of blocks (QK = `block_format(t).block_values`: 32 for
        the legacy types, MXFP4 and IQ4_NL; 64 for NVFP4 and Q2_0; 128 for
        Q1_0; 256 for K-, I- and ternary quants; 1 for F16/BF16).
    t : GGMLType, ggml type id or name ("Q4_K").

    Returns
    -------
    numpy.ndarray of uint8: the blocks as stored in a GGUF tensor, shape
    (n_blocks * B,) for 1-D input and (rows, n_blocks_per_row * B) for 2-D,
    B = `block_format(t).block_bytes`.

    Supported types: F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K,
    Q4_K, Q5_K, Q6_K, Q8_K, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0, and the
    I-quants ggml quantizes without an importance matrix (IQ3_XXS, IQ3_S,
    IQ2_S, IQ4_NL, IQ4_XS) when their module is installed. IQ2_XXS, IQ2_XS and
    IQ1_S need an importance matrix in ggml and IQ1_M has no `_ref` function:
    they raise UnsupportedTypeError, as do F32, integer and removed types.

    Non-finite input
    ----------------
    F16 and BF16 convert every value, NaN and ±Inf included, by ggml's rules
    (f16: NaN -> sign | 0x7E00, |x| >= 65520 -> ±Inf; bf16: NaN -> (u >> 16) |
    0x40). For every block type, NaN or ±Inf in x raises ValueError naming
    the first such position: ggml's C converts NaN and out-of-range floats to
    integers there, which is undefined behaviour in C and gives
    compiler-dependent bytes. Finite inputs whose intermediates overflow
    (e.g. tiny blocks where 1/d is +Inf) are reproduced as the portable x86-64
    build computes them (truncating conversions give INT32_MIN, `lroundf` gives
    LONG_MIN), which gguf-py also matches.

    Notes on exact C behaviour kept here: scans start from 0.0f or ±FLT_MAX
    and keep the first hit (so an all-zero Q4_0 block starting with -0.0 has
    d = -0.0 bits 0x8000, and Q4_1's m keeps a first -0.0; gguf-py differs
    there); `nearest_int` rounds half to even, `roundf`/`lroundf` half away
    from zero. Q8_K's C code leaves `bsums` untouched for an all-zero block;
    here they are zero.

    Raises
    ------
    TypeError   x is not a float16/float32/float64 array (e.g. int, bool, complex).
    ValueError  x is not 1-D or 2-D, its row length is not a multiple of QK,
                or a block type gets NaN/Inf.
    UnsupportedTypeError (a ValueError)  unknown or removed type, or one without
                a reference quantizer.
    """
    tt = parse_type(t)
    return quantize_with(x, tt, lambda: _quantizer(tt))


def quantize_with(x, t, blocks_fn) -> np.ndarray:
    """`quantize`'s checks, conversions, errors and shapes around another
    block quantizer of type t: `blocks_fn()` returns a function from
    float32 (n, QK) to uint8 (n, B) (with a `checks_finite` attribute when
    it takes `check_finite=True` and raises `NonFiniteInput` itself);
    `strata_ref.cpu.base_quant` gives the contracted ones."""
    tt = parse_type(t)
    fmt = block_format(tt)
    a = np.asarray(x)
    if a.dtype.kind != "f" or a.dtype.itemsize not in _ACCEPTED_SIZES:
        raise TypeError(f"quantize({tt.name}): x must hold float16, float32 or float64 "
                        f"values, got dtype {a.dtype}")
    if a.ndim not in (1, 2):
        raise ValueError(f"quantize({tt.name}): x must be 1-D or 2-D, got shape {a.shape}")
    fn = blocks_fn()
    from .formats._qdrive import NonFiniteInput, first_nonfinite
    qk = fmt.block_values
    n = a.shape[-1]
    if n % qk:
        raise ValueError(f"quantize({tt.name}): row length {n} is not a multiple of the "
                         f"block size {qk} ({n // qk} whole blocks and {n % qk} values left)")
    with np.errstate(over="ignore"):
        a32 = np.ascontiguousarray(a, dtype=np.float32)
    if not fmt.quantized:
        blocks = fn(a32.reshape(-1, qk))
    elif getattr(fn, "checks_finite", False):
        # the block loop checks each block as it reads it (no extra pass)
        try:
            blocks = fn(a32.reshape(-1, qk), check_finite=True)
        except NonFiniteInput as e:
            _raise_nonfinite(tt, a, a32, e.index)
    else:
        flat = first_nonfinite(a32)
        if flat >= 0:
            _raise_nonfinite(tt, a, a32, flat)
        blocks = fn(a32.reshape(-1, qk))
    rows = a32.shape[0] if a32.ndim == 2 else None
    if rows is None:
        return blocks.reshape(-1)
    return blocks.reshape(rows, (n // qk) * fmt.block_bytes)
