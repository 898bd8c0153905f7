"""CPU inference: run a GGUF model (llama, qwen2, qwen3, gemma3; the
mixture-of-experts qwen3moe and gpt-oss; the hybrid qwen3next and
qwen35moe) on the CPU the way a given llama.cpp CPU build does, with
weights kept quantized.

Modules: `model` (shared pieces of the forward pass, `load` by
architecture), the family graphs `dense`, `moe`, `hybrid` with the blocks
they share (`layers`), `kv_cache` (KV cache, recurrent state),
`tokenizer`, `sampling`, `chat`. The arithmetic is `strata_ref.cpu`'s, in the CPU profile chosen at
load (`load(..., cpu=...)`, `$STRATA_REF_CPU`, else the native build's).
See docs/inference.md for the agreement with llama.cpp and the speed.
"""
from __future__ import annotations

import codecs
import sys
import time

__all__ = ["load", "generate", "run_generate", "ctx_problem"]


def load(model=None, cpu=None, **cache_options):
    """Load a model by registry name, alias or GGUF path (None: the default
    model of `strata_ref.models`) to run in the CPU profile `cpu` ("scalar",
    "avx2", "avx512", "native" or a `strata_ref.cpu.Profile`; None:
    `$STRATA_REF_CPU`, else "native"). `cache_options` are the KV cache's
    (`kv_cache.KVCache`: type_k, type_v, flash_attn, rotate, fa_threads),
    used by every `new_cache` of the model. Raises ValueError for an
    unknown profile (before anything is read) or a cache option the model
    cannot take, ModelLoadError / GGUFError for a model that cannot run."""
    from .. import cpu as _cpu
    from ..models import resolve
    from .model import load as _load
    prof = _cpu.select(cpu)
    return _load(resolve(model), profile=prof, **cache_options)


def generate(m, prompt_ids, max_tokens: int, sampler, n_ctx: int | None = None,
             on_token=None, progress=None):
    """Run the prompt, then sample up to `max_tokens` tokens, stopping at an
    end-of-generation token. Returns (generated ids, prompt seconds, decode
    seconds, number of single-token decode calls). `on_token(id)` is called
    for each generated token; `progress(n)` after each pass over n prompt
    tokens (the prompt runs in the model's chunks of `m.CHUNK` tokens, as
    one `forward` call splits it, so the result is the same). Raises
    ValueError when the prompt does not fit
    the context, and `model.ModelOutputError` when the logits of the prompt
    pass are non-finite or all equal, or those of a decode step non-finite
    (a damaged model: `model.check_logits`)."""
    from .model import check_logits
    try:
        whole = int(max_tokens) == max_tokens and max_tokens >= 0
    except (TypeError, ValueError, OverflowError):     # None, a string, nan, inf
        whole = False
    if not whole:
        raise ValueError(f"max_tokens must be a whole number >= 0, got {max_tokens!r}")
    cache = m.new_cache(n_ctx)
    n_prompt = len(prompt_ids)
    if n_prompt == 0:
        raise ValueError("the prompt is empty (no tokens)")
    if n_prompt >= cache.n_ctx:
        raise ValueError(f"the prompt has {n_prompt} tokens and the context holds {cache.n_ctx}: "
                         f"it needs at least {n_prompt + 1} (one generated token)")
    max_tokens = min(int(max_tokens), cache.n_ctx - n_prompt)
    out = []
    n_calls = 0
    t0 = time.perf_counter()
    step = getattr(m, "CHUNK", None) or n_prompt
    for i in range(0, n_prompt, step):
        logits = m.forward(prompt_ids[i:i + step], cache)
        if progress is not None:
            progress(min(step, n_prompt - i))
    check_logits(logits, "the prompt pass")
    t1 = time.perf_counter()
    eog = m.tokenizer.eog_ids
    for i in range(max_tokens):
        tok = sampler(logits)
        if tok in eog:
            break
        out.append(tok)
        if on_token is not None:
            on_token(tok)
        if i + 1 < max_tokens:
            logits = m.forward([tok], cache)
            n_calls += 1
            check_logits(logits, f"decode step {n_calls}", spread=False)
    t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1, n_calls


def _cache_note(m) -> str:
    """' | kv: ...' naming a KV cache that is not llama.cpp's default (F16,
    no flash attention), else ''."""
    c = m.new_cache(1)
    if c.type_k.name == c.type_v.name == "F16" and not c.flash_attn:
        return ""
    rot = ", rotated" if c.rot_k or c.rot_v else ""
    return (f" | kv: k {c.type_k.name.lower()}, v {c.type_v.name.lower()}, flash attention "
            f"{'on' if c.flash_attn else 'off'}{rot}")


#: the notes `run_generate` has printed in this process
_NOTED: set = set()


