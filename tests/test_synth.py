"""strata_ref.synth: random blocks of every type, raw or with every scale in a
declared range, and strata_ref.blocks' rules read the same bytes in numba
and in NumPy."""
import numpy as np
import pytest

from strata_ref import blocks, synth
from strata_ref.types import GGMLType as T
from strata_ref.types import all_formats, block_format

FORMATS = [f for f in all_formats() if f.scales]


def _scale_bits(t, b, s):
    """The bits of scale s of every block, read independently of synth."""
    fmt = block_format(t)
    if not s.whole_field:                     # IQ1_M: top nibbles of the 4 scale words
        w = np.ascontiguousarray(b[:, fmt.offset("scales"):fmt.offset("scales") + 8]).view("<u2")
        return sum(((w[:, k].astype(np.int64) >> 12) & 15) << (4 * k) for k in range(4))[:, None]
    f = fmt.field(s.field)
    raw = np.ascontiguousarray(b[:, f.offset:f.offset + f.nbytes])
    return raw.view(f"<u{f.dtype.itemsize}").astype(np.int64).reshape(len(b), f.count)


def _finite(kind, bits):
    if kind in ("f16", "bf16"):
        exp = 0x7C00 if kind == "f16" else 0x7F80
        return (bits & exp) != exp
    if kind == "f32":
        return (bits & 0x7F800000) != 0x7F800000
    if kind == "e8m0":
        return bits != 0xFF
    return (bits & 0x7F) != 0x7F                 # ue4m3: 0x7F / 0xFF are NaN


@pytest.mark.parametrize("scales", ["full", "valid"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_scale_is_finite(fmt, scales):
    b = synth.blocks(fmt.type, 4000, np.random.default_rng(1), scales)
    assert b.shape == (4000, fmt.block_bytes) and b.dtype == np.uint8
    for s in fmt.scales:
        bits = _scale_bits(fmt.type, b, s)
        assert _finite(s.kind, bits).all(), (fmt.name, s)
        assert len(np.unique(bits)) > 50, (fmt.name, s)       # spread, not one value


def test_raw_blocks_are_uniform_bytes():
    b = synth.blocks(T.Q4_K, 4000, np.random.default_rng(2), None)
    assert np.array_equal(b, np.random.default_rng(2).integers(0, 256, (4000, 144), dtype=np.uint8))


def test_ranges_are_what_they_say():
    rng = np.random.default_rng(3)
    q = synth.blocks(T.Q4_0, 5000, rng, "narrow")
    d = _scale_bits(T.Q4_0, q, block_format(T.Q4_0).scales[0])[:, 0]
    assert set(np.unique(d >> 10)) == {5, 6, 7, 8, 9}          # positive, exponent 5..9
    e = synth.blocks(T.MXFP4, 5000, rng, "narrow")[:, 0]
    assert e.min() == 118 and e.max() == 136
    e = synth.blocks(T.MXFP4, 5000, rng, "full")[:, 0]
    assert e.min() == 2 and e.max() == 253
    e = synth.blocks(T.MXFP4, 5000, rng, "valid")[:, 0]
    assert e.min() == 0 and e.max() == 254
    # narrow leaves the kinds it does not name as random bytes (NVFP4's UE4M3)
    nv = synth.blocks(T.NVFP4, 5000, rng, "narrow")[:, :4]
    assert (nv == 0x7F).any() and (nv == 0xFF).any()
    d = _scale_bits(T.IQ1_M, synth.blocks(T.IQ1_M, 5000, rng, "narrow"), block_format(T.IQ1_M).scales[0])
    assert set(np.unique(d >> 10)) == {5, 6, 7, 8, 9}


def test_plain_types_are_drawn_from_the_range_alone():
    rng = np.random.default_rng(4)
    v = synth.blocks(T.F16, 10000, rng, "full").view("<u2")[:, 0]
    assert ((v & 0x7C00) != 0x7C00).all() and (v >> 15).any() and ((v & 0x7C00) == 0).any()
    want = np.random.default_rng(4).integers(0, 0x7C00, (10000, 1))
    assert np.array_equal(v & 0x7FFF, want[:, 0])              # no random bytes drawn first
    with pytest.raises(KeyError):
        synth.blocks(T.Q4_0, 1, rng, "wide")


def test_put_scale_writes_one_value_or_one_per_block():
    b = np.zeros((3, 56), np.uint8)
    b[:, 48:56] = 0xAB
    s = block_format(T.IQ1_M).scales[0]
    synth.put_scale(T.IQ1_M, b, s, [0x3C00, 0xBC00, 0x0001])
    assert [int(blocks.iq1_m_d_bits(b[i], 48)) for i in range(3)] == [0x3C00, 0xBC00, 0x0001]
    w = b[:, 48:56].copy().view("<u2")
    assert ((w & 0x0FFF) == 0xBAB).all()                       # the 3-bit scales kept
    q = np.zeros((2, 20), np.uint8)
    synth.put_scale(T.Q4_1, q, block_format(T.Q4_1).scales[1], 0xB800)   # m = -0.5
    assert q[:, 2:4].view("<u2").tolist() == [[0xB800], [0xB800]] and not q[:, :2].any()


# -- the rules of strata_ref.blocks, compiled and as NumPy -------------------

def _k4_ref(s, j):
    # ggml get_scale_min_k4, restated from ggml-quants.c
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def test_rules_agree_compiled_numpy_and_ggml():
    rng = np.random.default_rng(5)
    b = rng.integers(0, 256, (300, 144), dtype=np.uint8)
    o = block_format(T.Q4_K).offset("scales")
    for j in range(8):
        sc, mn = blocks.scale_min_k4.py_func(b.T, o, j)
        for i in (0, 1, 150, 299):
            want = _k4_ref([int(x) for x in b[i, o:o + 12]], j)
            assert (int(sc[i]), int(mn[i])) == want == tuple(int(v) for v in blocks.scale_min_k4(b[i], o, j))
    q3 = rng.integers(0, 256, (50, 110), dtype=np.uint8)
    o = block_format(T.Q3_K).offset("scales")
    for s in range(16):
        col = blocks.q3_k_scale.py_func(q3.T, o, s)
        assert [int(blocks.q3_k_scale(q3[i], o, s)) for i in range(50)] == col.tolist()
        assert (-32 <= col).all() and (col <= 31).all()
    x = rng.integers(0, 256, (50, 136), dtype=np.uint8)
    f = block_format(T.IQ4_XS)
    for ib in range(8):
        col = blocks.iq4_xs_ls.py_func(x.T, f.offset("scales_h"), f.offset("scales_l"), ib)
        lo = (x[:, 4 + ib // 2] >> (4 * (ib % 2))) & 15
        hi = (x[:, 2:4].copy().view("<u2")[:, 0] >> (2 * ib)) & 3
        assert np.array_equal(col, lo.astype(np.int64) | (hi.astype(np.int64) << 4))
