"""The kernels that multiply weights on their stored blocks (cpu.legacy_dots,
cpu.kquant_dots, run through cpu.matvec) against themselves taken apart:
the same bits for a row whatever else runs with it.

The kernels walk four weight rows at once, two activation rows per weight
block in a pass of several tokens, split the rows over threads, and fall
back to one row at a time for the rows left over. None of that may change
a bit: here every product is recomputed one weight row and one activation
row at a time (the one-row path), serially, and compared bitwise, for row
counts that leave 1 to 3 rows over, token counts that leave one over, and
matrices large enough to run in parallel. That ggml computes those one-row
values is tests/test_cpu_types.py's (ggml's own mul_mat per profile) and
the model tests'.
"""
import numpy as np
import pytest

from infer_helpers import f32_bits
from strata_ref import GGMLType
from strata_ref.cpu import matvec, select
from strata_ref.cpu.matmul import QMatrix
from strata_ref.routes.mmvq_inputs import sane_blocks
from strata_ref.types import block_format


def _matrix(t, rows, cols, profile, seed):
    fmt = block_format(t)
    raw = sane_blocks(t, rows * cols // fmt.block_values, np.random.default_rng(seed)).reshape(-1)
    return QMatrix(t, raw, rows, cols, t.name, profile), raw


@pytest.mark.parametrize("profile", ["scalar", "avx2", "avx512"])
@pytest.mark.parametrize("t", [GGMLType[n] for n in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                                     "Q4_K", "Q5_K", "Q6_K")])
def test_rows_and_tokens_are_independent(t, profile):
    cols = 4096 if block_format(t).block_values == 256 else 2048
    rng = np.random.default_rng(int(t))
    for rows, n in ((37, 3), (64, 2), (9, 5), (42, 9)):
        m, raw = _matrix(t, rows, cols, profile, seed=rows)
        x = rng.standard_normal((n, cols)).astype(np.float32)
        full = m.matmul(x)                  # large: the parallel kernels
        run, blocks = m.packed.data
        repacked = m.repacked()
        path = m.segments(n)[0][2]
        if path == "tiled" or (path == "repack" and n >= 4 and block_format(t).block_values == 256):
            # ggml's tiled K-quant kernel (8+ tokens) and repacked gemm
            # (groups of 4) round otherwise than one token's dot; the
            # legacy quants' tinyBLAS rounds as vec_dot
            continue
        for i in range(n):
            for r in range(rows):
                # one weight row, one token, serially, on the tensor's path
                y = run(repacked, True, False, blocks[r:r + 1], x[i:i + 1], 1)
                assert f32_bits(y)[0, 0] == f32_bits(full)[i, r], (t.name, profile, rows, n, i, r)


@pytest.mark.parametrize("t", [GGMLType[n] for n in ("Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")])
def test_thread_split_changes_no_bit(t, monkeypatch):
    # the same product with the rows split over 1, 2, 3 and 7 parts
    cols = 4096 if block_format(t).block_values == 256 else 2048
    m, raw = _matrix(t, 203, cols, "avx2", seed=3)
    x = np.random.default_rng(1).standard_normal((3, cols)).astype(np.float32)
    run, raw2 = m.packed.data
    outs = [run(m.repacked(), True, False, raw2, x, parts) for parts in (1, 2, 3, 7)]
    for o in outs[1:]:
        assert np.array_equal(f32_bits(o), f32_bits(outs[0]))


def test_runner_refuses_other_types():
    with pytest.raises(KeyError, match="IQ4_XS"):
        matvec.runner(GGMLType.IQ4_XS, select("avx2").isa)
    assert select("avx2").name == "avx2"


@pytest.mark.parametrize("profile", ["avx2", "avx512", "armv8.6-i8mm"])
@pytest.mark.parametrize("types", [("Q4_K", "Q4_K", "Q6_K"), ("Q5_0", "Q8_0", "Q5_0"), ("Q4_0", "Q5_K"),
                                   ("Q8_0", "Q6_K", "Q4_1")])
def test_group_runner_is_each_runner(types, profile):
    # q, k, v (gate, up) in one parallel region: each output the bits of
    # the type's own runner, with any part count, token count and layout
    isa = select(profile).isa
    ts = [GGMLType[n] for n in types]
    cols = 1024
    mats = [np.ascontiguousarray(_matrix(t, rows, cols, profile, seed=rows)[0].packed.data[1])
            for t, rows in zip(ts, (72, 40, 16))]
    group = matvec.group_runner(ts, isa)
    rng = np.random.default_rng(len(types))
    for n in (1, 3, 8, 9):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        for repacked in (False, True):
            flags = (repacked,) * len(ts)
            for parts in (1, 2, 3):
                outs = group(flags, tuple(mats), x, parts)
                assert len(outs) == len(ts)
                for t, raw, o in zip(ts, mats, outs):
                    ref = matvec.runner(t, isa)(repacked, True, False, raw, x, 1)
                    assert o.shape == (n, raw.shape[0])
                    assert np.array_equal(f32_bits(o), f32_bits(ref)), (t.name, n, repacked, parts)


def test_group_runner_takes_two_or_three():
    isa = select("avx2").isa
    for ts in ((GGMLType.Q4_K,), (GGMLType.Q4_K,) * 4):
        with pytest.raises(ValueError, match=f"2 or 3 types, got {len(ts)}"):
            matvec.group_runner(ts, isa)
    with pytest.raises(KeyError, match="IQ4_XS"):
        matvec.group_runner((GGMLType.Q4_K, GGMLType.IQ4_XS), isa)
