"""`strata-ref` command line: each subcommand is a thin shell over the library."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from . import __version__


def _err(msg: str) -> int:
    print(f"strata-ref: error: {msg}", file=sys.stderr)
    return 2


def _split_list(s: str | None) -> list[str] | None:
    if not s:
        return None
    return [p.strip() for p in s.split(",") if p.strip()]


# ---------------------------------------------------------------- hash / info
class _Terminated(Exception):
    """SIGTERM arrived during `hash`."""


def _raise_terminated(signum, frame):
    raise _Terminated()


def cmd_hash(a) -> int:
    from tqdm import tqdm

    from .gguf import read
    from .hashing import HASH_DTYPES, hash_model
    from .models import resolve
    from .tasks import cpu_count
    from .types import parse_type

    outs = list(dict.fromkeys(o.lower() for o in _split_list(a.out) or []))
    bad = [o for o in outs if o not in HASH_DTYPES]
    if bad or not outs:
        return _err(f"--out: unknown or no dtype ({a.out!r}); choose from f32,f16,bf16")
    if a.device != "cuda" and (a.kernel or a.compare):
        return _err("--kernel and --compare need --device cuda")
    if a.device == "cuda" and (a.jobs or a.scheduler or a.manifest):
        return _err("--jobs, --scheduler and --manifest run the oracle's tasks; "
                    "--device cuda hashes in this process")
    if a.jobs is not None and a.jobs < 1:
        return _err(f"--jobs must be >= 1, got {a.jobs}")
    if a.resume and not a.manifest:
        return _err("--resume needs --manifest FILE (the manifest to resume from)")
    types = None
    if a.types:
        types = {parse_type(t) for t in _split_list(a.types)}
    path = resolve(a.model)
    f = read(path)
    tensors = [t for t in f.tensors if types is None or t.type in types]
    if types is not None and not tensors:
        print(f"strata-ref: note: no tensor of type {', '.join(sorted(t.name for t in types))} "
              f"in {path.name}", file=sys.stderr)
    if a.device == "cuda":
        return _hash_device(a, f, tensors, outs)
    total = sum(t.n_bytes for t in tensors)
    # SIGTERM (a CI cancel, `timeout`) unwinds like Ctrl-C, so that worker
    # processes are stopped and the manifest is closed on the way out
    import threading
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        # disable=None: tqdm draws only on a terminal, never into a log file
        with tqdm(total=total, unit="B", unit_scale=True, desc="hash", file=sys.stderr,
                  disable=True if a.no_progress else None) as bar:
            res = hash_model(f, outs, types=types, jobs=a.jobs or cpu_count(),
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
    w = max([len(r["name"]) for r in rows] + [4])
    print(f"{'name':<{w}}  {'type':<7} {'shape':<16} " + " ".join(f"{d:<16}" for d in outs))
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        print(f"{r['name']:<{w}}  {r['type']:<7} {shape:<16} "
              + " ".join(r["hash"][d] for d in outs))
    if split:
        print(f"split set: {len(shards)} shards, {os.path.basename(shards[0])} ... "
              f"{os.path.basename(shards[-1])}")
    print(f"chained ({len(rows)} tensors, {_model_order(model)}): "
          + "  ".join(f"{d}={chained[d]}" for d in outs))


def _model_order(model) -> str:
    return "shard order, then file order" if len(model.shards) > 1 else "file order"


def _hash_device(a, model, tensors, outs) -> int:
    """`hash --device cuda`: the hashes through the native kernels
    (strata_ref.native.hash_device), printed as the oracle's on stdout, the
    device report (kernel times, GB/s) on stderr; with --compare the
    per-tensor verdicts, exit 0 only if every output equals the oracle's."""
    from tqdm import tqdm

    from .native import unavailable_reason
    from .native.hash_device import (compare_lines, device_json, hash_tensors_device,
                                     summary_lines, tensor_rows)

    why = unavailable_reason()
    if why:
        return _err(f"--device cuda: native path unavailable: {why}")
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
        print(f"chained ({len(rows)} tensors, {_model_order(model)}, device): "
              + "  ".join(f"{d}={chained[d]}" for d in outs))
    else:
        _print_hashes(model, rows, chained, outs, False)
    print("\n".join(summary_lines(run)), file=sys.stderr)
    return 0 if not a.compare or run.all_equal else 1


