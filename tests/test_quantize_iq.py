"""I-quant reference quantizers (strata_ref.formats.iquants_quant).

Expected bytes are derived here from ggml's rules (ggml-org/ggml
src/ggml-quants.c `quantize_row_iq4_nl_ref`, `quantize_iq4_xs`,
`quantize_row_iq3_xxs_impl`, `quantize_row_iq3_s_impl`,
`quantize_row_iq2_s_impl`) on blocks whose answer those rules fix exactly:
blocks that *are* a code pattern times a power-of-two scale. There the
scale search reaches a perfect fit, whose least-squares scale is exactly
the power of two (every term of sumqx is the matching term of sumq2 times
s, so float32 rounding cannot tell them apart), and nothing else fits as
well. The level values and IQ4_NL code values are written here from
../shared/spec/formats.md §7; the grid rows come from the tables module.

The live comparison against ggml's C library is tools/quantize_vs_c.py;
golden/ggml/quantize.json hashes are checked by tests/test_ggml_vectors.py.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_ref.quantize import quantize
from strata_ref.formats import get_quantizer, iq_tables
from strata_ref.formats import iquants_quant as iq
from strata_ref.formats.iq_grid_maps import grid_map
from strata_ref.types import GGMLType, block_format

# kvalues_iq4nl, spec/formats.md §7
KV = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])

# (grid rows as bytes, grid byte of each level, format): spec/formats.md §7
GRIDS = {
    "IQ3_XXS": (iq_tables.IQ3XXS_GRID_BYTES, (4, 12, 20, 28, 36, 44, 52, 62)),
    "IQ3_S": (iq_tables.IQ3S_GRID_BYTES, (1, 3, 5, 7, 9, 11, 13, 15)),
    "IQ2_S": (iq_tables.IQ2S_GRID_BYTES, (8, 25, 43)),
}
# per format: values per group, groups per sub-block, the d fudge factor
SHAPE = {"IQ3_XXS": (4, 8, 1.0125), "IQ3_S": (4, 8, 1.033), "IQ2_S": (8, 2, 0.9875)}

F32 = np.float32


def fp16_bits(v) -> int:
    """ggml's GGML_FP32_TO_FP16 for finite v: IEEE round to nearest even."""
    return int(np.array(F32(v)).astype(np.float16).view(np.uint16))


def u16(b, o):
    return int(b[o]) | int(b[o + 1]) << 8


def u32(b, o):
    return int.from_bytes(bytes(b[o:o + 4]), "little")


# --------------------------------------------------------------- IQ4_NL / IQ4_XS

def iq4_block(perm, s):
    """32 values kvalues[perm[j]] * s; perm[0] = 0 makes x[0] = -127 s the
    first value of largest |x|."""
    return (KV[perm] * s).astype(F32)


@pytest.mark.parametrize("fn", [iq.quantize_iq4_nl_ref, iq.quantize_iq4_nl_chunk])
@pytest.mark.parametrize("s", [2.0 ** -9, 1.0, 32.0])
def test_iq4_nl_exact_block(fn, s):
    # d0 = max/-127 = s (ref) or the trial id = -127/max = 1/s (chunk) gives
    # id*x = the code values exactly, best_index_int8 returns their indices,
    # and the least-squares d is s.
    rng = np.random.default_rng(int(s * 1024))
    perm = rng.integers(0, 16, 32)
    perm[0] = 0
    out = fn(iq4_block(perm, s)[None])[0]
    fmt = block_format(GGMLType.IQ4_NL)
    assert u16(out, fmt.offset("d")) == fp16_bits(s)
    qs = out[fmt.offset("qs"):fmt.offset("qs") + 16]
    assert list(qs) == [int(perm[j] | perm[j + 16] << 4) for j in range(16)]


