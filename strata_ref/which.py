"""`strata-ref which LOGITS MODEL`: which CPU profile and flash-attention
setting reproduce another engine's logits bit for bit.

Each candidate (a `strata_ref.cpu` profile: scalar, avx2, avx512; flash
attention off or on) runs the same token ids through MODEL, with every
logit row computed, batched or split into calls as the engine ran them;
a row matches when every given logit has the candidate's bits. The result
lists the candidates that match every row, else the nearest (most rows
matching, then the smallest largest ulp distance) with its first
differing row.

LOGITS is (docs/trace.md, "which"):

* an .npz with `tokens` int (n,) and `logits` float32 (n, n_vocab), one
  row per position, or (n, k) with `columns` int (n, k): the vocabulary
  ids of the k values given per row (a top-k dump); optional `split` (int:
  the engine ran the first `split` ids in one call, then one per call) and
  `n_ctx` (int: the context length it ran with);
* a trace container (`strata_ref.tracefile`): its tokens, calls,
  `result_output` nodes and the `n_ctx` of its options;
* an .npy of logits (n, n_vocab), with the ids given apart (`tokens=`).
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._text import printable
from .ulp import compare_bits

__all__ = ["EngineLogits", "Candidate", "load_logits", "which", "candidate_logits", "nearest"]


@dataclass
class EngineLogits:
    """Logits of another engine: tokens int64 (n,), logits float32 (n, m),
    columns int64 (n, m) or None (m = n_vocab, every column in order),
    split (the first call's ids; None: one batched call); model: a trace's
    model identity (`tracefile.MODEL_KEYS`) or None; n_ctx: the context
    length the engine ran with, where the file says (a trace's options,
    an .npz's `n_ctx`), else None."""
    tokens: np.ndarray
    logits: np.ndarray
    columns: np.ndarray | None = None
    split: int | None = None
    source: str = ""
    model: dict | None = None
    n_ctx: int | None = None


@dataclass
class Candidate:
    profile: str
    flash_attn: bool
    rows: int
    equal_rows: int
    first_row: int | None = None          # first row that differs
    max_ulp: int | None = None            # over the differing rows' numbers
    max_abs: float = 0.0                  # largest |engine - candidate| over every given logit
    first_col: int | None = None          # vocabulary id of the first differing logit of first_row
    values: tuple | None = None           # (engine, candidate) at that logit
    row_ulps: list = field(default_factory=list)
    nan_vs_number: int = 0                # logits NaN on one side only (no distance to show)
    not_emulated: str | None = None       # what of this candidate is not emulated (not run), short
    not_emulated_where: str | None = None  # where: "on this profile", "for gemma4", ... (None: in the what)

    @property
    def matches(self) -> bool:
        return self.equal_rows == self.rows

    def json(self) -> dict:
        # a candidate not run has no distances (null, not a perfect 0)
        ran = not self.not_emulated
        return {"profile": self.profile, "flash_attn": self.flash_attn, "rows": self.rows,
                "equal_rows": self.equal_rows, "matches": self.matches, "first_differing_row": self.first_row,
                "max_ulp": self.max_ulp if ran else None, "max_abs_diff": self.max_abs if ran else None,
                "first_differing_logit": self.first_col,
                "values": list(self.values) if self.values else None, "nan_vs_number": self.nan_vs_number,
                "not_emulated": self.not_emulated, "not_emulated_where": self.not_emulated_where}

    def not_run_reason(self) -> str | None:
        """Why the candidate was not run, in words ("flash attention not
        emulated on this profile"); None when it was run."""
        if not self.not_emulated:
            return None
        if self.not_emulated_where is None:
            return self.not_emulated
        return f"{self.not_emulated} not emulated {self.not_emulated_where}"


def _ids(a, what: str, src) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "iu" or a.ndim != 1 or a.size == 0:
        raise ValueError(f"{src}: `{what}` must be a non-empty 1-D integer array, got {a.dtype} {a.shape}")
    return _as_int64(a, what, src)


def _as_int64(a: np.ndarray, what: str, src) -> np.ndarray:
    """a (integers) as int64; ValueError naming an unsigned value past
    int64's range (it would wrap to a negative id)."""
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{src}: `{what}` holds the id {int(a.max())}, past any vocabulary")
    return a.astype(np.int64)


def load_logits(path, tokens=None, split: int | None = None) -> EngineLogits:
    """Read LOGITS (module docstring); `tokens` (ids) is required for an
    .npy and overrides nothing else; `split` overrides an .npz's, and must
    agree with a trace's recorded calls. Raises ValueError (one line) for a
    file of another shape or dtype, rows that do not match the ids, columns
    out of order, a `split` that a trace's calls contradict."""
    from ._npio import NpyError, ZIP_MAGIC, input_problem, read_npy, read_npz
    path = Path(path)
    src = str(path)
    bad = input_problem(path)
    if bad:
        raise ValueError(f"{src}: {bad}")
    with open(path, "rb") as f:
        is_zip = f.read(4) == ZIP_MAGIC
    if is_zip:
        try:
            with zipfile.ZipFile(path) as z:
                is_trace = "format.npy" in z.namelist()
        except zipfile.BadZipFile:
            is_trace = False                     # read_npz says what is wrong
        if is_trace:
            return _from_trace(path, tokens, split)
        try:
            d = read_npz(path, "")
        except NpyError as e:
            raise ValueError(str(e)) from None
        if "logits" not in d:
            keys = list(d)
            more = f", ... ({len(keys) - 8} more)" if len(keys) > 8 else ""
            raise ValueError(f"{src}: no `logits` array (keys: {', '.join(keys[:8])}{more})")
        logits = d["logits"]
        toks = _ids(d["tokens"], "tokens", src) if "tokens" in d else None
        cols = d.get("columns")
        fsplit = None
        if "split" in d:
            s = d["split"]
            if s.shape != () or s.dtype.kind not in "iu":
                raise ValueError(f"{src}: `split` must be one integer, got {s.dtype} {s.shape}")
            fsplit = int(s)
        fctx = _ctx(d["n_ctx"], src) if "n_ctx" in d else None
    elif path.suffix.lower() == ".npz":
        with open(path, "rb") as f:
            empty_zip = f.read(4) == b"PK\x05\x06"          # only an end-of-archive record
        what = "an .npz archive with no arrays" if empty_zip else "not an .npz archive (no zip header)"
        raise ValueError(f"{src}: {what}; give one written by numpy.savez "
                         f"(tokens, logits[, columns, split]), a trace, or an .npy with --tokens")
    else:
        try:
            logits = read_npy(path, "", "give float32 logits (tokens, n_vocab) saved with numpy.save "
                                        "(with --tokens), or an .npz")
        except NpyError as e:
            raise ValueError(str(e)) from None
        toks, cols, fsplit, fctx = None, None, None, None
    if tokens is not None:
        given = _ids(tokens, "--tokens", src)
        if toks is not None and (toks.size != given.size or (toks != given).any()):
            raise ValueError(f"{src}: its `tokens` differ from --tokens")
        toks = given
    if toks is None:
        raise ValueError(f"{src}: no token ids: give --tokens IDS (an .npy holds only logits)")
    if logits.dtype == np.dtype(">f4"):
        logits = logits.astype("<f4")       # big-endian float32: the same values, byte-swapped
    if logits.dtype != np.float32:
        raise ValueError(f"{src}: logits are {logits.dtype}; bitwise rows need the engine's float32 values")
    if logits.ndim != 2:
        raise ValueError(f"{src}: logits must be 2-D (a row per position), got shape {logits.shape}")
    if logits.shape[1] == 0:
        raise ValueError(f"{src}: rows of 0 logits: nothing to compare")
    if logits.shape[0] != toks.size:
        raise ValueError(f"{src}: {logits.shape[0]} logit rows for {toks.size} token ids (mismatched ids: "
                         f"one row per position)")
    if cols is not None:
        cols = np.asarray(cols)
        if cols.shape != logits.shape or cols.dtype.kind not in "iu":
            raise ValueError(f"{src}: `columns` must be integers of the logits' shape {logits.shape}, "
                             f"got {cols.dtype} {cols.shape}")
        cols = _as_int64(cols, "columns", src)
        if cols.size and cols.min() < 0:
            raise ValueError(f"{src}: `columns` holds the id {int(cols.min())}; vocabulary ids are "
                             f"0 .. n_vocab - 1")
    sp = split if split is not None else fsplit
    if sp is not None and not 1 <= sp <= toks.size:
        raise ValueError(f"{src}: split {sp} must be from 1 to the {toks.size} token ids")
    return EngineLogits(toks, np.ascontiguousarray(logits), cols, sp, src, n_ctx=fctx)


def _ctx(v, src) -> int:
    """A file's n_ctx (an .npz's 0-d integer array or a trace option's
    JSON number) as an int >= 1; ValueError naming the file otherwise."""
    a = np.asarray(v)
    if a.shape != () or a.dtype.kind not in "iu" or int(a) < 1:
        raise ValueError(f"{src}: `n_ctx` must be one integer >= 1, got {printable(repr(v), backslash=False)[:80]}")
    return int(a)


def _from_trace(path, tokens, split) -> EngineLogits:
    from .tracefile import open_trace
    with open_trace(path) as t:
        outs = t.find("result_output")
        if not outs:
            raise ValueError(f"{path}: the trace has no `result_output` node")
        calls = t.calls.tolist()
        # a call of more than one ubatch (512 tokens) has a node per ubatch
        per_call = [[] for _ in calls]
        for e in outs:
            if 0 <= e.call < len(calls):
                per_call[e.call].append(e)
        lacking = [c for c, es in enumerate(per_call) if not es]
        if lacking:
            raise ValueError(f"{path}: call {lacking[0]} of {len(calls)} has no `result_output` node")
        rows = []
        for c, es in enumerate(per_call):
            got = [a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1) for a in (t.array(e) for e in es)]
            n = sum(g.shape[0] for g in got)
            if n != calls[c] or len({g.shape[1] for g in got}) != 1:
                raise ValueError(f"{path}: call {c}'s `result_output` nodes hold {n} rows of "
                                 f"{sorted({g.shape[1] for g in got})} logits for its {calls[c]} tokens")
            rows += got
        toks = t.tokens
        n_ctx = t.options.get("n_ctx")
    logits = np.concatenate(rows).astype(np.float32)
    if tokens is not None:
        g = _ids(tokens, "--tokens", path)
        if g.size != toks.size or (g != toks).any():
            raise ValueError(f"{path}: the trace's tokens differ from --tokens")
    sp = calls[0] if len(calls) > 1 else None
    if split is not None and split != (toks.size if sp is None else sp):
        # the trace records how the engine called: a --split that disagrees is a mistake
        ran = "one batched call" if sp is None else f"{sp} ids, then one per call"
        raise ValueError(f"{path}: the trace ran {ran}, not --split {split} (leave --split out for a trace)")
    if len(calls) > 1 and any(c != 1 for c in calls[1:]):
        raise ValueError(f"{path}: calls {calls[:6]}...: only a batched pass or N then one id per call "
                         f"is reproduced")
    return EngineLogits(toks, np.ascontiguousarray(logits), None, sp, str(path), dict(t.model or {}),
                        None if n_ctx is None else _ctx(n_ctx, path))


def candidate_logits(model, profile: str, flash_attn: bool, tokens, split: int | None, logits=None,
                     n_ctx: int | None = None, ctx_what: str = "n_ctx", **cache) -> np.ndarray:
    """float32 (n, n_vocab): every logit row of `tokens` through MODEL (a
    registry name or path) in `profile` with flash attention on or off,
    one batched call or split as given, at context length n_ctx
    (`infer.trace.pass_ctx`, its errors naming it `ctx_what`; None: the
    reference drivers' 512). logits: the
    `EngineLogits` to be compared, whose width is checked against the
    model's vocabulary before anything runs (ValueError)."""
    from .infer import load
    from .infer.trace import pass_ctx, trace_calls
    m = load(model, cpu=profile, flash_attn="on" if flash_attn else "off", **cache)
    if logits is not None:
        _check_width(logits, m.n_vocab)
        _check_model(logits, m)
    ids = [int(t) for t in tokens]
    bad = [t for t in ids if not 0 <= t < m.n_vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the model's vocabulary (size {m.n_vocab})")
    cache_ = m.new_cache(pass_ctx(m, len(ids), n_ctx, ctx_what))
    rows = []
    for call in trace_calls(ids, split):
        out = m.forward(call, cache_, all_logits=True)
        rows.append(out.reshape(len(call), -1))
    return np.concatenate(rows)


def _check_width(e: EngineLogits, n_vocab: int) -> None:
    """ValueError where LOGITS' rows (or its `columns`) do not fit a
    vocabulary of n_vocab entries."""
    if e.columns is not None:
        top = int(e.columns.max()) if e.columns.size else -1
        if top >= n_vocab:
            raise ValueError(f"{e.source}: its `columns` name vocabulary ids up to {top}, the model's "
                             f"vocabulary has {n_vocab} entries (0 .. {n_vocab - 1})")
    elif e.logits.shape[1] != n_vocab:
        raise ValueError(f"{e.source}: rows of {e.logits.shape[1]} logits, the model's vocabulary has "
                         f"{n_vocab} (a dump of another model?)")


def _check_model(e: EngineLogits, m) -> None:
    """ValueError where a trace's recorded model (`EngineLogits.model`)
    is not MODEL, as `diff` refuses two traces of different models."""
    if not e.model or not m.path:
        return
    from . import gguf
    from .tracefile import MODEL_KEYS, model_info
    ours = model_info(gguf.read(m.path))
    for k in MODEL_KEYS:
        a, b = e.model.get(k), ours.get(k)
        if k != "name" and a not in (None, "", 0) and b not in (None, "", 0) and a != b:
            raise ValueError(f"{e.source}: a trace of another model: {k} {a!r}, MODEL has {b!r}")


def _score(e: EngineLogits, ours: np.ndarray, profile: str, fa: bool) -> Candidate:
    _check_width(e, ours.shape[1])
    sel = ours if e.columns is None else np.take_along_axis(ours, e.columns, axis=1)
    c = Candidate(profile, fa, e.logits.shape[0], 0)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(e.logits.astype(np.float64) - sel.astype(np.float64))
    c.max_abs = float(np.nanmax(d)) if d.size and not np.isnan(d).all() else 0.0
    c.nan_vs_number = int((np.isnan(e.logits) != np.isnan(sel)).sum())
    for r in range(e.logits.shape[0]):
        cmp = compare_bits(e.logits[r], np.ascontiguousarray(sel[r]))
        if cmp["n_diff"] == 0:
            c.equal_rows += 1
            continue
        mu = int(cmp["ulps"].max()) if cmp["ulps"].size else None
        c.row_ulps.append(mu)
        if mu is not None:
            c.max_ulp = mu if c.max_ulp is None else max(c.max_ulp, mu)
        if c.first_row is None:
            c.first_row = r
            j = cmp["first"]
            c.first_col = int(j if e.columns is None else e.columns[r, j])
            c.values = (float(e.logits[r, j]), float(sel[r, j]))
    return c


def which(logits: EngineLogits, model, profiles=None, flash_attn=(False, True), progress=None,
          n_ctx: int | None = None, **cache) -> list:
    """Every candidate (profile x flash attention) scored against the
    engine's logits (`Candidate`), in the order tried. profiles: names
    (default every `strata_ref.cpu.PROFILES`). flash_attn: the settings
    tried per profile (bools), or "auto": each profile's own default, as
    `generate` takes it (`Profile.default_flash_attn`). A candidate whose cache
    setting the profile's build computes in code not emulated yet (the arm64
    profiles' flash attention and KV cache types other than F16,
    `infer.model.unemulated_cache`), or whose model holds a weight type the
    profile has no kernel for yet (NotImplementedError), is not run: it
    comes back with `not_emulated` saying what (a short phrase: "flash
    attention", "a q8_0 K cache", "the Q4_K mat-mul (blk.0.attn_q.weight)")
    and `not_emulated_where` where ("on this profile", "for gemma4"), and
    no equal rows. n_ctx: the context length the candidates run with
    (default: `logits.n_ctx`, else the drivers' default of
    `infer.trace.pass_ctx`)."""
    from .cpu import PROFILES, select
    from .infer.kv_cache import resolve_flash_attn
    from .infer.model import unemulated_cache
    ctx, ctx_what = n_ctx, "n_ctx"
    if ctx is None and logits.n_ctx is not None:
        ctx, ctx_what = logits.n_ctx, f"{logits.source}: its n_ctx"
    out = []
    for p in profiles or list(PROFILES):
        fas = flash_attn
        if isinstance(flash_attn, str) and flash_attn == "auto":
            fas = (resolve_flash_attn(select(p).default_flash_attn, cache.get("type_v") or "f16"),)
        for fa in fas:
            skip = unemulated_cache(p, dict(cache, flash_attn="on" if fa else "off"))
            where = "on this profile" if skip else None
            ours = None
            if not skip:
                try:
                    ours = candidate_logits(model, p, fa, logits.tokens, logits.split, logits=logits,
                                            n_ctx=ctx, ctx_what=ctx_what, **cache)
                except NotImplementedError as e:    # a weight type or a cache not emulated
                    # NotEmulated has the short phrase; another's message says it all
                    skip, where = getattr(e, "what", None) or str(e), getattr(e, "where", None)
            if skip:
                out.append(Candidate(p, fa, logits.logits.shape[0], 0, not_emulated=skip,
                                     not_emulated_where=where))
            else:
                out.append(_score(logits, ours, p, fa))
            if progress is not None:
                progress(1)
    return out


def nearest(cands: list) -> Candidate:
    """The candidate with the most equal rows, then the smallest largest
    |engine - candidate| (an ulp count says little once values cross
    zero); None when no candidate was run (each `not_emulated`)."""
    run = [c for c in cands if not c.not_emulated]
    return max(run, key=lambda c: (c.equal_rows, -c.max_abs)) if run else None


def report_text(e: EngineLogits, cands: list, n_ctx: int | None = None) -> str:
    """The `strata-ref which` report: what was compared (rows, calls, the
    context length: n_ctx as given, else the file's, else the drivers'
    default of `infer.trace.pass_ctx`), one line per candidate, then the
    profiles that reproduce every row, or the nearest and its first
    differing row."""
    from ._text import printable
    kind = "every logit" if e.columns is None else f"{e.logits.shape[1]} logits"
    how = ("one batched call" if e.split is None or e.split >= e.logits.shape[0]
           else f"{e.split} ids, then one per call")
    if n_ctx is not None:
        ctx = f"n_ctx {n_ctx}"
    elif e.n_ctx is not None:
        ctx = f"n_ctx {e.n_ctx} (the file's)"
    else:
        ctx = ("n_ctx the drivers' default (512, or the next multiple of 256 that holds the ids, at most the "
               "training context)")
    out = [f"{printable(e.source)}: {e.logits.shape[0]} rows ({kind} each), {how}, {ctx}"]
    w = max([7] + [len(c.profile) for c in cands])
    for c in cands:
        if c.not_emulated:
            out.append(f"  {c.profile:<{w}s} flash attention {'on ' if c.flash_attn else 'off'}: "
                       f"not run ({printable(c.not_run_reason())})")
            continue
        extra = "" if c.matches else (f"  first differing row {c.first_row}, max |difference| {c.max_abs:.3g}"
                                      + (f" over the numbers, {c.nan_vs_number} NaN against numbers"
                                         if c.nan_vs_number else ""))
        out.append(f"  {c.profile:<{w}s} flash attention {'on ' if c.flash_attn else 'off'}: "
                   f"{c.equal_rows:>4d}/{c.rows} rows bitwise{extra}")
    hits = [c for c in cands if c.matches]
    if hits:
        out.append("reproduced by: " + ", ".join(f"{c.profile} (flash attention {'on' if c.flash_attn else 'off'})"
                                                 for c in hits))
    else:
        n = nearest(cands)
        if n is None:
            out.append("no candidate was run: what each one needs is not emulated yet (its line says what)")
            return "\n".join(out)
        out.append(f"no candidate reproduces every row; nearest: {n.profile} (flash attention "
                   f"{'on' if n.flash_attn else 'off'}), {n.equal_rows}/{n.rows} rows; its first differing row "
                   f"{n.first_row} (token {int(e.tokens[n.first_row])}): logit of id {n.first_col}, engine "
                   f"{n.values[0]!r} vs {n.values[1]!r}")
    return "\n".join(out)
