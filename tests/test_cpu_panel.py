"""The K-quant panel (`strata_ref.cpu.kquant_panel`: eight weight rows at a
time, for several activation rows on the repacked `q4_K_8x8` and tiled
paths) gives the bits of the row kernel (`kquant_dots`), which
tests/test_cpu_types.py and the whole-model tests hold to ggml's own.

Rows are independent, so a matrix of 29 rows (three panels and 5 rows
left to the row kernel) must give, row for row, what each row gives alone
(one row: always the row kernel). The extreme blocks put every value at
its type's largest (Q4_K 15, Q5_K 31, Q6_K 63) with the largest scales,
against activations quantized to -127 everywhere (Q8_K's largest
magnitude: its scale is -127 / max): the int16 pair sums the AVX2 panel
adds before its `madd` come closest to their bound there.
"""
from __future__ import annotations

import numpy as np
import pytest

from strata_ref import GGMLType, quantize
from strata_ref.cpu import select
from strata_ref.cpu.matvec import runner
from strata_ref.types import block_format

ROWS, COLS = 29, 512
#: (profile, type, repacked): the 0.3.36 x86 chain's repacked gemm / gemv
#: and tiled paths, and v0.4.0's repacked Q4_K (its other K-quants take
#: their vec_dot, which is not a panel)
CASES = [("avx2", "Q4_K", True), ("avx2", "Q4_K", False), ("avx2", "Q5_K", False), ("avx2", "Q6_K", False),
         ("v0.4.0-haswell", "Q4_K", True)]


def _extreme(t: GGMLType, rows: int) -> np.ndarray:
    """Blocks whose every value and scale is the type's largest, d = 1, dmin = 0."""
    fmt = block_format(t)
    b = np.zeros((rows * COLS // 256, fmt.block_bytes), np.uint8)
    one = np.array([1.0], np.float16).view(np.uint8)
    b[:, fmt.field("d").offset:fmt.field("d").offset + 2] = one
    for name in ("qs", "ql", "qh"):
        if any(f.name == name for f in fmt.fields):
            f = fmt.field(name)
            b[:, f.offset:f.offset + f.nbytes] = 0xFF
    sc = fmt.field("scales")
    if t == GGMLType.Q6_K:
        b[:, sc.offset:sc.offset + sc.nbytes] = 127
    else:
        # 6-bit scales 63 and mins 0 (ggml's get_scale_min_k4 packing: the
        # scales of sub-blocks 4-7 take their high bits from bytes 0-3)
        s = np.zeros(12, np.uint8)
        s[0:4] = 0xFF
        s[8:12] = 0x0F
        b[:, sc.offset:sc.offset + 12] = s
    return b.reshape(rows, -1)


def _both(run, repacked, raw, x, parts):
    y = run(repacked, True, False, raw, x, parts)
    alone = np.concatenate([run(repacked, True, False, raw[r:r + 1], x, 1) for r in range(raw.shape[0])], axis=1)
    return y, alone


@pytest.mark.parametrize("profile,tname,repacked", CASES)
def test_panel_rows_equal_the_row_kernel(profile, tname, repacked):
    t = GGMLType[tname]
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((ROWS, COLS)) * 0.05).astype(np.float32)
    raw = quantize(w, t).reshape(ROWS, -1)
    run = runner(t, select(profile).isa)
    for n in (2, 5, 8, 13):
        x = rng.standard_normal((n, COLS)).astype(np.float32)
        for parts in (1, 2):
            y, alone = _both(run, repacked, raw, x, parts)
            assert np.array_equal(y.view(np.uint32), alone.view(np.uint32)), (n, parts)


@pytest.mark.parametrize("profile,tname,repacked", CASES)
def test_panel_at_the_int16_bound(profile, tname, repacked):
    t = GGMLType[tname]
    raw = _extreme(t, 16)
    run = runner(t, select(profile).isa)
    x = np.full((8, COLS), -1.0, np.float32)      # Q8_K: -127 everywhere
    y, alone = _both(run, repacked, raw, x, 1)
    assert np.array_equal(y.view(np.uint32), alone.view(np.uint32))
    # the value itself: every weight vmax (Q6_K: 63 - 32) times its scale
    # times d_w = 1, every activation -1 (q -127 times d_a = 1/127); exact
    vmax = {GGMLType.Q4_K: 15, GGMLType.Q5_K: 31, GGMLType.Q6_K: 63}[t]
    scale = 127 if t == GGMLType.Q6_K else 63
    q = vmax - 32 if t == GGMLType.Q6_K else vmax
    assert np.all(y == np.float32(-COLS * q * scale))
