"""IQ4_XS on its stored blocks (strata_ref/cpu/iq4_rows.py) against the
widened-value "x86" path of dots_iquants and a NumPy float32 recomputation
of ggml's AVX2 `ggml_vec_dot_iq4_xs_q8_K`, bit for bit: random valid
blocks and blocks at the extremes (scales 0 and 63, nibbles 0 and 15,
activations quantized to -127 / 127)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from strata_ref import GGMLType as T
from strata_ref.cpu import act_quant, dots_iquants, iq4_rows
from strata_ref.cpu.matmul import QMatrix
from strata_ref.formats.iq_tables import KVALUES_IQ4NL
from strata_ref.numerics import fma_f32
from strata_ref.routes.mmvq_inputs import sane_blocks

f32 = np.float32
BB = 136


def expected(raw, xq, xd):
    """float32 (n, rows): the AVX2 formula (iq4_rows docstring) from the
    block bytes, in NumPy: exact int64 lanes, then one float32 fma per
    block and lane (`numerics.fma_f32`), then hsum_float_8."""
    rows = raw.shape[0]
    nb = raw.shape[1] // BB
    blk = raw.reshape(rows, nb, BB)
    d = blk[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)              # (r, nb)
    sh = blk[..., 2:4].copy().view("<u2")[..., 0].astype(np.int64)
    sl = blk[..., 4:8].astype(np.int64)
    c = np.arange(8)
    ls = ((sl[..., c // 2] >> (4 * (c & 1))) & 15) | (((sh[..., None] >> (2 * c)) & 3) << 4)   # (r, nb, 8)
    qs = blk[..., 8:].reshape(rows, nb, 8, 16)
    v = KVALUES_IQ4NL[np.concatenate([qs & 15, qs >> 4], axis=3)].astype(np.int64)     # (r, nb, 8, 32)
    n = xq.shape[0]
    q = xq.reshape(n, 1, nb, 8, 8, 4).astype(np.int64)
    dots = (v.reshape(1, rows, nb, 8, 8, 4) * q).sum(axis=5)                          # (n, r, nb, chunk, lane)
    lanes = ((ls - 32)[None, :, :, :, None] * dots).sum(axis=3)                        # (n, r, nb, lane)
    acc = np.zeros((n, rows, 8), np.float32)
    for b in range(nb):
        db = (d[None, :, b] * xd[:, None, b]).astype(np.float32)                       # (n, r)
        acc = fma_f32(db[..., None], lanes[:, :, b].astype(np.float32), acc).astype(np.float32)
    s = [(acc[..., 4 + i] + acc[..., i]).astype(np.float32) for i in range(4)]
    return ((s[0] + s[2]).astype(np.float32) + (s[1] + s[3]).astype(np.float32)).astype(np.float32)


def widened(raw, xq, xd):
    """The dots_iquants "x86" IQ4_XS path on `pack_iquant`'s widened copy."""
    rows, cols = raw.shape[0], raw.shape[1] // BB * 256
    wq, sc, d, _ = dots_iquants.pack_iquant(T.IQ4_XS, raw, rows, cols)
    out = np.zeros((xq.shape[0], rows), np.float32)
    dots_iquants._rows_iq(dots_iquants._IQ4, dots_iquants._AVX2, f32(1), f32(1), False, wq, sc, d,
                          dots_iquants._NO_DELTA, xq, xd, np.zeros((xq.shape[0], 1), np.int32), out, 0, rows)
    return out


def stored(raw, xq, xd, parallel=False):
    out = np.full((xq.shape[0], raw.shape[0]), np.nan, np.float32)
    iq4_rows.matmul_iq4_xs(raw, xq, xd, out, 0, raw.shape[0], parallel)
    return out


def same(a, b):
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def extreme_blocks(rng, rows, nb):
    """Blocks with every scale 0 or 63 and every nibble 0 or 15 (one choice
    per block, all four combinations), random fp16 d near 1e-2."""
    raw = np.zeros((rows, nb, BB), np.uint8)
    d = rng.uniform(0.004, 0.03, (rows, nb)).astype(np.float16).view(np.uint16)
    raw[..., 0] = d & 0xFF
    raw[..., 1] = d >> 8
    combo = rng.integers(0, 4, (rows, nb))
    top = combo & 1                     # scales 63 (else 0)
    raw[..., 2:8] = np.where(top[..., None] == 1, 0xFF, 0x00)
    raw[..., 8:] = np.where((combo >> 1)[..., None] == 1, 0xFF, 0x00)
    return raw.reshape(rows, nb * BB)


