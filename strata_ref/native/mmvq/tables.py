"""Rows-per-warp tables of the interleaved multi-column mat-vec, as data.

`table[type][ncols - 2][row_class]` is the number of consecutive rows one
warp computes (1, 2 or 4); 0 means "use the plain kernel". Row classes split
n_out at 2048, 4096, 8192 and 12288 (`row_class`). Only types 23 (IQ4_XS),
12 (Q4_K), 13 (Q5_K) and 14 (Q6_K) and 2..4 columns have entries; every
other lookup gives 0. Sources (../shared/spec/kernels.md §9):

* SHARED: zsariboga/Strata src/kernels/cuda/native_mmvq.cu, the table for
  sm_86 / sm_89 / sm_120 and every other sm_80+ card;
* SM70: the V100-SXM2 table of the same file (`kIlArch = {{70, kIlRows_70}}`);
* SM61 and SM61_1COL: all zeros, a valid bit-identical placeholder, until
  `strata-ref bench mmvq --emit-table` is run on a compute capability 6.1
  card and its output committed here with its log (no values are published).
"""
from __future__ import annotations

from ...types import GGMLType

__all__ = ["SHARED", "SM70", "SM61", "SM61_1COL", "TABLES", "H200_MEASURED", "IL_TYPES", "LEGAL_ROWS",
           "ROW_CLASS_BOUNDS", "row_class", "lookup"]

T = GGMLType
IL_TYPES = (T.IQ4_XS, T.Q4_K, T.Q5_K, T.Q6_K)
LEGAL_ROWS = (0, 1, 2, 4)
ROW_CLASS_BOUNDS = (2048, 4096, 8192, 12288)

SHARED = {
    T.IQ4_XS: ((0, 0, 0, 0, 0), (0, 0, 2, 4, 4), (0, 1, 1, 1, 1)),
    T.Q4_K:   ((0, 0, 1, 1, 1), (0, 1, 1, 1, 1), (0, 1, 1, 1, 1)),
    T.Q5_K:   ((0, 0, 1, 1, 1), (0, 4, 1, 1, 1), (0, 1, 1, 1, 2)),
    T.Q6_K:   ((0, 0, 1, 1, 0), (0, 0, 1, 1, 2), (0, 0, 1, 1, 1)),
}
SM70 = {
    T.IQ4_XS: ((0, 2, 2, 2, 2), (0, 2, 2, 2, 2), (0, 4, 2, 2, 2)),
    T.Q4_K:   ((0, 2, 2, 4, 4), (0, 2, 2, 2, 2), (0, 2, 2, 2, 2)),
    T.Q5_K:   ((0, 2, 2, 2, 2), (0, 2, 2, 2, 2), (0, 1, 2, 2, 2)),
    T.Q6_K:   ((0, 1, 1, 1, 1), (0, 2, 2, 2, 2), (0, 2, 2, 4, 2)),
}
_ZERO = ((0,) * 5,) * 3
SM61 = {t: _ZERO for t in IL_TYPES}
#: 1-column rows per warp on 6.1 (row class 0..4); zeros until measured.
SM61_1COL = {t: (0,) * 5 for t in IL_TYPES}

TABLES = {"shared": SHARED, "sm_70": SM70, "sm_61": SM61}

#: Emitted by `run_bench_mmvq(emit_table=True)` on one NVIDIA H200 (cc 9.0,
#: 2026-11-30, K = 2560, 200 reps per arm, weights L2-cold, strata-ref's own
#: kernels as of ABI 4; log in docs/mmvq.md). Not selected
#: by `mmvq.policy` (cc >= 80 takes SHARED, as kernels.md §12 says); use it
#: through STRATA_MMVQ_IL_ROWS or adopt it there.
H200_MEASURED = {
    T.IQ4_XS: ((1, 1, 2, 2, 4), (0, 1, 4, 4, 4), (1, 1, 4, 4, 4)),
    T.Q4_K:   ((0, 1, 2, 1, 1), (0, 1, 4, 2, 2), (0, 1, 4, 1, 1)),
    T.Q5_K:   ((0, 1, 2, 1, 1), (0, 1, 1, 1, 1), (0, 1, 4, 2, 2)),
    T.Q6_K:   ((0, 1, 2, 2, 2), (0, 1, 4, 1, 4), (1, 1, 2, 2, 2)),
}


def row_class(n_out: int) -> int:
    """0 for n_out < 2048, 1 for [2048, 4096), 2 for [4096, 8192),
    3 for [8192, 12288), 4 for >= 12288."""
    return sum(n_out >= b for b in ROW_CLASS_BOUNDS)


def lookup(table: dict, t, ncols: int, n_out: int) -> int:
    """Rows per warp in `table` for (type, 2..4 columns, n_out); 0 when the
    table has no such cell."""
    try:
        t = GGMLType(t)
    except ValueError:
        return 0
    if t not in table or not 2 <= ncols <= 4:
        return 0
    return table[t][ncols - 2][row_class(n_out)]
