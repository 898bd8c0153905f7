"""Quantized mat-mul for the CPU inference path: weights stay quantized, the
activations are quantized as ggml-cpu does, and each weight row is dotted
with each activation row in the order of arithmetic of the CPU profile's
llama.cpp build, so that the results equal that build's bit for bit. Rows
run in parallel (numba `prange`) when the product is large enough.

`QMatrix(t, raw, rows, cols, name, profile)` is one weight tensor (or
several stacked: q|k|v, gate|up). Which code path a product takes is
`traits.mm_path` per GGUF tensor (`QMatrix.segments`), which kernel variant
runs on it the profile's instruction-set chain (`traits.kernel`), and
which module packs and multiplies the type its row of `traits.TRAITS`
(`traits.family`): `matvec` (the legacy quants, Q4_K, Q5_K, Q6_K on their
stored blocks, one compiled call per product), `kquant_unpacked` (Q2_K,
Q3_K), `dots_iquants` (the 256-value I-quants), `dots_small` (Q1_0, Q2_0,
MXFP4, NVFP4, IQ4_NL, TQ1_0, TQ2_0), `dots_float` (F32, F16, BF16). Every
path is checked bitwise against ggml's own `ggml_mul_mat` per profile
(tests/test_cpu_types.py).

The integer part of every dot is exact, so it is computed in whatever way is
fastest (`simd`, `lanes`: VNNI's vpdpbusd or ggml's own maddubs/madd on
AVX2 CPUs, plain LLVM vector code elsewhere); the float part follows ggml's
order with explicit FMAs and no fastmath.

A matrix is packed at its first product (`QMatrix.packed`): for the
stored-block types nothing is copied (the kernels read the GGUF bytes, a
memory map, as they are); the other families widen their quants once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._text import printable
from ..types import UnsupportedTypeError, block_format, parse_type
from .traits import Family, amx_buffer, family, mm_path

__all__ = ["QMatrix", "Packed", "PARALLEL_MIN_MACS", "row_ids"]

# Multiply-adds below which one thread is faster than waking the others
# (checked on the handed models: raising it to 1 << 20 cuts SmolLM2 decode
# from 70 to 62 tok/s on an idle 2-core VM, lowering it to 1 << 17 changes nothing).
PARALLEL_MIN_MACS = 1 << 18


@dataclass(frozen=True)
class Packed:
    """What `QMatrix.packed` holds: the kernel `family` of the matrix's type
    (`traits.family`) and `data`, what its `pack` made (a named tuple of
    that module: `matvec.StoredBlocks`, `kquant_unpacked.Q23Packed`, ...)."""
    family: Family
    data: object


def row_ids(ids, rows: int, name: str) -> np.ndarray:
    """`ids` as int64 (n,); IndexError naming the matrix for an id outside
    0 .. rows-1 (`rows_f32` of the weight matrices)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        raise IndexError(f"{name}: row ids must be in 0 .. {rows - 1}")
    return ids


