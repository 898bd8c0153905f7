"""KL divergence on the positions a model generates.

REF generates from each prompt (greedy, or seeded sampling): its logits at
each generated position come from the incremental pass, one token per call,
as a user's generation computes them. TEST is teacher-forced on REF's
prompt and tokens in one batched pass. At every generated position j (the
distribution that produced REF's token j):

    KL_j = sum_v p_v (log p_v - log q_v),  p = softmax(REF row), q = softmax(TEST row)

over the whole vocabulary, in float64 from the float32 logits. Prompt
positions never count; with `chat` the prompt is the chat template's user
turn, so only the assistant's tokens count. The noise floor is the same
statistics for REF against REF's own batched pass over the same tokens:
how much two float orders of one model differ (llama.cpp's runs differ
the same way), the scale below which a TEST's KL says nothing.

Statistics (`summarize`): mean with its standard error, median, p90, p99,
p99.9 and max of KL; top-1 agreement (argmax of TEST = argmax of REF); Δp =
q(tok) - p(tok) for REF's token, its mean and 1st percentile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PromptResult", "log_softmax", "kl_rows", "summarize", "reference_pass", "teacher_forced",
           "run_kl", "run_kl_many", "write_reference_tokens", "load_test_logits", "run_kl_external"]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax of float32 rows (n, vocab); -inf logits give
    -inf. The maximum is taken off first, so that rows of large logits
    (3e38) keep their normaliser: `m + log(sum)` would round the log away."""
    z = np.asarray(logits, np.float64)
    s = z - z.max(axis=-1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def kl_rows(ref_logits: np.ndarray, test_logits: np.ndarray, tokens) -> dict:
    """Per-row KL(REF || TEST), top-1 agreement and Δp of REF's tokens:
    rows (n, vocab) float32 each, tokens (n,) the ids REF chose. Returns
    float64 arrays "kl", "dp" and bool "top1" of length n. Terms with p = 0
    add 0 (the limit); q = 0 where p > 0 gives inf."""
    lp, lq = log_softmax(ref_logits), log_softmax(test_logits)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (lp - lq), 0.0)
    kl = terms.sum(axis=-1)
    tok = np.asarray(tokens, np.int64)
    r = np.arange(len(tok))
    dp = np.exp(lq[r, tok]) - p[r, tok]
    top1 = np.argmax(ref_logits, axis=-1) == np.argmax(test_logits, axis=-1)
    return {"kl": kl, "dp": dp, "top1": top1}


