"""Quantized mat-mul for the CPU inference path: weights stay quantized, the
activations are quantized as ggml-cpu does (`act_quant`), and each weight row
is dotted with each activation row in the order of arithmetic of the CPU
profile's llama.cpp build, so that the results equal that build's bit for
bit. Rows run in parallel (numba `prange`) when the product is large enough.

Which ggml code path a product takes is `families.mm_path` (repacked,
tiled, llamafile or vec_dot, by type, profile, rows and activation count).
The legacy quants and Q4_K, Q5_K, Q6_K are multiplied on their stored
blocks by `legacy_dots` / `kquant_dots`, one compiled call per product
(`matvec`); Q2_K and Q3_K by this module's kernels on the quants unpacked
once; the other types are families of their own modules (`dots_iquants`:
the 256-value I-quants; `dots_small`: F32, F16, BF16, Q1_0, Q2_0, MXFP4,
NVFP4, IQ4_NL, TQ1_0, TQ2_0), reached through `families.family`. The
arithmetic (llama.cpp vendored by llama-cpp-python 0.3.36; every path
checked bitwise against ggml's own `ggml_mul_mat` per profile,
tests/test_cpu_types.py):

* Q4_0, Q5_0, Q8_0 (Q8_0 activations): `ggml_vec_dot_*_q8_0` (the AVX2
  code on the avx2 and avx512 builds) for one token and llamafile's
  `tinyBLAS_Q0_AVX` for more, which do the same arithmetic: 8 float32
  lanes, lane L gets the exact integer dot of values 4L..4L+3 of each block
  times the float32 product of the block scales by FMA, block after block,
  then `hsum_float_8`. Q4_0 tensors with rows % 8 == 0, which ggml repacks
  to `q4_0_8x8` on builds with AVX2: its gemv / gemm, one FMA of the whole
  block's dot per block. The scalar build: `ggml_vec_dot_*_generic`, one
  integer per block and no FMA.
* Q4_1, Q5_1 (Q8_1 activations): `ggml_vec_dot_*_q8_1` (AVX2), the same
  lanes plus a scalar FMA sum of m * s added last; generic on scalar.
* Q6_K, Q5_K, Q3_K (Q8_K): `ggml_vec_dot_*_q8_K` (AVX2) below 8 activation
  rows, ggml's tiled K-quant mat-mul (`tiled/`) from 8 rows on (its AVX2 and
  AVX512-VNNI microkernels round alike); the scalar build has neither the
  AVX2 code nor the tiled path: the generic dots, 8 lanes of positions mod 8.
* Q2_K (Q8_K): with rows % 8 == 0 on the avx512 build ggml's `q2_K_8x8`
  gemm / gemv, else as the other K-quants.
* Q4_K (Q8_K) with rows % 8 == 0 on builds with AVX2: ggml's CPU_REPACK
  layout `q4_K_8x8`: `ggml_gemm_q4_K_8x8_q8_K` for the activation rows in
  whole groups of 4, `ggml_gemv_q4_K_8x8_q8_K` for the rest. Other Q4_K
  tensors: as the other K-quants.

The integer part of every dot is exact, so it is computed in whatever way is
fastest (`simd`, `lanes`: VNNI's vpdpbusd or ggml's own maddubs/madd on
AVX2 CPUs, plain LLVM vector code elsewhere); the float part follows ggml's
order with explicit FMAs (`fp`, `simd`) and no fastmath.

Layout: `QMatrix(t, raw, rows, cols, name, profile)` prepares a tensor once,
at first use: for the stored-block types nothing is copied (the kernels
read the GGUF bytes, a memory map, as they are); Q2_K / Q3_K quants are
widened to one int8 each with their scales as int32.
"""
from __future__ import annotations

import os

import numba
import numpy as np
from numba import njit, prange

from ..numerics import F16_TO_F32
from ..types import GGMLType, block_format
from . import act_quant
from .families import family, mm_path
from .fp import fma32, hsum8
from .lanes import fma8_into, lanes8_scaled_add, lanes_scaled_add
from . import matvec

