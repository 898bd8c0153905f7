"""The kernel-shaped dequant API: the NumPy/numba oracle behind every kernel.

`dequant_f32 / dequant_f16 / dequant_bf16(type, blocks, rows, cols, row0=0,
ld=None, out=None)` mirror the native entry point of
../shared/spec/kernels.md §2: `blocks` holds the quantized tensor from row 0,
output row r (0 <= r < rows) is tensor row `row0 + r`, and value c of it goes
to `out[r, c]` of an output whose rows are `ld` elements apart. Columns
`[cols, ld)` of a caller's `out` are never written.

Every value is the f32 value of ../shared/spec/formats.md §5; f16 outputs are
its round-to-nearest-even half (`__float2half_rn`), bf16 outputs ggml's bf16
rule; NaNs are canonical (f32 0x7FFFFFFF, f16 0x7FFF, bf16 0x7FFF).
"""
from __future__ import annotations

import numpy as np

from . import numerics
from .formats import dequantize_blocks
from .types import (PLAIN_TYPES, GGMLType, UnsupportedTypeError, block_format,
                    parse_type)

__all__ = ["dequant_f32", "dequant_f16", "dequant_bf16", "dequant", "dequantize",
           "OUT_DTYPES", "as_bytes"]

#: numpy dtype of each output kind.
OUT_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16),
              "bf16": numerics.bfloat16}


def as_bytes(raw) -> np.ndarray:
    """A 1-D uint8 view (no copy) of bytes, bytearray, memoryview or an array.

    Raises TypeError for anything else."""
    if isinstance(raw, np.ndarray):
        if raw.dtype != np.uint8:
            raise TypeError(f"expected uint8 block bytes, got an array of {raw.dtype}")
        return raw.reshape(-1)
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return np.frombuffer(raw, dtype=np.uint8)
    raise TypeError(f"expected bytes or a uint8 array, got {type(raw).__name__}")


_PLAIN_FLOAT = {GGMLType.F32: ("f32", "<u4"), GGMLType.F16: ("f16", "<u2"),
                GGMLType.BF16: ("bf16", "<u2")}


def _check_int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {v!r}")
    v = int(v)
    if v < lo:
        raise ValueError(f"{name}={v} must be >= {lo}")
    return v


