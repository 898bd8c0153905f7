"""ggml's I-quant tables (strata_ref.formats.iq_tables) and their generator.

Second source: the official `gguf` package (gguf-py 0.19.0), which carries
compressed copies in `gguf/quants.py` (grid_shape, grid_map, grid_hex,
ksigns and kvalues per class). Every entry is compared with it, and the
facts of ../shared/spec/formats.md §7 are checked from their definitions.
"""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest
from gguf import quants as gq

from strata_ref.formats import _iq_tables_data as data
from strata_ref.formats import iq_tables as t

ROOT = Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_iq_tables", ROOT / "tools" / "gen_iq_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen = _load_generator()


def _gguf_grid(cls) -> np.ndarray:
    """gguf-py's decoded grid of a quant class as int64 (rows, elements)."""
    cls.init_grid()
    g = np.asarray(cls.grid)
    g = g.reshape(g.shape[-2], g.shape[-1])
    gi = g.astype(np.int64)
    assert np.array_equal(gi, g), "gguf grid values are not integers"
    return gi


def _first_diff(a, b) -> str:
    idx = np.argwhere(np.asarray(a) != np.asarray(b))
    return "equal" if len(idx) == 0 else f"{len(idx)} entries differ, first at {tuple(idx[0])}"


# --- entry by entry against gguf-py ----------------------------------------

GRIDS = [
    ("IQ2XXS_GRID_BYTES", gq.IQ2_XXS, (256, 8)),
    ("IQ2XS_GRID_BYTES", gq.IQ2_XS, (512, 8)),
    ("IQ2S_GRID_BYTES", gq.IQ2_S, (1024, 8)),
    ("IQ3XXS_GRID_BYTES", gq.IQ3_XXS, (256, 4)),
    ("IQ3S_GRID_BYTES", gq.IQ3_S, (512, 4)),
    ("IQ1S_GRID_BYTES", gq.IQ1_S, (2048, 8)),
]


@pytest.mark.parametrize("name, cls, shape", GRIDS, ids=[g[0] for g in GRIDS])
def test_grid_matches_gguf(name, cls, shape):
    ours = getattr(t, name)
    theirs = _gguf_grid(cls)
    assert ours.shape == shape == theirs.shape
    assert np.array_equal(ours.astype(np.int64), theirs), _first_diff(ours, theirs)


def test_iq1_m_shares_the_iq1_s_grid_in_gguf():
    assert np.array_equal(_gguf_grid(gq.IQ1_M), t.IQ1S_GRID_BYTES.astype(np.int64))


def test_ksigns_matches_gguf():
    theirs = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8)
    assert theirs.shape == (128,)
    assert np.array_equal(t.KSIGNS_IQ2XS, theirs), _first_diff(t.KSIGNS_IQ2XS, theirs)


def test_kvalues_iq4nl_matches_gguf():
    assert t.KVALUES_IQ4NL.dtype == np.int8
    assert t.KVALUES_IQ4NL.tolist() == list(gq.IQ4_NL.kvalues)


# --- the integer tables and their byte rows agree ---------------------------

@pytest.mark.parametrize("ints, rows, width", [
    ("IQ2XXS_GRID", "IQ2XXS_GRID_BYTES", 8), ("IQ2XS_GRID", "IQ2XS_GRID_BYTES", 8),
    ("IQ2S_GRID", "IQ2S_GRID_BYTES", 8), ("IQ3XXS_GRID", "IQ3XXS_GRID_BYTES", 4),
    ("IQ3S_GRID", "IQ3S_GRID_BYTES", 4), ("IQ1S_GRID", "IQ1S_GRID_BYTES", 8),
])
def test_rows_are_little_endian_bytes(ints, rows, width):
    # C reads a row through a byte pointer: element j is byte j of the
    # integer in little-endian memory. Python's int.to_bytes says the same
    # without numpy's views.
    signed = rows == "IQ1S_GRID_BYTES"
    for g, (v, row) in enumerate(zip(getattr(t, ints).tolist(), getattr(t, rows))):
        want = list(int(v).to_bytes(width, "little"))
        if signed:
            want = [b - 256 if b >= 128 else b for b in want]
        assert row.tolist() == want, (ints, g)


# --- facts of formats.md §7 ---------------------------------------------------