# A decode step launches about four parallel regions per layer, each tens of
# microseconds long, so how idle threads wait decides the decode speed.
# Measured on a 2-core VM (tools/bench_infer.py, SmolLM2-135M / Qwen2.5-0.5B
# decode tok/s, idle | with one busy-looping process): OpenMP (GNU libgomp)
# with its default spin of 300,000 rounds 83 / 27 | 23 / 8 (the spinning
# waiters take the core from the thread that has work); numba's workqueue,
# which always sleeps, 30-43 / 14-19 | 39 / 13; one thread 50 / 14 | 46 / 14;
# OpenMP spinning 2,000 rounds before sleeping 67-72 / 23 | 36 / 13, close to
# the spinning speed at idle and to workqueue's under load
# (docs/inference.md, "Threading layer"). So: the OpenMP layer with
# GOMP_SPINCOUNT=2000, unless the user chose a layer (who still gets that
# spin count), a wait policy or a spin count. libgomp reads the variable
# once, when it is loaded: if it already is (another library brought it in),
# the spin cannot be set and the never-spinning workqueue is used. It only
# takes effect if no parallel numba function has run yet in this process; it
# changes no result (every row's arithmetic is the same on any thread).
_GOMP_SPINCOUNT = "2000"


def _libgomp_loaded() -> bool:
    try:
        import ctypes
        ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return True
    except (OSError, AttributeError):      # not loaded, or no RTLD_NOLOAD (not Linux/glibc)
        return False


def _choose_threading_layer() -> None:
    user_wait = any(k in os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))
    gomp_fixed = _libgomp_loaded()
    if not user_wait and not gomp_fixed:
        os.environ["GOMP_SPINCOUNT"] = _GOMP_SPINCOUNT
    if "NUMBA_THREADING_LAYER" in os.environ:
        return
    if not user_wait and gomp_fixed:
        numba.config.THREADING_LAYER = "workqueue"
    elif "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:   # numba's own order: tbb, omp, workqueue
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]


_choose_threading_layer()

__all__ = ["QMatrix", "INTEGER_KERNEL_TYPES", "VEC_DOT_TYPE"]

#: The activation format ggml-cpu quantizes to for each weight type
#: (`vec_dot_type` in ggml-cpu's type traits, spec/models.md §8).
VEC_DOT_TYPE = {
    GGMLType.Q4_0: GGMLType.Q8_0, GGMLType.Q5_0: GGMLType.Q8_0, GGMLType.Q8_0: GGMLType.Q8_0,
    GGMLType.Q4_1: GGMLType.Q8_1, GGMLType.Q5_1: GGMLType.Q8_1,
    GGMLType.Q2_K: GGMLType.Q8_K, GGMLType.Q3_K: GGMLType.Q8_K, GGMLType.Q4_K: GGMLType.Q8_K,
    GGMLType.Q5_K: GGMLType.Q8_K,
    GGMLType.Q6_K: GGMLType.Q8_K,
}
INTEGER_KERNEL_TYPES = frozenset(VEC_DOT_TYPE)

def _field(raw3, t, name, dtype):
    """Field `name` of every block as a contiguous array (rows, nb, bytes),
    viewed as the field's dtype and cast to `dtype` when given."""
    f = block_format(t).field(name)
    b = np.ascontiguousarray(raw3[:, :, f.offset:f.offset + f.nbytes])
    return b.view(f.dtype).astype(dtype) if dtype is not None else b


def _f16(raw3, t, name):
    """A one-element fp16 field as float32 (rows, nb)."""
    return F16_TO_F32[_field(raw3, t, name, None).view(np.uint16)[..., 0]]


#: weight rows per task of the parallel kernels
_ROWS_PER_TASK = 64


