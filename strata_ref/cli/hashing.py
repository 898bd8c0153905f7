"""`strata-ref hash`: every tensor's dequantized output hashed (FNV-1a 64),
by the oracle's worker processes or the native CUDA kernels."""
from __future__ import annotations

import json
import os
import signal
import sys

from .._text import count, printable
from .common import decimal, err, list_problem, patterns_problem, split_list


class _Terminated(Exception):
    """SIGTERM arrived during `hash`."""


def _raise_terminated(signum, frame):
    raise _Terminated()


def cmd_hash(a) -> int:
    from .._progress import progress_bar
    from ..gguf import read
    from ..hashing import HASH_DTYPES, hash_model
    from ..models import resolve
    from ..tasks import cpu_count
    from ..types import parse_type

    no_dtype = f"--out: unknown or no dtype ({a.out!r}); choose from f32,f16,bf16"
    bad = (list_problem(a.out, "--out", no_dtype)
           or list_problem(a.types, "--types", f"--types {a.types!r} names no type")
           or patterns_problem(a.tensors))
    if bad:
        return err(bad)
    outs = list(dict.fromkeys(o.lower() for o in split_list(a.out)))
    if any(o not in HASH_DTYPES for o in outs):
        return err(no_dtype)
    if a.device != "cuda" and (a.kernel or a.compare):
        return err("--kernel and --compare need --device cuda")
    if a.device == "cuda" and (a.jobs or a.scheduler or a.manifest):
        return err("--jobs, --scheduler and --manifest run the oracle's tasks; "
                    "--device cuda hashes in this process")
    if a.jobs is not None and a.jobs < 1:
        return err(f"--jobs must be >= 1, got {a.jobs}")
    if a.resume and not a.manifest:
        return err("--resume needs --manifest FILE (the manifest to resume from)")
    types = None if a.types is None else {parse_type(t) for t in split_list(a.types)}
    if a.device == "cuda":
        # before the model is fetched or read: a machine without a GPU
        # says so at once
        from ..native import unavailable_reason
        from ..native.loader import unavailable_line
        why = unavailable_reason()
        if why:
            print(unavailable_line("hash --device cuda", why), file=sys.stderr)
            return 2
    path = resolve(a.model)
    f = read(path)
    select = None if a.tensors is None else _name_filter(a.tensors)
    bad = _selection_problem(f, path.name, a.tensors, types)
    if bad:
        return err(bad)
    tensors = [t for t in f.tensors if (types is None or t.type in types) and (select is None or select(t.name))]
    if a.device == "cuda":
        return _hash_device(a, f, tensors, outs)
    total = sum(t.n_bytes for t in tensors)
    # SIGTERM (a CI cancel, `timeout`) unwinds like Ctrl-C, so that worker
    # processes are stopped and the manifest is closed on the way out
    import threading
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        with progress_bar(total, "hash", "B", enabled=not (a.no_progress or a.json),
                          unit_scale=True) as bar:
            res = hash_model(f, outs, types=types, select=select, jobs=a.jobs or cpu_count(),
                             scheduler=a.scheduler, manifest=a.manifest, resume=a.resume,
                             progress=bar.update)
    except _Terminated:
        return 128 + signal.SIGTERM
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)
    if res.resumed:
        print(f"strata-ref: note: {res.resumed} of {len(res.tensors)} tensors taken from "
              f"{a.manifest}", file=sys.stderr)
    rows = [{"name": t.name, "type": t.type.name, "shape": list(t.shape),
             "hash": {d: f"{t.hashes[d]:016x}" for d in outs}} for t in res.tensors]
    chained = {d: f"{res.chained[d]:016x}" for d in outs}
    _print_hashes(f, rows, chained, outs, a.json)
    return 0


def _name_filter(patterns: str):
    """A predicate on tensor names from comma-separated fnmatch patterns
    (checked by `patterns_problem`)."""
    import fnmatch
    pats = split_list(patterns)
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in pats)


def _selection_problem(model, file_name: str, patterns, types) -> str | None:
    """Why `--tensors PATTERNS` (None: not given) and `--types` (a set of
    GGMLType, None: not given) select no tensor of `model`, as one line, or
    None: a pattern that matches no tensor, a type the file has no tensor
    of (the line names those it holds), or the two together leaving none."""
    if patterns is not None:
        idle = [p for p in split_list(patterns) if not any(_name_filter(p)(t.name) for t in model.tensors)]
        if idle:
            return f"--tensors: pattern {idle[0]!r} matches no tensor of {file_name}"
    if types is None:
        return None
    asked = ",".join(sorted(t.name for t in types))
    held = dict.fromkeys(t.type for t in model.tensors)
    idle = sorted(t.name for t in types if t not in held)
    if idle:
        # each type must select something, as each --tensors pattern must
        return (f"--types {','.join(idle)} matches no tensor of {file_name}, which holds "
                f"{', '.join(t.name for t in held) or 'no tensor'}")
    keep = _name_filter(patterns) if patterns is not None else None
    if keep is not None and not any(t.type in types and keep(t.name) for t in model.tensors):
        return f"--types {asked} and --tensors {patterns!r} together match no tensor of {file_name}"
    return None


