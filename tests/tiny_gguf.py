"""The one builder of the tests' tiny GGUF models: hyper-parameters, the
byte-level vocabulary, norm weights and the file.

Every tiny model of the tests (`infer_helpers.tiny_model` /
`tiny_moe_model`, `typed_models.typed_model`, `iq_model.tiny_iq_model`,
test_rotate's float models) is a small random model of one architecture
with the same 259-token byte-level BPE vocabulary (256 byte tokens, "ĠĠ",
<|bos|> 257, <|eos|> 258, one merge), written with `strata_ref.gguf.write_gguf`.
Their bytes are pinned (llama.cpp's logits of several are stored under
tests/data with the file's sha256), so the metadata keys come out in one
fixed order: architecture, the hyper-parameters, the vocabulary; a caller's
extra keys follow (or replace a value in place).
"""
from __future__ import annotations

import numpy as np

#: the byte-level vocabulary's size and special ids
N_VOCAB, BOS, EOS = 259, 257, 258


def byte_tokens() -> list[str]:
    """The 259 token strings: GPT-2's byte-to-unicode map of bytes 0..255,
    then "ĠĠ", "<|bos|>", "<|eos|>"."""
    from strata_ref.infer.tokenizer import _BYTE_TO_CHAR
    return [_BYTE_TO_CHAR[b] for b in range(256)] + ["ĠĠ", "<|bos|>", "<|eos|>"]


def metadata(arch: str, *, layers: int, embd: int, ff: int, heads: int, kv_heads: int,
             head_dim: int | None = None, ctx: int = 256, eps: float = 1e-6,
             rope_base: float = 1e6, after_ff: dict | None = None) -> dict:
    """GGUF metadata of a tiny `arch` model with the byte-level vocabulary, for
    `write_gguf`: `{arch}.block_count` ... `{arch}.rope.freq_base`, the
    keys of `after_ff` right after `feed_forward_length` (an MoE's expert
    sizes), `key_length` / `value_length` only when `head_dim` is given,
    then the tokenizer's keys."""
    from strata_ref.gguf import GGUFValueType as V
    u32 = lambda v: (V.UINT32, v)       # noqa: E731
    md = {"general.architecture": arch,
          f"{arch}.block_count": u32(layers), f"{arch}.context_length": u32(ctx),
          f"{arch}.embedding_length": u32(embd), f"{arch}.feed_forward_length": u32(ff)}
    md.update(after_ff or {})
    md[f"{arch}.attention.head_count"] = u32(heads)
    md[f"{arch}.attention.head_count_kv"] = u32(kv_heads)
    if head_dim is not None:
        md[f"{arch}.attention.key_length"] = u32(head_dim)
        md[f"{arch}.attention.value_length"] = u32(head_dim)
    md[f"{arch}.attention.layer_norm_rms_epsilon"] = (V.FLOAT32, eps)
    md[f"{arch}.rope.freq_base"] = (V.FLOAT32, rope_base)
    md.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
               "tokenizer.ggml.tokens": (V.ARRAY, byte_tokens(), V.STRING),
               "tokenizer.ggml.token_type": (V.ARRAY, [1] * 257 + [3, 3], V.INT32),
               "tokenizer.ggml.merges": (V.ARRAY, ["Ġ Ġ"], V.STRING),
               "tokenizer.ggml.bos_token_id": u32(BOS), "tokenizer.ggml.eos_token_id": u32(EOS),
               "tokenizer.ggml.add_bos_token": False})
    return md


def norm(rng: np.random.Generator, n: int, gain: float = 1.0):
    """An F32 norm weight tensor entry (type, shape, data): gain · (1 + 0.1·N(0,1))."""
    from strata_ref import GGMLType
    return (GGMLType.F32, (n,), (gain * (1.0 + 0.1 * rng.standard_normal(n))).astype(np.float32))


def write(path, md: dict, tensors, **split) -> None:
    """Write the model (`strata_ref.gguf.write_gguf`; `split`: its split options)."""
    from strata_ref.gguf import write_gguf
    write_gguf(path, md, tensors, **split)
