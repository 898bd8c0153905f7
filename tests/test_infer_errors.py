"""Malformed models and bad arguments in CPU inference give one clear error
naming the key, value or option (issue #7): hyperparameters validated at load
(an n_rot past head_dim used to corrupt the heap in the RoPE kernel), the
KV-cache size checked before allocating, non-finite or constant logits
refused, and `strata-ref generate`'s options checked."""
from __future__ import annotations

import shutil
import struct
import warnings

import numpy as np
import pytest

import strata_ref.gguf as sgguf
from strata_ref import cli
from strata_ref.cli import main
from strata_ref.gguf import GGUFValueType as V
from strata_ref.cpu import PROFILES, ops
from strata_ref.infer.model import HParams, ModelLoadError, ModelOutputError, check_logits, load

from infer_helpers import model_path, tiny_model


# ---------------------------------------------------------------- helpers
def _md(arch="llama", **kw):
    # head_dim 256 / 4 = 64, as SmolLM2's
    md = {"general.architecture": arch, f"{arch}.block_count": 2, f"{arch}.embedding_length": 256,
          f"{arch}.feed_forward_length": 512, f"{arch}.attention.head_count": 4,
          f"{arch}.attention.layer_norm_rms_epsilon": 1e-6}
    md.update({f"{arch}.{k}": v for k, v in kw.items()})
    return md