def _note_once(note: str, err) -> None:
    """Print `strata-ref: note: NOTE` on `err` (default sys.stderr) the first
    time NOTE comes up: once per model cache (a marker file under
    `cache_dir()/notes/`, named by the note's sha256, so that a changed
    note is shown again), and once per process where the cache cannot be
    written."""
    if not note or note in _NOTED:
        return
    _NOTED.add(note)
    import hashlib

    from ..models import cache_dir
    mark = cache_dir() / "notes" / hashlib.sha256(note.encode()).hexdigest()[:16]
    try:
        if mark.is_file():
            return
    except OSError:
        pass
    print(f"strata-ref: note: {note}", file=err or sys.stderr)
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(note + "\n")
    except OSError:
        pass


def ctx_problem(n_ctx, m=None) -> str | None:
    """Why `strata-ref generate --ctx n_ctx` cannot run model `m`, as one
    line stating the range it takes, or None (n_ctx None: the default).
    The range is 2 .. the model's training context: `Model.new_cache` takes
    1 .. that, but a context of 1 holds the prompt's first token and no
    generated one. With m None (before the model is loaded) only the lower
    bound is checked, and the line names the upper one in words."""
    if n_ctx is None:
        return None
    if m is None:
        if int(n_ctx) >= 2:
            return None
        return (f"--ctx {n_ctx} is outside 2 .. the model's training context (2: one prompt "
                f"token and one generated)")
    hi = m.hp.n_ctx_train
    if 2 <= int(n_ctx) <= hi:
        return None
    return (f"--ctx {n_ctx} is outside 2 .. {hi} (2: one prompt token and one generated; "
            f"{hi}: the model's training context, `{m.hp.arch}.context_length`)")


def run_generate(model, prompt: str, max_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 40, top_p: float = 0.95, seed: int = 0, chat: bool = False,
                 out=None, n_ctx: int | None = None, cpu=None, err=None, cache=None) -> int:
    """`strata-ref generate`: stream the continuation of `prompt` to stdout
    (`out`), then a line with the prompt and decode speeds in tok/s.

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
    (`_note_once`, `strata_ref.cpu.native_note`).
    err: where the n_ctx error and the note go (default sys.stderr).
    cache: KV cache options (`kv_cache.KVCache`: type_k, type_v, flash_attn,
    fa_threads), named in the speed line when not the default.
    """
    from .._env import env_value
    from .._progress import progress_bar
    from .chat import format_chat
    if int(max_tokens) < 0:
        raise ValueError(f"--max-tokens must be >= 0, got {max_tokens}")
    from .sampling import Sampler
    from .. import cpu as _cpu
    out = out or sys.stdout
    prof = _cpu.select(cpu)
    cache = dict(cache or {})
    # the lower bound before the model is loaded (or fetched), the upper after
    bad_ctx = ctx_problem(n_ctx)
    if not bad_ctx:
        m = load(model, cpu=prof, **cache)
        bad_ctx = ctx_problem(n_ctx, m)
    if bad_ctx:
        print(f"strata-ref: error: {bad_ctx}", file=err or sys.stderr)
        return 2
    name = cpu if cpu is not None else env_value(_cpu.ENV) or "native"
    native = isinstance(name, str) and name.strip().lower() == "native"
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
                         + ("" if n_ctx else f"; raise it with --ctx, up to {m.hp.n_ctx_train}"))
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

    try:
        gen, tp, td, n_dec = generate(m, ids, max_tokens, sampler, n_ctx=n_ctx, on_token=emit,
                                      progress=prompt_done)
    finally:
        bar.close()
    echo_prompt()
    out.write(dec.decode(b"", final=True))
    p_tps = len(ids) / tp if tp > 0 else float("inf")
    # the first generated token comes from the prompt pass: the speed is
    # that of the n_dec single-token passes, the count all generated tokens
    d_tps = n_dec / td if td > 0 and n_dec else 0.0
    # why it stopped short of max_tokens, when the context did it
    full = (f"; stopped: the context of {ctx} tokens is full" if len(gen) < int(max_tokens)
            and len(ids) + len(gen) >= ctx else "")
    def n_of(n, what):
        return f"{n} {what}" + ("" if n == 1 else "s")
    out.write(f"\n[prompt: {n_of(len(ids), 'token')}, {p_tps:.1f} tok/s | decode: {n_of(len(gen), 'token')} "
              f"({n_dec} {'pass' if n_dec == 1 else 'passes'}{full}), {d_tps:.1f} tok/s | cpu: {prof.name}"
              f"{' (native)' if native else ''}"
              f"{_cache_note(m)}]\n")
    out.flush()
    if native:
        # after the speed line it explains (and never before an error)
        _note_once(_cpu.native_note(), err)
    return 0
