"""Write a small GGUF of real tensors from the registry models, for a GPU
machine that reaches no package registry (the device hashing tests and the
README figures of `strata-ref hash FILE --device cuda`).

The tensors are taken byte for byte from SmolLM2-135M-Instruct and
Qwen2.5-Coder-0.5B-Instruct (`strata-ref models fetch`), renamed with the
model as a prefix (`smollm2.token_embd.weight`), and written with gguf-py's
GGUFWriter (`strata_ref.gguf.write_gguf`). They cover every type of the two
files and three of the five wide kernels (Q8_0, Q4_K, Q6_K); the other two
(Q5_K, IQ4_XS) have no tensor in either model, so one real tensor
(SmolLM2's blk.1.ffn_down) is dequantized by the oracle and re-quantized
with ggml's reference quantizers (`strata_ref.quantize`), under the names
`requant.q5_k.…` and `requant.iq4_xs.…`.

SmolLM2's tensors keep their golden hashes (golden/models/
SmolLM2-135M-Instruct.json: the same bytes, the same per-tensor hash under
the unprefixed name). About 46 MB.

Usage: python tools/make_real_gguf.py OUT.gguf
"""
from __future__ import annotations

import sys

import numpy as np

#: (registry model, prefix, tensor names in the order written)
SELECTION = (
    ("SmolLM2-135M-Instruct", "smollm2", (
        "token_embd.weight",                    # Q8_0 576 x 49152
        "blk.0.attn_norm.weight", "blk.0.ffn_down.weight", "blk.0.ffn_gate.weight",
        "blk.0.ffn_up.weight", "blk.0.ffn_norm.weight", "blk.0.attn_k.weight",
        "blk.0.attn_output.weight", "blk.0.attn_q.weight", "blk.0.attn_v.weight")),
    ("Qwen2.5-Coder-0.5B-Instruct", "qwen", (
        "blk.0.attn_norm.weight", "blk.0.ffn_down.weight", "blk.0.attn_q.bias",
        "blk.0.attn_q.weight", "blk.0.attn_v.weight",
        "blk.1.ffn_down.weight", "blk.2.ffn_down.weight", "blk.4.ffn_down.weight")),
)
#: (source model, tensor, ggml types it is re-quantized to)
REQUANT = ("SmolLM2-135M-Instruct", "blk.1.ffn_down.weight", ("Q5_K", "IQ4_XS"))


def collect():
    """[(name, GGMLType, shape in ggml order, uint8 bytes)] of the file."""
    from strata_ref.dequant import dequant_f32
    from strata_ref.gguf import read
    from strata_ref.models import resolve
    from strata_ref.quantize import quantize
    from strata_ref.types import parse_type

    out = []
    for model, prefix, names in SELECTION:
        f = read(resolve(model))
        for n in names:
            t = f.tensor(n)
            out.append((f"{prefix}.{n}", t.type, t.shape, np.array(t.data)))
    model, name, types = REQUANT
    t = read(resolve(model)).tensor(name)
    x = dequant_f32(t.type, t.data, t.rows, t.cols)
    for q in types:
        out.append((f"requant.{q.lower()}.{name}", parse_type(q), t.shape,
                    quantize(x, q).reshape(-1)))
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    from strata_ref.gguf import write_gguf
    tensors = collect()
    write_gguf(argv[0], {"general.name": "strata-ref real tensors (SmolLM2, Qwen2.5-Coder)"},
               tensors)
    total = sum(d.size for *_, d in tensors)
    print(f"{argv[0]}: {len(tensors)} tensors, {total / 1e6:.1f} MB of tensor data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
