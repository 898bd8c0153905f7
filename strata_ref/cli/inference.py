"""`strata-ref generate`: CPU inference streamed to stdout, then the prompt
and decode speeds on stderr."""
from __future__ import annotations

import codecs
import sys

from .. import infer
from .common import (Help, below_minimum, decimal, real, KV_TYPES, cpu_problem, err, fa_threads_problem, note_once,
                     sampling_problem, seed_problem, utf8_problem)

#: the least `generate --ctx`: one prompt token and one generated
MIN_CTX = 2


def _check_generate_args(a) -> str | None:
    """The first problem with generate's options or prompt, or None."""
    bad = sampling_problem(a.temperature, a.top_k, a.top_p)
    if bad:
        return bad
    if seed_problem(a.seed):
        return seed_problem(a.seed)
    if a.max_tokens < 0:
        return f"--max-tokens must be >= 0, got {a.max_tokens}"
    from ..infer.kv_cache import cache_type, resolve_flash_attn
    try:
        cache_type(a.cache_type_k or "f16", "--cache-type-k")
        tv = cache_type(a.cache_type_v or "f16", "--cache-type-v")
        if a.flash_attn is not None:
            resolve_flash_attn(a.flash_attn, tv)
    except ValueError as e:
        msg = str(e)
        if "requires flash attention" in msg:
            msg = f"--cache-type-v {tv.name.lower()} needs --flash-attn on (or auto): " + msg
        return msg.replace("flash_attn ", "--flash-attn ", 1) if msg.startswith("flash_attn ") else msg
    bad = cpu_problem(a.cpu) or fa_threads_problem(a.fa_threads, a.flash_attn, a.cache_type_v, a.cpu)
    if bad:
        return bad
    return utf8_problem(a.args[-1])


def _names_a_model(arg: str) -> bool:
    """Whether a lone `generate` argument is a registry name or alias, ends
    in .gguf (a model file) or is an existing directory (a folder holding a
    model), rather than a prompt."""
    import os
    from ..models import ModelError, lookup
    try:
        lookup(arg)
        return True
    except ModelError:
        pass
    try:
        is_dir = os.path.isdir(os.path.expanduser(arg))
    except (OSError, ValueError):
        is_dir = False
    return arg.strip().lower().endswith(".gguf") or is_dir


def cmd_generate(a) -> int:
    bad = _check_generate_args(a)
    if bad:
        return err(bad)
    model, prompt = (None, a.args[0]) if len(a.args) == 1 else (a.args[0], a.args[1])
    if model is None and _names_a_model(prompt):
        # `generate gemma3` ran the default model on the prompt "gemma3"
        return err(f"'{prompt[:200]}' names a model but no PROMPT follows: give MODEL PROMPT "
                    "(a prompt alone may not be a registry name, end in .gguf or name a directory)")
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


