"""`strata-ref golden make|check`: the golden files written or
recomputed, with a pass/fail table per type."""
from __future__ import annotations

import sys
from pathlib import Path

from .._text import printable
from .common import err


def cmd_golden(a) -> int:
    if a.dir is not None and not a.dir.strip():
        # an unset shell variable: never fall back to the repository's files
        return err("--dir is empty; give a directory (or leave --dir out for the repository's golden/)")
    if a.action == "make":
        return run_golden_make(a.dir)
    return run_golden_check(a.dir)


def _print_table(title: str, rows: list[dict], ok: bool, out=None) -> None:
    out = out or sys.stdout
    by_type: dict[str, list] = {}
    for r in rows:
        by_type.setdefault(r["type"], []).append(r)
    print(title, file=out)
    print(f"  {'type':<8} {'cases':>6} {'values':>10} {'pass':>6} {'fail':>5}", file=out)
    for ty, rs in by_type.items():
        npass = sum(r["status"] == "pass" for r in rs)
        print(f"  {ty:<8} {len(rs):>6} {sum(r['values'] for r in rs):>10} {npass:>6} "
              f"{len(rs) - npass:>5}", file=out)
    bad = [r for r in rows if r["status"] != "pass"]
    for r in bad[:200]:
        print(f"  {r['status']:<5} {printable(r['name'])}: {r['detail']}", file=out)
    if len(bad) > 200:
        print(f"  … and {len(bad) - 200} more", file=out)
    total = sum(r["values"] for r in rows)
    print(f"  {'PASS' if ok else 'FAIL'}: {len(rows) - len(bad)}/{len(rows)} cases, "
          f"{total} values compared, {len(bad)} failing", file=out)


def _default_model_path(fetch: bool) -> Path | None:
    from ..models import DEFAULT_MODEL, ModelError, resolve
    try:
        return resolve(DEFAULT_MODEL, fetch_missing=fetch)
    except ModelError:
        return None


def _writable_dir(d: Path) -> str | None:
    """Create `d` and d/models; the problem (one line) when that fails or
    they cannot be written, else None. Checked before any long work."""
    import tempfile
    for sub in (d, d / "models"):
        try:
            sub.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=sub):
                pass
        except OSError as e:
            why = e.strerror or str(e)
            if isinstance(e, (FileExistsError, NotADirectoryError)):
                why = "a file, not a directory, is in the way"
            return f"cannot write golden files into {sub}: {why}"
    return None


def _corpus_bar(desc: str, n_cases: int):
    from .._progress import progress_bar
    return progress_bar(n_cases, desc, "case")


def _model_bar(desc: str, gguf_path):
    from .._progress import progress_bar
    from ..gguf import read
    total = sum(t.n_bytes for t in read(gguf_path).tensors)
    return progress_bar(total, desc, "B", unit_scale=True)


def run_golden_make(out_dir=None) -> int:
    """`strata-ref golden make [--dir D]`: write D/corpus.json and, for the
    registry's default model (fetched if needed), D/models/<model>.json.
    The directory is created and checked for writing first. A progress bar
    on stderr (on a terminal). Returns the exit status."""
    from .. import golden
    from ..models import DEFAULT_MODEL
    try:
        d = Path(out_dir) if out_dir else golden.default_golden_dir(for_writing=True)
    except ValueError as e:
        print(f"strata-ref: error: {e}", file=sys.stderr)
        return 2
    problem = _writable_dir(d)
    if problem:
        print(f"strata-ref: error: {printable(problem, backslash=False)}", file=sys.stderr)
        return 2
    with _corpus_bar("golden corpus", len(golden.corpus_cases())) as bar:
        doc = golden.make_corpus(d / "corpus.json", progress=lambda c: bar.update(1))
    print(f"wrote {d / 'corpus.json'}: {len(doc['cases'])} cases"
          + (f"; oracle lacks {', '.join(doc['missing_types'])}" if doc["missing_types"] else ""))
    p = _default_model_path(fetch=True)
    if p is None:
        print(f"default model {DEFAULT_MODEL} unavailable: no model golden file written")
        return 1
    with _model_bar(f"golden {DEFAULT_MODEL}", p) as bar:
        mdoc = golden.make_model_golden(p, d / "models" / f"{DEFAULT_MODEL}.json", progress=bar.update)
    print(f"wrote {d / 'models' / (DEFAULT_MODEL + '.json')}: {mdoc['n_tensors']} tensors")
    return 0


def run_golden_check(golden_dir=None) -> int:
    """`strata-ref golden check [--dir D]`: recompute D/corpus.json and every
    D/models/<name>.json whose model is in the cache (others are reported as
    skipped), print pass/fail tables; exit status 0 only if all pass. A
    progress bar on stderr (on a terminal)."""
    from .. import golden
    from ..models import ModelError, resolve
    try:
        d = Path(golden_dir) if golden_dir else golden.default_golden_dir()
        with _corpus_bar("check corpus", len(golden.corpus_cases())) as bar:
            rows, ok = golden.check_corpus(d / "corpus.json", progress=lambda c: bar.update(1))
    except ValueError as e:
        print(f"strata-ref: error: {e}", file=sys.stderr)
        return 2
    _print_table(f"corpus ({d / 'corpus.json'})", rows, ok)
    for mf in sorted((d / "models").glob("*.json")):
        try:
            p = resolve(mf.stem, fetch_missing=False)
        except ModelError as e:
            print(f"model {mf.stem}: skipped ({e})")
            continue
        with _model_bar(f"check {mf.stem}", p) as bar:
            mrows, mok = golden.check_model_golden(p, mf, progress=bar.update)
        _print_table(f"model {mf.stem}", mrows, mok)
        ok &= mok
    return 0 if ok else 1


def add_golden(sub) -> None:
    g = sub.add_parser("golden", help="golden hash files: make or check")
    g.add_argument("action", choices=["make", "check"],
                   help="make: write the golden files; check: recompute and compare them")
    g.add_argument("--dir", default=None, help="golden directory (default: the repository's golden/)")
    g.set_defaults(func=cmd_golden)