@pytest.mark.parametrize("fn", [iq.quantize_iq4_nl_ref, iq.quantize_iq4_nl_chunk])
@pytest.mark.parametrize("v", [0.0, -0.0, 9e-16, -1e-20])
def test_iq4_nl_block_below_eps(fn, v):
    # max|x| < GROUP_MAX_EPS (1e-15): d = 0; codes best_index_int8(0) = 8
    # (value 1: |1 - 0| < |0 - (-10)|), as quantize_iq4_nl stores them (the
    # _ref function leaves them undefined; module docstring).
    x = np.full((1, 32), v, F32)
    out = fn(x)[0]
    fmt = block_format(GGMLType.IQ4_NL)
    assert u16(out, fmt.offset("d")) == 0
    assert (out[fmt.offset("qs"):] == 0x88).all()


def test_iq4_nl_ref_and_chunk_are_different_rules():
    # ntry = -1 keeps the codes of d0 = max/-127; ntry = 7 searches 15 more
    # scales and re-derives the codes: on random data they differ often.
    x = np.random.default_rng(1).standard_normal((64, 32)).astype(F32)
    a = iq.quantize_iq4_nl_ref(x)
    b = iq.quantize_iq4_nl_chunk(x)
    assert (a != b).any(axis=1).sum() > 16


def test_iq4_xs_exact_block():
    # Sub-block ib is kvalues[perm] * 2^-k[ib]; each sub-block's search finds
    # scale 2^-k (trial itry = 0: id = -127/max), max_scale = 1 (ib 0, first
    # largest), d = -1/32, l = nearest_int(-32 * 2^-k) = -32 * 2^-k, stored
    # l + 32; dl = d*l = 2^-k exactly, so the codes are perm again.
    k = np.array([0, 1, 2, 3, 4, 5, 0, 1])
    rng = np.random.default_rng(7)
    perm = rng.integers(0, 16, (8, 32))
    perm[:, 0] = 0
    x = np.concatenate([iq4_block(perm[ib], 2.0 ** -k[ib]) for ib in range(8)])
    out = iq.quantize_iq4_xs_ref(x[None])[0]
    fmt = block_format(GGMLType.IQ4_XS)
    ls = 32 - 32 // 2 ** k                      # [0, 16, 24, 28, 30, 31, 0, 16]
    assert u16(out, fmt.offset("d")) == fp16_bits(-1.0 / 32)
    sl = fmt.offset("scales_l")
    assert list(out[sl:sl + 4]) == [int((ls[2 * i] & 15) | (ls[2 * i + 1] & 15) << 4)
                                    for i in range(4)]
    assert u16(out, fmt.offset("scales_h")) == sum(int(ls[ib] >> 4) << 2 * ib for ib in range(8))
    qs = out[fmt.offset("qs"):]
    want = [int(perm[ib, j] | perm[ib, j + 16] << 4) for ib in range(8) for j in range(16)]
    assert list(qs) == want


# --------------------------------------------------------------- grid types

