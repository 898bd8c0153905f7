"""The one-liners of docs/trace.md, each checked with real values:
`which` (against llama.cpp's stored logits of every profile), `dequant`
and `hash --tensors` (against gguf-py's dequantizers), `compare --worst /
--max-ulp`, `matmul` (against llama.cpp's stored mat-mul outputs, the
route oracles, a float32 GEMM within the cuBLAS routes' bound), `info
--tensors` (against gguf-py's reader), `kl --tokens-out / --test-logits`."""
from __future__ import annotations

import json

import gguf as gguf_py
import numpy as np
import pytest

from infer_helpers import DATA, PROFILES, f32_bits, tiny_model
from strata_ref import hash_array
from strata_ref.cli import main
from strata_ref.hashing import fnv1a64


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    p = tmp_path_factory.mktemp("tiny") / "tiny_qwen3.gguf"
    tiny_model("qwen3", p, seed=0)
    return str(p)


def _gguf_py_rows(path, name):
    r = gguf_py.GGUFReader(path)
    t = next(t for t in r.tensors if t.name == name)
    data = np.asarray(t.data)
    f = gguf_py.quants.dequantize(data.reshape(-1).view(np.uint8) if t.tensor_type != 0 else data, t.tensor_type)
    return np.asarray(f, np.float32).reshape(-1, int(t.shape[0]))


