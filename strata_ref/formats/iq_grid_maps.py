"""Lattice maps of ggml's grid quantizers (IQ3_XXS, IQ3_S, IQ2_S, IQ1_M).

A grid quantizer first rounds each group of n values (n = 4 for IQ3, 8 for
IQ2) to integer levels l in 0..L-1, which names a point of the lattice
{0..L-1}^n by the index u = sum(l_i << (bits * i)). ggml then needs, for
every lattice point, either the grid row that *is* this point, or the grid
rows *nearest* to it, so that the quantizer can try those. ggml builds both
tables once, at `ggml_quantize_init` (`iq3xs_init_impl` for the 256- and
512-row IQ3 grids, `iq2xs_init_impl` for the 1024-row IQ2_S grid and the
2048-row IQ1 grid; ggml-org/ggml src/ggml-quants.c). This module builds the same tables,
lazily, cached in memory.

Facts reproduced from ggml:

* A grid row's level on axis i is the row's byte i mapped back through the
  format's level values (`LEVELS` below); its position is 2*l + 1.
* The distance between a lattice point and a grid row is the integer sum of
  squared differences of the positions.
* The nearest rows of a point are all rows whose distance is among the
  `nwant` smallest distinct distances (2 for the 256-row IQ3 grid, 3 for the
  512-row one, 1 for IQ2_S, 3 for the 2048-row IQ1 grid), ordered by
  (distance, row index). ggml sorts (distance, index) pairs with `qsort`
  and a comparator that compares both fields; as the indices are distinct this is a total order, so the order
  (which decides ties in the quantizer's strict `<` search) does not depend
  on the C library's sort.

Only lattice points the quantizers can reach are given neighbours: every
level below `query_levels` (ggml's IQ2_S quantizer clamps levels to 0..2,
IQ1_M's has only 0..2, the IQ3 quantizers clamp to 0..7). Points outside that set have no neighbours and
would be reported as an error, never silently used.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import njit

from . import iq_tables

__all__ = ["GridMap", "grid_map", "LEVELS"]

#: Grid element value of each level l, per grid (ggml-common.h tables; ggml's
#: init functions hold the same rows as packed level indices).
LEVELS = {
    "iq3xxs": (4, 12, 20, 28, 36, 44, 52, 62),
    "iq3s": (1, 3, 5, 7, 9, 11, 13, 15),
    "iq2s": (8, 25, 43),
    "iq1s": (-1, 0, 1),
}

# grid name -> (row bytes, bits per level in u, nwant, query_levels)
_SPECS = {
    "iq3xxs": (iq_tables.IQ3XXS_GRID_BYTES, 3, 2, 8),
    "iq3s": (iq_tables.IQ3S_GRID_BYTES, 3, 3, 8),
    "iq2s": (iq_tables.IQ2S_GRID_BYTES, 2, 1, 3),
    "iq1s": (iq_tables.IQ1S_GRID_BYTES, 2, 3, 3),
}


@dataclass(frozen=True)
class GridMap:
    """The lookup tables of one grid, as ggml's quantizer uses them.

    pos:      int8 (rows, n): 2*l + 1 of each grid row's levels.
    kmap:     int32 (2**(bits*n),): grid row of lattice point u, or -1.
    nb_start: int32 (2**(bits*n),): start of u's neighbour list in `nb`.
    nb_count: int32 (2**(bits*n),): its length (0 for grid points and
              for points no quantizer reaches).
    nb:       int32 (total,): neighbour row indices, by (distance, index).
    """
    pos: np.ndarray
    kmap: np.ndarray
    nb_start: np.ndarray
    nb_count: np.ndarray
    nb: np.ndarray


def _grid_positions(rows: np.ndarray, levels: tuple[int, ...]) -> np.ndarray:
    rows = np.asarray(rows, np.int16)
    lv = np.full(rows.shape, -1, np.int16)
    for i, v in enumerate(levels):
        lv[rows == v] = i
    if (lv < 0).any():
        raise AssertionError("grid byte outside the declared levels")
    return (2 * lv + 1).astype(np.int8)


@njit(cache=True)
def _lattice_map(pos, bits, query_levels):
    nrow, n = pos.shape
    size = 1 << (bits * n)
    kmap = np.full(size, -1, np.int32)
    for g in range(nrow):
        u = 0
        for i in range(n):
            u |= ((pos[g, i] - 1) // 2) << (bits * i)
        kmap[u] = g
    # A point is reachable when every level is below query_levels.
    reach = np.zeros(size, np.bool_)
    mask = (1 << bits) - 1
    for u in range(size):
        ok = True
        for i in range(n):
            if ((u >> (bits * i)) & mask) >= query_levels:
                ok = False
        reach[u] = ok and kmap[u] < 0
    return kmap, reach


@njit(cache=True)
def _distances(pos, u, bits, d2):
    nrow, n = pos.shape
    mask = (1 << bits) - 1
    for g in range(nrow):
        s = 0
        for i in range(n):
            p = 2 * ((u >> (bits * i)) & mask) + 1
            t = pos[g, i] - p
            s += t * t
        d2[g] = s


@njit(cache=True)
def _cutoff(d2, nwant):
    # The nwant-th smallest distinct distance.
    cut = -1
    for _ in range(nwant):
        best = 1 << 30
        for v in d2:
            if v > cut and v < best:
                best = v
        cut = best
    return cut


@njit(cache=True)
def _neighbours(pos, reach, bits, nwant):
    nrow = pos.shape[0]
    size = reach.shape[0]
    d2 = np.empty(nrow, np.int64)
    nb_start = np.zeros(size, np.int32)
    nb_count = np.zeros(size, np.int32)
    total = 0
    for u in range(size):
        if not reach[u]:
            continue
        _distances(pos, u, bits, d2)
        cut = _cutoff(d2, nwant)
        c = 0
        for v in d2:
            if v <= cut:
                c += 1
        nb_start[u] = total
        nb_count[u] = c
        total += c
    nb = np.empty(total, np.int32)
    for u in range(size):
        if not reach[u]:
            continue
        _distances(pos, u, bits, d2)
        cut = _cutoff(d2, nwant)
        k = nb_start[u]
        # Ascending distance, then ascending row index: ggml's sort order.
        level = -1
        while True:
            nxt = 1 << 30
            for v in d2:
                if v > level and v < nxt:
                    nxt = v
            if nxt > cut:
                break
            for g in range(nrow):
                if d2[g] == nxt:
                    nb[k] = g
                    k += 1
            level = nxt
    return nb_start, nb_count, nb


@functools.lru_cache(maxsize=None)
def grid_map(name: str) -> GridMap:
    """The GridMap of grid `name` ("iq3xxs", "iq3s", "iq2s" or "iq1s"), built on
    first use (well under a second) and cached. KeyError for other names."""
    rows, bits, nwant, query_levels = _SPECS[name]
    pos = _grid_positions(rows, LEVELS[name])
    kmap, reach = _lattice_map(pos, bits, query_levels)
    nb_start, nb_count, nb = _neighbours(pos, reach, bits, nwant)
    for a in (pos, kmap, nb_start, nb_count, nb):
        a.setflags(write=False)
    return GridMap(pos, kmap, nb_start, nb_count, nb)
