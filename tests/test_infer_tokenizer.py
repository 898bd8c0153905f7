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
            "falcon", "mpt", "llama-spm", "phi-3", "gemma-4"]


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
    with pytest.raises(TokenizerError, match="deepseek-coder"):
        Tokenizer.from_metadata(_md(d / "ggml-vocab-deepseek-coder.gguf"))
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