def cmd_info(a) -> int:
    from collections import Counter

    from .gguf import read
    from .models import resolve

    f = read(resolve(a.file))
    print(f"file: {f.path}\nGGUF version {f.version}, alignment {f.alignment}, "
          f"{len(f.metadata)} metadata keys, {len(f.tensors)} tensors")
    if len(f.shards) > 1:
        print(f"split set of {len(f.shards)} shards (metadata from the first):")
        for k, s in enumerate(f.shards):
            print(f"  {k + 1:>5}  {os.path.basename(s.path)}  {len(s.tensors)} tensors, "
                  f"{s.file_size / 1e6:.2f} MB")
    def show(v):
        return v.item() if hasattr(v, "item") and getattr(v, "ndim", 0) == 0 else v
    for k, v in f.metadata.items():
        s = repr(show(v))
        if hasattr(v, "__len__") and not isinstance(v, str) and len(v) > 8:
            s = f"[{len(v)} values] " + repr([show(x) for x in v[:4]])[:-1] + ", ...]"
        print(f"  {k} = {s[:160]}")
    cnt, nbytes, nvals = Counter(), Counter(), Counter()
    for t in f.tensors:
        cnt[t.type.name] += 1
        nbytes[t.type.name] += t.n_bytes
        nvals[t.type.name] += t.n_elements
    print(f"{'type':<8} {'tensors':>7} {'MB':>10} {'M values':>10}")
    for k in sorted(cnt, key=lambda k: -nbytes[k]):
        print(f"{k:<8} {cnt[k]:>7} {nbytes[k] / 1e6:>10.2f} {nvals[k] / 1e6:>10.2f}")
    return 0


# ---------------------------------------------------------------- models
def cmd_models(a) -> int:
    from .models import REGISTRY, cache_dir, cached_path, fetch

    if a.action == "list":
        if a.name:
            return _err("models list takes no NAME")
        print(f"cache: {cache_dir()}")
        for m in REGISTRY.values():
            hit = cached_path(m)
            if hit:
                state = f"cached at {hit}"
            elif (cache_dir() / "models" / f"{m.name}.gguf").is_file():
                state = "cached copy fails its sha256; `models fetch` replaces it"
            else:
                state = "not fetched"
            print(f"{m.name:<30} {m.architecture:<6} {m.size / 1e6:7.1f} MB  {m.note}  [{state}]")
        return 0
    if not a.name:
        return _err("models fetch needs a NAME")
    print(fetch(a.name))
    return 0


# ---------------------------------------------------------------- delegated
def cmd_golden(a) -> int:
    from . import golden
    if a.action == "make":
        return golden.run_golden_make(a.dir)
    return golden.run_golden_check(a.dir)


def cmd_compare(a) -> int:
    from .golden import run_compare
    return run_compare(a.file, a.tensor, a.dump, a.dtype, a.row0, a.rows, a.ld, a.hash)


def _check_generate_args(a) -> str | None:
    """The first problem with generate's options or prompt, or None."""
    import math
    if not math.isfinite(a.temperature) or a.temperature < 0:
        return f"--temperature must be a finite number >= 0 (0: greedy), got {a.temperature}"
    if not 0.0 < a.top_p <= 1.0:
        return f"--top-p must be in (0, 1], got {a.top_p}"
    if a.top_k < 0:
        return f"--top-k must be >= 0 (0: off), got {a.top_k}"
    if a.seed < 0:
        return f"--seed must be >= 0, got {a.seed}"
    if a.max_tokens < 0:
        return f"--max-tokens must be >= 0, got {a.max_tokens}"
    if a.ctx is not None and a.ctx < 2:
        return f"--ctx must be >= 2, got {a.ctx}"
    try:
        a.args[-1].encode("utf-8")
    except UnicodeEncodeError as e:
        # bytes the locale could not decode come as lone surrogates
        raw = os.fsencode(a.args[-1][e.start:e.end])
        return (f"the prompt is not valid UTF-8 text (byte {raw[:1].hex()} at character "
                f"{e.start}); pass UTF-8")
    return None


def cmd_generate(a) -> int:
    from .infer import run_generate
    bad = _check_generate_args(a)
    if bad:
        return _err(bad)
    model, prompt = (None, a.args[0]) if len(a.args) == 1 else (a.args[0], a.args[1])
    return run_generate(model, prompt, a.max_tokens, a.temperature, a.top_k, a.top_p,
                        a.seed, a.chat, n_ctx=a.ctx, cpu=a.cpu)


def cmd_parity(a) -> int:
    if a.full and a.what != "gemm":
        return _err(f"--full applies to `parity gemm` only, not `parity {a.what}`")
    if a.what == "dequant":
        from .native.parity import run_parity_dequant
        return run_parity_dequant(quick=a.quick)
    if a.what == "gemm":
        from .native.gemm_parity import run_parity_gemm
        return run_parity_gemm(quick=a.quick, full=a.full)
    from .native import mmvq_parity
    if a.what == "mmvq":
        return mmvq_parity.run_parity_mmvq(a.quick)
    return mmvq_parity.run_parity_experts(a.quick)


