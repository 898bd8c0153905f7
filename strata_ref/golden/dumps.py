"""Another engine's dump of a tensor's rows against the oracle
(`strata-ref compare`): equal bits or not, both FNV-1a 64, the differing
values, their ulp distances and where they sit in the block."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..hashing import fnv1a64
from ..types import block_format

__all__ = ["compare_dump"]

_BITS = {"f32": np.dtype("<u4"), "f16": np.dtype("<u2"), "bf16": np.dtype("<u2")}


def _ordered(bits: np.ndarray, width: int) -> np.ndarray:
    """Monotone integer line of float bit patterns (+0 and -0 coincide)."""
    u = bits.astype(np.int64)
    sign = np.int64(1) << (width - 1)
    return np.where(u & sign, -(u & (sign - 1)), u)


def _is_inf_bits(bits: np.ndarray, kind: str) -> np.ndarray:
    """+-inf in IEEE binary32 / binary16 / bfloat16 bit patterns."""
    return (bits & {"f32": 0x7FFFFFFF, "f16": 0x7FFF}.get(kind, 0x7FFF)) == \
        {"f32": 0x7F800000, "f16": 0x7C00}.get(kind, 0x7F80)


def _is_nan_bits(bits: np.ndarray, kind: str) -> np.ndarray:
    if kind == "f32":
        return (bits & 0x7FFFFFFF) > 0x7F800000
    if kind == "f16":
        return (bits & 0x7FFF) > 0x7C00
    return (bits & 0x7FFF) > 0x7F80


def _canon_bits(bits: np.ndarray, kind: str) -> np.ndarray:
    out = bits.copy()
    out[_is_nan_bits(bits, kind)] = 0x7FFFFFFF if kind == "f32" else 0x7FFF
    return out


def _bits_to_float(b: int, kind: str) -> float:
    if kind == "f32":
        return float(np.array([b], "<u4").view("<f4")[0])
    if kind == "f16":
        return float(np.array([b], "<u2").view("<f2")[0])
    return float(np.array([b << 16], "<u4").view("<f4")[0])


def _dump_layouts(n_bytes: int, cols: int, ld: int, max_rows: int) -> list[tuple[str, int]]:
    """Every (dtype, rows) for which a dump of `n_bytes` bytes holds exactly
    `rows` rows (1 <= rows <= max_rows) of `cols` values `ld` apart, padded
    after the last row or not."""
    fits = []
    for d, bits in _BITS.items():
        if n_bytes % bits.itemsize:
            continue
        n = n_bytes // bits.itemsize
        for r in dict.fromkeys(([n // ld] if n % ld == 0 else [])
                               + ([(n - cols) // ld + 1] if n >= cols and (n - cols) % ld == 0
                                  else [])):
            if 1 <= r <= max_rows:
                fits.append((d, r))
    return fits


def _read_dump(dump_path, sizes: tuple[int, ...], describe) -> bytes:
    """Exactly the bytes of the dump file when its size is one of `sizes`.

    The file is opened without blocking (a FIFO with no writer would wait
    forever) and must be a regular file, whose size is known before any
    byte is read: nothing is read unless the size fits, so a device such as
    /dev/zero or a huge file costs nothing. `describe(n_bytes)` gives the
    error for a size that does not fit. Raises ValueError."""
    import os
    import stat
    try:
        fd = os.open(dump_path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ValueError(f"cannot read the dump {dump_path}: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError(f"the dump {dump_path} is not a regular file (a pipe, device "
                         f"or directory): write the dump to a file first")
    with os.fdopen(fd, "rb", buffering=0) as f:
        if st.st_size == 0:
            raise ValueError(f"the dump {dump_path} is empty")
        if st.st_size not in sizes:
            raise ValueError(describe(st.st_size))
        raw = f.read(st.st_size)
        if len(raw) != st.st_size or f.read(1):
            raise ValueError(f"the dump {dump_path} changed size while it was read")
    return raw


def compare_dump(gguf_path, tensor_name: str, dump_path=None, dtype: str = "f32",
                 row0: int = 0, rows: int | None = None, ld: int | None = None,
                 hash_hex: str | None = None, n_worst: int = 5) -> dict:
    """Compare another engine's raw output of one tensor with the oracle.

    gguf_path: the GGUF file (or a registry model name); tensor_name: a
    tensor in it. The rows compared are [row0, row0 + rows), rows defaulting
    to every row from row0 to the end of the tensor. dump_path: a raw
    little-endian file of `dtype` values ("f32", "f16", "bf16") holding
    exactly those rows, row r starting at value r*ld (ld >= cols, default
    cols): rows*ld or (rows-1)*ld + cols values, nothing more or less (a dump
    of another size is refused before it is read, with the row counts and
    dtypes its size would fit). hash_hex: compare the oracle's FNV-1a 64
    of those rows with this hex string instead of a dump.

    Equality is on canonical bits: any NaN equals any NaN (the oracle's NaN
    policy, DESIGN.md); NaNs with other encodings are counted separately in
    "nan_encoding_diffs". Returns a dict: equal, fnv_oracle, fnv_dump (hex,
    canonical bytes), n_values, n_diff, first_diff (index, row, col, both
    values and bit patterns) or None, max_ulp (over pairs of numbers; None if
    no numeric pair differs), nan_vs_number (pairs where one side is NaN),
    inf_vs_finite (differing pairs of numbers where one side is +-inf),
    worst (the `n_worst` largest ulp distances, largest first: index, row,
    col, block and offset in the tensor type's block, both values, ulps),
    also_fits (other (dtype, rows) the dump's size would hold, a hint when
    the values differ).
    Raises ValueError for an unknown tensor, a bad dtype, a dump that is not
    a regular file or whose size does not fit, rows beyond the tensor, an
    empty tensor or one of a plain integer type (GGUFError, a ValueError,
    for a malformed file); models.ModelError for a name that is neither a
    file nor a cached registry model.
    """
    from ..dequant import dequant
    from ..gguf import read
    from ..models import resolve
    from ..types import PLAIN_TYPES
    if dtype not in _BITS:
        raise ValueError(f"dtype must be f32, f16 or bf16, got {dtype!r}")
    path = Path(gguf_path)
    if not path.is_file():      # a registry name: only a cached copy, never a download here
        path = resolve(gguf_path, fetch_missing=False)
    f = read(path)
    try:
        t = f.tensor(tensor_name)
    except KeyError:
        if not f.tensors:
            raise ValueError(f"no tensor {tensor_name!r} in {path.name}: it has no tensors") from None
        names = ", ".join(repr(x.name) for x in f.tensors[:5])
        more = ", …" if len(f.tensors) > 5 else ""
        raise ValueError(f"no tensor {tensor_name!r} in {path.name} (tensors: {names}{more})") from None
    if t.type in PLAIN_TYPES:
        raise ValueError(f"tensor {tensor_name!r} is {t.type.name}, a plain array of "
                         f"{block_format(t.type).field('v').kind} values, not a float format: "
                         "there is no f32/f16/bf16 output to compare")
    if t.n_elements == 0:
        raise ValueError(f"tensor {tensor_name!r} is empty (shape {list(t.shape)}): "
                         "there is nothing to compare")
    cols = t.cols
    for name, v in (("row0", row0), ("rows", rows), ("ld", ld)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise ValueError(f"{name} must be an integer, got {v!r}")
    ld = cols if ld is None else int(ld)
    if ld < cols:
        raise ValueError(f"ld={ld} is smaller than the tensor's {cols} columns")
    if row0 < 0 or row0 >= t.rows:
        raise ValueError(f"row0={row0} is outside the tensor's {t.rows} rows")
    if rows is None:
        rows = t.rows - row0
    if rows < 1:
        raise ValueError(f"rows={rows}: at least one row is needed")
    if row0 + rows > t.rows:
        raise ValueError(f"rows [{row0}, {row0 + rows}) are outside the tensor's {t.rows} rows")
    bits_dt = _BITS[dtype]
    dump = None
    if hash_hex is not None:
        if dump_path is not None:
            raise ValueError("give either a dump file or --hash, not both")
        try:
            want_hash = int(str(hash_hex).lower().removeprefix("0x"), 16)
        except ValueError:
            raise ValueError(f"--hash {hash_hex!r} is not a hexadecimal FNV-1a 64 value") from None
        if want_hash < 0:
            raise ValueError(f"--hash {hash_hex!r} is negative; give the unsigned hex value")
        if want_hash >= 1 << 64:
            raise ValueError(f"--hash {hash_hex!r} is wider than 64 bits")
        if ld != cols:
            raise ValueError("--ld describes a dump's layout; it has no meaning with --hash")
    also_fits = []
    if hash_hex is None:
        if dump_path is None:
            raise ValueError("give a dump file or a hash to compare against")
        isz = bits_dt.itemsize
        tight, padded = ((rows - 1) * ld + cols) * isz, rows * ld * isz

        def describe(n_bytes):
            msg = (f"the dump {dump_path} has {n_bytes} bytes, but rows [{row0}, {row0 + rows}) "
                   f"of {tensor_name!r} in {dtype} take {tight} bytes ({cols} values a row"
                   + (f", ld {ld}; {padded} bytes with the padding after the last row)"
                      if ld != cols else ")"))
            fits = _dump_layouts(n_bytes, cols, ld, t.rows - row0)
            hints = [f"--dtype {d}" + (f" --rows {r}" if r != rows else "") for d, r in fits
                     if (d, r) != (dtype, rows)]
            if hints:
                msg += "; its size fits " + " or ".join(hints)
            elif n_bytes % isz:
                msg += f"; that is not a whole number of {dtype} values"
            return msg
        raw = _read_dump(dump_path, (tight, padded), describe)
        dump = np.frombuffer(raw, bits_dt)
        also_fits = [{"dtype": d, "rows": r}
                     for d, r in _dump_layouts(len(raw), cols, ld, t.rows - row0)
                     if (d, r) != (dtype, rows)]
    ref = dequant(t.type, t.data, rows, cols, row0=row0, out_dtype=dtype)
    ref_bits = _canon_bits(np.ascontiguousarray(ref).view(bits_dt).reshape(rows, cols), dtype)
    fnv_ref = fnv1a64(ref_bits.view(np.uint8).reshape(-1))
    report = {"file": path.name, "tensor": tensor_name, "type": t.type.name, "dtype": dtype,
              "row0": row0, "rows": rows, "cols": cols, "ld": ld,
              "n_values": rows * cols, "fnv_oracle": f"{fnv_ref:016x}", "also_fits": also_fits}
    if dump is None:
        report.update(equal=want_hash == fnv_ref, fnv_dump=f"{want_hash:016x}", n_diff=None,
                      first_diff=None, max_ulp=None, nan_vs_number=None, nan_encoding_diffs=None,
                      inf_vs_finite=None, worst=[])
        return report
    got_raw = np.lib.stride_tricks.as_strided(dump, (rows, cols), (ld * bits_dt.itemsize, bits_dt.itemsize))
    got_raw = np.ascontiguousarray(got_raw)
    got = _canon_bits(got_raw, dtype)
    width = 8 * bits_dt.itemsize
    diff = got != ref_bits
    nan_g, nan_r = _is_nan_bits(got, dtype), _is_nan_bits(ref_bits, dtype)
    both_num = diff & ~nan_g & ~nan_r
    n_diff = int(diff.sum())
    report.update(equal=n_diff == 0, fnv_dump=f"{fnv1a64(got.view(np.uint8).reshape(-1)):016x}",
                  n_diff=n_diff, nan_vs_number=int((diff & (nan_g ^ nan_r)).sum()),
                  nan_encoding_diffs=int(((got_raw != ref_bits) & nan_g & nan_r).sum()),
                  inf_vs_finite=int((both_num & (_is_inf_bits(got, dtype) | _is_inf_bits(ref_bits, dtype))).sum()))
    if both_num.any():
        ulp = np.abs(_ordered(got[both_num], width) - _ordered(ref_bits[both_num], width))
        report["max_ulp"] = int(ulp.max())
        from ..ulp import worst
        qk = block_format(t.type).block_values
        report["worst"] = []
        for i, u in worst(ulp, np.flatnonzero(both_num.reshape(-1)), n_worst):
            r, c = divmod(i, cols)
            report["worst"].append({"index": i, "row": row0 + r, "col": c, "block": c // qk,
                                    "offset": c % qk, "ulps": u,
                                    "oracle": _bits_to_float(int(ref_bits[r, c]), dtype),
                                    "dump": _bits_to_float(int(got_raw[r, c]), dtype)})
    else:
        report["max_ulp"] = None
        report["worst"] = []
    if n_diff:
        i = int(np.flatnonzero(diff.reshape(-1))[0])
        r, c = divmod(i, cols)
        gb, rb = int(got_raw[r, c]), int(ref_bits[r, c])
        report["first_diff"] = {"index": i, "row": row0 + r, "col": c,
                                "oracle": _bits_to_float(rb, dtype), "dump": _bits_to_float(gb, dtype),
                                "oracle_bits": f"0x{rb:0{width // 4}x}", "dump_bits": f"0x{gb:0{width // 4}x}"}
    else:
        report["first_diff"] = None
    return report
