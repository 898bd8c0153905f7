"""ggml-cpu's mat-muls of the float weight types F32, F16 and BF16, per CPU
profile, bit for bit (llama.cpp vendored by llama-cpp-python 0.3.36).

The activations are first rounded to the weight's `vec_dot_type` (F16 by
round to nearest even, `ggml_cpu_fp32_to_fp16`; BF16 by ggml's rule,
`GGML_FP32_TO_BF16`; F32 as is). Then, per path (`traits.mm_path`):

* "vec_dot": the build's `ggml_vec_dot_f32` / `_f16` / `_bf16` (`vec.cpp`
  over the build's `simd-mappings.h`), the instruction-set chain's
  `vec_dot_f32`, `vec_dot_f16`, `vec_dot_bf16` (`strata_ref.cpu.isa`: four
  accumulators of 16 or 8 lanes reduced in the build's tree; BF16 with
  AVX512-BF16's `vdpbf16ps`; every product in double without SIMD).
* "tinyblas" (k a multiple of the lanes, rows a multiple of 4): llamafile's
  `tinyBLAS<KN, ...>`, one accumulator of KN lanes per output, lane l
  taking elements l, l + KN, ... by FMA, then the lane sum (the chain's
  `tinyblas_dot`); BF16 the chain's `tinyblas_bf16`. On a chain with
  `TINYBLAS_F16_F32B` (ARM NEON without FP16 arithmetic) tinyBLAS
  multiplies F16 weights by the F32 activations unrounded; on one with
  `F16_VA` (Arm's FP16 vector arithmetic) F16 weights take
  `tinyBLAS<8, float16x8_t>` (`fp16_va.tinyblas_f16x8`) and the chain's
  `vec_dot_f16` computes in binary16.

F16 and BF16 weights stay as their 16-bit patterns and are widened one row
at a time inside the kernel (exact).
"""
from __future__ import annotations

import platform
from collections import namedtuple

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._digest import jit
from ..numerics import bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits
from ..types import GGMLType as T
from . import fp16_va
from .fp import bits_f32, f32_bits
from .traits import FLOAT_TYPES, Family

__all__ = ["FAMILY", "FloatPacked", "round_activations", "FLOAT_TYPES"]

_F32 = np.float32
_KF32, _KF16, _KBF16 = 0, 1, 2
#: weight rows per parallel task
_ROWS_PER_TASK = 64


_F16_SCALE = _F32(2.0 ** 112)


@njit(inline="always", cache=True)
def _half_to_f32(h):
    # The float32 value of fp16 bits h, exact, as F16C's vcvtph2ps (ggml's
    # F16 loads): the 15 magnitude bits moved to float32's place are the
    # value times 2^-112 (normals and denormals alike), so one exact
    # multiply by 2^112 rescales them; Inf / NaN (exponent 31) are rebuilt,
    # a NaN quieted. For x86 CPUs without F16C (`_widen_f16`).
    u = np.uint32(h)
    mag = u & np.uint32(0x7FFF)
    fin = np.uint32(f32_bits(_F32(bits_f32(np.int32(mag << np.uint32(13))) * _F16_SCALE)))
    inf = (np.uint32(0x7F800000) | ((mag & np.uint32(0x3FF)) << np.uint32(13))
           | (np.uint32(mag > np.uint32(0x7C00)) << np.uint32(22)))
    big = np.uint32(0) - np.uint32(mag >= np.uint32(0x7C00))        # all ones for Inf / NaN
    b = (inf & big) | (fin & ~big) | ((u & np.uint32(0x8000)) << np.uint32(16))
    return bits_f32(np.int32(b))


