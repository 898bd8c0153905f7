"""The golden files: the corpus file (`corpus.json`, every case's input and
output hashes) and the per-model files (`models/<name>.json`, every
tensor's hashes and the chained hash), written and recomputed
(../shared/DESIGN.md "Golden files"; `strata-ref golden make|check`)."""
from __future__ import annotations

import json
from pathlib import Path

from .._paths import data_dir
from ..hashing import FNV64_OFFSET, fnv1a64, hash_array, hash_tensor
from ..types import UnsupportedTypeError, parse_type
from .corpus import CORPUS_SEED, CORPUS_VERSION, OUT_KINDS, Case, case_output, corpus_cases

__all__ = ["FORMAT_VERSION", "MODEL_FORMAT_VERSION", "write_golden_json", "make_corpus", "check_corpus",
           "make_model_golden", "check_model_golden", "default_golden_dir"]

#: Version of the JSON layout of the golden files (the corpus file's).
FORMAT_VERSION = 1
#: Version of the per-model golden files. 2: "chained" is
#: `hashing.chain_hashes` over the tensor hashes, and a split model lists its
#: "shards"; 1 (still checked): "chained" ran over every tensor's output bytes.
MODEL_FORMAT_VERSION = 2


def _hex(h: int) -> str:
    return f"{h:016x}"


