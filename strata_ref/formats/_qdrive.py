"""Run a numba block quantizer over many blocks.

A block quantizer is `fn(x, b)`: `x` one block's QK float32 inputs, `b` the
block's B output bytes (zeroed before the call, laid out per
`strata_ref.types.block_format`). `run_blocks` applies it to every row of an
(n, QK) float32 array and returns the (n, B) uint8 blocks. 
Each block function gets its own compiled loop, in which the block function
is a compile-time constant: called directly, it runs several times faster
than through a function-typed argument. The loop is serial: a parallel
(parfors) loop costs seconds to compile and, on a shared 2-core machine, was
measured slower than the serial one.
"""
import numpy as np
from numba import njit

from .._jitcache import cached

_DRIVERS = {}


def _digest() -> str:
    # the block quantizers a driver inlines live in this package
    from . import _digest as formats_digest
    return formats_digest()


class NonFiniteInput(ValueError):
    """A block holds NaN or ±Inf; `index` is the flat index of the first one."""

    def __init__(self, index: int):
        super().__init__(f"NaN or Inf at flat index {index}")
        self.index = index


def _driver(block_fn):
    # drive(x, out, check) -> -1, or the first block holding NaN/Inf when
    # check is set (that block and the ones after it are left unwritten).
    # The check reads the block just before block_fn does, from cache: an OR
    # over (bits & 0x7F800000) + 0x00800000, whose bit 31 marks an all-ones
    # exponent, in 32-bit integer lanes.
    drive = _DRIVERS.get(block_fn)
    if drive is None:
        def drive(x, out, check):
            u = x.view(np.uint32)
            for i in range(x.shape[0]):
                if check:
                    acc = np.uint32(0)
                    for j in range(u.shape[1]):
                        acc |= (u[i, j] & np.uint32(0x7F800000)) + np.uint32(0x00800000)
                    if acc >> np.uint32(31):
                        return i
                block_fn(x[i], out[i])
            return -1
        # a closure over its block function: its own on-disk cache
        # (strata_ref._jitcache), named after that function
        f = getattr(block_fn, "py_func", block_fn)
        drive = _DRIVERS[block_fn] = cached(njit(nogil=True, error_model="numpy")(drive),
                                            f"qdrive_{f.__module__}.{f.__qualname__}", _digest)
    return drive


_MIN_BLOCKS_PER_THREAD = 8192
_POOL = None


def _run_threads(drive, x, out, check_finite) -> int:
    # The driver releases the GIL (nogil), so contiguous slices of blocks run
    # in parallel threads; blocks are independent, so the bytes are the same.
    import os
    global _POOL
    n = x.shape[0]
    k = min(os.cpu_count() or 1, n // _MIN_BLOCKS_PER_THREAD)
    if k < 2:
        return drive(x, out, check_finite)
    if _POOL is None:
        import concurrent.futures
        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count())
    cuts = np.linspace(0, n, k + 1).astype(np.int64)
    parts = list(_POOL.map(lambda i: drive(x[cuts[i]:cuts[i + 1]], out[cuts[i]:cuts[i + 1]], check_finite),
                           range(k)))
    for i, bad in enumerate(parts):   # the first non-finite block in input order
        if bad >= 0:
            return int(cuts[i] + bad)
    return -1


def run_blocks(block_fn, x: np.ndarray, block_bytes: int, check_finite: bool = False) -> np.ndarray:
    """(n, QK) float32 -> (n, block_bytes) uint8 by `block_fn` per block.
    With `check_finite`, raises NonFiniteInput for a NaN or ±Inf in x."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], block_bytes), np.uint8)
    if x.shape[0]:
        bad = _run_threads(_driver(block_fn), x, out, check_finite)
        if bad >= 0:
            j = int(np.flatnonzero(~np.isfinite(x[bad]))[0])
            raise NonFiniteInput(bad * x.shape[1] + j)
    return out


def register_block_quantizer(t, block_fn):
    """Register `block_fn` as type t's quantizer (strata_ref.formats registry):
    the registered function maps float32 (n, QK) to uint8 (n, B)."""
    from ..types import block_format
    from . import register_quantize
    fmt = block_format(t)

    def quantize_blocks(x, check_finite=False):
        return run_blocks(block_fn, x, fmt.block_bytes, check_finite)
    quantize_blocks.__name__ = f"quantize_{fmt.name.lower()}"
    quantize_blocks.__doc__ = (f"{fmt.name}: float32 (n, {fmt.block_values}) -> uint8 "
                               f"(n, {fmt.block_bytes}); check_finite: raise NonFiniteInput "
                               f"for NaN/Inf. {block_fn.__doc__}")
    quantize_blocks.checks_finite = True
    return register_quantize(t)(quantize_blocks)


@njit(nogil=True, cache=True)
def _first_nonfinite(u):
    # Per chunk an OR over (u & 0x7F800000) + 0x00800000, whose bit 31 is set
    # exactly for an all-ones exponent (NaN, ±Inf): 32-bit integer lanes,
    # vectorisable; the position is searched only in a chunk that has one.
    n = u.shape[0]
    mask = np.uint32(0x7F800000)
    one = np.uint32(0x00800000)
    for c in range(0, n, 8192):
        e = min(n, c + 8192)
        acc = np.uint32(0)
        for i in range(c, e):
            acc |= (u[i] & mask) + one
        if acc >> np.uint32(31):
            for i in range(c, e):
                if (u[i] & mask) == mask:
                    return i
    return -1


def first_nonfinite(x: np.ndarray) -> int:
    """Flat index of the first NaN or ±Inf of a float32 array, or -1 (one pass
    over the bits, no temporary arrays)."""
    return int(_first_nonfinite(np.ascontiguousarray(x, np.float32).reshape(-1).view(np.uint32)))