@njit(inline="always", cache=True)
def _row_q3_k(w, x, sc, d, xd, tiled, sumi, lf, acc):
    # Q3_K (w the signed quants -4..3, sc the scales minus 32). tiled False:
    # AVX2 `ggml_vec_dot_q3_K_q8_K`: 8 int32 lanes per super-block; lane L =
    # sum over the 8 chunks c of 32 values of scale[2c + L // 4] times the
    # dot of values 4L..4L+3 of chunk c; acc[L] = fma(d_a * d, float(lane),
    # acc[L]); `hsum_float_8`. tiled True: ggml's tiled K-quant mat-mul
    # (`tiled/tiled-kernel.cpp`, 8 or more activation rows): per super-block
    # the exact integer s (the sum of the lanes), r = float(s) * d, then out
    # = fma(r, d_a, out).
    for L in range(8):
        acc[L] = 0.0
    out = np.float32(0.0)
    for b in range(d.shape[0]):
        for L in range(8):
            sumi[L] = 0
        for c in range(8):
            o = b * 256 + c * 32
            lanes_scaled_add(sumi, w, o, x, o, sc[b, 2 * c], sc[b, 2 * c + 1])
        tot = 0
        for L in range(8):
            lf[L] = np.float32(sumi[L])
            tot += sumi[L]
        if tiled:
            out = fma32(np.float32(np.float32(tot) * d[b]), xd[b], out)
        else:
            fma8_into(acc, lf, 0, np.float32(xd[b] * d[b]))
    return out if tiled else hsum8(acc)


@njit(inline="always", cache=True)
def _row_q2_k(w, x, sc, mn, d, dmin, xd, xb, path, sumi, lf, acc):
    # Q2_K (unsigned quants 0..3, 16 sub-blocks of 16 with a 4-bit scale and
    # min each), bsums xb per 16. path 0: AVX2 `ggml_vec_dot_q2_K_q8_K`: per
    # super-block acc = fma(-d_a * dmin, float(min lanes), acc), lane L =
    # min[2L] bsum[2L] + min[2L+1] bsum[2L+1], then acc = fma(d_a * d,
    # float(lanes as Q6_K's), acc); hsum_float_8. path 1: the tiled kernel
    # (as for Q4_K). paths 2 / 3: ggml's CPU_REPACK `q2_K_8x8` gemv / gemm
    # (x86, AVX-512): exact I = sum scale * dot and M = sum min * bsum,
    # acc = fma(float(I), d * d_a, acc), accm = fma(float(M), dmin * d_a,
    # accm) per super-block (gemv) or per half of it (gemm); acc - accm.
    for L in range(8):
        acc[L] = 0.0
    out = np.float32(0.0)
    accm = np.float32(0.0)
    for b in range(d.shape[0]):
        if path == 0:
            for L in range(8):
                lf[L] = np.float32(mn[b, 2 * L] * xb[b * 16 + 2 * L] + mn[b, 2 * L + 1] * xb[b * 16 + 2 * L + 1])
            fma8_into(acc, lf, 0, np.float32(-xd[b] * dmin[b]))
        step = 4 if path == 3 else 8
        for c0 in range(0, 8, step):
            for L in range(8):
                sumi[L] = 0
            totm = 0
            for c in range(c0, c0 + step):
                o = b * 256 + c * 32
                lanes_scaled_add(sumi, w, o, x, o, sc[b, 2 * c], sc[b, 2 * c + 1])
                totm += mn[b, 2 * c] * xb[b * 16 + 2 * c] + mn[b, 2 * c + 1] * xb[b * 16 + 2 * c + 1]
            tot = 0
            for L in range(8):
                tot += sumi[L]
            if path == 0:
                for L in range(8):
                    lf[L] = np.float32(sumi[L])
                fma8_into(acc, lf, 0, np.float32(xd[b] * d[b]))
            elif path == 1:
                r = fma32(-dmin[b], np.float32(totm), np.float32(np.float32(tot) * d[b]))
                out = fma32(r, xd[b], out)
            else:
                out = fma32(np.float32(tot), np.float32(d[b] * xd[b]), out)
                accm = fma32(np.float32(totm), np.float32(dmin[b] * xd[b]), accm)
    if path == 0:
        return hsum8(acc)
    if path == 1:
        return out
    return np.float32(out - accm)


