"""GGMLType and BlockFormat declarations against the gguf package and ggml facts."""
import gguf
import numpy as np
import pytest

from strata_ref import GGMLType, UnsupportedTypeError, block_format
from strata_ref.types import REMOVED_TYPE_IDS, all_formats, parse_type


def test_every_id_and_names_match_gguf():
    assert [t.value for t in GGMLType] == list(range(43))
    for t in GGMLType:
        try:
            g = gguf.GGMLQuantizationType(t.value)
        except ValueError:
            # gguf 0.19.0 stops at Q1_0 (formats.md §1) and drops the removed ids
            assert t == GGMLType.Q2_0 or t.value in REMOVED_TYPE_IDS
            continue
        assert g.name == t.name


def test_block_sizes_match_gguf():
    for f in all_formats():
        try:
            g = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(f.type.value)]
        except ValueError:
            continue
        if f.type == GGMLType.Q8_1:
            # gguf-py still lists the old 40-byte Q8_1 (f32 d and s); ggml's
            # block_q8_1 is a half2 ds + 32 int8 = 36 bytes (formats.md §3).
            assert g == (32, 40) and f.block_bytes == 36
            continue
        assert g == (f.block_values, f.block_bytes), f.name


def test_fields_add_up_and_split():
    for f in all_formats():
        assert sum(x.nbytes for x in f.fields) == f.block_bytes
        offs = [x.offset for x in f.fields]
        assert offs == sorted(offs) and offs[0] == 0
    q4k = block_format("q4_k")
    assert (q4k.offset("d"), q4k.offset("dmin"), q4k.offset("scales"), q4k.offset("qs")) == (0, 2, 4, 16)
    blocks = np.arange(2 * 144, dtype=np.uint32).astype(np.uint8).reshape(2, 144)
    parts = q4k.split(blocks)
    assert parts["d"][1, 0] == 144 + 145 * 256 and parts["qs"].shape == (2, 128)
    with pytest.raises(ValueError):
        q4k.split(blocks[:, :100])


@pytest.mark.parametrize("tid", sorted(REMOVED_TYPE_IDS))
def test_removed_ids_raise(tid):
    with pytest.raises(UnsupportedTypeError, match="removed"):
        block_format(tid)


@pytest.mark.parametrize("bad", [43, -1, 1000, "Q9_9", 2.0, None])
def test_unknown_types_raise(bad):
    with pytest.raises(UnsupportedTypeError):
        parse_type(bad)
