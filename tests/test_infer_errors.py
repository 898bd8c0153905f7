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
from strata_ref.infer.dense import HParams
from strata_ref.infer.loader import load
from strata_ref.infer.model import ModelLoadError, ModelOutputError, check_logits

from infer_helpers import model_path, tiny_model


HASWELL = {"sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"}
ZEN4 = HASWELL | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi",
                  "avx512_vnni", "avx512_bf16"}


# ---------------------------------------------------------------- helpers
def _md(arch="llama", **kw):
    # head_dim 256 / 4 = 64, as SmolLM2's
    md = {"general.architecture": arch, f"{arch}.block_count": 2, f"{arch}.embedding_length": 256,
          f"{arch}.feed_forward_length": 512, f"{arch}.attention.head_count": 4,
          f"{arch}.attention.layer_norm_rms_epsilon": 1e-6}
    md.update({f"{arch}.{k}": v for k, v in kw.items()})
    return md


def _tiny(path, md=None, tensor_fn=None, arch="qwen3", edit=None, drop=()):
    """tests' tiny model with metadata entries replaced (`md`), keys in
    `drop` removed, tensors passed through `tensor_fn(name, type, shape,
    data) -> data`, and the list of (name, type, shape, data) through
    `edit(list) -> list`."""
    real = sgguf.write_gguf

    def patched(p, meta, ts, **kw):
        meta = {k: v for k, v in {**meta, **(md or {})}.items() if k not in drop}
        if tensor_fn is not None:
            ts = [(n, t, s, tensor_fn(n, t, s, d)) for n, t, s, d in ts]
        if edit is not None:
            ts = edit(list(ts))
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
    assert err == [f"strata-ref: error: `llama.rope.dimension_count` = {n_rot} "
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
@pytest.mark.parametrize("ctx", ["100000000", "257"])
def test_ctx_outside_its_range_is_refused_before_allocating(tiny, capsys, ctx):
    # the tiny model's context_length is 256; too small and too large were
    # worded apart (">= 2" and "outside 1 .. 256")
    assert main(["generate", tiny, "Hi", "--ctx", ctx]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [
        f"strata-ref: error: --ctx {ctx} is outside 2 .. 256 (2: one prompt token and one "
        "generated; 256: the model's training context, `qwen3.context_length`)"]


@pytest.mark.parametrize("ctx", ["1", "0", "-3"])
def test_ctx_below_two_is_refused_before_the_model_is_read(tmp_path, capsys, ctx):
    # no file is read (or fetched) for a context no model can take; worded
    # as kl, trace and which word a --ctx below their minimum of 1
    missing = str(tmp_path / "absent.gguf")
    assert main(["generate", missing, "Hi", "--ctx", ctx]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [
        f"strata-ref: error: --ctx {ctx} is below the minimum of 2 (one prompt token and one generated)"]


def test_prompt_that_fills_the_context_says_what_it_needs(tiny, capsys):
    # "the prompt has 5 tokens; the context holds 5" read as if it fitted
    n = len(load(tiny).tokenizer.encode("Hello", add_special=True))
    assert main(["generate", tiny, "Hello", "--ctx", str(n)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"the prompt has {n} tokens and the context holds {n}: it needs at least {n + 1} "
        "(one generated token)")


def test_prompt_past_the_training_context_says_to_shorten_it(tiny, capsys):
    # "raise it with --ctx, up to N" could not be followed when the prompt
    # alone has N tokens or more (trial finding)
    m = load(tiny)
    n_train = m.hp.n_ctx_train
    text = "Hello " * n_train
    n = len(m.tokenizer.encode(text, add_special=True))
    assert n >= n_train
    assert main(["generate", tiny, text]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"it needs at least {n + 1} (one generated token); the model's context is {n_train} tokens: "
        "shorten the prompt")


def test_ctx_bounds_are_what_generate_runs(tiny, capsys):
    # 2 and 256 run (2 holds a one-token prompt and one generated token)
    from strata_ref.infer import ctx_problem
    m = load(tiny)
    assert ctx_problem(2, m) is None and ctx_problem(256, m) is None and ctx_problem(None, m) is None
    assert main(["generate", tiny, "Hi", "--ctx", "256", "--max-tokens", "1"]) == 0
    # one token comes from the prompt pass: no decode speed (it said 0.0 tok/s)
    speed = capsys.readouterr().err
    assert "decode: 1 token (0 passes), no decode pass | cpu: " in speed
    assert "compiling" not in speed
    assert m.tokenizer.encode("H", add_special=True) == [72]      # one token, no BOS
    assert main(["generate", tiny, "H", "--ctx", "2", "--max-tokens", "1"]) == 0
    assert m.new_cache(256).n_ctx == 256 and m.new_cache(1).n_ctx == 1
    with pytest.raises(ValueError, match=r"^n_ctx 257 is outside 1 \.\. 256 "):
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
    assert capsys.readouterr().err.splitlines() == [f"strata-ref: error: {msg}"]


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
    (["--seed", "-1"], "--seed must be from 0 to 4294967295, got -1"),
    # (the words "inf" and "nan" are not decimal notation: argparse refuses
    # them, tests/test_cli_input.py; 1e999 reads as infinity)
    (["--temperature", "1e999"], "--temperature must be a finite number >= 0 (0: greedy), got inf"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0 (0: greedy), got -1.0"),
    (["--top-k", "-3"], "--top-k must be >= 0 (0: off), got -3"),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["--top-p", "1e999"], "--top-p must be in (0, 1], got inf"),
    (["--max-tokens", "-1"], "--max-tokens must be >= 0, got -1"),
])
def test_bad_generate_options_name_the_option(tiny, capsys, opts, msg):
    assert main(["generate", tiny, "Hi"] + opts) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [f"strata-ref: error: {msg}"]


def test_native_note_is_one_short_line_once_per_cache(tiny, capsys, monkeypatch, tmp_path):
    # the AMX note was a long clause inside every speed line, and then a
    # line after every run (issue 29): now once per model cache
    import strata_ref.cli.common as infer      # where the notes printed once are kept
    import strata_ref.cpu as cpu
    note = cpu.native_note(ZEN4 | {"amx_tile", "amx_int8"})
    assert note == ("native = avx512: bit for bit llama.cpp's avx512 build, not its native build "
                    "(AMX here: no 0.3.36 profile has it; prebuilt v0.4.0's: --cpu v0.4.0-native)")
    monkeypatch.setattr(cpu, "native_note", lambda flags=None: note)
    monkeypatch.setattr(infer, "_NOTED", set())
    monkeypatch.delenv("STRATA_REF_CPU", raising=False)
    monkeypatch.setenv("STRATA_REF_CACHE", str(tmp_path))
    name = cpu.native().name
    for run in range(2):
        infer._NOTED.clear()            # a new process: the cache remembers
        assert main(["generate", tiny, "Hi", "--max-tokens", "1"]) == 0
        lines = capsys.readouterr().err.splitlines()
        # the speed line, then the note it explains
        assert lines[0].endswith(f"| cpu: {name} (native)]")
        assert lines[1:] == ([f"strata-ref: note: {note}"] if run == 0 else [])
    monkeypatch.setattr(infer, "_NOTED", set())
    assert main(["generate", tiny, "Hi", "--max-tokens", "1", "--cpu", "avx2"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[prompt: ")


@pytest.mark.parametrize("flags", [ZEN4 | {"amx_tile", "amx_int8"}, {"sse4_2", "avx"},
                                   HASWELL | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"}])
def test_native_notes_name_the_build_they_match(flags):
    from strata_ref import cpu
    p = cpu.native(flags).name
    note = cpu.native_note(flags)
    assert note.startswith(f"native = {p}: bit for bit llama.cpp's {p} build, not its native build (")
    assert "\n" not in note and len(note) <= 160


def test_non_utf8_prompt_is_named(tiny, capsys):
    # a byte the locale cannot decode reaches sys.argv as a lone surrogate
    assert main(["generate", tiny, "Hi \udcff"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: the prompt is not valid UTF-8 text (byte ff at character 3); pass UTF-8"]
    # trace's --prompt says the same, before the model is loaded
    assert main(["trace", tiny, "--prompt", "a\udcffb", "--out", "unused.npz"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: --prompt is not valid UTF-8 text (byte ff at character 1); pass UTF-8"]


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
    last = capsys.readouterr().err.splitlines()[0]
    assert "decode: 5 tokens (4 passes)," in last


@pytest.mark.parametrize("exc, line", [
    (MemoryError("Unable to allocate 1.05 TiB"), "MemoryError: Unable to allocate 1.05 TiB"),
    (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero"),
    (OverflowError("too big"), "OverflowError: too big"),
])
def test_memory_and_arithmetic_errors_are_one_line(monkeypatch, capsys, exc, line):
    def boom(a):
        raise exc
    monkeypatch.setattr(cli.inference, "cmd_generate", boom)
    monkeypatch.delenv("STRATA_REF_DEBUG", raising=False)
    assert main(["generate", "Hi"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"strata-ref: error: {line}"]


# ---------------------------------------------------------------- issue 16: tokenizer metadata and tensors
def _gen_err(path, capsys, *extra):
    """`generate` on `path`: exit 2 and the one stderr line, without its prefix."""
    assert main(["generate", str(path), "Hi", "--max-tokens", "2", *extra]) == 2
    cap = capsys.readouterr()
    err = cap.err.splitlines()
    assert len(err) == 1 and err[0].startswith("strata-ref: error: "), cap.err
    return err[0][len("strata-ref: error: "):]


@pytest.mark.parametrize("md, msg", [
    # 1: merges as numbers or nested arrays crashed with AttributeError
    ({"tokenizer.ggml.merges": (V.ARRAY, [1, 2], V.INT32)},
     "`tokenizer.ggml.merges` must be an array of STRING, the file has an array of INT32"),
    ({"tokenizer.ggml.merges": (V.ARRAY, [["a b"], ["c d"]], V.ARRAY)},
     "`tokenizer.ggml.merges` must be an array of STRING, the file has an array of arrays"),
    ({"tokenizer.ggml.merges": "a b"},
     "`tokenizer.ggml.merges` must be an array of STRING, the file has a STRING"),
    # 2: a SentencePiece vocabulary with too few scores gave an IndexError
    ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.scores": (V.ARRAY, [0.0] * 100, V.FLOAT32)},
     "`tokenizer.ggml.scores` has 100 values, `tokenizer.ggml.tokens` has 259 tokens"),
    ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.scores": (V.ARRAY, list(range(259)), V.INT32)},
     "`tokenizer.ggml.scores` must be an array of FLOAT32, the file has an array of INT32"),
    # 10: wrongly typed values were accepted
    ({"tokenizer.ggml.add_bos_token": "false"},
     "`tokenizer.ggml.add_bos_token` must be a BOOL, the file has a STRING ('false')"),
    ({"tokenizer.ggml.add_bos_token": (V.UINT8, 0)},
     "`tokenizer.ggml.add_bos_token` must be a BOOL, the file has an integer (0)"),
    ({"tokenizer.ggml.token_type": (V.ARRAY, [1.0] * 259, V.FLOAT32)},
     "`tokenizer.ggml.token_type` must be an array of INT32, the file has an array of FLOAT32"),
    # 12: Python-internal messages that did not name the key
    ({"tokenizer.ggml.tokens": (V.ARRAY, list(range(259)), V.INT32)},
     "`tokenizer.ggml.tokens` must be an array of STRING, the file has an array of INT32"),
    ({"tokenizer.ggml.tokens": (V.INT32, 5)},
     "`tokenizer.ggml.tokens` must be an array of STRING, the file has an integer"),
    ({"tokenizer.ggml.token_type": (V.ARRAY, ["1"] * 259, V.STRING)},
     "`tokenizer.ggml.token_type` must be an array of INT32, the file has an array of STRING"),
    ({"tokenizer.ggml.token_type": (V.ARRAY, [1] * 258 + [99], V.INT32)},
     "`tokenizer.ggml.token_type`[258] = 99 is not a token type (0..6)"),
    ({"tokenizer.ggml.bos_token_id": (V.FLOAT32, float("nan"))},
     "`tokenizer.ggml.bos_token_id` must be an integer token id, the file has a float (nan)"),
    ({"tokenizer.ggml.eos_token_id": (V.INT32, -1)},
     "`tokenizer.ggml.eos_token_id` = -1 is outside the vocabulary (size 259)"),
    ({"tokenizer.ggml.model": (V.ARRAY, ["gpt2"], V.STRING)},
     "`tokenizer.ggml.model` must be a STRING, the file has an array of STRING"),
    ({"tokenizer.ggml.pre": (V.ARRAY, [1], V.INT32)},
     "`tokenizer.ggml.pre` must be a STRING, the file has an array of INT32"),
])
def test_mistyped_tokenizer_metadata_is_named(tmp_path, capsys, md, msg):
    path = _tiny(tmp_path / "t.gguf", md=md)
    assert _gen_err(path, capsys) == msg


def test_empty_vocabulary_is_named():
    # gguf-py cannot write an empty array; the fuzz test writes one as bytes
    from strata_ref.infer.tokenizer import Tokenizer, TokenizerError
    with pytest.raises(TokenizerError, match=r"^`tokenizer.ggml.tokens` is empty$"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": []})


def test_chat_template_that_is_not_a_string_is_named(tmp_path, capsys):
    path = _tiny(tmp_path / "c.gguf", md={"tokenizer.chat_template": (V.INT32, 7)})
    assert _gen_err(path, capsys, "--chat") == (
        "`tokenizer.chat_template` must be a STRING, the file has an "
        "integer; run without --chat")


def _q8(rows, cols, seed=1):
    from strata_ref import GGMLType, quantize
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.2
    return GGMLType.Q8_0, (cols, rows), quantize(w, GGMLType.Q8_0).reshape(-1)


def _replace(name, new):
    def edit(ts):
        return [(n,) + new if n == name else (n, t, s, d) for n, t, s, d in ts]
    return edit


@pytest.mark.parametrize("name", ["token_embd.weight", "output.weight"])
def test_vocabulary_and_embedding_sizes_are_checked_at_load(tmp_path, capsys, name):
    # 9: 268 embedding rows for 259 tokens loaded, printed garbage, then
    # failed on a sampled token id 268
    path = _tiny(tmp_path / "v.gguf", edit=_replace(name, _q8(268, 64)))
    assert _gen_err(path, capsys) == (
        f"tensor `{name}` has 268 rows, but the vocabulary "
        "(`tokenizer.ggml.tokens`) has 259 tokens")


def test_three_dimensional_matrix_is_refused(tmp_path, capsys):
    # 10: ggml shape [64, 32, 2] holds 64 x 64 values but is no 64 x 64 matrix
    t, _, d = _q8(64, 64)
    path = _tiny(tmp_path / "q.gguf", edit=_replace("blk.0.attn_q.weight", (t, (64, 32, 2), d)))
    assert _gen_err(path, capsys) == (
        "tensor `blk.0.attn_q.weight` has ggml shape [64, 32, 2], expected [64, 64]")


def test_norm_of_another_shape_is_refused(tmp_path, capsys):
    from strata_ref import GGMLType
    path = _tiny(tmp_path / "n.gguf", edit=_replace(
        "output_norm.weight", (GGMLType.F32, (32, 2), np.ones(64, np.float32))))
    assert _gen_err(path, capsys) == (
        "tensor `output_norm.weight` has ggml shape [32, 2], expected [64]")


@pytest.mark.parametrize("t, dt", [("I8", np.int8), ("I32", np.int32), ("F64", np.float64)])
def test_plain_type_tensor_is_named(tmp_path, capsys, t, dt):
    # 13: an UnsupportedTypeError suggesting a library call, without the tensor
    from strata_ref import GGMLType
    path = _tiny(tmp_path / "p.gguf", edit=_replace(
        "blk.1.ffn_norm.weight", (GGMLType[t], (64,), np.ones(64, dt))))
    kind = {"I8": "i8", "I32": "i32", "F64": "f64"}[t]
    assert _gen_err(path, capsys) == (
        f"tensor `blk.1.ffn_norm.weight` is of type {t}, a plain {kind} array; "
        "model weights are float or quantized types")


def _tiny_llama(path, edit=None):
    """The tiny qwen3 model as a llama one: its keys renamed, without the
    q / k norms llama.cpp's llama graph does not load."""
    def as_llama(ts):
        ts = [t for t in ts if not t[0].endswith(("attn_q_norm.weight", "attn_k_norm.weight"))]
        return edit(ts) if edit else ts
    real = sgguf.write_gguf

    def renamed(p, meta, ts, **kw):
        meta = {k.replace("qwen3.", "llama.", 1): v for k, v in meta.items()}
        meta["general.architecture"] = "llama"
        real(p, meta, ts, **kw)
    sgguf.write_gguf = renamed
    try:
        _tiny(path, edit=as_llama)
    finally:
        sgguf.write_gguf = real
    return path


@pytest.mark.parametrize("value, shown", [(0.0, "0.0"), (-1.0, "-1.0"), (np.inf, "inf"), (np.nan, "nan")])
def test_rope_freqs_must_be_positive(tmp_path, capsys, value, shown):
    # 12: zeros gave a ZeroDivisionError from the RoPE kernel
    from strata_ref import GGMLType
    f = np.ones(8, np.float32)
    f[3] = value

    def edit(ts):
        return ts + [("rope_freqs.weight", GGMLType.F32, (8,), f)]
    path = _tiny_llama(tmp_path / "r.gguf", edit=edit)
    assert _gen_err(path, capsys) == (
        f"tensor `rope_freqs.weight` value [3] = {shown}: RoPE frequency "
        "factors must be finite and > 0")


@pytest.mark.parametrize("temp", ["1e-320", "5e-324", "1e-45", "1e300"])
def test_extreme_temperatures_sample_cleanly(tiny, capsys, temp):
    # 11: 1e-320 printed two RuntimeWarnings, then "Probabilities contain NaN"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["generate", tiny, "Hi", "--max-tokens", "3", "--temperature", temp]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "decode: " in lines[0]     # the speed line alone: no warning


def test_tiny_temperature_is_greedy():
    from strata_ref.infer.sampling import Sampler, greedy
    rng = np.random.default_rng(0)
    for _ in range(20):
        z = rng.standard_normal(50).astype(np.float32)
        assert Sampler(1e-320, seed=1)(z) == greedy(z)
    z = np.array([1.0, 3.0, 3.0, 0.0], np.float32)   # a tie: one of the two maxima
    assert {Sampler(1e-320, seed=s)(z) for s in range(40)} == {1, 2}


@pytest.mark.parametrize("md, msg", [
    ({"general.architecture": np.array([1, 2], np.int32)}, "`general.architecture` = array([1, 2], dtype=int32) is not a string"),
    (dict(**{"rope.scaling.type": 3}), "`llama.rope.scaling.type` = 3 is not a string"),
    (dict(block_count=["x" * 50] * 10_000), "`llama.block_count` = ['xxxxxxxx"),
])
def test_hparams_mistyped_strings_and_long_values(md, msg):
    base = _md()
    if "general.architecture" in md:
        base.update(md)
    else:
        base.update({f"llama.{k}": v for k, v in md.items()})
    with pytest.raises(ModelLoadError) as e:
        HParams.from_metadata(base)
    assert msg in str(e.value) and len(str(e.value)) < 160


def test_hparams_window_pattern_of_strings_is_refused():
    with pytest.raises(ModelLoadError, match=r"sliding_window_pattern` must be an array of BOOL or integers"):
        HParams.from_metadata(_md("gemma3", **{"attention.sliding_window": 4,
                                               "attention.sliding_window_pattern": ["false", "true"]}))


def test_dense_model_refuses_a_tensor_it_does_not_use(tmp_path, capsys):
    # the MoE and hybrid graphs refused a file with a tensor their graph does
    # not load, as llama.cpp does ("wrong number of tensors"); the dense one
    # ran such a file, ignoring the tensor
    from strata_ref import GGMLType
    extra = ("blk.2.ffn_gate_shexp.weight", GGMLType.F32, (64, 8), np.zeros(512, np.float32))
    path = _tiny(tmp_path / "x.gguf", edit=lambda ts: ts + [extra])
    assert _gen_err(path, capsys) == ("qwen3: tensor `blk.2.ffn_gate_shexp.weight` is not part of llama.cpp's "
                                      "qwen3 graph (llama.cpp refuses files with tensors it does not load)")
    # llama.cpp's qwen3 has no RoPE frequency factors (llama's has): refused, not ignored
    ones = ("rope_freqs.weight", GGMLType.F32, (8,), np.ones(8, np.float32))
    path = _tiny(tmp_path / "f.gguf", edit=lambda ts: ts + [ones])
    with pytest.raises(ModelLoadError, match=r"qwen3: tensor `rope_freqs.weight` is not part of"):
        load(path)
    # a name from the file is escaped in the error line
    odd = ("blk.0.x\nforged.weight", GGMLType.F32, (8,), np.ones(8, np.float32))
    path = _tiny(tmp_path / "o.gguf", edit=lambda ts: ts + [odd])
    assert _gen_err(path, capsys).startswith("qwen3: tensor `blk.0.x\\x0aforged.weight` is not part of")
    # the llama form of the model, with its rope_freqs, loads
    m = load(_tiny_llama(tmp_path / "l.gguf", edit=lambda ts: ts + [ones]))
    assert m.spec.name == "llama" and m.rope_freqs is not None


def test_speed_line_says_when_the_timed_passes_compiled(tiny, capsys, monkeypatch):
    # a first run compiles kernels inside the timed prompt / decode passes:
    # its tok/s are not the kernels' own, and the line says so
    from strata_ref import _compile_notes
    calls = iter(range(100))
    monkeypatch.setattr(_compile_notes, "stats", lambda: (next(calls), 1.0))
    assert main(["generate", tiny, "Hi", "--max-tokens", "2"]) == 0
    line = capsys.readouterr().err.splitlines()[0]
    assert line.endswith(" | the speeds include numba compiling (a first run)]"), line


def test_the_speed_line_names_what_was_asked(tiny, capsys):
    # an alias or v0.4.0-native runs another profile's name: both are shown
    assert main(["generate", tiny, "Hi", "--max-tokens", "1", "--cpu", "v0.4.0-alderlake"]) == 0
    assert "| cpu: v0.4.0-haswell (v0.4.0-alderlake) |" in capsys.readouterr().err


def test_stdout_holds_the_text_alone_and_the_speeds_go_to_stderr(tiny, capsys):
    # the speed line after the text went into a file piped from stdout, to
    # be compared with llama.cpp's output; llama.cpp prints timings on stderr
    from strata_ref.infer import generate
    from strata_ref.infer.sampling import Sampler
    assert main(["generate", tiny, "Hi", "--max-tokens", "3", "--cpu", "avx2"]) == 0
    cap = capsys.readouterr()
    m = load(tiny, profile="avx2")
    ids = m.tokenizer.encode("Hi", add_special=True, parse_special=False)
    gen = generate(m, ids, 3, Sampler(0.0, 0, 1.0, 0))[0]
    text = b"".join(m.tokenizer.piece_bytes(t) for t in gen).decode("utf-8", errors="replace")
    assert cap.out == "Hi" + text + "\n"
    speed = cap.err.splitlines()
    assert len(speed) == 1 and speed[0].startswith(f"[prompt: {len(ids)} tokens, ")
    assert f"| decode: {len(gen)} tokens ({len(gen) - 1} passes), " in speed[0]
    assert speed[0].endswith("| cpu: avx2]")
