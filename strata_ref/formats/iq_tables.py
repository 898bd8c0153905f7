"""ggml's I-quant lookup tables as read-only numpy arrays.

Source: ggml `ggml-common.h` (ggml-org/llama.cpp `ggml/src/ggml-common.h`;
the same file as ggml-org/ggml `src/ggml-common.h`), parsed by
tools/gen_iq_tables.py into `_iq_tables_data` (its `SOURCE` and
`SOURCE_SHA256` name the exact header). tests/test_iq_tables.py checks every
entry against the official `gguf` package's compressed copies and the facts
of ../shared/spec/formats.md §7.

Tables keep ggml's names, upper-cased, in ggml's element types:

========================  ==============  ===================================
name                      dtype, shape    used by
========================  ==============  ===================================
KMASK_IQ2XS               uint8 (8,)      signed IQ2/IQ3: `1 << j`
KSIGNS_IQ2XS              uint8 (128,)    IQ2_XXS, IQ2_XS, IQ3_XXS
IQ2XXS_GRID               uint64 (256,)   IQ2_XXS
IQ2XS_GRID                uint64 (512,)   IQ2_XS
IQ2S_GRID                 uint64 (1024,)  IQ2_S
IQ3XXS_GRID               uint32 (256,)   IQ3_XXS
IQ3S_GRID                 uint32 (512,)   IQ3_S
IQ1S_GRID                 uint64 (2048,)  IQ1_S, IQ1_M (CPU), int8[8] rows
IQ1S_GRID_GPU             uint32 (2048,)  IQ1_S, IQ1_M (ggml's CUDA kernels)
KVALUES_IQ4NL             int8 (16,)      IQ4_NL, IQ4_XS
========================  ==============  ===================================

A grid row is read as little-endian memory, as C reads it through a byte
pointer: element j of row g is byte j of the integer. The `*_BYTES` arrays
hold the rows that way, shape (rows, elements per row): uint8, except
IQ1S_GRID_BYTES, which is int8 (values -1, 0, 1).

numba freezes these arrays into the compiled block functions of `iquants`,
and its on-disk cache does not notice a change of a global: after
regenerating the data module, delete strata_ref/formats/__pycache__.
"""
from __future__ import annotations

import numpy as np

from . import _iq_tables_data as _data

__all__ = [
    "SOURCE", "SOURCE_SHA256",
    "KMASK_IQ2XS", "KSIGNS_IQ2XS", "IQ2XXS_GRID", "IQ2XS_GRID", "IQ2S_GRID",
    "IQ3XXS_GRID", "IQ3S_GRID", "IQ1S_GRID", "IQ1S_GRID_GPU", "KVALUES_IQ4NL",
    "IQ2XXS_GRID_BYTES", "IQ2XS_GRID_BYTES", "IQ2S_GRID_BYTES",
    "IQ3XXS_GRID_BYTES", "IQ3S_GRID_BYTES", "IQ1S_GRID_BYTES",
]

SOURCE: str = _data.SOURCE
SOURCE_SHA256: str = _data.SOURCE_SHA256

_DTYPES = {"uint8_t": np.uint8, "int8_t": np.int8,
           "uint32_t": np.uint32, "uint64_t": np.uint64}


def _table(name: str) -> np.ndarray:
    a = np.array(getattr(_data, name), dtype=_DTYPES[_data.TABLE_TYPES[name]])
    a.setflags(write=False)
    return a


def _row_bytes(grid: np.ndarray, dtype=np.uint8) -> np.ndarray:
    # Little-endian bytes of each entry, whatever the host's byte order.
    le = grid.astype(grid.dtype.newbyteorder("<"))
    rows = np.ascontiguousarray(le.view(np.uint8).reshape(len(grid), grid.itemsize))
    rows = rows.view(dtype)
    rows.setflags(write=False)
    return rows


KMASK_IQ2XS = _table("kmask_iq2xs")
KSIGNS_IQ2XS = _table("ksigns_iq2xs")
IQ2XXS_GRID = _table("iq2xxs_grid")
IQ2XS_GRID = _table("iq2xs_grid")
IQ2S_GRID = _table("iq2s_grid")
IQ3XXS_GRID = _table("iq3xxs_grid")
IQ3S_GRID = _table("iq3s_grid")
IQ1S_GRID = _table("iq1s_grid")
IQ1S_GRID_GPU = _table("iq1s_grid_gpu")
KVALUES_IQ4NL = _table("kvalues_iq4nl")

IQ2XXS_GRID_BYTES = _row_bytes(IQ2XXS_GRID)
IQ2XS_GRID_BYTES = _row_bytes(IQ2XS_GRID)
IQ2S_GRID_BYTES = _row_bytes(IQ2S_GRID)
IQ3XXS_GRID_BYTES = _row_bytes(IQ3XXS_GRID)
IQ3S_GRID_BYTES = _row_bytes(IQ3S_GRID)
IQ1S_GRID_BYTES = _row_bytes(IQ1S_GRID, np.int8)