def summarize(rows: dict) -> dict:
    """The statistics of the module docstring over concatenated per-row
    results (`kl_rows` outputs): a dict of floats ("n", "kl_mean",
    "kl_se", "kl_median", "kl_p90", "kl_p99", "kl_p999", "kl_max",
    "top1", "dp_mean", "dp_p1")."""
    kl, dp, top1 = rows["kl"], rows["dp"], rows["top1"]
    n = int(kl.size)
    if n == 0:
        return {"n": 0}
    se = float(kl.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    q = np.percentile(kl, [50, 90, 99, 99.9])
    return {"n": n, "kl_mean": float(kl.mean()), "kl_se": se, "kl_median": float(q[0]),
            "kl_p90": float(q[1]), "kl_p99": float(q[2]), "kl_p999": float(q[3]),
            "kl_max": float(kl.max()), "top1": float(top1.mean()), "dp_mean": float(dp.mean()),
            "dp_p1": float(np.percentile(dp, 1))}


def sequence_ctx(m, n_prompt: int, max_tokens: int, n_ctx: int | None = None) -> int:
    """The context length (tokens) every pass of one sequence runs with,
    REF's and TEST's alike: n_ctx where given, else the prompt plus
    max_tokens plus one, at most the model's training context. One length
    for all of them, as it is part of the arithmetic where RoPE depends on
    it (phi3's LongRoPE: `infer.trace.pass_ctx`). Raises ValueError for an
    n_ctx outside 1 .. the training context or too small for the
    sequence."""
    from ..infer.trace import pass_ctx
    if n_ctx is None:
        n_ctx = min(m.hp.n_ctx_train, n_prompt + max_tokens + 1)
    return pass_ctx(m, n_prompt + max_tokens, n_ctx)


def reference_pass(m, prompt_ids, max_tokens: int, sampler, n_ctx: int | None = None):
    """REF's generation: (tokens, logits) where logits (G, vocab) float32
    row j is the incremental pass's distribution that produced token j. It
    stops after an end-of-generation token (which counts) or max_tokens.
    n_ctx: the context length (`sequence_ctx`)."""
    cache = m.new_cache(sequence_ctx(m, len(prompt_ids), max_tokens, n_ctx))
    logits = m.forward(list(prompt_ids), cache)
    toks, rows = [], []
    for i in range(max_tokens):
        tok = sampler(logits)
        toks.append(tok)
        rows.append(np.array(logits, np.float32))
        if tok in m.tokenizer.eog_ids or i + 1 == max_tokens:
            break
        logits = m.forward([tok], cache)
    return toks, np.stack(rows) if rows else np.zeros((0, m.n_vocab), np.float32)


def teacher_forced(m, prompt_ids, tokens, n_ctx: int | None = None) -> np.ndarray:
    """float32 (len(tokens), vocab): m's batched pass over prompt + tokens,
    the rows that predict each of `tokens`, at context length n_ctx (None:
    `sequence_ctx`'s default for len(tokens) generated ids; pass REF's)."""
    ids = list(prompt_ids) + list(tokens)
    cache = m.new_cache(sequence_ctx(m, len(prompt_ids), len(tokens), n_ctx))
    out = m.forward(ids[:-1] if tokens else ids, cache, all_logits=True)
    return out[len(prompt_ids) - 1:]


@dataclass
class PromptResult:
    prompt: str
    n_prompt: int
    tokens: list
    test: dict = field(repr=False)
    floor: dict = field(repr=False)


def run_kl_many(ref, tests, prompts, max_tokens: int = 32, sampler=None, chat: bool = False,
                progress=None, n_ctx: int | None = None):
    """`run_kl` for several TEST models against one REF generation: tests
    is a list of loaded models. Returns (per-prompt lists of PromptResult,
    one list per test; the overall statistics per test; the floor's). The
    floor is the same for every test (REF's own batched pass). Every pass
    of a prompt runs at one context length (`sequence_ctx`; n_ctx: that
    length for every prompt)."""
    from ..infer.chat import format_chat
    from ..infer.sampling import Sampler
    for t in tests:
        if ref.n_vocab != t.n_vocab:
            raise ValueError(f"REF has {ref.n_vocab} tokens and a TEST {t.n_vocab}: KL needs one vocabulary")
    sampler = sampler or Sampler(0.0)
    results = [[] for _ in tests]
    for text in prompts:
        if chat:
            text_in = format_chat(ref.metadata.get("tokenizer.chat_template"),
                                  [{"role": "user", "content": text}])
            ids = ref.tokenizer.encode(text_in, add_special=True, parse_special=True)
        else:
            ids = ref.tokenizer.encode(text, add_special=True, parse_special=False)
        ctx = sequence_ctx(ref, len(ids), max_tokens, n_ctx)
        toks, rlog = reference_pass(ref, ids, max_tokens, sampler, ctx)
        floor = kl_rows(rlog, teacher_forced(ref, ids, toks, ctx), toks)
        for i, t in enumerate(tests):
            results[i].append(PromptResult(text, len(ids), toks,
                                           kl_rows(rlog, teacher_forced(t, ids, toks, ctx), toks), floor))
        if progress:
            progress(1)
    cat = lambda rs, key: {k: np.concatenate([getattr(r, key)[k] for r in rs]) for k in ("kl", "dp", "top1")}
    return results, [summarize(cat(rs, "test")) for rs in results], summarize(cat(results[0], "floor"))


def run_kl(ref, test, prompts, max_tokens: int = 32, sampler=None, chat: bool = False,
           progress=None, n_ctx: int | None = None):
    """KL(REF || TEST) at REF's generated positions for each prompt, and
    the noise floor (REF incremental vs REF batched). ref, test: loaded
    models (`variants.load_variant`) with the same vocabulary; prompts: str
    list; sampler: `infer.sampling.Sampler` (None: greedy); progress: called
    with 1 per prompt. Returns (per-prompt PromptResult list, overall test
    statistics, overall floor statistics). Raises ValueError when the
    models' vocabularies differ."""
    res, st, fl = run_kl_many(ref, [test], prompts, max_tokens, sampler, chat, progress, n_ctx)
    return res[0], st[0], fl


# ------------------------------------------------------------------ another engine's logits
def _encode(ref, text: str, chat: bool) -> list:
    from ..infer.chat import format_chat
    if chat:
        text = format_chat(ref.metadata.get("tokenizer.chat_template"), [{"role": "user", "content": text}])
        return ref.tokenizer.encode(text, add_special=True, parse_special=True)
    return ref.tokenizer.encode(text, add_special=True, parse_special=False)


def write_reference_tokens(path, ref, prompts, max_tokens: int = 32, sampler=None, chat: bool = False,
                           progress=None, n_ctx: int | None = None) -> int:
    """REF's generation from each prompt, for another engine to be
    teacher-forced on (`kl REF --tokens-out FILE`): an .npz with, per prompt
    i, `tokens:<i>` int32 (prompt ids + generated ids), `n_prompt:<i>`,
    `n_ctx:<i>` (the context length REF ran with, `sequence_ctx`: the
    engine should run with it too) and `prompt:<i>` (the text). The engine
    adds `logits:<i>` (`load_test_logits`). Returns the number of prompts."""
    from ..infer.sampling import Sampler
    sampler = sampler or Sampler(0.0)
    out = {}
    for i, text in enumerate(prompts):
        ids = _encode(ref, text, chat)
        ctx = sequence_ctx(ref, len(ids), max_tokens, n_ctx)
        toks, _ = reference_pass(ref, ids, max_tokens, sampler, ctx)
        out[f"tokens:{i}"] = np.array(list(ids) + list(toks), np.int32)
        out[f"n_prompt:{i}"] = np.int64(len(ids))
        out[f"n_ctx:{i}"] = np.int64(ctx)
        out[f"prompt:{i}"] = np.array(text)
        if progress:
            progress(1)
    np.savez(path, **out)
    return len(prompts)


def load_test_logits(path, n_vocab: int) -> list:
    """Another engine's logits at REF's positions (`kl REF --test-logits
    FILE`): an .npz with, per sequence i, `tokens:<i>` int (the ids it
    was teacher-forced on: prompt + REF's generation), `n_prompt:<i>` and
    `logits:<i>` float32, either one row per position (len(tokens),
    n_vocab) or only the rows that predict the generated ids (len(tokens)
    - n_prompt, n_vocab); `prompt:<i>` (text) and `n_ctx:<i>` (the context
    length the engine ran with; REF runs with it) optional. A single
    sequence may leave out the `:0`. Returns [(prompt text, ids, n_prompt,
    rows (G, n_vocab), n_ctx or None)]. Raises ValueError (one line) for
    missing keys, rows of another vocabulary or count, a bad n_ctx, and
    non-finite logits in a compared row."""
    try:
        d = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"--test-logits {path}: cannot be read as .npz ({e})") from None
    with d:
        keys = set(d.files)
        idx = sorted({int(k.split(":", 1)[1]) for k in keys if k.startswith("tokens:") and k[7:].isdigit()})
        single = not idx and "tokens" in keys
        if single:
            idx = [0]
        if not idx:
            raise ValueError(f"--test-logits {path}: no `tokens:<i>` (or `tokens`) arrays")
        out = []
        for i in idx:
            sfx = "" if single else f":{i}"
            for k in ("tokens", "n_prompt", "logits"):
                if k + sfx not in keys:
                    raise ValueError(f"--test-logits {path}: `{k}{sfx}` is missing")
            ids = np.asarray(d["tokens" + sfx])
            n_prompt = int(d["n_prompt" + sfx])
            rows = d["logits" + sfx]
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise ValueError(f"--test-logits {path}: `tokens{sfx}` must be 1-D integers")
            if not 1 <= n_prompt < ids.size:
                raise ValueError(f"--test-logits {path}: `n_prompt{sfx}` = {n_prompt} leaves no generated "
                                 f"token among {ids.size}")
            if rows.dtype != np.float32 or rows.ndim != 2 or rows.shape[1] != n_vocab:
                raise ValueError(f"--test-logits {path}: `logits{sfx}` is {rows.dtype} {rows.shape}; "
                                 f"REF needs float32 rows of {n_vocab} logits")
            g = ids.size - n_prompt
            if rows.shape[0] == ids.size:
                rows = rows[n_prompt - 1:-1]
            elif rows.shape[0] != g:
                raise ValueError(f"--test-logits {path}: `logits{sfx}` has {rows.shape[0]} rows for "
                                 f"{ids.size} ids of which {g} generated (give one row per position or per "
                                 f"generated id)")
            bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))
            if bad.size:
                row = rows[bad[0]]
                what = "NaN" if np.isnan(row).any() else "an infinite logit"
                raise ValueError(f"--test-logits {path}: `logits{sfx}` has {what} in the row that predicts "
                                 f"generated id {int(bad[0])} ({bad.size} such rows): KL needs finite logits")
            text = str(d["prompt" + sfx]) if "prompt" + sfx in keys else f"#{i}"
            ctx = None
            if "n_ctx" + sfx in keys:
                c = np.asarray(d["n_ctx" + sfx])
                if c.shape != () or c.dtype.kind not in "iu" or not ids.size <= int(c) <= 2 ** 31:
                    raise ValueError(f"--test-logits {path}: `n_ctx{sfx}` must be one integer from the "
                                     f"{ids.size} ids up, got {c.dtype} {c.shape}")
                ctx = int(c)
            out.append((text, [int(t) for t in ids], n_prompt, np.ascontiguousarray(rows), ctx))
    return out


