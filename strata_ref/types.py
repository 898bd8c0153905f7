"""ggml tensor type ids and block formats, each declared once, as data.

Every block format lists its fields in storage order (name, storage kind,
count). Byte offsets and the block size are derived from that list, and the
declared block size is checked against it at import, the way ggml's
`ggml-common.h` follows each block struct with a `static_assert` on its size.

Sources: ggml-org/ggml `src/ggml-common.h` (block structs) and `include/ggml.h`
(`enum ggml_type`) at commit d99724f2; tables in ../shared/spec/formats.md §3.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "GGMLType", "BlockFormat", "Field", "block_format", "parse_type",
    "REMOVED_TYPE_IDS", "PLAIN_TYPES", "UnsupportedTypeError", "all_formats",
    "GGML_TYPE_COUNT", "Scale", "SCALE_KINDS", "PLAIN_FLOAT_TYPES",
]


class GGMLType(enum.IntEnum):
    """ggml's `enum ggml_type`, every id 0..42 (`GGML_TYPE_COUNT` = 43).

    Ids 4, 5, 31-33 and 36-38 are kept as members so that a file naming them
    can be reported by name, but they have no block format: they were removed
    from the format (see `REMOVED_TYPE_IDS`).
    """
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q4_2 = 4          # removed
    Q4_3 = 5          # removed
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    Q4_0_4_4 = 31     # removed
    Q4_0_4_8 = 32     # removed
    Q4_0_8_8 = 33     # removed
    TQ1_0 = 34
    TQ2_0 = 35
    IQ4_NL_4_4 = 36   # removed
    IQ4_NL_4_8 = 37   # removed
    IQ4_NL_8_8 = 38   # removed
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


GGML_TYPE_COUNT = 43

REMOVED_TYPE_IDS = frozenset({4, 5, 31, 32, 33, 36, 37, 38})

#: Types that are plain arrays, not quantized blocks; `dequantize` returns
#: them in their own dtype (ids 24-28).
PLAIN_TYPES = frozenset({GGMLType.I8, GGMLType.I16, GGMLType.I32,
                         GGMLType.I64, GGMLType.F64})


#: The plain float types (one value per "block"): the oracle converts them,
#: the corpus and the generic kernels cover them.
PLAIN_FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


class UnsupportedTypeError(ValueError):
    """A type id that is unknown, removed, or has no operation here."""


# Storage kinds of a field: the little-endian numpy dtype that holds one
# element. "f16", "bf16", "e8m0" and "ue4m3" are raw bits whose meaning is
# given by strata_ref.numerics.
_KINDS = {
    "u8": np.dtype("u1"), "i8": np.dtype("i1"),
    "u16": np.dtype("<u2"), "i16": np.dtype("<i2"),
    "u32": np.dtype("<u4"), "i32": np.dtype("<i4"),
    "i64": np.dtype("<i8"), "f32": np.dtype("<f4"), "f64": np.dtype("<f8"),
    "f16": np.dtype("<u2"), "bf16": np.dtype("<u2"),
    "e8m0": np.dtype("u1"), "ue4m3": np.dtype("u1"),
}


#: Storage kinds that hold a float: a block's scales (and a plain float
#: type's value).
SCALE_KINDS = frozenset({"f16", "bf16", "f32", "e8m0", "ue4m3"})


@dataclass(frozen=True)
class Scale:
    """One float scale of a block: `name`, its storage `kind` (one of
    SCALE_KINDS) and the `field` that holds it. Mostly the scale is the
    whole field (name == field); IQ1_M's fp16 d is spread over the top
    nibbles of its four u16 `scales` (strata_ref.blocks reads and writes it).
    """
    name: str
    kind: str
    field: str

    @property
    def whole_field(self) -> bool:
        return self.name == self.field


@dataclass(frozen=True)
class Field:
    """One field of a block: `count` elements of storage `kind` at `offset`."""
    name: str
    kind: str
    count: int
    offset: int

    @property
    def dtype(self) -> np.dtype:
        """Little-endian numpy dtype of one element."""
        return _KINDS[self.kind]

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


@dataclass(frozen=True)
class BlockFormat:
    """Layout of one ggml type's block.

    Attributes: `type` (GGMLType), `name` (ggml type name, e.g. "Q4_K"),
    `block_values` (QK, values per block), `block_bytes` (B), `fields`
    (tuple of Field in storage order, offsets derived), `quantized`,
    `scales` (tuple of Scale: every field of a float kind, in storage
    order, unless the format declares them otherwise).
    """
    type: GGMLType
    block_values: int
    block_bytes: int
    fields: tuple[Field, ...]
    quantized: bool = True
    scales: tuple[Scale, ...] = ()
    _by_name: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.type.name

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.block_bytes / self.block_values

    def field(self, name: str) -> Field:
        """The field called `name`; KeyError if the format has none."""
        return self._by_name[name]

    def offset(self, name: str) -> int:
        """Byte offset of field `name` inside the block."""
        return self._by_name[name].offset

    def split(self, blocks: np.ndarray) -> dict[str, np.ndarray]:
        """View a (n, block_bytes) uint8 array as its fields.

        Returns {name: array of shape (n, count)} in each field's
        little-endian storage dtype (raw bits for fp16/bf16/e8m0/ue4m3).
        The arrays are copies only where alignment forces it.
        """
        blocks = np.asarray(blocks, dtype=np.uint8)
        if blocks.ndim != 2 or blocks.shape[1] != self.block_bytes:
            raise ValueError(
                f"{self.name}: expected blocks of shape (n, {self.block_bytes}),"
                f" got {blocks.shape}")
        out = {}
        for f in self.fields:
            raw = np.ascontiguousarray(blocks[:, f.offset:f.offset + f.nbytes])
            out[f.name] = raw.view(f.dtype).reshape(len(blocks), f.count)
        return out


def _fmt(t: GGMLType, qk: int, nbytes: int, *fields: tuple[str, str, int],
         quantized: bool = True, scales: tuple[Scale, ...] | None = None) -> BlockFormat:
    laid, off = [], 0
    for name, kind, count in fields:
        laid.append(Field(name, kind, count, off))
        off += count * _KINDS[kind].itemsize
    if off != nbytes:   # the static_assert of ggml-common.h
        raise AssertionError(f"{t.name}: fields add up to {off} bytes, "
                             f"the format says {nbytes}")
    if scales is None:
        scales = tuple(Scale(f.name, f.kind, f.name) for f in laid if f.kind in SCALE_KINDS)
    fmt = BlockFormat(t, qk, nbytes, tuple(laid), quantized, scales)
    fmt._by_name.update({f.name: f for f in laid})
    return fmt


T = GGMLType
_FORMATS: dict[GGMLType, BlockFormat] = {f.type: f for f in (
    # plain element types (one value per "block")
    _fmt(T.F32, 1, 4, ("v", "f32", 1), quantized=False),
    _fmt(T.F16, 1, 2, ("v", "f16", 1), quantized=False),
    _fmt(T.BF16, 1, 2, ("v", "bf16", 1), quantized=False),
    _fmt(T.I8, 1, 1, ("v", "i8", 1), quantized=False),
    _fmt(T.I16, 1, 2, ("v", "i16", 1), quantized=False),
    _fmt(T.I32, 1, 4, ("v", "i32", 1), quantized=False),
    _fmt(T.I64, 1, 8, ("v", "i64", 1), quantized=False),
    _fmt(T.F64, 1, 8, ("v", "f64", 1), quantized=False),
    # legacy 32-value blocks
    _fmt(T.Q4_0, 32, 18, ("d", "f16", 1), ("qs", "u8", 16)),
    _fmt(T.Q4_1, 32, 20, ("d", "f16", 1), ("m", "f16", 1), ("qs", "u8", 16)),
    _fmt(T.Q5_0, 32, 22, ("d", "f16", 1), ("qh", "u32", 1), ("qs", "u8", 16)),
    _fmt(T.Q5_1, 32, 24, ("d", "f16", 1), ("m", "f16", 1), ("qh", "u32", 1),
         ("qs", "u8", 16)),
    _fmt(T.Q8_0, 32, 34, ("d", "f16", 1), ("qs", "i8", 32)),
    _fmt(T.Q8_1, 32, 36, ("d", "f16", 1), ("s", "f16", 1), ("qs", "i8", 32)),
    # K-quants, 256-value super-blocks
    _fmt(T.Q2_K, 256, 84, ("scales", "u8", 16), ("qs", "u8", 64),
         ("d", "f16", 1), ("dmin", "f16", 1)),
    _fmt(T.Q3_K, 256, 110, ("hmask", "u8", 32), ("qs", "u8", 64),
         ("scales", "u8", 12), ("d", "f16", 1)),
    _fmt(T.Q4_K, 256, 144, ("d", "f16", 1), ("dmin", "f16", 1),
         ("scales", "u8", 12), ("qs", "u8", 128)),
    _fmt(T.Q5_K, 256, 176, ("d", "f16", 1), ("dmin", "f16", 1),
         ("scales", "u8", 12), ("qh", "u8", 32), ("qs", "u8", 128)),
    _fmt(T.Q6_K, 256, 210, ("ql", "u8", 128), ("qh", "u8", 64),
         ("scales", "i8", 16), ("d", "f16", 1)),
    _fmt(T.Q8_K, 256, 292, ("d", "f32", 1), ("qs", "i8", 256),
         ("bsums", "i16", 16)),
    # I-quants
    _fmt(T.IQ2_XXS, 256, 66, ("d", "f16", 1), ("qs", "u16", 32)),
    _fmt(T.IQ2_XS, 256, 74, ("d", "f16", 1), ("qs", "u16", 32),
         ("scales", "u8", 8)),
    _fmt(T.IQ3_XXS, 256, 98, ("d", "f16", 1), ("qs", "u8", 64),
         ("scales_and_signs", "u32", 8)),
    _fmt(T.IQ1_S, 256, 50, ("d", "f16", 1), ("qs", "u8", 32), ("qh", "u16", 8)),
    _fmt(T.IQ4_NL, 32, 18, ("d", "f16", 1), ("qs", "u8", 16)),
    _fmt(T.IQ3_S, 256, 110, ("d", "f16", 1), ("qs", "u8", 64), ("qh", "u8", 8),
         ("signs", "u8", 32), ("scales", "u8", 4)),
    _fmt(T.IQ2_S, 256, 82, ("d", "f16", 1), ("qs", "u8", 32), ("signs", "u8", 32),
         ("qh", "u8", 8), ("scales", "u8", 8)),
    _fmt(T.IQ4_XS, 256, 136, ("d", "f16", 1), ("scales_h", "u16", 1),
         ("scales_l", "u8", 4), ("qs", "u8", 128)),
    _fmt(T.IQ1_M, 256, 56, ("qs", "u8", 32), ("qh", "u8", 16),
         ("scales", "u16", 4), scales=(Scale("d", "f16", "scales"),)),
    # ternary
    _fmt(T.TQ1_0, 256, 54, ("qs", "u8", 48), ("qh", "u8", 4), ("d", "f16", 1)),
    _fmt(T.TQ2_0, 256, 66, ("qs", "u8", 64), ("d", "f16", 1)),
    # FP4
    _fmt(T.MXFP4, 32, 17, ("e", "e8m0", 1), ("qs", "u8", 16)),
    _fmt(T.NVFP4, 64, 36, ("d", "ue4m3", 4), ("qs", "u8", 32)),
    # low-bit
    _fmt(T.Q1_0, 128, 18, ("d", "f16", 1), ("qs", "u8", 16)),
    _fmt(T.Q2_0, 64, 18, ("d", "f16", 1), ("qs", "u8", 16)),
)}
del T


def parse_type(t: "GGMLType | int | str") -> GGMLType:
    """Turn an id, a ggml type name ("Q4_K", case-insensitive), an id
    written in decimal ("12") or a GGMLType into a GGMLType. Raises
    UnsupportedTypeError naming the bad value."""
    if isinstance(t, GGMLType):
        return t
    if isinstance(t, str):
        s = t.strip()
        if s.isascii() and s.isdigit():
            return parse_type(int(s))
        try:
            return GGMLType[s.upper()]
        except KeyError:
            raise UnsupportedTypeError(
                f"unknown ggml type name {t!r} (names such as Q4_K, or ids "
                f"0..{GGML_TYPE_COUNT - 1})") from None
    if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
        try:
            return GGMLType(int(t))
        except ValueError:
            raise UnsupportedTypeError(
                f"unknown ggml type id {int(t)} (ggml ids are 0..{GGML_TYPE_COUNT - 1})"
            ) from None
    raise UnsupportedTypeError(f"not a ggml type: {t!r}")


def block_format(t: "GGMLType | int | str") -> BlockFormat:
    """The BlockFormat of type `t` (id, name or GGMLType).

    Raises UnsupportedTypeError for unknown ids and for the removed ids
    4, 5, 31-33 and 36-38 (Q4_2, Q4_3, the Q4_0_x_y and IQ4_NL_x_y repacks).
    """
    tt = parse_type(t)
    if tt.value in REMOVED_TYPE_IDS:
        raise UnsupportedTypeError(
            f"ggml type {tt.name} (id {tt.value}) was removed from the GGUF "
            "format and has no block layout")
    return _FORMATS[tt]


def all_formats() -> list[BlockFormat]:
    """Every BlockFormat, in type-id order."""
    return [_FORMATS[t] for t in sorted(_FORMATS)]
