"""`strata-ref info`, `models`, `compare` and `dequant`: what a file holds,
the model registry, another engine's dump against the oracle, the
oracle's rows to a file."""
from __future__ import annotations

import os
import sys

from .._text import count, printable
from .._npio import atomic_output
from .common import Help, decimal, err, out_problem


def _moe_summary(f) -> str:
    """One line on a mixture-of-experts file (empty for others): the
    `<arch>.expert_count`, `expert_used_count` and expert FFN sizes, and how
    many tensors are 3-D (the `*_exps` tensors, one matrix per expert)."""
    md = f.metadata
    arch = md.get("general.architecture")
    if not isinstance(arch, str) or f"{arch}.expert_count" not in md:
        return ""

    def val(key):
        v = md.get(f"{arch}.{key}")
        if v is None:
            return None
        v = v.item() if hasattr(v, "item") and getattr(v, "ndim", 0) == 0 else v
        return printable(repr(v)[:40], backslash=False)
    parts = [f"experts: {val('expert_count')}"]
    if val("expert_used_count") is not None:
        parts[0] += f", {val('expert_used_count')} used per token"
    for key, what in (("expert_feed_forward_length", "expert FFN"),
                      ("expert_shared_feed_forward_length", "shared expert FFN")):
        if val(key) is not None:
            parts.append(f"{what} {val(key)}")
    n3 = sum(1 for t in f.tensors if len(t.shape) == 3)
    parts.append(f"{n3} 3-D expert tensors")
    return "; ".join(parts)


#: characters of a metadata value `info` shows on its line
INFO_VALUE_CHARS = 150


def _print_key(f, key: str, where) -> int:
    """`info MODEL --key KEY`: the one value, whole. A string as its text,
    line by line, each line escaped (a control character as \\xNN, so
    that the file cannot drive the terminal); an array one value per line
    (strings escaped as names are); a number as Python writes it."""
    if key not in f.metadata:
        return err(f"no metadata key '{key}' in {where} (it has {count(len(f.metadata), 'key')}; "
                    f"`strata-ref info {where}` lists them)")
    v = f.metadata[key]
    v = v.item() if hasattr(v, "item") and getattr(v, "ndim", 0) == 0 else v
    if isinstance(v, str):
        print("\n".join(printable(line, backslash=False) for line in v.split("\n")))
    elif hasattr(v, "__len__"):
        for x in v:
            x = x.item() if hasattr(x, "item") else x
            print(printable(x) if isinstance(x, str) else printable(repr(x), backslash=False))
    else:
        print(printable(repr(v), backslash=False))
    return 0


def cmd_info(a) -> int:
    from collections import Counter

    from ..gguf import read
    from ..models import resolve

    f = read(resolve(a.file))
    if a.key is not None:
        return _print_key(f, a.key, a.file)
    if a.tensors:
        return _info_tensors(f)
    print(f"file: {printable(f.path)}\nGGUF version {f.version}, alignment {f.alignment}, "
          f"{count(len(f.metadata), 'metadata key')}, {count(len(f.tensors), 'tensor')}")
    if len(f.shards) > 1:
        print(f"split set of {len(f.shards)} shards (metadata from the first):")
        for k, s in enumerate(f.shards):
            print(f"  {k + 1:>5}  {printable(os.path.basename(s.path))}  {count(len(s.tensors), 'tensor')}, "
                  f"{s.file_size / 1e6:.2f} MB")
    def show(v):
        # one value as printed: a string quoted and escaped as names are (a
        # newline as \x0a, a byte that was not UTF-8 as \xNN), a number
        # as Python writes it
        v = v.item() if hasattr(v, "item") and getattr(v, "ndim", 0) == 0 else v
        if isinstance(v, str):
            return "'" + printable(v[:INFO_VALUE_CHARS + 1]) + "'"
        return printable(repr(v), backslash=False)
    for k, v in f.metadata.items():
        cut = False
        if hasattr(v, "__len__") and not isinstance(v, str):
            cut = len(v) > 8
            shown = v[:4] if cut else v
            s = (f"[{len(v)} values] " if cut else "") + "[" + ", ".join(show(x) for x in shown)
            s += ", ...]" if cut else "]"
        else:
            s = show(v)
        if len(s) > INFO_VALUE_CHARS:
            # one line: '…' where it is cut, and the way to see all of it
            s = s[:INFO_VALUE_CHARS] + ("…'" if s.startswith("'") else "…")
            cut = True
        if cut:
            s += " (cut; --key prints it whole)"
        # the key is escaped too (and cut: a damaged file can have a key of
        # megabytes)
        key = printable(k if len(k) <= 200 else k[:150] + "…" + k[-20:])
        print(f"  {key} = {s}")
    moe = _moe_summary(f)
    if moe:
        print(moe)
    cnt, nbytes, nvals = Counter(), Counter(), Counter()
    for t in f.tensors:
        cnt[t.type.name] += 1
        nbytes[t.type.name] += t.n_bytes
        nvals[t.type.name] += t.n_elements
    print(f"{'type':<8} {'tensors':>7} {'MB':>10} {'M values':>10}")
    for k in sorted(cnt, key=lambda k: -nbytes[k]):
        print(f"{k:<8} {cnt[k]:>7} {nbytes[k] / 1e6:>10.2f} {nvals[k] / 1e6:>10.2f}")
    return 0


