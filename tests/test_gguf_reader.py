"""strata_ref.gguf: a valid file round-trips (checked against gguf-py's own
writer and reader), and each malformed case raises GGUFError naming the
offending field's byte offset.

Malformed files are built byte by byte here with struct, from the layout in
ggml-org/ggml docs/gguf.md, so that every field is under the test's control.
"""
from __future__ import annotations

import json
import os
import struct

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGUFEndian, GGUFValueType as V

from strata_ref.gguf import (GGML_MAX_NAME, MAX_ARRAY_DEPTH, GGUFError,
                             read, read_bytes, write_gguf)
from strata_ref.types import GGMLType

T = GGMLType


# ------------------------------------------------------------ byte builder

def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: "str | bytes") -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return u64(len(b)) + b


def build(kvs=(), tensors=(), data=b"", *, magic=b"GGUF", version=3,
          n_tensors=None, n_kv=None, alignment=32):
    """GGUF bytes and the offsets of their fields.

    kvs: (key, value type id, value bytes); tensors: (name, dims, type id,
    relative offset); data: the data section, written at the info end
    rounded up to `alignment`, with no padding after it. Offsets: "kv",
    "vtype", "value", "info", "n_dims", "dims", "type", "offset" (lists, one
    per item) and "data".
    """
    out = bytearray(magic + u32(version))
    out += u64(len(tensors) if n_tensors is None else n_tensors)
    out += u64(len(kvs) if n_kv is None else n_kv)
    offs = {k: [] for k in ("kv", "vtype", "value", "info", "n_dims", "dims",
                            "type", "offset")}
    for key, vtype, payload in kvs:
        offs["kv"].append(len(out))
        out += gstr(key)
        offs["vtype"].append(len(out))
        out += u32(vtype)
        offs["value"].append(len(out))
        out += payload
    for name, dims, ttype, rel in tensors:
        offs["info"].append(len(out))
        out += gstr(name)
        offs["n_dims"].append(len(out))
        out += u32(len(dims))
        offs["dims"].append(len(out))
        out += b"".join(u64(d) for d in dims)
        offs["type"].append(len(out))
        out += u32(ttype)
        offs["offset"].append(len(out))
        out += u64(rel)
    if tensors or data:
        out += bytes(-len(out) % alignment)
    offs["data"] = len(out)
    return bytes(out + data), offs


ARCH = ("general.architecture", V.STRING, gstr("llama"))


def valid():
    """Two tensors: F32 [8, 2] (64 bytes) at 0 and Q8_0 [32, 2] (68 bytes) at 64."""
    return build([ARCH], [("a", [8, 2], T.F32, 0), ("b", [32, 2], T.Q8_0, 64)],
                 bytes(range(132)))


def one_tensor(dims, ttype, rel=0, data_len=None, kvs=(ARCH,)):
    if data_len is None:
        data_len = 4 * int(np.prod(dims, dtype=object))
    return build(list(kvs), [("w", dims, ttype, rel)], bytes(data_len))


def fails(blob: bytes, offset: int, *words: str) -> GGUFError:
    with pytest.raises(GGUFError) as ei:
        read_bytes(blob)
    e = ei.value
    assert isinstance(e, ValueError)
    assert e.offset == offset, str(e)
    assert f"byte offset {offset}" in str(e)
    for w in words:
        assert w in str(e), str(e)
    return e


# ------------------------------------------------------------ valid files

