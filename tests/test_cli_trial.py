"""The new commands (trace, diff, which, dequant, matmul, hash --tensors,
kl --tokens-out) on a new user's hostile input (issue 29's trial): output
files checked before the work by one check, written under exactly the name
given through a temporary file of a unique name; .npy / .npz inputs read by
one reader that says in one line what is wrong with a file."""
from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

from infer_helpers import tiny_model
from strata_ref.cli import main


def _err_line(capsys) -> str:
    # which's note on the candidates to run (every profile: no --cpu) is not an error line
    err = [e for e in capsys.readouterr().err.splitlines() if not e.startswith("strata-ref which: ")]
    assert len(err) == 1 and err[0].startswith("strata-ref: error: "), err
    return err[0][len("strata-ref: error: "):]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    tiny_model("qwen3", p, seed=0)
    return str(p)


@pytest.fixture
def model(tiny, tmp_path):
    """A copy of the tiny model the test may see overwritten."""
    p = tmp_path / "m.gguf"
    p.write_bytes(open(tiny, "rb").read())
    return p


def _no_work(monkeypatch):
    """The work itself fails loudly if a refused command reaches it."""
    import strata_ref.infer as infer
    import strata_ref.probe as probe

    def boom(*a, **k):
        raise AssertionError("the work ran before the output was checked")
    monkeypatch.setattr(probe, "dequant_rows", boom)
    monkeypatch.setattr(infer, "load", boom)


# ---------------------------------------------------------------- 2, 7, 12: outputs refused before the work
def test_an_output_that_is_an_input_a_users_file_or_a_device_is_refused_first(model, tmp_path, capsys,
                                                                             monkeypatch):
    _no_work(monkeypatch)
    before = model.read_bytes()
    precious = tmp_path / "precious.txt"
    precious.write_text("precious\n")
    d = tmp_path / "d"
    d.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.npz"
    os.symlink(loop, loop)
    deq = ["dequant", str(model), "blk.0.attn_q.weight", "--out"]
    tr = ["trace", str(model), "--tokens", "1,2,3", "--out"]
    cases = [
        (deq + [str(model)], f"--out {model}: must not be the input file {model}; give another name"),
        (tr + [str(model)], f"--out {model}: must not be the input file {model}; give another name"),
        (deq + [str(precious)], f"--out {precious}: the file exists and is not an empty file (a raw dump has "
                                f"no header to recognise); give another --out, or remove it"),
        (tr + [str(precious)], f"--out {precious}: the file exists and is not a trace container; give "
                               f"another --out, or remove it"),
        (tr + [str(d)], f"--out {d}: a directory; give a file name, such as {d / 'trace.npz'}"),
        (tr + [str(fifo)], f"--out {fifo}: exists and is not a regular file (a device, pipe or socket); "
                           f"give a file name"),
        (deq + ["/dev/null"], "--out /dev/null: exists and is not a regular file (a device, pipe or socket); "
                              "give a file name"),
        (deq + [str(loop)], f"--out {loop}: a symbolic link loop (it leads back to itself)"),
        (deq + [str(tmp_path / "nope" / "x.npy")], f"--out {tmp_path / 'nope' / 'x.npy'}: "
                                                   f"{tmp_path / 'nope'} is not a directory"),
        (["matmul", str(model), "blk.0.attn_q.weight", "--activations", "x.npy", "--route", "cpu",
          "--out", str(precious)], f"--out {precious}: the file exists and is not a .npy file; give "
                                   f"another --out, or remove it"),
    ]
    for argv, msg in cases:
        assert main(argv) == 2, argv
        assert _err_line(capsys) == msg
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert main(deq + [str(ro / "x.npy")]) == 2
        assert _err_line(capsys).startswith(f"--out {ro / 'x.npy'}: cannot write into {ro}: ")
    assert model.read_bytes() == before and precious.read_text() == "precious\n"
    assert sorted(os.listdir(tmp_path)) == ["d", "fifo", "loop.npz", "m.gguf", "precious.txt"] + \
        (["ro"] if os.geteuid() != 0 else [])


