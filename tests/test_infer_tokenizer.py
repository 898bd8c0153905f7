"""Tokenizer: llama.cpp's own conformance pairs (ggml-vocab-*.gguf.inp/.out
from llama-cpp-python 0.3.36's sdist), the prompt ids of spec/models.md §5,
BOS rules and hand-made vocabularies."""
from __future__ import annotations

import numpy as np
import pytest

from strata_ref.infer.tokenizer import Tokenizer, TokenizerError, PRE_TOKENIZERS
from infer_helpers import vocab_dir

# Every vocabulary with .inp/.out pairs whose tokenizer family is implemented.
FAMILIES = ["gpt-2", "llama-bpe", "qwen2", "qwen35", "starcoder", "refact", "command-r",
            "falcon", "mpt", "llama-spm", "phi-3", "gemma-4", "deepseek-llm", "deepseek-coder"]


def _md(path):
    from strata_ref import gguf
    return gguf.read(path).metadata


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_cpp_vocab_pairs(family):
    d = vocab_dir()
    g = d / f"ggml-vocab-{family}.gguf"
    if not g.is_file():
        pytest.skip(f"{g.name} not in the sdist")
    tok = Tokenizer.from_metadata(_md(g))
    cases = (d / (g.name + ".inp")).read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    expected = (d / (g.name + ".out")).read_text(encoding="utf-8").split("\n")
    assert len(cases) >= 40
    # llama.cpp's test-tokenizer-0 tokenizes without special tokens (no BOS)
    bad = [(c, expected[i]) for i, c in enumerate(cases)
           if tok.encode(c, add_special=False) != [int(v) for v in expected[i].split()]]
    assert not bad, f"{len(bad)}/{len(cases)} cases differ, first: {bad[0]!r}"


def test_unsupported_families_are_named():
    d = vocab_dir()
    with pytest.raises(TokenizerError, match="bert"):
        Tokenizer.from_metadata(_md(d / "ggml-vocab-bert-bge.gguf"))


def test_qwen2_vocab_roundtrip_bytes():
    tok = Tokenizer.from_metadata(_md(vocab_dir() / "ggml-vocab-qwen2.gguf"))
    s = "naïve café 東京 🦙 \t\n  x"
    assert tok.decode_bytes(tok.encode(s, add_special=False)) == s.encode()


# ---------------------------------------------------------------- hand-made
def _bpe_md(**kw):
    # byte-level alphabet subset: "a", "b", "Ġ" (space), merges a+b, Ġ+ab
    tokens = ["<s>", "</s>", "a", "b", "Ġ", "ab", "Ġab", "<|x|>"]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
          "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": np.array([3, 3, 1, 1, 1, 1, 1, 4], np.int32),
          "tokenizer.ggml.merges": ["a b", "Ġ ab"],
          "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1}
    md.update(kw)
    return md


def test_bpe_merges_by_rank_and_bos_rule():
    tok = Tokenizer.from_metadata(_bpe_md())
    assert tok.encode("ab ab", add_special=False) == [5, 6]
    assert tok.encode("ba", add_special=False) == [3, 2]
    # the gpt-2 pre-tokenizer adds no BOS unless the file says so
    assert tok.encode("ab") == [5]
    tok = Tokenizer.from_metadata(_bpe_md(**{"tokenizer.ggml.add_bos_token": True}))
    assert tok.encode("ab") == [0, 5]
    # a text that already starts with BOS (parsed as special) gets no second one
    assert tok.encode("<s>ab", parse_special=True) == [0, 5]
    # control tokens are text unless parse_special; user-defined ones always match
    assert tok.encode("<|x|>ab", add_special=False) == [7, 5]


def test_missing_keys_and_unknown_pre_are_clear_errors():
    md = _bpe_md()
    del md["tokenizer.ggml.merges"]
    with pytest.raises(TokenizerError, match="tokenizer.ggml.merges"):
        Tokenizer.from_metadata(md)
    with pytest.raises(TokenizerError, match="'nonesuch'"):
        Tokenizer.from_metadata(_bpe_md(**{"tokenizer.ggml.pre": "nonesuch"}))
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model"):
        Tokenizer.from_metadata({})
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        Tokenizer.from_metadata(_bpe_md(**{"tokenizer.ggml.eos_token_id": 99}))