def cmd_bench(a) -> int:
    if a.emit_table and a.what != "mmvq":
        return _err(f"--emit-table applies to `bench mmvq` only, not `bench {a.what}`")
    from .native import mmvq_parity
    if a.what == "mmvq":
        return mmvq_parity.run_bench_mmvq(a.emit_table)
    return mmvq_parity.run_bench_experts()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata-ref", description=__doc__)
    p.add_argument("--version", action="version", version=f"strata-ref {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    h = sub.add_parser("hash", help="FNV-1a 64 of every tensor's dequantized output")
    h.add_argument("model", nargs="?", default=None,
                   help="registry model name, .gguf path (any shard of a split set) or a "
                        "directory holding one model (default: SmolLM2-135M-Instruct)")
    h.add_argument("--out", default="f32,f16,bf16", help="output dtypes (default f32,f16,bf16)")
    h.add_argument("--types", default=None, help="only tensors of these ggml types, e.g. Q4_1,Q8_0")
    h.add_argument("--json", action="store_true", help="machine-readable output")
    h.add_argument("--no-progress", action="store_true", help="no progress bar")
    h.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="tensors hashed in parallel by N worker processes (default: the "
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

    i = sub.add_parser("info", help="metadata and a per-type tensor summary")
    i.add_argument("file")
    i.set_defaults(func=cmd_info)

    m = sub.add_parser("models", help="the registry of real GGUF models")
    m.add_argument("action", choices=["list", "fetch"])
    m.add_argument("name", nargs="?")
    m.set_defaults(func=cmd_models)

    g = sub.add_parser("golden", help="golden hash files: make or check")
    g.add_argument("action", choices=["make", "check"])
    g.add_argument("--dir", default=None, help="golden directory (default: the repository's golden/)")
    g.set_defaults(func=cmd_golden)

    c = sub.add_parser("compare", help="compare another engine's raw output dump with the oracle")
    c.add_argument("file")
    c.add_argument("tensor")
    c.add_argument("dump", nargs="?", default=None)
    c.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    c.add_argument("--row0", type=int, default=0)
    c.add_argument("--rows", type=int, default=None)
    c.add_argument("--ld", type=int, default=None)
    c.add_argument("--hash", default=None, help="compare against this FNV-1a 64 (hex) instead of a dump")
    c.set_defaults(func=cmd_compare)

    ge = sub.add_parser("generate", help="CPU inference: generate text from a prompt")
    ge.add_argument("args", nargs="+", metavar="[MODEL] PROMPT",
                    help="optional registry model or .gguf path, then the prompt (quoted)")
    ge.add_argument("--max-tokens", type=int, default=32)
    ge.add_argument("--temperature", type=float, default=0.0)
    ge.add_argument("--top-k", type=int, default=0)
    ge.add_argument("--top-p", type=float, default=1.0)
    ge.add_argument("--seed", type=int, default=0)
    ge.add_argument("--chat", action="store_true", help="apply the model's chat template")
    ge.add_argument("--ctx", type=int, default=None,
                    help="context length in tokens, at most the model's training context "
                         "(default: that, at most 4096)")
    ge.add_argument("--cpu", default=None, metavar="PROFILE",
                    help="the llama.cpp CPU build whose arithmetic to reproduce: scalar, avx2, "
                         "avx512 or native (default: $STRATA_REF_CPU, else native: the profile "
                         "of llama.cpp's native build on this CPU)")
    ge.set_defaults(func=cmd_generate)

    pa = sub.add_parser("parity", help="native kernels against the oracle (needs a GPU)")
    pa.add_argument("what", choices=["dequant", "gemm", "mmvq", "experts"])
    pa.add_argument("--quick", action="store_true", help="a small run")
    pa.add_argument("--full", action="store_true", help="gemm: >= 5,000 consecutive chunk sizes")
    pa.set_defaults(func=cmd_parity)

    b = sub.add_parser("bench", help="benchmarks (needs a GPU)")
    b.add_argument("what", choices=["mmvq", "experts"])
    b.add_argument("--emit-table", action="store_true",
                   help="mmvq: print the rows-per-warp table in the source's format")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    # argparse stops filling a positional list at the first option, so
    # `generate MODEL --chat PROMPT` leaves PROMPT over: take it back here.
    args, extra = parser.parse_known_args(argv)
    if extra:
        # after `--` everything is positional (`generate MODEL -- "-5 ..."`)
        dashes = extra[0] == "--"
        rest = extra[1:] if dashes else extra
        if args.cmd == "generate" and (dashes or not any(e.startswith("-") for e in rest)):
            args.args += rest
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "generate" and len(args.args) > 2:
        return _err("generate takes [MODEL] PROMPT (quote the prompt)")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except (ValueError, TypeError, RuntimeError, OSError, ImportError,
            MemoryError, ArithmeticError) as e:
        # Library errors (GGUFError, ModelError, UnsupportedTypeError...) name
        # what went wrong; show that line, not a traceback. MemoryError and
        # ArithmeticError (ZeroDivisionError, OverflowError) are not expected:
        # the type stays in the line so that a bug is still visible
        # (STRATA_REF_DEBUG=1 gives the traceback).
        if os.environ.get("STRATA_REF_DEBUG", "0") not in ("", "0"):
            raise
        return _err(f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    sys.exit(main())
