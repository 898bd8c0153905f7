"""`strata-ref trace` and `strata-ref diff` (docs/trace.md): the trace
container, the graphs' recording hook, and the comparison, checked
against llama.cpp's own graph nodes.

Stored llama.cpp traces (tests/data/<profile>/llama_trace_tiny_*.npz): the
Python driver over llama-cpp-python 0.3.36 built for each profile
(tools/peer_build.py), on the seeded tiny models of infer_helpers (seed 0;
their sha256 is in each file's `options`), e.g.

    python tools/llama_dump.py tiny_qwen3.gguf llama_trace_tiny_qwen3.npz --trace
        --tokens 257,72,101,108,108,111 --split 4 --compress --profile avx2

(the full command is in each file's `options`). The 6 ids run as 4 in one
call (the repacked gemm's group of 4) and then one per call (gemv and
vec_dot paths). tools/llama_trace.c, built against a peer, writes the same
container: the tests that run it skip without a peer build.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import zipfile

import numpy as np
import pytest

from infer_helpers import DATA, TINY_IDS, f32_bits, tiny_model, tiny_moe_model
from strata_ref.cli import main
from strata_ref.diff import diff_traces
from strata_ref.tracefile import (TraceError, TraceWriter, canonical_shape, derived_name, is_auto_name,
                                  open_trace, strip_view_suffixes)

IDS6 = TINY_IDS[:6]


@functools.lru_cache(maxsize=None)
def _tiny(arch: str, tmpdir: str) -> str:
    from pathlib import Path
    path = Path(tmpdir) / f"tiny_{arch}.gguf"
    if arch in ("qwen3", "gemma3"):
        tiny_model(arch, path, seed=0)
    else:
        tiny_moe_model(arch, path, seed=0)
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny"))
    return lambda arch: _tiny(arch, d)


def _our_trace(tmp_path, model, profile, ids=IDS6, split=4, name="ours.npz", **opts):
    out = tmp_path / name
    args = ["trace", model, "--tokens", ",".join(map(str, ids)), "--cpu", profile, "--out", str(out)]
    if split:
        args += ["--split", str(split)]
    for k, v in opts.items():
        args += [f"--{k.replace('_', '-')}", v]
    assert main(args) == 0
    return out


# ---------------------------------------------------------------- the container
def test_names_and_shapes_follow_ggml():
    # ggml_n_dims: dimensions above the last ne that is not 1 are dropped
    assert canonical_shape((1, 1, 5, 576)) == (5, 576)
    assert canonical_shape((1, 1, 1, 576)) == (576,)
    assert canonical_shape((9, 1, 256)) == (9, 1, 256)
    assert canonical_shape((1, 1)) == (1,)
    assert is_auto_name("node_32") and is_auto_name("leaf_7") and is_auto_name("")
    assert not is_auto_name("node_x") and not is_auto_name("attn_norm-0")
    assert strip_view_suffixes("Qcur-0 (view) (permuted)") == "Qcur-0"
    assert strip_view_suffixes("a-0 (cont)") == "a-0 (cont)"
    # names llama.cpp's graphs give unnamed nodes (seen in the 0.3.36 dumps)
    assert derived_name("MUL_MAT", ["blk.0.attn_output.weight", "kqv_out-0"]) == \
        "MUL_MAT(blk.0.attn_output.weight,kqv_out-0)"
    assert derived_name("GET_ROWS", ["node_233", "out_ids"]) == "GET_ROWS(_,out_ids)"
    assert derived_name("SCALE", ["Qcur-0"]) == "SCALE(Qcur-0)"
    # a view of an unnamed node is named " (reshaped)": no name of its own
    assert derived_name("REPEAT", [" (reshaped)"]) == "REPEAT(_)"


def _write(path, tokens=(1, 2, 3), calls=(3,), nodes=(), model=None):
    model = model or {"arch": "qwen3", "n_params": 10, "size": 20, "n_vocab": 5, "n_embd": 4, "n_layer": 1}
    with TraceWriter(path, tokens, calls, model, "test") as w:
        for call, op, name, a in nodes:
            w.add(call, op, name, a)
    return path


def test_container_round_trip(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    p = _write(tmp_path / "t.npz", nodes=[(0, "RMS_NORM", "norm-0", x), (0, "MUL", "attn_norm-0", x * 2),
                                          (0, "RMS_NORM", "norm-0", x[0, :1]),
                                          (0, "ARGSORT", "ffn_moe_argsort-0", np.array([[2, 0, 1]], np.int64)),
                                          (0, "CONT", "h", x.astype(np.float16))])
    with open_trace(p) as t:
        assert t.tokens.tolist() == [1, 2, 3] and t.calls.tolist() == [3] and t.model["n_vocab"] == 5
        e = t.entries
        assert [(x.name, x.op, x.occurrence) for x in e] == [
            ("norm-0", "RMS_NORM", 0), ("attn_norm-0", "MUL", 0), ("norm-0", "RMS_NORM", 1),
            ("ffn_moe_argsort-0", "ARGSORT", 0), ("h", "CONT", 0)]
        assert e[0].shape == (3, 4) and e[2].shape == (4,) and e[0].layer == 0
        assert t.array(e[1]).tolist() == (x[0] * 2).tolist()
        assert t.array(e[3]).dtype == np.int32 and t.array(e[4]).dtype == np.float16
    # NumPy reads it as an .npz too
    with np.load(p) as z:
        assert str(z["format"]) == "strata-ref-trace 1" and int(z["n_tensors"]) == 5


def test_bad_containers_are_one_clear_error(tmp_path):
    p = _write(tmp_path / "t.npz", nodes=[(0, "MUL", "a-0", np.ones((3, 8), np.float32))])
    raw = p.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(TraceError, match="cut short"):
        open_trace(cut)
    # a writer that did not finish leaves no n_tensors
    part = tmp_path / "part.npz"
    with zipfile.ZipFile(p) as zi, zipfile.ZipFile(part, "w") as zo:
        for n in zi.namelist():
            if n != "n_tensors.npy":
                zo.writestr(n, zi.read(n))
    with pytest.raises(TraceError, match="incomplete"):
        open_trace(part)
    plain = tmp_path / "plain.npz"
    np.savez(plain, logits=np.zeros(3))
    with pytest.raises(TraceError, match=r"not a trace container \(no `format` entry; it holds logits\)"):
        open_trace(plain)
    # a header claiming more data than the entry holds is refused, not allocated
    big = tmp_path / "big.npz"
    with zipfile.ZipFile(p) as zi, zipfile.ZipFile(big, "w") as zo:
        for n in zi.namelist():
            data = zi.read(n)
            if n.startswith("t:"):
                data = data.replace(b"(3, 8)", b"(9, 9)")
            zo.writestr(n, data)
    with open_trace(big) as t, pytest.raises(TraceError, match="header says"):
        t.array(t.entries[0])
    # options that are JSON but not an object (of flash_attn, n_ctx, ...)
    odd = tmp_path / "odd.npz"
    with zipfile.ZipFile(p) as zi, zipfile.ZipFile(odd, "w") as zo:
        for n in zi.namelist():
            zo.writestr(n, zi.read(n) if n != "options.npy" else _npy(np.array("[1, 2]")))
    with pytest.raises(TraceError, match="entry `options` is JSON list, not an object"):
        open_trace(odd)
    with pytest.raises(ValueError, match="do not split"):
        _write(tmp_path / "x.npz", tokens=(1, 2, 3), calls=(2,))
    assert main(["diff", str(cut), str(p)]) == 2


@pytest.mark.parametrize("opt,val,msg", [("--block", "0", "--block must be >= 1, got 0"),
                                         ("--worst", "-1", "--worst must be >= 0, got -1")])
def test_diff_names_the_bad_option(opt, val, msg, capsys):
    # each of the two options is named alone, with the value given
    assert main(["diff", "a.npz", "b.npz", opt, val]) == 2
    assert capsys.readouterr().err == f"strata-ref: error: {msg}\n"


# ---------------------------------------------------------------- against llama.cpp
def _stored(profile, arch):
    p = DATA / profile / f"llama_trace_tiny_{arch}.npz"
    if not p.is_file():
        pytest.skip(f"no {p.name} for {profile}")
    return p


STORED = [("scalar", "qwen3"), ("avx2", "qwen3"), ("avx512", "qwen3"), ("avx2", "gemma3")]


@pytest.mark.parametrize("profile, arch", STORED, ids=[f"{a}-{p}" for p, a in STORED])
def test_every_node_equals_llama_cpp(tmp_path, tiny, capsys, profile, arch):
    ref = _stored(profile, arch)
    model = tiny(arch)
    with open_trace(ref) as t:
        assert t.options["model_sha256"] == hashlib.sha256(open(model, "rb").read()).hexdigest()
        assert t.tokens.tolist() == IDS6 and t.calls.tolist() == [4, 1, 1]
    ours = _our_trace(tmp_path, model, profile)
    capsys.readouterr()
    assert main(["diff", str(ref), str(ours), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # every node llama.cpp computes (views and cache copies aside) is
    # recorded, in llama.cpp's graph order, with the same bits
    assert doc["equal"] and doc["only_a"] == [] and doc["only_b"] == [] and doc["order"] is None
    assert doc["compared"] == (450 if arch == "qwen3" else 543)


def test_first_departing_node_against_another_build(tmp_path, tiny, capsys):
    # llama.cpp's avx2 build against this engine in the scalar profile:
    # the first node that differs is layer 0's q projection (the mat-mul
    # of the repacked Q8_0 weights), located and measured as numpy says
    ref = _stored("avx2", "qwen3")
    ours = _our_trace(tmp_path, tiny("qwen3"), "scalar")
    with open_trace(ref) as a, open_trace(ours) as b:
        rep = diff_traces(a, b)
        fd = rep.first_diff
        assert (fd.a.name, fd.a.op, fd.a.layer, fd.a.call, fd.a.seq) == ("Qcur-0", "MUL_MAT", 0, 0, 3)
        xa, xb = a.array(fd.a), b.array(fd.b)
    diff = np.flatnonzero(f32_bits(xa) != f32_bits(xb))
    assert fd.n_diff == diff.size > 0 and fd.first["index"] == diff[0]
    r, c = divmod(int(diff[0]), xa.shape[-1])
    assert (fd.first["row"], fd.first["col"], fd.first["block"], fd.first["offset"]) == (r, c, c // 32, c % 32)
    ia, ib = (f32_bits(x).reshape(-1)[diff].astype(np.int64) for x in (xa, xb))
    same_sign = (ia >> 31) == (ib >> 31)
    assert same_sign.all() and fd.max_ulp == int(np.abs(ia - ib).max())
    assert main(["diff", str(ref), str(ours)]) == 1
    out = capsys.readouterr().out
    assert "first difference: call 0, node 3 `Qcur-0` (MUL_MAT, layer 0)" in out and "DIFFERENT" in out


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "qwen3moe", "gpt-oss", "qwen3next", "qwen35moe"])
def test_tracing_changes_no_bit(tmp_path, tiny, arch):
    # the trace's result_output rows are the logits of an untraced pass
    # (the compiled layers where they apply)
    from strata_ref.infer.loader import load
    m = load(tiny(arch), profile="avx2")
    want = m.forward(IDS6, m.new_cache(64), all_logits=True)
    ours = _our_trace(tmp_path, tiny(arch), "avx2", split=None)
    with open_trace(ours) as t:
        (e,) = t.find("result_output")
        assert np.array_equal(f32_bits(t.array(e)), f32_bits(want))
        assert t.model["arch"] == arch and len(t.entries) > 40


def test_gpt_oss_flash_attention_with_sinks_equals_llama_cpp(tmp_path, tiny):
    ref = DATA / "avx2" / "llama_trace_tiny_gpt-oss_fa.npz"
    ours = _our_trace(tmp_path, tiny("gpt-oss"), "avx2", ids=TINY_IDS, split=8, flash_attn="on",
                      tensors="FLASH_ATTN_EXT*")
    with open_trace(ref) as a, open_trace(ours) as b:
        rep = diff_traces(a, b)
        assert len(rep.results) == 20 and not rep.only_a
        assert rep.equal


# ---------------------------------------------------------------- diff on made-up traces
def _pair(tmp_path, xa, xb, name="ffn_out-2", op="MUL_MAT"):
    a = _write(tmp_path / "a.npz", nodes=[(0, "MUL", "attn_norm-2", np.ones((2, 3), np.float32)), (0, op, name, xa)])
    b = _write(tmp_path / "b.npz", nodes=[(0, "MUL", "attn_norm-2", np.ones((2, 3), np.float32)), (0, op, name, xb)])
    return a, b


def test_diff_counts_ulps_and_places_the_first_difference(tmp_path):
    xa = np.linspace(-1, 1, 2 * 64, dtype=np.float32).reshape(2, 64)
    xb = xa.copy()
    xb[1, 37] = np.nextafter(xb[1, 37], np.float32(9))                 # 1 ulp
    u = xb[1, 40].view(np.uint32) + np.uint32(3)
    xb[1, 40] = u.view(np.float32)                                     # 3 ulp
    xb[0, 5] = np.nan
    xa[0, 9] = xb[0, 9] = np.nan                                       # NaN vs NaN: equal
    a, b = _pair(tmp_path, xa, xb)
    with open_trace(a) as ta, open_trace(b) as tb:
        r = diff_traces(ta, tb).first_diff
    assert (r.a.name, r.n_diff, r.nan_vs_number, r.max_ulp, r.median_ulp) == ("ffn_out-2", 3, 1, 3, 2.0)
    assert (r.first["row"], r.first["col"], r.first["block"], r.first["offset"]) == (0, 5, 0, 5)
    assert [(w["row"], w["col"], w["ulps"], w["block"], w["offset"]) for w in r.worst] == \
        [(1, 40, 3, 1, 8), (1, 37, 1, 1, 5)]


def test_diff_exit_status_json_and_bad_pairs(tmp_path, capsys):
    x = np.ones((2, 3), np.float32)
    a, b = _pair(tmp_path, x, x)
    assert main(["diff", str(a), str(b)]) == 0
    assert "EQUAL: all 2 compared nodes" in capsys.readouterr().out
    a, b = _pair(tmp_path, x, x * 2)
    assert main(["diff", str(a), str(b), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["first_diff"]["name"] == "ffn_out-2" and doc["first_diff"]["max_ulp"] == 1 << 23
    assert doc["layers"][0]["differing"] == 1 and doc["layers"][0]["out"] == "ffn_out-2"
    # shapes, token ids, models that differ
    c = _write(tmp_path / "c.npz", nodes=[(0, "MUL", "attn_norm-2", np.ones((3, 2), np.float32))])
    assert main(["diff", str(a), str(c)]) == 1
    assert "shape [2, 3] vs [3, 2]" in capsys.readouterr().out
    d = _write(tmp_path / "d.npz", tokens=(1, 2, 4), nodes=[(0, "MUL", "attn_norm-2", x)])
    assert main(["diff", str(a), str(d)]) == 2
    assert "different token ids (first differing at position 2: 3 vs 4)" in capsys.readouterr().err
    e = _write(tmp_path / "e.npz", nodes=[(0, "MUL", "attn_norm-2", x)],
               model={"arch": "llama", "n_params": 10, "size": 20, "n_vocab": 5, "n_embd": 4, "n_layer": 1})
    assert main(["diff", str(a), str(e)]) == 2
    assert "different models: arch 'qwen3' vs 'llama'" in capsys.readouterr().err
    f = _write(tmp_path / "f.npz", calls=(2, 1), nodes=[(0, "MUL", "attn_norm-2", x)])
    assert main(["diff", str(a), str(f)]) == 2
    assert "different calls" in capsys.readouterr().err


def test_diff_map_renames_another_engines_nodes(tmp_path, capsys):
    # a PyTorch-style dump of hidden states, named its own way and without ggml ops
    h = [np.full((2, 4), i, np.float32) for i in range(3)]
    a = _write(tmp_path / "a.npz", nodes=[(0, "ADD", f"l_out-{i}", h[i]) for i in range(3)])
    b = _write(tmp_path / "b.npz", nodes=[(0, "HIDDEN", f"model.layers.{i}", h[i] + (i == 2)) for i in range(3)])
    m = tmp_path / "map.json"
    m.write_text(json.dumps({"model.layers.{il}": "l_out-{il}"}))
    assert main(["diff", str(a), str(b), "--map", str(m), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["compared"] == 3 and doc["first_diff"]["name"] == "l_out-2"
    assert doc["first_diff"]["b_name"] == "model.layers.2"
    m.write_text(json.dumps({"model.layers.{il}": "l_out"}))
    assert main(["diff", str(a), str(b), "--map", str(m)]) == 2
    assert "{il} must appear on both sides" in capsys.readouterr().err
    assert main(["diff", str(a), str(b)]) == 2
    assert "no node of" in capsys.readouterr().err


# ---------------------------------------------------------------- the drivers
def _peer_driver(tmp_path, profile="avx2"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    from strata_ref.models import cache_dir
    lib = cache_dir() / "peer" / profile / "site" / "llama_cpp" / "lib"
    if not (lib / "libllama.so").exists() or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip(f"no {profile} peer build or no C compiler")
    out = tmp_path / "llama_trace"
    tools = Path(__file__).resolve().parents[1] / "tools"
    r = subprocess.run([sys.executable, str(tools / "llama_trace_build.py"), "--profile", profile, "--out",
                        str(out)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot build the C driver: {r.stderr.strip()[-300:]}")
    return out


def test_c_driver_writes_the_python_drivers_container(tmp_path, tiny):
    import subprocess
    exe = _peer_driver(tmp_path)
    out = tmp_path / "c.npz"
    r = subprocess.run([str(exe), tiny("qwen3"), str(out), "--tokens", ",".join(map(str, IDS6)), "--split", "4"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None                       # every CRC right
    ref = _stored("avx2", "qwen3")
    with open_trace(ref) as a, open_trace(out) as b:
        rep = diff_traces(a, b)
        assert rep.equal and not rep.only_a and not rep.only_b and rep.order is None
        assert [e.name for e in a.entries] == [e.name for e in b.entries]
        assert b.model == a.model and b.producer == "tools/llama_trace.c"
    # bad input: one line, no output file left behind
    r = subprocess.run([str(exe), tiny("qwen3"), str(tmp_path / "x.npz"), "--tokens", "1,99999"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "outside the vocabulary" in r.stderr
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "x.npz.part").exists()
    # OUT a directory: refused before the model is read, not after the work
    d = tmp_path / "d"
    d.mkdir()
    r = subprocess.run([str(exe), tiny("qwen3"), str(d), "--tokens", "1,2"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is not a regular file" in r.stderr
    assert os.listdir(d) == [] and not [n for n in os.listdir(tmp_path) if n.endswith(".part")]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss", "qwen3next", "qwen35moe"])
def test_moe_and_hybrid_nodes_equal_llama_cpp(tmp_path, tiny, arch):
    # every node both record is equal; llama.cpp's recurrent-state
    # bookkeeping (cache_r / cache_s reads) is the only thing not recorded
    import subprocess
    exe = _peer_driver(tmp_path)
    ref = tmp_path / "llama.npz"
    r = subprocess.run([str(exe), tiny(arch), str(ref), "--tokens", ",".join(map(str, TINY_IDS)), "--split", "8"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = _our_trace(tmp_path, tiny(arch), "avx2", ids=TINY_IDS, split=8)
    with open_trace(ref) as a, open_trace(ours) as b:
        rep = diff_traces(a, b)
        assert rep.equal and not rep.only_b and rep.order is None
        assert all(("cache_r_l" in e.name or "cache_s_l" in e.name or "conv_states" in e.name)
                   for e in rep.only_a)


@pytest.mark.slow
def test_registry_model_every_node_equals_llama_cpp(tmp_path):
    # SmolLM2-135M (Q4_1 / Q8_0): the prompt and llama.cpp's greedy
    # continuation, 5 ids in one call then one per call
    import subprocess
    from infer_helpers import model_path
    exe = _peer_driver(tmp_path)
    ref_ids = np.load(DATA / "avx2" / "llama_ref_SmolLM2-135M-Instruct.npz")
    ids = ref_ids["prompt_ids"].tolist() + ref_ids["greedy_ids"].tolist()[:8]
    path = str(model_path("SmolLM2-135M-Instruct"))
    ref = tmp_path / "llama.npz"
    r = subprocess.run([str(exe), path, str(ref), "--tokens", ",".join(map(str, ids)), "--split", "5"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = _our_trace(tmp_path, path, "avx2", ids=ids, split=5)
    with open_trace(ref) as a, open_trace(ours) as b:
        rep = diff_traces(a, b)
        assert rep.equal and not rep.only_a and not rep.only_b and len(rep.results) == len(a.entries)
    # the builds of the other variants depart from the avx2 arithmetic at
    # layer 0: the scalar build at the q projection (its Q4_1 x q8_1 dot),
    # the AVX-512 build at the F16 attention scores (16 lanes against 8)
    for profile, first in (("scalar", ("Qcur-0", "MUL_MAT", 0)), ("avx512", ("kq-0", "MUL_MAT", 0))):
        other = tmp_path / f"llama_{profile}.npz"
        r = subprocess.run([str(_peer_driver(tmp_path / profile, profile)), path, str(other), "--tokens",
                            ",".join(map(str, ids)), "--split", "5"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        with open_trace(other) as a, open_trace(ours) as b:
            fd = diff_traces(a, b).first_diff
            assert (fd.a.name, fd.a.op, fd.a.layer, fd.a.call) == (*first, 0)


def test_trace_bad_input_is_one_line(tmp_path, tiny, capsys):
    q = tiny("qwen3")
    out = str(tmp_path / "t.npz")
    cases = [(["--tokens", "1,x"], "not a comma-separated list"),
             (["--tokens", "1,300"], "token id 300 is outside the vocabulary (size 259)"),
             (["--tokens", "1,2", "--prompt", "hi"], "one of them"),
             (["--tokens", "1,2", "--tensors", "nothing*"], "matches no node"),
             (["--tokens", "1,2", "--split", "0"], "--split must be >= 1")]
    for extra, msg in cases:
        assert main(["trace", q, "--out", out, *extra]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, (extra, err)
    assert not (tmp_path / "t.npz").exists() and not (tmp_path / "t.npz.part").exists()
    assert main(["trace", q, "--out", str(tmp_path), "--tokens", "1"]) == 2
    assert ": a directory; give a file name" in capsys.readouterr().err
    # a filter keeps what it names, in order
    assert main(["trace", q, "--out", out, "--tokens", "1,2,3", "--tensors", "l_out-*,result_output",
                 "--cpu", "avx2"]) == 0
    with open_trace(out) as t:
        assert [e.name for e in t.entries] == [f"l_out-{i}" for i in range(6)] + ["result_output"]


def test_group_limited_routing_nodes_equal_llama_cpp(tmp_path, tiny):
    # deepseek2's routing as DeepSeek V3 runs it (group-limited, weights
    # scaled after the normalization): the group selection's nodes, the
    # argsort over the masked scores and `ffn_moe_weights_norm` before /
    # `ffn_moe_weights_scaled` after the scale are llama.cpp's, by name and
    # bits (they once held the ungrouped choice and the scaled weights)
    ref = DATA / "avx2" / "llama_trace_tiny_deepseek2-v3.npz"
    with open_trace(ref) as a:
        pats = a.options["command"].split("--tensors ", 1)[1]
    ours = _our_trace(tmp_path, tiny("deepseek2-v3"), "avx2", tensors=pats)
    with open_trace(ref) as a, open_trace(ours) as b:
        rep = diff_traces(a, b)
        names = {e.name for e in a.entries}
        assert rep.equal and not rep.only_a and not rep.only_b, (rep.only_a[:5], rep.only_b[:5])
    for n in ("ffn_moe_weights_scaled-1", "FILL(ffn_moe_probs_biased-1)", "SUM_ROWS(_)",
              "GET_ROWS(ffn_moe_probs_biased-2,ffn_moe_group_topk-2)"):
        assert n in names


def test_model_identity_does_not_count_mtp_layers():
    # llama_model_n_layer is block_count - nextn_predict_layers
    # (llama_model_base::load_hparams), as glm4moe's tiny model has one
    class G:
        metadata = {"general.architecture": "glm4moe", "glm4moe.block_count": 5,
                    "glm4moe.nextn_predict_layers": 1, "glm4moe.embedding_length": 256}
        tensors = []
    from strata_ref.tracefile import model_info
    assert model_info(G)["n_layer"] == 4
    G.metadata = {"general.architecture": "qwen3", "qwen3.block_count": 5}
    assert model_info(G)["n_layer"] == 5


def _npy(a: np.ndarray) -> bytes:
    """`a` as the bytes of an .npy file."""
    import io
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()