def grid_block(name, rng, s, zero_sub=()):
    """A 256-value block made of grid rows times s with random signs.

    Returns (x, rows (n_groups,), sign bytes (n_groups_of_8,)). The first
    group of every sub-block is a row holding the top level, so the
    sub-block max is (2*top + 1) s. IQ3_XXS signs have even parity per 8.
    Sub-blocks in zero_sub are all zeros (rows -1, signs 0)."""
    rows_b, levels = GRIDS[name]
    n, ng, _ = SHAPE[name]
    lv = np.searchsorted(levels, rows_b)                       # level of each byte
    assert (np.asarray(levels)[lv] == rows_b).all()
    pos = 2 * lv + 1
    top = np.flatnonzero((lv == len(levels) - 1).any(axis=1))
    nsub = 256 // (n * ng)
    rows = rng.integers(0, len(rows_b), nsub * ng)
    rows[::ng] = rng.choice(top, nsub)
    signs = rng.integers(0, 256, 32)
    if name == "IQ3_XXS":
        par = np.array([bin(v & 127).count("1") & 1 for v in signs])
        signs = (signs & 127) | (par << 7)
    mag = pos[rows].reshape(-1).astype(np.float64)
    neg = np.unpackbits(signs.astype(np.uint8), bitorder="little").astype(bool)
    x = np.where(neg, -mag, mag) * s
    for ib in zero_sub:
        x[ib * n * ng:(ib + 1) * n * ng] = 0
        rows[ib * ng:(ib + 1) * ng] = -1
        signs[ib * n * ng // 8:(ib + 1) * n * ng // 8] = 0
    return x.astype(F32), rows, signs


def expected_d(name, s):
    # max_scale = s; d = max_scale/31 in float32, stored fp16(d * fudge)
    return fp16_bits(F32(F32(s) / F32(31)) * F32(SHAPE[name][2]))


@pytest.mark.parametrize("s", [2.0 ** -6, 0.5, 8.0])
def test_iq3_xxs_exact_block(s):
    rng = np.random.default_rng(11)
    x, rows, signs = grid_block("IQ3_XXS", rng, s)
    out = quantize(x, "IQ3_XXS")
    fmt = block_format(GGMLType.IQ3_XXS)
    assert u16(out, fmt.offset("d")) == expected_d("IQ3_XXS", s)
    assert list(out[fmt.offset("qs"):fmt.offset("qs") + 64]) == list(rows)
    for ib in range(8):
        sas = u32(out, fmt.offset("scales_and_signs") + 4 * ib)
        want = sum(int(signs[4 * ib + k] & 127) << 7 * k for k in range(4)) | 15 << 28
        assert sas == want, ib


@pytest.mark.parametrize("s", [2.0 ** -6, 0.5, 8.0])
def test_iq3_s_exact_block(s):
    rng = np.random.default_rng(12)
    x, rows, signs = grid_block("IQ3_S", rng, s)
    out = quantize(x, "IQ3_S")
    fmt = block_format(GGMLType.IQ3_S)
    assert u16(out, fmt.offset("d")) == expected_d("IQ3_S", s)
    assert list(out[fmt.offset("qs"):fmt.offset("qs") + 64]) == list(rows & 255)
    qh = out[fmt.offset("qh"):fmt.offset("qh") + 8]
    assert list(qh) == [sum(int(rows[8 * ib + k] >> 8) << k for k in range(8)) for ib in range(8)]
    assert list(out[fmt.offset("signs"):fmt.offset("signs") + 32]) == list(signs)
    assert list(out[fmt.offset("scales"):fmt.offset("scales") + 4]) == [0xFF] * 4


def test_iq3_s_zero_sub_block_shifts_later_ones():
    # ggml skips an all-zero sub-block without advancing its qs/signs
    # pointers: sub-block ib lands in slot ib-1, the last slot stays zero.
    # qh is indexed by ib. Scale code of the zero sub-block: nearest_int(-0.5)
    # = 0 (half to even).
    rng = np.random.default_rng(13)
    x, rows, signs = grid_block("IQ3_S", rng, 0.25, zero_sub=(0,))
    out = quantize(x, "IQ3_S")
    fmt = block_format(GGMLType.IQ3_S)
    assert u16(out, fmt.offset("d")) == expected_d("IQ3_S", 0.25)
    qs = out[fmt.offset("qs"):fmt.offset("qs") + 64]
    assert list(qs) == list(rows[8:] & 255) + [0] * 8
    sg = out[fmt.offset("signs"):fmt.offset("signs") + 32]
    assert list(sg) == list(signs[4:]) + [0] * 4
    qh = out[fmt.offset("qh"):fmt.offset("qh") + 8]
    assert qh[0] == 0
    assert list(qh[1:]) == [sum(int(rows[8 * ib + k] >> 8) << k for k in range(8))
                            for ib in range(1, 8)]
    assert list(out[fmt.offset("scales"):fmt.offset("scales") + 4]) == [0xF0, 0xFF, 0xFF, 0xFF]


@pytest.mark.parametrize("s", [2.0 ** -6, 0.5, 8.0])
def test_iq2_s_exact_block(s):
    rng = np.random.default_rng(14)
    x, rows, signs = grid_block("IQ2_S", rng, s)
    out = quantize(x, "IQ2_S")
    fmt = block_format(GGMLType.IQ2_S)
    assert u16(out, fmt.offset("d")) == expected_d("IQ2_S", s)
    assert list(out[fmt.offset("qs"):fmt.offset("qs") + 32]) == list(rows & 255)
    qh = out[fmt.offset("qh"):fmt.offset("qh") + 8]
    assert list(qh) == [sum(int(rows[4 * i + k] >> 8) << 2 * k for k in range(4)) for i in range(8)]
    assert list(out[fmt.offset("signs"):fmt.offset("signs") + 32]) == list(signs)
    assert list(out[fmt.offset("scales"):fmt.offset("scales") + 8]) == [0xFF] * 8


@pytest.mark.parametrize("name", ["IQ3_XXS", "IQ3_S", "IQ2_S"])
def test_grid_types_all_zero_block(name):
    # every sub-block is skipped, max_scale = 0: the block is all zero bytes
    out = quantize(np.zeros(256, F32), name)
    assert not out.any()


# --------------------------------------------------------------- properties

I_TYPES = ["IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_S"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(-2, 4),
       name=st.sampled_from(I_TYPES))
def test_power_of_two_scaling_is_equivariant(seed, k, name):
    # Every step of ggml's rule commutes with x -> x * 2^k away from
    # overflow, underflow and the eps thresholds: products, quotients and
    # sums scale exactly, id*x and nearest_int's inputs do not change. So
    # the codes and sub-block scale codes are the same and d scales by 2^k
    # while d stays a normal fp16: N(0,1) blocks give |d| >= ~5e-4 (IQ4_XS:
    # max|x|/127/32), so k >= -2 keeps it above 2^-14 ~ 6.1e-5.
    fmt = block_format(name)
    x = np.random.default_rng(seed).standard_normal((2, 256)).astype(F32).reshape(-1)
    a = quantize(x, name).reshape(-1, fmt.block_bytes)
    b = quantize(x * F32(2.0 ** k), name).reshape(-1, fmt.block_bytes)
    o = fmt.offset("d")
    rest = np.ones(fmt.block_bytes, bool)
    rest[o:o + 2] = False
    assert (a[:, rest] == b[:, rest]).all()
    da = a[:, o:o + 2].copy().view(np.float16).astype(np.float64)
    db = b[:, o:o + 2].copy().view(np.float16).astype(np.float64)
    assert (db == da * 2.0 ** k).all()


def test_blocks_are_independent():
    x = np.random.default_rng(3).standard_t(2, (6, 256)).astype(F32)
    for name in I_TYPES:
        whole = quantize(x, name)
        assert (whole == np.stack([quantize(r, name) for r in x])).all(), name


# --------------------------------------------------------------- errors and registry

def test_registered_quantizers():
    assert get_quantizer(GGMLType.IQ4_NL) is iq.quantize_iq4_nl_ref
    assert get_quantizer(GGMLType.IQ4_XS) is iq.quantize_iq4_xs_ref
    assert get_quantizer(GGMLType.IQ3_XXS) is iq.quantize_iq3_xxs_ref
    assert get_quantizer(GGMLType.IQ3_S) is iq.quantize_iq3_s_ref
    assert get_quantizer(GGMLType.IQ2_S) is iq.quantize_iq2_s_ref


@pytest.mark.parametrize("name", I_TYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_input_is_refused(name, bad):
    fmt = block_format(name)
    x = np.ones((2, fmt.block_values), F32)
    x[1, 5] = bad
    fn = get_quantizer(name)
    with pytest.raises(ValueError, match="block 1, value 5"):
        fn(x)


def test_direct_call_checks_dtype_and_shape():
    with pytest.raises(TypeError, match="float32"):
        iq.quantize_iq3_s_ref(np.ones((1, 256)))
    with pytest.raises(ValueError, match=r"\(n_blocks, 256\)"):
        iq.quantize_iq3_s_ref(np.ones((1, 255), F32))
    assert iq.quantize_iq4_nl_ref(np.zeros((0, 32), F32)).shape == (0, 18)


@pytest.mark.parametrize("name", ["IQ3_XXS", "IQ3_S", "IQ2_S"])
def test_where_ggml_aborts_a_value_error_names_the_block(name):
    # |x| ~ 1e30: every weighted distance overflows to +Inf, no neighbour
    # beats FLT_MAX and ggml stops on GGML_ASSERT(grid_index >= 0)
    # (golden/ggml/quantize.json records "crash:6" for the "huge" case).
    x = np.ones((2, 256), F32)
    x[1] = np.random.default_rng(5).standard_normal(256).astype(F32) * F32(1e30)
    with pytest.raises(ValueError, match="aborts on block 1"):
        get_quantizer(name)(x)


# --------------------------------------------------------------- grid maps

@pytest.mark.parametrize("name,n,bits,nwant,nlev", [
    ("iq3xxs", 4, 3, 2, 8), ("iq3s", 4, 3, 3, 8), ("iq2s", 8, 2, 1, 3), ("iq1s", 8, 2, 3, 3)])
def test_grid_map_neighbours_by_brute_force(name, n, bits, nwant, nlev):
    # ggml's rule: the rows at the nwant smallest distinct squared distances
    # (positions 2l+1), ordered by (distance, row index).
    m = grid_map(name)
    pos = m.pos.astype(np.int64)
    for g in range(len(pos)):
        u = sum(int((pos[g, i] - 1) // 2) << bits * i for i in range(n))
        assert m.kmap[u] == g
    rng = np.random.default_rng(0)
    tried = 0
    while tried < 60:
        lv = rng.integers(0, nlev, n)
        u = sum(int(lv[i]) << bits * i for i in range(n))
        if m.kmap[u] >= 0:
            continue
        tried += 1
        d2 = ((pos - (2 * lv + 1)) ** 2).sum(axis=1)
        cut = np.unique(d2)[nwant - 1]
        want = sorted(np.flatnonzero(d2 <= cut), key=lambda g: (d2[g], g))
        got = m.nb[m.nb_start[u]:m.nb_start[u] + m.nb_count[u]]
        assert list(got) == want


# --------------------------------------------------------------- IQ1_M (unregistered)

def test_iq1_m_is_not_a_reference_quantizer():
    from strata_ref.formats import quantize_types
    assert GGMLType.IQ1_M not in quantize_types()


def test_iq1_m_chunk_equals_ggml_hashes():
    # golden/ggml/quantize.json hashes IQ1_M through ggml_quantize_chunk (no
    # imatrix), the entry point quantize_iq1_m_chunk follows.
    import json
    from pathlib import Path
    from strata_ref import golden
    from strata_ref.hashing import fnv1a64
    path = Path(__file__).resolve().parents[1] / "golden" / "ggml" / "quantize.json"
    if not path.is_file():
        pytest.skip("no golden/ggml/quantize.json")
    items = [it for it in json.loads(path.read_text())["cases"] if it["type"] == "IQ1_M"
             and len(it["bytes"]) == 16 and not it.get("nonfinite")]
    cases = {q.name: q for q in golden.quant_cases()}
    assert len(items) >= 8
    for it in items:
        x = cases[it["case"]].inputs()
        assert f"{fnv1a64(x.view(np.uint8).reshape(-1)):016x}" == it["input"], it["case"]
        out = iq.quantize_iq1_m_chunk(np.ascontiguousarray(x, F32).reshape(-1, 256))
        assert f"{fnv1a64(out.reshape(-1)):016x}" == it["bytes"], it["case"]