def run_kl_external(ref, seqs, sampler=None, progress=None, n_ctx: int | None = None):
    """KL(REF || another engine) at REF's generated positions: `seqs` from
    `load_test_logits`. REF regenerates each sequence from its prompt ids
    (the same sampler as made them) and must give the file's ids, else
    ValueError naming the sequence and position (the engine's rows belong
    to other positions). REF runs at n_ctx where given, else at the
    sequence's own n_ctx, else `sequence_ctx`'s default. Returns
    (PromptResult list, test statistics, floor statistics) as `run_kl`."""
    from ..infer.sampling import Sampler
    sampler = sampler or Sampler(0.0)
    results = []
    for i, (text, ids, n_prompt, rows, *rest) in enumerate(seqs):
        want = ids[n_prompt:]
        ctx = sequence_ctx(ref, n_prompt, len(want), n_ctx if n_ctx is not None else (rest[0] if rest else None))
        toks, rlog = reference_pass(ref, ids[:n_prompt], len(want), sampler, ctx)
        if toks != want:
            j = next((k for k, (a, b) in enumerate(zip(toks, want)) if a != b), min(len(toks), len(want)))
            got = toks[j] if j < len(toks) else "end of generation"
            raise ValueError(f"sequence {i}: REF generates {got} at generated position {j}, the file has "
                             f"{want[j] if j < len(want) else 'nothing'} (mismatched ids: the logits must come "
                             f"from REF's own tokens, `strata-ref kl REF --tokens-out FILE`)")
        floor = kl_rows(rlog, teacher_forced(ref, ids[:n_prompt], toks, ctx), toks)
        results.append(PromptResult(text, n_prompt, toks, kl_rows(rlog, rows, toks), floor))
        if progress:
            progress(1)
    cat = lambda key: {k: np.concatenate([getattr(r, key)[k] for r in results]) for k in ("kl", "dp", "top1")}
    return results, summarize(cat("test")), summarize(cat("floor"))