def test_table_sizes_and_types():
    sizes = {
        "KMASK_IQ2XS": (8, np.uint8), "KSIGNS_IQ2XS": (128, np.uint8),
        "IQ2XXS_GRID": (256, np.uint64), "IQ2XS_GRID": (512, np.uint64),
        "IQ2S_GRID": (1024, np.uint64), "IQ3XXS_GRID": (256, np.uint32),
        "IQ3S_GRID": (512, np.uint32), "IQ1S_GRID": (2048, np.uint64),
        "IQ1S_GRID_GPU": (2048, np.uint32), "KVALUES_IQ4NL": (16, np.int8),
    }
    for name, (n, dtype) in sizes.items():
        a = getattr(t, name)
        assert a.shape == (n,) and a.dtype == dtype, (name, a.shape, a.dtype)
        assert not a.flags.writeable, name


def test_kmask_is_one_bit_per_element():
    assert t.KMASK_IQ2XS.tolist() == [1 << j for j in range(8)]


def test_ksigns_parity_rule():
    # Entry k holds the 7 explicit sign bits k and an 8th bit that makes the
    # number of negated elements even.
    for k in range(128):
        parity = bin(k).count("1") & 1
        assert int(t.KSIGNS_IQ2XS[k]) == k | (parity << 7), k
        assert bin(int(t.KSIGNS_IQ2XS[k])).count("1") % 2 == 0


@pytest.mark.parametrize("name, values", [
    ("IQ2XXS_GRID_BYTES", {8, 25, 43}),
    ("IQ2XS_GRID_BYTES", {8, 25, 43}),
    ("IQ2S_GRID_BYTES", {8, 25, 43}),
    ("IQ3XXS_GRID_BYTES", {4, 12, 20, 28, 36, 44, 52, 62}),
    ("IQ3S_GRID_BYTES", set(range(1, 16, 2))),
    ("IQ1S_GRID_BYTES", {-1, 0, 1}),
])
def test_grid_byte_sets_and_distinct_rows(name, values):
    a = getattr(t, name)
    assert set(np.unique(a).tolist()) == values
    assert len(np.unique(a, axis=0)) == len(a), f"{name} has repeated rows"


def test_iq1s_grid_gpu_decodes_to_iq1s_grid():
    # Nibbles hold value + 1: the low nibble of byte k is element k, the high
    # nibble element k + 4 (k < 4).
    for g, (gpu, row) in enumerate(zip(t.IQ1S_GRID_GPU.tolist(), t.IQ1S_GRID_BYTES)):
        lo = [((gpu >> (8 * k)) & 0xF) - 1 for k in range(4)]
        hi = [((gpu >> (8 * k + 4)) & 0xF) - 1 for k in range(4)]
        assert lo + hi == row.tolist(), g


def test_kvalues_iq4nl_values():
    assert t.KVALUES_IQ4NL.tolist() == [-127, -104, -83, -65, -49, -35, -22, -10,
                                       1, 13, 25, 38, 53, 69, 89, 113]


def test_source_is_named():
    assert "ggml-common.h" in t.SOURCE
    assert len(t.SOURCE_SHA256) == 64 and int(t.SOURCE_SHA256, 16) >= 0


# --- the generator --------------------------------------------------------

def test_committed_data_module_is_the_generators_output():
    # Regenerating from the parsed values must give the committed file byte
    # for byte, so the file was not edited by hand after generation.
    tables = {name: getattr(data, name) for name in gen.TABLES}
    text = gen.render_module(tables, data.SOURCE, data.SOURCE_SHA256)
    assert text == Path(data.__file__).read_text()


SYNTHETIC = """
#define NGRID_TEST 3
#define IQ1S_DELTA 0.125f
// a line comment with GGML_TABLE_END() inside
GGML_TABLE_BEGIN(uint8_t, kmask_iq2xs, 8)
    1, 2, 4, 8, 16, 32, 64, 128
GGML_TABLE_END()

/* a block comment
   GGML_TABLE_BEGIN(uint8_t, kmask_iq2xs, 1) 7 GGML_TABLE_END() */
GGML_TABLE_BEGIN(int8_t, kvalues_iq4nl, 4)
    -127, -10, 1, 113,
GGML_TABLE_END()

#if defined(GGML_COMMON_IMPL_C)
GGML_TABLE_BEGIN(uint64_t, iq1s_grid, NGRID_TEST)
    0xffffffffffffffff, 0x0101010101010101, 0x00ff00ff00ff00ffULL,
GGML_TABLE_END()
#else
GGML_TABLE_BEGIN(uint64_t, iq1s_grid, NGRID_TEST)
    0xffffffffffffffff, 0x0101010101010101, 0x00ff00ff00ff00ff,
GGML_TABLE_END()
#endif
GGML_TABLE_BEGIN(float, some_float_table, 2)
    0.5f, 1.5f,
GGML_TABLE_END()
"""


