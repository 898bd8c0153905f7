"""The I-quant dots (strata_ref/cpu/dots_iquants.py) on hand-built blocks
whose result depends on the order of the float operations.

Each case builds raw blocks from chosen integers (quant indices, scales,
fp16 d) and activations with a different magnitude per 256-value block
(their Q8_K quants and scales from `act_quant`). The expected value of each ggml order is computed here,
from the format's definition, with float32 operations written out
(`numerics.fma_f32` for an FMA); the test first checks that the orders give
different bits on these inputs (so a kernel taking the wrong one fails),
then that each profile's kernel gives its own order's bits. The order each
profile follows: ggml-cpu `arch/x86/quants.c` `ggml_vec_dot_*_q8_K`
(`__AVX2__` branch, avx2 and avx512 profiles), `quants.c` `*_generic`
(scalar profile), `tiled/tiled-kernel.cpp` (avx2 / avx512, 8+ rows).
"""
from __future__ import annotations

import numpy as np
import pytest

from strata_ref import GGMLType as T
from strata_ref import block_format
from strata_ref.cpu import act_quant
from strata_ref.cpu.matmul import QMatrix
from strata_ref.formats.iq_tables import IQ1S_GRID_BYTES, KVALUES_IQ4NL
from strata_ref.numerics import fma_f32

f32 = np.float32
COLS = 1024                     # four super-blocks (IQ1: sixteen, `IQ1_COLS`)
IQ1_COLS = 4096


def fma(a, b, c):
    return f32(fma_f32(f32(a), f32(b), f32(c)))


def hsum8(v):
    # ggml hsum_float_8: high half + low half, then (0 + 2) + (1 + 3)
    s = [f32(v[4 + i] + v[i]) for i in range(4)]
    return f32(f32(s[0] + s[2]) + f32(s[1] + s[3]))


def f16_bits(rng, n):
    """fp16 bit patterns of d values with full mantissas, around 1e-2."""
    d = rng.uniform(0.004, 0.03, n).astype(np.float16)
    return d.view(np.uint16)