def test_spm_scores_and_byte_fallback():
    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab"] + [f"<0x{i:02X}>" for i in range(256)]
    types = [2, 3, 3, 1, 1, 1, 1, 1, 1] + [6] * 256
    scores = [0, 0, 0, -1, -1, -1, -3, -2, -0.5] + [0] * 256
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": np.array(types), "tokenizer.ggml.scores": np.array(scores, np.float32),
          "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    tok = Tokenizer.from_metadata(md)
    # " ab" -> "▁ab": "ab" (score -2) merges before "▁a" (-3), then "▁"+"ab" -> "▁ab"
    assert tok.encode("ab") == [1, 8]
    # "é" is not in the vocabulary: its two UTF-8 bytes as <0xC3> <0xA9>
    assert tok.encode("é", add_special=False) == [3, 9 + 0xC3, 9 + 0xA9]
    assert tok.decode_bytes([8, 9 + 0xC3, 9 + 0xA9]) == " abé".encode()


def test_pre_tokenizer_table_names():
    assert {"smollm", "qwen2", "llama-bpe", "gpt-2"} <= set(PRE_TOKENIZERS)


# ---------------------------------------------------------------- gpt-4o (gpt-oss)
def test_gpt4o_pre_tokenizer_pieces_are_llama_cpps():
    # tests/data/llama_tok_gpt-4o.npz (tools/llama_ref.py pretok): llama.cpp's
    # ids of texts in a probe vocabulary where each pre-tokenized piece is one
    # token, so the ids are the pieces; the other pre-tokenizers split these
    # texts otherwise
    from pathlib import Path
    from infer_helpers import PRETOK_TEXTS, pretok_vocab
    z = np.load(Path(__file__).parent / "data" / "llama_tok_gpt-4o.npz")
    assert z["texts"].tolist() == PRETOK_TEXTS

    def tokenizer(pre):
        md = {k: (v[1] if isinstance(v, tuple) else v) for k, v in pretok_vocab(PRETOK_TEXTS, pre).items()}
        md["tokenizer.ggml.token_type"] = np.array(md["tokenizer.ggml.token_type"], np.int32)
        return Tokenizer.from_metadata(md)
    off = np.concatenate([[0], np.cumsum(z["lengths"])])
    want = [z["ids"][off[i]:off[i + 1]].tolist() for i in range(len(PRETOK_TEXTS))]
    tok = tokenizer("gpt-4o")
    got = [tok.encode(t, add_special=False) for t in PRETOK_TEXTS]
    bad = [(t, [tok.tokens[j] for j in g], [tok.tokens[j] for j in w])
           for t, g, w in zip(PRETOK_TEXTS, got, want) if g != w]
    assert not bad, bad[0]
    assert [tok.tokens[j] for j in want[0]] == ["Hello", "World"]
    other = tokenizer("qwen2")
    assert sum(other.encode(t, add_special=False) != w for t, w in zip(PRETOK_TEXTS, want)) >= 8
    assert tokenizer("llama4").pre == "gpt-4o"


def test_harmony_end_of_generation_tokens():
    # llama.cpp ends gpt-oss generation on <|return|> and <|call|>, not <|end|>
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o",
          "tokenizer.ggml.tokens": ["a", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>"],
          "tokenizer.ggml.token_type": np.array([1, 3, 3, 3, 3], np.int32),
          "tokenizer.ggml.merges": [], "tokenizer.ggml.eos_token_id": 4}
    assert Tokenizer.from_metadata(md).eog_ids == {2, 3, 4}
    md["tokenizer.ggml.tokens"] = ["a", "<|end|>", "<|x|>", "<|y|>", "<|endoftext|>"]
    assert Tokenizer.from_metadata(md).eog_ids == {1, 4}