def test_kl_tokens_out_keeps_an_engines_logits_and_writes_the_name_given(tiny, tmp_path, capsys):
    theirs = tmp_path / "theirs.npz"
    np.savez(theirs, **{"tokens:0": np.arange(3, dtype=np.int32), "logits:0": np.ones((3, 4), np.float32)})
    before = theirs.read_bytes()
    argv = ["kl", tiny, "--limit", "1", "--max-tokens", "2", "--cpu", "avx2", "--tokens-out"]
    assert main([*argv, str(theirs)]) == 2
    assert _err_line(capsys) == (f"--tokens-out {theirs}: the file exists and is not a token file of "
                                 f"`kl --tokens-out`; give another --tokens-out, or remove it")
    assert theirs.read_bytes() == before
    assert main([*argv, str(tmp_path)]) == 2
    assert _err_line(capsys) == f"--tokens-out {tmp_path}: a directory; give a file name, such as " \
                                f"{tmp_path / 'tokens.npz'}"
    # exactly the name given (numpy.savez alone would write tok.txt.npz), and again over itself
    out = tmp_path / "tok.txt"
    for _ in range(2):
        assert main([*argv, str(out)]) == 0
        assert capsys.readouterr().out.startswith(f"{out}: REF's tokens for 1 prompt ")
        with np.load(out) as d:
            assert sorted(d.files) == ["n_ctx:0", "n_prompt:0", "prompt:0", "tokens:0"]
    assert sorted(os.listdir(tmp_path)) == ["theirs.npz", "tok.txt"]


# ---------------------------------------------------------------- 3: the path printed is the path written
def test_matmul_and_dequant_write_exactly_the_name_given(tiny, tmp_path, capsys):
    from strata_ref.probe import dequant_rows
    x = np.linspace(-1, 1, 2 * 64, dtype=np.float32).reshape(2, 64)
    np.save(tmp_path / "x.npy", x)
    y_out = tmp_path / "y.data"
    assert main(["matmul", tiny, "blk.0.attn_q.weight", "--activations", str(tmp_path / "x.npy"),
                 "--route", "cpu", "--cpu", "avx2", "--out", str(y_out)]) == 0
    assert f"written {y_out} (float32 2 x 64)" in capsys.readouterr().out
    y = np.load(y_out)
    assert y.shape == (2, 64) and y.dtype == np.float32
    assert main(["matmul", tiny, "blk.0.attn_q.weight", "--activations", str(tmp_path / "x.npy"),
                 "--route", "cpu", "--cpu", "avx2", "--compare", str(y_out)]) == 0
    capsys.readouterr()
    d_out = tmp_path / "rows.bin"
    assert main(["dequant", tiny, "blk.0.attn_q.weight", "--rows", "2", "--out", str(d_out)]) == 0
    capsys.readouterr()
    want = dequant_rows(tiny, "blk.0.attn_q.weight", "f32", 0, 2)
    assert np.fromfile(d_out, "<u4").tobytes() == want.view(np.uint32).tobytes()
    assert sorted(os.listdir(tmp_path)) == ["rows.bin", "x.npy", "y.data"]
    # --rows 0: says rows must be >= 1
    assert main(["dequant", tiny, "blk.0.attn_q.weight", "--rows", "0", "--out", str(tmp_path / "z.npy")]) == 2
    assert _err_line(capsys) == "--rows must be >= 1, got 0"


# ---------------------------------------------------------------- 4: two writers of one trace
def test_two_trace_writers_of_one_path_never_share_a_part_file(tmp_path):
    from strata_ref.tracefile import TraceWriter, open_trace
    p = tmp_path / "same.npz"
    model = {"arch": "qwen3", "n_params": 10, "size": 20, "n_vocab": 5, "n_embd": 4, "n_layer": 1}
    w1 = TraceWriter(p, (1, 2), (2,), model, "one")
    w2 = TraceWriter(p, (1, 2), (2,), model, "two")
    w1.add(0, "MUL", "a-0", np.ones(4, np.float32))
    w2.add(0, "MUL", "a-0", np.zeros(4, np.float32))
    w2.add(0, "ADD", "b-0", np.zeros(4, np.float32))
    w1.close()
    with open_trace(p) as t:
        assert t.producer == "one" and len(t.entries) == 1
    w2.close()
    with open_trace(p) as t:
        assert t.producer == "two" and len(t.entries) == 2
        assert t.array(t.entries[0]).tolist() == [0.0] * 4
    # an error inside the `with` leaves no part file
    with pytest.raises(KeyboardInterrupt):
        with TraceWriter(p, (1, 2), (2,), model, "three"):
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["same.npz"]