@intrinsic
def _fpext_half(typingctx, h):
    """The float32 value of fp16 bits h (uint16), exact: LLVM's `fpext`,
    F16C's vcvtph2ps on x86 (only used where the host has it: elsewhere
    on x86 LLVM would call a runtime helper)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return sig, codegen


#: whether `_fpext_half` compiles to an instruction here (x86 with F16C, or
#: another architecture, where LLVM converts halves natively)
_HOST_F16C = bool(llb.get_host_cpu_features().get("f16c", False)) or \
    platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86")


@jit
def _widen_f16(src, dst):
    # one row of fp16 bits -> float32; the fpext loop vectorizes (about 15
    # times faster than `_half_to_f32`'s, which LLVM keeps scalar)
    if _HOST_F16C:
        for i in range(dst.shape[0]):
            dst[i] = _fpext_half(src[i])
    else:
        for i in range(dst.shape[0]):
            dst[i] = _half_to_f32(src[i])


@jit
def _widen_bf16(src, dst):
    # one row of bf16 bits -> float32 (exact: the bits shifted into place)
    for i in range(dst.shape[0]):
        dst[i] = bits_f32(np.int32(np.uint32(src[i]) << np.uint32(16)))




@njit(inline="always", cache=True)
def _dot(isa, kind, tiny, a, b, acc):
    n = a.shape[0]
    if kind == _KBF16:
        if tiny:
            return isa.tinyblas_bf16(a, 0, b, 0, n, acc)
        return isa.vec_dot_bf16(a, 0, b, 0, n, acc)
    if tiny:
        if kind == _KF16 and isa.F16_VA:
            return fp16_va.tinyblas_f16x8(a, 0, b, 0, n, acc)
        return isa.tinyblas_dot(a, 0, b, 0, n, acc)
    if kind == _KF32:
        return isa.vec_dot_f32(a, 0, b, 0, n, acc)
    return isa.vec_dot_f16(a, 0, b, 0, n, acc)


@jit
def _rows_float(isa, kind, tiny, w32, w16, x, out, r0, r1):
    acc = np.empty(64, np.float32)
    wf = np.empty(x.shape[1], np.float32)
    for r in range(r0, r1):
        if kind == _KF32:
            a = w32[r]
        else:
            if kind == _KF16:
                _widen_f16(w16[r], wf)
            else:
                _widen_bf16(w16[r], wf)
            a = wf
        for t in range(x.shape[0]):
            out[t, r] = _dot(isa, kind, tiny, a, x[t], acc)


@jit(parallel=True)
def _mm_float(isa, kind, tiny, w32, w16, x, out, r0, r1):
    """out[t, r] = ggml's dot of float weight row r (F32: w32 (rows, cols);
    F16 / BF16: their bits w16 (rows, cols) uint16; the other a dummy) with
    activation row t of x (float32 (n, cols), already rounded to the
    weight's vec_dot_type): tinyBLAS's order when `tiny`, else the build's
    `ggml_vec_dot_*` (the chain `isa`'s), for r0 <= r < r1. Tasks of
    `_ROWS_PER_TASK` rows run in parallel."""
    for c in prange((r1 - r0 + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        a = r0 + c * _ROWS_PER_TASK
        _rows_float(isa, kind, tiny, w32, w16, x, out, a, min(r1, a + _ROWS_PER_TASK))


def round_activations(t, x: np.ndarray) -> np.ndarray:
    """x float32 (n, cols) as ggml-cpu converts it to the `vec_dot_type` of
    float weight type t, back in float32: F16 by round to nearest even
    (`ggml_cpu_fp32_to_fp16`), BF16 by ggml's rule (`GGML_FP32_TO_BF16`),
    F32 unchanged."""
    t = T(t)
    if t == T.F16:
        return f16_bits_to_f32(f32_to_f16_bits(x)).reshape(x.shape)
    if t == T.BF16:
        return bf16_bits_to_f32(f32_to_bf16_bits(x)).reshape(x.shape)
    return x


#: the packed form: kind (F32 / F16 / BF16), the F32 rows (rows, cols) or a
#: dummy, the F16 / BF16 bits (rows, cols) uint16 or a dummy
FloatPacked = namedtuple("FloatPacked", "kind w32 w16")


class _FloatFamily(Family):
    """F32, F16, BF16 weights: module docstring."""

    def pack(self, qm):
        if qm.type == T.F32:
            return FloatPacked(_KF32, np.ascontiguousarray(qm.raw.view(np.float32).reshape(qm.rows, qm.cols)),
                               np.zeros((1, 1), np.uint16))
        kind = _KF16 if qm.type == T.F16 else _KBF16
        return FloatPacked(kind, np.zeros((1, 1), np.float32),
                           np.ascontiguousarray(qm.raw.view(np.uint16).reshape(qm.rows, qm.cols)))

    def matmul(self, qm, packed, x, segments, parallel, mmid):
        xr = np.ascontiguousarray(round_activations(qm.type, x), np.float32)
        out = np.empty((x.shape[0], qm.rows), np.float32)
        isa = qm.profile.isa
        # ARM NEON without FP16 arithmetic: tinyBLAS takes F16 weights with
        # the F32 activations as they are (`TINYBLAS_F16_F32B`)
        x32 = np.ascontiguousarray(x, np.float32) if isa.resolve("TINYBLAS_F16_F32B") else xr
        for r0, r1, path in segments:
            tiny = path == "tinyblas"
            (_mm_float if parallel else _rows_float)(isa, packed.kind, tiny, packed.w32, packed.w16,
                                                     x32 if tiny else xr, out, r0, r1)
        return out


FAMILY = _FloatFamily()
