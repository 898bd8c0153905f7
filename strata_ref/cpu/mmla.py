"""Which outputs of a mat-mul ggml-cpu's i8mm builds compute with the
two-row `vec_dot` (`vmmlaq_s32`, `nrows = 2`), per llama.cpp vendored by
llama-cpp-python 0.3.36 (`ggml_compute_forward_mul_mat`, ggml-cpu.c).

With `__ARM_FEATURE_MATMUL_INT8` the `vec_dot`s of Q4_0, Q4_1, Q8_0, Q4_K
and Q6_K take 2 weight rows x 2 activation rows at once, in another float
order than their one-row code; ggml uses them for a chunk of the output
only when the weight rows (nr0), the activation rows (nr1) and both sides
of the chunk are even. The chunks come from the thread count: chunk_size
16 (64 when nr0 or nr1 is 1), nchunk = ceil(nr / chunk_size) per side; when
nchunk0 * nchunk1 < 4 * nth the work is re-chunked by thread (nchunk0 =
nth, nchunk1 = 1 if nr0 > nr1, else the reverse); chunk (i0, i1) covers
rows [dr0 i0, dr0 (i0 + 1)) x [dr1 i1, dr1 (i1 + 1)) clipped, dr =
ceil(nr / nchunk). So the bits of such a product depend on the number of
threads llama.cpp ran with: `THREADS`, the count the arm64 reference data
was made with (`tools/arm_ref.py`: 2). A pair's outputs are computed
independently (one float lane each), so only the chunk's choice matters,
not which row is its partner. A MUL_MAT_ID (experts) always takes the
one-row `vec_dot`.
"""
from __future__ import annotations

from numba import njit

__all__ = ["THREADS", "TWO_ROW_VARIANTS", "two_rows"]

#: llama.cpp's thread count that the i8mm profile reproduces
THREADS = 2
#: the `VEC_DOT` variants (`strata_ref.cpu.isa`) that take two rows at once
#: where `two_rows` says so: their bits depend on the tensor's own row count
TWO_ROW_VARIANTS = frozenset({"i8mm", "neon_i8mm"})


@njit(inline="always", cache=True)
def _span(i, nr, nchunk):
    # the rows of chunk i of nr rows in nchunk chunks: (start, end)
    dr = (nr + nchunk - 1) // nchunk
    s = dr * (i // dr)
    return s, min(s + dr, nr)


@njit(inline="always", cache=True)
def two_rows(r, t, nr0, nr1, nth):
    """Whether ggml computes the output of weight row r and activation row
    t (of nr0 x nr1, nth threads) with the two-row `vec_dot` (module
    docstring)."""
    if nr0 % 2 != 0 or nr1 % 2 != 0:
        return False
    chunk = 64 if nr0 == 1 or nr1 == 1 else 16
    nc0 = (nr0 + chunk - 1) // chunk
    nc1 = (nr1 + chunk - 1) // chunk
    if nc0 * nc1 < nth * 4:
        nc0 = nth if nr0 > nr1 else 1
        nc1 = 1 if nr0 > nr1 else nth
    s0, e0 = _span(r, nr0, nc0)
    s1, e1 = _span(t, nr1, nc1)
    return (e0 - s0) % 2 == 0 and (e1 - s1) % 2 == 0