def _print_hashes(model, rows: list, chained: dict, outs: list, as_json: bool,
                  extra: dict | None = None) -> None:
    """The output of `hash`: JSON (with `extra`'s keys added) or the table,
    for a split set a line naming its shards, and the chained line; the
    same for the oracle and the device."""
    shards = [str(s.path) for s in model.shards]
    split = len(shards) > 1
    if as_json:
        doc = {"file": shards[0], "tensors": rows, "chained": chained,
               "types": sorted({r["type"] for r in rows})}
        if split:
            doc["shards"] = shards
        json.dump({**doc, **(extra or {})}, sys.stdout, indent=1)
        print()
        return
    # names come from the file: escaped, so that none can add a row or
    # reach the terminal as a control sequence (the JSON above escapes its own)
    names = [printable(r["name"]) for r in rows]
    w = max([len(n) for n in names] + [4])
    print(f"{'name':<{w}}  {'type':<7} {'shape':<16} " + " ".join(f"{d:<16}" for d in outs))
    for name, r in zip(names, rows):
        shape = "x".join(map(str, r["shape"]))
        print(f"{name:<{w}}  {r['type']:<7} {shape:<16} "
              + " ".join(r["hash"][d] for d in outs))
    if split:
        print(f"split set: {len(shards)} shards, {printable(os.path.basename(shards[0]))} ... "
              f"{printable(os.path.basename(shards[-1]))}")
    print(f"chained ({count(len(rows), 'tensor')}, {_model_order(model)}): "
          + "  ".join(f"{d}={chained[d]}" for d in outs))


def _model_order(model) -> str:
    return "shard order, then file order" if len(model.shards) > 1 else "file order"


def _hash_device(a, model, tensors, outs) -> int:
    """`hash --device cuda`: the hashes through the native kernels
    (strata_ref.native.hash_device), printed as the oracle's on stdout, the
    device report (kernel times, GB/s) on stderr; with --compare the
    per-tensor verdicts, exit 0 only if every output equals the oracle's."""
    from tqdm import tqdm

    from ..native.hash_device import (compare_lines, device_json, hash_tensors_device,
                                     summary_lines, tensor_rows)

    with tqdm(total=sum(t.n_bytes for t in tensors), unit="B", unit_scale=True,
              desc="hash cuda", file=sys.stderr,
              disable=True if a.no_progress else None) as bar:
        run = hash_tensors_device(tensors, outs, kernel=a.kernel or "auto", compare=a.compare,
                                  progress=bar.update)
    rows = tensor_rows(run)
    chained = {d: f"{run.chained[d]:016x}" for d in outs}
    extra = {"device": device_json(run)}
    if a.compare:
        extra["equal"] = run.all_equal
    if a.json:
        _print_hashes(model, rows, chained, outs, True, extra)
        return 0 if not a.compare or run.all_equal else 1
    if a.compare:
        print("\n".join(compare_lines(run)))
        print(f"chained ({count(len(rows), 'tensor')}, {_model_order(model)}, device): "
              + "  ".join(f"{d}={chained[d]}" for d in outs))
    else:
        _print_hashes(model, rows, chained, outs, False)
    print("\n".join(summary_lines(run)), file=sys.stderr)
    return 0 if not a.compare or run.all_equal else 1


def add_hash(sub) -> None:
    h = sub.add_parser("hash", help="FNV-1a 64 of every tensor's dequantized output")
    h.add_argument("model", nargs="?", default=None,
                   help="registry model name, .gguf path (any shard of a split set) or a "
                        "directory holding one model (default: SmolLM2-135M-Instruct)")
    h.add_argument("--out", default="f32,f16,bf16", help="output dtypes (default f32,f16,bf16)")
    h.add_argument("--types", default=None, help="only tensors of these ggml types, e.g. Q4_1,Q8_0")
    h.add_argument("--tensors", default=None, metavar="PATTERN",
                   help="only tensors whose names match these comma-separated fnmatch patterns, "
                        "e.g. 'blk.0.*,output.weight'")
    h.add_argument("--json", action="store_true", help="machine-readable output")
    h.add_argument("--no-progress", action="store_true", help="no progress bar")
    h.add_argument("--jobs", type=decimal, default=None, metavar="N",
                   help="tensors hashed in parallel by N worker processes (default and most: the "
                        "core count; 1: in this process); with --scheduler local, N dask workers")
    h.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the per-tensor tasks on dask.distributed: a scheduler address "
                        "(workers must see the model under the same path) or 'local' for a "
                        "LocalCluster (needs strata-ref[dask])")
    h.add_argument("--manifest", default=None, metavar="FILE",
                   help="write each tensor's hashes to FILE (JSON lines) as it completes")
    h.add_argument("--resume", action="store_true",
                   help="take the tensors --manifest FILE already holds from it, hash the rest")
    h.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: the NumPy oracle (default); cuda: the native kernels, the same "
                        "hashes printed, kernel times on stderr")
    h.add_argument("--kernel", choices=["auto", "generic", "wide"], default=None,
                   help="with --device cuda: auto (dispatch as the card and "
                        "STRATA_DEQUANT_WIDE say, default), generic, or wide (generic for "
                        "types without a wide kernel)")
    h.add_argument("--compare", action="store_true",
                   help="with --device cuda: also run the oracle and print per tensor equal / "
                        "DIFFERENT with the first differing value; exit 0 only if all equal")
    h.set_defaults(func=cmd_hash)
