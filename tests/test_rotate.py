"""`strata-ref rotate`: the offline residual-stream rotation.

* the Hadamard constructions (Sylvester, Paley I and II, Kronecker
  products) and the seeded randomized Hadamard transform;
* the transform is the same function: a float64 restatement of the
  llama / qwen2 graph gives the original's logits from the rotated file to
  float64 rounding, on tiny random models whose norm weights and one
  massive channel make every fold and rotation matter;
* in float32 (`@float` weights and an F32 KV cache, strata-ref's own
  arithmetic) the rotated model's logits equal the original's within a
  rounding bound derived from the model's own sensitivity to a
  perturbation of its weights by one unit roundoff (the rotated weights'
  float32 rounding is such a perturbation);
* the file: norms 1, a tied output written out, metadata, errors; and
  llama.cpp's logits on a rotated SmolLM2 equal strata-ref's bit for bit
  (tests/data/<profile>/llama_ref_smollm2-rot-q8_0.npz, the file rebuilt
  here: the rotation is bit-reproducible).
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from infer_helpers import load_model, model_path, profile_files
from strata_ref import GGMLType, gguf
from strata_ref.quality.rotate import (RandomizedHadamard, RotateError, hadamard_factors,
                                       hadamard_matrix, rotate_gguf)


# ------------------------------------------------------------ Hadamard
@pytest.mark.parametrize("n", [1, 2, 4, 8, 12, 20, 24, 28, 36, 44, 48, 64, 72, 576, 640, 896, 1024])
def test_hadamard_matrix_is_hadamard(n):
    h = hadamard_matrix(n)
    assert h.shape == (n, n) and set(np.unique(h)) <= {-1, 1}
    assert np.array_equal(h @ h.T, n * np.eye(n, dtype=np.int64))


def test_hadamard_factors_use_paley_and_sylvester():
    assert [f.shape[0] for f in hadamard_factors(576)] == [12, 12, 4]
    assert [f.shape[0] for f in hadamard_factors(896)] == [28, 8, 4]
    assert [f.shape[0] for f in hadamard_factors(64)] == [8, 8]
    # 28 = 2 (13 + 1): Paley II; 12 = 11 + 1: Paley I
    assert hadamard_factors(28)[0].shape == (28, 28)


@pytest.mark.parametrize("n", [3, 6, 10, 18, 0, -4])
def test_hadamard_impossible_orders(n):
    with pytest.raises(RotateError):
        hadamard_factors(n)


def test_randomized_hadamard_is_orthogonal_and_seeded():
    q = RandomizedHadamard(48, 3)
    m = q.matrix()
    assert np.abs(m @ m.T - np.eye(48)).max() < 1e-14
    x = np.random.default_rng(0).standard_normal((5, 48))
    assert np.abs(q.right(x) - x @ m).max() < 1e-13
    assert np.abs(q.right_t(x) - x @ m.T).max() < 1e-13
    assert np.array_equal(RandomizedHadamard(48, 3).signs, q.signs)
    assert not np.array_equal(RandomizedHadamard(48, 4).signs, q.signs)
    # H diag(s) / sqrt(n), H the Kronecker product of the factors
    assert np.allclose(m, hadamard_matrix(48) * q.signs / np.sqrt(48))


# ------------------------------------------------------------ tiny models
def _tiny(path, arch, seed=0, tied=True, biases=False, extra_tokens=0, **split):
    """A tiny float model: n_embd 48 (Paley 12 x Sylvester 4), 3 heads of
    16 over 1 KV head, n_ff 96, 3 layers, random norm weights and a massive
    embedding channel; `extra_tokens` more (control) tokens make the
    embedding as large as asked."""
    from strata_ref.gguf import GGUFValueType as V
    from tiny_gguf import byte_tokens, metadata, write
    rng = np.random.default_rng(seed)
    L, E, H, KV, D, F = 3, 48, 3, 1, 16, 96
    md = metadata(arch, layers=L, embd=E, ff=F, heads=H, kv_heads=KV, eps=1e-5, rope_base=1e4)
    if extra_tokens:
        md["tokenizer.ggml.tokens"] = (V.ARRAY, byte_tokens() + [f"<|x{i}|>" for i in range(extra_tokens)],
                                       V.STRING)
        md["tokenizer.ggml.token_type"] = (V.ARRAY, [1] * 257 + [3, 3] + [3] * extra_tokens, V.INT32)
    nv = len(md["tokenizer.ggml.tokens"][1])
    t = []

    def f32(name, a):
        a = np.ascontiguousarray(a, np.float32)
        t.append((name, GGMLType.F32, a.shape[::-1], a))

    emb = rng.standard_normal((nv, E)) * 0.5
    emb[:, 7] *= 30                                     # a massive channel
    f32("token_embd.weight", emb)
    for i in range(L):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", 0.5 + rng.random(E))
        f32(p + "attn_q.weight", rng.standard_normal((H * D, E)) * 0.2)
        f32(p + "attn_k.weight", rng.standard_normal((KV * D, E)) * 0.2)
        f32(p + "attn_v.weight", rng.standard_normal((KV * D, E)) * 0.2)
        if biases:
            f32(p + "attn_q.bias", rng.standard_normal(H * D) * 0.1)
            f32(p + "attn_k.bias", rng.standard_normal(KV * D) * 0.1)
            f32(p + "attn_v.bias", rng.standard_normal(KV * D) * 0.1)
        f32(p + "attn_output.weight", rng.standard_normal((E, H * D)) * 0.2)
        f32(p + "ffn_norm.weight", 0.5 + rng.random(E))
        f32(p + "ffn_gate.weight", rng.standard_normal((F, E)) * 0.2)
        f32(p + "ffn_up.weight", rng.standard_normal((F, E)) * 0.2)
        f32(p + "ffn_down.weight", rng.standard_normal((E, F)) * 0.2)
    f32("output_norm.weight", 0.5 + rng.random(E))
    if not tied:
        f32("output.weight", rng.standard_normal((nv, E)) * 0.3)
    write(path, md, t, **split)


def _forward64(path, ids):
    """float64 logits of the llama / qwen2 graph over `ids` (a restatement
    of infer.model in numpy float64: rms_norm, RoPE normal / NeoX, causal
    GQA attention, SwiGLU)."""
    from strata_ref.infer.dense import HParams
    from strata_ref.quality.rotate import _f64
    f = gguf.read(path)
    hp = HParams.from_metadata(f.metadata)
    T = {t.name: _f64(t) for t in f.tensors}
    n, d, hd = len(ids), hp.n_embd, hp.head_dim

    def norm(x, g):
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + hp.eps) * g

    pos = np.arange(n)[:, None]
    half = hd // 2
    theta = pos * hp.rope_base ** (-2.0 * np.arange(half) / hd)
    cos, sin = np.cos(theta), np.sin(theta)

    def rope(x):                       # (n, heads, hd)
        if hp.neox:
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * cos[:, None] - b * sin[:, None], a * sin[:, None] + b * cos[:, None]], -1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos[:, None] - b * sin[:, None]
        out[..., 1::2] = a * sin[:, None] + b * cos[:, None]
        return out

    x = T["token_embd.weight"][ids]
    G = hp.n_head // hp.n_head_kv
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        h = norm(x, T[p + "attn_norm.weight"])
        q = h @ T[p + "attn_q.weight"].T + T.get(p + "attn_q.bias", 0)
        k = h @ T[p + "attn_k.weight"].T + T.get(p + "attn_k.bias", 0)
        v = h @ T[p + "attn_v.weight"].T + T.get(p + "attn_v.bias", 0)
        q = rope(q.reshape(n, hp.n_head, hd))
        k = rope(k.reshape(n, hp.n_head_kv, hd))
        v = v.reshape(n, hp.n_head_kv, hd)
        a = np.empty((n, hp.n_head, hd))
        for j in range(hp.n_head):
            s = q[:, j] @ k[:, j // G].T / np.sqrt(hd) + mask
            w = np.exp(s - s.max(axis=1, keepdims=True))
            a[:, j] = (w / w.sum(axis=1, keepdims=True)) @ v[:, j // G]
        x = x + a.reshape(n, -1) @ T[p + "attn_output.weight"].T
        h = norm(x, T[p + "ffn_norm.weight"])
        g, u = h @ T[p + "ffn_gate.weight"].T, h @ T[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ T[p + "ffn_down.weight"].T
    out = T.get("output.weight", T["token_embd.weight"])
    return norm(x, T["output_norm.weight"]) @ out.T


IDS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33]


@pytest.mark.parametrize("arch, tied, biases", [("llama", True, False), ("qwen2", False, True)])
def test_rotated_model_is_the_same_function_in_float64(tmp_path, arch, tied, biases):
    src, dst = tmp_path / "m.gguf", tmp_path / "r.gguf"
    _tiny(src, arch, tied=tied, biases=biases)
    summary = rotate_gguf(src, dst, type="F32", seed=5)
    assert summary["hadamard"] == [12, 4] and summary["tied_output_written"] is tied
    a, b = _forward64(src, IDS), _forward64(dst, IDS)
    # the rotated weights are float32: their rounding (2^-24 relative) is
    # the only difference left
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    # without the folds / per-head rotation the function changes
    assert np.abs(a).max() > 1


def test_rotated_file_layout(tmp_path):
    src, dst = tmp_path / "m.gguf", tmp_path / "r.gguf"
    _tiny(src, "llama")
    rotate_gguf(src, dst, type="Q8_0", seed=1)
    f = gguf.read(dst)
    names = [t.name for t in f.tensors]
    assert "output.weight" in names and names.index("output.weight") < names.index("token_embd.weight")
    by = {t.name: t for t in f.tensors}
    for n in ("blk.0.attn_norm.weight", "blk.2.ffn_norm.weight", "output_norm.weight"):
        assert np.array_equal(by[n].data.view(np.float32), np.ones(48, np.float32))
    # rows of 48 do not fit Q8_0's block: llama.cpp's fallback, F16
    assert by["blk.0.attn_q.weight"].type == GGMLType.F16
    assert by["blk.0.ffn_down.weight"].type == GGMLType.Q8_0        # rows of 96
    assert f.metadata["strata_ref.rotate.seed"] == 1
    assert f.metadata["general.architecture"] == "llama"
    # the same seed gives the same bytes
    rotate_gguf(src, tmp_path / "r2.gguf", type="Q8_0", seed=1)
    assert (tmp_path / "r2.gguf").read_bytes() == dst.read_bytes()


def test_rotate_streams_its_output(tmp_path):
    """The rotated tensors are computed and written one at a time (the
    embedding and every linear that reads the stream in chunks of rows):
    `rotate` held every tensor of the model in float64 before it wrote the
    file, 2.0 GB of RSS on SmolLM2-135M for a 128 MB output. Here a tied
    embedding of 33027 x 48 (F32: 6.3 MB, float64 12.7 MB, written twice:
    as output.weight and token_embd.weight): the peak of traced
    allocations must stay below the largest output tensor plus 16 MiB of
    chunk scratch (a chunk of 2^18 values in float64 is 2 MiB; the
    transform holds a few copies), where holding the model's rotated
    float64 tensors takes over 25 MB."""
    import tracemalloc
    src, dst = tmp_path / "m.gguf", tmp_path / "r.gguf"
    _tiny(src, "llama", extra_tokens=32768)
    rotate_gguf(src, tmp_path / "warm.gguf", type="F32", seed=0)      # compiled before measuring
    emb_bytes = 33027 * 48 * 4
    tracemalloc.start()
    try:
        rotate_gguf(src, dst, type="F32", seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < emb_bytes + (16 << 20), peak
    assert dst.read_bytes() == (tmp_path / "warm.gguf").read_bytes()


def test_rotate_errors(tmp_path):
    from infer_helpers import tiny_model
    g = tmp_path / "g.gguf"
    tiny_model("gemma3", g)
    with pytest.raises(RotateError, match="gemma3.*post-attention"):
        rotate_gguf(g, tmp_path / "o.gguf")
    src = tmp_path / "m.gguf"
    _tiny(src, "llama")
    with pytest.raises(ValueError, match="--seed"):
        rotate_gguf(src, tmp_path / "o.gguf", seed=-1)
    with pytest.raises(ValueError):
        rotate_gguf(src, tmp_path / "o.gguf", type="Q9_9")


def test_rotate_cli_refuses_before_it_writes(tmp_path, capsys):
    """What a new user's trial found: OUT reached through a link or as
    another shard of the input set, bad --limit / --max-tokens / --types
    with --measure: each a one-line error (exit 2), and nothing written."""
    import os
    from strata_ref.cli import main
    src = tmp_path / "m.gguf"
    _tiny(src, "llama")
    link = tmp_path / "link.gguf"
    os.symlink(src, link)
    before = src.read_bytes()
    assert main(["rotate", str(src), str(link)]) == 2
    assert "must not be the input file" in capsys.readouterr().err
    assert src.read_bytes() == before
    # a hard link is the same file under another name: it was overwritten
    hard = tmp_path / "hard.gguf"
    os.link(src, hard)
    assert main(["rotate", str(src), str(hard)]) == 2
    assert "must not be the input file" in capsys.readouterr().err
    assert src.read_bytes() == before
    # a directory that does not exist: refused before the rotation runs
    assert main(["rotate", str(src), str(tmp_path / "nope" / "o.gguf")]) == 2
    assert capsys.readouterr().err.strip() == (f"strata-ref: error: rotate: OUT {tmp_path / 'nope' / 'o.gguf'}: "
                                               f"{tmp_path / 'nope'} is not a directory")
    out = tmp_path / "o.gguf"
    for bad, msg in ((["--limit", "0"], "--limit must be >= 1"), (["--limit", "-3"], "--limit must be >= 1"),
                     (["--max-tokens", "0"], "--max-tokens must be >= 1"), (["--types", "Q8_0,Q4_Z"], "Q4_Z")):
        assert main(["rotate", str(src), str(out), "--measure", *bad]) == 2
        assert msg in capsys.readouterr().err
        assert not out.exists()


def test_rotating_a_split_set_writes_one_plain_file(tmp_path):
    """The input may be a gguf-split set (any shard); the output is one
    file, so it carries no `split.*` keys, and it reads back whole."""
    src = tmp_path / "m.gguf"
    _tiny(src, "llama")
    f = gguf.read(src)
    d = tmp_path / "split"
    d.mkdir()
    _tiny(d / "s.gguf", "llama", split_max_tensors=10)
    shards = sorted(d.glob("*.gguf"))
    assert len(shards) > 1
    out = tmp_path / "r.gguf"
    rotate_gguf(shards[1], out, type="F32", seed=0)
    r = gguf.read(out)
    assert not [k for k in r.metadata if k.startswith("split.")]
    assert len(r.shards) == 1 and {t.name for t in r.tensors} >= {t.name for t in f.tensors}


#: float arithmetic throughout: float32 weights (@float) and an F32 KV cache
#: (the default F16 cache rounds q, k, v and the probabilities to F16, in
#: another basis once V is rotated per head)
F32_CACHE = {"type_k": "f32", "type_v": "f32"}


def _float_logits(spec, ids, profile="avx512"):
    from strata_ref.quality.variants import load_variant
    m = load_variant(spec, profile)
    return m, m.forward(ids, m.new_cache(len(ids) + 1, **F32_CACHE), all_logits=True)


def _perturbed_logits(m, ids, seed=0):
    """m's @float logits with every weight of every matrix multiplied by
    (1 +- 2^-24) (random signs): the response to a one-unit-roundoff
    perturbation of the weights."""
    from strata_ref.quality.variants import FloatMatrix, linear_matrices
    rng = np.random.default_rng(seed)
    for _, _, fm in linear_matrices(m):
        if isinstance(fm, FloatMatrix):
            w = fm._weights()
            fm._w = (w * (1 + rng.choice([-1.0, 1.0], w.shape) * 2.0 ** -24)).astype(np.float32)
    return m.forward(ids, m.new_cache(len(ids) + 1, **F32_CACHE), all_logits=True)


def _check_float32(src, dst, ids):
    """The rotated model's @float logits against the original's, within
    4 times the original's response to a unit-roundoff weight perturbation:
    the rotated model differs from the original by its weights' float32
    rounding (at most a relative unit roundoff each, the probe's size) and
    by the rounding of its activations in another basis (the same order:
    every product is rounded to float32 in both), first-order effects that
    add; the factor covers both and a typical-to-worst margin of 2."""
    m, a = _float_logits(f"{src}@float", ids)
    _, b = _float_logits(f"{dst}@float", ids)
    probe = np.abs(_perturbed_logits(m, ids) - a).max()
    bound = 4 * max(probe, 2.0 ** -24 * np.abs(a).max())
    diff = np.abs(a - b).max()
    assert diff <= bound, (diff, bound)
    assert np.array_equal(np.argmax(a, axis=1), np.argmax(b, axis=1))
    return diff, bound


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rotated_float32_logits_within_the_rounding_bound(tmp_path, arch):
    src, dst = tmp_path / "m.gguf", tmp_path / "r.gguf"
    _tiny(src, arch, tied=arch == "llama", biases=arch == "qwen2")
    rotate_gguf(src, dst, type="F32", seed=2)
    _check_float32(src, dst, IDS)


@pytest.mark.slow
def test_rotated_smollm2_float32_logits_within_the_rounding_bound(tmp_path):
    src = model_path("SmolLM2-135M-Instruct")
    dst = tmp_path / "r.gguf"
    rotate_gguf(src, dst, type="F32", seed=0)
    m, _ = _float_logits(f"{src}@float", [1])
    ids = m.tokenizer.encode("The capital of France is", add_special=True)
    _check_float32(src, dst, ids)


# ------------------------------------------------ llama.cpp on a rotated file
ROT_REF = "llama_ref_smollm2-rot-q8_0.npz"


def _rotated_smollm2(tmp_path_factory):
    p = tmp_path_factory.mktemp("rot") / "smollm2-rot-q8_0.gguf"
    if not p.exists():
        rotate_gguf(model_path("SmolLM2-135M-Instruct"), p, type="Q8_0", seed=0)
    return p


@pytest.fixture(scope="module")
def rotated_smollm2(tmp_path_factory):
    return _rotated_smollm2(tmp_path_factory)


@pytest.mark.parametrize("profile, path", [pytest.param(*p.values, id=p.values[0])
                                           for p in profile_files(ROT_REF)])
def test_llama_cpp_runs_the_rotated_file_as_strata_ref_does(profile, path, rotated_smollm2):
    from strata_ref.infer.loader import load
    ref = np.load(path)
    assert str(ref["profile"]) == profile
    assert hashlib.sha256(rotated_smollm2.read_bytes()).hexdigest() == str(ref["sha256"]), \
        "the rotated file is not the one llama.cpp ran (the rotation is not reproducible?)"
    m = load(rotated_smollm2, profile=profile)
    ids = ref["prompt_ids"].tolist() + ref["greedy_ids"].tolist()
    n = len(ref["prompt_ids"])
    cache = m.new_cache(512)
    incr = np.concatenate([m.forward(ids[:n], cache, all_logits=True)] +
                          [m.forward([t], cache)[None] for t in ids[n:]])
    got = np.take_along_axis(incr, ref["incr_ids"], axis=1)
    assert np.array_equal(got.view(np.uint32), ref["incr_logits"].view(np.uint32))
    # greedy: strata-ref's continuation is llama.cpp's
    assert np.argmax(incr[n - 1:-1], axis=1).tolist() == ref["greedy_ids"].tolist()


# ------------------------------------------------------------ the study
def test_rotation_study_on_a_planted_massive_channel(tmp_path):
    """`rotation_study` (what `rotate --measure` prints): the rotated model
    is the same function (its @float KL against the original's @float is at
    the float32 rounding level, far below the int8 cost), and the planted
    channel (x30 in the embedding) that sets the crest factor of layer 0's
    attention input is spread by the rotation."""
    from strata_ref.quality.rotate import rotation_study
    src, dst = tmp_path / "m.gguf", tmp_path / "r.gguf"
    _tiny(src, "llama")
    rotate_gguf(src, dst, type="F32", seed=0)
    res = rotation_study(str(src), str(dst), ["Hello world!", "abc abc"], max_tokens=4,
                         types=("Q8_0",), profile="avx2")
    assert res["positions"] == 8 and [L["layer"] for L in res["layers"]] == [0, 1, 2]
    kl = res["kl"]
    assert set(kl) == {"rot@float", "orig@a8token", "rot@a8token", "orig@Q8_0", "rot@Q8_0"}
    # the same function: float32 rounding (1e-12 here) against the int8 cost (1e-8)
    assert kl["rot@float"]["kl_mean"] < kl["orig@a8token"]["kl_mean"] / 100
    assert kl["rot@float"]["top1"] == 1.0
    assert kl["rot@a8token"]["kl_mean"] < kl["orig@a8token"]["kl_mean"]
    o, r = res["layers"][0]["orig"]["attn"], res["layers"][0]["rot"]["attn"]
    assert o["channel"] == 7 and o["crest_median"] > 2 * r["crest_median"]
    wq = [res["layers"][0][k]["linears"]["wq"] for k in ("orig", "rot")]
    assert wq[1]["out_a8"] < wq[0]["out_a8"] / 2