def _info_tensors(f) -> int:
    """`info --tensors`: one line per tensor in file order (shard order for a
    split set): index, name, type, ggml shape, absolute byte offset, bytes."""
    split = len(f.shards) > 1
    rows = [(k, t) for k, s in enumerate(f.shards) for t in s.tensors]
    names = [printable(t.name) for _, t in rows]
    w = max([len(n) for n in names] + [4])
    print(f"{'#':>5}  {'name':<{w}}  {'type':<8} {'shape':<20} {'offset':>14} {'bytes':>12}"
          + ("  shard" if split else ""))
    for i, ((k, t), name) in enumerate(zip(rows, names)):
        print(f"{i:>5}  {name:<{w}}  {t.type.name:<8} {'x'.join(map(str, t.shape)):<20} {t.offset:>14} "
              f"{t.n_bytes:>12}" + (f"  {k + 1}" if split else ""))
    return 0


def cmd_models(a) -> int:
    from ..models import REGISTRY, cache_dir, cached_path, fetch

    if a.action == "list":
        if a.name:
            return err("models list takes no NAME")
        print(f"cache: {cache_dir()}")
        for m in REGISTRY.values():
            hit = cached_path(m)
            if hit:
                state = f"cached at {hit}"
            elif (cache_dir() / "models" / f"{m.name}.gguf").is_file():
                state = "cached copy fails its sha256; `models fetch` replaces it"
            else:
                state = "not fetched"
            print(f"{m.name:<30} {m.architecture:<6} {m.size / 1e6:7.1f} MB  {m.note}; aliases: "
                  f"{', '.join(m.aliases)}  [{state}]")
        return 0
    if not a.name:
        return err("models fetch needs a NAME")
    print(fetch(a.name))
    return 0


def cmd_compare(a) -> int:
    if a.worst < 0:
        return err(f"--worst must be >= 0, got {a.worst}")
    if a.dump is not None and os.path.isfile(a.dump):
        with open(a.dump, "rb") as f:
            head = f.read(6)
        if head == b"\x93NUMPY" or head[:4] == b"PK\x03\x04":
            return err(f"the dump {a.dump} is a {'.npy' if head[0] == 0x93 else '.npz'} file; compare takes "
                       f"raw little-endian values (numpy: array.tofile(PATH); `dequant --out X.bin` writes one)")
    return run_compare(a.file, a.tensor, a.dump, a.dtype, a.row0, a.rows, a.ld, a.hash,
                       n_worst=a.worst, max_ulp=a.max_ulp)


def cmd_dequant(a) -> int:
    import numpy as np

    from ..hashing import hash_array
    from ..probe import dequant_rows
    npy = a.out.endswith(".npy")
    bad = out_problem(a.out, "--out", "npy" if npy else "raw", "rows.npy", inputs=(a.model,))
    if bad:
        return err(bad)
    y = dequant_rows(a.model, a.tensor, a.dtype, a.row0, a.rows)
    bits = y.view({"f32": np.uint32, "f16": np.uint16, "bf16": np.uint16}[a.dtype])
    with atomic_output(a.out) as f:
        if npy:
            np.save(f, y if a.dtype != "bf16" else bits, allow_pickle=False)
        else:
            f.write(np.ascontiguousarray(bits).astype(bits.dtype.newbyteorder("<")).tobytes())
    print(f"{printable(a.out)}: {printable(a.tensor)} rows [{a.row0}, {a.row0 + y.shape[0]}) x {y.shape[1]}, "
          f"{a.dtype}{' (uint16 bits)' if a.dtype == 'bf16' and a.out.endswith('.npy') else ''}, "
          f"{bits.nbytes} bytes, fnv1a64 {hash_array(y):016x}")
    return 0


