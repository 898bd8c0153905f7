"""The forward pass against llama.cpp on the two handed models: the greedy
continuation listed in spec/models.md §5 and stored by tools/llama_ref.py,
and teacher-forced logits stored by tools/llama_ref.py (bit for bit, batched
and incremental), plus the pieces that can be checked by hand (RoPE styles,
RMSNorm, errors)."""
from __future__ import annotations

import io

import numpy as np
import pytest

from strata_ref.infer.dense import HParams
from strata_ref.infer.model import ModelLoadError, apply_rope, rms_norm, rope_cos_sin
from infer_helpers import load_model, model_path

PROMPT = "The capital of France is"
SMOL = "SmolLM2-135M-Instruct"
QWEN = "Qwen2.5-Coder-0.5B-Instruct"
# spec/models.md §5 (llama.cpp 0.3.36, greedy)
SPEC = {
    SMOL: dict(prompt=[504, 3575, 282, 4649, 314],
               first=[7042, 30, 198, 198, 504, 1797, 1918, 553, 253, 2155, 282, 4723, 216, 35, 33,
                      33, 2215, 701, 30, 198, 198, 504],
               text=" Paris.\n\nThe United States has a population of approximately 311 million "
                    "people.\n\nThe United States has a population of approximately 31"),
    QWEN: dict(prompt=[785, 6722, 315, 9625, 374],
               first=[12095, 13, 12095, 374, 7407, 304, 279, 10200, 30282, 949],
               text=" Paris. Paris is located in the northwestern part of France. The capital of "
                    "France is located in the northwestern part of France. Paris is located in the"),
}


def _greedy(m, ids, n):
    cache = m.new_cache(512)
    logits = m.forward(ids, cache)
    out = []
    for i in range(n):
        out.append(int(np.argmax(logits)))
        if i + 1 < n:
            logits = m.forward([out[-1]], cache)
    return out


def _check_greedy(name, profile):
    m = load_model(name, profile)
    spec = SPEC[name]
    ids = m.tokenizer.encode(PROMPT)
    assert ids == spec["prompt"]            # no BOS: add_bos_token is false in both files
    gen = _greedy(m, ids, 32)
    assert gen[:len(spec["first"])] == spec["first"]
    assert m.tokenizer.decode(gen) == spec["text"]


def test_smollm2_greedy_continuation_is_spec():
    # the same in every profile (tests/test_cpu_profiles.py checks each one
    # against its llama.cpp build)
    _check_greedy(SMOL, "avx2")


@pytest.mark.slow
def test_qwen_greedy_continuation_is_spec():
    # spec §5 was made by an AVX2 build: its third token is a near-tie
    # inside llama.cpp (" Paris" 12095 vs " The" 576, 0.05 apart) that the
    # AVX-512 build decides the other way (docs/inference.md)
    _check_greedy(QWEN, "avx2")


def test_batched_equals_incremental_argmax():
    # like with like: our batched pass and our incremental pass pick the same tokens
    m = load_model(SMOL)
    ids = SPEC[SMOL]["prompt"] + SPEC[SMOL]["first"][:6]
    batched = m.forward(ids, m.new_cache(64), all_logits=True)
    cache = m.new_cache(64)
    m.forward(ids[:5], cache)
    for i in range(5, len(ids)):
        row = m.forward([ids[i]], cache)
        assert int(np.argmax(row)) == int(np.argmax(batched[i]))


def test_run_generate_streams_text_and_speed_line():
    from strata_ref.cli.inference import run_generate
    buf, err = io.StringIO(), io.StringIO()
    assert run_generate(str(model_path(SMOL)), PROMPT, max_tokens=4, out=buf, err=err) == 0
    # the text alone on `out` (4 tokens: " Paris", ".", "\n", "\n"), ending
    # with one newline more; the speeds on `err`
    assert buf.getvalue() == PROMPT + SPEC[SMOL]["text"][:9] + "\n"
    last = err.getvalue().splitlines()[0]
    assert "prompt: 5 tokens" in last and "tok/s" in last and "decode: 4 tokens (3 passes)" in last


def test_run_generate_says_when_the_context_stopped_it():
    from strata_ref.cli.inference import run_generate
    buf, err = io.StringIO(), io.StringIO()
    # 5 prompt tokens in a context of 7: two tokens of the 5 asked for
    assert run_generate(str(model_path(SMOL)), PROMPT, max_tokens=5, n_ctx=7, out=buf, err=err) == 0
    assert "decode: 2 tokens (1 pass; stopped: the context of 7 tokens is full)" in err.getvalue()
    assert "stopped" not in buf.getvalue()
    buf, err = io.StringIO(), io.StringIO()
    assert run_generate(str(model_path(SMOL)), PROMPT, max_tokens=1, n_ctx=7, out=buf, err=err) == 0
    assert "decode: 1 token (0 passes)" in err.getvalue() and "stopped" not in err.getvalue()


