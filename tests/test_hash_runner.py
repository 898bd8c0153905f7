"""The task runner, streamed tensor hashes, parallel model hashing, the
manifest and resuming."""
from __future__ import annotations

import json
import multiprocessing
import os
import tracemalloc

import numpy as np
import pytest
from _split import MIXED, write_mixed
from _tasks import fail_on_three, square_reporting

from strata_ref import gguf, hashing, tasks
from strata_ref.cli import main
from strata_ref.dequant import dequant
from strata_ref.hashing import (TensorSource, cpu_outputs, hash_array, hash_model,
                                hash_source, hash_tensor)
from strata_ref.types import PLAIN_TYPES, GGMLType as T, block_format


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return write_mixed(tmp_path_factory.mktemp("mixed") / "mixed.gguf")[0]


@pytest.fixture(scope="module")
def two_types(tmp_path_factory):
    """Five Q8_0 / F32 tensors: few types, so that worker processes spend
    little time compiling dequantizers."""
    rng = np.random.default_rng(7)
    ts = []
    for i in range(5):
        q = rng.integers(0, 256, (8 * (i + 1), 34), dtype=np.uint8)
        q[:, 1] &= 0x3B
        ts += [(f"blk.{i}.w", T.Q8_0, (256, i + 1), q.reshape(-1)),
               (f"blk.{i}.norm", T.F32, (64,), rng.standard_normal(64).astype(np.float32))]
    p = tmp_path_factory.mktemp("two") / "two.gguf"
    gguf.write_gguf(p, {}, ts)
    return p


def _reference(t) -> dict[str, int]:
    """A tensor's hashes from its whole dequantized output at once."""
    if t.type in PLAIN_TYPES:
        h = hash_array(np.asarray(t.data).view(block_format(t.type).field("v").dtype))
        return {d: h for d in hashing.HASH_DTYPES}
    return {d: hash_array(dequant(t.type, t.data, t.rows, t.cols, out_dtype=d))
            for d in hashing.HASH_DTYPES}


# ------------------------------------------------------------------ tasks.run

@pytest.mark.parametrize("jobs", [1, 2])
def test_run_yields_every_result_and_the_whole_progress(jobs, monkeypatch):
    # two workers even on a one-core machine (run caps jobs at cpu_count)
    monkeypatch.setattr(tasks, "cpu_count", lambda: 2)
    items = [5, 1, 8, 3, 2, 7]
    got = []
    res = dict(tasks.run(square_reporting, items, jobs=jobs, weights=items, progress=got.append))
    assert {i: r[0] for i, r in res.items()} == {i: x * x for i, x in enumerate(items)}
    assert sum(got) == sum(items)
    pids = {r[1] for r in res.values()}
    assert (pids == {os.getpid()}) if jobs == 1 else (os.getpid() not in pids)
    assert multiprocessing.active_children() == []


def test_run_starts_at_most_one_worker_per_core(monkeypatch):
    # `hash --jobs 1000` on 2 cores started a process per tensor (272) and
    # took minutes; the pool and the dask LocalCluster get cpu_count() at most
    started = []

    def pool(fn, items, jobs, weights, order, progress):
        started.append(jobs)
        return iter(())

    monkeypatch.setattr(tasks, "_run_pool", pool)
    monkeypatch.setattr(tasks, "cpu_count", lambda: 2)
    list(tasks.run(square_reporting, list(range(300)), jobs=1000))
    list(tasks.run(square_reporting, list(range(300)), jobs=2))
    list(tasks.run(square_reporting, [1, 2, 3], jobs=1000))
    assert started == [2, 2, 2]
    dask_jobs = []
    monkeypatch.setattr(tasks, "_run_dask", lambda fn, items, jobs, *rest: dask_jobs.append(jobs) or iter(()))
    list(tasks.run(square_reporting, list(range(8)), jobs=64, scheduler=tasks.SCHEDULER_LOCAL))
    list(tasks.run(square_reporting, list(range(8)), jobs=64, scheduler="tcp://10.0.0.1:8786"))
    assert dask_jobs == [2, 64]      # a remote cluster's size is its own


