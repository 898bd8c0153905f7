"""ctypes wrapper for ggml's C library (`libggml-base.so`): the C oracle.

Loads a ggml-base shared library by path, without importing llama_cpp, and
exposes the calls strata-ref checks itself against (../shared/spec/models.md
§8): the type traits (`ggml_get_type_traits`), `to_float`, the reference
quantizers (`from_float_ref`, `ggml_quantize_chunk`), `ggml_row_size`,
`ggml_quantize_requires_imatrix` and `ggml_validate_row_data`.

Where the library comes from (first hit wins):
1. the environment variable STRATA_REF_GGML_LIB (a path to the .so);
2. the portable build made by tools/ggml_vectors.py --build, in
   ~/.cache/strata-ref/ggml/build/src/libggml-base.so (docs/ggml-vectors.md);
3. the copy inside an installed llama-cpp-python (`llama_cpp/lib/`).
The third is a native build (it may contract FMAs), so quantizer outputs of
K- and I-quants can differ from the portable build (spec/formats.md §8);
`to_float` cannot (§6).

Every argument is checked in Python before it reaches C, because a failed
GGML_ASSERT aborts the whole process.
"""
from __future__ import annotations

import ctypes as C
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["GGML", "TypeTraits", "find_library", "load", "CACHE_DIR",
           "ENV_LIB", "GGML_TYPE_COUNT"]

ENV_LIB = "STRATA_REF_GGML_LIB"
CACHE_DIR = Path.home() / ".cache" / "strata-ref" / "ggml"
GGML_TYPE_COUNT = 43

# Ids of ggml's enum that the C library still defines (removed ids are holes).
_REMOVED = {4, 5, 31, 32, 33, 36, 37, 38}
_Q8_K = 15
_IQ1_M = 29

_to_float_t = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)
_from_float_t = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)


class _CTraits(C.Structure):
    # struct ggml_type_traits, include/ggml.h (llama-cpp-python 0.3.36,
    # ggml 0.25.3). Checked against ggml_blck_size/ggml_type_size on load.
    _fields_ = [
        ("type_name", C.c_char_p),
        ("blck_size", C.c_int64),
        ("blck_size_interleave", C.c_int64),
        ("type_size", C.c_size_t),
        ("is_quantized", C.c_bool),
        ("to_float", C.c_void_p),
        ("from_float_ref", C.c_void_p),
    ]


@dataclass(frozen=True)
class TypeTraits:
    """One type's traits as ggml reports them. to_float / from_float_ref are
    raw function addresses (0 when ggml has none)."""
    type_id: int
    name: str
    blck_size: int
    type_size: int
    is_quantized: bool
    to_float: int
    from_float_ref: int


def find_library() -> Path | None:
    """Path of a ggml-base shared library, or None (see the module doc)."""
    env = os.environ.get(ENV_LIB)
    if env:
        return Path(env)
    built = CACHE_DIR / "build" / "src" / "libggml-base.so"
    if built.is_file():
        return built
    spec = importlib.util.find_spec("llama_cpp")
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            cand = Path(d) / "lib" / "libggml-base.so"
            if cand.is_file():
                return cand
    return None


def _as_f32_rows(x, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"{what}: expected float32 input, got {a.dtype}")
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2:
        raise ValueError(f"{what}: expected 1-D or 2-D input, got {a.ndim} dimensions")
    return np.ascontiguousarray(a)


