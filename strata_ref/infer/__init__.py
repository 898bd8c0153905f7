"""CPU inference: run a GGUF model (llama, qwen2, qwen3, gemma3, phi3, gemma4; the
mixture-of-experts qwen3moe, glm4moe, deepseek2 (MLA) and gpt-oss; the hybrid qwen3next,
qwen35moe and qwen35) on the CPU the way a given llama.cpp CPU build does, with
weights kept quantized.

Modules: `archs` (the table of architectures, one row each), `model`
(hyperparameters, tensors, the `Model` base class), `loader` (`load` by
architecture), the graphs `dense`, `moe` (with `mla`, deepseek2's attention), `hybrid`, `gemma4`, the blocks they share
(`layers`: attention, gated FFN) whose arithmetic is written once
(`blocks`) and run eagerly (`eager`) or compiled (`compiled`),
`kv_cache` (KV cache, recurrent state), `trace` (the recording hook),
`expert_check` (one MoE layer against the GPU expert route),
`tokenizer`, `sampling`, `chat`. The arithmetic is `strata_ref.cpu`'s, in the CPU profile chosen at
load (`load(..., cpu=...)`, `$STRATA_REF_CPU`, else the native build's).
See docs/inference.md for the agreement with llama.cpp and the speed.
"""
from __future__ import annotations

import time

__all__ = ["load", "generate", "ctx_problem"]


def load(model=None, cpu=None, **cache_options):
    """Load a model by registry name, alias or GGUF path (None: the default
    model of `strata_ref.models`) to run in the CPU profile `cpu` ("scalar",
    "avx2", "avx512", "native" or a `strata_ref.cpu.Profile`; None:
    `$STRATA_REF_CPU`, else "native"). `cache_options` are the KV cache's
    (`kv_cache.KVCache`: type_k, type_v, flash_attn, rotate, fa_threads),
    used by every `new_cache` of the model. Raises ValueError for an
    unknown profile (before anything is read) or a cache option the model
    cannot take, ModelLoadError / GGUFError for a model that cannot run;
    TypeError for profile= (the loader's name: here it is cpu=)."""
    if "profile" in cache_options:
        raise TypeError("strata_ref.infer.load takes the CPU profile as cpu=..., not profile=")
    from .. import cpu as _cpu
    from ..models import resolve
    from .loader import load as _load
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


def ctx_problem(n_ctx, m) -> str | None:
    """Why `strata-ref generate --ctx n_ctx` cannot run model `m`, as one
    line stating the range it takes, or None (n_ctx None: the default).
    The range is 2 .. the model's training context: `Model.new_cache` takes
    1 .. that, but a context of 1 holds the prompt's first token and no
    generated one (the command checks the lower bound before loading the
    model: `cli.inference.MIN_CTX`)."""
    if n_ctx is None:
        return None
    hi = m.hp.n_ctx_train
    if 2 <= int(n_ctx) <= hi:
        return None
    return (f"--ctx {n_ctx} is outside 2 .. {hi} (2: one prompt token and one generated; "
            f"{hi}: the model's training context, `{m.hp.arch}.context_length`)")
