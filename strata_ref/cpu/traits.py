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

0. "amx": the weights sit in ggml's AMX buffer (`amx_buffer`: builds with
   AMX, whose extra buffer types list AMX before CPU_REPACK); every batch
   size runs `strata_ref.cpu.amx`.
1. "repack": the weights sit in the CPU_REPACK buffer (their type is in
   the chain's `REPACK` and the tensor's rows are a multiple of 8:
   `ggml_repack_get_optimal_repack_type`); its gemm takes the activation
   rows in whole groups of 4, its gemv the rest.
2. "tiled": ggml's tiled mat-mul (`tiled/tiled.cpp`) for the chain's
   `TILED` types, from 8 activation rows on (`ggml_tiled_min_batch`); on
   llama.cpp v0.4.0's AVX2 builds the IQ panel gemm (`iqp.cpp`) in its
   place, for I-quant tensors of rows % 8 == 0 (`TILED_ROWS`).
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
           "choose_path", "tinyblas_wants_f32", "kernel", "PATHS", "VEC_DOT", "TINYBLAS", "TILED", "REPACK", "FLOAT_TYPES",
           "amx_buffer", "AMX_ROWS"]

#: path codes (`choose_path`) and their names (`mm_path`; "amx" is decided
#: per tensor, `amx_buffer`)
VEC_DOT, TINYBLAS, TILED, REPACK = 0, 1, 2, 3
PATHS = ("vec_dot", "tinyblas", "tiled", "repack", "amx")

#: the weight rows (the product's ne[0]) ggml's AMX buffer needs a multiple
#: of: TILE_N * 2 (ggml-cpu/amx/common.h)
AMX_ROWS = 32

FLOAT_TYPES = frozenset({T.F32, T.F16, T.BF16})

#: the weight rows a tensor must have a multiple of to take a `TILED`
#: kernel variant (iqp.cpp `IQP_NB_ROWS`: its panel decodes 8 rows at once)
TILED_ROWS = {"iqp": 8}


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
        if t == T.F16 and not isa.resolve("TINYBLAS_F16"):
            return False
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


def amx_buffer(isa, t, rows: int, cols: int) -> bool:
    """Whether ggml's AMX buffer takes a weight tensor of type t, rows x
    cols (ggml: ne[1] x ne[0]) used by a MUL_MAT on a build of the chain
    `isa`: `extra_buffer_type::supports_op` of ggml-cpu/amx/amx.cpp (the
    op a MUL_MAT, not MUL_MAT_ID or GET_ROWS: the caller's to know; both
    operands contiguous and the activations F32, as here always; the
    output's ne[0], the weight rows, a multiple of `AMX_ROWS`; the type one
    of the chain's `AMX` with the row length a multiple of its entry).
    False on chains without AMX."""
    k = isa.lookup("AMX", T(t))
    return k is not None and rows % AMX_ROWS == 0 and cols % k == 0


def tinyblas_wants_f32(isa, t) -> bool:
    """Whether llamafile takes weights of type t only with the activations
    still float32, before ggml converts them to the `vec_dot_type`: F32
    weights (nothing is converted), and F16 on chains with
    `TINYBLAS_F16_F32B` (ARM NEON without FP16 arithmetic:
    `tinyBLAS<4, float32x4_t, float32x4_t, ggml_fp16_t, float>`). ggml-cpu.c
    `ggml_compute_forward_mul_mat` tries llamafile on the float32
    activations only when they are contiguous (`src1_cont`), and again on
    the converted copy only when a conversion was made."""
    t = T(t)
    return t == T.F32 or (t == T.F16 and bool(isa.resolve("TINYBLAS_F16_F32B")))


def mm_path(isa, t, n: int, repacked: bool, rows: int = 4, cols: int = 0, mmid: bool = False,
            amx: bool = False, src1_cont: bool = True) -> str:
    """ggml-cpu's code path for a weight tensor of type t (rows x cols) with
    n activation rows on the instruction-set chain `isa`: "amx", "repack",
    "tiled", "tinyblas" or "vec_dot" (module docstring). amx: the tensor is
    in the AMX buffer (`amx_buffer`), which a MUL_MAT_ID never reads;
    repacked: in the repack buffer (`matmul.QMatrix.repacked`); src1_cont:
    the activations are a contiguous tensor in ggml's graph (False for a
    permuted view, such as attention's q: then no tinyBLAS for the types of
    `tinyblas_wants_f32`)."""
    t = T(t)
    if amx and not mmid:
        return "amx"
    tb = (has_tinyblas(isa, t, rows, cols) and n >= tinyblas_min_rows(isa, t)
          and (src1_cont or not tinyblas_wants_f32(isa, t)))
    tiled = isa.resolve("TILED").get(t)
    tiled = tiled is not None and rows % TILED_ROWS.get(tiled, 1) == 0
    code = choose_path.py_func(bool(repacked), tiled, tb, int(n), bool(mmid))
    return PATHS[code]


def kernel(isa, t, path: str) -> str:
    """The kernel variant the chain runs for type t on `path`: its
    `VEC_DOT` entry ("generic", "x86", ...), its `TINYBLAS_Q0` entry (or
    "tinyblas" for the float types), its `TILED` entry ("tiled", "iqp"),
    or its `REPACK` layout ("q4_K_8x8", ...)."""
    t = T(t)
    if path == "vec_dot":
        return "vec_dot" if t in FLOAT_TYPES else isa.lookup("VEC_DOT", t)
    if path == "tinyblas":
        return "tinyblas" if t in FLOAT_TYPES else isa.lookup("TINYBLAS_Q0", t)
    if path == "tiled":
        return isa.resolve("TILED")[t]
    if path == "repack":
        return isa.resolve("REPACK")[t]
    if path == "amx":
        return "amx"
    raise ValueError(f"no ggml mat-mul path {path!r}")
