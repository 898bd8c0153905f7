"""The quality tools (strata_ref.quality): prompt files, model variants, KL
at generated positions, crest factors, the per-layer study, charts."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from infer_helpers import TINY_IDS, tiny_model
from strata_ref import GGMLType, quantize
from strata_ref.dequant import dequant_f32
from strata_ref.quality import kl, prompts, variants


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("q") / "tiny.gguf"
    tiny_model("qwen3", p, seed=0)
    return str(p)


# ------------------------------------------------------------------ prompts
def test_prompt_files(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("one\n\n two \\n three\n")
    assert prompts.load_prompts(f) == ["one", " two \n three"]
    f.write_text('{"prompt": "a"}\n"b"\n')
    assert prompts.load_prompts(f) == ["a", "b"]
    f.write_text('{"prompt": 3}\n')
    with pytest.raises(prompts.PromptError, match=r"p.txt:1: .*non-empty string"):
        prompts.load_prompts(f)
    f.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(prompts.PromptError, match=r":2: not a JSON line"):
        prompts.load_prompts(f)
    f.write_text("\n  \n")
    with pytest.raises(prompts.PromptError, match="no prompt"):
        prompts.load_prompts(f)
    assert len(prompts.DEFAULT_PROMPTS) >= 30 and len(set(prompts.DEFAULT_PROMPTS)) == len(prompts.DEFAULT_PROMPTS)


# ------------------------------------------------------------------ variants
def test_spec_parsing(tmp_path):
    assert variants.parse_spec("smollm2") == ("smollm2", None)
    assert variants.parse_spec("m.gguf@float") == ("m.gguf", "float")
    assert variants.parse_spec("m.gguf@A8TOKEN") == ("m.gguf", "a8token")
    assert variants.parse_spec("m.gguf@q4_k") == ("m.gguf", GGMLType.Q4_K)
    odd = tmp_path / "a@b.gguf"
    odd.write_bytes(b"")
    assert variants.parse_spec(str(odd)) == (str(odd), None)     # an existing path is not split
    with pytest.raises(variants.VariantError, match="unknown variant 'fp8'"):
        variants.parse_spec("m.gguf@fp8")


def test_fallback_types_are_llama_cpps():
    T = GGMLType
    assert variants.fallback_type(T.Q4_K, 4096) == T.Q4_K
    assert variants.fallback_type(T.Q4_K, 576) == T.Q5_0
    assert variants.fallback_type(T.Q6_K, 896) == T.Q8_0
    assert variants.fallback_type(T.IQ4_XS, 640) == T.IQ4_NL
    assert variants.fallback_type(T.TQ1_0, 576) == T.Q4_0
    assert variants.fallback_type(T.Q4_0, 40) == T.F16            # not even a 32-block fits


def test_requantized_matrix_is_the_reference_quantizer(tiny):
    m = variants.load_variant(tiny + "@Q4_K", "avx2")
    ref = variants.load_variant(tiny, "avx2")
    for (_, a, q), (_, _, o) in zip(variants.linear_matrices(m), variants.linear_matrices(ref)):
        want_t = variants.fallback_type(GGMLType.Q4_K, o.cols)
        assert q.type == want_t, a
        x = dequant_f32(o.type, o.raw, o.rows, o.cols)
        assert np.array_equal(q.raw, np.asarray(quantize(x, want_t), np.uint8).reshape(-1))


def test_float_and_a8token_products(tiny):
    m = variants.load_variant(tiny + "@float", "avx2")
    fm = m.layers[0].ffn.w_down
    assert isinstance(fm, variants.FloatMatrix)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, fm.cols)).astype(np.float32)
    w = fm._weights()
    # the documented order: 8 partial float64 sums (positions j mod 8), paired, tail last
    p = x.astype(np.float64)[:, None, :] * w.astype(np.float64)[None, :, :]
    k8 = fm.cols - fm.cols % 8
    s = p[..., :k8].reshape(3, fm.rows, -1, 8)
    acc = np.zeros((3, fm.rows, 8))
    for j in range(s.shape[2]):
        acc += s[:, :, j, :]
    tot = ((acc[..., 0] + acc[..., 4]) + (acc[..., 2] + acc[..., 6])) + ((acc[..., 1] + acc[..., 5]) + (acc[..., 3] + acc[..., 7]))
    for j in range(k8, fm.cols):
        tot = tot + p[..., j]
    assert np.array_equal(fm.matmul(x).view(np.uint32), tot.astype(np.float32).view(np.uint32))
    a8 = variants.A8TokenMatrix(fm._qm)
    # per token: d = amax / 127, q = rint(x / d); a row whose values are k * d exactly
    xr = np.zeros((1, fm.cols), np.float32)
    xr[0, :4] = [127.0, -63.5, 2.0, 0.25]      # d = 1: 127, -64 (half to even), 2, 0
    q = np.array([127.0, -64.0, 2.0, 0.0], np.float64)
    want = (q @ w[:, :4].astype(np.float64).T).astype(np.float32)
    assert np.array_equal(a8.matmul(xr)[0], want)


# ------------------------------------------------------------------ KL
def test_kl_rows_against_an_independent_float64_computation():
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((6, 300)) * 3).astype(np.float32)
    b = (a + rng.standard_normal((6, 300)).astype(np.float32) * 0.3).astype(np.float32)
    toks = rng.integers(0, 300, 6)
    r = kl.kl_rows(a, b, toks)
    for i in range(6):
        la = a[i].astype(np.float64) - np.logaddexp.reduce(a[i].astype(np.float64))
        lb = b[i].astype(np.float64) - np.logaddexp.reduce(b[i].astype(np.float64))
        want = float(np.sum(np.exp(la) * (la - lb)))
        assert abs(r["kl"][i] - want) <= 1e-12 * max(1.0, want)
        assert abs(r["dp"][i] - (np.exp(lb[toks[i]]) - np.exp(la[toks[i]]))) < 1e-15
    z = kl.kl_rows(a, a, toks)
    assert np.all(z["kl"] == 0.0) and np.all(z["dp"] == 0.0) and z["top1"].all()


def test_kl_of_a_model_against_itself_is_its_noise_floor(tiny):
    ref = variants.load_variant(tiny, "avx2")
    res, st, fl = kl.run_kl(ref, ref, ["Hello", "abc"], max_tokens=5)
    # TEST = REF: TEST's pass is REF's own batched pass, so the statistics
    # are exactly the noise floor's
    for k in st:
        assert st[k] == fl[k], k
    assert st["n"] == sum(len(r.tokens) for r in res) == 10


def test_kl_of_a_variant_is_positive(tiny):
    ref = variants.load_variant(tiny + "@float", "avx2")
    test = variants.load_variant(tiny + "@Q4_0", "avx2")
    res, st, fl = kl.run_kl(ref, test, ["Hello"], max_tokens=6)
    assert st["kl_mean"] > 10 * max(fl["kl_mean"], 1e-12)
    assert 0.0 <= st["top1"] <= 1.0 and st["kl_max"] >= st["kl_p99"] >= st["kl_median"] >= 0.0


def test_kl_command_json(tiny, capsys):
    from strata_ref.cli import main
    assert main(["kl", tiny + "@float", tiny, "--limit", "2", "--max-tokens", "3", "--cpu", "scalar",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cpu"] == "scalar" and len(doc["prompts"]) == 2
    assert doc["test"]["n"] == 6 and len(doc["prompts"][0]["kl"]) == 3
    assert main(["kl", tiny + "@fp9", tiny]) == 2
    assert "unknown variant 'fp9'" in capsys.readouterr().err


# ------------------------------------------------------------------ crest factors
def test_crest_factor_of_a_planted_massive_channel():
    from strata_ref.quality.layers import crest_stats
    d = 64
    x = np.ones((10, d), np.float32)
    x[:, 5] = 100.0                              # one massive channel in every token
    s = crest_stats(x)
    rms = np.sqrt((100.0 ** 2 + (d - 1)) / d)
    assert s["channel"] == 5 and s["channel_share"] == 1.0
    assert s["crest_median"] == pytest.approx(100.0 / rms, rel=1e-12)
    assert s["channel_ratio"] == pytest.approx(100.0, rel=1e-12)
    flat = crest_stats(np.ones((3, d), np.float32))
    assert flat["crest_median"] == pytest.approx(1.0)


def test_charts_are_written(tiny, tmp_path):
    pytest.importorskip("matplotlib")
    from strata_ref.quality import charts
    ref = variants.load_variant(tiny + "@float", "avx2")
    test = variants.load_variant(tiny + "@Q4_0", "avx2")
    res, _, _ = kl.run_kl(ref, test, ["Hi"], max_tokens=3)
    p = charts.kl_distribution(tmp_path, res, "tiny")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    study = {"model": "tiny", "type": "Q4_0", "cpu": "avx2",
             "layers": [{"kl_weight": 0.1, "kl_act": -0.01, "kl_full": 0.09,
                         "attn_input": {"crest_median": 3.0}, "ffn_input": {"crest_median": 9.0}}] * 3}
    for fn in (charts.layer_kl, charts.crest):
        assert fn(tmp_path, study).stat().st_size > 1000


def test_kl_command_several_tests_share_one_reference(tiny, capsys):
    from strata_ref.cli import main
    assert main(["kl", tiny + "@float", tiny, tiny + "@Q4_0", "--limit", "1", "--max-tokens", "3",
                 "--cpu", "avx2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["test_spec"] for t in doc["tests"]] == [tiny, tiny + "@Q4_0"]
    one, two = doc["tests"]
    assert one["prompts"][0]["tokens"] == two["prompts"][0]["tokens"]       # one REF generation
    assert one["floor"] == two["floor"] == doc["floor"]


def test_json_output_is_strict_json():
    """`kl --json` with one generated position has no standard error: it is
    written as null, never as NaN (which strict JSON readers refuse)."""
    import json
    from strata_ref.cli.common import finite as _finite
    doc = {"kl_se": float("nan"), "v": [1.5, float("inf")], "n": 1}
    assert json.dumps(_finite(doc), allow_nan=False) == '{"kl_se": null, "v": [1.5, null], "n": 1}'


def test_prompt_files_binary_and_bom(tmp_path):
    from strata_ref.quality.prompts import PromptError, load_prompts
    b = tmp_path / "b.txt"
    b.write_bytes(b"\xc9\x00\xff garbage")
    with pytest.raises(PromptError, match="not UTF-8 text"):
        load_prompts(b)
    t = tmp_path / "t.txt"
    t.write_bytes("\ufeffThe sky is\nWater is\n".encode("utf-8"))
    assert load_prompts(t) == ["The sky is", "Water is"]


@pytest.mark.parametrize("t", ["Q8_1", "q8_k"])
def test_activation_block_types_are_not_weight_variants(t):
    from strata_ref.quality.variants import VariantError, parse_spec
    with pytest.raises(VariantError, match="activation block type"):
        parse_spec(f"smollm2@{t}")


def test_prompt_file_must_be_a_bounded_regular_file(tmp_path, monkeypatch):
    # `kl --prompts /dev/zero` read until the machine ran out of memory
    import os
    from strata_ref.quality import prompts as P
    with pytest.raises(P.PromptError, match="not a regular file"):
        P.load_prompts("/dev/zero")
    with pytest.raises(P.PromptError, match="not a regular file"):
        P.load_prompts(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(P.PromptError, match="not a regular file"):
        P.load_prompts(fifo)
    big = tmp_path / "big.txt"
    big.write_text("hello\n" * 20)
    monkeypatch.setattr(P, "MAX_PROMPT_FILE", 100)
    with pytest.raises(P.PromptError, match="120 bytes, more than a prompt file may hold"):
        P.load_prompts(big)
    monkeypatch.setattr(P, "MAX_PROMPT_FILE", 120)
    assert P.load_prompts(big) == ["hello"] * 20


def test_kl_of_rows_of_huge_logits_keeps_the_normaliser():
    # a TEST row of equal logits 3e38 is the uniform distribution: KL(p||u)
    # = log(V) - H(p) >= 0, computed here in float64 by hand; the old
    # log-softmax rounded log(V) away against 3e38 and gave -3.5
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 50)).astype(np.float32)
    test = np.full((1, 50), 3e38, np.float32)
    z = ref[0].astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    want = math.log(50) + float((p * np.log(p)).sum())
    got = kl.kl_rows(ref, test, [0])["kl"][0]
    assert want > 0 and abs(got - want) <= 1e-12 * want


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_test_logits_with_non_finite_rows_are_refused(tmp_path, bad):
    rows = np.zeros((3, 8), np.float32)
    rows[1, 2] = bad
    f = tmp_path / "t.npz"
    np.savez(f, tokens=np.array([1, 2, 3, 4]), n_prompt=np.array(1), logits=rows)
    with pytest.raises(ValueError, match=r"row that predicts generated id 1 .*finite"):
        kl.load_test_logits(f, 8)