def test_run_in_process_keeps_item_order_and_reports_live():
    seen = []
    for i, r in tasks.run(square_reporting, [4, 6], jobs=1, weights=[4, 6], progress=seen.append):
        seen.append(("done", i))
    assert seen == [2, 2, ("done", 0), 3, 3, ("done", 1)]


def test_run_worker_error_stops_the_pool():
    with pytest.raises(ValueError, match="item three is bad"):
        list(tasks.run(fail_on_three, list(range(8)), jobs=2))
    assert multiprocessing.active_children() == []
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        tasks.run(fail_on_three, [1], jobs=0)
    with pytest.raises(ValueError, match="2 weights for 3 items"):
        tasks.run(fail_on_three, [1, 2, 4], weights=[1, 2])


# ------------------------------------------------------------------ streamed hashes

def test_streamed_hashes_equal_whole_outputs_at_any_chunk_size(mixed, monkeypatch):
    f = gguf.read(mixed)
    want = [_reference(t) for t in f.tensors]
    # 256 values: one row per chunk for 256 columns, pieces of one row for
    # 512 (Q4_K) and 1024 (Q4_1), runs of elements for I32; 100: smaller
    # than a Q4_K block, so one block per piece.
    for chunk in (256, 100, 1 << 22):
        monkeypatch.setattr(hashing, "CHUNK_VALUES", chunk)
        got = hash_model(f, jobs=1)
        assert [t.hashes for t in got.tensors] == want, chunk
        t = f.tensor("output.weight")
        assert hash_tensor(t.type, t.data, t.rows, t.cols) == want[-1]


def test_chunk_plan_covers_the_tensor_in_whole_blocks():
    # Q4_1 rows of 1024 values in 20-byte blocks of 32, 3 rows, pieces of 320
    plan = list(hashing._plan(T.Q4_1, 3 * 1024, 1024, chunk_values=330))
    assert plan[:4] == [(0, 200, 1, 320), (200, 200, 1, 320), (400, 200, 1, 320), (600, 40, 1, 64)]
    assert len(plan) == 12 and plan[4] == (640, 200, 1, 320)
    assert sum(nb for _, nb, _, _ in plan) == 3 * 640
    assert list(hashing._plan(T.Q8_0, 10 * 64, 64, chunk_values=192)) == [
        (0, 204, 3, 64), (204, 204, 3, 64), (408, 204, 3, 64), (612, 68, 1, 64)]
    assert list(hashing._plan(T.I16, 5, 5, chunk_values=2)) == [(0, 4, 1, 2), (4, 4, 1, 2), (8, 2, 1, 1)]
    assert list(hashing._plan(T.F32, 0, 0)) == []