def _tiny(path, md=None, tensor_fn=None, arch="qwen3"):
    """tests' tiny model with metadata entries replaced (`md`) and tensors
    passed through `tensor_fn(name, type, shape, data) -> data`."""
    real = sgguf.write_gguf

    def patched(p, meta, ts, **kw):
        meta = {**meta, **(md or {})}
        if tensor_fn is not None:
            ts = [(n, t, s, tensor_fn(n, t, s, d)) for n, t, s, d in ts]
        real(p, meta, ts, **kw)
    sgguf.write_gguf = patched
    try:
        tiny_model(arch, path)
    finally:
        sgguf.write_gguf = real
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _tiny(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


# ---------------------------------------------------------------- hparams
BAD = [  # (metadata change, text the error must hold)
    (dict(**{"rope.dimension_count": 1000}), "`llama.rope.dimension_count` = 1000 is out of range (must be in [2, 64])"),
    (dict(**{"rope.dimension_count": 66}), "`llama.rope.dimension_count` = 66 is out of range"),
    (dict(**{"rope.dimension_count": 0}), "`llama.rope.dimension_count` = 0 is out of range"),
    (dict(**{"rope.dimension_count": 31}), "`llama.rope.dimension_count` = 31 is odd"),
    (dict(block_count=9.7), "`llama.block_count` = 9.7 is not an integer"),
    (dict(block_count=0), "`llama.block_count` = 0 is out of range (must be in [1, 512])"),
    (dict(block_count=10**9), "`llama.block_count` = 1000000000 is out of range"),
    (dict(embedding_length=0), "`llama.embedding_length` = 0 is out of range (must be >= 1)"),
    (dict(embedding_length=258), "`llama.embedding_length` = 258 is not a multiple of `llama.attention.head_count` = 4"),
    (dict(feed_forward_length=-1), "`llama.feed_forward_length` = -1 is out of range"),
    (dict(feed_forward_length="512"), "`llama.feed_forward_length` = '512' is not an integer"),
    (dict(**{"attention.head_count": 0}), "`llama.attention.head_count` = 0 is out of range"),
    (dict(**{"attention.head_count_kv": 0}), "`llama.attention.head_count_kv` = 0 is out of range (must be in [1, 4])"),
    (dict(**{"attention.head_count_kv": 8}), "`llama.attention.head_count_kv` = 8 is out of range (must be in [1, 4])"),
    (dict(**{"attention.head_count_kv": 3}), "`llama.attention.head_count` = 4 is not a multiple of `llama.attention.head_count_kv` = 3"),
    (dict(**{"attention.key_length": 0}), "`llama.attention.key_length` = 0 is out of range"),
    (dict(context_length=0), "`llama.context_length` = 0 is out of range"),
    (dict(**{"attention.layer_norm_rms_epsilon": float("nan")}), "`llama.attention.layer_norm_rms_epsilon` = nan must be finite and > 0"),
    (dict(**{"attention.layer_norm_rms_epsilon": 0.0}), "`llama.attention.layer_norm_rms_epsilon` = 0.0 must be finite and > 0"),
    (dict(**{"attention.layer_norm_rms_epsilon": -1e-6}), "= -1e-06 must be finite and > 0"),
    (dict(**{"rope.freq_base": float("inf")}), "`llama.rope.freq_base` = inf must be finite and > 0"),
    (dict(**{"rope.freq_base": 0.0}), "`llama.rope.freq_base` = 0.0 must be finite and > 0"),
    (dict(**{"rope.freq_base": True}), "`llama.rope.freq_base` = True is not a number"),
]


@pytest.mark.parametrize("change, msg", BAD)
def test_hparams_refuse_bad_values_naming_key_and_value(change, msg):
    with pytest.raises(ModelLoadError) as e:
        HParams.from_metadata(_md(**change))
    assert msg in str(e.value)


def test_hparams_gemma3_window_and_rope_base_swa():
    with pytest.raises(ModelLoadError, match=r"`gemma3.attention.sliding_window` = 0 is out of range"):
        HParams.from_metadata(_md("gemma3", **{"attention.sliding_window": 0}))
    with pytest.raises(ModelLoadError, match=r"`gemma3.rope.freq_base_swa` = nan must be finite"):
        HParams.from_metadata(_md("gemma3", **{"attention.sliding_window": 4,
                                               "rope.freq_base_swa": float("nan")}))
    with pytest.raises(ModelLoadError, match=r"sliding_window_pattern` has 3 values for 2 layers"):
        HParams.from_metadata(_md("gemma3", **{"attention.sliding_window": 4,
                                               "attention.sliding_window_pattern": [True] * 3}))


def test_hparams_accept_the_edges():
    # n_rot = head_dim, and n_rot = 2, and MQA (one KV head) are all valid
    assert HParams.from_metadata(_md(**{"rope.dimension_count": 64})).n_rot == 64
    assert HParams.from_metadata(_md(**{"rope.dimension_count": 2})).n_rot == 2
    hp = HParams.from_metadata(_md(**{"attention.head_count_kv": 1}))
    assert (hp.n_head_kv, hp.head_dim, hp.n_rot) == (1, 64, 64)
    # numpy integers, as a reader may return them
    assert HParams.from_metadata(_md(block_count=np.uint32(3))).n_layer == 3


def test_float_block_count_in_a_file_is_refused(tmp_path):
    path = _tiny(tmp_path / "f.gguf", md={"qwen3.block_count": (V.FLOAT32, 6.0)})
    with pytest.raises(ModelLoadError, match=r"`qwen3.block_count` = 6.0 is not an integer"):
        load(path)


# ---------------------------------------------------------------- ops guards
def test_rope_refuses_shapes_it_cannot_index():
    x = np.zeros((2, 3, 8), np.float32)
    cos, sin = ops.rope_cache(np.arange(2), 8, 10000.0, 1.0)
    assert ops.rope(x, cos, sin, 8, False, PROFILES["avx2"]).shape == x.shape
    with pytest.raises(ValueError, match="head_dim >= n_rot = 10"):
        c, s = ops.rope_cache(np.arange(2), 10, 10000.0, 1.0)
        ops.rope(x, c, s, 10, True, PROFILES["avx2"])
    with pytest.raises(ValueError, match="n_rot must be an even integer >= 2, got 7"):
        ops.rope(x, cos, sin, 7, False, PROFILES["avx2"])
    with pytest.raises(ValueError, match=r"cos and sin must be \(2, 3\)"):
        ops.rope(x, cos, sin, 6, False, PROFILES["avx2"])
    with pytest.raises(ValueError, match=r"cos and sin must be \(2, 4\)"):
        ops.rope(x, cos[:1], sin[:1], 8, False, PROFILES["avx2"])
    with pytest.raises(ValueError, match="got 0"):
        ops.rope_cache(np.arange(2), 0, 10000.0, 1.0)
    with pytest.raises(ValueError, match=r"freq_factors has shape \(3,\), expected \(4,\)"):
        ops.rope_cache(np.arange(2), 8, 10000.0, 1.0, np.ones(3, np.float32))


# ---------------------------------------------------------------- the real file
def _patch_u32(path, key: bytes, value: int) -> None:
    """Overwrite the UINT32 value of metadata `key` in the GGUF at `path`."""
    with open(path, "r+b") as f:
        head = f.read(1 << 20)
        i = head.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
        assert struct.unpack_from("<I", head, i)[0] == 4          # GGUF type UINT32
        f.seek(i + 4)
        f.write(struct.pack("<I", value))


@pytest.fixture(scope="module")
def smol_copy(tmp_path_factory):
    dst = tmp_path_factory.mktemp("smol") / "smollm2-damaged.gguf"
    shutil.copyfile(model_path("SmolLM2-135M-Instruct"), dst)
    return dst


@pytest.mark.parametrize("n_rot", [1000, 66, 0])
def test_generate_on_smollm2_with_bad_rope_dimension_is_one_line(smol_copy, capsys, n_rot):
    # the issue's reproduction: 1000 crashed in malloc, 66 gave wrong text,
    # 0 a ZeroDivisionError traceback
    _patch_u32(smol_copy, b"llama.rope.dimension_count", n_rot)
    assert main(["generate", str(smol_copy), "Hi", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"strata-ref: error: ModelLoadError: `llama.rope.dimension_count` = {n_rot} "
                   f"is out of range (must be in [2, 64])"]


@pytest.mark.parametrize("key", [b"llama.attention.head_count", b"llama.attention.head_count_kv"])
def test_generate_on_smollm2_with_zero_heads_is_one_line(smol_copy, capsys, key):
    _patch_u32(smol_copy, b"llama.rope.dimension_count", 64)
    _patch_u32(smol_copy, key, 0)
    try:
        assert main(["generate", str(smol_copy), "Hi"]) == 2
    finally:
        _patch_u32(smol_copy, key, 9 if key.endswith(b"head_count") else 3)
    assert f"`{key.decode()}` = 0 is out of range" in capsys.readouterr().err


# ---------------------------------------------------------------- context
def test_ctx_beyond_training_context_is_refused_before_allocating(tiny, capsys):
    # the tiny model's context_length is 256
    assert main(["generate", tiny, "Hi", "--ctx", "100000000"]) == 2
    err = capsys.readouterr().err
    assert "(--ctx) 100000000 is outside 1 .. 256" in err and "qwen3.context_length" in err
    m = load(tiny)
    assert m.new_cache(256).n_ctx == 256
    with pytest.raises(ValueError, match=r"\(--ctx\) 257 is outside"):
        m.new_cache(257)


def test_ctx_larger_than_memory_is_refused(tiny, monkeypatch):
    from strata_ref.infer import model as model_mod
    m = load(tiny)
    # 6 layers x 2 KV heads x 16 x 2 (K, V) x 2 bytes = 768 bytes a position
    need = 768 * 200
    monkeypatch.setattr(model_mod, "_physical_memory", lambda: need - 1)
    with pytest.raises(ValueError, match=r"\(--ctx\) 200: the KV cache would take"):
        m.new_cache(200)
    monkeypatch.setattr(model_mod, "_physical_memory", lambda: need)
    assert m.new_cache(200).k.nbytes * 2 == need


# ---------------------------------------------------------------- logits
def test_check_logits_by_hand():
    check_logits(np.array([0.0, 1.0], np.float32), "x")
    with pytest.raises(ModelOutputError, match=r"the logits of the prompt pass have 2 non-finite "
                                               r"values of 3 \(1 NaN\)"):
        check_logits(np.array([np.nan, np.inf, 0.0], np.float32), "the prompt pass")
    with pytest.raises(ModelOutputError, match="logits of decode step 2 are all equal"):
        check_logits(np.zeros(4, np.float32), "decode step 2")
    check_logits(np.zeros(4, np.float32), "decode step 2", spread=False)


def _nan_scales(data):
    # every Q8_0 block (34 bytes: fp16 d, then 32 int8) gets d = fp16 NaN
    b = data.reshape(-1, 34).copy()
    b[:, :2] = np.frombuffer(struct.pack("<H", 0x7E00), np.uint8)
    return b.reshape(-1)


_NAN = ": the model file is damaged (NaN or huge weights or metadata, e.g. the RMS epsilon)"
_SAME = ": the model file is damaged (zero weights, or a tensor stored with the wrong type)"


@pytest.mark.parametrize("name, damage, msg", [
    ("output.weight", _nan_scales,
     "the logits of the prompt pass have 259 non-finite values of 259 (259 NaN)" + _NAN),
    ("output_norm.weight", np.zeros_like, "the logits of the prompt pass are all equal (0.0)" + _SAME),
    # NaN activations quantize to Q8_0 zeros (as in ggml), so the logits are 0
    ("output_norm.weight", lambda d: np.full_like(d, np.nan),
     "the logits of the prompt pass are all equal (0.0)" + _SAME),
])
def test_damaged_tensor_is_named_not_token_0(tmp_path, capsys, name, damage, msg):
    # these load fine; generate used to print nothing and exit 0 (argmax of
    # NaN or constant logits is token 0)
    path = _tiny(tmp_path / "d.gguf", tensor_fn=lambda n, t, sh, d: damage(d) if n == name else d)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # silenced in the forward pass
        rc = main(["generate", path, "Hi", "--max-tokens", "2"])
    assert rc == 2
    assert capsys.readouterr().err.splitlines() == [f"strata-ref: error: ModelOutputError: {msg}"]


def test_non_finite_decode_step_is_named():
    from strata_ref.infer import generate

    class Fake:            # good logits for the prompt, NaN from decode step 2
        class tokenizer:
            eog_ids = set()

        def __init__(self):
            self.calls = 0

        def new_cache(self, n_ctx):
            return type("C", (), {"n_ctx": 64})()

        def forward(self, ids, cache):
            self.calls += 1
            return np.array([0.0, 1.0, np.nan if self.calls >= 3 else 0.5], np.float32)

    with pytest.raises(ModelOutputError, match="logits of decode step 2 have 1 non-finite"):
        generate(Fake(), [1, 2], 5, lambda z: int(np.argmax(z)))


# ---------------------------------------------------------------- CLI
def test_prompt_after_double_dash_with_model(tiny, capsys):
    assert main(["generate", tiny, "--max-tokens", "1", "--", "-5 is negative"]) == 0
    assert capsys.readouterr().out.startswith("-5 is negative")


@pytest.mark.parametrize("opts, msg", [
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--temperature", "inf"], "--temperature must be a finite number >= 0 (0: greedy), got inf"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0: greedy), got nan"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0 (0: greedy), got -1.0"),
    (["--top-k", "-3"], "--top-k must be >= 0 (0: off), got -3"),
    (["--top-p", "nan"], "--top-p must be in (0, 1], got nan"),
    (["--max-tokens", "-1"], "--max-tokens must be >= 0, got -1"),
    (["--ctx", "1"], "--ctx must be >= 2, got 1"),
])
def test_bad_generate_options_name_the_option(tiny, capsys, opts, msg):
    assert main(["generate", tiny, "Hi"] + opts) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [f"strata-ref: error: {msg}"]


def test_non_utf8_prompt_is_named(tiny, capsys):
    # a byte the locale cannot decode reaches sys.argv as a lone surrogate
    assert main(["generate", tiny, "Hi \udcff"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: the prompt is not valid UTF-8 text (byte ff at character 3); pass UTF-8"]


def test_decode_count_is_the_generated_tokens(tiny, capsys, monkeypatch):
    import dataclasses

    import strata_ref.infer as infer
    real = infer.load

    def load_no_eog(name, cpu=None):
        # no end-of-generation token, so exactly --max-tokens tokens come out
        m = real(name, cpu=cpu)
        m.tokenizer = dataclasses.replace(m.tokenizer, eog_ids=frozenset())
        return m
    monkeypatch.setattr(infer, "load", load_no_eog)
    assert main(["generate", tiny, "Hi", "--max-tokens", "5"]) == 0
    last = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)[-1]
    assert "decode: 5 tokens (4 passes)," in last


@pytest.mark.parametrize("exc, line", [
    (MemoryError("Unable to allocate 1.05 TiB"), "MemoryError: Unable to allocate 1.05 TiB"),
    (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero"),
    (OverflowError("too big"), "OverflowError: too big"),
])
def test_memory_and_arithmetic_errors_are_one_line(monkeypatch, capsys, exc, line):
    def boom(a):
        raise exc
    monkeypatch.setattr(cli, "cmd_generate", boom)
    monkeypatch.delenv("STRATA_REF_DEBUG", raising=False)
    assert main(["generate", "Hi"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"strata-ref: error: {line}"]
