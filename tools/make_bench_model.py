"""Write a dense model of real size (Qwen2.5-1.5B or Llama-3-8B / Mistral-7B shapes, Q4_K_M) from seeded
random weights, with a real tokenizer, for measuring CPU inference speed
(`tools/bench_infer.py --models FILE`) with no download.

Shapes (`SHAPES`):

- `1.5b`: Qwen2.5-1.5B's: architecture `qwen2`, n_embd 1536, n_ff 8960,
  28 layers, 12 query heads over 2 KV heads of 128, q/k/v biases, token
  embedding tied to the output (no `output.weight`).
- `7b`: Llama-3-8B / Mistral-7B's: architecture `llama`, n_embd 4096,
  n_ff 14336, 32 layers, 32 query heads over 8 KV heads of 128, a separate
  output matrix.

Both use Qwen2.5-Coder-0.5B-Instruct's tokenizer (GPT-2 BPE, `qwen2`
pre-tokenizer, 151,936 tokens: `strata-ref models fetch` gets it), so the
output matrix is that of a 150k vocabulary. Weight types follow
`llama_tensor_get_type` (llama.cpp `src/llama-quant.cpp`, vendored by
llama-cpp-python 0.3.36) for `LLAMA_FTYPE_MOSTLY_Q4_K_M`: Q4_K everywhere
except `attn_v` and `ffn_down` of the layers `use_more_bits` picks (the
first and last eighth, and every third layer between), which are Q6_K;
the output matrix, or a token embedding tied to it, Q6_K; norms and biases
F32.

The weights are N(0, 0.02) values quantized once by ggml's reference
quantizers (`strata_ref.quantize`) into a pool of blocks per type, and
taken from the pool at a moving offset for every tensor, so writing is
bound by the disk. Norm weights are 1 + N(0, 0.1). The result is a model
llama.cpp loads and runs (its text is noise), with every tensor the
architecture needs at its real size. About 1.1 GB (`1.5b`) and 4.9 GB
(`7b`).

    python tools/make_bench_model.py 1.5b OUT.gguf [--seed 0] [--tokenizer GGUF]

`--tokenizer GGUF` takes the `tokenizer.*` keys from that file instead of
the registry model; `python tools/make_bench_model.py tokenizer OUT.gguf`
writes a GGUF of only those keys of the registry model (5.9 MB), so
that a machine without the 0.5 GB model (or without network) writes the
same bench models byte for byte.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from strata_ref.types import GGMLType as T, block_format  # noqa: E402

TOKENIZER_FROM = "Qwen2.5-Coder-0.5B-Instruct"


@dataclass(frozen=True)
class Shape:
    arch: str
    embd: int
    ff: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool
    tied: bool
    rope_base: float
    rms_eps: float


SHAPES = {
    "1.5b": Shape("qwen2", 1536, 8960, 28, 12, 2, 128, qkv_bias=True, tied=True,
                  rope_base=1e6, rms_eps=1e-6),
    "7b": Shape("llama", 4096, 14336, 32, 32, 8, 128, qkv_bias=False, tied=False,
                rope_base=5e5, rms_eps=1e-5),
}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's `use_more_bits` (src/llama-quant.cpp): the layers whose
    `attn_v` and `ffn_down` Q4_K_M stores as Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensors(s: Shape, vocab: int):
    """(name, type, shape in ggml order: ne[0] first), in llama.cpp's file order."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [("token_embd.weight", T.Q6_K if s.tied else T.Q4_K, (s.embd, vocab))]
    for i in range(s.layers):
        p, big = f"blk.{i}.", use_more_bits(i, s.layers)
        out += [(p + "attn_norm.weight", T.F32, (s.embd,)),
                (p + "attn_q.weight", T.Q4_K, (s.embd, q)),
                (p + "attn_k.weight", T.Q4_K, (s.embd, kv)),
                (p + "attn_v.weight", T.Q6_K if big else T.Q4_K, (s.embd, kv))]
        if s.qkv_bias:
            out += [(p + "attn_q.bias", T.F32, (q,)), (p + "attn_k.bias", T.F32, (kv,)),
                    (p + "attn_v.bias", T.F32, (kv,))]
        out += [(p + "attn_output.weight", T.Q4_K, (q, s.embd)),
                (p + "ffn_norm.weight", T.F32, (s.embd,)),
                (p + "ffn_gate.weight", T.Q4_K, (s.embd, s.ff)),
                (p + "ffn_up.weight", T.Q4_K, (s.embd, s.ff)),
                (p + "ffn_down.weight", T.Q6_K if big else T.Q4_K, (s.ff, s.embd))]
    out.append(("output_norm.weight", T.F32, (s.embd,)))
    if not s.tied:
        out.append(("output.weight", T.Q6_K, (s.embd, vocab)))
    return out


def n_bytes(t, shape) -> int:
    fmt = block_format(t)
    return int(np.prod(shape)) // fmt.block_values * fmt.block_bytes