def _fixture_metadata():
    return {
        "general.architecture": "llama",
        "t.u8": (V.UINT8, 255), "t.i8": (V.INT8, -128),
        "t.u16": (V.UINT16, 65535), "t.i16": (V.INT16, -32768),
        "t.u32": (V.UINT32, 2**32 - 1), "t.i32": (V.INT32, -2**31),
        "t.f32": (V.FLOAT32, 0.1), "t.bool": (V.BOOL, True),
        "t.false": (V.BOOL, False), "t.str": (V.STRING, "héllo ✓ 🦙"),
        "t.u64": (V.UINT64, 2**64 - 1), "t.i64": (V.INT64, -2**63),
        "t.f64": (V.FLOAT64, 0.1),
        "t.a_u8": (V.ARRAY, [0, 7, 255], V.UINT8),
        "t.a_i8": (V.ARRAY, [-128, 0, 127], V.INT8),
        "t.a_u16": (V.ARRAY, [0, 65535], V.UINT16),
        "t.a_i16": (V.ARRAY, [-32768, 32767], V.INT16),
        "t.a_u32": (V.ARRAY, [1, 2**32 - 1], V.UINT32),
        "t.a_i32": (V.ARRAY, [-2**31, 5], V.INT32),
        "t.a_f32": (V.ARRAY, [0.1, -2.5, 3e38], V.FLOAT32),
        "t.a_u64": (V.ARRAY, [2**64 - 1, 3], V.UINT64),
        "t.a_i64": (V.ARRAY, [-2**63, 2**63 - 1], V.INT64),
        "t.a_f64": (V.ARRAY, [0.1, 1e300], V.FLOAT64),
        "t.a_bool": (V.ARRAY, [True, False, True], V.BOOL),
        "t.a_str": (V.ARRAY, ["a", "", "ünï ✓"], V.STRING),
        "t.nested": (V.ARRAY, [[1, 2], [3]], V.ARRAY),
        "t.nested_str": (V.ARRAY, [["x"], ["y", "zz"]], V.ARRAY),
    }


_NP = {V.UINT8: np.uint8, V.INT8: np.int8, V.UINT16: np.uint16,
       V.INT16: np.int16, V.UINT32: np.uint32, V.INT32: np.int32,
       V.FLOAT32: np.float32, V.UINT64: np.uint64, V.INT64: np.int64,
       V.FLOAT64: np.float64, V.BOOL: np.bool_}


def _expected(vtype, value, sub=None):
    """What the reader must return for a value written with gguf-py."""
    if vtype == V.ARRAY:
        if sub == V.STRING:
            return list(value)
        if sub == V.ARRAY:   # gguf-py infers python ints as INT32, str as STRING
            return [np.array(v, np.int32) if isinstance(v[0], int) else list(v)
                    for v in value]
        return np.array(value, dtype=_NP[sub])
    if vtype == V.FLOAT32:
        return float(np.float32(value))
    return value


def _assert_same(got, want):
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w)
    else:
        assert type(got) is type(want) and got == want


def _fixture_tensors(rng):
    def raw(t, shape):
        qk, b = GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(t))]
        n = int(np.prod(shape)) // qk * b
        return rng.integers(0, 256, n, dtype=np.uint8)
    return [
        ("f32", T.F32, (3, 2), np.arange(6, dtype=np.float32) - 2.5),
        ("f16", T.F16, (4,), np.array([1, -2, 65504, 0.5], np.float16)),
        ("bf16", T.BF16, (8,), raw(T.BF16, (8,))),
        ("i32", T.I32, (5,), np.array([1, -1, 2**31 - 1, 0, 7], np.int32)),
        ("q4_0", T.Q4_0, (64, 2), raw(T.Q4_0, (64, 2))),
        ("q8_0", T.Q8_0, (32, 3), raw(T.Q8_0, (32, 3))),
        ("q4_k", T.Q4_K, (256, 2, 1), raw(T.Q4_K, (256, 2, 1))),
    ]


@pytest.fixture(scope="module")
def fixture_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "all_types.gguf"
    tensors = _fixture_tensors(np.random.default_rng(1))
    write_gguf(path, _fixture_metadata(), tensors)
    return path, tensors


def test_roundtrip_every_value_type(fixture_file):
    path, _ = fixture_file
    f = read(path)
    assert f.version == 3 and f.endian == "<" and f.alignment == 32
    meta = _fixture_metadata()
    assert list(f.metadata) == list(meta)
    for key, spec in meta.items():
        if not isinstance(spec, tuple):
            spec = (V.STRING, spec)
        assert f.metadata_types[key] == spec[0], key
        if spec[0] == V.ARRAY:
            assert f.array_types[key] == spec[2], key
        _assert_same(f.metadata[key], _expected(*spec))


