"""`strata_ref.cpu.avx_legacy`: the legacy-quant dots of ggml's x86 builds
without AVX2 (arch/x86/quants.c `__AVX__` / `__SSSE3__` branches), against
the orders written out here step by step in NumPy float32 (every operation
one rounding, as C's float arithmetic without contraction).

The FMA build's `PAIRS` ("avx", the v0.4.0-piledriver profile) is checked
bit for bit against llama.cpp's own logits by tests/test_cpu_prebuilt.py;
here the unfused orders, and the odd last block no stored model reaches
(SmolLM2's rows hold 18 and 48 blocks)."""
from __future__ import annotations

import numpy as np
import pytest

from strata_ref.cpu import avx_legacy
from strata_ref.types import GGMLType, block_format

F = np.float32


def _blocks(t, nb, rng):
    """raw uint8 (1, nb * block bytes) of type t with random quants and fp16
    scales, and the values (int, natural order) and float32 d (and m)."""
    fmt = block_format(t)
    raw = rng.integers(0, 256, (1, nb * fmt.block_bytes), dtype=np.uint8)
    d = rng.uniform(0.001, 0.01, nb).astype(np.float16)
    m = rng.uniform(-0.01, 0.01, nb).astype(np.float16)
    vals = np.empty(32 * nb, np.int64)
    for b in range(nb):
        o = b * fmt.block_bytes
        raw[0, o:o + 2] = np.frombuffer(d[b].tobytes(), np.uint8)
        qs = fmt.field("qs").offset + o
        if t == GGMLType.Q8_0:
            vals[32 * b:32 * b + 32] = raw[0, qs:qs + 32].view(np.int8)
        else:
            if t == GGMLType.Q4_1:
                mo = fmt.field("m").offset + o
                raw[0, mo:mo + 2] = np.frombuffer(m[b].tobytes(), np.uint8)
            q = raw[0, qs:qs + 16].astype(np.int64)
            bias = 8 if t == GGMLType.Q4_0 else 0
            vals[32 * b:32 * b + 16] = (q & 15) - bias
            vals[32 * b + 16:32 * b + 32] = (q >> 4) - bias
    return raw, vals, d.astype(F), m.astype(F)


def _acts(nb, rng):
    xq = rng.integers(-127, 128, (1, 32 * nb)).astype(np.int8)
    xs = rng.uniform(0.01, 0.05, (1, nb)).astype(np.float16).astype(F)
    xm = rng.uniform(-1, 1, (1, nb)).astype(np.float16).astype(F)
    return xq, xs, xm


def _hsum8(a):
    s = [F(a[4 + i] + a[i]) for i in range(4)]
    return F(F(s[0] + s[2]) + F(s[1] + s[3]))


def _run(t, variant, raw, xq, xs, xm):
    out = np.empty((1, 1), F)
    avx_legacy.variant_kernels(t, variant)[0](raw, xq, xs, xm, out)
    return out[0, 0]


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q8_0])
def test_pairs_unfused_with_odd_block(t):
    rng = np.random.default_rng(int(t))
    nb = 5
    raw, w, dw, _ = _blocks(t, nb, rng)
    xq, xs, xm = _acts(nb, rng)
    x = xq[0].astype(np.int64)
    acc = np.zeros(8, F)
    for b in range(0, nb - 1, 2):
        for h in range(2):
            d = F(dw[b + h] * xs[0, b + h])
            o = 32 * (b + h)
            for L in range(4):
                p = (w[o + 4 * L:o + 4 * L + 4] @ x[o + 4 * L:o + 4 * L + 4]
                     + w[o + 16 + 4 * L:o + 20 + 4 * L] @ x[o + 16 + 4 * L:o + 20 + 4 * L])
                acc[4 * h + L] = F(acc[4 * h + L] + F(d * F(p)))
    s = _hsum8(acc)
    si = F(w[128:160] @ x[128:160])
    if t == GGMLType.Q4_0:                 # sumf += sumi * d_w * d_a
        want = F(s + F(F(si * dw[4]) * xs[0, 4]))
    else:                                  # sumf += sumi * (d_w * d_a)
        want = F(s + F(si * F(dw[4] * xs[0, 4])))
    got = _run(t, "avx_nofma", raw, xq, xs, xm)
    assert np.array([got]).view(np.uint32) == np.array([want]).view(np.uint32)


def test_lanes_unfused_q4_1():
    t = GGMLType.Q4_1
    rng = np.random.default_rng(41)
    nb = 3
    raw, w, dw, mw = _blocks(t, nb, rng)
    xq, xs, xm = _acts(nb, rng)
    x = xq[0].astype(np.int64)
    acc = np.zeros(8, F)
    summs = F(0)
    for b in range(nb):
        summs = F(summs + F(mw[b] * xm[0, b]))
        d = F(dw[b] * xs[0, b])
        for L in range(8):
            o = 32 * b + 4 * L
            acc[L] = F(acc[L] + F(d * F(w[o:o + 4] @ x[o:o + 4])))
    want = F(_hsum8(acc) + summs)
    got = _run(t, "lanes_nofma", raw, xq, xs, xm)
    assert np.array([got]).view(np.uint32) == np.array([want]).view(np.uint32)


def test_ssse3_q4_0_with_odd_block():
    t = GGMLType.Q4_0
    rng = np.random.default_rng(3)
    nb = 3
    raw, w, dw, _ = _blocks(t, nb, rng)
    xq, xs, xm = _acts(nb, rng)
    x = xq[0].astype(np.int64)
    acc = np.zeros((4, 4), F)              # acc_0 .. acc_3 of the SSSE3 branch
    d = [F(dw[b] * xs[0, b]) for b in range(2)]
    for a in range(4):
        b, half = a // 2, a % 2
        for L in range(4):
            o = 32 * b + 16 * half + 4 * L
            acc[a, L] = F(acc[a, L] + F(d[b] * F(w[o:o + 4] @ x[o:o + 4])))
    r = [F(F(acc[a, 0] + acc[a, 1]) + F(acc[a, 2] + acc[a, 3])) for a in range(4)]
    s = F(F(r[0] + r[1]) + F(r[2] + r[3]))  # hsum_float_4x4
    want = F(s + F(F(F(w[64:96] @ x[64:96]) * dw[2]) * xs[0, 2]))
    got = _run(t, "ssse3", raw, xq, xs, xm)
    assert np.array([got]).view(np.uint32) == np.array([want]).view(np.uint32)