def run_generate(model, prompt: str, max_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 40, top_p: float = 0.95, seed: int = 0, chat: bool = False,
                 out=None, n_ctx: int | None = None, cpu=None, err=None, cache=None) -> int:
    """`strata-ref generate`: stream `prompt` and its continuation to stdout
    (`out`), ending with one newline, then write a line with the prompt and
    decode speeds in tok/s to stderr (`err`), as llama.cpp's tools print
    their timings: stdout holds the text alone, to compare with another
    engine's.

    model: registry name, alias or GGUF path (None: the default model).
    chat: format `prompt` as one user message with the model's chat template.
    Returns 0, or 2 after one line on `err` for an n_ctx outside the range
    the model takes (`ctx_problem`). Raises ModelLoadError /
    ModelOutputError / ModelError / ChatTemplateError / ValueError with a
    message naming the problem (prompt longer than the context, unknown chat
    template, unsupported architecture, damaged model ...).
    n_ctx: context length in tokens (default: the model's training context,
    at most 4096), from 2 to the training context.
    cpu: the CPU profile (`load`), named in the speed line; when it is the
    native one and llama.cpp's native build on this CPU would take code that
    no profile reproduces, a note on `err` says so, once per model cache
    (`common.note_once`, `strata_ref.cpu.native_note`).
    err: where the speed line, the n_ctx error and the note go (default
    sys.stderr).
    cache: KV cache options (`kv_cache.KVCache`: type_k, type_v, flash_attn,
    fa_threads), named in the speed line when not the default.
    """
    from .. import cpu as _cpu
    from .._env import env_value
    from .._progress import progress_bar
    from ..infer.chat import format_chat
    if int(max_tokens) < 0:
        raise ValueError(f"--max-tokens must be >= 0, got {max_tokens}")
    from ..infer.sampling import Sampler
    out = out or sys.stdout
    errs = err or sys.stderr
    prof = _cpu.select(cpu)
    cache = dict(cache or {})
    # the lower bound before the model is loaded (or fetched), the upper after
    bad_ctx = below_minimum("--ctx", n_ctx, MIN_CTX, "one prompt token and one generated")
    if not bad_ctx:
        m = infer.load(model, cpu=prof, **cache)
        bad_ctx = infer.ctx_problem(n_ctx, m)
    if bad_ctx:
        print(f"strata-ref: error: {bad_ctx}", file=errs)
        return 2
    name = cpu if cpu is not None else env_value(_cpu.ENV) or "native"
    # "native", "v0.4.0-native" or an alias: named after the profile it chose
    chosen = name.strip().lower() if isinstance(name, str) else ""
    native = chosen in _cpu.NATIVE_NAMES or chosen in _cpu.ALIASES
    tok = m.tokenizer
    if chat:
        text = format_chat(m.metadata.get("tokenizer.chat_template"),
                           [{"role": "user", "content": prompt}])
        ids = tok.encode(text, add_special=True, parse_special=True)
    else:
        ids = tok.encode(prompt, add_special=True, parse_special=False)
    if not ids and not prompt:
        raise ValueError("the prompt is empty (and the model adds no BOS token): give some text")
    if not ids:
        # the tokenizer drops characters and bytes its vocabulary lacks
        raise ValueError(f"the prompt gives no tokens: the vocabulary (`tokenizer.ggml.tokens`, "
                         f"{tok.n_vocab} tokens) has none of its characters or bytes")
    ctx = m.new_cache(n_ctx).n_ctx if n_ctx is not None else min(m.hp.n_ctx_train, 4096)
    if len(ids) >= ctx:
        raise ValueError(f"the prompt has {len(ids)} tokens and the context holds {ctx}: it needs "
                         f"at least {len(ids) + 1} (one generated token)"
                         + ("" if n_ctx else (f"; raise it with --ctx, up to {m.hp.n_ctx_train}"
                                              if len(ids) < m.hp.n_ctx_train else
                                              f"; the model's context is {m.hp.n_ctx_train} tokens: "
                                              f"shorten the prompt")))
    sampler = Sampler(temperature, top_k, top_p, seed)
    m.prepare()
    # one throwaway token loads the compiled kernels, so the speed line
    # measures the model rather than numba's cache
    m.forward(ids[:1] or [0], m.new_cache(1))
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    # the prompt is echoed once its pass is over, so that the bar (on the
    # same terminal) never overwrites it
    echoed = [chat]

    def echo_prompt():
        if not echoed[0]:
            out.write(prompt)
            out.flush()
            echoed[0] = True

    def emit(t):
        echo_prompt()
        out.write(dec.decode(tok.piece_bytes(t)))
        out.flush()

    # a bar for a prompt pass longer than a second, gone when it is over;
    # at once for a prompt of several chunks (the bar moves once a chunk)
    long_prompt = len(ids) > getattr(m, "CHUNK", len(ids))
    bar = progress_bar(len(ids), "prompt", "tok", delay=0.0 if long_prompt else 1.0,
                       leave=False)

    def prompt_done(n):
        bar.update(n)
        if bar.n >= len(ids):
            bar.close()

    from .. import _compile_notes
    compiled_before = _compile_notes.stats()[0]
    try:
        gen, tp, td, n_dec = infer.generate(m, ids, max_tokens, sampler, n_ctx=n_ctx, on_token=emit,
                                      progress=prompt_done)
    finally:
        bar.close()
    # numba compiled kernels inside the timed passes (a first run): say so
    # beside the speeds, which then are not the kernels' own
    timed_compile = (" | the speeds include numba compiling (a first run)"
                     if _compile_notes.stats()[0] > compiled_before else "")
    echo_prompt()
    out.write(dec.decode(b"", final=True) + "\n")
    out.flush()
    p_tps = len(ids) / tp if tp > 0 else float("inf")
    # the first generated token comes from the prompt pass: the speed is
    # that of the n_dec single-token passes, the count all generated tokens
    # (none with --max-tokens 0 or 1: no speed to give)
    d_speed = f"{n_dec / td:.1f} tok/s" if td > 0 and n_dec else "no decode pass"
    # why it stopped short of max_tokens, when the context did it
    full = (f"; stopped: the context of {ctx} tokens is full" if len(gen) < int(max_tokens)
            and len(ids) + len(gen) >= ctx else "")
    def n_of(n, what):
        return f"{n} {what}" + ("" if n == 1 else "s")
    errs.write(f"[prompt: {n_of(len(ids), 'token')}, {p_tps:.1f} tok/s | decode: {n_of(len(gen), 'token')} "
               f"({n_dec} {'pass' if n_dec == 1 else 'passes'}{full}), {d_speed} | cpu: {prof.name}"
               f"{f' ({chosen})' if native else ''}"
               f"{cache_note(m)}{timed_compile}]\n")
    errs.flush()
    if chosen == "native":
        # after the speed line it explains (and never before an error)
        note_once(_cpu.native_note(), errs)
    return 0


