"""numba compilation of the CPU kernels with an on-disk cache that cannot
go stale (`strata_ref._jitcache`).

numba's own cache keys a function on its file's time stamp and its
bytecode, not on the functions it inlines from other files nor on the
switches read at import (`simd.HOST_AVX2`, `HOST_VNNI`, `HOST_F16C`): after
an edit of an instruction-set module, or with STRATA_REF_PORTABLE_LANES set
differently, it would load machine code compiled from other sources. Every
CPU kernel is therefore compiled through `jit` (or `cached` with
`cpu_digest` for the closures made by factories), whose cache key holds a
digest of every source the kernels inline (this package, its
instruction-set modules, numerics, types) and of those switches.
"""
from __future__ import annotations

from collections import namedtuple
from pathlib import Path

from numba import njit, prange

from .._jitcache import cached, sources_digest

__all__ = ["cpu_digest", "jit", "even_split", "RowKernels", "legacy_row_kernels", "kquant_row_kernels"]

#: the compiled kernels of one weight layout: serial(...) over every weight
#: row, parallel(..., parts) over `parts` ranges on numba's threads,
#: span(..., r0, r1) over rows r0 .. r1 (what each part runs; a caller
#: with its own parallel region, `matvec.group_runner`, calls it), and
#: split(R, parts, p), the first row of part p (the boundaries the layout
#: allows)
RowKernels = namedtuple("RowKernels", "serial parallel span split")


def cpu_digest() -> str:
    from .simd import HOST_AVX2, HOST_AVX512BW, HOST_F16C, HOST_VNNI
    here = Path(__file__).resolve().parent
    switches = "".join("1" if s else "0" for s in (HOST_AVX2, HOST_VNNI, HOST_F16C, HOST_AVX512BW))
    return sources_digest(here, here / "isa", here.parent / "numerics.py",
                          here.parent / "types.py") + "-" + switches


def jit(fn=None, **options):
    """`numba.njit(**options)` with the on-disk cache keyed on `cpu_digest`
    (module docstring); as `@jit` or `@jit(parallel=True)`."""
    def wrap(f):
        return cached(njit(**options)(f), f.__qualname__, cpu_digest)
    return wrap(fn) if fn is not None else wrap


@njit(inline="always")
def even_split(R, parts, p):
    """The first row of part p of `parts` equal parts of R rows."""
    return R * p // parts


# Why the rows run in a function of their own (`span` below), not inlined
# into the serial and parallel kernels: numba outlines a prange body into a
# function of its own, and LLVM compiled the inlined K-quant row loop there
# into slower code than in a plain function (Q4_K's repacked gemv on a
# Zen 4, one thread, the parallel kernel with 2 parts: 0.74 ms against
# 0.56 for the serial one on an 8960 x 1536 matrix; at 2 threads the 151936
# x 1536 output matrix 6.8 ms, 19 GB/s, against 4.4 ms, 30 GB/s, when the
# body calls the compiled row loop). The arithmetic is the same code.
def legacy_row_kernels(rows, name: str, split=even_split):
    """The `RowKernels` (serial, parallel, span, split) over a factory's numba function
    rows(raw, xq, xs, xm, out, r0, r1), which fills out[:, r0:r1]:
    serial(raw, xq, xs, xm, out) does every weight row, parallel(raw, xq,
    xs, xm, out, parts) splits them into `parts` contiguous ranges (part p
    from row split(R, parts, p)) run by numba's threads (each row's
    arithmetic is the same on any thread); cached as `name`_span / _serial
    / _parallel (`legacy_dots.kernels`' interface)."""
    def span(raw, xq, xs, xm, out, r0, r1):
        rows(raw, xq, xs, xm, out, r0, r1)
    span_c = cached(njit(span), name + "_span", cpu_digest)

    def serial(raw, xq, xs, xm, out):
        span_c(raw, xq, xs, xm, out, 0, raw.shape[0])

    def parallel(raw, xq, xs, xm, out, parts):
        R = raw.shape[0]
        for p in prange(parts):
            span_c(raw, xq, xs, xm, out, split(R, parts, p), split(R, parts, p + 1))
    return RowKernels(cached(njit(serial), name + "_serial", cpu_digest),
                      cached(njit(parallel=True)(parallel), name + "_parallel", cpu_digest), span_c, split)


def kquant_row_kernels(rows, name: str):
    """As `legacy_row_kernels` for rows(raw, xq, xd, xb, n_gemm, out, r0,
    r1) of the K-quant interface (`kquant_dots.kernels`): serial(raw, xq,
    xd, xb, n_gemm, out), parallel(..., parts), span(..., r0, r1); parts
    split evenly (each row's arithmetic is its own)."""
    def span(raw, xq, xd, xb, n_gemm, out, r0, r1):
        rows(raw, xq, xd, xb, n_gemm, out, r0, r1)
    span_c = cached(njit(span), name + "_span", cpu_digest)

    def serial(raw, xq, xd, xb, n_gemm, out):
        span_c(raw, xq, xd, xb, n_gemm, out, 0, raw.shape[0])

    def parallel(raw, xq, xd, xb, n_gemm, out, parts):
        R = raw.shape[0]
        for p in prange(parts):
            span_c(raw, xq, xd, xb, n_gemm, out, even_split(R, parts, p), even_split(R, parts, p + 1))
    return RowKernels(cached(njit(serial), name + "_serial", cpu_digest),
                      cached(njit(parallel=True)(parallel), name + "_parallel", cpu_digest), span_c, even_split)