@njit(inline="always", cache=True)
def _row_kq_generic(mode, w, x, sc, mn, d, dmin, xd, xb, sumi, sums):
    # ggml's generic `ggml_vec_dot_q{2,3}_K_q8_K_generic` (quants.c; the
    # baseline build, no FMA). Q3_K: per super-block 8 int32 lanes
    # (`lanes8_scaled_add`: lane l sums positions l mod 8 with their
    # sub-block scale), sums[l] += (d_w * d_a) * lane[l]; at the end sumf +=
    # sums[0], ..., sums[7] in order. Q2_K: one exact isum (scale * dot) and
    # summs (min * bsum) per super-block, sumf += (d_a d_w) isum - (d_a
    # dmin) summs. (Q4_K, Q5_K, Q6_K: `kquant_dots`.)
    for L in range(8):
        sums[L] = 0.0
    sumf = np.float32(0.0)
    for b in range(d.shape[0]):
        if mode == _Q2_K or mode == _Q2_K_8X8:
            isum = 0
            summs = 0
            for c in range(8):
                o = b * 256 + c * 32
                for L in range(8):
                    sumi[L] = 0
                lanes8_scaled_add(sumi, w, o, x, o, sc[b, 2 * c], sc[b, 2 * c + 1])
                for L in range(8):
                    isum += sumi[L]
            for j in range(16):
                summs += xb[b * 16 + j] * mn[b, j]
            dall = np.float32(xd[b] * d[b])
            dm = np.float32(xd[b] * dmin[b])
            sumf = np.float32(sumf + np.float32(np.float32(dall * np.float32(isum)) -
                                                np.float32(dm * np.float32(summs))))
            continue
        for L in range(8):
            sumi[L] = 0
        for c in range(8):
            o = b * 256 + c * 32
            lanes8_scaled_add(sumi, w, o, x, o, sc[b, 2 * c], sc[b, 2 * c + 1])
        dd = np.float32(d[b] * xd[b])
        for L in range(8):
            sums[L] = np.float32(sums[L] + np.float32(dd * np.float32(sumi[L])))
    if mode == _Q2_K or mode == _Q2_K_8X8:
        return sumf
    for L in range(8):
        sumf = np.float32(sumf + sums[L])
    return sumf


@njit(inline="always", cache=True)
def _rows_kquant(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, n_gemm, out, r0, r1, sumi, lf,
                 acc, accm):
    # n_gemm: the leading activation rows the repacked layouts take through
    # their gemm (whole groups of 4 for a mul_mat, none for a MUL_MAT_ID,
    # whose repacked path runs the gemv for every routed row)
    n = xq.shape[0]
    tiled = tiled_ok and n >= 8
    for r in range(r0, r1):
        for t in range(n):
            if gen:
                out[t, r] = _row_kq_generic(mode, wq[r], xq[t], sc[r], mn[r], d[r], dmin[r], xd[t], xb[t],
                                            sumi, lf)
            elif mode == _Q3_K:
                out[t, r] = _row_q3_k(wq[r], xq[t], sc[r], d[r], xd[t], tiled, sumi, lf, acc)
            else:
                # Q2_K: repacked gemm for whole groups of 4 rows, else gemv;
                # not repacked: tiled from 8 rows, else vec_dot
                path = (3 if t < n_gemm else 2) if mode == _Q2_K_8X8 else (1 if tiled else 0)
                out[t, r] = _row_q2_k(wq[r], xq[t], sc[r], mn[r], d[r], dmin[r], xd[t], xb[t],
                                      path, sumi, lf, acc)


#: `_mm_kquant` modes
_Q3_K, _Q2_K, _Q2_K_8X8 = 0, 1, 2


