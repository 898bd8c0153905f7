"""Per weight type, what ggml-cpu's CPU back end needs to multiply it: one
table, as ggml-cpu.c's `type_traits_cpu[]` is one row per type, and the one
statement of which code path a mat-mul takes.

`TRAITS[t]` gives the activation type ggml quantizes to (`vec_dot_type`)
and the kernel family (a module of this package) that packs and multiplies
weights of type t. Which of a family's kernel variants runs is the
instruction-set chain's choice (`strata_ref.cpu.isa`): `kernel(isa, t,
path)` names it.

`mm_path` is ggml-cpu's dispatch of `ggml_compute_forward_mul_mat`
(ggml-cpu.c, llama.cpp vendored by llama-cpp-python 0.3.36) for a weight
tensor, in ggml's order of precedence:

1. "repack": the weights sit in the CPU_REPACK buffer (their type is in
   the chain's `REPACK` and the tensor's rows are a multiple of 8:
   `ggml_repack_get_optimal_repack_type`); its gemm takes the activation
   rows in whole groups of 4, its gemv the rest.
2. "tiled": ggml's tiled mat-mul (`tiled/tiled.cpp`) for the chain's
   `TILED` types, from 8 activation rows on (`ggml_tiled_min_batch`).
3. "tinyblas": llamafile's `llamafile_sgemm`, from 2 activation rows on
   (F32 / F16 weights: from the chain's `TINYBLAS_F32_MIN_ROWS` /
   `TINYBLAS_F16_MIN_ROWS`), where the chain
   has it: `tinyBLAS_Q0` for the types of `TINYBLAS_Q0`,
   `tinyBLAS` for F32 / F16 / BF16 when the row length is a multiple of
   its lanes and the rows a multiple of 4.
4. "vec_dot": the type's `vec_dot` per (weight row, activation row).

A MUL_MAT_ID (`mmid`: one expert's share of the routed rows,
`ggml_compute_forward_mul_mat_id`, repack.cpp `forward_mul_mat_id`) never
takes llamafile, and its repacked path runs the gemv for every row.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..types import GGMLType as T

__all__ = ["TypeTraits", "TRAITS", "traits", "vec_dot_type", "family", "Family", "mm_path",
           "choose_path", "kernel", "PATHS", "VEC_DOT", "TINYBLAS", "TILED", "REPACK", "FLOAT_TYPES"]

#: path codes (`choose_path`) and their names (`mm_path`)
VEC_DOT, TINYBLAS, TILED, REPACK = 0, 1, 2, 3
PATHS = ("vec_dot", "tinyblas", "tiled", "repack")

FLOAT_TYPES = frozenset({T.F32, T.F16, T.BF16})


@dataclass(frozen=True)
class TypeTraits:
    """One weight type's row: `vec_dot_type` (the activation format ggml-cpu
    quantizes or converts to, `type_traits_cpu[t].vec_dot_type`) and
    `family` (the module of `strata_ref.cpu` holding its kernels)."""
    type: T
    vec_dot_type: T
    family: str


def _rows(vdt: T, fam: str, *types_) -> list:
    return [TypeTraits(t, vdt, fam) for t in types_]


TRAITS = {r.type: r for r in (
    _rows(T.F32, "dots_float", T.F32) + _rows(T.F16, "dots_float", T.F16) + _rows(T.BF16, "dots_float", T.BF16)
    + _rows(T.Q8_0, "matvec", T.Q4_0, T.Q5_0, T.Q8_0)
    + _rows(T.Q8_1, "matvec", T.Q4_1, T.Q5_1)
    + _rows(T.Q8_K, "matvec", T.Q4_K, T.Q5_K, T.Q6_K)
    + _rows(T.Q8_K, "kquant_unpacked", T.Q2_K, T.Q3_K)
    + _rows(T.Q8_K, "dots_iquants", T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M,
            T.IQ4_XS)
    + _rows(T.Q8_0, "dots_small", T.Q1_0, T.Q2_0, T.IQ4_NL, T.MXFP4, T.NVFP4)
    + _rows(T.Q8_K, "dots_small", T.TQ1_0, T.TQ2_0)
)}


def traits(t) -> TypeTraits:
    """The row of weight type t; ValueError for a type ggml-cpu has no
    mat-mul for (I8 ... F64, Q8_1, Q8_K)."""
    r = TRAITS.get(T(t))
    if r is None:
        raise ValueError(f"ggml-cpu has no mat-mul for {T(t).name} weights")
    return r


def vec_dot_type(t) -> T:
    """The activation format of weight type t (`traits(t).vec_dot_type`)."""
    return traits(t).vec_dot_type


class Family:
    """The kernels of a set of weight types (one module of this package,
    its `FAMILY`). `pack(qm)` turns `qm` (a `matmul.QMatrix`) into what the
    kernels read, once; `matmul(qm, packed, x, segments, parallel, mmid)`
    returns float32 (n, rows) for float32 activations x (n, cols), where
    `segments` lists (r0, r1, path) row ranges (`matmul.QMatrix.segments`)
    and `kernel(qm.profile.isa, qm.type, path)` names each one's variant."""

    def pack(self, qm):
        raise NotImplementedError

    def matmul(self, qm, packed, x, segments, parallel: bool, mmid: bool):
        raise NotImplementedError

    @staticmethod
    def by_segment(qm, segments, part):
        """float32 (n, rows) from `part(r0, r1, path, variant)`, which
        returns the product of rows r0..r1-1 (n, r1 - r0) on the segment's
        path and kernel variant; one segment's result is returned as it is."""
        isa = qm.profile.isa
        outs = [part(r0, r1, path, kernel(isa, qm.type, path)) for r0, r1, path in segments]
        return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1)


