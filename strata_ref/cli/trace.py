"""`strata-ref trace`, `diff` and `which`: a forward pass's every node
recorded under llama.cpp's names, two traces compared, the CPU profile
that reproduces an engine's logits (docs/trace.md)."""
from __future__ import annotations

import sys

from .._text import count, printable
from .common import (Help, decimal, KV_TYPES, below_minimum, cpu_problem, err, fa_threads_bound_problem,
                     fa_threads_problem, json_out, list_problem, out_problem, patterns_problem, split_list,
                     token_ids, utf8_problem)


def cmd_trace(a) -> int:
    from ..infer import load
    from ..infer.trace import pass_ctx, run_trace
    if (a.prompt is None) == (a.tokens is None):
        return err("trace takes --prompt TEXT or --tokens IDS (one of them)")
    ids = None
    if a.tokens is not None:
        ids = token_ids(a.tokens)
        if ids is None:
            return err(f"--tokens {a.tokens[:80]!r} is not a comma-separated list of token ids")
    if a.split is not None and a.split < 1:
        return err(f"--split must be >= 1, got {a.split}")
    bad = (patterns_problem(a.tensors) or cpu_problem(a.cpu) or _ctx_problem(a.ctx)
           or fa_threads_problem(a.fa_threads, a.flash_attn, a.cache_type_v, a.cpu)
           or (utf8_problem(a.prompt, "--prompt") if a.prompt is not None else None)
           or out_problem(a.out, "--out", "trace", "trace.npz", inputs=(a.model,)))
    if bad:
        return err(bad)
    cache = {k: v for k, v in (("type_k", a.cache_type_k), ("type_v", a.cache_type_v),
                               ("flash_attn", a.flash_attn), ("fa_threads", a.fa_threads)) if v is not None}
    m = load(a.model, cpu=a.cpu, **cache)
    if ids is None:
        ids = m.tokenizer.encode(a.prompt, add_special=True, parse_special=False)
    if a.split is not None and a.split > len(ids):
        return err(f"--split {a.split} is more than the {len(ids)} token ids (at most {len(ids)}; "
                   f"leave it out for one batched call)")
    bad = _ctx_problem(a.ctx, m, len(ids))
    if bad:
        return err(bad)
    n_ctx = pass_ctx(m, len(ids), a.ctx)
    n = run_trace(m, ids, a.out, split=a.split, patterns=split_list(a.tensors),
                  producer=f"strata-ref trace --cpu {m.cpu.name}", compress=a.compress, n_ctx=n_ctx)
    c = m.new_cache(1)
    print(f"{printable(a.out)}: {count(n, 'tensor')}, {count(len(ids), 'token')}"
          + (f", {len(ids) - a.split + 1} calls" if a.split and a.split < len(ids) else ", one call")
          + f"; cpu {m.cpu.name}, n_ctx {n_ctx}, flash attention {'on' if c.flash_attn else 'off'}, "
            f"cache {c.type_k.name.lower()}/{c.type_v.name.lower()}")
    return 0


def _ctx_problem(n_ctx, m=None, n_ids: int | None = None) -> str | None:
    """Why --ctx n_ctx cannot run a pass of n_ids token ids through model
    m (each check where its argument is given), or None; the words of
    `infer.trace.pass_ctx`."""
    if n_ctx is None:
        return None
    bad = below_minimum("--ctx", n_ctx, 1, "one token")
    if bad:
        return bad
    if m is not None:
        from ..infer.trace import pass_ctx
        try:
            pass_ctx(m, n_ids or 0, n_ctx, "--ctx")
        except ValueError as e:
            return str(e)
    if n_ids is not None and n_ids > n_ctx:
        return f"--ctx {n_ctx} holds fewer than the {n_ids} token ids (at least {n_ids})"
    return None


def cmd_diff(a) -> int:
    from ..diff import diff_traces, load_map, report_text
    from ..tracefile import open_trace
    if a.block < 1:
        return err(f"--block must be >= 1, got {a.block}")
    if a.worst < 0:
        return err(f"--worst must be >= 0, got {a.worst}")
    mapping = load_map(a.map) if a.map else None
    with open_trace(a.a) as ta, open_trace(a.b) as tb:
        rep = diff_traces(ta, tb, block=a.block, mapping=mapping, n_worst=a.worst)
        if not rep.results:
            return err(f"no node of {a.a} has a namesake in {a.b} (another naming? give --map FILE)")
        if a.json:
            json_out(rep.json())
        else:
            print(report_text(rep, a.block, a.all))
    return 0 if rep.equal else 1