@njit(parallel=True, cache=True)
def _mm_kquant(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, n_gemm, out):
    """Q3_K and Q2_K weight rows times Q8_K activation rows in ggml-cpu's
    order: mode `_Q3_K` (`_row_q3_k`), `_Q2_K` / `_Q2_K_8X8` (`_row_q2_k`).
    wq: the quants (rows, cols) int8 (Q3_K signed, Q2_K unsigned); sc (and
    mn for Q2_K): the integer sub-block scales, int32 (rows, super-blocks,
    16); d (dmin) float32 per super-block; xq the Q8_K quants int8, xd their
    scales, xb the bsums int32 per 16 values.
    tiled_ok: the build has ggml's tiled mat-mul (taken from 8 rows on);
    gen: the generic C dots (`_row_kq_generic`); n_gemm: activation rows
    taken by the repacked gemm (`_rows_kquant`)."""
    R = wq.shape[0]
    for c in prange((R + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK):
        _rows_kquant(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, n_gemm, out, c * _ROWS_PER_TASK,
                     min(R, (c + 1) * _ROWS_PER_TASK), np.empty(8, np.int32),
                     np.empty(8, np.float32), np.empty(8, np.float32), np.empty(4, np.float32))


@njit(cache=True)
def _mm_kquant_serial(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, n_gemm, out):
    _rows_kquant(mode, wq, sc, mn, d, dmin, xq, xd, xb, tiled_ok, gen, n_gemm, out, 0, wq.shape[0],
                 np.empty(8, np.int32),
                 np.empty(8, np.float32), np.empty(8, np.float32), np.empty(4, np.float32))


# Multiply-adds below which one thread is faster than waking the others
# (checked on the handed models: raising it to 1 << 20 cuts SmolLM2 decode
# from 70 to 62 tok/s on an idle 2-core VM, lowering it to 1 << 17 changes nothing).
PARALLEL_MIN_MACS = 1 << 18


def _q3_k_values(hmask: np.ndarray, qs: np.ndarray, s12: np.ndarray):
    """Q3_K fields -> (values int8 (rows, nb, 256) in -4..3, scales int32
    (rows, nb, 16) in -32..31), ggml `dequantize_row_q3_K`: value 128h + 32k
    + l (h < 2, k < 4, l < 32) = bits 2k..2k+1 of qs[32h + l], minus 4 when
    bit 4h + k of hmask[l] is clear; scale j: low 4 bits from byte j % 8
    (low nibble for j < 8, high nibble after), high 2 bits from byte 8 + j %
    4 at bit 2 * (j // 4), minus 32."""
    r, nb, _ = qs.shape
    q = qs.reshape(r, nb, 2, 1, 32)
    h = hmask.reshape(r, nb, 1, 1, 32)
    k = np.arange(4, dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    half = np.arange(2, dtype=np.uint8).reshape(1, 1, 2, 1, 1)
    low = (q >> (2 * k)) & 3
    high = (h >> (4 * half + k)) & 1
    values = (low.astype(np.int16) - 4 * (1 - high.astype(np.int16))).reshape(r, nb, 256)
    s = s12.astype(np.int32)
    j = np.arange(16)
    lo = np.where(j < 8, s[..., j % 8] & 15, s[..., j % 8] >> 4)
    hi = (s[..., 8 + j % 4] >> (2 * (j // 4))) & 3
    return values.astype(np.int8), (lo | (hi << 4)) - 32


def row_ids(ids, rows: int, name: str) -> np.ndarray:
    """`ids` as int64 (n,); IndexError naming the matrix for an id outside
    0 .. rows-1 (`rows_f32` of the weight matrices)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        raise IndexError(f"{name}: row ids must be in 0 .. {rows - 1}")
    return ids


class QMatrix:
    """A weight matrix of `rows` x `cols` (ggml: ne[1] x ne[0]) in type `t`.

    raw: uint8 bytes of the tensor (rows * cols / QK blocks). `matmul(x)`
    takes float32 (n, cols) and returns float32 (n, rows) = x @ W.T, the way
    ggml-cpu's `ggml_mul_mat` computes it on the build of `profile` (a
    `strata_ref.cpu` profile or name; None: `cpu.select()`), activation
    quantization and float order included (module docstring). Packing
    happens at the first `matmul` (a matrix used only for `row_f32`, such as
    an untied token embedding, is never packed). Raises ValueError for a row
    length that is not a multiple of the block, raw of another size, and at
    the first product for a type ggml-cpu does not multiply (I8 ... F64).
    """

    def __init__(self, t, raw, rows: int, cols: int, name: str = "", profile=None):
        from . import select
        self.profile = select(profile)
        self.type = GGMLType(t)
        self.rows, self.cols, self.name = int(rows), int(cols), name
        fmt = block_format(self.type)
        raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
        qk = fmt.block_values
        if cols % qk:
            raise ValueError(f"{name}: row length {cols} is not a multiple of the "
                             f"{fmt.name} block size {qk}")
        if raw.size != rows * cols // qk * fmt.block_bytes:
            raise ValueError(f"{name}: {raw.size} bytes do not hold {rows} x {cols} {fmt.name}")
        self.raw = raw
        self._packed = None
        #: rows of the smallest GGUF tensor this matrix is made of (`stack`):
        #: ggml repacks a Q4_K tensor when its row count is a multiple of 8
        self.repack_rows = self.rows
        #: the row counts of the GGUF tensors stacked into this matrix, in
        #: order (ggml chooses a path per tensor: `families.segments`)
        self.part_rows = (self.rows,)
        #: False for data that never sits in ggml's CPU_REPACK buffer (a KV
        #: cache view: `cpu.attention`); repacking is for weights only
        self.repackable = True
        #: a ggml path forced for every product ("vec_dot", "tinyblas"),
        #: None: `families.mm_path` decides (flash attention dots K and Q by
        #: the type's vec_dot whatever the token count)
        self.path = None

    @classmethod
    def stack(cls, mats: list["QMatrix"], name: str = "") -> "QMatrix":
        """One matrix holding the rows of `mats` (same type and cols) in
        order: one activation quantization and one kernel call instead of
        several (q/k/v, gate/up). Rows are independent, so this changes no
        result."""
        t, cols = mats[0].type, mats[0].cols
        if any(m.type != t or m.cols != cols for m in mats):
            raise ValueError("stacked matrices need one type and one row length")
        out = cls(t, np.concatenate([m.raw for m in mats]), sum(m.rows for m in mats), cols, name,
                  mats[0].profile)
        out.repack_rows = 8 if all(m.repack_rows % 8 == 0 for m in mats) else 1
        out.part_rows = tuple(r for m in mats for r in m.part_rows)
        return out

    def prepare(self) -> None:
        """Pack now rather than at the first product; idempotent. Raises
        ValueError for a type ggml-cpu has no mat-mul for."""
        if self._packed is None:
            self._prepare()

    def _prepare(self):
        t = self.type
        fam = family(t) if t not in INTEGER_KERNEL_TYPES else None
        if fam is not None:
            self._packed = ("family", fam, fam.pack(self))
            return
        if t not in INTEGER_KERNEL_TYPES:
            raise ValueError(f"{self.name}: ggml-cpu has no mat-mul for {t.name} weights")
        raw3 = self.raw.reshape(self.rows, -1, block_format(t).block_bytes)
        kind = self._kind()
        c32 = np.ascontiguousarray
        if t in matvec.RUN_TYPES:
            # the legacy quants, Q4_K, Q5_K and Q6_K are multiplied on the
            # stored blocks (`legacy_dots`, `kquant_dots`), in one compiled
            # call (`matvec`): nothing to pack
            prof = self.profile
            path = 0 if prof.vec_dot == "generic" else (2 if kind in ("q4_k_8x8",) or (
                t == GGMLType.Q4_0 and self._repacked()) else 1)
            self._packed = ("run", matvec.runner(t), path, prof.act_quant == "ref", bool(prof.tiled),
                            self.raw.reshape(self.rows, -1))
        elif kind in ("q2_k", "q2_k_8x8"):
            qs = _field(raw3, t, "qs", None)
            r, nb, _ = qs.shape
            shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)
            wq = ((qs.reshape(r, nb, 2, 1, 32) >> shifts) & 3).reshape(r, nb, 256)
            s16 = _field(raw3, t, "scales", None).astype(np.int32)
            self._packed = (kind, c32(wq.reshape(self.rows, -1), np.int8), c32(s16 & 15), c32(s16 >> 4),
                            c32(_f16(raw3, t, "d")), c32(_f16(raw3, t, "dmin")))
        elif kind == "q3_k":
            wq, sc = _q3_k_values(_field(raw3, t, "hmask", None), _field(raw3, t, "qs", None),
                                  _field(raw3, t, "scales", None))
            self._packed = (kind, c32(wq.reshape(self.rows, -1), np.int8), c32(sc, np.int32),
                            c32(sc, np.int32), c32(_f16(raw3, t, "d")), c32(_f16(raw3, t, "d")))

    def _repacked(self) -> bool:
        """Whether ggml's CPU_REPACK buffer rearranges this tensor on the
        profile's build (its type is repacked there and rows % 8 == 0)."""
        return self.repackable and self.type.name in self.profile.repack and self.repack_rows % 8 == 0

    def _kind(self) -> str:
        """Which ggml-cpu kernel the product follows: "q8" (legacy quants:
        `vec_dot_*_q8_0` = tinyBLAS_Q0, `vec_dot_*_q8_1`, and for Q4_0 with
        rows % 8 == 0 the repacked `q4_0_8x8`), "q6_k",
        "q4_k_8x8" (Q4_K repacked, when ggml's CPU_REPACK takes it: rows %
        8 == 0 on a build with AVX2), "q4_k" (other Q4_K tensors), "q5_k",
        "q3_k", "q2_k_8x8" / "q2_k" (Q2_K repacked, AVX-512 builds, or
        not)."""
        if self.type in (GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_1, GGMLType.Q5_1):
            return "q8"
        if self.type == GGMLType.Q6_K:
            return "q6_k"
        if self.type == GGMLType.Q5_K:
            return "q5_k"
        if self.type == GGMLType.Q3_K:
            return "q3_k"
        if self.type == GGMLType.Q2_K:
            return "q2_k_8x8" if self._repacked() else "q2_k"
        return "q4_k_8x8" if self._repacked() else "q4_k"     # Q4_K

    def matmul(self, x: np.ndarray, mmid: bool = False) -> np.ndarray:
        """float32 (n, cols) -> float32 (n, rows).

        mmid: the rows are the activations ggml's MUL_MAT_ID routes to this
        matrix as one expert (ggml-cpu.c `ggml_compute_forward_mul_mat_id`,
        repack.cpp `forward_mul_mat_id`), which take other code than a
        mul_mat of as many rows: never llamafile's tinyBLAS (each row by
        `vec_dot`, or the tiled kernel from 8 rows on, as a mul_mat), and
        for repacked weights the gemv for every row (no gemm)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.cols:
            raise ValueError(f"{self.name}: activations must be (n, {self.cols}), got {x.shape}")
        self.prepare()
        prof = self.profile
        ref = prof.act_quant == "ref"
        gen = prof.vec_dot == "generic"
        kind = self._packed[0]
        parallel = x.shape[0] * self.rows * self.cols >= PARALLEL_MIN_MACS
        if kind == "family":
            fam, packed = self._packed[1], self._packed[2]
            n = x.shape[0]
            if mmid and n > 1 and mm_path(prof, self.type, n, self._repacked(), self.rows,
                                          self.cols) in ("repack", "tinyblas"):
                # one row at a time is the gemv / vec_dot MUL_MAT_ID takes
                par1 = self.rows * self.cols >= PARALLEL_MIN_MACS
                return np.concatenate([fam.matmul(self, packed, x[i:i + 1], par1) for i in range(n)])
            return fam.matmul(self, packed, x, parallel)
        if kind == "run":
            _, run, path, ref, tiled, raw2 = self._packed
            return run(path, ref, tiled, bool(mmid), raw2, x, matvec.threads() if parallel else 1)
        n = x.shape[0]
        n_gemm = n - n % 4 if kind.endswith("8x8") and not mmid else 0
        xq, xd, bsums = act_quant.q8_k_fields(x, mat_rows=n_gemm)
        out = np.empty((n, self.rows), np.float32)
        _, wq, sc, mn, d, dmin = self._packed
        mode = {"q3_k": _Q3_K, "q2_k": _Q2_K, "q2_k_8x8": _Q2_K_8X8}[kind]
        (_mm_kquant if parallel else _mm_kquant_serial)(mode, wq, sc, mn, d, dmin, xq, xd,
                                                        bsums.astype(np.int32), prof.tiled, gen,
                                                        n_gemm, out)
        return out

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
