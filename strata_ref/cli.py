"""`strata-ref` command line: each subcommand is a thin shell over the library.

Every error is one line on stderr and exit status 2 (argparse's usage errors
add the usage above it); names and values taken from a file are escaped
before they are printed (`_text.printable`). Long jobs draw a tqdm bar on
stderr when it is a terminal; Ctrl-C stops any command with status 130.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys

from . import __version__
from ._text import count, printable

DESCRIPTION = """\
The bitwise reference for GGML/GGUF quantized weights: hash every tensor's
dequantized output (FNV-1a 64), compare another engine's output dump with
the oracle bit for bit, check the golden files, and run GGUF models
(llama, qwen2, qwen3, gemma3, qwen3moe, gpt-oss, qwen3next, qwen35moe) on
the CPU as llama.cpp does, and measure what a quantization costs."""

EPILOG = """\
A MODEL is a registry name (see `strata-ref models list`), a path to a
.gguf file (any shard of a gguf-split set opens the whole set) or a
directory holding one model. Models are cached in $STRATA_REF_CACHE, else
$XDG_CACHE_HOME/strata-ref, else ~/.cache/strata-ref. Errors are one line
(exit 2); STRATA_REF_DEBUG=1 shows the traceback. Ctrl-C exits with 130."""


class _Help(argparse.HelpFormatter):
    """Shows an option's default after its help, unless there is no default
    (None, a flag) or the help already says it."""

    def _get_help_string(self, action):
        h = action.help or ""
        if (not action.option_strings or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or "default" in h):
            return h
        return h + " (default: %(default)s)"


def _err(msg: str) -> int:
    # one line, whatever the message holds (a name taken from a file)
    print(f"strata-ref: error: {printable(msg, backslash=False)}", file=sys.stderr)
    return 2


def _error_line(e: BaseException) -> str:
    """The message of an error caught at the top, as the line after
    `strata-ref: error: `. The library's errors (ValueError, RuntimeError,
    ImportError and their kinds: GGUFError, ModelError ...) are sentences
    that name what went wrong: their message alone. An OSError: its path(s)
    and reason ("out.npz: is a directory"; a symbolic link loop or a link to
    nothing said so), no class name or errno. Any other error (TypeError,
    MemoryError, ArithmeticError: not expected) keeps its class name, so
    that a bug still shows as one."""
    msg = str(e)
    if isinstance(e, OSError) and e.strerror:
        names = [os.fsdecode(n) for n in (e.filename, e.filename2) if n is not None]
        from ._paths import unreachable
        why = unreachable(names[0]) if names and e.errno in (errno.ELOOP, errno.ENOENT) else None
        reason = why or e.strerror[:1].lower() + e.strerror[1:]
        return f"{' -> '.join(names)}: {reason}" if names else reason
    if isinstance(e, (ValueError, RuntimeError, ImportError, OSError)) and msg:
        return msg
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _split_list(s: str | None) -> list[str] | None:
    if not s:
        return None
    return [p.strip() for p in s.split(",") if p.strip()]


def _cpu_problem(name) -> str | None:
    """Why `--cpu NAME` (None: $STRATA_REF_CPU, else native) names no CPU
    profile, as one line, or None; checked before any model is read."""
    from .cpu import select
    try:
        select(name)
    except ValueError as e:
        return str(e)
    return None


# ---------------------------------------------------------------- hash / info
class _Terminated(Exception):
    """SIGTERM arrived during `hash`."""


def _raise_terminated(signum, frame):
    raise _Terminated()


def cmd_hash(a) -> int:
    from ._progress import progress_bar
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
    if a.types is not None:
        types = {parse_type(t) for t in _split_list(a.types) or []}
        if not types:
            return _err(f"--types {a.types!r} names no type")
    if a.device == "cuda":
        # before the model is fetched or read: a machine without a GPU
        # says so at once
        from .native import unavailable_reason
        from .native.loader import unavailable_line
        why = unavailable_reason()
        if why:
            print(unavailable_line("hash --device cuda", why), file=sys.stderr)
            return 2
    path = resolve(a.model)
    f = read(path)
    select = None
    if a.tensors is not None:
        select = _name_filter(a.tensors)
        if select is None or not any(select(t.name) for t in f.tensors):
            return _err(f"--tensors {a.tensors!r} matches no tensor of {path.name}")
    tensors = [t for t in f.tensors if (types is None or t.type in types) and (select is None or select(t.name))]
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
    (None when the list names no pattern)."""
    import fnmatch
    pats = _split_list(patterns)
    if not pats:
        return None
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in pats)


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

    from .native.hash_device import (compare_lines, device_json, hash_tensors_device,
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
        return _err(f"no metadata key '{key}' in {where} (it has {count(len(f.metadata), 'key')}; "
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

    from .gguf import read
    from .models import resolve

    f = read(resolve(a.file))
    if a.key is not None:
        return _print_key(f, a.key, a.file)
    if a.tensors:
        return _info_tensors(f)
    print(f"file: {printable(f.path)}\nGGUF version {f.version}, alignment {f.alignment}, "
          f"{len(f.metadata)} metadata keys, {len(f.tensors)} tensors")
    if len(f.shards) > 1:
        print(f"split set of {len(f.shards)} shards (metadata from the first):")
        for k, s in enumerate(f.shards):
            print(f"  {k + 1:>5}  {printable(os.path.basename(s.path))}  {len(s.tensors)} tensors, "
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
            print(f"{m.name:<30} {m.architecture:<6} {m.size / 1e6:7.1f} MB  {m.note}; aliases: "
                  f"{', '.join(m.aliases)}  [{state}]")
        return 0
    if not a.name:
        return _err("models fetch needs a NAME")
    print(fetch(a.name))
    return 0


# ---------------------------------------------------------------- delegated
def cmd_golden(a) -> int:
    from . import golden
    if a.dir is not None and not a.dir.strip():
        # an unset shell variable: never fall back to the repository's files
        return _err("--dir is empty; give a directory (or leave --dir out for the repository's golden/)")
    if a.action == "make":
        return golden.run_golden_make(a.dir)
    return golden.run_golden_check(a.dir)


def cmd_compare(a) -> int:
    from .golden import run_compare
    if a.worst < 0:
        return _err(f"--worst must be >= 0, got {a.worst}")
    return run_compare(a.file, a.tensor, a.dump, a.dtype, a.row0, a.rows, a.ld, a.hash,
                       n_worst=a.worst, max_ulp=a.max_ulp)


def _check_generate_args(a) -> str | None:
    """The first problem with generate's options or prompt, or None."""
    import math
    if not math.isfinite(a.temperature) or a.temperature < 0:
        return f"--temperature must be a finite number >= 0 (0: greedy), got {a.temperature}"
    if not 0.0 < a.top_p <= 1.0:
        return f"--top-p must be in (0, 1], got {a.top_p}"
    if a.top_k < 0:
        return f"--top-k must be >= 0 (0: off), got {a.top_k}"
    if _seed_problem(a.seed):
        return _seed_problem(a.seed)
    if a.max_tokens < 0:
        return f"--max-tokens must be >= 0, got {a.max_tokens}"
    from .infer.kv_cache import cache_type, resolve_flash_attn
    try:
        tk = cache_type(a.cache_type_k or "f16", "--cache-type-k")
        tv = cache_type(a.cache_type_v or "f16", "--cache-type-v")
        if a.flash_attn is not None:
            resolve_flash_attn(a.flash_attn, tv)
    except ValueError as e:
        msg = str(e)
        if "requires flash attention" in msg:
            msg = f"--cache-type-v {tv.name.lower()} needs --flash-attn on (or auto): " + msg
        return msg.replace("flash_attn ", "--flash-attn ", 1) if msg.startswith("flash_attn ") else msg
    if a.fa_threads is not None and a.fa_threads < 1:
        return f"--fa-threads must be >= 1, got {a.fa_threads}"
    bad_cpu = _cpu_problem(a.cpu)
    if bad_cpu:
        return bad_cpu
    try:
        a.args[-1].encode("utf-8")
    except UnicodeEncodeError as e:
        # bytes the locale could not decode come as lone surrogates
        raw = os.fsencode(a.args[-1][e.start:e.end])
        return (f"the prompt is not valid UTF-8 text (byte {raw[:1].hex()} at character "
                f"{e.start}); pass UTF-8")
    return None


def _names_a_model(arg: str) -> bool:
    """Whether a lone `generate` argument is a registry name or alias, or
    ends in .gguf (a model file), rather than a prompt."""
    from .models import ModelError, lookup
    try:
        lookup(arg)
        return True
    except ModelError:
        pass
    return arg.strip().lower().endswith(".gguf")


def cmd_generate(a) -> int:
    from .infer import run_generate
    bad = _check_generate_args(a)
    if bad:
        return _err(bad)
    model, prompt = (None, a.args[0]) if len(a.args) == 1 else (a.args[0], a.args[1])
    if model is None and _names_a_model(prompt):
        # `generate gemma3` ran the default model on the prompt "gemma3"
        return _err(f"'{prompt[:200]}' names a model but no PROMPT follows: give MODEL PROMPT "
                    "(a prompt alone may not be a registry name or end in .gguf)")
    cache = {}
    if a.cache_type_k is not None:
        cache["type_k"] = a.cache_type_k
    if a.cache_type_v is not None:
        cache["type_v"] = a.cache_type_v
    if a.flash_attn is not None:
        cache["flash_attn"] = a.flash_attn
    if a.fa_threads is not None:
        cache["fa_threads"] = a.fa_threads
    return run_generate(model, prompt, a.max_tokens, a.temperature, a.top_k, a.top_p,
                        a.seed, a.chat, n_ctx=a.ctx, cpu=a.cpu, cache=cache)


def _finite(x):
    """x with every non-finite float (a standard error of one position)
    as None, so that --json output is strict JSON (null, never NaN)."""
    import math
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _json_out(doc) -> None:
    json.dump(_finite(doc), sys.stdout, allow_nan=False)
    print()


def _plot_problem(plot_dir) -> str | None:
    """Why the charts of `--plot DIR` could not be written, as one line, or
    None; checked before the measurement runs, not after it: matplotlib
    must be there (ImportError, a one-line error), DIR must be a directory
    this process can write, or one it can create. Directories made for the
    check are removed again (the charts make them)."""
    if plot_dir is None:
        return None
    if not plot_dir.strip():
        # an unset shell variable: say so rather than draw no chart
        return "--plot is empty; give a directory for the charts (or leave --plot out)"
    from .quality.charts import _plt
    _plt()
    import tempfile
    d = os.path.abspath(plot_dir)
    if os.path.exists(d) and not os.path.isdir(d):
        return f"--plot {plot_dir}: not a directory (a file of that name exists)"
    missing = []
    while not os.path.isdir(d):
        if os.path.lexists(d):
            return f"--plot {plot_dir}: {d} is not a directory"
        missing.append(d)
        d = os.path.dirname(d)
    made = []
    try:
        for m in reversed(missing):
            try:
                os.mkdir(m)
            except OSError as e:
                return f"--plot {plot_dir}: cannot create {m}: {e.strerror[:1].lower() + e.strerror[1:]}"
            made.append(m)
        probe = missing[0] if missing else os.path.abspath(plot_dir)
        try:
            with tempfile.TemporaryFile(dir=probe):
                pass
        except OSError as e:
            return f"--plot {plot_dir}: cannot write into it: {e.strerror[:1].lower() + e.strerror[1:]}"
    finally:
        for m in reversed(made):
            os.rmdir(m)
    return None


def _write_charts(plot_dir, *charts) -> int:
    """Call each chart writer (no arguments) after the results are
    printed: 0, or 2 after one error line when one fails (the results
    stand)."""
    for chart in charts:
        try:
            chart()
        except Exception as e:
            return _err(f"--plot {plot_dir}: the chart was not written: {_error_line(e)} "
                        f"(the results are above)")
    return 0


def _native_note(cpu) -> None:
    """After the results of a run in the native profile (`--cpu` None: as
    $STRATA_REF_CPU, else native): the note on what native means on this
    CPU, once per model cache (as `generate` prints it)."""
    from . import cpu as _cpu
    from ._env import env_value
    from .infer import _note_once
    name = cpu if cpu is not None else env_value(_cpu.ENV) or "native"
    if name.strip().lower() == "native":
        _note_once(_cpu.native_note(), None)


def cmd_kl(a) -> int:
    from ._progress import progress_bar
    from .infer.sampling import Sampler
    from .quality import kl, prompts, report, variants
    if a.max_tokens < 1:
        return _err(f"--max-tokens must be >= 1, got {a.max_tokens}")
    if a.limit is not None and a.limit < 1:
        return _err(f"--limit must be >= 1, got {a.limit}")
    if _seed_problem(a.seed):
        return _err(_seed_problem(a.seed))
    bad_cpu = _cpu_problem(a.cpu)
    if bad_cpu:
        return _err(bad_cpu)
    bad_plot = _plot_problem(a.plot)
    if bad_plot:
        return _err(bad_plot)
    if sum(map(bool, (a.test, a.test_logits, a.tokens_out))) != 1:
        return _err("kl takes TEST models, --test-logits FILE or --tokens-out FILE (one of them)")
    plist = prompts.load_prompts(a.prompts) if a.prompts else list(prompts.DEFAULT_PROMPTS)
    if a.limit:
        plist = plist[:a.limit]
    sampler = Sampler(a.temperature, a.top_k, a.top_p, a.seed)
    ref = variants.load_variant(a.ref, a.cpu)
    if a.tokens_out or a.test_logits:
        return _kl_external(a, ref, plist, sampler)
    tests = [variants.load_variant(t, a.cpu) for t in a.test]
    for spec, m in zip([a.ref] + a.test, [ref] + tests):
        # `@Q4_K` of a model whose rows do not fit its blocks is mostly another type
        note = variants.fallback_note(spec, m)
        if note:
            print(f"strata-ref: note: {note}", file=sys.stderr)
    with progress_bar(len(plist), "kl", "prompt", enabled=not a.json) as bar:
        results, sts, fl = kl.run_kl_many(ref, tests, plist, a.max_tokens, sampler, a.chat, bar.update)
    meta = {"ref": a.ref, "cpu": ref.cpu.name, "prompts_file": a.prompts,
            "max_tokens": a.max_tokens, "temperature": a.temperature, "top_k": a.top_k,
            "top_p": a.top_p, "seed": a.seed, "chat": a.chat}
    if a.json:
        def fallback(m):
            fb = getattr(m, "fallback", None)
            return {"matrices": fb["matrices"], "types": fb["types"]} if fb else None
        docs = [report.kl_json({**meta, "test_spec": spec, "fallback": fallback(m)}, res, st, fl)
                for spec, m, res, st in zip(a.test, tests, results, sts)]
        _json_out(docs[0] if len(docs) == 1 else {**meta, "floor": fl, "tests": docs})
    else:
        mode = "greedy" if a.temperature <= 0 else f"temperature {a.temperature}, seed {a.seed}"
        for i, (spec, res, st) in enumerate(zip(a.test, results, sts)):
            header = (f"KL(REF || TEST)  REF={printable(a.ref)}  TEST={printable(spec)}  cpu {ref.cpu.name}, "
                      f"{count(len(plist), 'prompt')}, {count(st.get('n', 0), 'generated position')}, "
                      f"{mode}"
                      + (", chat" if a.chat else ""))
            print(("\n" if i else "") + report.kl_text(header, res, st, fl))
    _native_note(a.cpu)
    if not a.plot:
        return 0
    sys.stdout.flush()
    from .quality import charts
    return _write_charts(a.plot, *(
        lambda spec=spec, res=res: charts.kl_distribution(
            a.plot, res, f"{spec} vs {a.ref}",
            name=None if len(a.test) == 1 else f"kl_{charts.slug(spec)}.png")
        for spec, res in zip(a.test, results)))


def _kl_external(a, ref, plist, sampler) -> int:
    """`kl REF --tokens-out FILE` (REF's generations for another engine) and
    `kl REF --test-logits FILE` (that engine's logits measured)."""
    from ._progress import progress_bar
    from .quality import kl, report
    if a.tokens_out:
        with progress_bar(len(plist), "kl", "prompt", enabled=not a.json) as bar:
            n = kl.write_reference_tokens(a.tokens_out, ref, plist, a.max_tokens, sampler, a.chat, bar.update)
        print(f"{printable(a.tokens_out)}: REF's tokens for {n} prompts (tokens:<i>, n_prompt:<i>, prompt:<i>); "
              f"add logits:<i> from the engine and run `strata-ref kl REF --test-logits FILE`")
        return 0
    seqs = kl.load_test_logits(a.test_logits, ref.n_vocab)
    with progress_bar(len(seqs), "kl", "sequence", enabled=not a.json) as bar:
        res, st, fl = kl.run_kl_external(ref, seqs, sampler, bar.update)
    meta = {"ref": a.ref, "cpu": ref.cpu.name, "test_logits": a.test_logits, "temperature": a.temperature,
            "seed": a.seed}
    if a.json:
        _json_out(report.kl_json(meta, res, st, fl))
        return 0
    header = (f"KL(REF || TEST)  REF={printable(a.ref)}  TEST={printable(a.test_logits)} (another engine's "
              f"logits)  cpu {ref.cpu.name}, {len(seqs)} sequences, {st.get('n', 0)} generated positions")
    print(report.kl_text(header, res, st, fl))
    return 0


def cmd_layers(a) -> int:
    from ._progress import progress_bar
    from .quality import layers, prompts, report, variants
    if "@" in a.model and variants.parse_spec(a.model)[1] is not None:
        return _err(f"layers: give the model without a variant suffix ({a.model!r}); "
                    f"the study compares it with its own @float baseline")
    if a.max_tokens < 1:
        return _err(f"--max-tokens must be >= 1, got {a.max_tokens}")
    if a.jobs is not None and a.jobs < 1:
        return _err(f"--jobs must be >= 1, got {a.jobs}")
    if a.limit is not None and a.limit < 1:
        return _err(f"--limit must be >= 1, got {a.limit}")
    bad_cpu = _cpu_problem(a.cpu)
    if bad_cpu:
        return _err(bad_cpu)
    from .types import parse_type
    target = parse_type(a.type)
    bad_plot = _plot_problem(a.plot)
    if bad_plot:
        return _err(bad_plot)
    plist = prompts.load_prompts(a.prompts) if a.prompts else list(prompts.DEFAULT_PROMPTS)
    if a.limit:
        plist = plist[:a.limit]
    with progress_bar(None, "layers", "task", enabled=not a.json) as bar:
        study = layers.run_layers(a.model, target, plist, a.max_tokens, a.cpu,
                                  jobs=a.jobs or 1, scheduler=a.scheduler, progress=bar.update)
    if a.json:
        _json_out(study)
    else:
        print(report.layers_text(study))
    if not a.plot:
        return 0
    sys.stdout.flush()
    from .quality import charts
    return _write_charts(a.plot, lambda: charts.layer_kl(a.plot, study),
                         lambda: charts.crest(a.plot, study))


_NPY_ASK = "give float32 (n, n_embd) saved with numpy.save"


def _load_activations(path):
    """(array, None) of `experts --activations FILE`, or (None, the line
    that says why not): a regular file in NumPy's .npy format holding a
    2-D float32 array; never unpickled."""
    import stat

    import numpy as np
    where = f"--activations {path}"
    if not stat.S_ISREG(os.stat(path).st_mode):
        return None, f"{where}: not a regular file"
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic[:4] == b"PK\x03\x04":
        return None, f"{where}: a .npz archive, not a .npy array; {_NPY_ASK}"
    if magic != b"\x93NUMPY":
        return None, f"{where}: not a .npy file (no NumPy header); {_NPY_ASK}"
    fmt = np.lib.format
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(f)
        except ValueError as e:
            return None, f"{where}: a damaged .npy header ({e}); {_NPY_ASK}"
        data_at = f.tell()
    if dtype.hasobject:
        return None, f"{where}: holds Python objects, not numbers; {_NPY_ASK}"
    if dtype != np.float32 or len(shape) != 2:
        return None, f"{where}: needs a float32 .npy array (n, n_embd), got {dtype} {shape}"
    need = data_at + shape[0] * shape[1] * 4
    size = os.path.getsize(path)
    if size < need:
        return None, (f"{where}: the header says float32 {shape}, {need - data_at} bytes, the file "
                      f"holds {size - data_at}; is it cut short?")
    return np.load(path, allow_pickle=False), None


def _npz_out_problem(path) -> str | None:
    """Why `experts --out PATH` would not be written, or None: PATH must not
    be a directory, nor a file other than a .npz (zip) archive, and its
    directory must exist; checked before the work."""
    where = f"--out {path}"
    if os.path.isdir(path):
        return f"{where}: a directory; give a file name, such as {os.path.join(path, 'experts.npz')}"
    if os.path.lexists(path):
        if not os.path.isfile(path):
            return f"{where}: not a regular file"
        with open(path, "rb") as f:
            if f.read(4) not in (b"PK\x03\x04", b""):
                return f"{where}: the file exists and is not a .npz archive; give another --out, or remove it"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{where}: {parent} is not a directory"
    return None


def _save_npz(path, **arrays) -> None:
    """numpy.savez into exactly `path` (savez given a name adds `.npz`),
    through a temporary file beside it, so that a failure leaves no half
    archive and the old one, if any, whole."""
    import tempfile

    import numpy as np
    real = os.path.realpath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=".strata-ref-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, real)
    except BaseException:
        os.unlink(tmp)
        raise


def cmd_experts(a) -> int:
    from .hashing import hash_array
    from .infer import moe
    if (a.prompt is None) == (a.activations is None):
        return _err("experts takes --prompt TEXT or --activations FILE.npy (one of them)")
    bad_cpu = _cpu_problem(a.cpu)
    if bad_cpu:
        return _err(bad_cpu)
    bad_out = _npz_out_problem(a.out) if a.out else None
    if bad_out:
        return _err(bad_out)
    x = None
    if a.activations is not None:
        x, bad = _load_activations(a.activations)
        if bad:
            return _err(bad)
    c = moe.check_experts(a.model, a.layer, x=x, prompt=a.prompt, profile=a.cpu)
    agree = c.agreement()
    doc = {"arch": c.arch, "layer": c.layer, "cpu_profile": c.profile, "tokens": int(c.x.shape[0]),
           "experts_used": int(c.ids.shape[1]),
           "fnv1a64": {"x": f"{hash_array(c.x):016x}", "cpu": f"{hash_array(c.cpu):016x}",
                       "route": f"{hash_array(c.route):016x}"}, **agree}
    if a.out:
        import numpy as np
        _save_npz(a.out, x=c.x, ids=c.ids, weights=c.weights, cpu=c.cpu, route=c.route,
                  **{k: np.array(str(v)) for k, v in doc.items() if k != "fnv1a64"})
        doc["out"] = a.out
    if a.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"{c.arch} layer {c.layer}: {doc['tokens']} tokens, {doc['experts_used']} experts each "
          f"(ids of token 0: {c.ids[0].tolist()})")
    print(f"  llama.cpp CPU ({c.profile}):  fnv1a64 {doc['fnv1a64']['cpu']}")
    print(f"  mode-8 expert route:    fnv1a64 {doc['fnv1a64']['route']}")
    nan = []
    if agree["nan_both"]:
        nan.append(f"{agree['nan_both']} NaN on both sides, counted equal as in the hashes")
    if agree["nan_vs_number"]:
        nan.append(f"{agree['nan_vs_number']} NaN on one side only")
    print(f"  max |cpu - route| {agree['max_abs_diff']:.3g} ({agree['max_rel_diff']:.3g} of max |cpu|), "
          f"{100 * agree['equal_values']:.1f} % of values equal" + (f" ({'; '.join(nan)})" if nan else ""))
    if a.out:
        print(f"  written: {printable(a.out)} (x, ids, weights, cpu, route)")
    return 0


def _seed_problem(seed) -> str | None:
    """A seed is llama.cpp's uint32_t (`llama_sampler_init_dist`); the
    rotation's is written as a UINT32 key."""
    if not 0 <= seed < 1 << 32:
        return f"--seed must be from 0 to {(1 << 32) - 1}, got {seed}"
    return None


def _rotate_out_problem(out, force: bool) -> str | None:
    """Why `rotate IN OUT` must not write OUT, as one line, or None; checked
    before the work: a directory, something that is not a regular file, or
    a file that is not a GGUF without --force (an earlier rotation, a GGUF,
    is replaced)."""
    if os.path.isdir(out):
        return (f"rotate: OUT {out} is a directory; give a file name, such as "
                f"{os.path.join(out, 'rotated.gguf')}")
    if not os.path.exists(out):
        return None
    if not os.path.isfile(out):
        return f"rotate: OUT {out} is not a regular file"
    with open(out, "rb") as f:
        if f.read(4) != b"GGUF" and not force:
            return (f"rotate: OUT {out} exists and is not a GGUF file; give another OUT, or "
                    f"--force to replace it")
    return None


def cmd_rotate(a) -> int:
    from ._progress import progress_bar
    from .models import resolve
    from .quality.rotate import rotate_gguf
    bad_seed = _seed_problem(a.seed)
    if bad_seed:
        return _err(bad_seed)
    bad_out = _rotate_out_problem(a.output, a.force)
    if bad_out:
        return _err(bad_out)
    from .gguf import read
    src = resolve(a.input)
    out_real = os.path.realpath(a.output)

    def _same(path) -> bool:
        # a symlink, or a hard link (same file under another name)
        if os.path.realpath(path) == out_real:
            return True
        try:
            return os.path.samefile(path, out_real)
        except OSError:
            return False          # OUT does not exist yet
    if any(_same(f.path) for f in read(src).shards):
        return _err("rotate: OUT must not be the input file (or one of its shards)")
    out_dir = os.path.dirname(out_real)
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        # checked before the rotation's minutes of work, not after
        return _err(f"rotate: cannot write OUT: {out_dir} is not a writable directory")
    if not a.measure and (a.plot or a.types or a.prompts or a.limit is not None):
        return _err("rotate: --types, --prompts, --limit and --plot go with --measure")
    if a.measure:
        from .types import parse_type
        if a.max_tokens < 1:
            return _err(f"--max-tokens must be >= 1, got {a.max_tokens}")
        if a.limit is not None and a.limit < 1:
            return _err(f"--limit must be >= 1, got {a.limit}")
        bad_cpu = _cpu_problem(a.cpu)
        if bad_cpu:
            return _err(bad_cpu)
        for t in (a.types or "Q8_0,Q4_0").split(","):
            if t:
                parse_type(t)
        bad_plot = _plot_problem(a.plot)
        if bad_plot:
            return _err(bad_plot)
    with progress_bar(None, "rotate", "layer", enabled=not a.json) as bar:
        summary = rotate_gguf(src, a.output, a.type, a.seed, bar.update)
    if a.measure:
        from .quality import prompts, report
        from .quality.rotate import rotation_study
        plist = prompts.load_prompts(a.prompts) if a.prompts else list(prompts.DEFAULT_PROMPTS)
        plist = plist[:a.limit or 12]
        types = [t for t in (a.types or "Q8_0,Q4_0").split(",") if t]
        with progress_bar(None, "measure", "step", enabled=not a.json) as bar:
            study = rotation_study(src, a.output, plist, a.max_tokens, types, a.cpu, bar.update)
        summary["study"] = study
        if not a.json:
            print(report.rotation_text(study))
    if a.json:
        _json_out(summary)
    else:
        types = {}
        for _, t in summary["tensors"]:
            types[t] = types.get(t, 0) + 1
        print(f"{printable(a.output)}: {summary['arch']}, residual stream {summary['n_embd']} rotated by "
              f"a randomized Hadamard ({' x '.join(map(str, summary['hadamard']))}, seed {summary['seed']}), "
              f"heads of {summary['head_dim']} ({' x '.join(map(str, summary['head_hadamard']))}); "
              f"tensors: " + ", ".join(f"{t} x{n}" for t, n in sorted(types.items())))
    if not a.plot:
        return 0
    sys.stdout.flush()
    from .quality import charts
    return _write_charts(a.plot, *(lambda fn=fn: fn(a.plot, summary["study"])
                                   for fn in (charts.rotation_crest, charts.rotation_a8,
                                              charts.rotation_kl)))


# ---------------------------------------------------------------- trace / diff / which
def _token_ids(text: str) -> list | None:
    """Comma-separated token ids, None when the text is not such a list."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def cmd_trace(a) -> int:
    from .infer import load
    from .infer.trace import run_trace
    if (a.prompt is None) == (a.tokens is None):
        return _err("trace takes --prompt TEXT or --tokens IDS (one of them)")
    ids = None
    if a.tokens is not None:
        ids = _token_ids(a.tokens)
        if ids is None:
            return _err(f"--tokens {a.tokens[:80]!r} is not a comma-separated list of token ids")
    if a.split is not None and a.split < 1:
        return _err(f"--split must be >= 1, got {a.split}")
    if os.path.isdir(a.out):
        return _err(f"--out {a.out} is a directory; give the trace file to write")
    bad = _cpu_problem(a.cpu)
    if bad:
        return _err(bad)
    cache = {k: v for k, v in (("type_k", a.cache_type_k), ("type_v", a.cache_type_v),
                               ("flash_attn", a.flash_attn), ("fa_threads", a.fa_threads)) if v is not None}
    m = load(a.model, cpu=a.cpu, **cache)
    if ids is None:
        ids = m.tokenizer.encode(a.prompt, add_special=True, parse_special=False)
    n = run_trace(m, ids, a.out, split=a.split, patterns=_split_list(a.tensors),
                  producer=f"strata-ref trace --cpu {m.cpu.name}", compress=a.compress)
    c = m.new_cache(1)
    print(f"{printable(a.out)}: {n} tensors, {len(ids)} tokens"
          + (f", {len(ids) - a.split + 1} calls" if a.split and a.split < len(ids) else ", one call")
          + f"; cpu {m.cpu.name}, flash attention {'on' if c.flash_attn else 'off'}, "
            f"cache {c.type_k.name.lower()}/{c.type_v.name.lower()}")
    return 0


def cmd_diff(a) -> int:
    from .diff import diff_traces, load_map, report_text
    from .tracefile import open_trace
    if a.block < 1 or a.worst < 0:
        return _err("--block must be >= 1 and --worst >= 0")
    mapping = load_map(a.map) if a.map else None
    with open_trace(a.a) as ta, open_trace(a.b) as tb:
        rep = diff_traces(ta, tb, block=a.block, mapping=mapping, n_worst=a.worst)
        if not rep.results:
            return _err(f"no node of {a.a} has a namesake in {a.b} (another naming? give --map FILE)")
        if a.json:
            _json_out(rep.json())
        else:
            print(report_text(rep, a.block, a.all))
    return 0 if rep.equal else 1


def cmd_which(a) -> int:
    from ._progress import progress_bar
    from .which import load_logits, report_text, which
    from .cpu import ALIASES, PROFILES
    toks = None
    if a.tokens is not None:
        toks = _token_ids(a.tokens)
        if toks is None:
            return _err(f"--tokens {a.tokens[:80]!r} is not a comma-separated list of token ids")
    profiles = _split_list(a.cpu) or list(PROFILES)
    unknown = [p for p in profiles if p not in PROFILES and p not in ALIASES]
    if unknown:
        return _err(f"--cpu {unknown[0]!r} is not a profile ({', '.join(list(PROFILES) + list(ALIASES))})")
    fa = {"off": (False,), "on": (True,), "both": (False, True)}[a.flash_attn]
    e = load_logits(a.logits, toks, a.split)
    cache = {k: v for k, v in (("type_k", a.cache_type_k), ("type_v", a.cache_type_v)) if v is not None}
    with progress_bar(len(profiles) * len(fa), "which", "candidate", enabled=not a.json) as bar:
        cands = which(e, a.model, profiles, fa, bar.update, **cache)
    if a.json:
        _json_out({"logits": a.logits, "rows": int(e.logits.shape[0]), "split": e.split,
                   "candidates": [c.json() for c in cands],
                   "matches": [c.json() for c in cands if c.matches]})
    else:
        print(report_text(e, cands))
    return 0 if any(c.matches for c in cands) else 1


def cmd_dequant(a) -> int:
    import numpy as np

    from .hashing import hash_array
    from .probe import dequant_rows
    y = dequant_rows(a.model, a.tensor, a.dtype, a.row0, a.rows)
    bits = y.view({"f32": np.uint32, "f16": np.uint16, "bf16": np.uint16}[a.dtype])
    if a.out.endswith(".npy"):
        np.save(a.out, y if a.dtype != "bf16" else bits, allow_pickle=False)
    else:
        with open(a.out, "wb") as f:
            f.write(np.ascontiguousarray(bits).astype(bits.dtype.newbyteorder("<")).tobytes())
    print(f"{printable(a.out)}: {printable(a.tensor)} rows [{a.row0}, {a.row0 + y.shape[0]}) x {y.shape[1]}, "
          f"{a.dtype}{' (uint16 bits)' if a.dtype == 'bf16' and a.out.endswith('.npy') else ''}, "
          f"{bits.nbytes} bytes, fnv1a64 {hash_array(y):016x}")
    return 0


def cmd_matmul(a) -> int:
    import numpy as np

    from .hashing import hash_array
    from .probe import compare_output, load_activations, open_tensor, route_matmul
    if (a.out is None) == (a.compare is None):
        return _err("matmul takes --out Y.npy or --compare Y.npy (one of them)")
    if a.route != "cpu" and a.cpu is not None:
        return _err("--cpu goes with --route cpu")
    bad = _cpu_problem(a.cpu) if a.route == "cpu" else None
    if bad:
        return _err(bad)
    _, t = open_tensor(a.model, a.tensor)
    x = load_activations(a.activations, t.cols)
    y, bound = route_matmul(a.model, a.tensor, x, a.route, a.cpu)
    head = (f"{printable(a.tensor)} ({t.type.name}, {t.rows} x {t.cols}) x {x.shape[0]} activation rows, "
            f"route {a.route}: fnv1a64 {hash_array(y):016x}")
    if a.out is not None:
        np.save(a.out, y, allow_pickle=False)
        print(f"{head}; written {printable(a.out)} (float32 {y.shape[0]} x {y.shape[1]})")
        return 0
    try:
        got = np.load(a.compare, allow_pickle=False)
    except (OSError, ValueError) as e:
        return _err(f"--compare {a.compare}: cannot be read as .npy ({e})")
    if not isinstance(got, np.ndarray) or got.dtype != np.float32:
        return _err(f"--compare {a.compare}: needs float32 values, got {getattr(got, 'dtype', '?')}")
    if got.ndim == 1 and y.shape[0] == 1:
        got = got[None]
    rep = compare_output(got, y, bound, n_worst=a.worst)
    if a.json:
        _json_out({"tensor": a.tensor, "type": t.type.name, "route": a.route, **rep})
        return 0 if rep["equal"] else 1
    print(head)
    print(f"  {rep['n_diff']} of {rep['n']} values differ from the route's bits"
          + (f" (max {rep['max_ulp']} ulp, median {rep['median_ulp']:g})" if "max_ulp" in rep else ""))
    for w in rep["worst"]:
        print(f"    {w['ulps']:>10} ulp at token {w['row']}, output row {w['col']}")
    if bound is None:
        print("  EQUAL" if rep["equal"] else "  DIFFERENT")
    else:
        print(f"  largest |y - oracle| / bound {rep['max_ratio']:.3g} (token {rep['at']['row']}, output row "
              f"{rep['at']['col']}); NaN positions differing {rep['nan_mismatch']}")
        print("  WITHIN the route's error bound" if rep["within"] else "  OUTSIDE the route's error bound")
    return 0 if rep["equal"] else 1


def cmd_parity(a) -> int:
    if a.full and a.what != "gemm":
        return _err(f"--full applies to `parity gemm` only, not `parity {a.what}`")
    if a.what == "dequant":
        from .native.dequant.parity import run_parity_dequant
        return run_parity_dequant(quick=a.quick)
    if a.what == "gemm":
        from .native.gemm.parity import run_parity_gemm
        return run_parity_gemm(quick=a.quick, full=a.full)
    from .native.mmvq import parity as mmvq_parity
    if a.what == "mmvq":
        return mmvq_parity.run_parity_mmvq(a.quick)
    return mmvq_parity.run_parity_experts(a.quick)


def cmd_bench(a) -> int:
    if a.emit_table and a.what != "mmvq":
        return _err(f"--emit-table applies to `bench mmvq` only, not `bench {a.what}`")
    from .native.mmvq import bench as mmvq_bench
    if a.what == "mmvq":
        return mmvq_bench.run_bench_mmvq(a.emit_table)
    return mmvq_bench.run_bench_experts()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata-ref", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"strata-ref {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

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
    h.add_argument("--jobs", type=int, default=None, metavar="N",
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

    m = sub.add_parser("models", help="the registry of real GGUF models")
    m.add_argument("action", choices=["list", "fetch"],
                   help="list: the registry and what is cached; fetch: download one model")
    m.add_argument("name", nargs="?", metavar="NAME", help="fetch: the model name or alias")
    m.set_defaults(func=cmd_models)

    g = sub.add_parser("golden", help="golden hash files: make or check")
    g.add_argument("action", choices=["make", "check"],
                   help="make: write the golden files; check: recompute and compare them")
    g.add_argument("--dir", default=None, help="golden directory (default: the repository's golden/)")
    g.set_defaults(func=cmd_golden)

    c = sub.add_parser(
        "compare", help="compare another engine's raw output dump with the oracle",
        description="Compare rows [ROW0, ROW0 + ROWS) of one tensor, dequantized by "
                    "another engine, with the oracle's output, bit for bit (any NaN "
                    "equals any NaN). Exit 0 when equal, 1 when different, 2 on bad input.",
        formatter_class=_Help)
    c.add_argument("file", metavar="MODEL", help="GGUF file, or a cached registry model")
    c.add_argument("tensor", metavar="TENSOR", help="tensor name, as `strata-ref hash` lists it")
    c.add_argument("dump", metavar="DUMP", nargs="?", default=None,
                   help="raw little-endian file of --dtype values, row r at value r*LD; it "
                        "must hold exactly ROWS rows: ROWS*LD or (ROWS-1)*LD+cols values")
    c.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32",
                   help="value type of the dump")
    c.add_argument("--row0", type=int, default=0, metavar="R",
                   help="first tensor row the dump holds")
    c.add_argument("--rows", type=int, default=None, metavar="N",
                   help="rows the dump holds (default: every row from R to the end)")
    c.add_argument("--ld", type=int, default=None, metavar="L",
                   help="values from one dump row to the next (default: the tensor's row length)")
    c.add_argument("--hash", default=None, metavar="HEX",
                   help="compare against this FNV-1a 64 (hex) of the rows instead of a dump")
    c.add_argument("--worst", type=int, default=5, metavar="N",
                   help="list the N largest ulp distances with row, block and offset in the block")
    c.add_argument("--max-ulp", type=int, default=None, metavar="K",
                   help="an opt-in tolerance: exit 0 also when every differing value is a number within "
                        "K ulps (the report still says it is not bitwise)")
    c.set_defaults(func=cmd_compare)

    ge = sub.add_parser(
        "generate", help="CPU inference: generate text from a prompt",
        usage="%(prog)s [-h] [--max-tokens N] [--temperature T] [--top-k K]\n"
              + " " * 27 + "[--top-p P] [--seed S] [--chat] [--ctx N] [--cpu PROFILE]\n"
              + " " * 27 + "[--cache-type-k T] [--cache-type-v T] [--flash-attn on|off|auto]\n"
              + " " * 27 + "[--fa-threads N] [MODEL] PROMPT",
        description="Run a GGUF model on the CPU as llama.cpp does and stream the "
                    "continuation of PROMPT, then the prompt and decode speeds.",
        formatter_class=_Help)
    ge.add_argument("args", nargs="+", metavar="[MODEL] PROMPT",
                    help="optional registry model or .gguf path (default: "
                         "SmolLM2-135M-Instruct), then the prompt (quoted)")
    ge.add_argument("--max-tokens", type=int, default=32, metavar="N",
                    help="tokens to generate at most (0: only run the prompt)")
    ge.add_argument("--temperature", type=float, default=0.0, metavar="T",
                    help="sampling temperature; 0 is greedy (the most likely token)")
    ge.add_argument("--top-k", type=int, default=0, metavar="K",
                    help="sample among the K most likely tokens (0: all)")
    ge.add_argument("--top-p", type=float, default=1.0, metavar="P",
                    help="sample among the most likely tokens whose probabilities add "
                         "up to P, in (0, 1] (1: all)")
    ge.add_argument("--seed", type=int, default=0, metavar="S",
                    help="seed of the sampler's random numbers, 0 .. 2^32 - 1 (a 32-bit seed, "
                         "as llama.cpp's)")
    ge.add_argument("--chat", action="store_true",
                    help="format the prompt as one user message with the model's chat template")
    ge.add_argument("--ctx", type=int, default=None, metavar="N",
                    help="context length in tokens, from 2 to the model's training context "
                         "(default: that, at most 4096)")
    ge.add_argument("--cpu", default=None, metavar="PROFILE",
                    help="the llama.cpp CPU build whose arithmetic to reproduce: scalar, avx2, "
                         "avx512 (llama-cpp-python 0.3.36's llama.cpp), v0.4.0-x64, v0.4.0-haswell, "
                         "v0.4.0-skylakex, v0.4.0-zen4 (prebuilt llama.cpp v0.4.0 of "
                         "node-llama-cpp 3.21.1; aliases: v0.4.0-alderlake, -cannonlake, "
                         "-cascadelake, -icelake, -cooperlake) or native (default: "
                         "$STRATA_REF_CPU, else native: the profile of llama.cpp's native build "
                         "on this CPU)")
    kv_types = "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"
    ge.add_argument("--cache-type-k", default=None, metavar="T",
                    help=f"KV cache type of K, as llama.cpp's -ctk: {kv_types} (default f16); a "
                         "block type turns on llama.cpp's Hadamard rotation of q and k")
    ge.add_argument("--cache-type-v", default=None, metavar="T",
                    help="KV cache type of V, as llama.cpp's -ctv (default f16); a block type "
                         "needs flash attention and rotates v and the attention output")
    ge.add_argument("--flash-attn", default=None, metavar="on|off|auto",
                    help="flash attention (default: off, as llama-cpp-python's default, but on "
                         "for a block-type V cache; auto: on, as llama.cpp resolves it on the CPU)")
    ge.add_argument("--fa-threads", type=int, default=None, metavar="N",
                    help="llama.cpp's thread count to reproduce: flash attention for one token "
                         "over 512+ cached cells splits them into one chunk per thread "
                         "(default 2)")
    ge.set_defaults(func=cmd_generate)

    kq = sub.add_parser(
        "kl", help="KL divergence of TEST from REF at the positions REF generates",
        description="REF generates from each prompt; TEST is teacher-forced on REF's tokens; "
                    "KL(REF || TEST) over the whole vocabulary at the generated positions, with "
                    "the noise floor (REF's incremental pass against its own batched pass). "
                    "A model is a registry name or .gguf path, optionally with a variant: "
                    "@float (dequantized weights, float activations), @TYPE (every matrix "
                    "requantized to a ggml type, e.g. @Q4_K), @a8token (float weights, "
                    "per-token int8 activations).",
        formatter_class=_Help)
    kq.add_argument("ref", metavar="REF", help="the reference model[@variant]")
    kq.add_argument("test", metavar="TEST", nargs="*",
                    help="the model[@variant] measured against REF (several: one REF generation for all)")
    kq.add_argument("--test-logits", default=None, metavar="FILE",
                    help="instead of TEST: another engine's logits at REF's tokens (.npz of tokens:<i>, "
                         "n_prompt:<i>, logits:<i>; docs/trace.md); REF's generation must give its ids")
    kq.add_argument("--tokens-out", default=None, metavar="FILE",
                    help="write REF's generation per prompt (tokens:<i>, n_prompt:<i>, prompt:<i>) for "
                         "another engine to be teacher-forced on, and stop")
    kq.add_argument("--prompts", default=None, metavar="FILE",
                    help="prompts, one per line or JSON lines with \"prompt\" (default: the "
                         "built-in set of strata_ref.quality.prompts)")
    kq.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N prompts")
    kq.add_argument("--max-tokens", type=int, default=32, metavar="N",
                    help="tokens REF generates per prompt")
    kq.add_argument("--temperature", type=float, default=0.0, metavar="T",
                    help="REF's sampling temperature; 0 is greedy")
    kq.add_argument("--top-k", type=int, default=0, metavar="K", help="REF samples among the K most likely (0: all)")
    kq.add_argument("--top-p", type=float, default=1.0, metavar="P", help="REF's top-p, in (0, 1]")
    kq.add_argument("--seed", type=int, default=0, metavar="S",
                    help="REF's sampling seed, 0 .. 2^32 - 1")
    kq.add_argument("--chat", action="store_true",
                    help="each prompt is a user message in the model's chat template")
    kq.add_argument("--cpu", default=None, metavar="PROFILE",
                    help="CPU profile of both models (default: $STRATA_REF_CPU, else native)")
    kq.add_argument("--json", action="store_true", help="machine-readable output, every position's KL")
    kq.add_argument("--plot", default=None, metavar="DIR",
                    help="write the KL distribution chart (PNG, needs matplotlib) into DIR")
    kq.set_defaults(func=cmd_kl)

    ly = sub.add_parser(
        "layers", help="per-layer study of a quantization: crest factors, errors, sensitivity",
        description="Against MODEL@float on a calibration set: the crest factor of every "
                    "layer's attention and FFN input, each linear's weight and output errors "
                    "when requantized to TYPE (weights, ggml's activation blocks, per-token "
                    "int8), and the KL when only one layer is requantized (weight part and "
                    "activation part), beside the whole model's (docs/quality.md).",
        formatter_class=_Help)
    ly.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    ly.add_argument("--type", default="Q4_K", metavar="TYPE", help="the ggml type to requantize to")
    ly.add_argument("--prompts", default=None, metavar="FILE", help="calibration prompts (default: the built-in set)")
    ly.add_argument("--limit", type=int, default=16, metavar="N", help="use the first N prompts")
    ly.add_argument("--max-tokens", type=int, default=24, metavar="N", help="tokens generated per prompt")
    ly.add_argument("--cpu", default=None, metavar="PROFILE", help="CPU profile (default: $STRATA_REF_CPU, else native)")
    ly.add_argument("--jobs", type=int, default=None, metavar="N",
                    help="worker processes for the per-layer tasks (default 1: in this process)")
    ly.add_argument("--scheduler", default=None, metavar="ADDR",
                    help="run the tasks on dask.distributed: 'local' or a scheduler address")
    ly.add_argument("--json", action="store_true", help="machine-readable output")
    ly.add_argument("--plot", default=None, metavar="DIR", help="write layer_kl.png and crest.png into DIR")
    ly.set_defaults(func=cmd_layers)

    ex = sub.add_parser("experts", help="one MoE layer's routed experts: llama.cpp's CPU "
                                        "result and the mode-8 expert route's")
    ex.add_argument("model", metavar="MODEL", help="registry name, alias or .gguf path of a "
                                                   "qwen3moe or qwen3next model")
    ex.add_argument("--layer", type=int, required=True, metavar="N", help="the layer (0-based)")
    ex.add_argument("--prompt", metavar="TEXT",
                    help="take the FFN input that llama.cpp's graph has at the layer for this text")
    ex.add_argument("--activations", metavar="FILE.npy",
                    help="or these activations: float32 (n_tokens, n_embd), the FFN input")
    ex.add_argument("--cpu", default=None, metavar="PROFILE",
                    help="the llama.cpp CPU build to reproduce (as for generate)")
    ex.add_argument("--out", metavar="FILE.npz", help="also write x, ids, weights, cpu, route")
    ex.add_argument("--json", action="store_true", help="machine-readable output")
    ex.set_defaults(func=cmd_experts)

    ro = sub.add_parser(
        "rotate", help="rotate a model's residual stream offline (QuaRot style)",
        description="Fold every RMSNorm weight into the linears that read it, rotate the "
                    "embedding and every linear that reads or writes the residual stream by a "
                    "seeded randomized Hadamard matrix (and V / attn_output per head), "
                    "re-quantize with the reference quantizers and write a GGUF of the same "
                    "architecture (docs/quality.md, \"Rotation\").",
        formatter_class=_Help)
    ro.add_argument("input", metavar="IN", help="registry model or .gguf path (llama, qwen2, qwen3)")
    ro.add_argument("output", metavar="OUT", help="the rotated .gguf to write")
    ro.add_argument("--type", default=None, metavar="TYPE",
                    help="ggml type of every 2-D weight (default: each tensor keeps its type)")
    ro.add_argument("--seed", type=int, default=0, metavar="S",
                    help="seed of the Hadamard signs, 0 .. 2^32 - 1")
    ro.add_argument("--force", action="store_true",
                    help="replace OUT even when it exists and is not a GGUF file (an earlier "
                         "GGUF is replaced without it)")
    ro.add_argument("--json", action="store_true", help="machine-readable summary")
    ro.add_argument("--measure", action="store_true",
                    help="then compare OUT with IN (crest factors, per-linear int8 errors, KL "
                         "against IN@float; give --type F32 so that each weight type starts from "
                         "the same float weights)")
    ro.add_argument("--types", default=None, metavar="T1,T2",
                    help="weight types the measurement requantizes both to (default Q8_0,Q4_0)")
    ro.add_argument("--prompts", default=None, metavar="FILE", help="prompts (default: the built-in set)")
    ro.add_argument("--limit", type=int, default=None, metavar="N", help="the first N prompts (default 12)")
    ro.add_argument("--max-tokens", type=int, default=24, metavar="N", help="tokens generated per prompt")
    ro.add_argument("--cpu", default=None, metavar="PROFILE", help="CPU profile (default: $STRATA_REF_CPU, else native)")
    ro.add_argument("--plot", default=None, metavar="DIR",
                    help="write rotation_crest.png, rotation_a8.png and rotation_kl.png into DIR")
    ro.set_defaults(func=cmd_rotate)

    _add_trace_parsers(sub)

    pa = sub.add_parser("parity", help="native kernels against the oracle (needs a GPU)")
    pa.add_argument("what", choices=["dequant", "gemm", "mmvq", "experts"],
                    help="which native kernels")
    pa.add_argument("--quick", action="store_true", help="a small run")
    pa.add_argument("--full", action="store_true", help="gemm: >= 5,000 consecutive chunk sizes")
    pa.set_defaults(func=cmd_parity)

    b = sub.add_parser("bench", help="benchmarks (needs a GPU)")
    b.add_argument("what", choices=["mmvq", "experts"], help="which native kernels")
    b.add_argument("--emit-table", action="store_true",
                   help="mmvq: print the rows-per-warp table in the source's format")
    b.set_defaults(func=cmd_bench)
    return p


def _add_trace_parsers(sub) -> None:
    """The parsers of trace, diff, which, dequant and matmul (docs/trace.md)."""
    kv_types = "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"
    tr = sub.add_parser(
        "trace", help="every intermediate tensor of a forward pass, named as llama.cpp's graph",
        description="Run token ids through MODEL on the CPU as llama.cpp does and write every node of "
                    "the graph (named and ordered as llama.cpp's: attn_norm-0, Qcur-0, kq_soft_max-0, "
                    "ffn_out-3, result_output, ...) with its ggml op into a trace container "
                    "(docs/trace.md), streamed to disk.", formatter_class=_Help)
    tr.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    tr.add_argument("--prompt", metavar="TEXT", help="the text, tokenized as `generate` does")
    tr.add_argument("--tokens", metavar="IDS", help="or comma-separated token ids")
    tr.add_argument("--split", type=int, default=None, metavar="N",
                    help="the first N ids in one call, then one id per call (default: one batched call)")
    tr.add_argument("--tensors", default=None, metavar="PATTERNS",
                    help="only nodes whose names match these comma-separated fnmatch patterns")
    tr.add_argument("--out", required=True, metavar="TRACE", help="the trace file to write (.npz)")
    tr.add_argument("--cpu", default=None, metavar="PROFILE",
                    help="the llama.cpp CPU build to reproduce (default: $STRATA_REF_CPU, else native)")
    tr.add_argument("--cache-type-k", default=None, metavar="T", help=f"KV cache type of K: {kv_types}")
    tr.add_argument("--cache-type-v", default=None, metavar="T", help="KV cache type of V")
    tr.add_argument("--flash-attn", default=None, metavar="on|off|auto", help="flash attention (default off)")
    tr.add_argument("--fa-threads", type=int, default=None, metavar="N",
                    help="llama.cpp's thread count for flash attention's split (default 2)")
    tr.add_argument("--compress", action="store_true", help="deflate the entries (smaller, slower)")
    tr.set_defaults(func=cmd_trace)

    df = sub.add_parser(
        "diff", help="two traces node by node: where they depart",
        description="Compare trace B with trace A node by node in A's graph order: equal bits or not, "
                    "the first differing node with its op and layer, its ulp distribution and first "
                    "differing element (row, block, offset), the growth layer by layer. Exit 0 only "
                    "if every compared node is equal, 1 when some differ, 2 on bad input.",
        formatter_class=_Help)
    df.add_argument("a", metavar="A", help="trace (e.g. llama.cpp's, tools/llama_trace.c)")
    df.add_argument("b", metavar="B", help="trace compared with A")
    df.add_argument("--map", default=None, metavar="FILE",
                    help="JSON {\"B name\": \"A name\"} ({il}: any layer) for a B of other naming")
    df.add_argument("--block", type=int, default=32, metavar="N",
                    help="block length the first difference is placed in (32: q8_0, 256: q8_K)")
    df.add_argument("--worst", type=int, default=5, metavar="N", help="largest ulp distances listed per node")
    df.add_argument("--all", action="store_true", help="a line for every compared node")
    df.add_argument("--json", action="store_true", help="machine-readable report, every node")
    df.set_defaults(func=cmd_diff)

    wh = sub.add_parser(
        "which", help="which CPU profile and flash-attention setting reproduce an engine's logits",
        description="Run LOGITS' token ids through MODEL in every candidate (CPU profile x flash "
                    "attention) and count the rows equal bit for bit; name the candidates that "
                    "reproduce every row, else the nearest and its first differing row. Exit 0 when "
                    "one matches, 1 when none does, 2 on bad input (docs/trace.md).",
        formatter_class=_Help)
    wh.add_argument("logits", metavar="LOGITS",
                    help=".npz (tokens, logits[, columns, split]), a trace, or .npy with --tokens")
    wh.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    wh.add_argument("--tokens", default=None, metavar="IDS", help="the token ids of an .npy")
    wh.add_argument("--split", type=int, default=None, metavar="N",
                    help="the engine ran the first N ids in one call, then one per call")
    wh.add_argument("--cpu", default=None, metavar="P1,P2", help="candidate profiles (default: all)")
    wh.add_argument("--flash-attn", choices=["off", "on", "both"], default="both",
                    help="candidate flash-attention settings")
    wh.add_argument("--cache-type-k", default=None, metavar="T", help=f"KV cache type of K: {kv_types}")
    wh.add_argument("--cache-type-v", default=None, metavar="T", help="KV cache type of V")
    wh.add_argument("--json", action="store_true", help="machine-readable output")
    wh.set_defaults(func=cmd_which)

    dq = sub.add_parser("dequant", help="the oracle's output of a tensor's rows, to a file",
                        formatter_class=_Help)
    dq.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    dq.add_argument("tensor", metavar="TENSOR", help="tensor name (`info --tensors` lists them)")
    dq.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32", help="output value type")
    dq.add_argument("--row0", type=int, default=0, metavar="R", help="first row")
    dq.add_argument("--rows", type=int, default=None, metavar="N", help="rows (default: to the end)")
    dq.add_argument("--out", required=True, metavar="FILE",
                    help="raw little-endian values, or .npy (bf16 as uint16 bits)")
    dq.set_defaults(func=cmd_dequant)

    mm = sub.add_parser(
        "matmul", help="one weight times activations through a route, or an engine's result checked",
        description="y = x W^T for weight TENSOR and --activations X.npy (float32, tokens x cols) through "
                    "a route: cpu (ggml-cpu's mat-mul of a profile, bitwise), mmvq (the CUDA q8_1 "
                    "mat-vec, bitwise), gemm-f16 / gemm-f32 (the cuBLAS routes, within their derived "
                    "error bound). --out writes the route's y; --compare checks an engine's y. Exit 0 "
                    "when equal (within the bound), 1 when not, 2 on bad input.",
        formatter_class=_Help)
    mm.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    mm.add_argument("tensor", metavar="TENSOR", help="a 2-D weight tensor")
    mm.add_argument("--activations", required=True, metavar="X.npy", help="float32 (tokens, cols) or (cols,)")
    mm.add_argument("--route", required=True, choices=["mmvq", "gemm-f16", "gemm-f32", "cpu"], help="the route")
    mm.add_argument("--cpu", default=None, metavar="PROFILE", help="the profile of --route cpu")
    mm.add_argument("--out", default=None, metavar="Y.npy", help="write the route's float32 (tokens, rows)")
    mm.add_argument("--compare", default=None, metavar="Y.npy", help="an engine's float32 (tokens, rows)")
    mm.add_argument("--worst", type=int, default=5, metavar="N", help="largest ulp distances listed")
    mm.add_argument("--json", action="store_true", help="machine-readable comparison")
    mm.set_defaults(func=cmd_matmul)


#: Seconds the main thread has, after Ctrl-C, to stop the job cleanly.
INTERRUPT_GRACE_S = 1.0


def _keep_interrupts() -> None:
    """Make every Ctrl-C stop the command, at once.

    Two ways an interrupt could be late or lost. A KeyboardInterrupt raised
    while Python code runs as a callback of C code (llvmlite calls one
    whenever numba compiles or caches a function) cannot leave the
    callback: CPython reports it as "Exception ignored ..." and drops it.
    The hook below takes such an interrupt silently and a watcher thread
    raises it again in the main thread a moment later (the hook only sets
    an event: an interrupt raised inside the hook would be lost as well).
    And Python runs its SIGINT handler only between bytecodes, so a long
    call into C (an LLVM compile) delays it: the signal also wakes a second
    thread (`signal.set_wakeup_fd`), which ends the process with status 130
    if it is still running INTERRUPT_GRACE_S seconds later. (That thread
    needs the GIL: a compiled kernel that holds it still delays the exit
    until it returns; strata-ref's kernels run in short calls.) Other unraisable errors go to the previous hook. Does
    nothing when SIGINT was ignored when the process started (a background
    job of a shell without job control)."""
    import _thread
    import signal
    import threading
    import time
    if (signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            or threading.current_thread() is not threading.main_thread()):
        return
    lost = threading.Event()
    previous = sys.unraisablehook

    def hook(u):
        if isinstance(u.exc_value, KeyboardInterrupt):
            lost.set()
        else:
            previous(u)

    def reraise():
        while True:
            lost.wait()
            time.sleep(0.02)      # let the C code return from its callback
            lost.clear()
            _thread.interrupt_main()

    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def deadline():
        while signal.SIGINT not in os.read(r, 64):
            pass
        time.sleep(INTERRUPT_GRACE_S)
        # raw writes only: the main thread may hold the locks of the Python
        # streams (a bar being drawn); a line end after a half-drawn bar
        try:
            os.write(2, b"\n")
        finally:
            os._exit(130)

    for target, name in ((reraise, "reraise"), (deadline, "deadline")):
        threading.Thread(target=target, name=f"strata-ref-interrupt-{name}", daemon=True).start()
    sys.unraisablehook = hook


def _escape_unencodable() -> None:
    """Write what stdout / stderr cannot encode (PYTHONIOENCODING=ascii, a
    C locale) as backslash escapes (`caf\\xe9`, `\\u0120`) instead of
    dying with UnicodeEncodeError in the middle of the output. A stream
    that already has an error handler other than strict keeps it."""
    import io
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def main(argv=None) -> int:
    """The `strata-ref` command: returns the exit status. With argv None
    (the console script, `python -m strata_ref.cli`) the process is the
    command, and Ctrl-C handling is set up for it (`_keep_interrupts`);
    a caller passing argv keeps its own."""
    if argv is None:
        _keep_interrupts()
    _escape_unencodable()
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
    from ._env import (debug_setting, drop_blank_numba_env, numba_config_problem,
                       numba_env_problem, switch_problem)
    debug, debug_warning = debug_setting()
    if debug_warning:
        print(f"strata-ref: warning: {debug_warning}", file=sys.stderr)
    drop_blank_numba_env()      # an empty variable is unset, for numba too
    bad_env = numba_env_problem() or switch_problem() or numba_config_problem()  # before anything imports numba
    if bad_env:
        return _err(bad_env)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        # a second Ctrl-C must not interrupt the way out
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return 130
    except BrokenPipeError:
        return 0
    except (ValueError, TypeError, RuntimeError, OSError, ImportError,
            MemoryError, ArithmeticError) as e:
        # Library errors (GGUFError, ModelError, UnsupportedTypeError...) name
        # what went wrong; show that line, not a traceback (`_error_line`:
        # TypeError, MemoryError and ArithmeticError are not expected and
        # keep their class name; STRATA_REF_DEBUG=1 gives the traceback).
        if debug:
            raise
        return _err(_error_line(e))
    except Exception as e:
        # Nothing else is expected: a bug. Still one line, saying so.
        if debug:
            raise
        return _err(f"internal error {type(e).__name__}: {e} (a bug in strata-ref; "
                    f"STRATA_REF_DEBUG=1 shows the traceback)")


if __name__ == "__main__":
    sys.exit(main())