def cmd_which(a) -> int:
    from .._progress import progress_bar
    from ..which import load_logits, report_text, which
    from ..cpu import PROFILES, select
    toks = None
    if a.tokens is not None:
        toks = token_ids(a.tokens)
        if toks is None:
            return err(f"--tokens {a.tokens[:80]!r} is not a comma-separated list of token ids")
    # an empty list would otherwise mean every profile (minutes of compiling)
    bad = list_problem(a.cpu, "--cpu", f"--cpu {a.cpu!r} names no profile (give P1,P2 or leave --cpu out "
                                        f"for all)")
    if bad:
        return err(bad)
    given, seen, repeats = {}, {}, []   # profile -> the item naming it first; item (any case) -> item
    for p in split_list(a.cpu) or list(PROFILES):
        # the profile names of `generate --cpu` (any case, `native`), each once
        bad = cpu_problem(p)
        if bad:
            return err(bad)
        name = select(p).name
        if name in given:
            repeats.append(_repeat_note(seen.get(p.lower()) or given[name], p, name))
        else:
            given[name] = p
        seen.setdefault(p.lower(), p)
    profiles = list(given)
    bad = fa_threads_bound_problem(a.fa_threads) or _ctx_problem(a.ctx)
    if bad:
        return err(bad)
    fa = {"off": (False,), "on": (True,), "both": (False, True), "auto": "auto"}[a.flash_attn]
    e = load_logits(a.logits, toks, a.split)
    bad = _ctx_problem(a.ctx, n_ids=e.tokens.size)
    if bad:
        return err(bad)
    for note in repeats:       # once the input is known good: never beside an error line
        print(f"strata-ref: note: {printable(note, backslash=False)}", file=sys.stderr)
    cache = {k: v for k, v in (("type_k", a.cache_type_k), ("type_v", a.cache_type_v)) if v is not None}
    if fa == (False, True) and "type_v" in cache and _block_v(cache["type_v"]):
        # llama.cpp runs a block-type V cache with flash attention only:
        # there is no "off" candidate (an explicit --flash-attn off says so)
        fa = (True,)
    if a.fa_threads is not None:
        cache["fa_threads"] = a.fa_threads      # the candidates without flash attention ignore it
    per_profile = 1 if fa == "auto" else len(fa)
    if a.cpu is None and not a.json:
        # every profile: say what is coming (each compiles at its first use)
        print(f"strata-ref which: {len(profiles) * per_profile} candidates ({len(profiles)} CPU profiles); "
              f"a profile's first use on this machine compiles its kernels (a minute or more each); "
              f"--cpu P1,P2 narrows the search", file=sys.stderr, flush=True)
    with progress_bar(len(profiles) * per_profile, "which", "candidate", enabled=not a.json) as bar:
        cands = which(e, a.model, profiles, fa, bar.update, n_ctx=a.ctx, **cache)
    if a.json:
        json_out({"logits": a.logits, "rows": int(e.logits.shape[0]), "split": e.split,
                  "n_ctx": a.ctx if a.ctx is not None else e.n_ctx,
                   "candidates": [c.json() for c in cands],
                   "matches": [c.json() for c in cands if c.matches]})
    else:
        print(report_text(e, cands, a.ctx))
    if all(c.not_emulated for c in cands):
        # nothing was compared: a choice of candidates to change, as --cpu ''
        return err("no candidate could be run (each one's line says what is not emulated), so nothing was "
                   "compared: choose other --cpu, --flash-attn or cache types")
    return 0 if any(c.matches for c in cands) else 1


def _repeat_note(first: str, again: str, name: str) -> str:
    """The note for `which --cpu` items `first` and `again` that both give
    profile `name` (its one candidate runs once): `native` or an alias
    beside the profile it resolves to, or a name given twice."""
    from ..cpu import NATIVE_NAMES
    first, again = first.strip(), again.strip()
    if first.lower() == again.lower():
        what = f"--cpu names {first} twice" if first == again else f"--cpu names {first} and {again}"
    else:
        other = again if again.lower() != name.lower() else first
        where = " on this machine" if other.lower() in NATIVE_NAMES else ""
        what = f"--cpu {other} is {name}{where}"
    return f"{what}: tried once"


def _block_v(name: str) -> bool:
    """Whether V cache type `name` is a block type (False for an unknown
    name: the candidates' cache check then names it)."""
    from ..infer.kv_cache import _is_block, cache_type
    try:
        return _is_block(cache_type(name, "type_v (--cache-type-v)"))
    except ValueError:
        return False