# ---------------------------------------------------------------- which
@pytest.mark.parametrize("profile", PROFILES)
def test_which_names_the_profile_of_stored_llama_cpp_logits(tmp_path, qwen3, capsys, profile):
    # llama.cpp's logits of the tiny qwen3 (tools/llama_ref.py synthetic,
    # one batched call, flash attention off); the Q8_0 model gives the avx2
    # and avx512 builds the same bits, the scalar build others. `which`
    # tries every profile: the v0.4.0 builds compute this model (Q8_0, no
    # tiled path, flash attention off) as their 0.3.36 counterparts do
    # (docs/prebuilt.md), so they reproduce the same rows. The arm64
    # profiles are tried with and without flash attention (with it where
    # it is emulated, `ARM64_KV_TYPES`; elsewhere named, not run)
    # and reproduce none
    ref = np.load(DATA / profile / "llama_ref_tiny.npz")
    f = tmp_path / "logits.npz"
    np.savez(f, tokens=ref["ids"], logits=ref["qwen3_logits"])
    assert main(["which", str(f), qwen3, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    hits = {(c["profile"], c["flash_attn"]) for c in doc["matches"]}
    # (and, on this small model, v0.4.0-sse42 gives scalar's rows and
    # v0.4.0-piledriver avx2's: their Q8_0 takes the generic C over the
    # reference quantizer and the same tinyBLAS_Q0_AVX respectively; the
    # stored SmolLM2 data of tests/data/v0.4.0-* tells them apart)
    want = ({("scalar", False), ("v0.4.0-x64", False), ("v0.4.0-sse42", False)} if profile == "scalar" else
            {(p, False) for p in ("avx2", "avx512", "v0.4.0-piledriver", "v0.4.0-haswell", "v0.4.0-skylakex",
                                  "v0.4.0-zen4")})
    assert hits == want
    assert all(c["equal_rows"] < 12 for c in doc["candidates"] if (c["profile"], c["flash_attn"]) not in want)
    arm = {(c["profile"], c["flash_attn"]): c["not_emulated"] for c in doc["candidates"]
           if c["profile"].startswith("armv8")}
    from infer_helpers import ARM_PROFILES
    from strata_ref.infer.model import ARM64_KV_TYPES
    fa_f16 = {p for p in ARM_PROFILES if "f16" in ARM64_KV_TYPES.get(p, {}).get(True, ())}
    assert arm == {(p, fa): "flash attention" if fa and p not in fa_f16 else None
                   for p in ARM_PROFILES for fa in (False, True)}
    assert {"armv8.0", "armv8.2-dotprod", "armv8.2-fp16", "armv8.6-i8mm"} <= set(ARM_PROFILES)
    for p in sorted(set(ARM_PROFILES) - fa_f16)[:1]:
        # nothing compared: exit 2, as for --cpu naming no profile
        assert main(["which", str(f), qwen3, "--cpu", p, "--flash-attn", "on"]) == 2
        cap = capsys.readouterr()
        out = cap.out
        assert f"{p} flash attention on : not run (flash attention not emulated on this profile)" in out
        assert "no candidate was run" in out
        assert cap.err == ("strata-ref: error: no candidate could be run (each one's line says what is not "
                           "emulated), so nothing was compared: choose other --cpu, --flash-attn or cache "
                           "types\n")
    # armv8.0's flash attention over the F16 cache is emulated: a candidate
    # like any other (run, reproducing none of these x86 rows)
    assert "armv8.0" in fa_f16
    assert main(["which", str(f), qwen3, "--cpu", "armv8.0", "--flash-attn", "on"]) == 1
    out = capsys.readouterr().out
    assert "not run" not in out and "no candidate was run" not in out


def test_which_nearest_and_bad_input(tmp_path, qwen3, capsys):
    ref = np.load(DATA / "avx2" / "llama_ref_tiny.npz")
    logits = ref["qwen3_logits"].copy()
    logits[7, 100] = np.nextafter(logits[7, 100], np.float32(1e9))      # one logit 1 ulp off
    f = tmp_path / "l.npz"
    np.savez(f, tokens=ref["ids"], logits=logits)
    assert main(["which", str(f), qwen3, "--cpu", "avx2", "--flash-attn", "off"]) == 1
    out = capsys.readouterr().out
    # the header says what ran: rows, calls and the context length
    assert out.splitlines()[0] == (f"{f}: 12 rows (every logit each), one batched call, n_ctx the drivers' "
                                   "default (512, or the next multiple of 256 that holds the ids, at most the "
                                   "training context)")
    assert "11/12 rows bitwise  first differing row 7" in out
    # (the tiny model's training context is 256, which the default takes)
    assert main(["which", str(f), qwen3, "--cpu", "avx2", "--flash-attn", "off", "--ctx", "256"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{f}: 12 rows (every logit each), one batched call, n_ctx 256"
    assert "11/12 rows bitwise  first differing row 7" in out
    assert "nearest: avx2 (flash attention off), 11/12 rows; its first differing row 7 (token 119): logit of id 100" in out
    # auto: each profile's own default, as `generate` takes it
    assert main(["which", str(f), qwen3, "--cpu", "avx2,v0.4.0-haswell", "--flash-attn", "auto", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(c["profile"], c["flash_attn"]) for c in doc["candidates"]] == [("avx2", False), ("v0.4.0-haswell", True)]
    np.save(tmp_path / "l.npy", ref["qwen3_logits"])
    assert main(["which", str(tmp_path / "l.npy"), qwen3]) == 2
    assert "give --tokens IDS" in capsys.readouterr().err
    for empty in (",,", ""):
        assert main(["which", str(f), qwen3, "--cpu", empty]) == 2
        assert "names no profile" in capsys.readouterr().err
    assert main(["which", str(tmp_path / "l.npy"), qwen3, "--tokens", "257,72"]) == 2
    assert "12 logit rows for 2 token ids (mismatched ids" in capsys.readouterr().err
    np.savez(f, tokens=ref["ids"], logits=ref["qwen3_logits"].astype(np.float64))
    assert main(["which", str(f), qwen3]) == 2
    assert "float64" in capsys.readouterr().err
    np.savez(f, tokens=ref["ids"], logits=ref["qwen3_logits"][:, :200])
    assert main(["which", str(f), qwen3, "--cpu", "avx2", "--flash-attn", "off"]) == 2
    assert "rows of 200 logits, the model's vocabulary has 259" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
def test_which_on_a_registry_model_with_flash_attention(tmp_path, capsys, profile):
    # SmolLM2: llama.cpp's top-k logits of 37 positions, batched and
    # incremental (5 ids, then one per call), flash attention off
    # (llama_ref) and on (llama_kv f16-f16-fa); each is reproduced by its
    # own profile and setting only
    from infer_helpers import model_path
    path = str(model_path("SmolLM2-135M-Instruct"))
    cases = []
    r = np.load(DATA / profile / "llama_ref_SmolLM2-135M-Instruct.npz")
    ids = np.concatenate([r["prompt_ids"], r["greedy_ids"]])
    cases.append((ids, r["incr_logits"], r["incr_ids"], 5, False))
    kv = np.load(DATA / profile / "llama_kv_SmolLM2-135M-Instruct.npz")
    k = "f16-f16-fa:"
    cases.append((np.concatenate([kv[k + "prompt_ids"], kv[k + "greedy_ids"]]), kv[k + "batched_logits"],
                  kv[k + "batched_ids"], None, True))
    for toks, logits, cols, split, fa in cases:
        f = tmp_path / "l.npz"
        extra = {} if split is None else {"split": np.int64(split)}
        np.savez(f, tokens=toks, logits=logits, columns=cols, **extra)
        assert main(["which", str(f), path, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [(c["profile"], c["flash_attn"]) for c in doc["matches"]] == [(profile, fa)]


# ---------------------------------------------------------------- dequant / hash / compare / info
def test_dequant_writes_the_oracles_rows(tmp_path, qwen3, capsys):
    want = _gguf_py_rows(qwen3, "blk.1.ffn_down.weight")[3:7]
    assert main(["dequant", qwen3, "blk.1.ffn_down.weight", "--row0", "3", "--rows", "4",
                 "--out", str(tmp_path / "r.bin")]) == 0
    got = np.fromfile(tmp_path / "r.bin", "<f4").reshape(4, -1)
    assert np.array_equal(f32_bits(got), f32_bits(want))
    assert f"fnv1a64 {hash_array(want):016x}" in capsys.readouterr().out
    assert main(["dequant", qwen3, "blk.1.ffn_down.weight", "--dtype", "bf16", "--out", str(tmp_path / "r.npy")]) == 0
    bits = np.load(tmp_path / "r.npy")
    import ml_dtypes
    full = _gguf_py_rows(qwen3, "blk.1.ffn_down.weight")
    assert bits.dtype == np.uint16 and np.array_equal(bits, full.astype(ml_dtypes.bfloat16).view(np.uint16))
    capsys.readouterr()
    assert main(["dequant", qwen3, "blk.1.ffn_dwn.weight", "--out", str(tmp_path / "x")]) == 2
    assert "nearest: blk.1.ffn_down.weight" in capsys.readouterr().err
    assert main(["dequant", qwen3, "blk.1.ffn_down.weight", "--row0", "64", "--out", str(tmp_path / "x")]) == 2


def test_hash_tensors_filter(qwen3, capsys):
    assert main(["hash", qwen3, "--tensors", "blk.0.ffn_*,output_norm.weight", "--out", "f32", "--json",
                 "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [t["name"] for t in doc["tensors"]]
    assert names == ["output_norm.weight", "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight",
                     "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"]
    hs = [hash_array(_gguf_py_rows(qwen3, n)) for n in names]
    assert [t["hash"]["f32"] for t in doc["tensors"]] == [f"{h:016x}" for h in hs]
    assert doc["chained"]["f32"] == f"{fnv1a64(b''.join(h.to_bytes(8, 'little') for h in hs)):016x}"
    assert main(["hash", qwen3, "--tensors", "blk.9*"]) == 2
    assert "matches no tensor" in capsys.readouterr().err


def test_compare_lists_the_worst_ulps_and_takes_a_tolerance(tmp_path, qwen3, capsys):
    rows = _gguf_py_rows(qwen3, "blk.0.attn_q.weight")[2:5].copy()
    flat = rows.reshape(-1)
    flat[5] = np.nextafter(flat[5], np.float32(10))                       # 1 ulp, block 0 offset 5
    flat[64 + 40] = flat[64 + 40].view(np.uint32).__add__(np.uint32(3)).view(np.float32)  # 3 ulp, row 3 block 1 +8
    rows.tofile(tmp_path / "d.bin")
    args = ["compare", qwen3, "blk.0.attn_q.weight", str(tmp_path / "d.bin"), "--row0", "2", "--rows", "3"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "3 ulp  row 3 col 40 (block 1, offset 8)" in out and "1 ulp  row 2 col 5 (block 0, offset 5)" in out
    assert out.index("3 ulp") < out.index("1 ulp") and out.rstrip().endswith("DIFFERENT")
    assert main(args + ["--max-ulp", "3"]) == 0
    assert "WITHIN --max-ulp 3 (not bitwise: 2 values differ, max 3 ulp)" in capsys.readouterr().out
    assert main(args + ["--max-ulp", "2"]) == 1
    assert "beyond --max-ulp 2" in capsys.readouterr().out
    assert main(args + ["--worst", "1"]) == 1
    out = capsys.readouterr().out
    assert "worst 1 " in out and "1 ulp  row 2" not in out


def test_info_tensors_lists_offsets_and_bytes(qwen3, capsys):
    assert main(["info", qwen3, "--tensors"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    r = gguf_py.GGUFReader(qwen3)
    assert len(lines) == len(r.tensors)
    for line, t in zip(lines, r.tensors):
        i, name, typ, shape, off, nbytes = line.split()
        assert (name, typ, off, nbytes) == (t.name, t.tensor_type.name, str(t.data_offset), str(t.n_bytes))
        assert shape == "x".join(str(int(d)) for d in t.shape)


# ---------------------------------------------------------------- matmul
def _matrix_gguf(tmp_path, name="llama_matrix_q4_k.npz"):
    from strata_ref.gguf import write_gguf
    from strata_ref import GGMLType
    p = DATA / "avx512" / name
    if not p.is_file():
        pytest.skip(f"no {name}")
    v = np.load(p)
    path = tmp_path / "w.gguf"
    write_gguf(path, {"general.architecture": "llama"},
               [("w", GGMLType(int(v["w_type"])), (int(v["w_cols"]), int(v["w_rows"])), v["w_raw"])])
    return str(path), v


@pytest.mark.parametrize("tag", ["b", "d"])
def test_matmul_cpu_route_is_llama_cpps_mat_mul(tmp_path, capsys, tag):
    # llama.cpp's own input and output rows of a Q4_K matrix (avx512
    # build, tests/test_infer_ggml_ops.py MATRIX_TYPES): 12 tokens (the
    # tiled kernel) and one (vec_dot)
    path, v = _matrix_gguf(tmp_path)
    np.save(tmp_path / "x.npy", v[f"{tag}_x"])
    np.save(tmp_path / "y.npy", v[f"{tag}_y"])
    args = ["matmul", path, "w", "--activations", str(tmp_path / "x.npy"), "--route", "cpu", "--cpu", "avx512"]
    assert main(args + ["--compare", str(tmp_path / "y.npy")]) == 0
    assert "0 of" in capsys.readouterr().out
    assert main(args + ["--out", str(tmp_path / "o.npy")]) == 0
    assert np.array_equal(f32_bits(np.load(tmp_path / "o.npy")), f32_bits(v[f"{tag}_y"]).reshape(-1, v[f"{tag}_y"].shape[-1]))
    # the scalar build's arithmetic gives other bits
    assert main(args[:-1] + ["scalar", "--compare", str(tmp_path / "y.npy")]) == 1


def test_matmul_routes_and_their_agreement(tmp_path, qwen3, capsys):
    from strata_ref.routes.mmvq import mmvq_f32
    rng = np.random.default_rng(3)
    x = rng.standard_normal((10, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    w = _gguf_py_rows(qwen3, "blk.0.attn_q.weight")                       # 64 x 64, Q8_0
    base = ["matmul", qwen3, "blk.0.attn_q.weight", "--activations", str(tmp_path / "x.npy")]
    # mmvq: the route oracle, 8 columns per call, bitwise the library's
    assert main(base + ["--route", "mmvq", "--out", str(tmp_path / "m.npy")]) == 0
    m = np.load(tmp_path / "m.npy")
    from strata_ref import gguf
    t = gguf.read(qwen3).tensor("blk.0.attn_q.weight")
    raw = np.asarray(t.data).reshape(64, -1)
    assert np.array_equal(f32_bits(m), f32_bits(np.concatenate([mmvq_f32(t.type, raw, x[:8]), mmvq_f32(t.type, raw, x[8:])])))
    # q8_1 activations: within a few percent of the exact product
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(m - exact).max() < 0.02 * np.abs(exact).max()
    m2 = m.copy()
    m2[9, 33] = np.nextafter(np.nextafter(m2[9, 33], np.float32(9)), np.float32(9))
    np.save(tmp_path / "m2.npy", m2)
    capsys.readouterr()
    assert main(base + ["--route", "mmvq", "--compare", str(tmp_path / "m2.npy")]) == 1
    out = capsys.readouterr().out
    assert "1 of 640 values differ" in out and "2 ulp at token 9, output row 33" in out
    # the GEMM routes: a float32-accumulating product of the same f16
    # operands is within the derived bound, a result off by 1e-3 is not
    xf = x.astype(np.float16).astype(np.float32)
    y32 = (xf @ w.astype(np.float16).astype(np.float32).T).astype(np.float32)
    np.save(tmp_path / "g.npy", y32)
    assert main(base + ["--route", "gemm-f16", "--compare", str(tmp_path / "g.npy")]) == 0
    assert "WITHIN the route's error bound" in capsys.readouterr().out
    np.save(tmp_path / "g2.npy", y32 + np.float32(1e-3))
    assert main(base + ["--route", "gemm-f16", "--compare", str(tmp_path / "g2.npy")]) == 1
    assert "OUTSIDE" in capsys.readouterr().out
    # bad input: one line each
    np.save(tmp_path / "bad.npy", x[:, :32])
    assert main(["matmul", qwen3, "blk.0.attn_q.weight", "--activations", str(tmp_path / "bad.npy"),
                 "--route", "cpu", "--out", str(tmp_path / "o.npy")]) == 2
    assert "the weight needs (tokens, 64)" in capsys.readouterr().err
    assert main(base + ["--route", "mmvq", "--cpu", "avx2", "--out", str(tmp_path / "o.npy")]) == 2
    assert main(base + ["--route", "cpu", "--out", str(tmp_path / "o.npy"), "--compare", str(tmp_path / "m.npy")]) == 2


# ---------------------------------------------------------------- kl with another engine's logits
def test_kl_with_an_external_engines_logits(tmp_path, qwen3, capsys):
    from strata_ref.infer.loader import load
    tok = tmp_path / "tokens.npz"
    assert main(["kl", qwen3, "--tokens-out", str(tok), "--limit", "2", "--max-tokens", "5", "--cpu", "avx2"]) == 0
    capsys.readouterr()
    d = dict(np.load(tok))
    m = load(qwen3, profile="avx2")
    # the "engine": this one's batched pass over REF's tokens, one row per position
    for i in range(2):
        ids = d[f"tokens:{i}"].tolist()
        d[f"logits:{i}"] = m.forward(ids, m.new_cache(64), all_logits=True)
    f = tmp_path / "test.npz"
    np.savez(f, **d)
    assert main(["kl", qwen3, "--test-logits", str(f), "--cpu", "avx2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # that engine is REF's own batched pass: KL is the noise floor, exactly
    assert doc["test"] == doc["floor"] and doc["test"]["n"] == 10
    # rows of the generated positions only give the same
    for i in range(2):
        d[f"logits:{i}"] = d[f"logits:{i}"][int(d[f"n_prompt:{i}"]) - 1:-1]
    np.savez(f, **d)
    assert main(["kl", qwen3, "--test-logits", str(f), "--cpu", "avx2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["test"] == doc["test"]
    d["tokens:1"] = d["tokens:1"].copy()
    d["tokens:1"][-2] = (d["tokens:1"][-2] + 1) % 259
    np.savez(f, **d)
    assert main(["kl", qwen3, "--test-logits", str(f), "--cpu", "avx2"]) == 2
    assert "sequence 1: REF generates" in capsys.readouterr().err
    assert main(["kl", qwen3]) == 2
    assert "one of them" in capsys.readouterr().err


def test_which_lists_a_profile_without_a_kernel_for_a_weight_type_as_not_run(tmp_path, capsys, monkeypatch):
    # every x86 profile now has every weight type's kernel: a candidate whose
    # profile lacks one (the NotImplementedError QMatrix raises, naming the
    # tensor type and the profile) is simulated here; it is listed as not
    # run, and the others still count
    import strata_ref.which as which_mod
    from infer_helpers import tiny_moe_model
    from strata_ref.which import candidate_logits
    path = tmp_path / "qwen3moe.gguf"
    tiny_moe_model("qwen3moe", path, seed=0)
    toks = np.array([257, 72, 101, 108, 108, 111], np.int64)
    logits = candidate_logits(str(path), "avx2", False, toks, None)
    f = tmp_path / "l.npz"
    np.savez(f, tokens=toks, logits=logits)

    def lacking(model, profile, *a, **k):
        if profile == "v0.4.0-sandybridge":
            raise NotImplementedError("Q4_K: ggml's avx kernel is not emulated yet on the CPU profile "
                                      "v0.4.0-sandybridge")
        return candidate_logits(model, profile, *a, **k)
    monkeypatch.setattr(which_mod, "candidate_logits", lacking)
    assert main(["which", str(f), str(path), "--cpu", "avx2,v0.4.0-sandybridge", "--flash-attn", "off",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {c["profile"]: c for c in doc["candidates"]}
    assert by["avx2"]["matches"] and by["avx2"]["not_emulated"] is None
    skip = by["v0.4.0-sandybridge"]["not_emulated"]
    assert "Q4_K" in skip and "v0.4.0-sandybridge" in skip and by["v0.4.0-sandybridge"]["equal_rows"] == 0


def test_which_says_in_a_short_phrase_what_a_model_does_not_emulate(tmp_path, capsys):
    # gemma4 refuses the caches not checked against llama.cpp (flash
    # attention with a q8_0 K and an F16 V cache): the candidate's line says
    # so in a few words (the error's
    # whole sentence, with its advice, once stood inside "... not emulated
    # on this profile"), and the JSON gives the bare phrase and its place
    from infer_helpers import tiny_gemma4
    path = tmp_path / "gemma4.gguf"
    tiny_gemma4("gemma4", path)
    f = tmp_path / "l.npz"
    np.savez(f, tokens=np.array([257, 72, 101]), logits=np.zeros((3, 8), np.float32))
    assert main(["which", str(f), str(path), "--cpu", "avx2,armv8.2-dotprod", "--flash-attn", "on",
                 "--cache-type-k", "q8_0"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  avx2            flash attention on : not run (flash attention and a q8_0 K cache " \
                     "not emulated for gemma4)"
    # (the arm64 profiles run gemma4's checked caches: the same refusal)
    assert out[2] == "  armv8.2-dotprod flash attention on : not run (flash attention and a q8_0 K cache " \
                     "not emulated for gemma4)"
    assert main(["which", str(f), str(path), "--cpu", "avx2", "--flash-attn", "on", "--cache-type-v", "q8_0",
                 "--json"]) == 2
    c, = json.loads(capsys.readouterr().out)["candidates"]
    assert (c["not_emulated"], c["not_emulated_where"], c["equal_rows"]) == ("flash attention and a q8_0 V cache",
                                                                            "for gemma4", 0)
    # not run: no distances (null; they were 0.0, which read as a perfect match)
    assert c["max_abs_diff"] is None and c["max_ulp"] is None


def test_which_takes_no_off_candidate_for_a_block_type_v_cache(tmp_path, capsys):
    # llama.cpp runs a q8_0 V cache only with flash attention: with the
    # default --flash-attn both, `which` compares the "on" candidates alone
    # (it stopped with "requires flash attention"); an explicit off still
    # says why it cannot be
    from infer_helpers import tiny_gemma4
    path = tmp_path / "gemma4.gguf"
    tiny_gemma4("gemma4", path)
    f = tmp_path / "l.npz"
    from strata_ref.gguf import read_file
    n_vocab = len(read_file(path).metadata["tokenizer.ggml.tokens"])
    np.savez(f, tokens=np.array([257, 72, 101]), logits=np.zeros((3, n_vocab), np.float32))
    q8 = ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"]
    assert main(["which", str(f), str(path), "--cpu", "avx2", *q8, "--json"]) == 1
    cands = json.loads(capsys.readouterr().out)["candidates"]
    assert [(c["profile"], c["flash_attn"], c["not_emulated"]) for c in cands] == [("avx2", True, None)]
    assert main(["which", str(f), str(path), "--cpu", "avx2", *q8, "--flash-attn", "off"]) == 2
    assert capsys.readouterr().err == ("strata-ref: error: a q8_0 V cache requires flash attention "
                                       "(llama.cpp: \"quantized V cache requires flash_attn to be enabled\")\n")


def test_which_says_when_the_key_list_is_cut(tmp_path):
    # an .npz without `logits`: the first 8 keys and how many more, not a
    # silently shortened list
    from strata_ref.which import load_logits
    f = tmp_path / "other.npz"
    np.savez(f, **{f"k{i:02d}": np.zeros(1) for i in range(14)})
    with pytest.raises(ValueError, match=r"no `logits` array \(keys: k00, k01, k02, k03, k04, k05, k06, "
                                         r"k07, \.\.\. \(6 more\)\)$"):
        load_logits(f)


def test_which_and_trace_take_the_context_length(tmp_path, capsys):
    # phi3's LongRoPE takes its short factors up to n_ctx 256 (the tiny
    # model's original context) and the long ones above: llama.cpp's avx2
    # logits at n_ctx 256 and 512 (tools/llama_ref.py moe, MOE_CTX) are
    # reproduced only at the n_ctx they were made with
    from infer_helpers import moe_seed, tiny_moe_model
    from strata_ref.tracefile import open_trace
    ref = np.load(DATA / "avx2" / "llama_ref_moe_phi3.npz")
    model = tmp_path / "phi3.gguf"
    tiny_moe_model("phi3", model, seed=moe_seed("phi3"))
    ids = ref["prompt_ids"].tolist() + ref["ctx256_greedy_ids"].tolist()
    short = ref["ctx256_batched"]
    assert (f32_bits(short) != f32_bits(ref["batched"][:len(ids)])).any()  # the factors matter here
    f = tmp_path / "short.npz"
    np.savez(f, tokens=np.array(ids), logits=short)
    args = ["which", str(f), str(model), "--cpu", "avx2", "--flash-attn", "off", "--json"]
    assert main(args) == 1                              # the default 512: long factors
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_ctx"] is None and doc["matches"] == []
    assert main(args + ["--ctx", "256"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_ctx"] == 256 and doc["candidates"][0]["equal_rows"] == len(ids)
    # an .npz that says its n_ctx needs no --ctx
    np.savez(f, tokens=np.array(ids), logits=short, n_ctx=np.int64(256))
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["n_ctx"] == 256
    # trace --ctx 256 records llama.cpp's short-factor logits and its n_ctx
    t = tmp_path / "t.npz"
    tok = ",".join(map(str, ids))
    assert main(["trace", str(model), "--tokens", tok, "--cpu", "avx2", "--ctx", "256",
                 "--tensors", "result_output", "--out", str(t)]) == 0
    assert "n_ctx 256" in capsys.readouterr().out
    with open_trace(t) as tr:
        assert tr.options["n_ctx"] == 256
        out = tr.array(tr.find("result_output")[0]).reshape(len(ids), -1)
    assert np.array_equal(f32_bits(out), f32_bits(short))
    # the trace records its calls (one batched): a --split that says
    # otherwise is refused, not used
    from strata_ref.which import load_logits
    with pytest.raises(ValueError, match=r"the trace ran one batched call, not --split 5 "
                                         r"\(leave --split out for a trace\)$"):
        load_logits(t, split=5)
    assert load_logits(t, split=len(ids)).split is None      # all ids in the first call: the same
    # a call of more than one ubatch (512 ids): a `result_output` node per
    # ubatch, joined again by which; its n_ctx the drivers' 768
    long = tmp_path / "long.npz"
    tok600 = ",".join(map(str, (ids * 20)[:600]))
    assert main(["trace", str(model), "--tokens", tok600, "--cpu", "avx2", "--tensors", "result_output",
                 "--out", str(long)]) == 0
    assert "600 tokens, one call; cpu avx2, n_ctx 768" in capsys.readouterr().out
    with open_trace(long) as tr:
        assert [e.shape[0] for e in tr.find("result_output")] == [512, 88]
    assert main(["which", str(long), str(model), "--cpu", "avx2", "--flash-attn", "off", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["n_ctx"], doc["candidates"][0]["equal_rows"]) == (768, 600)
    # kl: every pass of a sequence at one n_ctx, stored with REF's tokens
    # for the engine; its logits at another n_ctx are measured as such
    from strata_ref.infer.loader import load
    ref_toks, g = tmp_path / "tok.npz", tmp_path / "g.npz"
    assert main(["kl", str(model), "--tokens-out", str(ref_toks), "--limit", "1", "--max-tokens", "4",
                 "--cpu", "avx2"]) == 0
    capsys.readouterr()
    d = dict(np.load(ref_toks))
    n = int(d["n_ctx:0"])
    assert n == int(d["n_prompt:0"]) + 4 + 1 < 256           # short factors
    m = load(str(model), profile="avx2")
    for c, extra, same in ((n, [], True), (512, [], False), (512, ["--ctx", "512"], True)):
        d["logits:0"] = m.forward(d["tokens:0"].tolist(), m.new_cache(c), all_logits=True)
        np.savez(g, **d)
        assert main(["kl", str(model), "--test-logits", str(g), "--cpu", "avx2", "--json"] + extra) == 0
        doc = json.loads(capsys.readouterr().out)
        assert (doc["test"] == doc["floor"]) == same, (c, extra)
    # bad --ctx: one line, exit 2, nothing run
    for extra, msg in ((["--ctx", "0"], "--ctx 0 is below the minimum of 1 (one token)"),
                       (["--ctx", "3"], f"--ctx 3 holds fewer than the {len(ids)} token ids"),
                       (["--ctx", "100000"], "--ctx 100000 is more than the model's training context of ")):
        assert main(["trace", str(model), "--tokens", tok, "--cpu", "avx2", "--out", str(tmp_path / "x.npz")]
                    + extra) == 2
        assert msg in capsys.readouterr().err
    np.savez(f, tokens=np.array(ids), logits=short, n_ctx=np.float32(256))
    assert main(args) == 2
    assert "`n_ctx` must be one integer >= 1" in capsys.readouterr().err