class Pool:
    """Blocks of ggml type `t` quantized from N(0, 0.02) values, handed out
    from a moving offset."""

    def __init__(self, t, n_blocks: int, rng):
        from strata_ref.quantize import quantize
        fmt = block_format(t)
        x = (0.02 * rng.standard_normal((n_blocks // 64, 64 * fmt.block_values))).astype(np.float32)
        self.blocks = quantize(x, t).reshape(-1, fmt.block_bytes)
        self.at = 0

    def take(self, n: int) -> np.ndarray:
        idx = (self.at + np.arange(n)) % len(self.blocks)
        self.at = (self.at + 7919 * 1021) % len(self.blocks)
        return self.blocks[idx]


def tokenizer_fields(path):
    """Every `tokenizer.*` key of the GGUF at `path`: (key, value, type, sub
    type). ValueError naming the file when it is not a GGUF gguf-py reads,
    or has no `tokenizer.ggml.tokens`."""
    import gguf
    try:
        r = gguf.GGUFReader(path)
    except Exception as e:          # gguf-py's errors on a damaged file vary
        raise ValueError(f"{path}: not a GGUF file gguf-py can read ({e})") from None
    out = []
    for key, f in r.fields.items():
        if key.startswith("tokenizer."):
            sub = f.types[1] if len(f.types) > 1 else None
            out.append((key, f.contents(), f.types[0], sub))
    if not any(k == "tokenizer.ggml.tokens" for k, _, _, _ in out):
        raise ValueError(f"{path}: has no tokenizer.ggml.tokens key (a tokenizer source needs the "
                         f"tokenizer.* keys of a model)")
    return out


def _tokenizer_source(path=None) -> Path:
    if path is not None:
        return Path(path)
    from strata_ref.models import resolve
    return resolve(TOKENIZER_FROM)


def write_tokenizer(out: Path, source=None) -> int:
    """A GGUF holding only the `tokenizer.*` keys of `source` (default: the
    registry's TOKENIZER_FROM), for `write(..., tokenizer=out)` elsewhere;
    returns its size in bytes."""
    import gguf
    w = gguf.GGUFWriter(str(out), "qwen2")
    for key, val, vtype, sub in tokenizer_fields(_tokenizer_source(source)):
        w.add_key_value(key, val, vtype, sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return out.stat().st_size


def write(out: Path, shape_name: str, seed: int, tokenizer=None) -> int:
    """Write the model (the tokenizer keys from the GGUF `tokenizer`, else
    from the registry's TOKENIZER_FROM); returns its size in bytes."""
    import gguf
    s = SHAPES[shape_name]
    tok = tokenizer_fields(_tokenizer_source(tokenizer))
    vocab = next(len(v) for k, v, _, _ in tok if k == "tokenizer.ggml.tokens")
    spec = tensors(s, vocab)
    total = sum(n_bytes(t, sh) for _, t, sh in spec)
    print(f"{shape_name}: {len(spec)} tensors, {total / 1e9:.2f} GB", flush=True)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), s.arch)
    w.add_name(f"synthetic {shape_name} shapes (tools/make_bench_model.py, seed {seed})")
    w.add_block_count(s.layers)
    w.add_context_length(32768)
    w.add_embedding_length(s.embd)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    for key, val, vtype, sub in tok:
        w.add_key_value(key, val, vtype, sub)
    for name, t, shape in spec:
        if t == T.F32:
            w.add_tensor_info(name, shape[::-1], np.dtype(np.float32), n_bytes(t, shape))
        else:
            w.add_tensor_info(name, (int(np.prod(shape[1:])), n_bytes(t, shape[:1])), np.dtype(np.uint8),
                              n_bytes(t, shape), raw_dtype=gguf.GGMLQuantizationType(int(t)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pools = {T.Q4_K: Pool(T.Q4_K, 1 << 17, rng), T.Q6_K: Pool(T.Q6_K, 1 << 16, rng)}
    from strata_ref._progress import progress_bar
    bar = progress_bar(total, "writing", unit="B", unit_scale=True)
    for name, t, shape in spec:
        if t == T.F32:
            gain = 1.0 if name.endswith("norm.weight") else 0.0
            data = (gain + (0.1 if gain else 0.02) * rng.standard_normal(shape[0])).astype(np.float32)
        else:
            nb = int(np.prod(shape)) // block_format(t).block_values
            data = pools[t].take(nb).reshape(int(np.prod(shape[1:])), -1)
        w.write_tensor_data(data)
        bar.update(data.nbytes)
    bar.close()
    w.close()
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES) + ["tokenizer"],
                    help="a model shape, or `tokenizer`: only the tokenizer keys")
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", type=Path, default=None, metavar="GGUF",
                    help=f"take the tokenizer keys from this GGUF (default: {TOKENIZER_FROM})")
    a = ap.parse_args(argv)
    if a.tokenizer is not None:
        if not a.tokenizer.is_file():
            ap.error(f"--tokenizer: not a file: {a.tokenizer}")
        try:
            tokenizer_fields(a.tokenizer)
        except ValueError as e:
            ap.error(f"--tokenizer: {e}")
    if a.out.is_dir() or not a.out.parent.is_dir():
        ap.error(f"{a.out}: " + ("is a directory" if a.out.is_dir() else "its folder does not exist"))
    t0 = time.perf_counter()
    if a.shape == "tokenizer":
        size = write_tokenizer(a.out, a.tokenizer)
        print(f"wrote {a.out} ({size / 1e6:.1f} MB): the tokenizer keys")
        return 0
    total = write(a.out, a.shape, a.seed, a.tokenizer)
    print(f"wrote {a.out} ({total / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
