"""GGUF files: a strict reader, gguf-split sets opened as one model, and a
fixture writer over the official package.

`read(path)` parses a GGUF v2/v3 file itself and checks every field before
it is used; the official `gguf` package (gguf-py 0.19.0) supplies the value
type enum and, in `write_gguf`, the writer. We parse ourselves because
gguf-py's `GGUFReader` trusts the file (an array count is looped over as
given, a truncated field becomes a short slice, a bad id surfaces as a raw
enum error) and knows no ggml type after Q1_0 (id 41), while strata-ref
reads Q2_0 (id 42).

Layout (ggml-org/ggml `docs/gguf.md`; checks follow ggml `src/gguf.cpp`
`gguf_init_from_reader`; all integers little-endian):

    header       "GGUF", u32 version, u64 tensor_count, u64 kv_count
    key/value    string key, u32 value type, value       (kv_count times)
    tensor info  string name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
                 u64 offset relative to the data section (tensor_count times)
    padding      to `general.alignment` (u32, default 32)
    data         tensor bytes at their offsets

A string is a u64 byte length and that many UTF-8 bytes. An array value is
a u32 element type, a u64 count and the elements; its elements may be arrays
again (gguf-py writes nested lists that way; ggml's C reader refuses them).

Every malformed file raises `GGUFError` (a ValueError) naming the problem,
the byte offset of the offending field and, where known, the key or tensor.
Work and memory are bounded by the file size: every count and length is
checked against the bytes that remain before anything is read or allocated,
numeric arrays are taken with one `np.frombuffer` each, and Python loops run
only over items that take at least 8 bytes of file each (strings, nested
arrays, key/value pairs, tensor infos).

What is refused, beyond truncation anywhere:
- magic other than "GGUF"; versions other than 2 and 3 (v1 used 32-bit
  counts); big-endian files (recognised by their byte-swapped version and
  refused: this reader is little-endian only; gguf-py's
  `gguf_convert_endian.py` converts them);
- a key that is empty, not UTF-8 or repeated; an unknown value type id; a
  bool byte other than 0 or 1 (ggml reads any nonzero byte as true); arrays nested deeper than `MAX_ARRAY_DEPTH`;
  `general.alignment` that is not a UINT32 or not a power of two;
- a tensor name that is not UTF-8, repeated, or `GGML_MAX_NAME` (64) bytes
  or longer; more than `GGML_MAX_DIMS` (4) dimensions; a dimension >= 2**63
  (a dimension of 0 is a valid empty tensor, as in ggml and gguf-py: it
  takes no data bytes); element or byte counts >= 2**63; a ggml type id that is
  unknown or was removed from the format (4, 5, 31-33, 36-38); ne[0] not a
  multiple of the type's block size;
- tensor data that is misaligned, reaches past the end of the file, or
  overlaps another tensor's data (an empty tensor overlaps nothing). (ggml additionally requires the tensors
  to be packed in info order with padding only; gaps are accepted here.)

Split sets (llama.cpp's `gguf-split`, gguf-py's `GGUFWriter(split_max_*)`):
shards are named `NAME-00001-of-0000N.gguf` and carry `split.no` (0-based),
`split.count` and `split.tensors.count`; only the first carries the
architecture and the tokenizer. `read` of any shard (or of the directory
holding one model) returns a `GGUFSplit` whose tensors are every shard's,
in shard order and then file order; `read_split` lists what it checks.
`read_file` reads one file as it is.

String values are decoded as UTF-8 with `errors="surrogateescape"`, so
any byte string is accepted and its bytes come back with
`s.encode("utf-8", "surrogateescape")`; keys and tensor names must be valid
UTF-8.
"""
from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from .types import (GGML_TYPE_COUNT, BlockFormat, GGMLType,
                    UnsupportedTypeError, block_format)

__all__ = ["GGUFError", "GGUFFile", "GGUFTensor", "GGUFSplit", "GGUFValueType",
           "read", "read_file", "read_split", "read_bytes", "find_model",
           "split_set", "shard_name", "SHARD_NAME", "write_gguf", "GGML_MAX_DIMS", "GGML_MAX_NAME",
           "MAX_ARRAY_DEPTH", "SUPPORTED_VERSIONS"]

#: ggml `include/ggml.h`: a tensor has at most 4 dimensions.
GGML_MAX_DIMS = 4
#: ggml `include/ggml.h`: a tensor name, with its terminating NUL, fits 64 bytes.
GGML_MAX_NAME = 64
#: GGUF versions read here (gguf-py's reader reads the same two).
SUPPORTED_VERSIONS = (2, 3)
#: Nesting limit for arrays of arrays (ours: gguf defines none, ggml allows 0).
MAX_ARRAY_DEPTH = 8

_INT64_LIMIT = 1 << 63
_HEADER_BYTES = 24
# Smallest encodings, used to bound counts before looping: a key/value pair
# has a u64 length, >= 1 key byte, a u32 type and >= 1 value byte; a tensor
# info has a u64 name length, u32 n_dims, u32 type and u64 offset.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8