def extreme_activations(rng, n, cols):
    """x of +-1 only: every Q8_K quant is -127 or 127."""
    x = np.where(rng.random((n, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
    xq, xd, _ = act_quant.q8_k_fields(x)
    assert set(np.unique(xq)) <= {-127, 127}
    return xq, xd


@pytest.mark.parametrize("n", [1, 2, 5])
def test_random_blocks_match_widened_and_formula(n):
    rng = np.random.default_rng(310 + n)
    rows, cols = 70, 1536
    raw = sane_blocks(T.IQ4_XS, rows * cols // 256, rng).reshape(rows, -1)
    x = (rng.standard_normal((n, cols)) * 10.0 ** rng.uniform(-2, 2, (n, 1))).astype(np.float32)
    xq, xd, _ = act_quant.q8_k_fields(x)
    got = stored(raw, xq, xd)
    same(got, widened(raw, xq, xd))
    same(got, expected(raw, xq, xd))
    same(stored(raw, xq, xd, parallel=True), got)


@pytest.mark.parametrize("n", [1, 3])
def test_extreme_blocks_match_widened_and_formula(n):
    rng = np.random.default_rng(31)
    rows, cols = 40, 2048
    raw = extreme_blocks(rng, rows, cols // 256)
    for xq, xd in (extreme_activations(rng, n, cols),
                   act_quant.q8_k_fields(rng.standard_normal((n, cols)).astype(np.float32))[:2]):
        got = stored(raw, xq, xd)
        same(got, widened(raw, xq, xd))
        same(got, expected(raw, xq, xd))
    # the largest lanes: scales 63 (ls - 32 = 31) and nibbles 0 (-127) against
    # quants -127 everywhere: 8 chunks * 31 * 4 * 127 * 127, exact in int32
    raw = extreme_blocks(rng, 2, cols // 256).reshape(2, -1, BB)
    raw[..., 2:8] = 0xFF
    raw[..., 8:] = 0
    raw = raw.reshape(2, -1)
    xq, xd, _ = act_quant.q8_k_fields(np.full((n, cols), -1.0, np.float32))
    got = stored(raw, xq, xd)
    same(got, widened(raw, xq, xd))
    same(got, expected(raw, xq, xd))


def test_routed_for_the_x86_vec_dot(monkeypatch):
    # the avx2 / avx512 profiles take iq4_rows below 8 activation rows (the
    # vec_dot), never for the tiled path or other profiles
    rng = np.random.default_rng(5)
    rows, cols = 9, 512
    raw = sane_blocks(T.IQ4_XS, rows * cols // 256, rng).reshape(-1)
    x = rng.standard_normal((8, cols)).astype(np.float32)
    calls = []
    real = iq4_rows.matmul_iq4_xs
    monkeypatch.setattr(iq4_rows, "matmul_iq4_xs", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    for profile in ("avx2", "avx512", "scalar"):
        qm = QMatrix(T.IQ4_XS, raw, rows, cols, "w", profile)
        for n in (1, 7, 8):
            y = qm.matmul(x[:n])
            xq, xd, _ = act_quant.q8_k_fields(x[:n])
            if profile != "scalar" and n < 8:
                same(y, expected(raw.reshape(rows, -1), xq, xd))
    assert calls == [1, 7, 1, 7]


_PORTABLE = """
import sys, numpy as np
sys.path.insert(0, sys.argv[2])
from tests.test_cpu_iq4_rows import check_once
from strata_ref.cpu.simd import HOST_AVX2
assert not HOST_AVX2
check_once()
"""


def check_once():
    rng = np.random.default_rng(77)
    rows, cols = 12, 1024
    raw = np.concatenate([sane_blocks(T.IQ4_XS, rows * cols // 256, rng).reshape(rows, -1),
                          extreme_blocks(rng, 4, cols // 256)])
    for xq, xd in (extreme_activations(rng, 2, cols),
                   act_quant.q8_k_fields(rng.standard_normal((2, cols)).astype(np.float32))[:2]):
        same(stored(raw, xq, xd), expected(raw, xq, xd))


def test_portable_lanes(tmp_path):
    # the table lookup and lanes without AVX2 (a select per table entry,
    # plain vector arithmetic): the same bits
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), STRATA_REF_PORTABLE_LANES="1")
    subprocess.run([sys.executable, "-c", _PORTABLE, "", str(root)], check=True, env=env, cwd=str(root))