def test_parse_synthetic_header():
    names = {"kmask_iq2xs", "kvalues_iq4nl", "iq1s_grid"}
    got = gen.parse_tables(SYNTHETIC, names)
    assert got["kmask_iq2xs"] == ("uint8_t", (1, 2, 4, 8, 16, 32, 64, 128))
    assert got["kvalues_iq4nl"] == ("int8_t", (-127, -10, 1, 113))
    assert got["iq1s_grid"] == ("uint64_t", (2**64 - 1, 0x0101010101010101,
                                             0x00FF00FF00FF00FF))
    assert "some_float_table" not in got      # not asked for, never parsed


@pytest.mark.parametrize("header, message", [
    ("GGML_TABLE_BEGIN(uint8_t, kmask_iq2xs, 3)\n 1, 2,\nGGML_TABLE_END()", "2 entries"),
    ("GGML_TABLE_BEGIN(uint8_t, kmask_iq2xs, 2)\n 1, 256\nGGML_TABLE_END()", "outside"),
    ("GGML_TABLE_BEGIN(int8_t, kmask_iq2xs, 1)\n -129\nGGML_TABLE_END()", "outside"),
    ("GGML_TABLE_BEGIN(uint8_t, kmask_iq2xs, N)\n 1\nGGML_TABLE_END()", "size macro"),
    ("GGML_TABLE_BEGIN(uint8_t, kmask_iq2xs, 1)\n 1.5\nGGML_TABLE_END()", "integer literal"),
    ("GGML_TABLE_BEGIN(uint8_t, kmask_iq2xs, 1)\n 1\nGGML_TABLE_END()\n"
     "GGML_TABLE_BEGIN(uint8_t, kmask_iq2xs, 1)\n 2\nGGML_TABLE_END()", "twice"),
])
def test_parse_rejects_bad_tables(header, message):
    with pytest.raises(gen.HeaderError, match=message):
        gen.parse_tables(header, {"kmask_iq2xs"})


def test_select_reports_missing_and_mistyped_tables():
    with pytest.raises(gen.HeaderError, match="ksigns_iq2xs not found"):
        gen.select_tables({"kmask_iq2xs": ("uint8_t", (1,))},
                          {"kmask_iq2xs": "uint8_t", "ksigns_iq2xs": "uint8_t"})
    with pytest.raises(gen.HeaderError, match="C type int8_t"):
        gen.select_tables({"kmask_iq2xs": ("int8_t", (1,))}, {"kmask_iq2xs": "uint8_t"})


def test_generator_round_trip(tmp_path):
    # A complete synthetic header: every table the generator wants, each with
    # distinct values; the written module must give them back exactly.
    rng = random.Random(7)
    sizes = {"kmask_iq2xs": 8, "ksigns_iq2xs": 128, "iq2xxs_grid": 256,
             "iq2xs_grid": 512, "iq2s_grid": 1024, "iq3xxs_grid": 256,
             "iq3s_grid": 512, "iq1s_grid": 2048, "iq1s_grid_gpu": 2048,
             "kvalues_iq4nl": 16}
    bits = {"uint8_t": 8, "uint32_t": 32, "uint64_t": 64}
    want, parts = {}, ["#define NGRID_IQ1S 2048"]
    for name, ctype in gen.TABLES.items():
        n = sizes[name]
        if ctype == "int8_t":
            vals = tuple(rng.getrandbits(8) - 128 for _ in range(n))
        else:
            vals = tuple(rng.getrandbits(bits[ctype]) for _ in range(n))
        want[name] = vals
        size = "NGRID_IQ1S" if n == 2048 else str(n)
        body = ",\n".join(hex(v) if ctype != "int8_t" else str(v) for v in vals)
        parts.append(f"GGML_TABLE_BEGIN({ctype}, {name}, {size})\n{body},\nGGML_TABLE_END()")
    header = tmp_path / "ggml-common.h"
    header.write_text("\n".join(parts))
    out = tmp_path / "data.py"
    assert gen.main([str(header), "--source", "synthetic @ 0", "-o", str(out)]) == 0
    ns: dict = {}
    exec(out.read_text(), ns)
    assert ns["SOURCE"] == "synthetic @ 0"
    for name, vals in want.items():
        assert ns[name] == vals, name


def test_generator_fails_cleanly_on_a_bad_header(tmp_path, capsys):
    header = tmp_path / "ggml-common.h"
    header.write_text("GGML_TABLE_BEGIN(uint8_t, kmask_iq2xs, 8)\n 1, 2\nGGML_TABLE_END()")
    out = tmp_path / "data.py"
    assert gen.main([str(header), "--source", "x", "-o", str(out)]) == 1
    assert "kmask_iq2xs: 2 entries, declared 8" in capsys.readouterr().err
    assert not out.exists()