def test_roundtrip_tensors(fixture_file):
    path, tensors = fixture_file
    f = read(path)
    assert [t.name for t in f.tensors] == [t[0] for t in tensors]
    assert f.data_offset % 32 == 0
    for t, (name, ttype, shape, data) in zip(f.tensors, tensors):
        qk, b = GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(ttype))]
        n = int(np.prod(shape))
        assert t.type is ttype and t.shape == shape and t.n_elements == n
        assert t.n_bytes == n // qk * b and t.offset % 32 == 0
        assert t.cols == shape[0] and t.rows == n // shape[0]
        assert t.data.dtype == np.uint8 and t.data.tobytes() == data.tobytes()
        assert isinstance(t.data, np.memmap) and not t.data.flags.writeable
        with pytest.raises(ValueError):
            t.data[0] = 1
        assert t.blocks.shape == (n // qk, b)
    assert f.tensor("q8_0") is f.tensors[5]
    with pytest.raises(KeyError):
        f.tensor("missing")


def test_agrees_with_gguf_py_reader(fixture_file):
    path, _ = fixture_file
    ours, theirs = read(path), gguf.GGUFReader(path)
    assert ours.data_offset == theirs.data_offset
    assert ours.alignment == theirs.alignment
    for key, field in theirs.fields.items():
        if key.startswith("GGUF.") or key.startswith("t.nested"):
            continue   # header pseudo-fields; gguf-py flattens nested arrays
        mine = ours.metadata[key]
        mine = mine.tolist() if isinstance(mine, np.ndarray) else mine
        assert field.contents() == mine, key
        assert field.types[0] == ours.metadata_types[key]
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.name, int(a.type), a.n_elements, a.n_bytes, a.offset) == \
            (b.name, int(b.tensor_type), b.n_elements, b.n_bytes, b.data_offset)
        assert a.shape == tuple(int(d) for d in b.shape)
        assert a.data.tobytes() == np.ascontiguousarray(b.data).tobytes()


def test_q2_0_tensor_is_read(tmp_path):
    # gguf-py 0.19.0 has no Q2_0 (id 42); QK = 64, 18 bytes per block
    # (strata_ref.types, from ggml-common.h block_q2_0).
    raw = np.arange(3 * 2 * 18, dtype=np.uint8)
    write_gguf(tmp_path / "q2.gguf", {}, [("w", T.Q2_0, (128, 3), raw)])
    f = read(tmp_path / "q2.gguf")
    t = f.tensor("w")
    assert t.type is T.Q2_0 and t.shape == (128, 3) and t.n_bytes == 108
    assert t.data.tobytes() == raw.tobytes()
    assert f.metadata == {"general.architecture": "strata-fixture"}
    # the type field written in the file is the ggml id itself
    blob = (tmp_path / "q2.gguf").read_bytes()
    info = blob.index(gstr("w"))
    assert struct.unpack_from("<I", blob, info + 9 + 4 + 16)[0] == 42


def test_custom_alignment(tmp_path):
    write_gguf(tmp_path / "a.gguf", {}, [
        ("x", T.F32, (3,), np.ones(3, np.float32)),
        ("y", T.F32, (5,), np.ones(5, np.float32))], alignment=64)
    f = read(tmp_path / "a.gguf")
    assert f.alignment == 64 and f.metadata_types["general.alignment"] == V.UINT32
    assert [t.offset % 64 for t in f.tensors] == [0, 0]
    assert f.tensors[1].offset - f.tensors[0].offset == 64


def test_hand_built_valid_file_and_read_matches_read_bytes(tmp_path):
    blob, offs = valid()
    path = tmp_path / "v.gguf"
    path.write_bytes(blob)
    for f in (read(path), read_bytes(blob)):
        assert f.data_offset == offs["data"]
        assert [(t.name, t.type, t.shape, t.offset, t.n_bytes) for t in f.tensors] == [
            ("a", T.F32, (8, 2), offs["data"], 64),
            ("b", T.Q8_0, (32, 2), offs["data"] + 64, 68)]
        assert f.tensors[1].data.tobytes() == bytes(range(64, 132))


def test_version_2_is_read():
    blob, _ = build([ARCH], version=2)
    f = read_bytes(blob)
    assert f.version == 2 and f.tensors == []