def _tensor_bytes(raw, label: str) -> np.ndarray:
    """The tensor's bytes as flat uint8: a bytes-like object, or an array
    whose memory is the tensor (uint8, or any numeric dtype, read as its
    bytes: the float32 data of an F32 tensor, a uint16 view of blocks).
    ValueError for anything else (a list, an object array), which would
    otherwise be converted value by value."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return np.frombuffer(raw, np.uint8)
    if not isinstance(raw, np.ndarray) or raw.dtype.kind not in "biuf":
        what = f"a {type(raw).__name__}" if not isinstance(raw, np.ndarray) else f"an array of {raw.dtype}"
        raise ValueError(f"{label}: the weights must be the tensor's bytes (a uint8 array, bytes, or a "
                         f"numeric array read as its memory), got {what}")
    return np.ascontiguousarray(raw).view(np.uint8).reshape(-1)


class QMatrix:
    """A weight matrix of `rows` x `cols` (ggml: ne[1] x ne[0]) in type `t`
    (a GGMLType, its id, or its name: "Q4_K", any case).

    raw: uint8 bytes of the tensor (rows * cols / QK blocks). `matmul(x)`
    takes float32 (n, cols) and returns float32 (n, rows) = x @ W.T, the way
    ggml-cpu's `ggml_mul_mat` computes it on the build of `profile` (a
    `strata_ref.cpu` profile or name; None: `cpu.select()`), activation
    quantization and float order included. Packing happens at the first
    `matmul` (a matrix used only for `row_f32`, such as an untied token
    embedding, is never packed). Raises ValueError for a row length that is
    not a multiple of the block, raw of another size, an unknown type
    (UnsupportedTypeError, naming it), and at the first
    product for a type ggml-cpu does not multiply (I8 ... F64).
    """

    def __init__(self, t, raw, rows: int, cols: int, name: str = "", profile=None):
        from . import select
        self.profile = select(profile)
        label = f"QMatrix '{printable(name)}'" if name else "QMatrix"
        try:
            self.type = parse_type(t)
        except UnsupportedTypeError as e:
            raise UnsupportedTypeError(f"{label}: {e}") from None
        self.rows, self.cols, self.name = int(rows), int(cols), name
        self._label = label
        fmt = block_format(self.type)
        raw = _tensor_bytes(raw, label)
        qk = fmt.block_values
        if self.rows < 1 or self.cols < 1:
            raise ValueError(f"{label}: {rows} x {cols} is not a matrix shape (rows and cols must be >= 1)")
        if cols % qk:
            raise ValueError(f"{label}: row length {cols} is not a multiple of the "
                             f"{fmt.name} block size {qk}")
        if raw.size != rows * cols // qk * fmt.block_bytes:
            raise ValueError(f"{label}: {raw.size} bytes do not hold {rows} x {cols} {fmt.name} "
                             f"({rows * cols // qk * fmt.block_bytes} bytes)")
        self.raw = raw
        self._packed = None
        self._amx = None
        #: the row counts of the GGUF tensors stacked into this matrix, in
        #: order (ggml chooses a path per tensor: `segments`)
        self.part_rows = (self.rows,)
        #: False for data that never sits in ggml's CPU_REPACK buffer (a KV
        #: cache view: `cpu.attention`; a 2-D MUL_MAT_ID weight:
        #: `cpu.moe`); repacking is for weight tensors only, and so is the
        #: AMX buffer (`amx`)
        self.repackable = True
        #: a ggml path forced for every product ("vec_dot", "tinyblas"),
        #: None: `traits.mm_path` decides (flash attention dots K and Q by
        #: the type's vec_dot whatever the token count)
        self.path = None

    @classmethod
    def stack(cls, mats: list["QMatrix"], name: str = "", mmid: bool = False) -> "QMatrix | None":
        """One matrix holding the rows of `mats` (same type and cols) in
        order: one activation quantization and one kernel call instead of
        several (q/k/v, gate/up). Rows are independent, so this changes no
        result; None where it would: a profile whose `vec_dot` of the type
        takes two rows at once (i8mm), which ggml chooses per tensor from
        its row count (`mmla`), unless the stack is only multiplied as
        MUL_MAT_ID experts (`mmid`: one row at a time)."""
        t, cols = mats[0].type, mats[0].cols
        if any(m.type != t or m.cols != cols for m in mats):
            raise ValueError("stacked matrices need one type and one row length")
        from .mmla import TWO_ROW_VARIANTS
        from .traits import kernel
        if not mmid and kernel(mats[0].profile.isa, t, "vec_dot") in TWO_ROW_VARIANTS:
            return None
        out = cls(t, np.concatenate([m.raw for m in mats]), sum(m.rows for m in mats), cols, name,
                  mats[0].profile)
        out.part_rows = tuple(r for m in mats for r in m.part_rows)
        out.repackable = all(m.repackable for m in mats)
        return out

    def prepare(self) -> None:
        """Pack now rather than at the first product; idempotent. Raises
        ValueError for a type ggml-cpu has no mat-mul for."""
        if self._packed is None:
            try:
                fam = family(self.type)
            except ValueError as e:
                raise ValueError(f"{self._label}: {e}") from None
            try:
                self._packed = Packed(fam, fam.pack(self))
            except NotImplementedError as e:
                raise self._not_emulated(e) from None

    def _not_emulated(self, e: NotImplementedError) -> NotImplementedError:
        """A kernel's NotImplementedError as NotEmulated, naming the tensor
        and the profile."""
        from .._notemulated import NotEmulated
        name = printable(self.name) if self.name else "a matrix"
        return NotEmulated(f"{name}: {e} on the CPU profile {self.profile.name} "
                           f"(docs/inference.md lists what each profile covers)",
                           f"the {self.type.name} mat-mul ({name})", "on this profile")

    @property
    def packed(self) -> Packed:
        """The packed form (`Packed`), made now if it was not yet."""
        self.prepare()
        return self._packed

    def amx(self, part_rows: int | None = None) -> bool:
        """Whether ggml's AMX buffer holds this tensor (or its part of
        `part_rows` rows; each part for None) when a MUL_MAT reads it, on
        the profile's build (`traits.amx_buffer`); a weight tensor only."""
        parts = self.part_rows if part_rows is None else (part_rows,)
        return self.repackable and all(amx_buffer(self.profile.isa, self.type, r, self.cols) for r in parts)

    def repacked(self, part_rows: int | None = None, mmid: bool = False) -> bool:
        """Whether ggml's CPU_REPACK buffer holds this tensor (or its part of
        `part_rows` rows) on the profile's build: the AMX buffer does not
        take it first (a MUL_MAT_ID weight, `mmid`, never goes to AMX), its
        type has a repacked layout on the instruction-set chain and the
        rows are a multiple of the layout's interleaved rows, the N of its
        name `..._NxK` (8, or 4 for ARM's `4x4` layouts:
        `ggml_repack_get_optimal_repack_type`)."""
        rows = self.rows if part_rows is None else part_rows
        layout = self.profile.isa.resolve("REPACK").get(self.type)
        if not self.repackable or layout is None or (not mmid and self.amx(part_rows)):
            return False
        every = int(layout.rsplit("_", 1)[1].split("x")[0])
        return all(r % every == 0 for r in (self.part_rows if part_rows is None else (rows,)))

    def segments(self, n: int, mmid: bool = False, no_amx: bool = False, src1_cont: bool = True) -> list:
        """[(r0, r1, path)]: the row ranges of this matrix with the ggml path
        (`traits.mm_path`) each takes with n activation rows. ggml decides
        per GGUF tensor, so a matrix stacked from several can have parts on
        different paths (a repacked part of rows % 8 == 0 next to one that
        is not; tinyBLAS's rows % 4 for float types; an AMX part of rows %
        32 == 0 next to one that is not); consecutive parts on one path
        form one range. A forced `path` is one range. no_amx: the paths the
        parts would take if no AMX buffer held them; src1_cont: `mm_path`'s
        (the activations a contiguous tensor in ggml's graph)."""
        if self.path is not None:
            return [(0, self.rows, self.path)]
        isa = self.profile.isa
        out = []
        r0 = 0
        for rows in self.part_rows:
            amx = not no_amx and self.amx(rows)
            path = mm_path(isa, self.type, n, self.repacked(rows, mmid or no_amx), rows, self.cols, mmid,
                           amx, src1_cont)
            if out and out[-1][2] == path:
                out[-1] = (out[-1][0], r0 + rows, path)
            else:
                out.append((r0, r0 + rows, path))
            r0 += rows
        return out

    def matmul(self, x: np.ndarray, mmid: bool = False, src1_cont: bool = True) -> np.ndarray:
        """float32 (n, cols) -> float32 (n, rows).

        src1_cont: False where ggml's graph hands the mul_mat a permuted
        (non-contiguous) view of the activations, which llamafile's first
        attempt skips (`traits.tinyblas_wants_f32`).

        mmid: the rows are the activations ggml's MUL_MAT_ID routes to this
        matrix as one expert (ggml-cpu.c `ggml_compute_forward_mul_mat_id`,
        repack.cpp `forward_mul_mat_id`), which take other code than a
        mul_mat of as many rows: never llamafile's tinyBLAS (each row by
        `vec_dot`, or the tiled kernel from 8 rows on, as a mul_mat), and
        for repacked weights the gemv for every row (no gemm)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.cols:
            raise ValueError(f"{self.name}: activations must be (n, {self.cols}), got {x.shape}")
        parallel = x.shape[0] * self.rows * self.cols >= PARALLEL_MIN_MACS
        segs = self.segments(x.shape[0], mmid, src1_cont=src1_cont)
        amx = [(r0, r1) for r0, r1, path in segs if path == "amx"]
        if len(amx) == len(segs):
            return self._amx_rows(x, 0, self.rows, parallel)
        p = self.packed
        if not amx:
            try:
                return p.family.matmul(self, p.data, x, segs, parallel, bool(mmid))
            except NotImplementedError as e:
                raise self._not_emulated(e) from None
        # parts in the AMX buffer next to parts that are not: the family
        # computes every row, the AMX ones are then replaced
        out = p.family.matmul(self, p.data, x, self.segments(x.shape[0], mmid, True, src1_cont), parallel,
                              bool(mmid))
        for r0, r1 in amx:
            out[:, r0:r1] = self._amx_rows(x, r0, r1, parallel)
        return out

    def _amx_rows(self, x, r0: int, r1: int, parallel: bool) -> np.ndarray:
        # rows r0..r1-1 of the product as ggml's AMX buffer computes them
        # (`strata_ref.cpu.amx`); the AMX form is made at the first use
        from . import amx
        if self._amx is None:
            self._amx = amx.pack(self.type, self.raw, self.rows, self.cols)
        return amx.matmul(self._amx, x, self.profile.isa, r0, r1, parallel)

    def row_f32(self, i: int) -> np.ndarray:
        """Row i dequantized to float32 by the oracle (ggml `get_rows`)."""
        from ..dequant import dequant_f32
        return dequant_f32(self.type, self.raw, 1, self.cols, row0=int(i))[0]

    def rows_f32(self, ids) -> np.ndarray:
        """float32 (len(ids), cols): the rows `ids` dequantized by the oracle
        in one call (ggml `get_rows`); IndexError for an id outside the
        matrix."""
        from ..dequant import dequant_f32
        ids = row_ids(ids, self.rows, self.name)
        raw = self.raw.reshape(self.rows, -1)[ids]
        return dequant_f32(self.type, raw.reshape(-1), ids.size, self.cols)