def test_gemma4_vocab_bos_eog_and_roundtrip():
    # llama.cpp adds BOS for the gemma4 pre-tokenizer whatever the file
    # says, ends generation on <eos> and <turn|>; the text comes back
    # byte for byte (U+2581 for spaces, <0xXX> byte fallback)
    md = dict(_md(vocab_dir() / "ggml-vocab-gemma-4.gguf"))
    md["tokenizer.ggml.add_bos_token"] = False
    tok = Tokenizer.from_metadata(md)
    s = "naïve café 東京 🦙 \t\n  x\n\n\n y\u0001"
    ids = tok.encode(s)
    assert ids[0] == tok.bos_id == 2 and tok.decode_bytes(ids[1:]) == s.encode()
    assert tok.eog_ids == {1, 106}
    assert tok.encode("\n\n\n", add_special=False) == [109]


# ---------------------------------------------------------------- DeepSeek / Kimi
def _probe_tokenizer(texts, pre):
    from infer_helpers import pretok_vocab
    md = {k: (v[1] if isinstance(v, tuple) else v) for k, v in pretok_vocab(texts, pre).items()}
    md["tokenizer.ggml.token_type"] = np.array(md["tokenizer.ggml.token_type"], np.int32)
    return Tokenizer.from_metadata(md)


def _llama_tok(pre, prefix=""):
    # tests/data/llama_tok_<pre>.npz (tools/llama_ref.py pretok --pre PRE
    # --corpus wide --vocab ...): the texts and llama.cpp's ids of each
    from pathlib import Path
    z = np.load(Path(__file__).parent / "data" / f"llama_tok_{pre}.npz")
    off = np.concatenate([[0], np.cumsum(z[prefix + "lengths"])])
    ids = z[prefix + "ids"]
    return z, z["texts"].tolist(), [ids[off[i]:off[i + 1]].tolist() for i in range(len(off) - 1)]


DEEPSEEK_PRES = ["deepseek-llm", "deepseek-coder", "deepseek-v3", "kimi-k2"]