def cache_note(m) -> str:
    """' | kv: ...' naming the KV cache, unless it is F16 without flash
    attention on a profile whose llama.cpp defaults to that (0.3.36's; on
    a v0.4.0 profile, whose default is flash attention on, either setting
    is named), else ''."""
    c = m.new_cache(1)
    if c.type_k.name == c.type_v.name == "F16" and not c.flash_attn and m.cpu.default_flash_attn is None:
        return ""
    rot = ", rotated" if c.rotated else ""
    return (f" | kv: k {c.type_k.name.lower()}, v {c.type_v.name.lower()}, flash attention "
            f"{'on' if c.flash_attn else 'off'}{rot}")


def add_generate(sub) -> None:
    ge = sub.add_parser(
        "generate", help="CPU inference: generate text from a prompt",
        usage="%(prog)s [-h] [--max-tokens N] [--temperature T] [--top-k K]\n"
              + " " * 27 + "[--top-p P] [--seed S] [--chat] [--ctx N] [--cpu PROFILE]\n"
              + " " * 27 + "[--cache-type-k T] [--cache-type-v T] [--flash-attn on|off|auto]\n"
              + " " * 27 + "[--fa-threads N] [MODEL] PROMPT",
        description="Run a GGUF model on the CPU as llama.cpp does and stream PROMPT and its "
                    "continuation to stdout, then the prompt and decode speeds to stderr.",
        formatter_class=Help)
    ge.add_argument("args", nargs="+", metavar="[MODEL] PROMPT",
                    help="optional registry model or .gguf path (default: "
                         "SmolLM2-135M-Instruct), then the prompt (quoted)")
    ge.add_argument("--max-tokens", type=decimal, default=32, metavar="N",
                    help="tokens to generate at most (0: only run the prompt)")
    ge.add_argument("--temperature", type=real, default=0.0, metavar="T",
                    help="sampling temperature; 0 is greedy (the most likely token)")
    ge.add_argument("--top-k", type=decimal, default=0, metavar="K",
                    help="sample among the K most likely tokens (0: all)")
    ge.add_argument("--top-p", type=real, default=1.0, metavar="P",
                    help="sample among the most likely tokens whose probabilities add "
                         "up to P, in (0, 1] (1: all)")
    ge.add_argument("--seed", type=decimal, default=0, metavar="S",
                    help="seed of the sampler's random numbers, 0 .. 2^32 - 1 (a 32-bit seed, "
                         "as llama.cpp's)")
    ge.add_argument("--chat", action="store_true",
                    help="format the prompt as one user message with the model's chat template")
    ge.add_argument("--ctx", type=decimal, default=None, metavar="N",
                    help="context length in tokens, from 2 to the model's training context "
                         "(default: that, at most 4096)")
    ge.add_argument("--cpu", default=None, metavar="PROFILE",
                    help="the llama.cpp CPU build whose arithmetic to reproduce: scalar, avx2, "
                         "avx512 (llama-cpp-python 0.3.36's llama.cpp), v0.4.0-x64, v0.4.0-sse42, "
                         "v0.4.0-sandybridge, v0.4.0-ivybridge, v0.4.0-piledriver, v0.4.0-haswell, "
                         "v0.4.0-skylakex, v0.4.0-zen4, v0.4.0-sapphirerapids (prebuilt llama.cpp v0.4.0 of "
                         "node-llama-cpp 3.21.1; aliases: v0.4.0-alderlake, v0.4.0-cannonlake, "
                         "v0.4.0-cascadelake, v0.4.0-icelake, v0.4.0-cooperlake), armv8.0, "
                         "armv8.2-dotprod, armv8.2-fp16, armv8.6-i8mm (0.3.36's llama.cpp built for "
                         "arm64, docs/arm64.md), native (the profile of llama.cpp's native build "
                         "on this CPU) or v0.4.0-native (the library prebuilt v0.4.0's loader "
                         "takes on this CPU); default: $STRATA_REF_CPU, else native")
    ge.add_argument("--cache-type-k", default=None, metavar="T",
                    help=f"KV cache type of K, as llama.cpp's -ctk: {KV_TYPES} (default f16); a "
                         "block type turns on llama.cpp's Hadamard rotation of q and k (not on deepseek2's "
                         "MLA cache)")
    ge.add_argument("--cache-type-v", default=None, metavar="T",
                    help="KV cache type of V, as llama.cpp's -ctv (default f16); a block type "
                         "needs flash attention and rotates v and the attention output")
    ge.add_argument("--flash-attn", default=None, metavar="on|off|auto",
                    help="flash attention (default: the emulated llama.cpp's own: off for "
                         "llama-cpp-python 0.3.36's profiles, but on for a block-type V cache; "
                         "auto, i.e. on, for the v0.4.0 profiles; auto: on, as llama.cpp "
                         "resolves it on the CPU)")
    ge.add_argument("--fa-threads", type=decimal, default=None, metavar="N",
                    help="llama.cpp's thread count to reproduce: flash attention for one token "
                         "over 512+ cached cells splits them into one chunk per thread "
                         "(default 2); needs flash attention on")
    ge.set_defaults(func=cmd_generate)