def q8k_activations(rng, cols=COLS):
    """(x float32 (cols,), q int (cols,), xd float32 (cols/256,)): normals
    with a magnitude per 256-value block, and their Q8_K quants and scales
    (`act_quant.q8_k_fields`, ggml's `quantize_row_q8_K_ref`, checked
    against ggml elsewhere)."""
    x = rng.standard_normal(cols) * np.repeat(10.0 ** rng.uniform(-2, 2, cols // 256), 256)
    x = x.astype(np.float32)
    xq, d, _ = act_quant.q8_k_fields(x[None])
    return x, xq[0].astype(np.int64), d[0]


def lanes(v, q, s16):
    """The AVX2 lanes of one super-block: lane L = sum over chunks c of 32 of
    s16[2c + L // 4] * (dot of values 4L..4L+3 of chunk c)."""
    p = (v * q).reshape(8, 8, 4).sum(axis=2)          # (chunk, lane)
    sc = np.stack([s16[0::2], s16[0::2], s16[0::2], s16[0::2],
                   s16[1::2], s16[1::2], s16[1::2], s16[1::2]], axis=1)
    return (p * sc).sum(axis=0)


def run(t, raw, x, profile, n=1):
    qm = QMatrix(t, raw, 1, x.size, t.name, profile)
    return qm.matmul(np.repeat(x[None], n, axis=0))[:, 0]


def bits(v):
    return int(np.asarray(v, np.float32).view(np.uint32))


def assert_distinct(orders):
    got = {k: bits(v) for k, v in orders.items()}
    assert len(set(got.values())) == len(got), f"orders not told apart: {got}"


# ---------------------------------------------------------------- IQ4_XS

def iq4_xs_case(seed):
    rng = np.random.default_rng(seed)
    fmt = block_format(T.IQ4_XS)
    nb = COLS // 256
    idx = rng.integers(0, 16, (nb, 256))
    ls = rng.integers(0, 64, (nb, 8))
    dbits = f16_bits(rng, nb)
    raw = np.zeros((nb, fmt.block_bytes), np.uint8)
    for b in range(nb):
        raw[b, 0:2] = np.array([dbits[b]], "<u2").view(np.uint8)
        sh = sum(int(ls[b, i] >> 4) << (2 * i) for i in range(8))
        raw[b, 2:4] = np.array([sh], "<u2").view(np.uint8)
        for i in range(4):
            raw[b, 4 + i] = (ls[b, 2 * i] & 15) | ((ls[b, 2 * i + 1] & 15) << 4)
        for ib in range(8):
            lo, hi = idx[b, 32 * ib:32 * ib + 16], idx[b, 32 * ib + 16:32 * ib + 32]
            raw[b, 8 + 16 * ib:8 + 16 * ib + 16] = lo | (hi << 4)
    x, q, xd = q8k_activations(rng)
    v = KVALUES_IQ4NL[idx].astype(np.int64)
    s16 = np.repeat(ls - 32, 2, axis=1)
    dw = dbits.view(np.float16).astype(np.float32)
    return raw.reshape(-1), x, q.reshape(nb, 256), xd, v, s16, dw


def iq4_xs_orders(q, xd, v, s16, dw):
    acc = np.zeros(8, np.float32)
    gen = f32(0)
    tiled = f32(0)
    block = f32(0)
    for b in range(len(dw)):
        db = f32(dw[b] * xd[b])
        ln = lanes(v[b], q[b], s16[b])
        acc = np.array([fma(db, f32(ln[L]), acc[L]) for L in range(8)], np.float32)
        for c in range(8):
            dot = int((v[b, 32 * c:32 * c + 32] * q[b, 32 * c:32 * c + 32]).sum())
            gen = f32(gen + f32(f32(db * f32(s16[b, 2 * c])) * f32(dot)))
        tot = int(ln.sum())
        tiled = fma(f32(f32(tot) * dw[b]), xd[b], tiled)
        block = fma(db, f32(tot), block)
    seq = f32(0)
    for L in range(8):
        seq = f32(seq + acc[L])
    return {"avx2": hsum8(acc), "generic": gen, "tiled": tiled, "one fma per block": block,
            "lanes summed in order": seq}


# seeds whose inputs tell all the listed orders apart (asserted below)
@pytest.mark.parametrize("seed", [55, 64])
def test_iq4_xs_float_order_per_profile(seed):
    raw, x, q, xd, v, s16, dw = iq4_xs_case(seed)
    orders = iq4_xs_orders(q, xd, v, s16, dw)
    assert_distinct(orders)
    for profile in ("avx2", "avx512"):
        assert bits(run(T.IQ4_XS, raw, x, profile)[0]) == bits(orders["avx2"]), profile
        assert {bits(y) for y in run(T.IQ4_XS, raw, x, profile, n=8)} == {bits(orders["tiled"])}
    assert bits(run(T.IQ4_XS, raw, x, "scalar")[0]) == bits(orders["generic"])
    assert {bits(y) for y in run(T.IQ4_XS, raw, x, "scalar", n=8)} == {bits(orders["generic"])}


# ---------------------------------------------------------------- IQ1_S, IQ1_M

def iq1_s_case(seed):
    rng = np.random.default_rng(seed)
    fmt = block_format(T.IQ1_S)
    nb = IQ1_COLS // 256
    raw = rng.integers(0, 256, (nb, fmt.block_bytes), dtype=np.uint8)
    dbits = f16_bits(rng, nb)
    raw[:, 0:2] = dbits.astype("<u2").view(np.uint8).reshape(nb, 2)
    g = np.zeros((nb, 256), np.int64)
    s16 = np.zeros((nb, 16), np.int64)
    delta = np.zeros((nb, 256), np.int64)
    for b in range(nb):
        qs = raw[b, 2:34]
        qh = raw[b, 34:50].view("<u2")
        for ib in range(8):
            h = int(qh[ib])
            s16[b, 2 * ib:2 * ib + 2] = 2 * ((h >> 12) & 7) + 1
            delta[b, 32 * ib:32 * ib + 32] = -1 if h & 0x8000 else 1
            for l in range(4):
                gi = int(qs[4 * ib + l]) | (((h >> (3 * l)) & 7) << 8)
                g[b, 32 * ib + 8 * l:32 * ib + 8 * l + 8] = IQ1S_GRID_BYTES[gi]
    x, q, xd = q8k_activations(rng, IQ1_COLS)
    return raw.reshape(-1), x, q.reshape(nb, 256), xd, g, s16, delta, dbits.view(np.float16).astype(np.float32)


def iq1_m_case(seed):
    rng = np.random.default_rng(seed)
    fmt = block_format(T.IQ1_M)
    nb = IQ1_COLS // 256
    raw = rng.integers(0, 256, (nb, fmt.block_bytes), dtype=np.uint8)
    dbits = f16_bits(rng, nb).astype(np.int64)
    g = np.zeros((nb, 256), np.int64)
    s16 = np.zeros((nb, 16), np.int64)
    delta = np.zeros((nb, 256), np.int64)
    for b in range(nb):
        sc = raw[b, 48:56].view("<u2").astype(np.int64)
        sc = (sc & 0x0FFF) | (((dbits[b] >> (4 * np.arange(4))) & 15) << 12)
        raw[b, 48:56] = sc.astype("<u2").view(np.uint8)
        qs, qh = raw[b, 0:32], raw[b, 32:48]
        for ib in range(8):
            w = int(sc[ib // 2])
            for hh in range(2):
                s16[b, 2 * ib + hh] = 2 * ((w >> (6 * (ib % 2) + 3 * hh)) & 7) + 1
            for l in range(4):
                byte = int(qh[2 * ib + l // 2])
                half = 4 * (l % 2)
                gi = int(qs[4 * ib + l]) | (((byte >> half) & 7) << 8)
                o = 32 * ib + 8 * l
                g[b, o:o + 8] = IQ1S_GRID_BYTES[gi]
                delta[b, o:o + 8] = -1 if (byte >> (half + 3)) & 1 else 1
    x, q, xd = q8k_activations(rng, IQ1_COLS)
    dw = dbits.astype(np.uint16).view(np.float16).astype(np.float32)
    return raw.reshape(-1), x, q.reshape(nb, 256), xd, g, s16, delta, dw


def iq1_orders(m, q, xd, g, s16, delta, dw):
    acc = np.zeros(8, np.float32)
    acc2 = np.zeros(8, np.float32)
    a1 = f32(0)
    a1_unfused = f32(0)
    gen = f32(0)
    tiled = f32(0)
    for b in range(len(dw)):
        db = f32(dw[b] * xd[b])
        ln = lanes(g[b], q[b], s16[b])
        dln = lanes(delta[b], q[b], s16[b])
        acc = np.array([fma(db, f32(ln[L]), acc[L]) for L in range(8)], np.float32)
        acc2 = np.array([fma(db, f32(dln[L]), acc2[L]) for L in range(8)], np.float32)
        si, sd = int(ln.sum()), int(dln.sum())
        a1 = fma(db, f32(sd), a1)
        a1_unfused = f32(a1_unfused + f32(db * f32(sd)))
        gen = f32(gen + f32(db * f32(f32(si) + f32(f32(0.125) * f32(sd)))))
        tiled = fma(f32(f32(8 * si + sd) * f32(dw[b] * f32(0.125))), xd[b], tiled)
    h = hsum8(acc)
    o = {"generic": gen, "tiled": tiled}
    if m == "IQ1_S":
        o["avx2"] = fma(0.125, a1, h)
        o["avx2 without the accum1 fma"] = fma(0.125, a1_unfused, h)
    else:
        o["avx2"] = fma(0.125, hsum8(acc2), h)
        o["avx2 with the delta in a scalar"] = fma(0.125, a1, h)
    return o


# seeds whose inputs tell all the listed orders apart (asserted below)
@pytest.mark.parametrize("t, seed", [("IQ1_S", 24), ("IQ1_S", 52), ("IQ1_M", 7), ("IQ1_M", 13)])
def test_iq1_delta_order_per_profile(t, seed):
    case = (iq1_s_case if t == "IQ1_S" else iq1_m_case)(seed)
    raw, x, q, xd, g, s16, delta, dw = case
    orders = iq1_orders(t, q, xd, g, s16, delta, dw)
    assert_distinct(orders)
    for profile in ("avx2", "avx512"):
        assert bits(run(T[t], raw, x, profile)[0]) == bits(orders["avx2"]), profile
        assert {bits(y) for y in run(T[t], raw, x, profile, n=8)} == {bits(orders["tiled"])}
    assert bits(run(T[t], raw, x, "scalar")[0]) == bits(orders["generic"])


# ---------------------------------------------------------------- layout

IQ = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS")


@pytest.mark.parametrize("t", IQ)
def test_packed_path_never_dequantizes(t, monkeypatch):
    import strata_ref.dequant as dq
    from strata_ref.routes.mmvq_inputs import sane_blocks

    def refuse(*a, **k):
        raise AssertionError("the packed I-quant path dequantized the weights")
    monkeypatch.setattr(dq, "dequant_f32", refuse)
    rng = np.random.default_rng(7)
    rows, cols = 5, 512
    raw = sane_blocks(T[t], rows * cols // 256, rng).reshape(-1)
    x = rng.standard_normal((9, cols)).astype(np.float32)
    for profile in ("scalar", "avx2", "avx512"):
        qm = QMatrix(T[t], raw, rows, cols, t, profile)
        for n in (1, 9):
            assert qm.matmul(x[:n]).shape == (n, rows)
        p = qm.packed
        from strata_ref.cpu import dots_iquants
        assert p.family is dots_iquants.FAMILY
        wq, sc, d, dl = p.data
        assert wq.dtype == np.int8 and wq.shape == (rows, cols)
        # the only float data is one fp16 d per super-block
        assert d.dtype == np.float32 and d.shape == (rows, cols // 256)
        assert sc.dtype == np.int32 and (dl is None or (dl.dtype == np.int8 and dl.shape == (rows, cols // 4)))


def test_pack_errors():
    from strata_ref.cpu.dots_iquants import pack_iquant
    with pytest.raises(ValueError):
        pack_iquant(T.Q4_K, np.zeros(144, np.uint8), 1, 256)
    with pytest.raises(ValueError):
        pack_iquant(T.IQ2_XXS, np.zeros(65, np.uint8), 1, 256)
    with pytest.raises(ValueError):
        pack_iquant(T.IQ2_XXS, np.zeros(66, np.uint8), 1, 128)
