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

from pathlib import Path

from numba import njit, prange

from .._jitcache import cached, sources_digest

__all__ = ["cpu_digest", "jit", "legacy_row_kernels", "kquant_row_kernels"]


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


def legacy_row_kernels(rows, name: str):
    """(serial, parallel) compiled kernels over a factory's numba function
    rows(raw, xq, xs, xm, out, r0, r1), which fills out[:, r0:r1]:
    serial(raw, xq, xs, xm, out) does every weight row, parallel(raw, xq,
    xs, xm, out, parts) splits them into `parts` contiguous ranges run by
    numba's threads (each row's arithmetic is the same on any thread);
    cached as `name`_serial / _parallel (`legacy_dots.kernels`' interface)."""
    def serial(raw, xq, xs, xm, out):
        rows(raw, xq, xs, xm, out, 0, raw.shape[0])

    def parallel(raw, xq, xs, xm, out, parts):
        R = raw.shape[0]
        for p in prange(parts):
            rows(raw, xq, xs, xm, out, R * p // parts, R * (p + 1) // parts)
    return (cached(njit(serial), name + "_serial", cpu_digest),
            cached(njit(parallel=True)(parallel), name + "_parallel", cpu_digest))


def kquant_row_kernels(rows, name: str):
    """As `legacy_row_kernels` for rows(raw, xq, xd, xb, n_gemm, out, r0,
    r1) of the K-quant interface (`kquant_dots.kernels`): serial(raw, xq,
    xd, xb, n_gemm, out), parallel(..., parts)."""
    def serial(raw, xq, xd, xb, n_gemm, out):
        rows(raw, xq, xd, xb, n_gemm, out, 0, raw.shape[0])

    def parallel(raw, xq, xd, xb, n_gemm, out, parts):
        R = raw.shape[0]
        for p in prange(parts):
            rows(raw, xq, xd, xb, n_gemm, out, R * p // parts, R * (p + 1) // parts)
    return (cached(njit(serial), name + "_serial", cpu_digest),
            cached(njit(parallel=True)(parallel), name + "_parallel", cpu_digest))