def test_run_generate_chat_and_context_errors():
    from strata_ref.infer import generate, load
    from strata_ref.infer.sampling import Sampler
    m = load_model(SMOL)
    with pytest.raises(ValueError, match="context holds 8"):
        generate(m, list(range(100, 120)), 4, Sampler(), n_ctx=8)
    from strata_ref.cli.inference import run_generate
    buf, err = io.StringIO(), io.StringIO()
    assert run_generate(str(model_path(SMOL)), "Say hi", max_tokens=2, chat=True, out=buf, err=err) == 0
    assert "tok/s" in err.getvalue() and "tok/s" not in buf.getvalue()


# ---------------------------------------------------------------- by hand
def test_rope_styles_pair_different_values():
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 8)
    cos = np.zeros((1, 4), np.float32)
    sin = np.ones((1, 4), np.float32)          # a rotation by 90 degrees
    normal = apply_rope(x, cos, sin, 8, neox=False)[0, 0]
    neox = apply_rope(x, cos, sin, 8, neox=True)[0, 0]
    # normal: (x0, x1) -> (-x1, x0) on consecutive pairs
    assert normal.tolist() == [-1, 0, -3, 2, -5, 4, -7, 6]
    # NeoX: (x_i, x_{i+4}) -> (-x_{i+4}, x_i)
    assert neox.tolist() == [-4, -5, -6, -7, 0, 1, 2, 3]


def test_rope_angles_are_repeated_float32_products():
    cos, sin = rope_cos_sin(np.array([3]), 8, 10000.0, 1.0)
    ts = np.float32(10000.0) ** np.float32(-2.0 / 8)
    theta = np.float32(3.0)
    for i in range(4):
        assert cos[0, i] == np.float32(np.cos(np.float64(theta)))
        theta = np.float32(theta * ts)


def test_rms_norm_by_hand():
    x = np.array([[3.0, 4.0]], np.float32)
    w = np.array([1.0, 2.0], np.float32)
    y = rms_norm(x, w, 0.0)
    s = np.float32(1.0) / np.sqrt(np.float32(12.5))
    assert y.tolist() == [[np.float32(3.0) * s, np.float32(4.0) * s * np.float32(2.0)]]


def _md(arch, **kw):
    md = {"general.architecture": arch, f"{arch}.block_count": 2, f"{arch}.embedding_length": 64,
          f"{arch}.feed_forward_length": 128, f"{arch}.attention.head_count": 4,
          f"{arch}.attention.layer_norm_rms_epsilon": 1e-6}
    md.update(kw)
    return md


def test_hparams_errors_name_the_problem():
    with pytest.raises(ModelLoadError, match="'gptneox'"):
        HParams.from_metadata(_md("gptneox"))
    md = _md("qwen2")
    del md["qwen2.attention.layer_norm_rms_epsilon"]
    with pytest.raises(ModelLoadError, match="qwen2.attention.layer_norm_rms_epsilon"):
        HParams.from_metadata(md)
    with pytest.raises(ModelLoadError, match="general.architecture"):
        HParams.from_metadata({})


def test_hparams_rope_style_and_gemma3_windows():
    assert not HParams.from_metadata(_md("llama")).neox
    assert HParams.from_metadata(_md("qwen2")).neox
    hp = HParams.from_metadata(_md("gemma3", **{"gemma3.block_count": 12,
                                                "gemma3.attention.sliding_window": 512}))
    # llama.cpp's pattern 6: every sixth layer (5, 11) is global
    assert [i for i, s in enumerate(hp.swa_layers) if not s] == [5, 11]
    assert hp.n_swa == 512 and hp.kq_scale == 1.0
    assert hp.attn_scale == pytest.approx(1 / 4.0) and hp.embd_scale == pytest.approx(8.0)


def test_chunked_forward_equals_one_pass(monkeypatch):
    from strata_ref.infer.model import Model
    m = load_model(SMOL)
    ids = SPEC[SMOL]["prompt"] + SPEC[SMOL]["first"][:7]
    whole = m.forward(ids, m.new_cache(64), all_logits=True)
    monkeypatch.setattr(Model, "CHUNK", 5)
    chunked = m.forward(ids, m.new_cache(64), all_logits=True)
    # SmolLM2's types (Q4_1, Q8_0) take the same ggml code path for every
    # pass of two or more tokens, and each row's arithmetic is independent of
    # the others: chunks of 5 and 7 tokens give the one-pass bits.
    assert np.array_equal(whole.view(np.uint32), chunked.view(np.uint32))
