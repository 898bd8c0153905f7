"""Small random qwen3 models whose every matrix has one weight type, for
checking whole-model logits against llama.cpp per CPU profile
(tests/test_cpu_typed_models.py; the reference logits are made by
`python tools/llama_ref.py --profile P typed`).

The shapes make every layer matrix a multiple of 8 rows, so that llama.cpp
moves IQ4_NL and MXFP4 matrices into its CPU_REPACK buffer on AVX2 builds
(`ggml_repack_get_optimal_repack_type`): n_embd 512, 8 heads of 64 over 4
KV heads (q / output 512 rows, k / v 256), n_ff 1024, 2 layers; the token
embedding has the type too. The output matrix is F32: a quantized one
would quantize its input to Q8_0 again, and 8-bit codes almost never
change when the hidden state changes in its last bits, so the logits would
hardly depend on how the layers' matrices summed (a model whose output
matrix is IQ4_NL gives llama.cpp's logits bit for bit with the repacked
layers computed the non-repacked way). With an F32 output the logits see
the last layer's sums to the bit; the embedding is kept small next to the
layers' contributions for the same reason. The blocks are random valid
bytes with the scale field set in a range that keeps activations
moderate, so writing a model takes milliseconds; the same (type, seed)
always gives the same file.
"""
from __future__ import annotations

import numpy as np

#: the weight types a typed model can have
TYPED = ("IQ4_NL", "MXFP4")
#: the token ids every typed-model reference pass feeds (12 tokens)
IDS = [257, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]
#: the incremental reference pass: this many tokens in one call, then one
#: token per call (5 = one gemm group of 4 plus one gemv row)
N_PROMPT = 5

_L, _E, _H, _KV, _D, _F = 2, 512, 8, 4, 64, 1024


def _blocks(t, rows: int, cols: int, gain: float, rng) -> np.ndarray:
    """Random valid blocks of type t (uint8, rows * cols / QK * block bytes)
    whose values have a standard deviation of about `gain`: random code
    bytes, and per block an fp16 scale (IQ4_NL: |kvalues_iq4nl| have rms
    about 70) or an E8M0 exponent (MXFP4: the doubled E2M1 values have rms
    about 6) near the value that gives that spread."""
    from strata_ref import GGMLType, block_format
    fmt = block_format(GGMLType[t])
    nb = rows * cols // fmt.block_values
    b = rng.integers(0, 256, (nb, fmt.block_bytes), dtype=np.uint8)
    if t == "IQ4_NL":
        d = (gain / 70.0 * (0.8 + 0.4 * rng.random(nb))).astype(np.float16)
        f = fmt.field("d")
        b[:, f.offset:f.offset + 2] = d.view(np.uint8).reshape(nb, 2)
    elif t == "MXFP4":
        e0 = 128 + int(np.round(np.log2(gain / 6.0)))
        f = fmt.field("e")
        b[:, f.offset] = rng.integers(e0 - 1, e0 + 2, nb).astype(np.uint8)
    else:
        raise ValueError(f"no typed model for {t!r}")
    return b.reshape(-1)


def typed_model(t: str, path, seed: int = 0) -> None:
    """Write the random qwen3 GGUF whose layer matrices and token embedding
    are all of weight type t (one of TYPED) to `path`; the output matrix
    and the norms F32 (module docstring). ValueError for another type."""
    from strata_ref import GGMLType
    from tiny_gguf import N_VOCAB as nv, metadata, norm, write

    if t not in TYPED:
        raise ValueError(f"no typed model for {t!r} (known: {', '.join(TYPED)})")
    rng = np.random.default_rng(seed)
    arch = "qwen3"
    md = metadata(arch, layers=_L, embd=_E, ff=_F, heads=_H, kv_heads=_KV, head_dim=_D)
    ty = GGMLType[t]

    def mat(rows, cols, gain):
        return (ty, (cols, rows), _blocks(t, rows, cols, gain, rng))

    out = (0.05 * rng.standard_normal((nv, _E))).astype(np.float32)
    ts = [("token_embd.weight",) + mat(nv, _E, 0.3), ("output_norm.weight",) + norm(rng, _E),
          ("output.weight", GGMLType.F32, (_E, nv), out)]
    for i in range(_L):
        p = f"blk.{i}."
        ts += [(p + "attn_norm.weight",) + norm(rng, _E), (p + "attn_q.weight",) + mat(_H * _D, _E, 0.05),
               (p + "attn_k.weight",) + mat(_KV * _D, _E, 0.05), (p + "attn_v.weight",) + mat(_KV * _D, _E, 0.05),
               (p + "attn_output.weight",) + mat(_E, _H * _D, 0.05),
               (p + "attn_q_norm.weight",) + norm(rng, _D), (p + "attn_k_norm.weight",) + norm(rng, _D),
               (p + "ffn_norm.weight",) + norm(rng, _E), (p + "ffn_gate.weight",) + mat(_F, _E, 0.05),
               (p + "ffn_up.weight",) + mat(_F, _E, 0.05), (p + "ffn_down.weight",) + mat(_E, _F, 0.03)]
    write(path, md, ts)
