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

_DRIVERS = {}


def _driver(block_fn):
    drive = _DRIVERS.get(block_fn)
    if drive is None:
        @njit(nogil=True, error_model="numpy")
        def drive(x, out):
            for i in range(x.shape[0]):
                block_fn(x[i], out[i])
        _DRIVERS[block_fn] = drive
    return drive


def run_blocks(block_fn, x: np.ndarray, block_bytes: int) -> np.ndarray:
    """(n, QK) float32 -> (n, block_bytes) uint8 by `block_fn` per block."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], block_bytes), np.uint8)
    if x.shape[0]:
        _driver(block_fn)(x, out)
    return out


def register_block_quantizer(t, block_fn):
    """Register `block_fn` as type t's quantizer (strata_ref.formats registry):
    the registered function maps float32 (n, QK) to uint8 (n, B)."""
    from ..types import block_format
    from . import register_quantize
    fmt = block_format(t)

    def quantize_blocks(x):
        return run_blocks(block_fn, x, fmt.block_bytes)
    quantize_blocks.__name__ = f"quantize_{fmt.name.lower()}"
    quantize_blocks.__doc__ = (f"{fmt.name}: float32 (n, {fmt.block_values}) -> uint8 "
                               f"(n, {fmt.block_bytes}). {block_fn.__doc__}")
    return register_quantize(t)(quantize_blocks)


@njit(nogil=True, cache=True)
def _first_nonfinite(u):
    # an OR-reduction per chunk (vectorisable), the position only when needed
    n = u.shape[0]
    for c in range(0, n, 4096):
        e = min(n, c + 4096)
        bad = False
        for i in range(c, e):
            bad |= (u[i] & 0x7F800000) == 0x7F800000
        if bad:
            for i in range(c, e):
                if (u[i] & 0x7F800000) == 0x7F800000:
                    return i
    return -1


def first_nonfinite(x: np.ndarray) -> int:
    """Flat index of the first NaN or ±Inf of a float32 array, or -1 (one pass
    over the bits, no temporary arrays)."""
    return int(_first_nonfinite(np.ascontiguousarray(x, np.float32).reshape(-1).view(np.uint32)))