# ---------------------------------------------------------------- 8, 9: one reader of .npy / .npz inputs
def _bad_files(tmp_path):
    good = tmp_path / "good.npz"
    np.savez(good, tokens=np.arange(3), logits=np.ones((3, 259), np.float32))
    raw = good.read_bytes()
    half = tmp_path / "half.npz"
    half.write_bytes(raw[:len(raw) // 2])
    crc = tmp_path / "crc.npz"
    b = bytearray(raw)
    with zipfile.ZipFile(good) as z:
        info = z.getinfo("logits.npy")
    at = info.header_offset + 30 + len(info.filename) + 200            # inside the member's data
    b[at] ^= 0xFF
    crc.write_bytes(bytes(b))
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    text = tmp_path / "text.npz"
    text.write_text("precious\n")
    loop = tmp_path / "loop.npz"
    os.symlink(loop, loop)
    return half, crc, empty, text, loop


def test_which_says_what_is_wrong_with_a_logits_file(tiny, tmp_path, capsys):
    half, crc, empty, text, loop = _bad_files(tmp_path)
    cases = [(half, f"{half}: a zip archive cut short or damaged (no zip directory at its end); give a .npz "
                    f"archive written by numpy.savez"),
             (crc, f"{crc}: member 'logits.npy' is damaged (Bad CRC-32 for file 'logits.npy'); give a .npz "
                   f"archive written by numpy.savez"),
             (empty, f"{empty}: an empty file (0 bytes)"),
             (text, f"{text}: not an .npz archive (no zip header); give one written by numpy.savez (tokens, "
                    f"logits[, columns, split]), a trace, or an .npy with --tokens"),
             (loop, f"{loop}: a symbolic link loop (it leads back to itself)"),
             (tmp_path, f"{tmp_path}: a directory, not a file"),
             ("/dev/zero", "/dev/zero: not a regular file (a device, pipe or socket)")]
    for path, msg in cases:
        assert main(["which", str(path), tiny, "--tokens", "1,2,3"]) == 2, path
        assert _err_line(capsys) == msg
    f = tmp_path / "l.npz"
    np.savez(f, tokens=np.arange(3), logits=np.ones((3, 259), np.float32), split=np.array([1, 2]))
    assert main(["which", str(f), tiny]) == 2
    assert _err_line(capsys) == f"{f}: `split` must be one integer, got int64 (2,)"
    np.savez(f, tokens=np.arange(3), logits=np.ones((3, 2), np.float32), columns=np.array([[0, -1]] * 3))
    assert main(["which", str(f), tiny]) == 2
    assert _err_line(capsys) == f"{f}: `columns` holds the id -1; vocabulary ids are 0 .. n_vocab - 1"
    # ids past the model's vocabulary (259) and rows of another width: said before anything runs
    np.savez(f, tokens=np.arange(3), logits=np.ones((3, 2), np.float32), columns=np.array([[0, 259]] * 3))
    assert main(["which", str(f), tiny]) == 2
    assert _err_line(capsys) == (f"{f}: its `columns` name vocabulary ids up to 259, the model's vocabulary "
                                 f"has 259 entries (0 .. 258)")
    assert main(["which", str(f), tiny]) == 2
    note = capsys.readouterr().err.splitlines()[0]       # every profile: the count is said first
    assert note.startswith("strata-ref which: ") and "candidates" in note and "--cpu P1,P2" in note
    np.savez(f, tokens=np.arange(3), logits=np.ones((3, 5), np.float32))
    assert main(["which", str(f), tiny]) == 2
    assert _err_line(capsys) == f"{f}: rows of 5 logits, the model's vocabulary has 259 (a dump of another model?)"
    # big-endian float32 logits are the same values (taken); an .npz with no arrays is said so
    np.savez(f, tokens=np.arange(3), logits=np.ones((3, 5), ">f4"))
    assert main(["which", str(f), tiny]) == 2
    assert _err_line(capsys) == f"{f}: rows of 5 logits, the model's vocabulary has 259 (a dump of another model?)"
    e = tmp_path / "e.npz"
    np.savez(e)
    assert main(["which", str(e), tiny]) == 2
    assert _err_line(capsys).startswith(f"{e}: an .npz archive with no arrays; give one written by numpy.savez")
    # nothing to compare is not a match; unsigned ids past int64 do not wrap to negative ones
    np.savez(f, tokens=np.arange(3), logits=np.ones((3, 0), np.float32), columns=np.zeros((3, 0), np.int64))
    assert main(["which", str(f), tiny]) == 2
    assert _err_line(capsys) == f"{f}: rows of 0 logits: nothing to compare"
    np.savez(f, tokens=np.arange(3), logits=np.ones((3, 1), np.float32), columns=np.full((3, 1), 2**64 - 1, np.uint64))
    assert main(["which", str(f), tiny]) == 2
    assert _err_line(capsys) == f"{f}: `columns` holds the id {2**64 - 1}, past any vocabulary"
    np.savez(f, tokens=np.array([1, 2, 2**63 + 5], np.uint64), logits=np.ones((3, 1), np.float32),
             columns=np.zeros((3, 1), np.int64))
    assert main(["which", str(f), tiny]) == 2
    assert _err_line(capsys) == f"{f}: `tokens` holds the id {2**63 + 5}, past any vocabulary"
    np.savez(f, tokens=np.arange(3), logits=np.ones((3, 259), np.float32), split=np.array(4))
    assert main(["which", str(f), tiny]) == 2
    assert _err_line(capsys) == f"{f}: split 4 must be from 1 to the 3 token ids"
    # the profile names of generate: any case, native; each candidate once
    np.savez(f, tokens=np.arange(3), logits=np.ones((3, 1), np.float32), columns=np.zeros((3, 1), np.int64))
    assert main(["which", str(f), tiny, "--cpu", "AVX2,avx2", "--flash-attn", "off", "--json"]) == 1
    import json
    assert [c["profile"] for c in json.loads(capsys.readouterr().out)["candidates"]] == ["avx2"]


def test_diff_and_matmul_say_what_is_wrong_with_an_input(tiny, tmp_path, capsys):
    half, crc, empty, text, loop = _bad_files(tmp_path)
    ok = tmp_path / "ok.npz"
    assert main(["trace", tiny, "--tokens", "1,2", "--out", str(ok)]) == 0
    capsys.readouterr()
    for path, msg in [(loop, f"{loop}: a symbolic link loop (it leads back to itself)"),
                      (tmp_path, f"{tmp_path}: a directory, not a file"),
                      (empty, f"{empty}: an empty file (0 bytes)")]:
        assert main(["diff", str(ok), str(path)]) == 2
        assert _err_line(capsys) == msg
    # a trace whose member's bytes were flipped: the member named
    b = bytearray(ok.read_bytes())
    with zipfile.ZipFile(ok) as z:
        info = z.getinfo("format.npy")
    b[info.header_offset + 30 + len(info.filename) + 20] ^= 0xFF
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(b))
    assert main(["diff", str(ok), str(bad)]) == 2
    assert _err_line(capsys).startswith(f"{bad}: entry 'format.npy' is damaged (Bad CRC-32")
    mm = ["matmul", tiny, "blk.0.attn_q.weight", "--route", "cpu", "--cpu", "avx2"]
    ask = "give float32 (tokens, 64) saved with numpy.save"
    np.savez(tmp_path / "x.npz", x=np.ones((1, 64), np.float32))
    cases = [(["--activations", str(empty), "--out", "y.npy"], f"--activations {empty}: an empty file (0 bytes)"),
             (["--activations", str(text), "--out", "y.npy"],
              f"--activations {text}: not a .npy file (no NumPy header); {ask}"),
             (["--activations", "/dev/zero", "--out", "y.npy"],
              "--activations /dev/zero: not a regular file (a device, pipe or socket)"),
             (["--activations", str(tmp_path / "x.npz"), "--out", "y.npy"],
              f"--activations {tmp_path / 'x.npz'}: a .npz archive, not a .npy array; {ask}"),
             (["--activations", str(text), "--compare", str(text)],
              f"--activations {text}: not a .npy file (no NumPy header); {ask}"),
             (["--activations", str(text), "--out", "y.npy", "--worst", "-1"], "--worst must be >= 0, got -1")]
    np.save(tmp_path / "x.npy", np.ones((1, 64), np.float32))
    cases.append((["--activations", str(tmp_path / "x.npy"), "--compare", str(empty)],
                  f"--compare {empty}: an empty file (0 bytes)"))
    for extra, msg in cases:
        assert main(mm + extra) == 2, extra
        assert _err_line(capsys) == msg


# ---------------------------------------------------------------- 11: diff --map
def test_diff_map_is_a_small_regular_file_of_valid_patterns(tiny, tmp_path, capsys):
    ok = tmp_path / "ok.npz"
    assert main(["trace", tiny, "--tokens", "1,2", "--out", str(ok), "--tensors", "l_out-*"]) == 0
    capsys.readouterr()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * ((1 << 20) + 1))
    twice = tmp_path / "twice.json"
    twice.write_text('{"{il}{il}": "x-{il}"}')
    for m, msg in [("/dev/zero", "--map /dev/zero: not a regular file (a device, pipe or socket)"),
                   (fifo, f"--map {fifo}: not a regular file (a device, pipe or socket)"),
                   (big, f"--map {big}: larger than 1048576 bytes; a map of names is small"),
                   (twice, f"--map {twice}: '{{il}}{{il}}': {{il}} may appear once in a B name")]:
        assert main(["diff", str(ok), str(ok), "--map", str(m)]) == 2
        assert _err_line(capsys) == msg