_V = GGUFValueType
# Fixed-size value types: little-endian numpy dtype (BOOL read as u1 and checked).
_DTYPES: dict[GGUFValueType, np.dtype] = {
    _V.UINT8: np.dtype("u1"), _V.INT8: np.dtype("i1"),
    _V.UINT16: np.dtype("<u2"), _V.INT16: np.dtype("<i2"),
    _V.UINT32: np.dtype("<u4"), _V.INT32: np.dtype("<i4"),
    _V.FLOAT32: np.dtype("<f4"), _V.BOOL: np.dtype("u1"),
    _V.UINT64: np.dtype("<u8"), _V.INT64: np.dtype("<i8"),
    _V.FLOAT64: np.dtype("<f8"),
}
_STRUCT = {t: struct.Struct("<" + c) for t, c in (
    (_V.UINT8, "B"), (_V.INT8, "b"), (_V.UINT16, "H"), (_V.INT16, "h"),
    (_V.UINT32, "I"), (_V.INT32, "i"), (_V.FLOAT32, "f"), (_V.BOOL, "B"),
    (_V.UINT64, "Q"), (_V.INT64, "q"), (_V.FLOAT64, "d"))}
_MIN_VALUE_BYTES = {**{t: dt.itemsize for t, dt in _DTYPES.items()},
                    _V.STRING: 8, _V.ARRAY: 4 + 8}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class GGUFError(ValueError):
    """A malformed or unsupported GGUF file, or a broken split set.

    Attributes: `problem` (text), `offset` (byte offset in the file of the
    field at fault, int; None for a problem of a split set that no single
    field holds, such as a missing shard), `path` (the file, or None).
    """

    def __init__(self, problem: str, offset: int | None, path: str | None = None):
        self.problem = problem
        self.offset = offset
        self.path = path
        where = f"{path}: " if path else ""
        at = "" if offset is None else f" (at byte offset {offset})"
        super().__init__(f"{where}{problem}{at}")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file.

    `shape` is in ggml order: `shape[0]` is ne[0], the row length (the
    contiguous dimension); NumPy order is `shape[::-1]`. `n_bytes` =
    n_elements / block_values * block_bytes. `offset` is absolute in the
    file. `data` is a read-only uint8 view (a memory map for `read`) of
    exactly the tensor's `n_bytes` bytes. `info_offset` is where the
    tensor's info record starts.
    """
    name: str
    type: GGMLType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    offset: int
    data: np.ndarray = field(repr=False, compare=False)
    info_offset: int = 0

    @property
    def cols(self) -> int:
        """ne[0], values per row."""
        return self.shape[0] if self.shape else 1

    @property
    def rows(self) -> int:
        """Product of ne[1:], the number of rows (0 for an empty tensor
        whose ne[1:] holds a 0; an empty row length keeps its rows)."""
        n = 1
        for ne in self.shape[1:]:
            n *= ne
        return n

    @property
    def block_format(self) -> BlockFormat:
        return block_format(self.type)

    @property
    def blocks(self) -> np.ndarray:
        """`data` as a read-only (n_blocks, block_bytes) uint8 array."""
        return self.data.reshape(-1, self.block_format.block_bytes)


@dataclass
class GGUFFile:
    """A parsed GGUF file (see the module docstring for what was checked).

    `metadata`: key -> value in file order. Integers are int, FLOAT32 and
    FLOAT64 are float (exact), BOOL is bool, STRING is str; an array of
    numbers or bools is a 1-D numpy array of the element type (little-endian
    dtype, a copy), an array of strings a list of str, an array of arrays a
    list of such values. `metadata_types`: key -> GGUFValueType;
    `array_types`: key -> element GGUFValueType for ARRAY keys.
    `tensors`: GGUFTensor list in file (info) order. `data_offset`: absolute
    start of the data section. `endian` is always "<". `key_offsets`: key ->
    byte offset of its key/value record. `shards` is `[self]`, so that code
    written for a split set (`GGUFSplit`) takes a single file as well.
    """
    path: str | None
    version: int
    alignment: int
    data_offset: int
    file_size: int
    metadata: dict[str, Any]
    metadata_types: dict[str, GGUFValueType]
    array_types: dict[str, GGUFValueType]
    tensors: list[GGUFTensor]
    endian: str = "<"
    key_offsets: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._by_name = {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> GGUFTensor:
        """The tensor called `name`; KeyError if there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in {self.path or 'GGUF data'}") from None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def shards(self) -> list["GGUFFile"]:
        return [self]