def family(t) -> Family:
    """The kernel family of weight type t (its module's `FAMILY`), imported
    at the first use; ValueError as `traits`."""
    mod = importlib.import_module(f"{__package__}.{traits(t).family}")
    return mod.FAMILY


@njit(inline="always", cache=True)
def choose_path(repacked, has_tiled, has_tinyblas, n, mmid):
    """The path code of a product with n activation rows (module docstring):
    repacked weights take REPACK; then TILED from 8 rows where the type has
    it; then TINYBLAS from 2 rows where it has it, never for a MUL_MAT_ID;
    else VEC_DOT."""
    if repacked:
        return REPACK
    if has_tiled and n >= 8:
        return TILED
    if has_tinyblas and n >= 2 and not mmid:
        return TINYBLAS
    return VEC_DOT


def has_tinyblas(isa, t, rows: int, cols: int) -> bool:
    """Whether llamafile's sgemm takes weights of type t, rows x cols, on
    this chain (module docstring, 3)."""
    t = T(t)
    if isa.lookup("TINYBLAS_Q0", t) is not None:
        return True
    if t in FLOAT_TYPES:
        lanes = isa.resolve("TINYBLAS_BF16" if t == T.BF16 else "TINYBLAS")
        if lanes and t == T.F16 and isa.resolve("F16_VA"):
            lanes = isa.resolve("F16_EPR")         # tinyBLAS<8, float16x8_t>
        return bool(lanes) and cols % lanes == 0 and rows % 4 == 0
    return False


def tinyblas_min_rows(isa, t) -> int:
    """The fewest activation rows llamafile takes weights of type t with
    (`TINYBLAS_F32_MIN_ROWS` for F32, `TINYBLAS_F16_MIN_ROWS` for F16, else
    2)."""
    t = T(t)
    if t == T.F32:
        return int(isa.resolve("TINYBLAS_F32_MIN_ROWS"))
    if t == T.F16:
        return int(isa.resolve("TINYBLAS_F16_MIN_ROWS"))
    return 2


def mm_path(isa, t, n: int, repacked: bool, rows: int = 4, cols: int = 0, mmid: bool = False) -> str:
    """ggml-cpu's code path for a weight tensor of type t (rows x cols) with
    n activation rows on the instruction-set chain `isa`: "repack",
    "tiled", "tinyblas" or "vec_dot" (module docstring). repacked: the
    tensor is in the repack buffer (`matmul.QMatrix.repacked`)."""
    t = T(t)
    tb = has_tinyblas(isa, t, rows, cols) and n >= tinyblas_min_rows(isa, t)
    code = choose_path.py_func(bool(repacked), t in isa.resolve("TILED"), tb, int(n), bool(mmid))
    return PATHS[code]


def kernel(isa, t, path: str) -> str:
    """The kernel variant the chain runs for type t on `path`: its
    `VEC_DOT` entry ("generic", "x86", ...), its `TINYBLAS_Q0` entry (or
    "tinyblas" for the float types), "tiled", or its `REPACK` layout
    ("q4_K_8x8", ...)."""
    t = T(t)
    if path == "vec_dot":
        return "vec_dot" if t in FLOAT_TYPES else isa.lookup("VEC_DOT", t)
    if path == "tinyblas":
        return "tinyblas" if t in FLOAT_TYPES else isa.lookup("TINYBLAS_Q0", t)
    if path == "tiled":
        return "tiled"
    if path == "repack":
        return isa.resolve("REPACK")[t]
    raise ValueError(f"no ggml mat-mul path {path!r}")