# ---------------------------------------------------------------- 12, 13: patterns and counts checked first
def test_trace_checks_patterns_and_counts_before_the_work(model, tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    out = str(tmp_path / "t.npz")
    tr = ["trace", str(model), "--tokens", "1,2,3", "--out", out]
    for extra, msg in [(["--tensors", "["], "--tensors: pattern '[' has an unclosed '['; write [[] for a literal ["),
                       (["--tensors", ",,"], "--tensors ',,' names no pattern; give comma-separated names or "
                                             "fnmatch globs"),
                       (["--fa-threads", "0"], "--fa-threads must be in 1 .. 512 (ggml's GGML_MAX_N_THREADS), "
                                               "got 0"),
                       (["--fa-threads", "513"], "--fa-threads must be in 1 .. 512 (ggml's GGML_MAX_N_THREADS), "
                                                 "got 513")]:
        assert main(tr + extra) == 2
        assert _err_line(capsys) == msg
    monkeypatch.undo()
    assert main(tr + ["--split", "4"]) == 2
    assert _err_line(capsys) == ("--split 4 is more than the 3 token ids (at most 3; leave it out for one "
                                 "batched call)")
    assert not os.path.exists(out)


def test_fa_threads_without_flash_attention_is_refused(tiny, capsys, monkeypatch):
    # --fa-threads sets flash attention's split only: with flash attention
    # off (given, or a 0.3.36 profile's default) it was silently unused
    from strata_ref.cli.common import fa_threads_problem
    from strata_ref.infer import load
    m = load(tiny, cpu="avx2")
    _no_work(monkeypatch)
    for extra, why in [(["--flash-attn", "off"], "--flash-attn is off"),
                       ([], "flash attention is off by default on the avx2 profile")]:
        msg = f"--fa-threads 4 needs flash attention on, but {why}: add --flash-attn on " \
              f"or leave --fa-threads out (it sets flash attention's split only)"
        assert main(["generate", "--cpu", "avx2", "--fa-threads", "4", *extra, tiny, "hi"]) == 2
        assert _err_line(capsys) == msg
        assert main(["trace", tiny, "--cpu", "avx2", "--tokens", "1,2", "--out", "t.npz", "--fa-threads", "4",
                     *extra]) == 2
        assert _err_line(capsys) == msg
    # on: given, a v0.4.0 profile's default, a block-type V cache's
    assert fa_threads_problem(4, "on", None, "avx2") is None
    assert fa_threads_problem(4, None, None, "v0.4.0-haswell") is None
    assert fa_threads_problem(4, None, "q8_0", "avx2") is None
    assert fa_threads_problem(4, "off", None, "v0.4.0-haswell").endswith("but --flash-attn is off: add "
                                                                       "--flash-attn on or leave --fa-threads "
                                                                       "out (it sets flash attention's split "
                                                                       "only)")
    # the library: new_cache names both
    with pytest.raises(ValueError, match=r"fa_threads 3 needs flash attention, but flash_attn=False turns "
                                         r"flash attention off: pass flash_attn=True"):
        m.new_cache(8, flash_attn=False, fa_threads=3)
    with pytest.raises(ValueError, match=r"fa_threads 3 needs flash attention, which is off by default on "
                                         r"the avx2 profile: pass flash_attn=True"):
        m.new_cache(8, fa_threads=3)            # avx2's default: off for an F16 V
    assert m.new_cache(8, flash_attn=True, fa_threads=3).fa_threads == 3
    # a thread count given to `load` is for its caches with flash attention:
    # a cache asked for without it takes none (it was refused)
    m = load(tiny, cpu="v0.4.0-haswell", fa_threads=3)
    assert m.new_cache(8).fa_threads == 3
    c = m.new_cache(8, flash_attn="off")
    assert not c.flash_attn and c.fa_threads == 2


def test_hash_tensors_names_a_pattern_that_matches_nothing(tiny, capsys):
    assert main(["hash", tiny, "--tensors", "blk.0.*,nomatch"]) == 2
    assert _err_line(capsys) == "--tensors: pattern 'nomatch' matches no tensor of tiny.gguf"


# ---------------------------------------------------------------- 14: an infinity is never within K ulps
def test_compare_max_ulp_never_counts_an_infinity_as_near(tiny, tmp_path, capsys):
    from strata_ref.probe import dequant_rows
    rows = np.ascontiguousarray(dequant_rows(tiny, "blk.0.attn_q.weight", "f32", 0, 2))
    finite_at = 3
    assert np.isfinite(rows.reshape(-1)[finite_at])
    rows.reshape(-1)[finite_at] = np.inf
    rows.tofile(tmp_path / "d.bin")
    args = ["compare", tiny, "blk.0.attn_q.weight", str(tmp_path / "d.bin"), "--rows", "2"]
    # the bit patterns of inf and a finite float32 are < 2**31 apart: K = 2**31 - 1 "covers" them
    assert main(args + ["--max-ulp", str((1 << 31) - 1)]) == 1
    assert "DIFFERENT (beyond --max-ulp 2147483647; 1 infinities against other values)" in capsys.readouterr().out


def test_diff_layer_line_says_nan_against_numbers(tmp_path, capsys):
    from strata_ref.tracefile import TraceWriter
    model = {"arch": "qwen3", "n_params": 10, "size": 20, "n_vocab": 5, "n_embd": 4, "n_layer": 1}
    for name, v in (("a.npz", 1.0), ("b.npz", np.nan)):
        with TraceWriter(tmp_path / name, (1, 2), (2,), model, "t") as w:
            w.add(0, "MUL", "ffn_out-0", np.full(4, v, np.float32))
    assert main(["diff", str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]) == 1
    line = [s for s in capsys.readouterr().out.splitlines() if s.startswith("  layer   0:")]
    assert len(line) == 1 and line[0].endswith("NaN vs number 4"), line


def test_which_says_nan_against_numbers(tiny, tmp_path, capsys):
    f = tmp_path / "l.npz"
    np.savez(f, tokens=np.arange(1, 4), logits=np.full((3, 1), np.nan, np.float32),
             columns=np.zeros((3, 1), np.int64))
    assert main(["which", str(f), tiny, "--cpu", "avx2", "--flash-attn", "off"]) == 1
    out = capsys.readouterr().out
    assert "first differing row 0, max |difference| 0 over the numbers, 3 NaN against numbers" in out


def test_compare_refuses_a_npy_dump_with_what_it_takes(tiny, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((2, 64), np.float32))
    assert main(["compare", tiny, "blk.0.attn_q.weight", str(tmp_path / "x.npy"), "--rows", "2"]) == 2
    assert _err_line(capsys) == (f"the dump {tmp_path / 'x.npy'} is a .npy file; compare takes raw little-endian "
                                 f"values (numpy: array.tofile(PATH); `dequant --out X.bin` writes one)")


def test_compare_suggests_another_dtype_only_when_most_values_differ(tiny, tmp_path, capsys):
    from strata_ref.probe import dequant_rows
    rows = np.ascontiguousarray(dequant_rows(tiny, "blk.0.attn_q.weight", "f32", 0, 2))
    one = rows.copy()
    one.reshape(-1)[0] = np.nextafter(one.reshape(-1)[0], np.float32(10))
    one.tofile(tmp_path / "one.bin")
    args = ["compare", tiny, "blk.0.attn_q.weight", "--rows", "2"]
    assert main(args[:3] + [str(tmp_path / "one.bin")] + args[3:]) == 1
    assert "note:" not in capsys.readouterr().out
    # f16 values of 4 rows have the bytes of 2 f32 rows: read as f32 nearly every value differs
    dequant_rows(tiny, "blk.0.attn_q.weight", "f16", 0, 4).tofile(tmp_path / "h.bin")
    assert main(args[:3] + [str(tmp_path / "h.bin")] + args[3:]) == 1
    assert "note: the dump's size also fits --dtype f16 --rows 4" in capsys.readouterr().out


def test_outputs_get_the_mode_of_a_new_file(tmp_path):
    # mkstemp makes 0600 and the rename kept it: a trace or dump another
    # account (a llama.cpp run, a colleague) could not read
    import stat
    from strata_ref._npio import atomic_output
    from strata_ref.tracefile import TraceWriter
    old = os.umask(0o022)
    try:
        with atomic_output(tmp_path / "a.npy") as f:
            f.write(b"x")
        assert stat.S_IMODE(os.stat(tmp_path / "a.npy").st_mode) == 0o644
        w = TraceWriter(tmp_path / "t.npz", [1, 2], [2], {}, "test")
        w.add(0, "ADD", "x-0", np.zeros(2, np.float32))
        w.close()
        assert stat.S_IMODE(os.stat(tmp_path / "t.npz").st_mode) == 0o644
    finally:
        os.umask(old)


def test_which_takes_the_engines_flash_attention_thread_count(tiny, tmp_path, capsys, monkeypatch):
    # the thread count changes flash attention's split (512+ cells): which
    # ran every candidate with 2; --fa-threads now reaches the caches of
    # the flash-attention candidates, and the others ignore it
    import strata_ref.which as W
    ids = [1, 2, 3]
    ref = W.candidate_logits(tiny, "v0.4.0-haswell", False, ids, None, fa_threads=3)
    on = W.candidate_logits(tiny, "v0.4.0-haswell", True, ids, None, fa_threads=3)
    assert ref.shape == on.shape == (3, ref.shape[1])
    f = tmp_path / "l.npz"
    np.savez(f, tokens=np.array(ids), logits=ref)
    seen = []
    real = W.candidate_logits

    def spy(model, profile, fa, tokens, split, **cache):
        seen.append((fa, cache.get("fa_threads")))
        return real(model, profile, fa, tokens, split, **cache)
    monkeypatch.setattr(W, "candidate_logits", spy)
    assert main(["which", str(f), tiny, "--cpu", "v0.4.0-haswell", "--fa-threads", "3", "--json"]) == 0
    assert seen == [(False, 3), (True, 3)]
    capsys.readouterr()
    assert main(["which", str(f), tiny, "--fa-threads", "513"]) == 2
    assert _err_line(capsys) == "--fa-threads must be in 1 .. 512 (ggml's GGML_MAX_N_THREADS), got 513"



def test_which_refuses_a_trace_of_another_model(tiny, tmp_path, capsys):
    # a trace records its model's identity; which compares it with MODEL
    # as diff compares two traces (it ran the rows and said "0/3 rows")
    other = tmp_path / "gemma3.gguf"
    tiny_model("gemma3", other, seed=0)
    t = tmp_path / "t.npz"
    assert main(["trace", str(other), "--tokens", "1,2,3", "--cpu", "avx2", "--out", str(t)]) == 0
    capsys.readouterr()
    assert main(["which", str(t), tiny, "--cpu", "avx2", "--flash-attn", "off"]) == 2
    line = _err_line(capsys)
    assert line.startswith(f"{t}: a trace of another model: ") and "MODEL has" in line
    assert main(["which", str(t), str(other), "--cpu", "avx2", "--flash-attn", "off"]) == 0