def _out_view(out, kind: str, rows: int, cols: int, ld: int) -> tuple[np.ndarray, np.ndarray]:
    """(whole out array, strided (rows, cols) view of the values to write)."""
    dt = OUT_DTYPES[kind]
    if out is None:
        try:
            full = np.zeros((rows, ld), dt) if ld > cols else np.empty((rows, ld), dt)
        except (ValueError, MemoryError) as e:      # an absurd ld
            raise ValueError(f"an output of rows={rows} x ld={ld} {kind} values cannot be "
                             f"allocated ({e})") from None
        return full, full[:, :cols]
    if not isinstance(out, np.ndarray) or out.dtype != dt:
        got = out.dtype if isinstance(out, np.ndarray) else type(out).__name__
        raise TypeError(f"out must be a {dt} numpy array for {kind} output, got {got}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    if out.ndim == 2:
        if out.shape[0] < rows or out.shape[1] != ld:
            raise ValueError(f"out has shape {out.shape}; need ({rows}, ld={ld})")
        return out, out[:rows, :cols]
    if out.ndim == 1:
        need = (rows - 1) * ld + cols if rows else 0
        if out.size < need or not out.flags.c_contiguous:
            raise ValueError(f"flat out holds {out.size} values; rows={rows}, "
                             f"cols={cols}, ld={ld} need {need} contiguous values")
        view = np.lib.stride_tricks.as_strided(
            out, shape=(rows, cols), strides=(ld * dt.itemsize, dt.itemsize), writeable=True)
        return out, view
    raise ValueError(f"out must be 1-D or 2-D, got {out.ndim} dimensions")


def dequant(t, blocks, rows: int, cols: int, row0: int = 0, ld: int | None = None,
            out: np.ndarray | None = None, out_dtype: str = "f32") -> np.ndarray:
    """Dequantize rows `[row0, row0 + rows)` of a tensor of `cols` columns.

    t: GGMLType, id or name. blocks: bytes or uint8 array holding the tensor
    from row 0 (whole blocks). rows, cols: output shape; cols a multiple of the
    block size QK. ld: output row stride in elements (>= cols, default cols).
    out: optional output (2-D (>= rows, ld) or flat contiguous) of the output
    dtype; its columns [cols, ld) are left untouched. out_dtype: "f32", "f16"
    or "bf16" (float32, float16, ml_dtypes.bfloat16).

    Returns `out` (or a new (rows, ld) array, zero padding beyond cols).
    Raises ValueError (with the numbers) when cols is not a multiple of QK, the
    row range is beyond the tensor, ld < cols, or the byte count is not whole
    blocks; UnsupportedTypeError for removed/unknown types and plain integer
    types; TypeError for wrong argument types.
    """
    tt = parse_type(t)
    fmt = block_format(tt)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of f32, f16, bf16, got {out_dtype!r}")
    if tt in PLAIN_TYPES:
        raise UnsupportedTypeError(
            f"{tt.name} is a plain {fmt.field('v').kind} array, not a float format; "
            "use strata_ref.dequantize(raw, t) to read it")
    raw = as_bytes(blocks)
    rows = _check_int("rows", rows, 0)
    cols = _check_int("cols", cols, 1)
    row0 = _check_int("row0", row0, 0)
    ld = cols if ld is None else _check_int("ld", ld, 1)
    qk, bb = fmt.block_values, fmt.block_bytes
    if cols % qk:
        raise ValueError(f"cols={cols} is not a multiple of the {tt.name} block size {qk}")
    if ld < cols:
        raise ValueError(f"ld={ld} is smaller than cols={cols}")
    if raw.size % bb:
        raise ValueError(f"{raw.size} bytes is not a whole number of {tt.name} "
                         f"blocks of {bb} bytes")
    row_bytes = cols // qk * bb
    n_rows = raw.size // row_bytes
    if row0 + rows > n_rows:
        raise ValueError(f"rows [{row0}, {row0 + rows}) are beyond the tensor's "
                         f"{n_rows} rows ({raw.size} bytes, {row_bytes} bytes per row)")
    full, view = _out_view(out, out_dtype, rows, cols, ld)
    if rows == 0:
        return full
    src = raw[row0 * row_bytes:(row0 + rows) * row_bytes]
    direct = out_dtype == "f32"
    f32 = view if direct else np.empty((rows, cols), np.float32)
    if not fmt.quantized:
        kind, bits = _PLAIN_FLOAT[tt]
        numerics.widen_to_f32(kind, src.view(bits).reshape(rows, cols), f32.view(np.uint32))
    else:
        nb = cols // qk
        b3 = src.reshape(rows, nb, bb)
        o3 = np.lib.stride_tricks.as_strided(
            f32, shape=(rows, nb, qk),
            strides=(f32.strides[0], qk * f32.strides[1], f32.strides[1]), writeable=True)
        # a caller's out may be streamed to; one allocated here is in cache
        dequantize_blocks(tt, b3, o3, stream=out is not None and direct)
    if not direct:
        conv = numerics.f32_to_f16_bits if out_dtype == "f16" else numerics.f32_to_bf16_bits
        view.view(np.uint16)[...] = conv(f32)
    return full


def dequant_f32(t, blocks, rows, cols, row0=0, ld=None, out=None) -> np.ndarray:
    """float32 output of `dequant` (see there for arguments and errors)."""
    return dequant(t, blocks, rows, cols, row0, ld, out, "f32")


def dequant_f16(t, blocks, rows, cols, row0=0, ld=None, out=None) -> np.ndarray:
    """float16 output (RNE of the f32 value, NaN 0x7FFF) of `dequant`."""
    return dequant(t, blocks, rows, cols, row0, ld, out, "f16")


def dequant_bf16(t, blocks, rows, cols, row0=0, ld=None, out=None) -> np.ndarray:
    """ml_dtypes.bfloat16 output (ggml's bf16 rule of the f32 value) of `dequant`."""
    return dequant(t, blocks, rows, cols, row0, ld, out, "bf16")


def dequantize(raw, t, out: str = "f32") -> np.ndarray:
    """Dequantize whole blocks to a 1-D array.

    raw: bytes or uint8 array of whole blocks of type `t`. out: "f32", "f16"
    or "bf16". Returns float32, float16 or ml_dtypes.bfloat16 values (n =
    blocks * QK). The plain types I8, I16, I32, I64 and F64 are returned in
    their own dtype (little-endian), and `out` must be left at "f32" for them.
    Raises ValueError if raw is not whole blocks or `out` is not one of the
    three names (checked first, whatever raw holds), UnsupportedTypeError for
    removed or unknown types.
    """
    if not isinstance(out, str) or out not in OUT_DTYPES:
        raise ValueError(f"out must be one of f32, f16, bf16, got {out!r}")
    tt = parse_type(t)
    fmt = block_format(tt)
    b = as_bytes(raw)
    if b.size % fmt.block_bytes:
        raise ValueError(f"{b.size} bytes is not a whole number of {tt.name} "
                         f"blocks of {fmt.block_bytes} bytes")
    if tt in PLAIN_TYPES:
        if out != "f32":
            raise ValueError(f"{tt.name} is a plain array; out={out!r} does not apply")
        return b.view(fmt.field("v").dtype).copy()
    n = b.size // fmt.block_bytes
    if n == 0:
        return np.empty(0, OUT_DTYPES[out])
    return dequant(tt, b, 1, n * fmt.block_values, out_dtype=out).reshape(-1)