def test_empty_array_and_zero_counts():
    blob, _ = build([("k", V.ARRAY, u32(V.UINT32) + u64(0))])
    f = read_bytes(blob)
    assert f.metadata["k"].shape == (0,) and f.metadata["k"].dtype == np.uint32


def test_invalid_utf8_string_value_is_kept_with_surrogateescape():
    blob, _ = build([("k", V.STRING, gstr(b"a\xff"))])
    s = read_bytes(blob).metadata["k"]
    assert s.encode("utf-8", "surrogateescape") == b"a\xff"


# ------------------------------------------------------------ header

def test_bad_magic():
    blob, _ = build(magic=b"GGML")
    fails(blob, 0, "not a GGUF file")


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFF])
def test_unsupported_version(version):
    blob, _ = build(version=version)
    fails(blob, 4, "version")


def test_big_endian_version_field_is_refused():
    blob, _ = build(version=0x03000000)
    fails(blob, 4, "big-endian")


def test_big_endian_file_from_gguf_py_is_refused(tmp_path):
    path = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(path, "llama", endianess=GGUFEndian.BIG)
    w.add_uint32("k", 7)
    w.add_tensor("x", np.ones(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="big-endian GGUF .version 3") as ei:
        read(path)
    assert ei.value.offset == 4


@pytest.mark.parametrize("n", [0, 1, 3, 4, 7, 8, 15, 16, 23])
def test_truncated_header(tmp_path, n):
    blob, _ = build()
    want = {0: 0, 1: 0, 3: 0, 4: 4, 7: 4, 8: 8, 15: 8, 16: 16, 23: 16}[n]
    fails(blob[:n], want, "truncated")
    (tmp_path / "t.gguf").write_bytes(blob[:n])
    with pytest.raises(GGUFError) as ei:
        read(tmp_path / "t.gguf")
    assert ei.value.offset == want


def test_kv_count_larger_than_file():
    blob, _ = build([ARCH], n_kv=2**40)
    fails(blob, 16, "kv_count 1099511627776", "more than the file could hold")


def test_tensor_count_larger_than_file():
    blob, _ = build([ARCH], n_tensors=2**63)
    fails(blob, 8, "tensor_count 9223372036854775808", "more than the file could hold")


def test_tensor_count_larger_than_what_follows_metadata():
    # passes the header bound (the metadata is long) but not the one after it
    blob, offs = build([ARCH, ("pad", V.STRING, gstr("x" * 100))], n_tensors=3)
    fails(blob, 8, "tensor_count 3", f"metadata (which ends at byte {len(blob)})")


# ------------------------------------------------------------ metadata

def test_truncated_key():
    blob, offs = build([("pad", V.STRING, gstr("x" * 30)),
                        ("general.name", V.STRING, gstr("abc"))])
    fails(blob[:offs["kv"][1] + 8 + 5], offs["kv"][1], "key 1 length 12")


def test_truncated_value_type():
    blob, offs = build([("k", V.UINT32, u32(1)), ("k2", V.UINT32, u32(1))])
    cut = offs["vtype"][1] + 2
    fails(blob[:cut], offs["vtype"][1], "truncated", "value type of key 'k2'")


@pytest.mark.parametrize("vtype,nbytes", [(V.UINT16, 2), (V.UINT32, 4), (V.UINT64, 8),
                                          (V.FLOAT64, 8), (V.INT64, 8)])
def test_truncated_scalar_value(vtype, nbytes):
    blob, offs = build([("pad", V.STRING, gstr("x" * 30)), ("k", vtype, bytes(nbytes))])
    fails(blob[:-1], offs["value"][1], "truncated", f"{vtype.name} value of key 'k'")


def test_truncated_string_value():
    blob, offs = build([("k", V.STRING, gstr("x" * 40))])
    fails(blob[:-10], offs["value"][0], "string value of key 'k' length 40",
          "larger than the 30 bytes left")


def test_string_length_larger_than_file():
    blob, offs = build([("k", V.STRING, u64(2**64 - 1) + b"abc")])
    fails(blob, offs["value"][0], "length 18446744073709551615")


def test_key_length_larger_than_file():
    blob, offs = build([("k", V.UINT8, b"\x01")])
    blob = blob[:24] + u64(2**62) + blob[32:]
    fails(blob, 24, "key 0 length 4611686018427387904")


@pytest.mark.parametrize("etype,size", [(V.UINT8, 1), (V.UINT32, 4), (V.FLOAT64, 8),
                                        (V.STRING, 8), (V.ARRAY, 12)])
def test_array_count_larger_than_file(etype, size):
    payload = u32(etype) + u64(2**61) + bytes(64)
    blob, offs = build([("k", V.ARRAY, payload)])
    fails(blob, offs["value"][0] + 4, f"array of 2305843009213693952 {etype.name}",
          f"{size} bytes each")


def test_truncated_array_of_numbers():
    blob, offs = build([("k", V.ARRAY, u32(V.UINT32) + u64(20) + bytes(80))])
    fails(blob[:-4], offs["value"][0] + 4, "array of 20 UINT32")


def test_truncated_array_of_strings():
    items = gstr("ab" * 10) + gstr("cdef") + gstr("ghijkl")
    blob, offs = build([("k", V.ARRAY, u32(V.STRING) + u64(3) + items)])
    second = offs["value"][0] + 12 + 28
    fails(blob[:-3], second + 12, "key 'k'[2] length 6")
    fails(blob[:second + 5], second, "truncated", "key 'k'[1] length")


def test_truncated_nested_array():
    inner = u32(V.INT32) + u64(2) + u32(1) + u32(2)
    blob, offs = build([("k", V.ARRAY, u32(V.ARRAY) + u64(2) + inner + inner)])
    second = offs["value"][0] + 12 + len(inner)
    fails(blob[:-2], second + 4, "key 'k'[1]", "array of 2 INT32")


@pytest.mark.parametrize("raw", [13, 255, 2**32 - 1])
def test_unknown_value_type(raw):
    blob, offs = build([ARCH, ("k", raw, bytes(8))])
    fails(blob, offs["vtype"][1], f"unknown value type id {raw}", "key 'k'")


def test_unknown_array_element_type():
    blob, offs = build([("k", V.ARRAY, u32(13) + u64(1) + bytes(8))])
    fails(blob, offs["value"][0], "unknown value type id 13", "elements of key 'k'")


def test_array_nesting_limit():
    depth = MAX_ARRAY_DEPTH + 1
    payload = b"".join(u32(V.ARRAY) + u64(1) for _ in range(depth - 1)) + u32(V.UINT8) + u64(0)
    blob, offs = build([("k", V.ARRAY, payload)])
    fails(blob, offs["value"][0] + 12 * (depth - 1), f"nested deeper than {MAX_ARRAY_DEPTH}")
    ok, _ = build([("k", V.ARRAY, payload[12:])])
    assert read_bytes(ok).metadata["k"][0][0][0][0][0][0][0].size == 0


def test_bool_value_not_0_or_1():
    blob, offs = build([("k", V.BOOL, b"\x02")])
    fails(blob, offs["value"][0], "BOOL byte is 2")
    blob, offs = build([("k", V.ARRAY, u32(V.BOOL) + u64(3) + b"\x01\x00\x07")])
    fails(blob, offs["value"][0] + 12 + 2, "key 'k'[2]: BOOL byte is 7")


def test_duplicate_key():
    blob, offs = build([("k", V.UINT8, b"\x01"), ARCH, ("k", V.UINT8, b"\x02")])
    fails(blob, offs["kv"][2], "duplicate key 'k'", f"first at byte offset {offs['kv'][0]}")


def test_empty_key():
    blob, offs = build([ARCH, ("", V.UINT8, b"\x01")])
    fails(blob, offs["kv"][1], "key 1 is empty")


def test_key_not_utf8():
    blob, offs = build([(b"ab\xc3", V.UINT8, b"\x01")])
    fails(blob, offs["kv"][0], "key 0 is not valid UTF-8")


@pytest.mark.parametrize("vtype,payload", [(V.INT32, u32(32)), (V.UINT64, u64(32)),
                                           (V.STRING, gstr("32")), (V.UINT16, b"\x20\x00")])
def test_alignment_of_wrong_type(vtype, payload):
    blob, offs = build([ARCH, ("general.alignment", vtype, payload)])
    fails(blob, offs["vtype"][1], "general.alignment must be of type UINT32",
          vtype.name)


@pytest.mark.parametrize("a", [0, 3, 48, 2**32 - 1])
def test_alignment_not_power_of_two(a):
    blob, offs = build([("general.alignment", V.UINT32, u32(a))])
    fails(blob, offs["value"][0], f"general.alignment is {a}, not a power of two")


# ------------------------------------------------------------ tensor infos

def test_truncated_tensor_info_sections():
    kvs = [ARCH, ("pad", V.STRING, gstr("x" * 64))]
    name = "blk.0.attn_output.weight.with.a.long.name"
    blob, offs = build(kvs, [(name, [32, 4], T.F32, 0)], bytes(512))
    info, n_dims, dims, ttype, rel = (offs[k][0] for k in
                                      ("info", "n_dims", "dims", "type", "offset"))
    fails(blob[:info + 4], 8, "tensor_count 1")            # bound before the infos
    fails(blob[:info + 8 + 20], info, f"tensor 0 length {len(name)}")
    fails(blob[:n_dims + 2], n_dims, "truncated", f"n_dims of tensor '{name}'")
    fails(blob[:dims + 12], dims + 8, "truncated", f"ne[1] of tensor '{name}'")
    fails(blob[:ttype + 1], ttype, "truncated", f"type of tensor '{name}'")
    fails(blob[:rel + 7], rel, "truncated", f"data offset of tensor '{name}'")
    fails(blob[:offs["data"] + 511], rel, "outside the file")
    fails(blob[:rel + 8], rel, "outside the file")      # data section missing


def test_more_dims_than_ggml_allows():
    blob, offs = one_tensor([32, 1, 1, 1, 1], T.F32)
    fails(blob, offs["n_dims"][0], "5 dimensions", "at most 4")


def test_n_dims_huge():
    blob, offs = build([ARCH], [("w", [], T.F32, 0)], bytes(4))
    blob = blob[:offs["n_dims"][0]] + u32(2**32 - 1) + blob[offs["n_dims"][0] + 4:]
    fails(blob, offs["n_dims"][0], "4294967295 dimensions")


def test_zero_dims_is_a_scalar():
    blob, _ = build([ARCH], [("w", [], T.F32, 0)], bytes(4))
    t = read_bytes(blob).tensors[0]
    assert t.shape == () and t.n_elements == 1 and t.n_bytes == 4 and t.rows == t.cols == 1


@pytest.mark.parametrize("j,ne", [(1, 2**63), (2, 2**64 - 1), (0, 2**63)])
def test_bad_dimension(j, ne):
    dims = [32, 2, 2]
    dims[j] = ne
    blob, offs = one_tensor(dims, T.F32, data_len=64)
    fails(blob, offs["dims"][0] + 8 * j, f"ne[{j}] = {ne} is not in 0..2**63-1")


@pytest.mark.parametrize("dims, rows, cols", [([0], 1, 0), ([32, 0], 0, 32), ([0, 3], 3, 0),
                                              ([32, 2, 0, 5], 0, 32)])
def test_zero_size_tensor_is_valid_and_empty(tmp_path, capsys, dims, rows, cols):
    # ggml's reader and gguf-py's GGUFReader accept a dimension of 0; the
    # tensor takes no bytes, shares the offset of the next one, and hashes
    # as the empty output
    from strata_ref.cli import main
    from strata_ref.hashing import FNV64_OFFSET, hash_tensor
    blob, offs = build([ARCH], [("empty", dims, T.Q4_0 if cols else T.F32, 0),
                                ("next", [8], T.F32, 0)], np.arange(8, dtype="<f4").tobytes())
    f = read_bytes(blob)
    e, n = f.tensors
    assert (e.shape, e.rows, e.cols, e.n_elements, e.n_bytes) == (tuple(dims), rows, cols, 0, 0)
    assert e.data.size == 0 and e.offset == n.offset == offs["data"] and e.blocks.shape[0] == 0
    assert hash_tensor(e.type, e.data, e.rows, e.cols) == {d: FNV64_OFFSET for d in ("f32", "f16", "bf16")}
    path = tmp_path / "z.gguf"
    path.write_bytes(blob)
    r = gguf.GGUFReader(path)
    assert [(t.name, int(t.n_elements), int(t.data_offset)) for t in r.tensors] == \
        [("empty", 0, offs["data"]), ("next", 8, offs["data"])]
    del r
    capsys.readouterr()
    assert main(["hash", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tensors"][0]["hash"] == {d: f"{FNV64_OFFSET:016x}" for d in ("f32", "f16", "bf16")}
    assert doc["tensors"][0]["shape"] == dims
    assert main(["info", str(path)]) == 0
    assert "2 tensors" in capsys.readouterr().out


def test_zero_size_tensor_at_the_end_of_the_data():
    # an empty tensor may sit where the data ends, not beyond
    blob, _ = build([ARCH], [("w", [8], T.F32, 0), ("e", [0, 4], T.F32, 32)], bytes(32))
    e = read_bytes(blob).tensors[1]
    assert e.offset == len(blob) and e.n_bytes == 0
    blob, offs = build([ARCH], [("w", [8], T.F32, 0), ("e", [0], T.F32, 64)], bytes(32))
    fails(blob, offs["offset"][1], "tensor 'e'", "outside the file")


def test_element_count_overflow():
    blob, offs = one_tensor([2**32, 2**31, 1, 1], T.F32, data_len=64)
    fails(blob, offs["n_dims"][0], "9223372036854775808 elements", "not below 2**63")


def test_byte_size_overflow():
    # 2**62 F32 values fit an int64 count but take 2**64 bytes
    blob, offs = one_tensor([2**31, 2**31], T.F32, data_len=64)
    fails(blob, offs["n_dims"][0], "takes 18446744073709551616 bytes", "not below 2**63")


@pytest.mark.parametrize("t,ne0,qk", [(T.Q4_0, 48, 32), (T.Q4_K, 128, 256),
                                       (T.Q2_0, 32, 64), (T.NVFP4, 96, 64)])
def test_row_not_a_multiple_of_block_size(t, ne0, qk):
    blob, offs = one_tensor([ne0, 2], t, data_len=1024)
    fails(blob, offs["n_dims"][0] + 4, f"ne[0] = {ne0} is not a multiple",
          f"{t.name} block size {qk}")


@pytest.mark.parametrize("raw", [43, 1000, 2**32 - 1])
def test_unknown_tensor_type(raw):
    blob, offs = one_tensor([32], raw)
    fails(blob, offs["type"][0], f"unknown ggml type id {raw}", "tensor 'w'")


@pytest.mark.parametrize("raw", [4, 5, 31, 32, 33, 36, 37, 38])
def test_removed_tensor_type(raw):
    blob, offs = one_tensor([32], raw, data_len=1024)
    fails(blob, offs["type"][0], "was removed", f"id {raw}", "tensor 'w'")


def test_duplicate_tensor_name():
    blob, offs = build([ARCH], [("w", [8], T.F32, 0), ("v", [8], T.F32, 32),
                                ("w", [8], T.F32, 64)], bytes(96))
    fails(blob, offs["info"][2], "duplicate tensor name 'w'",
          f"first info at byte offset {offs['info'][0]}")


def test_tensor_name_not_utf8():
    blob, offs = build([ARCH], [(b"w\xfe", [8], T.F32, 0)], bytes(32))
    fails(blob, offs["info"][0], "name of tensor 0 is not valid UTF-8")


def test_tensor_name_too_long():
    name = "n" * GGML_MAX_NAME
    blob, offs = build([ARCH], [(name, [8], T.F32, 0)], bytes(32))
    fails(blob, offs["info"][0], f"is {GGML_MAX_NAME} bytes")
    ok, _ = build([ARCH], [(name[1:], [8], T.F32, 0)], bytes(32))
    assert read_bytes(ok).tensors[0].name == name[1:]


def test_tensor_name_length_larger_than_file():
    blob, offs = build([ARCH], [("w", [8], T.F32, 0)], bytes(32))
    at = offs["info"][0]
    blob = blob[:at] + u64(2**63 + 5) + blob[at + 8:]
    fails(blob, at, "name of tensor 0 length 9223372036854775813")


# ------------------------------------------------------------ tensor data

@pytest.mark.parametrize("rel", [4, 16, 33])
def test_misaligned_data_offset(rel):
    blob, offs = one_tensor([8], T.F32, rel=rel, data_len=128)
    fails(blob, offs["offset"][0], f"data offset {rel} is not a multiple of the alignment 32")


def test_misaligned_for_custom_alignment():
    kvs = [ARCH, ("general.alignment", V.UINT32, u32(64))]
    blob, offs = build(kvs, [("w", [8], T.F32, 32)], bytes(128), alignment=64)
    fails(blob, offs["offset"][0], "alignment 64")


@pytest.mark.parametrize("rel", [32, 2**40, 2**64 - 32])
def test_data_outside_file(rel):
    blob, offs = one_tensor([8], T.F32, rel=rel, data_len=40)
    start = offs["data"] + rel
    fails(blob, offs["offset"][0], f"data bytes {start}..{start + 32}", "outside the file")


def test_data_section_past_end_of_file():
    # a huge alignment puts the data section itself beyond the end
    kvs = [ARCH, ("general.alignment", V.UINT32, u32(2**31))]
    blob, offs = build(kvs, [("w", [8], T.F32, 0)], b"", alignment=1)
    blob += bytes(64)
    fails(blob, offs["offset"][0], "outside the file", "data section starts at 2147483648")


@pytest.mark.parametrize("second", [0, 32, 64])
def test_overlapping_tensors(second):
    # "a" holds 96 bytes at 0..96; "b" starts inside it
    blob, offs = build([ARCH], [("a", [24], T.F32, 0), ("b", [8], T.F32, second)],
                       bytes(160))
    fails(blob, offs["offset"][1], "tensor 'b'", "overlaps tensor 'a'")


def test_overlap_found_regardless_of_info_order():
    blob, offs = build([ARCH], [("b", [8], T.F32, 64), ("a", [24], T.F32, 0)],
                       bytes(160))
    fails(blob, offs["offset"][0], "tensor 'b'", "overlaps tensor 'a'")


def test_gaps_and_out_of_order_tensors_are_accepted():
    blob, offs = build([ARCH], [("b", [8], T.F32, 128), ("a", [8], T.F32, 0)],
                       bytes(160))
    f = read_bytes(blob)
    assert [t.offset - f.data_offset for t in f.tensors] == [128, 0]


def test_every_truncation_is_refused():
    blob, _ = valid()
    for n in range(len(blob)):
        with pytest.raises(GGUFError) as ei:
            read_bytes(blob[:n])
        assert ei.value.offset <= n
    read_bytes(blob)


def test_write_gguf_rejects_inconsistent_tensors(tmp_path):
    with pytest.raises(ValueError, match="needs|takes"):
        write_gguf(tmp_path / "x.gguf", {}, [("w", T.Q4_0, (32,), np.zeros(17, np.uint8))])
    with pytest.raises(ValueError, match="raw uint8"):
        write_gguf(tmp_path / "x.gguf", {}, [("w", T.Q4_0, (32,), np.zeros(9, np.float16))])
    with pytest.raises(ValueError, match="not a multiple"):
        write_gguf(tmp_path / "x.gguf", {}, [("w", T.Q8_0, (16,), np.zeros(17, np.uint8))])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_fifo_and_directory_are_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo.gguf")
    from strata_ref.gguf import read_file
    for p in (tmp_path / "fifo.gguf", tmp_path):
        with pytest.raises(GGUFError, match="not a regular file"):
            read_file(p)
    with pytest.raises(GGUFError, match="not a regular file"):
        read(tmp_path / "fifo.gguf")
    # a directory is searched for its one model; a FIFO is not taken for one
    with pytest.raises(GGUFError, match="the directory holds no .gguf file"):
        read(tmp_path)


def test_write_gguf_architecture_typed_or_refused(tmp_path):
    from strata_ref.gguf import read, write_gguf
    write_gguf(tmp_path / "a.gguf", {"general.architecture": (V.STRING, "llama")}, [])
    assert read(tmp_path / "a.gguf").metadata["general.architecture"] == "llama"
    with pytest.raises(TypeError, match="general.architecture must be a str"):
        write_gguf(tmp_path / "b.gguf", {"general.architecture": 3}, [])