class GGML:
    """A loaded ggml-base library. Type arguments are ggml type ids (ints)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no ggml library at {self.path}")
        lib = C.CDLL(str(self.path))
        self._lib = lib
        lib.ggml_get_type_traits.restype = C.POINTER(_CTraits)
        lib.ggml_get_type_traits.argtypes = [C.c_int]
        lib.ggml_blck_size.restype = C.c_int64
        lib.ggml_blck_size.argtypes = [C.c_int]
        lib.ggml_type_size.restype = C.c_size_t
        lib.ggml_type_size.argtypes = [C.c_int]
        lib.ggml_row_size.restype = C.c_size_t
        lib.ggml_row_size.argtypes = [C.c_int, C.c_int64]
        lib.ggml_quantize_requires_imatrix.restype = C.c_bool
        lib.ggml_quantize_requires_imatrix.argtypes = [C.c_int]
        lib.ggml_validate_row_data.restype = C.c_bool
        lib.ggml_validate_row_data.argtypes = [C.c_int, C.c_void_p, C.c_size_t]
        lib.ggml_quantize_init.restype = None
        lib.ggml_quantize_init.argtypes = [C.c_int]
        lib.ggml_quantize_chunk.restype = C.c_size_t
        lib.ggml_quantize_chunk.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64,
                                            C.c_int64, C.c_int64, C.c_void_p]
        # Q8_K has neither to_float nor from_float_ref in its traits, but the
        # row functions are exported (spec/formats.md §3 note 1).
        self._q8k_deq = _to_float_t(("dequantize_row_q8_K", lib))
        self._q8k_ref = _from_float_t(("quantize_row_q8_K_ref", lib))
        self._traits: dict[int, TypeTraits] = {}
        for t in range(GGML_TYPE_COUNT):
            if t not in _REMOVED:
                self._traits[t] = self._read_traits(t)

    def _read_traits(self, t: int) -> TypeTraits:
        p = self._lib.ggml_get_type_traits(t)
        s = p.contents
        tr = TypeTraits(t, (s.type_name or b"").decode(), int(s.blck_size),
                        int(s.type_size), bool(s.is_quantized),
                        int(s.to_float or 0), int(s.from_float_ref or 0))
        bs, ts = int(self._lib.ggml_blck_size(t)), int(self._lib.ggml_type_size(t))
        if (tr.blck_size, tr.type_size) != (bs, ts):
            raise RuntimeError(
                f"{self.path}: struct ggml_type_traits layout mismatch for type {t}: "
                f"traits say blck_size={tr.blck_size}, type_size={tr.type_size}; "
                f"ggml_blck_size/ggml_type_size say {bs}, {ts}")
        return tr

    # ---- metadata -------------------------------------------------------
    def traits(self, t: int) -> TypeTraits:
        """Traits of type id `t`; ValueError for removed or unknown ids."""
        if t not in self._traits:
            raise ValueError(f"ggml type id {t} is removed or unknown")
        return self._traits[t]

    def row_size(self, t: int, n: int) -> int:
        """`ggml_row_size(t, n)`: bytes of n values (n a multiple of QK)."""
        tr = self.traits(t)
        if n < 0 or n % tr.blck_size:
            raise ValueError(f"{tr.name}: n={n} is not a multiple of {tr.blck_size}")
        return int(self._lib.ggml_row_size(t, n))

    def requires_imatrix(self, t: int) -> bool:
        """`ggml_quantize_requires_imatrix(t)`."""
        self.traits(t)
        return bool(self._lib.ggml_quantize_requires_imatrix(t))

    def validate_row_data(self, t: int, data) -> bool:
        """`ggml_validate_row_data(t, data, nbytes)`: True for valid data.
        (ggml prints the first invalid value to stderr.)"""
        tr = self.traits(t)
        buf = np.ascontiguousarray(np.frombuffer(bytes(data), np.uint8))
        if buf.size % tr.type_size:
            raise ValueError(f"{tr.name}: {buf.size} bytes is not whole blocks of {tr.type_size}")
        return bool(self._lib.ggml_validate_row_data(t, buf.ctypes.data, buf.size))

    def init_quantizer(self, t: int) -> None:
        """`ggml_quantize_init(t)`: build the I-quant search tables once (IQ1_M
        takes tens of seconds); later quantizer calls reuse them."""
        self.traits(t)
        self._lib.ggml_quantize_init(t)

    def has_to_float(self, t: int) -> bool:
        return t == _Q8_K or self.traits(t).to_float != 0

    def quantizes(self, t: int) -> bool:
        """True when ggml quantizes `t` without an importance matrix."""
        tr = self.traits(t)
        if self.requires_imatrix(t):
            return False
        return tr.from_float_ref != 0 or t in (_Q8_K, _IQ1_M)

    # ---- conversions ----------------------------------------------------
    def to_float(self, t: int, raw) -> np.ndarray:
        """ggml's `to_float` of whole blocks -> float32 (NaN payloads as C
        leaves them). For Q8_K, `dequantize_row_q8_K`. Raises ValueError when
        ggml has no dequantizer or raw is not whole blocks."""
        tr = self.traits(t)
        buf = np.ascontiguousarray(np.frombuffer(bytes(raw), np.uint8))
        if buf.size % tr.type_size:
            raise ValueError(f"{tr.name}: {buf.size} bytes is not whole blocks of {tr.type_size}")
        n = buf.size // tr.type_size * tr.blck_size
        out = np.empty(n, np.float32)
        if n == 0:
            return out
        if t == _Q8_K:
            fn = self._q8k_deq
        elif tr.to_float:
            fn = _to_float_t(tr.to_float)
        else:
            raise ValueError(f"ggml has no to_float for {tr.name}")
        fn(buf.ctypes.data, out.ctypes.data, n)
        return out

    def quantize_ref(self, t: int, x) -> np.ndarray:
        """`from_float_ref` (`quantize_row_*_ref`) of each row of x.

        x: float32 (n,) or (rows, n), n a multiple of QK. Returns uint8
        (rows, row bytes). Q8_K uses `quantize_row_q8_K_ref`. ValueError when
        the type has no reference quantizer."""
        tr = self.traits(t)
        a = _as_f32_rows(x, tr.name)
        if a.shape[1] % tr.blck_size:
            raise ValueError(f"{tr.name}: row length {a.shape[1]} is not a multiple of {tr.blck_size}")
        if t == _Q8_K:
            fn = self._q8k_ref
        elif tr.from_float_ref:
            fn = _from_float_t(tr.from_float_ref)
        else:
            raise ValueError(f"ggml has no from_float_ref for {tr.name}")
        rs = a.shape[1] // tr.blck_size * tr.type_size
        out = np.zeros((a.shape[0], rs), np.uint8)
        # The IQ grids are built lazily; without this the IQ3/IQ2_S row
        # quantizers abort ("forgot to call ggml_quantize_init()?").
        self._lib.ggml_quantize_init(t)
        for r in range(a.shape[0]):
            fn(a[r].ctypes.data, out[r].ctypes.data, a.shape[1])
        return out

    def quantize_chunk(self, t: int, x) -> np.ndarray:
        """`ggml_quantize_chunk(t, x, dst, 0, rows, n, NULL)`: no imatrix.

        x: float32 (n,) or (rows, n). Returns uint8 (rows, row bytes).
        ValueError for types that need an imatrix or that the function does
        not handle (Q8_1, Q8_K, plain integer types)."""
        tr = self.traits(t)
        a = _as_f32_rows(x, tr.name)
        if self.requires_imatrix(t):
            raise ValueError(f"ggml needs an importance matrix to quantize {tr.name}")
        if t in (9, _Q8_K) or t >= 24 and t <= 28:
            raise ValueError(f"ggml_quantize_chunk does not handle {tr.name}")
        rows, n = a.shape
        if n % tr.blck_size or n == 0:
            raise ValueError(f"{tr.name}: row length {n} is not a positive multiple of {tr.blck_size}")
        rs = self.row_size(t, n)
        out = np.zeros((rows, rs), np.uint8)
        got = self._lib.ggml_quantize_chunk(t, a.ctypes.data, out.ctypes.data, 0, rows, n, None)
        if got != rows * rs:
            raise RuntimeError(f"{tr.name}: ggml_quantize_chunk wrote {got} bytes, expected {rows * rs}")
        return out

    def quantize(self, t: int, x) -> np.ndarray:
        """ggml's no-imatrix quantizer: `from_float_ref` where the type has
        one, else `ggml_quantize_chunk` (IQ1_M)."""
        tr = self.traits(t)
        if tr.from_float_ref or t == _Q8_K:
            return self.quantize_ref(t, x)
        return self.quantize_chunk(t, x)


_LOADED: dict[str, GGML] = {}


def load(path: Path | str | None = None) -> GGML | None:
    """The library at `path` (or `find_library()`), loaded once; None when
    no library is found. Raises OSError if a found file does not load."""
    p = Path(path) if path is not None else find_library()
    if p is None or not p.is_file():
        return None
    key = str(p.resolve())
    if key not in _LOADED:
        _LOADED[key] = GGML(p)
    return _LOADED[key]
