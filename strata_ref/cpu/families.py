"""Which ggml-cpu code path a mat-mul takes, and the registry of weight-type
families that implement them.

`mm_path` is the one place that states ggml-cpu's dispatch of
`ggml_compute_forward_mul_mat` (ggml-cpu.c, llama.cpp vendored by
llama-cpp-python 0.3.36) for a weight tensor on a CPU profile, in ggml's
order of precedence:

1. "repack": the weights sit in the CPU_REPACK buffer (their type is in
   `profile.repack` and the tensor's rows are a multiple of 8:
   `ggml_repack_get_optimal_repack_type`); its gemm takes the activation
   rows in whole groups of 4, its gemv the rest.
2. "tiled": ggml's tiled mat-mul (`tiled/tiled.cpp`) for the types of
   `TILED_TYPES`, on builds with it, from 8 activation rows on
   (`ggml_tiled_min_batch`).
3. "tinyblas": llamafile's `llamafile_sgemm`, from 2 activation rows on, on
   builds with it (AVX): `tinyBLAS_Q0_AVX` for the types of `TINYBLAS_Q0`
   (the same arithmetic as their AVX2 `vec_dot`), `tinyBLAS` for F32 / F16 /
   BF16 when the row length is a multiple of its lanes and the rows a
   multiple of 4.
4. "vec_dot": the type's `vec_dot` per (weight row, activation row): the
   AVX2 code or the generic C code (`profile.vec_dot`).

A family module (`dots_*.py`) registers the types it implements with
`register`; `matmul.QMatrix` packs and multiplies them through it.
"""
from __future__ import annotations

from ..types import GGMLType as T

__all__ = ["TILED_TYPES", "TINYBLAS_Q0", "TINYBLAS_FLOAT", "VEC_DOT_TYPE", "mm_path", "segments",
           "register", "family", "Family"]

#: `ggml_tiled_supported`'s types (tiled/tiled.cpp)
TILED_TYPES = frozenset({T.Q6_K, T.Q5_K, T.Q4_K, T.Q3_K, T.Q2_K, T.IQ4_XS, T.IQ2_XXS, T.IQ2_XS,
                         T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M})
#: `llamafile_sgemm`'s quantized weight types (with Q8_0 activations)
TINYBLAS_Q0 = frozenset({T.Q8_0, T.Q4_0, T.Q5_0, T.IQ4_NL})
#: `llamafile_sgemm`'s float weight types
TINYBLAS_FLOAT = frozenset({T.F32, T.F16, T.BF16})

#: the activation format ggml-cpu quantizes to for each weight type
#: (`vec_dot_type` of `type_traits_cpu` in ggml-cpu.c)
VEC_DOT_TYPE = {
    T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16,
    T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q8_0: T.Q8_0, T.Q1_0: T.Q8_0, T.Q2_0: T.Q8_0,
    T.IQ4_NL: T.Q8_0, T.MXFP4: T.Q8_0, T.NVFP4: T.Q8_0,
    T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1,
    **{t: T.Q8_K for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S,
                           T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.IQ4_XS, T.TQ1_0, T.TQ2_0)},
}


def _float_lanes(profile, t) -> int:
    """tinyBLAS's elements per vector for float weight type t (0: none)."""
    if not profile.tinyblas:
        return 0
    if t == T.BF16:
        if profile.bf16 == "avx512bf16":
            return 32                       # tinyBLAS<32, __m512, __m512bh>
        return profile.tinyblas if profile.bf16 == "avx2" or profile.tinyblas == 16 else 0
    return profile.tinyblas


def mm_path(profile, t, n: int, repacked: bool, rows: int = 4, cols: int = 0) -> str:
    """ggml-cpu's code path for weight type t on `profile` with n activation
    rows (module docstring): "repack", "tiled", "tinyblas" or "vec_dot".
    repacked: the tensor is in the repack buffer (`QMatrix._repacked`);
    rows, cols: the weight matrix's shape (tinyBLAS's float conditions)."""
    t = T(t)
    if repacked:
        return "repack"
    if profile.tiled and t in TILED_TYPES and n >= 8:
        return "tiled"
    if n >= 2 and profile.tinyblas:
        if t in TINYBLAS_Q0:
            return "tinyblas"
        lanes = _float_lanes(profile, t)
        if t in TINYBLAS_FLOAT and lanes and cols % lanes == 0 and rows % 4 == 0:
            return "tinyblas"
    return "vec_dot"


def segments(qm, n: int):
    """[(r0, r1, path)]: the row ranges of `qm` (a `matmul.QMatrix`) with
    the `mm_path` ggml takes for them with n activation rows. ggml decides
    per GGUF tensor, so a matrix stacked from several (`QMatrix.stack`,
    `part_rows`) can have parts on different paths (a repacked part of
    rows % 8 == 0 next to one that is not; tinyBLAS's rows % 4 for float
    types); consecutive parts on one path form one range. An unstacked
    matrix is one range, repacked as `qm._repacked()` says; a matrix with a
    forced `qm.path` is one range on that path."""
    if getattr(qm, "path", None) is not None:
        return [(0, qm.rows, qm.path)]
    parts = getattr(qm, "part_rows", (qm.rows,))
    out = []
    r0 = 0
    for rows in parts:
        rep = qm._repacked() if len(parts) == 1 else (qm.type.name in qm.profile.repack and rows % 8 == 0)
        path = mm_path(qm.profile, qm.type, n, rep, rows, qm.cols)
        if out and out[-1][2] == path:
            out[-1] = (out[-1][0], r0 + rows, path)
        else:
            out.append((r0, r0 + rows, path))
        r0 += rows
    return out


class Family:
    """A set of weight types whose dots one module implements.

    `pack(qm)` turns `qm` (a `matmul.QMatrix`: .type, .raw, .rows, .cols,
    .profile, `._repacked()`) into whatever its kernels read, once;
    `matmul(qm, packed, x, parallel)` returns float32 (n, rows) for float32
    activations x (n, cols), in the order of `mm_path(qm.profile, ...)`."""
    types: frozenset = frozenset()

    def pack(self, qm):
        raise NotImplementedError

    def matmul(self, qm, packed, x, parallel: bool):
        raise NotImplementedError


_REGISTRY: dict = {}
#: the family modules, imported on the first lookup (they import this one)
_MODULES = ("dots_iquants", "dots_small")
_loaded = False


def register(fam: Family) -> Family:
    """Register a family instance for its types; returns it."""
    for t in fam.types:
        _REGISTRY[T(t)] = fam
    return fam


def family(t):
    """The registered Family of weight type t, or None."""
    global _loaded
    if not _loaded:
        import importlib
        for m in _MODULES:
            try:
                importlib.import_module(f"{__package__}.{m}")
            except ModuleNotFoundError as e:
                if e.name != f"{__package__}.{m}":
                    raise
        _loaded = True
    return _REGISTRY.get(T(t))