def read(path: "str | os.PathLike[str]") -> "GGUFFile | GGUFSplit":
    """Read and validate a GGUF model: one file, a whole gguf-split set given
    by any of its shards, or a directory holding one model.

    A file whose `split.count` is above 1 is a shard: its siblings are found
    by llama.cpp's naming convention (`split_set`) and the set comes back as
    one `GGUFSplit` (metadata of the first shard, tensors of every shard).
    Tensor data stays in read-only `np.memmap`s of the files. Raises
    GGUFError for any malformed or unsupported file (module docstring), for
    a broken split set (`read_split`), for a path that is neither a regular
    file nor such a directory; OSError if a file cannot be opened.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = find_model(path)
    f = read_file(path)
    count = _split_key(f, SPLIT_COUNT)
    parsed = _shard_of_name(os.path.basename(path))
    if (count is None or count == 1) and (parsed is None or parsed[2] == 1):
        return f
    if parsed is None:
        raise GGUFError(f"{SPLIT_COUNT} is {count}, but the file name does not follow "
                        f"gguf-split's NAME-00001-of-{count:05d}.gguf, so the other shards "
                        "cannot be found (give the shards their names back)",
                        f.key_offsets.get(SPLIT_COUNT), path)
    return read_split(path, f)


def read_file(path: "str | os.PathLike[str]") -> GGUFFile:
    """Read and validate the one GGUF file at `path`, a shard as it is (its
    split keys are not followed).

    Tensor data stays in a read-only `np.memmap` of the file. Raises
    GGUFError for any malformed or unsupported file (module docstring) and
    for a path that is not a regular file; OSError if it cannot be opened.
    """
    path = os.fspath(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        # a FIFO or device could block or never end
        raise GGUFError("not a regular file", 0, path)
    if st.st_size < _HEADER_BYTES:
        # np.memmap refuses empty files; the header check gives the message.
        with open(path, "rb") as f:
            return _parse(np.frombuffer(f.read(), dtype=np.uint8), path)
    return _parse(np.memmap(path, dtype=np.uint8, mode="r"), path)


def read_bytes(data: "bytes | bytearray | memoryview") -> GGUFFile:
    """Validate and parse GGUF bytes held in memory (as `read`; the tensor
    data are read-only views of a private copy of `data`)."""
    return _parse(np.frombuffer(bytes(data), dtype=np.uint8), None)


class _Cursor:
    """Reads fields in order from a uint8 buffer, checking each against the
    bytes that remain."""

    def __init__(self, buf: np.ndarray, path: str | None):
        self.buf = buf
        self.mv = memoryview(buf)
        self.size = len(buf)
        self.pos = 0
        self.path = path

    def error(self, problem: str, offset: int | None = None) -> GGUFError:
        # A corrupt length can put kilobytes of junk in a key or tensor name:
        # keep the message to one readable line.
        if len(problem) > 240:
            problem = problem[:200] + " ... " + problem[-35:]
        return GGUFError(problem, self.pos if offset is None else offset, self.path)

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.remaining:
            raise self.error(f"file truncated in {what}: needs {n} bytes, "
                             f"the file ends after {self.remaining}")

    def unpack(self, st: struct.Struct, what: str):
        self.need(st.size, what)
        (v,) = st.unpack_from(self.mv, self.pos)
        self.pos += st.size
        return v

    def u32(self, what: str) -> int:
        return self.unpack(_U32, what)

    def u64(self, what: str) -> int:
        return self.unpack(_U64, what)

    def raw_string(self, what: str) -> bytes:
        start = self.pos
        n = self.u64(f"{what} length")
        if n > self.remaining:
            raise self.error(f"{what} length {n} is larger than the "
                             f"{self.remaining} bytes left in the file", start)
        s = self.mv[self.pos:self.pos + n].tobytes()
        self.pos += n
        return s

    def name(self, what: str) -> str:
        """A key or tensor name: strict UTF-8."""
        start = self.pos
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"{what} is not valid UTF-8 ({e.reason} at "
                             f"byte {e.start} of the name)", start) from None

    def text(self, what: str) -> str:
        return self.raw_string(what).decode("utf-8", "surrogateescape")


def _parse(buf: np.ndarray, path: str | None) -> GGUFFile:
    cur = _Cursor(buf, path)
    version, n_tensors, n_kv = _read_header(cur)
    metadata, types, array_types, places = _read_metadata(cur, n_kv)
    alignment = _alignment(cur, metadata, types, places)
    infos = _read_tensor_infos(cur, n_tensors, alignment)
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = _place_tensors(cur, infos, data_offset)
    return GGUFFile(path=path, version=version, alignment=alignment,
                    data_offset=data_offset, file_size=cur.size,
                    metadata=metadata, metadata_types=types,
                    array_types=array_types, tensors=tensors,
                    key_offsets={k: v[0] for k, v in places.items()})


def _read_header(cur: _Cursor) -> tuple[int, int, int]:
    magic = cur.u32("the magic")
    if magic != GGUF_MAGIC:
        raise cur.error(f"not a GGUF file: magic {_U32.pack(magic)!r}, "
                        "expected b'GGUF'", 0)
    version = cur.u32("the version")
    if version not in SUPPORTED_VERSIONS:
        raise cur.error(_version_problem(version), 4)
    n_tensors = cur.u64("tensor_count")
    n_kv = cur.u64("kv_count")
    room = cur.remaining
    if n_kv > room // _MIN_KV_BYTES:
        raise cur.error(
            f"kv_count {n_kv} is more than the file could hold: each key/value "
            f"pair takes at least {_MIN_KV_BYTES} bytes and {room} remain", 16)
    room -= n_kv * _MIN_KV_BYTES
    if n_tensors > room // _MIN_TENSOR_INFO_BYTES:
        raise cur.error(
            f"tensor_count {n_tensors} is more than the file could hold: each "
            f"tensor info takes at least {_MIN_TENSOR_INFO_BYTES} bytes and at "
            f"most {room} remain besides the key/value pairs", 8)
    return version, n_tensors, n_kv


def _version_problem(version: int) -> str:
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version & 0xFFFF == 0 and swapped in (1, 2, 3):
        return (f"big-endian GGUF (version {swapped} stored big-endian) is not "
                "supported: this reader is little-endian only (gguf-py's "
                "gguf_convert_endian.py converts the file)")
    if version == 1:
        return "GGUF version 1 (32-bit counts) is not supported"
    return (f"unsupported GGUF version {version} (supported: "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))})")


def _read_metadata(cur: _Cursor, n_kv: int):
    metadata: dict[str, Any] = {}
    types: dict[str, GGUFValueType] = {}
    array_types: dict[str, GGUFValueType] = {}
    places: dict[str, tuple[int, int]] = {}   # key -> (kv offset, value-type offset)
    for i in range(n_kv):
        kv_offset = cur.pos
        key = cur.name(f"key {i}")
        if not key:
            raise cur.error(f"key {i} is empty", kv_offset)
        if key in metadata:
            raise cur.error(f"duplicate key {key!r} (first at byte offset "
                            f"{places[key][0]})", kv_offset)
        type_offset = cur.pos
        vtype = _value_type(cur, f"key {key!r}")
        metadata[key] = _read_value(cur, vtype, f"key {key!r}", 0)
        types[key] = vtype
        if vtype == _V.ARRAY:
            array_types[key] = _V(_U32.unpack_from(cur.mv, type_offset + 4)[0])
        places[key] = (kv_offset, type_offset)
    return metadata, types, array_types, places


def _value_type(cur: _Cursor, what: str) -> GGUFValueType:
    offset = cur.pos
    raw = cur.u32(f"the value type of {what}")
    try:
        return _V(raw)
    except ValueError:
        raise cur.error(f"{what}: unknown value type id {raw} (GGUF value "
                        f"types are 0..{max(_V)})", offset) from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, what: str, depth: int) -> Any:
    if vtype == _V.STRING:
        return cur.text(f"the string value of {what}")
    if vtype == _V.ARRAY:
        return _read_array(cur, what, depth + 1)
    offset = cur.pos
    value = cur.unpack(_STRUCT[vtype], f"the {vtype.name} value of {what}")
    if vtype == _V.BOOL:
        if value > 1:
            raise cur.error(f"{what}: BOOL byte is {value}, not 0 or 1", offset)
        return bool(value)
    return value


def _read_array(cur: _Cursor, what: str, depth: int) -> Any:
    offset = cur.pos
    if depth > MAX_ARRAY_DEPTH:
        raise cur.error(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}", offset)
    etype = _value_type(cur, f"the elements of {what}")
    count_offset = cur.pos
    count = cur.u64(f"the array length of {what}")
    per_item = _MIN_VALUE_BYTES[etype]
    if count > cur.remaining // per_item:
        raise cur.error(
            f"{what}: array of {count} {etype.name} values is more than the file "
            f"could hold ({per_item} bytes each at least, {cur.remaining} remain)",
            count_offset)
    if etype in _DTYPES:
        return _read_numbers(cur, etype, count, what)
    if etype == _V.STRING:
        return _read_strings(cur, count, what)
    return [_read_value(cur, etype, f"{what}[{i}]", depth) for i in range(count)]


def _read_numbers(cur: _Cursor, etype: GGUFValueType, count: int, what: str) -> np.ndarray:
    dt = _DTYPES[etype]
    a = np.frombuffer(cur.buf, dtype=dt, count=count, offset=cur.pos).copy()
    if etype == _V.BOOL:
        bad = np.flatnonzero(a > 1)
        if bad.size:
            i = int(bad[0])
            raise cur.error(f"{what}[{i}]: BOOL byte is {a[i]}, not 0 or 1", cur.pos + i)
        a = a.astype(np.bool_)
    cur.pos += count * dt.itemsize
    return a


def _read_strings(cur: _Cursor, count: int, what: str) -> list[str]:
    # The hot loop of real files (tokenizer vocabularies of 10^5 strings),
    # kept to local names; a string that does not fit is re-read by
    # `_Cursor.text`, which raises the error.
    mv, size, pos = cur.mv, cur.size, cur.pos
    unpack = _U64.unpack_from
    out = []
    for i in range(count):
        if size - pos < 8 or unpack(mv, pos)[0] > size - pos - 8:
            cur.pos = pos
            cur.text(f"{what}[{i}]")
        n = unpack(mv, pos)[0]
        pos += 8
        out.append(str(mv[pos:pos + n], "utf-8", "surrogateescape"))
        pos += n
    cur.pos = pos
    return out


def _alignment(cur: _Cursor, metadata, types, places) -> int:
    key = "general.alignment"
    if key not in metadata:
        return GGUF_DEFAULT_ALIGNMENT
    type_offset = places[key][1]
    if types[key] != _V.UINT32:
        raise cur.error(f"{key} must be of type UINT32, the file has "
                        f"{types[key].name}", type_offset)
    a = metadata[key]
    if a == 0 or a & (a - 1):
        raise cur.error(f"{key} is {a}, not a power of two", type_offset + 4)
    return a


@dataclass
class _Info:
    name: str
    type: GGMLType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    rel_offset: int
    info_offset: int
    offset_field: int


def _read_tensor_infos(cur: _Cursor, n_tensors: int, alignment: int) -> list[_Info]:
    if n_tensors > cur.remaining // _MIN_TENSOR_INFO_BYTES:
        raise cur.error(
            f"tensor_count {n_tensors} is more than the file could hold: each "
            f"tensor info takes at least {_MIN_TENSOR_INFO_BYTES} bytes and "
            f"{cur.remaining} remain after the metadata (which ends at byte "
            f"{cur.pos})", 8)
    infos: list[_Info] = []
    first_at: dict[str, int] = {}
    for i in range(n_tensors):
        info = _read_tensor_info(cur, i, alignment)
        if info.name in first_at:
            raise cur.error(f"duplicate tensor name {info.name!r} (first info at "
                            f"byte offset {first_at[info.name]})", info.info_offset)
        first_at[info.name] = info.info_offset
        infos.append(info)
    return infos


def _read_tensor_info(cur: _Cursor, i: int, alignment: int) -> _Info:
    info_offset = cur.pos
    name = cur.name(f"the name of tensor {i}")
    if len(name.encode("utf-8")) >= GGML_MAX_NAME:
        raise cur.error(f"tensor {i} name {name[:20]!r}... is "
                        f"{len(name.encode('utf-8'))} bytes; ggml allows at most "
                        f"{GGML_MAX_NAME - 1}", info_offset)
    what = f"tensor {name!r}"
    n_dims_offset = cur.pos
    n_dims = cur.u32(f"the n_dims of {what}")
    if n_dims > GGML_MAX_DIMS:
        raise cur.error(f"{what} has {n_dims} dimensions; ggml allows at most "
                        f"{GGML_MAX_DIMS}", n_dims_offset)
    shape = []
    for j in range(n_dims):
        dim_offset = cur.pos
        ne = cur.u64(f"ne[{j}] of {what}")
        if ne >= _INT64_LIMIT:
            raise cur.error(f"{what}: ne[{j}] = {ne} is not in 0..2**63-1", dim_offset)
        shape.append(ne)
    type_offset = cur.pos
    t = _tensor_type(cur, cur.u32(f"the type of {what}"), what, type_offset)
    fmt = block_format(t)
    n_elements = 1
    for ne in shape:
        n_elements *= ne
    if n_elements >= _INT64_LIMIT:
        raise cur.error(f"{what}: shape {tuple(shape)} has {n_elements} "
                        "elements, not below 2**63", n_dims_offset)
    cols = shape[0] if shape else 1
    if cols % fmt.block_values:
        raise cur.error(f"{what}: ne[0] = {cols} is not a multiple of the "
                        f"{fmt.name} block size {fmt.block_values}", n_dims_offset + 4)
    n_bytes = n_elements // fmt.block_values * fmt.block_bytes
    if n_bytes >= _INT64_LIMIT:
        raise cur.error(f"{what}: {fmt.name} shape {tuple(shape)} takes "
                        f"{n_bytes} bytes, not below 2**63", n_dims_offset)
    offset_field = cur.pos
    rel = cur.u64(f"the data offset of {what}")
    if rel % alignment:
        raise cur.error(f"{what}: data offset {rel} is not a multiple of the "
                        f"alignment {alignment}", offset_field)
    return _Info(name, t, tuple(shape), n_elements, n_bytes, rel, info_offset,
                 offset_field)


def _tensor_type(cur: _Cursor, raw: int, what: str, offset: int) -> GGMLType:
    if raw >= GGML_TYPE_COUNT:
        raise cur.error(f"{what}: unknown ggml type id {raw} (ggml ids are "
                        f"0..{GGML_TYPE_COUNT - 1})", offset)
    try:
        block_format(raw)
    except UnsupportedTypeError as e:
        raise cur.error(f"{what}: {e}", offset) from None
    return GGMLType(raw)


def _place_tensors(cur: _Cursor, infos: list[_Info], data_offset: int) -> list[GGUFTensor]:
    for info in infos:
        start = data_offset + info.rel_offset
        if start + info.n_bytes > cur.size:
            raise cur.error(
                f"tensor {info.name!r}: data bytes {start}..{start + info.n_bytes} "
                f"lie outside the file ({cur.size} bytes; data section starts at "
                f"{data_offset})", info.offset_field)
    # an empty tensor holds no bytes, so it cannot overlap anything (ggml
    # gives it the offset of the next tensor)
    ordered = sorted((i for i in infos if i.n_bytes), key=lambda i: i.rel_offset)
    for prev, nxt in zip(ordered, ordered[1:]):
        if nxt.rel_offset < prev.rel_offset + prev.n_bytes:
            raise cur.error(
                f"tensor {nxt.name!r}: data at {data_offset + nxt.rel_offset} "
                f"overlaps tensor {prev.name!r} (bytes {data_offset + prev.rel_offset}"
                f"..{data_offset + prev.rel_offset + prev.n_bytes})", nxt.offset_field)
    return [_tensor(cur.buf, i, data_offset) for i in infos]


def _tensor(buf: np.ndarray, info: _Info, data_offset: int) -> GGUFTensor:
    start = data_offset + info.rel_offset
    view = buf[start:start + info.n_bytes]
    view.flags.writeable = False
    return GGUFTensor(info.name, info.type, info.shape, info.n_elements,
                      info.n_bytes, start, view, info.info_offset)


# ---------------------------------------------------------------- split sets

#: A shard's file name as llama.cpp writes it (`llama_split_path`,
#: "%s-%05d-of-%05d.gguf"; gguf-py's `SHARD_NAME_FORMAT` is the same), shard
#: numbers counting from 1. `_shard_of_name` also requires the canonical
#: zero padding, so that a name and the number it encodes map one to one.
SHARD_NAME = re.compile(r"(?P<prefix>.+)-(?P<no>[0-9]{5,})-of-(?P<count>[0-9]{5,})\.gguf\Z")
SPLIT_NO = "split.no"                     # 0-based shard index
SPLIT_COUNT = "split.count"               # number of shards
SPLIT_TENSORS = "split.tensors.count"     # tensors of the whole set
_INT_TYPES = frozenset({_V.UINT8, _V.INT8, _V.UINT16, _V.INT16, _V.UINT32,
                        _V.INT32, _V.UINT64, _V.INT64})


def shard_name(prefix: str, no: int, count: int) -> str:
    """File name of shard `no` (1-based) of `count`: `PREFIX-00001-of-00003.gguf`."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def _shard_of_name(name: str) -> tuple[str, int, int] | None:
    """(prefix, no, count) of a canonical shard file name, else None."""
    m = SHARD_NAME.match(name)
    if m is None:
        return None
    prefix, no, count = m["prefix"], int(m["no"]), int(m["count"])
    if shard_name(prefix, no, count) != name or not 1 <= no <= count:
        return None
    return prefix, no, count