@pytest.mark.parametrize("pre", DEEPSEEK_PRES)
def test_deepseek_kimi_pre_tokenizer_pieces_are_llama_cpps(pre):
    # llama.cpp's ids of 158 texts (its vocabulary tests' texts, PRETOK_TEXTS,
    # PRETOK_EXTRA: Han / kana / hangul, digit runs, punctuation, non-ASCII
    # whitespace, combining marks, ...) in the probe vocabulary, where each
    # pre-tokenized piece (up to 12 bytes) is one token
    z, texts, want = _llama_tok(pre)
    assert str(z["pre"]) == pre and len(texts) >= 150
    tok = _probe_tokenizer(texts, pre)
    assert not tok.add_bos        # llama.cpp adds no BOS for these by default
    got = [tok.encode(t, add_special=False) for t in texts]
    bad = [(t, [tok.tokens[j] for j in g], [tok.tokens[j] for j in w])
           for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, f"{len(bad)}/{len(texts)} differ, first: {bad[0]!r}"
    # the data tells the pre-tokenizers apart: qwen2's (and each other's)
    # pieces differ on many of these texts
    for other in ["qwen2"] + [p for p in DEEPSEEK_PRES if p != pre]:
        o = _probe_tokenizer(texts, other)
        assert sum(o.encode(t, add_special=False) != w for t, w in zip(texts, want)) >= 10, other


@pytest.mark.parametrize("pre", DEEPSEEK_PRES)
def test_deepseek_kimi_pre_tokenizers_with_a_real_vocabulary(pre):
    # the same texts through llama.cpp with the tokens and merges of the
    # sdist's ggml-vocab-deepseek-llm.gguf (ggml-vocab-deepseek-coder.gguf
    # for deepseek-coder) under tokenizer.ggml.pre = PRE
    import hashlib
    z, texts, want = _llama_tok(pre, "vocab_")
    g = vocab_dir() / f"ggml-vocab-{z['vocab']}.gguf"
    if not g.is_file():
        pytest.skip(f"{g.name} not in the sdist")
    assert hashlib.sha256(g.read_bytes()).hexdigest() == str(z["vocab_sha256"])
    m = _md(g)
    md = {k: m[k] for k in ("tokenizer.ggml.model", "tokenizer.ggml.tokens",
                            "tokenizer.ggml.token_type", "tokenizer.ggml.merges")}
    md["tokenizer.ggml.pre"] = pre
    tok = Tokenizer.from_metadata(md)
    bad = [t for t, w in zip(texts, want) if tok.encode(t, add_special=False) != w]
    assert not bad, f"{len(bad)}/{len(texts)} differ, first: {bad[0]!r}"


def test_deepseek_kimi_pieces_by_hand():
    # a few of llama.cpp's pieces spelled out (from the stored data)
    def pieces(pre, text):
        _, texts, want = _llama_tok(pre)
        tok = _probe_tokenizer(texts, pre)
        ids = want[texts.index(text)]
        assert tok.encode(text, add_special=False) == ids
        return [tok.decode([j]) for j in ids]
    # kimi-k2: Han runs apart from kana, contractions attached, digits in threes
    assert pieces("kimi-k2", "漢字かな交じり文") == ["漢字", "かな", "交", "じり", "文"]
    assert pieces("kimi-k2", "don't I'm you're we've they'll she'd IT'S") == [
        "don't", " I'm", " you're", " we've", " they'll", " she'd", " IT'S"]
    assert pieces("kimi-k2", "1234567") == ["123", "456", "7"]
    # llama.cpp's splitter keeps no case split and no combining marks in words
    assert pieces("kimi-k2", "HelloWorld") == ["HelloWorld"]
    assert pieces("kimi-k2", "e\u0301 a\u0300\u0301") == ["e", "\u0301", " a", "\u0300\u0301"]
    # deepseek-v3: \p{M} joins the letters, digits in threes
    assert pieces("deepseek-v3", "e\u0301 a\u0300\u0301") == ["e\u0301", " a\u0300\u0301"]
    assert pieces("deepseek-v3", "1234567") == ["123", "456", "7"]
    # deepseek-coder: single digits; U+3000 only matches as whitespace
    # (llama.cpp's U+000B stand-in), not in the CJK ranges
    assert pieces("deepseek-coder", "中文123abc") == ["中文", "1", "2", "3", "abc"]
    assert pieces("deepseek-llm", "a\u3000b") == ["a", "\u3000b"]


def test_deepseek_aliases_and_kimi_without_merges():
    for name in ("hunyuan-dense", "hy_v4", "joyai-llm"):
        assert _probe_tokenizer(["ab"], name).pre == "deepseek-v3"
    # llama.cpp loads a kimi-k2 vocabulary without merges (every other
    # byte-level vocabulary needs them): each byte is then its own token
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "kimi-k2",
          "tokenizer.ggml.tokens": ["a", "b", "Ġ"],
          "tokenizer.ggml.token_type": np.array([1, 1, 1], np.int32)}
    assert Tokenizer.from_metadata(md).encode("ab a", add_special=False) == [0, 1, 2, 0]
    md["tokenizer.ggml.pre"] = "deepseek-v3"
    with pytest.raises(TokenizerError, match="tokenizer.ggml.merges"):
        Tokenizer.from_metadata(md)


def test_encode_names_a_lone_surrogate(tmp_path):
    # a str that is not Unicode text: one ValueError naming the character
    # and its place (it was a raw UnicodeEncodeError from inside a fragment)
    from infer_helpers import tiny_model
    from strata_ref.infer import load
    path = tmp_path / "tiny.gguf"
    tiny_model("qwen3", path)
    tok = load(str(path)).tokenizer
    with pytest.raises(ValueError, match="^text is not valid Unicode: a lone surrogate U\\+D800 at character 1$"):
        tok.encode("a\ud800b")