def add_trace(sub) -> None:
    tr = sub.add_parser(
        "trace", help="every intermediate tensor of a forward pass, named as llama.cpp's graph",
        description="Run token ids through MODEL on the CPU as llama.cpp does and write every node of "
                    "the graph (named and ordered as llama.cpp's: attn_norm-0, Qcur-0, kq_soft_max-0, "
                    "ffn_out-3, result_output, ...) with its ggml op into a trace container "
                    "(docs/trace.md), streamed to disk.", formatter_class=Help)
    tr.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    tr.add_argument("--prompt", metavar="TEXT", help="the text, tokenized as `generate` does")
    tr.add_argument("--tokens", metavar="IDS", help="or comma-separated token ids")
    tr.add_argument("--split", type=decimal, default=None, metavar="N",
                    help="the first N ids in one call, then one id per call (default: one batched call)")
    tr.add_argument("--tensors", default=None, metavar="PATTERNS",
                    help="only nodes whose names match these comma-separated fnmatch patterns")
    tr.add_argument("--out", required=True, metavar="TRACE", help="the trace file to write (.npz)")
    tr.add_argument("--cpu", default=None, metavar="PROFILE",
                    help="the llama.cpp CPU build to reproduce (default: $STRATA_REF_CPU, else native)")
    tr.add_argument("--cache-type-k", default=None, metavar="T", help=f"KV cache type of K: {KV_TYPES}")
    tr.add_argument("--cache-type-v", default=None, metavar="T", help="KV cache type of V")
    tr.add_argument("--flash-attn", default=None, metavar="on|off|auto",
                    help="flash attention (default: the profile's llama.cpp's, as `generate`)")
    tr.add_argument("--fa-threads", type=decimal, default=None, metavar="N",
                    help="llama.cpp's thread count for flash attention's split (default 2); needs "
                         "flash attention on")
    tr.add_argument("--ctx", type=decimal, default=None, metavar="N",
                    help="context length in tokens (default: 512, or the next multiple of 256 that holds "
                         "the ids, as the reference drivers run; phi3's LongRoPE factors depend on it)")
    tr.add_argument("--compress", action="store_true", help="deflate the entries (smaller, slower)")
    tr.set_defaults(func=cmd_trace)


def add_diff(sub) -> None:
    df = sub.add_parser(
        "diff", help="two traces node by node: where they depart",
        description="Compare trace B with trace A node by node in A's graph order: equal bits or not, "
                    "the first differing node with its op and layer, its ulp distribution and first "
                    "differing element (row, block, offset), the growth layer by layer. Exit 0 only "
                    "if every compared node is equal, 1 when some differ, 2 on bad input.",
        formatter_class=Help)
    df.add_argument("a", metavar="A", help="trace (e.g. llama.cpp's, tools/llama_trace.c)")
    df.add_argument("b", metavar="B", help="trace compared with A")
    df.add_argument("--map", default=None, metavar="FILE",
                    help="JSON {\"B name\": \"A name\"} ({il}: any layer) for a B of other naming")
    df.add_argument("--block", type=decimal, default=32, metavar="N",
                    help="block length the first difference is placed in (32: q8_0, 256: q8_K)")
    df.add_argument("--worst", type=decimal, default=5, metavar="N", help="largest ulp distances listed per node")
    df.add_argument("--all", action="store_true", help="a line for every compared node")
    df.add_argument("--json", action="store_true", help="machine-readable report, every node")
    df.set_defaults(func=cmd_diff)


def add_which(sub) -> None:
    wh = sub.add_parser(
        "which", help="which CPU profile and flash-attention setting reproduce an engine's logits",
        description="Run LOGITS' token ids through MODEL in every candidate (CPU profile x flash "
                    "attention) and count the rows equal bit for bit; name the candidates that "
                    "reproduce every row, else the nearest and its first differing row. Exit 0 when "
                    "one matches, 1 when none does, 2 on bad input or when no candidate can be run "
                    "(what each needs not emulated: nothing compared) (docs/trace.md).",
        formatter_class=Help)
    wh.add_argument("logits", metavar="LOGITS",
                    help=".npz (tokens, logits[, columns, split]), a trace, or .npy with --tokens")
    wh.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    wh.add_argument("--tokens", default=None, metavar="IDS", help="the token ids of an .npy")
    wh.add_argument("--split", type=decimal, default=None, metavar="N",
                    help="the engine ran the first N ids in one call, then one per call")
    wh.add_argument("--cpu", default=None, metavar="P1,P2", help="candidate profiles (default: all)")
    wh.add_argument("--flash-attn", choices=["off", "on", "both", "auto"], default="both",
                    help="candidate flash-attention settings; auto: each profile's own default, as "
                         "`generate` takes it (on for the v0.4.0 profiles, off for the others, on for all "
                         "with a block-type V cache); both: off and on, only on with a block-type V cache")
    wh.add_argument("--cache-type-k", default=None, metavar="T", help=f"KV cache type of K: {KV_TYPES}")
    wh.add_argument("--cache-type-v", default=None, metavar="T", help="KV cache type of V")
    wh.add_argument("--fa-threads", type=decimal, default=None, metavar="N",
                    help="the engine's thread count for flash attention's split of 512+ cached "
                         "cells (llama.cpp's n_threads; it changes the bits there; default 2): the "
                         "flash-attention candidates take it")
    wh.add_argument("--ctx", type=decimal, default=None, metavar="N",
                    help="the context length the engine ran with (default: the file's n_ctx, else 512 or "
                         "the next multiple of 256 that holds the ids; phi3's LongRoPE factors depend on it)")
    wh.add_argument("--json", action="store_true", help="machine-readable output")
    wh.set_defaults(func=cmd_which)