def run_compare(file, tensor, dump, dtype="f32", row0=0, rows=None, ld=None, hash_hex=None,
                out=None, n_worst: int = 5, max_ulp: int | None = None) -> int:
    """`strata-ref compare`: print the report of `compare_dump`; exit status
    0 only when the bits are equal (or, with max_ulp K, every differing
    pair is a number pair within K ulps: an opt-in tolerance), 1 when they
    differ, 2 on bad input. n_worst: how many of the largest ulp distances
    to list."""
    from .. import golden
    from ..models import ModelError
    if max_ulp is not None and (max_ulp < 0 or hash_hex is not None):
        print("strata-ref: error: " + ("--max-ulp must be >= 0" if max_ulp < 0 else
              "--max-ulp needs a dump (a hash has no ulps)"), file=sys.stderr)
        return 2
    try:
        rep = golden.compare_dump(file, tensor, dump, dtype, row0, rows, ld, hash_hex, n_worst=n_worst)
    except (ValueError, OSError, ModelError) as e:
        print(f"strata-ref: error: {printable(str(e), backslash=False)}", file=sys.stderr)
        return 2
    out = out or sys.stdout
    print(f"{printable(rep['file'])} {printable(rep['tensor'])} ({rep['type']}) rows [{rep['row0']}, "
          f"{rep['row0'] + rep['rows']}) x {rep['cols']} cols, {rep['dtype']}, ld {rep['ld']}", file=out)
    print(f"  fnv oracle {rep['fnv_oracle']}  {'--hash' if hash_hex is not None else 'dump'} {rep['fnv_dump']}",
          file=out)
    if rep["n_diff"] is not None:
        # max ulp is over pairs of differing numbers: 0 when the bits are
        # equal, none to measure when every difference is a NaN against a number
        ulp = (rep["max_ulp"] if rep["max_ulp"] is not None else
               0 if rep["n_diff"] == 0 else "- (no pair of differing numbers)")
        print(f"  values {rep['n_values']}, differing {rep['n_diff']}, NaN vs number "
              f"{rep['nan_vs_number']}, max ulp {ulp}, NaN encodings differing "
              f"(counted equal) {rep['nan_encoding_diffs']}", file=out)
        fd = rep["first_diff"]
        if fd:
            print(f"  first difference at index {fd['index']} (row {fd['row']}, col {fd['col']}): "
                  f"oracle {fd['oracle']!r} [{fd['oracle_bits']}], dump {fd['dump']!r} "
                  f"[{fd['dump_bits']}]", file=out)
    if rep["worst"]:
        print(f"  worst {len(rep['worst'])} (ulps, row, block/offset in the {rep['type']} block, oracle vs dump):",
              file=out)
        for w in rep["worst"]:
            print(f"    {w['ulps']:>10} ulp  row {w['row']} col {w['col']} (block {w['block']}, offset "
                  f"{w['offset']})  {w['oracle']!r} vs {w['dump']!r}", file=out)
    if not rep["equal"] and rep.get("also_fits") and (rep["n_diff"] is None or 2 * rep["n_diff"] > rep["n_values"]):
        # a dump of another dtype or row count can have the size of this one;
        # read as the wrong dtype it differs nearly everywhere: the hint
        # then, not for a few differing values
        alt = " or ".join(f"--dtype {a['dtype']} --rows {a['rows']}" for a in rep["also_fits"])
        print(f"  note: the dump's size also fits {alt}; is --dtype right?", file=out)
    if rep["equal"]:
        print("  EQUAL", file=out)
        return 0
    # an infinity against a finite number (or -inf against +inf) is never
    # within K ulps, however far apart their bit patterns count
    within = (max_ulp is not None and rep["nan_vs_number"] == 0 and not rep.get("inf_vs_finite")
              and (rep["max_ulp"] is None or rep["max_ulp"] <= max_ulp))
    if within:
        print(f"  WITHIN --max-ulp {max_ulp} (not bitwise: {rep['n_diff']} values differ, max "
              f"{rep['max_ulp']} ulp)", file=out)
        return 0
    print("  DIFFERENT" + (f" (beyond --max-ulp {max_ulp}" + (f"; {rep['inf_vs_finite']} infinities against "
                                                                   f"other values)" if rep.get("inf_vs_finite")
                                                                   else ")")
                            if max_ulp is not None else ""), file=out)
    return 1


