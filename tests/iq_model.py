"""A tiny random qwen3 GGUF whose mat-muls are the 256-value I-quants, for a
whole-model check of `strata_ref.cpu.dots_iquants` against llama.cpp.

`tiny_iq_model(path)` writes 2 layers, n_embd 256, 4 heads of 64 over 2 KV
heads, n_ff 512, a 259-token byte vocabulary: a Q8_0 embedding, F32 norms,
and every matrix (q, k, v, o, gate, up, down, output) in one of the eight
I-quants in turn (`IQ_TYPES`), as random valid blocks
(`routes.mmvq_inputs.sane_blocks`; llama.cpp makes most of these types only
with an importance matrix, so they are not quantized from floats here).
The same seed always gives the same bytes. `PASSES` are the token batches
fed one after the other: 12 tokens (ggml's tiled path), 5 (vec_dot with 2-7
rows), then single tokens (vec_dot, one row). tools/llama_ref_iq.py stores
llama.cpp's logits of every position per CPU profile.
"""
from __future__ import annotations

IQ_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS")
PASSES = ([257, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100], [100, 101, 102, 103, 104],
          [50], [60], [70])


def tiny_iq_model(path, seed: int = 5) -> None:
    """Write the model (module docstring) to `path`."""
    import numpy as np
    from strata_ref import GGMLType
    from strata_ref.quantize import quantize
    from strata_ref.routes.mmvq_inputs import sane_blocks
    from tiny_gguf import N_VOCAB as nv, metadata, norm, write

    rng = np.random.default_rng(seed)
    arch = "qwen3"
    L, E, H, KV, D, F = 2, 256, 4, 2, 64, 512
    md = metadata(arch, layers=L, embd=E, ff=F, heads=H, kv_heads=KV, head_dim=D)
    n_iq = [0]

    def iq(rows, cols):
        t = GGMLType[IQ_TYPES[n_iq[0] % len(IQ_TYPES)]]
        n_iq[0] += 1
        return (t, (cols, rows), sane_blocks(t, rows * cols // 256, rng).reshape(-1))

    emb = rng.standard_normal((nv, E)).astype(np.float32)
    ts = [("token_embd.weight", GGMLType.Q8_0, (E, nv), quantize(emb, GGMLType.Q8_0).reshape(-1)),
          ("output_norm.weight",) + norm(rng, E), ("output.weight",) + iq(nv, E)]
    for i in range(L):
        p = f"blk.{i}."
        ts += [(p + "attn_norm.weight",) + norm(rng, E), (p + "attn_q.weight",) + iq(H * D, E),
               (p + "attn_k.weight",) + iq(KV * D, E), (p + "attn_v.weight",) + iq(KV * D, E),
               (p + "attn_output.weight",) + iq(E, H * D),
               (p + "attn_q_norm.weight",) + norm(rng, D), (p + "attn_k_norm.weight",) + norm(rng, D),
               (p + "ffn_norm.weight",) + norm(rng, E), (p + "ffn_gate.weight",) + iq(F, E),
               (p + "ffn_up.weight",) + iq(F, E), (p + "ffn_down.weight",) + iq(E, F)]
    write(path, md, ts)