def write_golden_json(path: Path, head: dict, items_key: str, items: list[dict], tail: dict) -> None:
    """JSON with one item per line (small, readable diffs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["{"]
    for k, v in head.items():
        lines.append(f" {json.dumps(k)}: {json.dumps(v)},")
    lines.append(f' {json.dumps(items_key)}: [')
    lines.append(",\n".join("  " + json.dumps(it, separators=(",", ":")) for it in items))
    lines.append(" ],")
    lines.append(",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in tail.items()))
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")


def _case_params(c: Case) -> dict:
    return {"name": c.name, "type": c.type.name, "rows": c.rows, "cols": c.cols,
            "row0": c.row0, "ld": c.ld, "tensor_rows": c.tensor_rows}


def make_corpus(path, progress=None, types=None) -> dict:
    """Compute every corpus case with the oracle and write `path` (JSON).

    Per case: parameters, "input" (FNV-1a 64 of the generated tensor bytes)
    and the hash per output dtype; "chained": per dtype, one FNV-1a state
    advanced over every case's canonical output in file order. Types the
    oracle cannot dequantize yet are listed under "missing_types".
    `types` limits the file to those types (tests). Returns the written
    document (as a dict)."""
    items, missing = [], []
    chain = {k: FNV64_OFFSET for k in OUT_KINDS}
    from ..hashing import canonical_bytes
    for c in corpus_cases(types):
        if c.type.name in missing:
            continue
        data = c.data()
        try:
            outs = {k: case_output(c, k, data) for k in OUT_KINDS}
        except UnsupportedTypeError:
            missing.append(c.type.name)
            continue
        it = _case_params(c)
        it["input"] = _hex(fnv1a64(data))
        for k in OUT_KINDS:
            it[k] = _hex(hash_array(outs[k]))
            chain[k] = fnv1a64(canonical_bytes(outs[k]), chain[k])
        items.append(it)
        if progress:
            progress(c)
    head = {"format": "strata-ref golden", "format_version": FORMAT_VERSION,
            "subject": "corpus", "generator": "strata_ref.golden",
            "generator_version": CORPUS_VERSION, "seed": CORPUS_SEED,
            "hash": "FNV-1a 64 of the canonical output bytes (rows x cols, row-major, "
                    "little-endian, NaN canonical, no ld padding)",
            "missing_types": missing}
    write_golden_json(path, head, "cases", items, {"chained": {k: _hex(v) for k, v in chain.items()}})
    return json.loads(Path(path).read_text())


#: A golden file is a few hundred kB; a larger "golden file" is not one.
MAX_GOLDEN_BYTES = 64 << 20


def _load(path, versions=(FORMAT_VERSION,)) -> dict:
    import os
    import stat
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            # a FIFO would block the read, a device never end
            raise ValueError(f"{path} is not a regular file")
        if st.st_size > MAX_GOLDEN_BYTES:
            raise ValueError(f"{path} has {st.st_size} bytes, more than a golden file "
                             f"holds ({MAX_GOLDEN_BYTES})")
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no golden file at {path}") from None
    except OSError as e:
        raise ValueError(f"cannot read the golden file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if (not isinstance(doc, dict) or doc.get("format") != "strata-ref golden"
            or doc.get("format_version") not in versions):
        raise ValueError(f"{path}: not a strata-ref golden file of format version "
                         f"{' or '.join(map(str, versions))}")
    for key in ("cases", "tensors"):
        items = doc.get(key, [])
        if not isinstance(items, list) or not all(isinstance(it, dict) for it in items):
            raise ValueError(f"{path}: {key!r} must be a list of objects")
        for i, it in enumerate(items):
            if not isinstance(it.get("name"), str):
                raise ValueError(f"{path}: {key}[{i}] has no \"name\" string")
    return doc


def check_corpus(path, types=None, progress=None) -> tuple[list[dict], bool]:
    """Recompute every case of the corpus file at `path` and compare.

    Returns (rows, ok): one row per case {"name", "type", "status" ("pass",
    "FAIL", "new", "gone"), "detail", "values"}; ok is True when every
    case passes and the generator version and seed match. A case whose
    generated input no longer hashes as stored fails with detail "input
    changed" (the generator, not the oracle, moved). `types` checks only
    those types (stored cases of other types are then ignored).
    `progress(case)` is called after each case. Raises ValueError for a
    missing or malformed file."""
    doc = _load(path)
    rows, ok = [], True
    if doc.get("generator_version") != CORPUS_VERSION or doc.get("seed") != CORPUS_SEED:
        ok = False
        rows.append({"name": "(file)", "type": "-", "status": "FAIL", "values": 0,
                     "detail": f"generator version/seed {doc.get('generator_version')}/"
                               f"{doc.get('seed')} != {CORPUS_VERSION}/{CORPUS_SEED}"})
    wanted = None if types is None else {parse_type(x).name for x in types}
    stored = {it["name"]: it for it in doc.get("cases", [])
              if wanted is None or it.get("type") in wanted}
    missing_types = set(doc.get("missing_types", []))
    for c in corpus_cases(types):
        it = stored.pop(c.name, None)
        values = c.rows * c.cols * len(OUT_KINDS)
        row = {"name": c.name, "type": c.type.name, "status": "pass", "detail": "", "values": values}
        if it is None:
            if c.type.name in missing_types:
                continue
            row.update(status="new", detail="case not in the golden file (run `golden make`)")
        elif {k: it.get(k) for k in _case_params(c)} != _case_params(c):
            row.update(status="FAIL", detail="case parameters changed")
        else:
            data = c.data()
            if _hex(fnv1a64(data)) != it.get("input"):
                row.update(status="FAIL", detail="input changed (generator drift)")
            else:
                try:
                    bad = [k for k in OUT_KINDS
                           if _hex(hash_array(case_output(c, k, data))) != it.get(k)]
                except UnsupportedTypeError as e:
                    bad, row["detail"] = list(OUT_KINDS), f"oracle lacks the type: {e}"
                if bad:
                    row.update(status="FAIL", detail=row["detail"] or "hash differs: " + ",".join(bad))
        ok &= row["status"] == "pass"
        rows.append(row)
        if progress:
            progress(c)
    for name, it in stored.items():
        ok = False
        rows.append({"name": name, "type": it.get("type", "?"), "status": "gone", "values": 0,
                     "detail": "in the golden file but no longer generated"})
    return rows, ok


# --------------------------------------------------------------------------
# per-model golden files

def _model_files(gguf_path) -> tuple[object, dict]:
    """(the model read, the head entries naming its file or files)."""
    from ..gguf import read
    from ..models import sha256_file
    f = read(gguf_path)
    if len(f.shards) == 1:
        p = Path(f.path)
        return f, {"file": p.name, "sha256": sha256_file(p), "size": p.stat().st_size}
    shards = [{"file": Path(s.path).name, "sha256": sha256_file(Path(s.path)),
               "size": Path(s.path).stat().st_size} for s in f.shards]
    return f, {"file": shards[0]["file"], "shards": shards}


def make_model_golden(gguf_path, out_path, progress=None, jobs: int = 1) -> dict:
    """Hash every tensor of a GGUF model (f32, f16, bf16 outputs) and write
    `out_path`: the file's sha256 (for a split set, "shards": each shard's
    file, sha256 and size), per tensor name/type/shape/hashes, and the
    chained hash per dtype (`hashing.chain_hashes`, model order): the
    numbers of `strata-ref hash`. gguf_path: a file, any shard of a split
    set, or a directory holding one model. jobs: worker processes
    (`strata_ref.tasks.run`). Returns the document."""
    from ..hashing import hash_model
    f, files = _model_files(gguf_path)
    res = hash_model(f, OUT_KINDS, jobs=jobs, progress=progress)
    items = [{"name": t.name, "type": t.type.name, "shape": list(t.shape),
              **{k: _hex(t.hashes[k]) for k in OUT_KINDS}} for t in res.tensors]
    head = {"format": "strata-ref golden", "format_version": MODEL_FORMAT_VERSION,
            "subject": "model", **files, "n_tensors": len(items)}
    write_golden_json(out_path, head, "tensors", items,
                      {"chained": {k: _hex(v) for k, v in res.chained.items()}})
    return json.loads(Path(out_path).read_text())


def check_model_golden(gguf_path, golden_path, progress=None, jobs: int = 1) -> tuple[list[dict], bool]:
    """Recompute a model's tensor hashes and compare with `golden_path`.
    Returns (rows, ok) like `check_corpus`; a different sha256 (of the file,
    or of any shard of a split set) fails at once: the golden file is for
    another model. Golden files of model format version 1 are checked
    too, their chained hash as it was defined then (serially, in this
    process)."""
    from ..hashing import hash_model
    doc = _load(golden_path, versions=(1, MODEL_FORMAT_VERSION))
    f, files = _model_files(gguf_path)
    want = doc.get("shards") or [{"file": doc.get("file"), "sha256": doc.get("sha256")}]
    have = files.get("shards") or [files]
    if [w.get("sha256") for w in want] != [h["sha256"] for h in have]:
        got = ", ".join(f"{h['file']} {h['sha256'][:16]}…" for h in have)
        exp = ", ".join(f"{w.get('file')} {str(w.get('sha256'))[:16]}…" for w in want)
        return [{"name": have[0]["file"], "type": "-", "status": "FAIL", "values": 0,
                 "detail": f"sha256 of {got} is not the golden file's {exp}"}], False
    stored = {it["name"]: it for it in doc.get("tensors", [])}
    if doc["format_version"] == 1:
        chain = {k: FNV64_OFFSET for k in OUT_KINDS}
        hashed = [(t, hash_tensor(t.type, t.data, t.rows, t.cols, OUT_KINDS, chain, progress))
                  for t in f.tensors]
    else:
        res = hash_model(f, OUT_KINDS, jobs=jobs, progress=progress)
        hashed = list(zip(f.tensors, (r.hashes for r in res.tensors)))
        chain = res.chained
    rows, ok = [], True
    for t, h in hashed:
        it = stored.pop(t.name, None)
        row = {"name": t.name, "type": t.type.name, "status": "pass", "detail": "",
               "values": t.n_elements * len(OUT_KINDS)}
        if it is None:
            row.update(status="new", detail="tensor not in the golden file")
        else:
            bad = [k for k in OUT_KINDS if _hex(h[k]) != it.get(k)]
            if bad:
                row.update(status="FAIL", detail="hash differs: " + ",".join(bad))
        ok &= row["status"] == "pass"
        rows.append(row)
    for name, it in stored.items():
        ok = False
        rows.append({"name": name, "type": it.get("type", "?"), "status": "gone", "values": 0,
                     "detail": "in the golden file but not in the model"})
    want_chain = doc.get("chained", {})
    if ok and any(_hex(chain[k]) != want_chain.get(k) for k in OUT_KINDS):
        ok = False
        rows.append({"name": "(chained)", "type": "-", "status": "FAIL", "values": 0,
                     "detail": "chained hash differs (tensor order changed?)"})
    return rows, ok


def default_golden_dir(for_writing: bool = False) -> Path:
    """The golden/ directory: the source checkout's, else the read-only copy
    a wheel ships inside the package (`strata_ref._paths.data_dir`).

    for_writing: only the checkout's (never write inside site-packages).
    Raises ValueError when there is none, saying to pass --dir.
    """
    try:
        return data_dir("golden", checkout_only=for_writing)
    except FileNotFoundError as e:
        why = " (golden make writes into a source checkout, never into the installed package)"
        raise ValueError(f"{e}; pass --dir{why if for_writing else ''}") from None
