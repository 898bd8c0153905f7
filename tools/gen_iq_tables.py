"""Generate strata_ref/formats/_iq_tables_data.py from ggml's `ggml-common.h`.

The I-quant lookup tables (grids, sign bytes, IQ4_NL values) are defined in
ggml's `ggml-common.h` as C initialisers between `GGML_TABLE_BEGIN(type,
name, size)` and `GGML_TABLE_END()`. This tool reads those initialisers from
a header file given on the command line, checks each table's length and
element range against its declared C type, and writes them as a Python data
module, together with the header's sha256 and the source named by `--source`.

The header itself is not part of the repository; fetch the file at the
commit you want to pin, then run, from the repository root:

    python tools/gen_iq_tables.py path/to/ggml-common.h \
        --source "ggml-org/llama.cpp ggml/src/ggml-common.h @ <commit>"

`strata_ref.formats.iq_tables` turns the generated tuples into numpy arrays;
tests/test_iq_tables.py checks them entry by entry against the official
`gguf` package's copies.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

#: name -> C element type of every table the I-quants need, in output order.
TABLES: dict[str, str] = {
    "kmask_iq2xs": "uint8_t",
    "ksigns_iq2xs": "uint8_t",
    "iq2xxs_grid": "uint64_t",
    "iq2xs_grid": "uint64_t",
    "iq2s_grid": "uint64_t",
    "iq3xxs_grid": "uint32_t",
    "iq3s_grid": "uint32_t",
    "iq1s_grid": "uint64_t",
    "iq1s_grid_gpu": "uint32_t",
    "kvalues_iq4nl": "int8_t",
}

#: inclusive value range of each C element type.
_RANGES = {
    "uint8_t": (0, 2**8 - 1), "int8_t": (-2**7, 2**7 - 1),
    "uint16_t": (0, 2**16 - 1), "uint32_t": (0, 2**32 - 1),
    "uint64_t": (0, 2**64 - 1),
}

_TABLE_RE = re.compile(
    r"GGML_TABLE_BEGIN\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)(.*?)GGML_TABLE_END\(\)",
    re.S)
_DEFINE_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+(\d+)[ \t]*$", re.M)
_NUMBER_RE = re.compile(r"^[+-]?(0[xX][0-9a-fA-F]+|\d+)[uUlL]*$")


class HeaderError(ValueError):
    """The header lacks a table, or a table does not match its declaration."""


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _parse_number(tok: str, table: str) -> int:
    if not _NUMBER_RE.match(tok):
        raise HeaderError(f"{table}: not an integer literal: {tok!r}")
    return int(tok.rstrip("uUlL"), 0)


def parse_tables(text: str, names=None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The `GGML_TABLE_BEGIN ... GGML_TABLE_END` tables of a header.

    text: the header's source; names: the table names to read (all when
    None; others are skipped unread). Returns {name: (C element type, values)}.
    A size given by a macro (`NGRID_IQ1S`) is resolved through the header's
    numeric `#define`s. Raises HeaderError when a table's entry count differs
    from its declared size, a value lies outside its C type, a size macro is
    unknown, or one name is defined twice with different contents.
    """
    text = _strip_comments(text)
    defines = {m.group(1): int(m.group(2)) for m in _DEFINE_RE.finditer(text)}
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for m in _TABLE_RE.finditer(text):
        ctype, name, size_tok, body = m.groups()
        if names is not None and name not in names:
            continue
        if size_tok.isdigit():
            size = int(size_tok)
        elif size_tok in defines:
            size = defines[size_tok]
        else:
            raise HeaderError(f"{name}: unknown size macro {size_tok!r}")
        toks = [t.strip() for t in body.split(",")]
        if toks and toks[-1] == "":
            toks.pop()              # C allows a trailing comma
        values = tuple(_parse_number(t, name) for t in toks)
        if len(values) != size:
            raise HeaderError(f"{name}: {len(values)} entries, declared {size}")
        if ctype in _RANGES:
            lo, hi = _RANGES[ctype]
            bad = [v for v in values if not lo <= v <= hi]
            if bad:
                raise HeaderError(f"{name}: value {bad[0]} outside {ctype}")
        if name in out and out[name] != (ctype, values):
            raise HeaderError(f"{name}: defined twice with different contents")
        out[name] = (ctype, values)
    return out


def select_tables(tables: dict, names=TABLES) -> dict[str, tuple[int, ...]]:
    """The I-quant tables out of `parse_tables`' result, type-checked.

    Raises HeaderError naming a table that is missing or has another C type.
    """
    out = {}
    for name, ctype in names.items():
        if name not in tables:
            raise HeaderError(f"table {name} not found in the header")
        got_type, values = tables[name]
        if got_type != ctype:
            raise HeaderError(f"{name}: C type {got_type}, expected {ctype}")
        out[name] = values
    return out


def _format_values(values: tuple[int, ...], ctype: str) -> str:
    if ctype == "uint64_t":
        items, per_line = [f"0x{v:016x}" for v in values], 4
    elif ctype == "uint32_t":
        items, per_line = [f"0x{v:08x}" for v in values], 8
    else:
        items, per_line = [str(v) for v in values], 16
    lines = [", ".join(items[i:i + per_line]) + ","
             for i in range(0, len(items), per_line)]
    return "\n".join("    " + ln for ln in lines)


def render_module(tables: dict[str, tuple[int, ...]], source: str,
                  sha256: str) -> str:
    """Python source of the data module for the selected tables."""
    parts = [
        '"""I-quant lookup tables of ggml, generated by tools/gen_iq_tables.py.',
        "",
        "Do not edit: regenerate from the header named below. Each table is a",
        "tuple of the C initialiser's integers in their order; element types in",
        "TABLE_TYPES. Values are facts carried over from the source, which is",
        "ggml's (MIT licence).",
        '"""',
        "",
        f"SOURCE = {source!r}",
        f"SOURCE_SHA256 = {sha256!r}",
        "",
        "TABLE_TYPES = {",
    ]
    parts += [f"    {n!r}: {TABLES[n]!r}," for n in tables]
    parts += ["}", ""]
    for name, values in tables.items():
        parts += [f"{name} = (", _format_values(values, TABLES[name]), ")", ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("header", type=Path, help="path of a ggml-common.h file")
    ap.add_argument("--source", required=True,
                    help="what the header is: repository, path and commit")
    ap.add_argument("-o", "--output", type=Path,
                    default=Path("strata_ref/formats/_iq_tables_data.py"))
    args = ap.parse_args(argv)
    raw = args.header.read_bytes()
    try:
        tables = select_tables(parse_tables(raw.decode("utf-8"), TABLES))
    except HeaderError as e:
        print(f"error: {args.header}: {e}", file=sys.stderr)
        return 1
    sha = hashlib.sha256(raw).hexdigest()
    args.output.write_text(render_module(tables, args.source, sha))
    print(f"wrote {args.output}: {len(tables)} tables from {args.source} "
          f"(sha256 {sha[:16]}...); delete strata_ref/formats/__pycache__ so "
          "that numba's cache does not keep the old tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