def add_info(sub) -> None:
    i = sub.add_parser("info", help="metadata and a per-type tensor summary",
                       description="The metadata of a GGUF model (values longer than a line "
                                   "are cut, ending in '…'; --key prints one whole), the expert "
                                   "counts of an MoE file, and a per-type tensor summary.")
    i.add_argument("file", metavar="MODEL",
                   help="a .gguf file (any shard of a split set), a directory holding one model, "
                        "or a registry model name or alias")
    i.add_argument("--key", default=None, metavar="KEY",
                   help="print only this metadata key's value, whole: a string as its text (its "
                        "lines as lines, other control characters escaped), an array one value "
                        "per line")
    i.add_argument("--tensors", action="store_true",
                   help="list every tensor instead: name, type, ggml shape, byte offset in the file, bytes")
    i.set_defaults(func=cmd_info)


def add_models(sub) -> None:
    m = sub.add_parser("models", help="the registry of real GGUF models")
    m.add_argument("action", choices=["list", "fetch"],
                   help="list: the registry and what is cached; fetch: download one model")
    m.add_argument("name", nargs="?", metavar="NAME", help="fetch: the model name or alias")
    m.set_defaults(func=cmd_models)


def add_compare(sub) -> None:
    c = sub.add_parser(
        "compare", help="compare another engine's raw output dump with the oracle",
        description="Compare rows [ROW0, ROW0 + ROWS) of one tensor, dequantized by "
                    "another engine, with the oracle's output, bit for bit (any NaN "
                    "equals any NaN). Exit 0 when equal, 1 when different, 2 on bad input.",
        formatter_class=Help)
    c.add_argument("file", metavar="MODEL", help="GGUF file, or a cached registry model")
    c.add_argument("tensor", metavar="TENSOR", help="tensor name, as `strata-ref hash` lists it")
    c.add_argument("dump", metavar="DUMP", nargs="?", default=None,
                   help="raw little-endian file of --dtype values, row r at value r*LD; it "
                        "must hold exactly ROWS rows: ROWS*LD or (ROWS-1)*LD+cols values")
    c.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32",
                   help="value type of the dump")
    c.add_argument("--row0", type=decimal, default=0, metavar="R",
                   help="first tensor row the dump holds")
    c.add_argument("--rows", type=decimal, default=None, metavar="N",
                   help="rows the dump holds (default: every row from R to the end)")
    c.add_argument("--ld", type=decimal, default=None, metavar="L",
                   help="values from one dump row to the next (default: the tensor's row length)")
    c.add_argument("--hash", default=None, metavar="HEX",
                   help="compare against this FNV-1a 64 (hex) of the rows instead of a dump")
    c.add_argument("--worst", type=decimal, default=5, metavar="N",
                   help="list the N largest ulp distances with row, block and offset in the block")
    c.add_argument("--max-ulp", type=decimal, default=None, metavar="K",
                   help="an opt-in tolerance: exit 0 also when every differing value is a number within "
                        "K ulps (the report still says it is not bitwise)")
    c.set_defaults(func=cmd_compare)


def add_dequant(sub) -> None:
    dq = sub.add_parser("dequant", help="the oracle's output of a tensor's rows, to a file",
                        formatter_class=Help)
    dq.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    dq.add_argument("tensor", metavar="TENSOR", help="tensor name (`info --tensors` lists them)")
    dq.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32", help="output value type")
    dq.add_argument("--row0", type=decimal, default=0, metavar="R", help="first row")
    dq.add_argument("--rows", type=decimal, default=None, metavar="N", help="rows (default: to the end)")
    dq.add_argument("--out", required=True, metavar="FILE",
                    help="raw little-endian values, or .npy (bf16 as uint16 bits)")
    dq.set_defaults(func=cmd_dequant)
