"""The weight types multiplied on their stored blocks, one compiled call per
mat-mul: the legacy quants (`legacy_dots`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
and Q4_K, Q5_K, Q6_K (`kquant_dots`). The activations are quantized as the
build does it, the kernel of ggml's code path runs and the output is
allocated, all inside numba, so that a product costs one call from Python,
or none from another compiled function (`strata_ref.infer.compiled`).

`runner(t, isa)` is the compiled function of type t on the
instruction-set chain `isa` (`strata_ref.cpu.isa`), holding exactly the
kernels that chain runs for t (its `vec_dot` variant, its tinyBLAS_Q0,
tiled and repacked ones where it has them) and its activation quantizer:

    run(repacked, tinyblas, mmid, raw, x, parts) -> out

raw: uint8 (rows, row_bytes), the tensor's blocks; x: float32 (n, cols);
out: float32 (n, rows). repacked: the tensor sits in ggml's CPU_REPACK
buffer; tinyblas: llamafile may take the product (False where ggml's own
row count is below what x has: the K of a KV cache, whose x stacks the
query heads of one KV head while ggml multiplies each head's tokens apart,
`attention.cache_dots`); mmid: the rows are one expert's share of a
MUL_MAT_ID (no tinyBLAS; the repacked path runs its gemv for every row);
parts: split the rows over that many of numba's threads. The path is
`traits.choose_path`'s, decided inside from n, so the compiled dense layer
calls the runner as it is.

`group_runner(types, isa)` makes two or three products of one x (q, k, v;
gate, up) in one call and one parallel region, each product's bits those
of its type's `runner`:

    run(repacked, raws, x, parts) -> outs      (tuples, in the order of types)
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit, prange

from .._jitcache import cached
from ..types import GGMLType
from . import kquant_dots, legacy_dots, mmla, neon_legacy
from ._digest import cpu_digest
from .act_quant import _q8_k
from .._threads import threads
from .traits import REPACK, TILED, TINYBLAS, VEC_DOT, Family, choose_path, kernel, vec_dot_type

__all__ = ["RUN_TYPES", "runner", "group_runner", "FAMILY", "StoredBlocks"]

#: the types `runner` serves
RUN_TYPES = legacy_dots.LEGACY_TYPES + kquant_dots.KQUANT_TYPES

_RUNNERS = {}
_GROUPS = {}


#: the one-row vec_dot variant of the two-row (i8mm) ones, which a
#: MUL_MAT_ID takes (ggml-cpu.c `ggml_compute_forward_mul_mat_id_one_chunk`)
ONE_ROW = dict(neon_legacy.ONE_ROW, neon_i8mm="neon")
assert set(ONE_ROW) == mmla.TWO_ROW_VARIANTS


def _one_row(module, t, isa):
    """The `RowKernels` of the vec_dot a MUL_MAT_ID runs."""
    v = kernel(isa, t, "vec_dot")
    return module.variant_kernels(t, ONE_ROW.get(v, v))


def _three(module, t, isa):
    """The `RowKernels` of the chain's vec_dot, tinyBLAS_Q0 and repacked
    variants of t (the vec_dot ones where it has no other)."""
    vd = module.variant_kernels(t, kernel(isa, t, "vec_dot"))
    tb = isa.lookup("TINYBLAS_Q0", t)
    rp = isa.resolve("REPACK").get(t)
    return (vd, module.variant_kernels(t, tb) if tb else vd, module.variant_kernels(t, rp) if rp else vd,
            tb is not None)


#: the compiled pieces of a runner: act(repacked, tinyblas, mmid, x) ->
#: a, the activations quantized with the path chosen (a tuple);
#: part(a, raw, out, parts, p), part p of `parts` of the product on one
#: thread, as the path's parallel kernel splits the rows (part(a, raw,
#: out, 1, 0): every row). A MUL_MAT_ID on a layout that `run` takes row
#: by row (MMID_ROW_BY_ROW) is `run`'s alone: `group_runner` makes dense
#: products only. act's quantizers are compiled functions of their own:
#: inlined into `group_runner`'s parallel function, numba would make
#: parallel reductions of any array expression in them and reorder floats.
Pieces = namedtuple("Pieces", "act part")


def _span_part(k):
    """part(...fixed args..., out, parts, p) of a `RowKernels` k: its span
    over part p of its own split."""
    span, split = k.span, k.split

    @njit(inline="always")
    def legacy(raw, xq, xs, xm, out, parts, p):
        R = raw.shape[0]
        span(raw, xq, xs, xm, out, split(R, parts, p), split(R, parts, p + 1))

    @njit(inline="always")
    def kquant(raw, xq, xd, xb, n_gemm, out, parts, p):
        R = raw.shape[0]
        span(raw, xq, xd, xb, n_gemm, out, split(R, parts, p), split(R, parts, p + 1))
    return legacy, kquant


def _legacy_pieces(t: GGMLType, isa):
    """(Pieces, run) of legacy type t on chain `isa`."""
    vd, tb, rp, HAS_TB = _three(legacy_dots, t, isa)
    v1 = _one_row(legacy_dots, t, isa)
    vd_part, tb_part, rp_part, v1_part = (_span_part(k)[0] for k in (vd, tb, rp, v1))
    vd_p, tb_p, rp_p, v1_p, rp_s = vd.parallel, tb.parallel, rp.parallel, v1.parallel, rp.serial
    QUANT = isa.resolve("quantize_rows_q8")
    # a MUL_MAT_ID on a repacked layout whose gemm rounds otherwise than its
    # gemv (`neon_legacy.GEMM_NOT_GEMV`) takes the gemv for every row, as
    # ggml does (repack.cpp `forward_mul_mat_id`): the kernel one row at a
    # time (with one row it has no group of 4 for the gemm)
    MMID_ROW_BY_ROW = isa.resolve("REPACK").get(t) in neon_legacy.GEMM_NOT_GEMV
    Q8_1 = vec_dot_type(t) == GGMLType.Q8_1

    @njit(inline="always")
    def act(repacked, tinyblas, mmid, x):
        n, k = x.shape
        xq = np.empty((n, k), np.int8)
        xs = np.empty((n, k // 32), np.float32)
        xm = np.empty((n, k // 32), np.float32) if Q8_1 else xs
        QUANT(x, xq, xs, xm, Q8_1)
        return choose_path(repacked, False, HAS_TB and tinyblas, n, mmid), mmid, xq, xs, xm

    @njit(inline="always")
    def part(a, raw, out, parts, p):
        path, mmid, xq, xs, xm = a
        if path == REPACK:
            rp_part(raw, xq, xs, xm, out, parts, p)
        elif path == TINYBLAS:
            tb_part(raw, xq, xs, xm, out, parts, p)
        elif mmid:
            v1_part(raw, xq, xs, xm, out, parts, p)
        else:
            vd_part(raw, xq, xs, xm, out, parts, p)

    def run(repacked, tinyblas, mmid, raw, x, parts):
        a = act(repacked, tinyblas, mmid, x)
        path, _, xq, xs, xm = a
        n = x.shape[0]
        out = np.empty((n, raw.shape[0]), np.float32)
        if path == REPACK and mmid and MMID_ROW_BY_ROW:
            for r in range(n):
                rp_s(raw, xq[r:r + 1], xs[r:r + 1], xm[r:r + 1], out[r:r + 1])
        elif parts <= 1:
            part(a, raw, out, 1, 0)
        elif path == REPACK:
            rp_p(raw, xq, xs, xm, out, parts)
        elif path == TINYBLAS:
            tb_p(raw, xq, xs, xm, out, parts)
        elif mmid:
            v1_p(raw, xq, xs, xm, out, parts)
        else:
            vd_p(raw, xq, xs, xm, out, parts)
        return out
    return Pieces(act, part), run


def _kquant_pieces(t: GGMLType, isa):
    """(Pieces, run) of K-quant type t on chain `isa`."""
    K = kquant_dots
    vd, _, rp, _ = _three(K, t, isa)
    TIE_ROWS = isa.resolve("REPACK").get(t) in K.AMAX_TIE_LAYOUTS
    HAS_TILED = t in isa.resolve("TILED")
    tl = K.variant_kernels(t, "tiled") if HAS_TILED else vd
    vd_part, tl_part, rp_part = (_span_part(k)[1] for k in (vd, tl, rp))
    vd_p, tl_p, rp_p = vd.parallel, tl.parallel, rp.parallel
    PER32 = t != GGMLType.Q6_K
    Q8_K_FMA = bool(isa.resolve("Q8_K_FMA"))

    @njit(inline="always")
    def act(repacked, tinyblas, mmid, x):
        n, k = x.shape
        path = choose_path(repacked, HAS_TILED, False, n, mmid)   # (no tinyBLAS_Q0 for K-quants)
        n_gemm = n - n % 4 if path == REPACK and not mmid else 0
        xq = np.empty((n, k), np.int8)
        xd = np.empty((n, k // 256), np.float32)
        b16 = np.empty((n, k // 16), np.int32)
        _q8_k(x, xq, xd, b16, n_gemm if TIE_ROWS else 0, Q8_K_FMA)
        if PER32:
            xb = np.empty((n, k // 32), np.int32)
            for t_ in range(n):
                for j in range(k // 32):
                    xb[t_, j] = b16[t_, 2 * j] + b16[t_, 2 * j + 1]
        else:
            xb = b16
        if path == VEC_DOT:
            # the two-row (i8mm) vec_dots take their n_gemm as "two rows
            # allowed": never for a MUL_MAT_ID; the others ignore it
            n_gemm = 0 if mmid else n
        return path, n_gemm, xq, xd, xb

    @njit(inline="always")
    def part(a, raw, out, parts, p):
        path, n_gemm, xq, xd, xb = a
        if path == REPACK:
            rp_part(raw, xq, xd, xb, n_gemm, out, parts, p)
        elif path == TILED:
            tl_part(raw, xq, xd, xb, n_gemm, out, parts, p)
        else:
            vd_part(raw, xq, xd, xb, n_gemm, out, parts, p)

    def run(repacked, tinyblas, mmid, raw, x, parts):
        a = act(repacked, tinyblas, mmid, x)
        path, n_gemm, xq, xd, xb = a
        out = np.empty((x.shape[0], raw.shape[0]), np.float32)
        if parts <= 1:
            part(a, raw, out, 1, 0)
        elif path == REPACK:
            rp_p(raw, xq, xd, xb, n_gemm, out, parts)
        elif path == TILED:
            tl_p(raw, xq, xd, xb, n_gemm, out, parts)
        else:
            vd_p(raw, xq, xd, xb, n_gemm, out, parts)
        return out
    return Pieces(act, part), run


def _pieces(t: GGMLType, isa):
    """(Pieces, compiled run) of type t on chain `isa`, made once."""
    t = GGMLType(t)
    key = (t, isa)
    r = _RUNNERS.get(key)
    if r is None:
        if t in legacy_dots.LEGACY_TYPES:
            pieces, fn = _legacy_pieces(t, isa)
        elif t in kquant_dots.KQUANT_TYPES:
            pieces, fn = _kquant_pieces(t, isa)
        else:
            raise KeyError(f"no compiled mat-mul runner for {t.name}")
        r = _RUNNERS[key] = pieces, cached(njit(fn), f"matvec_{t.name}_{isa.key}", cpu_digest)
    return r


def runner(t, isa):
    """The compiled `run` of weight type t on chain `isa` (module
    docstring); KeyError for a type not in `RUN_TYPES`."""
    return _pieces(t, isa)[1]


def group_runner(types, isa):
    """One compiled call for two or three products of the same
    activations (q, k and v; gate and up): run(repacked, raws, x, parts)
    -> outs, repacked / raws / outs tuples in the order of `types`, each
    product as `runner(t, isa)` computes it (dense, no MUL_MAT_ID,
    tinyBLAS allowed) but all of them in one parallel region, part p of
    every matrix on thread p (a decode step's small matrices cost their
    region's start more than their reading). KeyError for a type not in
    `RUN_TYPES`; ValueError for another count."""
    types = tuple(GGMLType(t) for t in types)
    key = (types, isa)
    r = _GROUPS.get(key)
    if r is None:
        if len(types) not in (2, 3):
            raise ValueError(f"group_runner takes 2 or 3 types, got {len(types)}")
        ps = [_pieces(t, isa)[0] for t in types]
        fn = _group3(*ps) if len(ps) == 3 else _group2(*ps)
        name = f"matvec_group_{'_'.join(t.name for t in types)}_{isa.key}"
        r = _GROUPS[key] = cached(njit(parallel=True)(fn), name, cpu_digest)
    return r


# two and three products written out: each product's activations have its
# type's own tuple type, which numba cannot index in a loop
def _group2(a, b):
    act_a, act_b, part_a, part_b = a.act, b.act, a.part, b.part

    def run(repacked, raws, x, parts):
        n = x.shape[0]
        ra, rb = raws
        xa, xb = act_a(repacked[0], True, False, x), act_b(repacked[1], True, False, x)
        oa, ob = np.empty((n, ra.shape[0]), np.float32), np.empty((n, rb.shape[0]), np.float32)
        if parts <= 1:              # no parallel region to enter
            part_a(xa, ra, oa, 1, 0)
            part_b(xb, rb, ob, 1, 0)
            return oa, ob
        for p in prange(parts):
            part_a(xa, ra, oa, parts, p)
            part_b(xb, rb, ob, parts, p)
        return oa, ob
    return run


def _group3(a, b, c):
    act_a, act_b, act_c, part_a, part_b, part_c = a.act, b.act, c.act, a.part, b.part, c.part

    def run(repacked, raws, x, parts):
        n = x.shape[0]
        ra, rb, rc = raws
        xa, xb = act_a(repacked[0], True, False, x), act_b(repacked[1], True, False, x)
        xc = act_c(repacked[2], True, False, x)
        oa, ob = np.empty((n, ra.shape[0]), np.float32), np.empty((n, rb.shape[0]), np.float32)
        oc = np.empty((n, rc.shape[0]), np.float32)
        if parts <= 1:              # no parallel region to enter
            part_a(xa, ra, oa, 1, 0)
            part_b(xb, rb, ob, 1, 0)
            part_c(xc, rc, oc, 1, 0)
            return oa, ob, oc
        for p in prange(parts):
            part_a(xa, ra, oa, parts, p)
            part_b(xb, rb, ob, parts, p)
            part_c(xc, rc, oc, parts, p)
        return oa, ob, oc
    return run


#: the packed form of a stored-block matrix: its runner and its blocks as
#: uint8 (rows, row_bytes), read in place (a memory map of the GGUF file)
StoredBlocks = namedtuple("StoredBlocks", "runner blocks")


class _StoredFamily(Family):
    """The types of `RUN_TYPES`: nothing is copied, the kernels read the
    GGUF bytes as they are."""

    def pack(self, qm):
        return StoredBlocks(runner(qm.type, qm.profile.isa), qm.raw.reshape(qm.rows, -1))

    def matmul(self, qm, packed, x, segments, parallel, mmid):
        parts = threads() if parallel else 1
        return self.by_segment(qm, segments, lambda r0, r1, path, variant: packed.runner(
            path == "repack", path == "tinyblas", bool(mmid), packed.blocks[r0:r1], x, parts))


FAMILY = _StoredFamily()