def test_memory_is_bounded_by_a_chunk_not_the_tensor(tmp_path, monkeypatch):
    monkeypatch.setattr(hashing, "CHUNK_VALUES", 1 << 20)
    n = 1 << 23                                     # 8 Mi values: 64 MiB of outputs
    raw = np.random.default_rng(3).integers(0, 256, (n // 32, 34), dtype=np.uint8)
    raw[:, 1] &= 0x3B                               # finite fp16 scales
    p = tmp_path / "big.gguf"
    gguf.write_gguf(p, {}, [("w", T.Q8_0, (4096, n // 4096), raw.reshape(-1))])
    del raw
    t = gguf.read(p).tensors[0]
    src = TensorSource.of(p, t)
    hash_source(src)                                # every dtype compiled before measuring
    tracemalloc.start()
    try:
        h = hash_source(src)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # one chunk: 1.06 MiB read, 4 MiB of f32, 2 + 2 MiB of f16 and bf16,
    # about 4 MiB of dequant scratch; the whole output would be 64 MiB
    assert peak < 12 << 20, peak
    assert h == hash_tensor(t.type, t.data, t.rows, t.cols)


def test_producer_is_pluggable(mixed):
    # a device back end passes its own producer; one returning other bytes
    # must change the hash, one returning the same bytes must not
    f = gguf.read(mixed)
    t = f.tensor("blk.0.attn_q.weight")
    src = TensorSource.of(mixed, t)
    assert hash_source(src, producer=_same_bytes) == _reference(t)
    assert hash_source(src, ("f32",), producer=_zero_bytes)["f32"] != _reference(t)["f32"]


def _same_bytes(t, raw, rows, cols, outs):
    return {d: b.copy() for d, b in cpu_outputs(t, raw, rows, cols, outs).items()}


def _zero_bytes(t, raw, rows, cols, outs):
    return {d: np.zeros(rows * cols * 4, np.uint8) for d in outs}


def test_file_shorter_than_its_tensor_is_an_error(tmp_path, mixed):
    t = gguf.read(mixed).tensors[-1]
    short = tmp_path / "short.gguf"
    short.write_bytes(mixed.read_bytes()[:t.offset + 100])
    with pytest.raises(ValueError, match="tensor 'output.weight' ends early"):
        hash_source(TensorSource.of(short, t))


# ------------------------------------------------------------------ models, jobs, manifest

def test_jobs_do_not_change_the_hashes(mixed):
    f = gguf.read(mixed)
    one, two = hash_model(f, jobs=1), hash_model(f, jobs=2)
    assert [t.hashes for t in two.tensors] == [t.hashes for t in one.tensors]
    assert [t.hashes for t in one.tensors] == [_reference(t) for t in f.tensors]
    assert two.chained == one.chained and two.resumed == 0
    only = hash_model(f, ("bf16",), types={T.Q4_K, T.F16}, jobs=2)
    assert [t.name for t in only.tensors] == ["blk.0.attn_q.weight", "blk.0.ffn_norm.weight"]
    assert only.chained["bf16"] == hashing.chain_hashes(t.hashes["bf16"] for t in only.tensors)


def _lines(p):
    return [json.loads(x) for x in p.read_text().splitlines()]


def test_manifest_and_resume_after_a_kill(mixed, tmp_path):
    f = gguf.read(mixed)
    m = tmp_path / "m.jsonl"
    fresh = hash_model(f, jobs=1, manifest=m)
    head, *recs = _lines(m)
    assert head == {"strata_ref_manifest": 1,
                    "shards": [{"file": "mixed.gguf", "size": mixed.stat().st_size,
                                "mtime_ns": mixed.stat().st_mtime_ns}]}
    assert sorted(r["name"] for r in recs) == sorted(n for n, _, _ in MIXED)
    by_name = {t.name: t for t in fresh.tensors}
    for r in recs:
        assert r["hash"] == {d: f"{v:016x}" for d, v in by_name[r["name"]].hashes.items()}
    # a run killed while writing its fourth record
    text = m.read_text().splitlines(keepends=True)
    m.write_text("".join(text[:4]) + text[4][:25])
    done = []
    again = hash_model(f, jobs=1, manifest=m, resume=True, progress=done.append)
    assert again.resumed == 3 and again.chained == fresh.chained
    assert [t.hashes for t in again.tensors] == [t.hashes for t in fresh.tensors]
    assert sum(done) == sum(t.n_bytes for t in f.tensors)
    assert len(_lines(m)) == 1 + len(MIXED)           # the cut line is gone
    # resuming a complete manifest hashes nothing
    assert hash_model(f, manifest=m, resume=True).resumed == len(MIXED)
    # without resume the manifest starts afresh
    hash_model(f, ("f32",), types={T.Q8_0}, manifest=m)
    assert len(_lines(m)) == 2


def test_resume_recomputes_tensors_lacking_a_dtype(mixed, tmp_path):
    f = gguf.read(mixed)
    m = tmp_path / "m.jsonl"
    hash_model(f, ("f32",), types={T.Q8_0, T.Q6_K}, manifest=m)
    r = hash_model(f, ("f16", "f32"), manifest=m, resume=True)
    assert r.resumed == 0
    r = hash_model(f, ("f32",), manifest=m, resume=True)
    assert r.resumed == len(MIXED)
    assert r.chained["f32"] == hash_model(f, ("f32",)).chained["f32"]


def test_resume_refuses_another_models_or_a_damaged_manifest(mixed, tmp_path):
    f = gguf.read(mixed)
    m = tmp_path / "m.jsonl"
    other = write_mixed(tmp_path / "other.gguf", seed=1)[0]
    hash_model(gguf.read(other), ("f32",), manifest=m)
    # same sizes, other name: still another model
    with pytest.raises(ValueError, match=r"the manifest is of other.gguf \(\d+ bytes, modified \d+ ns\), "
                                         r"not of mixed.gguf"):
        hash_model(f, manifest=m, resume=True)
    m.unlink()      # a manifest of another model is refused with or without resume
    hash_model(f, ("f32",), manifest=m)
    lines = m.read_text().splitlines()
    rec = json.loads(lines[2])
    rec["type"] = "Q4_0"
    m.write_text("\n".join([lines[0], lines[1], json.dumps(rec)] + lines[3:]) + "\n")
    with pytest.raises(ValueError, match=r"line 3: tensor 'blk.0.attn_norm.weight' is Q4_0"):
        hash_model(f, manifest=m, resume=True)
    m.write_text("\n".join([lines[0], "{oops"] + lines[2:]) + "\n")
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        hash_model(f, manifest=m, resume=True)
    m.write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match="is not a strata-ref hash manifest"):
        hash_model(f, manifest=m, resume=True)
    with pytest.raises(ValueError, match="resume needs a manifest"):
        hash_model(f, resume=True)


def test_manifest_never_overwrites_another_file(mixed, tmp_path):
    # `--manifest notes.txt` replaced the file with manifest lines
    f = gguf.read(mixed)
    m = tmp_path / "notes.txt"
    m.write_text("my notes\n")
    with pytest.raises(ValueError, match="notes.txt exists and is not a strata-ref hash manifest"):
        hash_model(f, ("f32",), manifest=m)
    assert m.read_text() == "my notes\n"
    # a manifest of an earlier run is started afresh, as before
    hash_model(f, ("f32",), manifest=m.with_suffix(".jsonl"))
    hash_model(f, ("f32",), manifest=m.with_suffix(".jsonl"))


def test_resume_refuses_a_file_of_the_same_name_and_size_rewritten(tmp_path):
    """A model re-quantized in place (same name, same size, other bytes) is
    not the manifest's model: resuming it must not report the old hashes."""
    import os
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_mixed(tmp_path / "a" / "m.gguf", seed=0)[0]
    b = write_mixed(tmp_path / "b" / "m.gguf", seed=1)[0]
    assert a.stat().st_size == b.stat().st_size and a.read_bytes() != b.read_bytes()
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 1))
    m = tmp_path / "m.jsonl"
    hash_model(gguf.read(a), ("f32",), manifest=m)
    with pytest.raises(ValueError, match="the manifest is of m.gguf .*, not of m.gguf"):
        hash_model(gguf.read(b), ("f32",), manifest=m, resume=True)


def test_cli_jobs_manifest_resume(two_types, tmp_path, capsys):
    m = tmp_path / "m.jsonl"
    assert main(["hash", str(two_types), "--no-progress", "--jobs", "1"]) == 0
    ref = capsys.readouterr().out
    assert main(["hash", str(two_types), "--no-progress", "--jobs", "2", "--manifest", str(m)]) == 0
    assert capsys.readouterr().out == ref
    # the pool writes records as tensors finish; cut the manifest after two
    lines = m.read_text().splitlines(keepends=True)
    assert len(lines) == 11
    m.write_text("".join(lines[:3]))
    assert main(["hash", str(two_types), "--no-progress", "--jobs", "2", "--manifest", str(m),
                 "--resume"]) == 0
    out = capsys.readouterr()
    assert out.out == ref
    assert f"2 of 10 tensors taken from {m}" in out.err
    assert len(m.read_text().splitlines()) == 11
    assert main(["hash", str(two_types), "--resume"]) == 2
    assert "--resume needs --manifest" in capsys.readouterr().err
    assert main(["hash", str(two_types), "--jobs", "0"]) == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err