def split_set(path: "str | os.PathLike[str]") -> list[str]:
    """Paths of all shards of the set whose shard `path` is, first to last,
    derived from the name alone (nothing is read). Raises GGUFError when the
    name is not a shard's (`SHARD_NAME`)."""
    path = os.fspath(path)
    head, name = os.path.split(path)
    parsed = _shard_of_name(name)
    if parsed is None:
        raise GGUFError("the file name does not follow gguf-split's "
                        "NAME-00001-of-00003.gguf, so the other shards cannot be found",
                        None, path)
    prefix, _, count = parsed
    return [os.path.join(head, shard_name(prefix, i + 1, count)) for i in range(count)]


def find_model(directory: "str | os.PathLike[str]") -> str:
    """The file to open for the one model in `directory`: a shard of its only
    split set, or its only .gguf file. Raises GGUFError when it holds no
    model or more than one (the names of up to four are given)."""
    directory = os.fspath(directory)
    sets: dict[tuple[str, int], list[str]] = {}
    plain: list[str] = []
    for name in sorted(os.listdir(directory)):
        if not name.lower().endswith(".gguf") or not os.path.isfile(os.path.join(directory, name)):
            continue
        parsed = _shard_of_name(name)
        if parsed is None:
            plain.append(name)
        else:
            sets.setdefault((parsed[0], parsed[2]), []).append(name)
    found = [names[0] for names in sets.values()] + plain
    if len(found) == 1:
        return os.path.join(directory, found[0])
    if not found:
        raise GGUFError("the directory holds no .gguf file", None, directory)
    shown = [f"{p}-*-of-{c:05d}.gguf" for p, c in sets] + plain
    more = ", ..." if len(shown) > 4 else ""
    raise GGUFError(f"the directory holds {len(shown)} models ({', '.join(shown[:4])}{more}); "
                    "give the file (or any shard) of one", None, directory)


