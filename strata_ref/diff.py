"""`strata-ref diff A B`: two traces (`strata_ref.tracefile`) compared node by
node in A's graph order: where the first difference appears, with its op
and layer, how large it is in ulps, where in the tensor it sits, and how
it grows through the layers.

Nodes are matched by (call, name, op, occurrence): the n-th node of that
name and op in that call (`TraceEntry.key`). A map (`load_map`) renames
B's nodes first, for a trace whose engine names them otherwise (a
PyTorch hidden-states dump written with `tracefile.TraceWriter`); a mapped
node matches on (call, name, occurrence), whatever its op. Memory: one
pair of tensors at a time.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from .tracefile import MODEL_KEYS, Trace, TraceEntry
from .ulp import compare_bits, locate, worst

__all__ = ["TensorResult", "DiffReport", "diff_traces", "load_map", "check_same_run"]


@dataclass
class TensorResult:
    """One matched node: equal bits or not and, when not, the ulp
    distribution of the differing number pairs (max, median, count) and
    the first differing element (`ulp.locate` plus both values)."""
    a: TraceEntry
    b: TraceEntry
    equal: bool
    n: int = 0
    n_diff: int = 0
    nan_vs_number: int = 0
    max_ulp: int | None = None
    median_ulp: float | None = None
    max_abs: float | None = None
    rel: float | None = None          # max |A - B| / max |B|
    first: dict | None = None
    problem: str = ""                 # shape or dtype that differs
    worst: list = field(default_factory=list)

    def json(self) -> dict:
        d = {"seq": self.a.seq, "call": self.a.call, "name": self.a.name, "op": self.a.op,
             "layer": self.a.layer, "shape": list(self.a.shape), "equal": self.equal}
        if self.b.name != self.a.name or self.b.op != self.a.op:
            d["b_name"], d["b_op"] = self.b.name, self.b.op
        if not self.equal:
            d.update(n=self.n, n_diff=self.n_diff, nan_vs_number=self.nan_vs_number, max_ulp=self.max_ulp,
                     median_ulp=self.median_ulp, max_abs_diff=self.max_abs, rel_diff=self.rel,
                     first_diff=self.first, worst=self.worst)
            if self.problem:
                d["problem"] = self.problem
        return d


@dataclass
class DiffReport:
    a: Trace
    b: Trace
    results: list
    only_a: list
    only_b: list
    order: dict | None               # first pair of matched nodes in another order in B
    notes: list

    @property
    def equal(self) -> bool:
        return bool(self.results) and all(r.equal for r in self.results)

    @property
    def first_diff(self) -> TensorResult | None:
        return next((r for r in self.results if not r.equal), None)

    def layers(self) -> list:
        """Per layer (in order): nodes compared, nodes differing, the
        largest ulp distance and the largest max |A - B| / max |B| over
        its nodes, the NaN-against-number values (no ulp distance), and that ratio at its output (the layer's last node in
        each call, `l_out` in most graphs; the largest over the calls)."""
        rows: dict = {}
        last: dict = {}
        for r in self.results:
            il = r.a.layer
            if il is None:
                continue
            row = rows.setdefault(il, {"layer": il, "nodes": 0, "differing": 0, "max_ulp": 0,
                                       "max_rel": 0.0, "nan_vs_number": 0, "out": None, "out_rel": 0.0})
            row["nodes"] += 1
            last[(r.a.call, il)] = r
            if not r.equal:
                row["differing"] += 1
                row["max_ulp"] = max(row["max_ulp"], r.max_ulp or 0)
                row["max_rel"] = max(row["max_rel"], r.rel or 0.0)
                row["nan_vs_number"] += r.nan_vs_number or 0
        for (_, il), r in last.items():
            row = rows[il]
            row["out"] = r.a.name
            if not r.equal:
                row["out_rel"] = max(row["out_rel"], r.rel or 0.0)
        return [rows[k] for k in sorted(rows)]

    def json(self) -> dict:
        fd = self.first_diff
        return {"a": str(self.a.path), "b": str(self.b.path), "a_producer": self.a.producer,
                "b_producer": self.b.producer, "model": self.a.model, "tokens": self.a.tokens.tolist(),
                "calls": self.a.calls.tolist(), "equal": self.equal, "compared": len(self.results),
                "differing": sum(not r.equal for r in self.results),
                "first_diff": fd.json() if fd else None, "layers": self.layers(),
                "only_a": [e.name for e in self.only_a], "only_b": [e.name for e in self.only_b],
                "order": self.order, "notes": self.notes, "tensors": [r.json() for r in self.results]}


#: the largest --map file read (bytes): a map of node names is a few KiB
MAP_LIMIT = 1 << 20


def load_map(path) -> list:
    """A map of B's node names to A's (llama.cpp's): JSON, an object of
    {"B name": "A name"}, where `{il}` in both stands for any layer number
    (`"model.layers.{il}.mlp": "ffn_out-{il}"`). Returns (regex, template)
    pairs; ValueError naming the file for anything else: not a regular
    file (a device or FIFO is never read), over MAP_LIMIT bytes, a B name
    with {il} twice."""
    from ._npio import input_problem
    bad = input_problem(path)
    if bad:
        raise ValueError(f"--map {path}: {bad}")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAP_LIMIT + 1)
        if len(raw) > MAP_LIMIT:
            raise ValueError(f"--map {path}: larger than {MAP_LIMIT} bytes; a map of names is small")
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--map {path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--map {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
        raise ValueError(f"--map {path}: must be a JSON object of name strings {{\"B name\": \"A name\"}}")
    out = []
    for k, v in doc.items():
        if ("{il}" in k) != ("{il}" in v):
            raise ValueError(f"--map {path}: {k!r} -> {v!r}: {{il}} must appear on both sides or neither")
        if k.count("{il}") > 1:
            raise ValueError(f"--map {path}: {k!r}: {{il}} may appear once in a B name")
        rx = re.compile("^" + re.escape(k).replace(re.escape("{il}"), r"(?P<il>\d+)") + "$")
        out.append((rx, v))
    return out


def _mapped(name: str, mapping) -> str | None:
    for rx, tmpl in mapping:
        m = rx.match(name)
        if m:
            return tmpl.replace("{il}", m.group("il")) if "il" in rx.groupindex else tmpl
    return None


def check_same_run(a: Trace, b: Trace) -> list:
    """Refuse (ValueError, one line) two traces of different models or
    inputs: the model identity (`tracefile.MODEL_KEYS`, where both carry
    it), the token ids and the split into calls. Returns notes on run
    options that differ (flash attention, cache types)."""
    for k in MODEL_KEYS:
        if k in ("name",):
            continue
        va, vb = a.model.get(k), b.model.get(k)
        if va not in (None, "", 0) and vb not in (None, "", 0) and va != vb:
            raise ValueError(f"{a.path} and {b.path} trace different models: {k} {va!r} vs {vb!r}")
    if a.tokens.size != b.tokens.size or (a.tokens != b.tokens).any():
        n = min(a.tokens.size, b.tokens.size)
        d = np.flatnonzero(a.tokens[:n] != b.tokens[:n])
        where = f"first differing at position {int(d[0])}: {int(a.tokens[d[0]])} vs {int(b.tokens[d[0]])}" \
            if d.size else f"{a.tokens.size} vs {b.tokens.size} tokens"
        raise ValueError(f"{a.path} and {b.path} ran different token ids ({where})")
    if a.calls.size != b.calls.size or (a.calls != b.calls).any():
        raise ValueError(f"{a.path} and {b.path} split the tokens into different calls "
                         f"({a.calls.tolist()[:4]}... vs {b.calls.tolist()[:4]}...): trace both with the same --split")
    notes = []
    for k in ("flash_attn", "type_k", "type_v"):
        va, vb = a.options.get(k), b.options.get(k)
        if va is not None and vb is not None and va != vb:
            notes.append(f"{k} differs: {va} vs {vb}")
    return notes


def _compare(ea: TraceEntry, eb: TraceEntry, xa: np.ndarray, xb: np.ndarray, block: int, n_worst: int) -> TensorResult:
    if xa.shape != xb.shape:
        return TensorResult(ea, eb, False, problem=f"shape {list(xa.shape)} vs {list(xb.shape)}")
    if xa.dtype.kind == "i" or xb.dtype.kind == "i":
        if xa.dtype != xb.dtype:
            return TensorResult(ea, eb, False, problem=f"dtype {xa.dtype} vs {xb.dtype}")
        d = np.flatnonzero((xa != xb).reshape(-1))
        r = TensorResult(ea, eb, d.size == 0, n=int(xa.size), n_diff=int(d.size))
        if d.size:
            i = int(d[0])
            r.first = {**locate(i, xa.shape, block), "a": int(xa.reshape(-1)[i]), "b": int(xb.reshape(-1)[i])}
        return r
    problem = ""
    if xa.dtype != xb.dtype:
        # compared as float32 (f16 widens exactly)
        problem = f"dtype {xa.dtype} vs {xb.dtype} (compared as float32)"
        xa, xb = xa.astype(np.float32), xb.astype(np.float32)
    c = compare_bits(xa, xb)
    r = TensorResult(ea, eb, c["n_diff"] == 0, n=c["n"], n_diff=c["n_diff"], nan_vs_number=c["nan_vs_number"],
                     problem=problem if c["n_diff"] else "")
    if c["n_diff"]:
        u = c["ulps"]
        if u.size:
            r.max_ulp = int(u.max())
            r.median_ulp = float(np.median(u))
        with np.errstate(invalid="ignore", over="ignore"):
            fa, fb = xa.astype(np.float64), xb.astype(np.float64)
            fin = np.isfinite(fa) & np.isfinite(fb)
            r.max_abs = float(np.abs(fa - fb)[fin].max()) if fin.any() else None
            scale = float(np.abs(fb[fin]).max()) if fin.any() else 0.0
        r.rel = (r.max_abs / scale) if r.max_abs is not None and scale > 0 else None
        i = c["first"]
        r.first = {**locate(i, xa.shape, block), "a": float(xa.reshape(-1)[i]), "b": float(xb.reshape(-1)[i]),
                   "a_bits": _hex(xa.reshape(-1)[i]), "b_bits": _hex(xb.reshape(-1)[i])}
        r.worst = [{**locate(j, xa.shape, block), "ulps": k} for j, k in worst(u, c["diff_index"], n_worst)]
    return r


def _hex(v) -> str:
    a = np.array([v])
    return "0x" + a.view(np.uint32 if a.dtype == np.float32 else np.uint16)[0].item().to_bytes(
        a.dtype.itemsize, "big").hex()


def _tokens(name: str) -> list:
    return [t for t in re.split(r"([(),])", name) if t != ""]


def _loose_equal(x: str, y: str) -> bool:
    """Two derived names (`OP(a,b)`) equal where an unnamed source `_` on
    either side stands for any one name."""
    if "(" not in x or "(" not in y:
        return False
    tx, ty = _tokens(x), _tokens(y)
    return len(tx) == len(ty) and all(p == q or ((p == "_") != (q == "_") and p not in "(),"
                                                 and q not in "(),") for p, q in zip(tx, ty))


def _loose_pairs(only_a: list, only_b: list) -> list:
    """Unmatched nodes paired in order by call, op and `_loose_equal` names."""
    free = list(only_b)
    pairs = []
    for e in only_a:
        for i, f in enumerate(free):
            if f.call == e.call and f.op == e.op and _loose_equal(e.name, f.name):
                pairs.append((e, f))
                del free[i]
                break
    return pairs


def diff_traces(a: Trace, b: Trace, block: int = 32, mapping=None, n_worst: int = 5, progress=None) -> DiffReport:
    """Compare trace B against trace A (module docstring). block: the
    block length the first difference is placed in (32: q8_0's blocks of
    an activation row; 256: q8_K's). mapping: `load_map`'s result or None.
    Raises ValueError for traces of different models or ids
    (`check_same_run`), TraceError for a damaged entry."""
    if block < 1:
        raise ValueError(f"--block must be >= 1, got {block}")
    notes = check_same_run(a, b)
    keyed = {}
    for e in b.entries:
        if mapping:
            m = _mapped(e.name, mapping)
            k = (e.call, m, None) if m is not None else e.key[:3]
        else:
            k = e.key[:3]
        keyed.setdefault(k, []).append(e)
    used = set()
    results, only_a = [], []
    for e in a.entries:
        cands = keyed.get((e.call, e.name, e.op)) or keyed.get((e.call, e.name, None)) or []
        if e.occurrence < len(cands):
            eb = cands[e.occurrence]
        else:
            only_a.append(e)
            continue
        used.add(eb.seq)
        results.append(_compare(e, eb, a.array(e), b.array(eb), block, n_worst))
        if progress is not None:
            progress(1)
    only_b = [e for e in b.entries if e.seq not in used]
    if only_a and only_b:
        # derived names whose sources one build named and the other did not
        # (`_`): llama.cpp versions name their inputs differently
        pairs = _loose_pairs(only_a, only_b)
        if pairs:
            for ea, eb in pairs:
                results.append(_compare(ea, eb, a.array(ea), b.array(eb), block, n_worst))
            done_a, done_b = {ea.seq for ea, _ in pairs}, {eb.seq for _, eb in pairs}
            only_a = [e for e in only_a if e.seq not in done_a]
            only_b = [e for e in only_b if e.seq not in done_b]
            results.sort(key=lambda r: r.a.seq)
            notes.append(f"{len(pairs)} nodes matched with an unnamed source (`_`) standing for a named one")
    order = None
    seqs = [r.b.seq for r in results]
    for i in range(1, len(seqs)):
        if seqs[i] < seqs[i - 1]:
            order = {"a": results[i].a.name, "a_op": results[i].a.op, "after": results[i - 1].a.name,
                     "call": results[i].a.call}
            break
    return DiffReport(a, b, results, only_a, only_b, order, notes)


def _fmt_first(r: TensorResult, block: int) -> list:
    out = [f"first difference: call {r.a.call}, node {r.a.seq} `{_esc(r.a.name)}` ({r.a.op}"
           + (f", layer {r.a.layer}" if r.a.layer is not None else "") + f"), shape {list(r.a.shape)}"]
    if r.b.name != r.a.name:
        out[0] += f" (B: `{_esc(r.b.name)}`)"
    if r.problem and r.n == 0:
        out.append(f"  {r.problem}")
        return out
    out.append(f"  {r.n_diff} of {r.n} values differ (NaN against a number: {r.nan_vs_number}); ulp "
               f"max {r.max_ulp}, median {r.median_ulp:g}" if r.max_ulp is not None else
               f"  {r.n_diff} of {r.n} values differ (NaN against a number: {r.nan_vs_number})")
    if r.problem:
        out.append(f"  note: {r.problem}")
    f = r.first
    if f:
        where = f"index {f['index']} (at {tuple(f['at'])}; row {f['row']}, col {f['col']}: block {f['block']}, " \
                f"offset {f['offset']} of {block})"
        bits = f" [{f['a_bits']}] vs [{f['b_bits']}]" if "a_bits" in f else ""
        out.append(f"  first differing element: {where}: A {f['a']!r} vs B {f['b']!r}{bits}")
    if r.worst:
        out.append("  worst: " + "; ".join(f"{w['ulps']} ulp at row {w['row']} col {w['col']} (block {w['block']} "
                                           f"+{w['offset']})" for w in r.worst))
    return out


def _esc(s: str) -> str:
    from ._text import printable
    return printable(s)


def report_text(rep: DiffReport, block: int = 32, every: bool = False) -> str:
    """The `strata-ref diff` report (names escaped): the two traces, the
    verdict, the first differing node with its ulp distribution and first
    element, the growth per layer; every=True lists each node."""
    a, b = rep.a, rep.b
    n_diff = sum(not r.equal for r in rep.results)
    m = a.model
    out = [f"A: {_esc(str(a.path))} ({_esc(a.producer)})", f"B: {_esc(str(b.path))} ({_esc(b.producer)})",
           f"model {_esc(m.get('arch', '?'))}" + (f" '{_esc(m['name'])}'" if m.get("name") else "")
           + f", {a.tokens.size} tokens in {a.calls.size} call{'s' if a.calls.size != 1 else ''}; "
           f"{len(rep.results)} nodes compared, {len(rep.only_a)} only in A, {len(rep.only_b)} only in B"]
    for note in rep.notes:
        out.append(f"note: {note}")
    for side, lst in (("A", rep.only_a), ("B", rep.only_b)):
        if lst:
            names = sorted({e.name for e in lst})
            out.append(f"only in {side}: " + ", ".join(_esc(n) for n in names[:6]) + (" ..." if len(names) > 6 else ""))
    if rep.order:
        o = rep.order
        out.append(f"graph order differs: B evaluates `{_esc(o['a'])}` ({o['a_op']}) before `{_esc(o['after'])}` "
                   f"(call {o['call']})")
    else:
        out.append("graph order: the same")
    if every:
        for r in rep.results:
            s = "equal" if r.equal else (f"DIFF {r.n_diff}/{r.n}" + (f" max {r.max_ulp} ulp" if r.max_ulp is not None
                                                                     else "") + (f" {r.problem}" if r.problem else ""))
            out.append(f"  {r.a.seq:6d} {r.a.call:4d} {r.a.op:<14s} {_esc(r.a.name):<40s} "
                       f"{'x'.join(map(str, r.a.shape)):<14s} {s}")
    fd = rep.first_diff
    if fd is not None:
        out += _fmt_first(fd, block)
        layers = rep.layers()
        if layers:
            out.append("by layer: nodes differing / compared, max ulp, max |A-B|/max|B| over the nodes and at "
                       "the layer's output (its last node)")
            for row in layers:
                out.append(f"  layer {row['layer']:3d}: {row['differing']:5d} / {row['nodes']:<5d} max {row['max_ulp']:>10d} ulp"
                           f"  rel {row['max_rel']:9.3g}  {_esc(row['out'])} {row['out_rel']:9.3g}"
                           # a NaN against a number has no ulp distance: said, not shown as 0
                           + (f"  NaN vs number {row['nan_vs_number']}" if row["nan_vs_number"] else ""))
        out.append(f"DIFFERENT: {n_diff} of {len(rep.results)} nodes differ")
    else:
        out.append(f"EQUAL: all {len(rep.results)} compared nodes have the same bits")
    return "\n".join(out)