def _split_key(f: GGUFFile, key: str) -> int | None:
    """The integer value of split key `key` in `f`, None if absent."""
    if key not in f.metadata:
        return None
    vtype = f.metadata_types[key]
    if vtype not in _INT_TYPES or f.metadata[key] < 0:
        raise GGUFError(f"{key} must be a non-negative integer, the file has "
                        f"{vtype.name} {f.metadata[key]!r}", f.key_offsets.get(key), f.path)
    return int(f.metadata[key])


@dataclass
class GGUFSplit:
    """A gguf-split set opened as one model (see `read_split`).

    `shards`: the GGUFFile of each shard, first to last. `tensors`: every
    shard's tensors, in shard order and then in file order; a tensor's
    `offset` is within its own shard (`shard_of`). `metadata`,
    `metadata_types`, `array_types`, `version` and `alignment` are the first
    shard's, which carries the architecture and the tokenizer. `path` is the
    first shard's path, `file_size` the bytes of all shards together.
    """
    path: str
    shards: list[GGUFFile]
    tensors: list[GGUFTensor] = field(init=False)

    def __post_init__(self):
        self.tensors = [t for f in self.shards for t in f.tensors]
        self._shard = {t.name: f for f in self.shards for t in f.tensors}
        self._by_name = {t.name: t for t in self.tensors}

    first = property(lambda self: self.shards[0])
    metadata = property(lambda self: self.first.metadata)
    metadata_types = property(lambda self: self.first.metadata_types)
    array_types = property(lambda self: self.first.array_types)
    version = property(lambda self: self.first.version)
    alignment = property(lambda self: self.first.alignment)
    file_size = property(lambda self: sum(f.file_size for f in self.shards))
    endian = "<"

    def tensor(self, name: str) -> GGUFTensor:
        """The tensor called `name`; KeyError if there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in the {len(self.shards)} shards of "
                           f"{self.path}") from None

    def shard_of(self, name: str) -> GGUFFile:
        """The shard that holds tensor `name`; KeyError if none does."""
        self.tensor(name)
        return self._shard[name]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


def read_split(path: "str | os.PathLike[str]", shard: GGUFFile | None = None) -> GGUFSplit:
    """Open the gguf-split set that the shard at `path` belongs to.

    The siblings are found by name (`split_set`); `shard` is `path` already
    read, if the caller has it. Every shard is read with `read_file` and the
    set is checked: each file's `split.no` is its 0-based place (the file
    names count from 1), `split.count` is the same in every shard and agrees
    with the names, the first shard's `split.tensors.count` (and any other
    shard's) is the total of tensors, every shard is present, and no tensor
    name occurs in two shards. Anything else raises a one-line GGUFError
    naming the shard and the key.
    """
    path = os.fspath(path)
    given = read_file(path) if shard is None else shard
    paths = split_set(path)
    count = len(paths)
    given_no = _shard_of_name(os.path.basename(path))[1]
    if _split_key(given, SPLIT_COUNT) is None:
        raise GGUFError(f"the file name says shard {given_no} of {count}, but the file "
                        f"has no {SPLIT_COUNT} key (a whole model under a shard's name? "
                        "then rename it)", None, path)
    shards: list[GGUFFile] = []
    for i, p in enumerate(paths):
        if i + 1 == given_no:
            f = given
        elif not os.path.lexists(p):
            raise GGUFError(f"shard {i + 1} of {count} is missing (no such file; "
                            f"the set was opened from {os.path.basename(path)})", None, p)
        else:
            f = read_file(p)
        no, n = _split_key(f, SPLIT_NO), _split_key(f, SPLIT_COUNT)
        if n != count:
            raise GGUFError(f"{SPLIT_COUNT} is {n}, but the file names say {count} shards"
                            if n is not None else f"shard {i + 1} of {count} has no "
                            f"{SPLIT_COUNT} key", f.key_offsets.get(SPLIT_COUNT), p)
        if no != i:
            raise GGUFError(f"{SPLIT_NO} is {no}, expected {i} for shard {i + 1} of {count} "
                            f"({SPLIT_NO} counts from 0, the file names from 1)"
                            if no is not None else f"shard {i + 1} of {count} has no "
                            f"{SPLIT_NO} key", f.key_offsets.get(SPLIT_NO), p)
        shards.append(f)
    total = sum(len(f.tensors) for f in shards)
    for i, f in enumerate(shards):
        want = _split_key(f, SPLIT_TENSORS)
        if want is None and i == 0:
            raise GGUFError(f"the first shard has no {SPLIT_TENSORS} key", None, f.path)
        if want is not None and want != total:
            raise GGUFError(f"{SPLIT_TENSORS} is {want}, but the {count} shards hold "
                            f"{total} tensors", f.key_offsets.get(SPLIT_TENSORS), f.path)
    first_in: dict[str, int] = {}
    for i, f in enumerate(shards):
        for t in f.tensors:
            j = first_in.setdefault(t.name, i)
            if j != i:
                raise GGUFError(f"tensor {t.name!r} is also in shard {j + 1} "
                                f"({os.path.basename(shards[j].path)})", t.info_offset, f.path)
    return GGUFSplit(paths[0], shards)


# ---------------------------------------------------------------- fixtures

def write_gguf(path: "str | os.PathLike[str]", metadata: Mapping[str, Any],
               tensors: Iterable[tuple[str, "GGMLType | int", Sequence[int], Any]],
               *, alignment: int | None = None, split_max_tensors: int = 0,
               split_max_size: int = 0, small_first_shard: bool = False) -> None:
    """Write a little-endian GGUF v3 file with gguf-py's `GGUFWriter`.

    `metadata`: key -> value, or key -> `(GGUFValueType, value)` to fix the
    type, or `(GGUFValueType.ARRAY, list, element_type)`. Untyped values
    follow gguf-py's inference (str -> STRING, bool -> BOOL, int -> INT32,
    float -> FLOAT32, list -> ARRAY). `general.architecture` is always
    written (gguf-py requires it): from `metadata`, else "strata-fixture".
    `tensors`: (name, ggml type, shape in ggml order (ne[0] first), data)
    where data is the raw uint8 bytes of whole blocks (any type, Q2_0
    included) or, for a plain type (F32, F16, BF16, I8..I64, F64), a
    little-endian array of that element size whose bits are written as they
    are; or a callable returning such data, called when the tensor is
    written, in order, so that a writer can stream a model one tensor at a
    time. `alignment`: written as `general.alignment` when given.
    `split_max_tensors` / `split_max_size` (bytes) / `small_first_shard`:
    gguf-py's split options; when they split, the shards are written as
    `PATH-STEM-00001-of-0000N.gguf` beside `path` (`path` itself is not).
    Raises ValueError on inconsistent input (for a callable's data, when it
    is written: the file is then incomplete).
    """
    import gguf   # the official package; imported here, only writers need it

    meta = dict(metadata)
    arch = meta.pop("general.architecture", "strata-fixture")
    if isinstance(arch, tuple) and len(arch) == 2 and arch[0] == GGUFValueType.STRING:
        arch = arch[1]                  # the typed form (STRING, value)
    if not isinstance(arch, str):
        raise TypeError(f"write_gguf: general.architecture must be a str, got {arch!r}")
    w = gguf.GGUFWriter(os.fspath(path), arch=arch, split_max_tensors=split_max_tensors,
                        split_max_size=split_max_size, small_first_shard=small_first_shard)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value in meta.items():
        if isinstance(value, tuple):
            w.add_key_value(key, value[1], value[0], *value[2:])
        else:
            w.add_key_value(key, value, GGUFValueType.get_type(value))
    plan = []
    for name, t, shape, data in tensors:
        t, shape = GGMLType(t), tuple(int(n) for n in shape)
        n_bytes = _tensor_bytes(name, t, shape)
        if not callable(data):          # checked before the file is opened
            data = _raw_bytes(name, t, shape, n_bytes, np.asarray(data))
        # the bytes as int8 with the element shape in NumPy order: gguf-py
        # turns a uint8 shape into element counts through its own type
        # table, which lacks Q2_0
        w.add_tensor_info(name, shape[::-1], np.dtype(np.int8), n_bytes, raw_dtype=t)
        plan.append((name, t, shape, n_bytes, data))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for fout in w.fout:             # as gguf-py's write_tensors_to_file: every shard
            w.write_padding(fout, fout.tell())      # padded to the data section
        for name, t, shape, n_bytes, data in plan:
            if callable(data):
                data = _raw_bytes(name, t, shape, n_bytes, np.asarray(data()))
            w.write_tensor_data(data.view(np.int8))
    finally:
        w.close()


def _tensor_bytes(name: str, t: GGMLType, shape: tuple[int, ...]) -> int:
    fmt = block_format(t)
    n = 1
    for ne in shape:
        n *= ne
    if shape and shape[0] % fmt.block_values:
        raise ValueError(f"tensor {name!r}: ne[0] = {shape[0]} is not a multiple "
                         f"of the {fmt.name} block size {fmt.block_values}")
    return n // fmt.block_values * fmt.block_bytes


def _raw_bytes(name: str, t: GGMLType, shape, n_bytes: int, data: np.ndarray) -> np.ndarray:
    """`data` as the tensor's uint8 bytes (1-D), checked against its type
    and size."""
    fmt = block_format(t)
    if data.dtype != np.uint8:
        if fmt.quantized or data.dtype.itemsize != fmt.block_bytes \
                or data.dtype.byteorder == ">":
            wanted = "raw uint8 bytes" if fmt.quantized else (
                f"raw uint8 bytes or little-endian {fmt.block_bytes}-byte values")
            raise ValueError(f"tensor {name!r}: {fmt.name} data must be {wanted},"
                             f" got {data.dtype}")
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if raw.size != n_bytes:
        raise ValueError(f"tensor {name!r}: {fmt.name} {shape} takes {n_bytes} "
                         f"bytes, got {raw.size}")
    return raw
