"""Write a large synthetic GGUF model for measuring `strata-ref hash`.

The shapes are Llama-3-70B's (n_embd 8192, n_ff 28672, 64 heads over 8 KV
heads of 128, a 128256-token vocabulary), with `--layers` of its 80 layers:
Q4_K matrices, F32 norms, a Q4_K token embedding and a Q6_K output matrix,
the mix of a Q4_K_M-like file. 40 layers make 20.7 GB. Block contents are
random with finite scales (strata_ref.golden.sane_blocks), drawn once into a
pool and taken from it at a different offset for every tensor, so writing
is bound by the disk rather than the random generator.

gguf-py's GGUFWriter writes the file in streaming mode (tensor infos first,
then one tensor at a time), split into shards of at most `--shard-gb` GB
(`NAME-00001-of-0000N.gguf` beside OUT), or as one file with --shard-gb 0.

    python tools/make_big_model.py /path/big.gguf --layers 40 --shard-gb 5
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from strata_ref.golden import sane_blocks  # noqa: E402
from strata_ref.types import GGMLType as T, block_format  # noqa: E402

E, FF, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 8192, 28672, 64, 8, 128, 128256


def tensors(layers: int):
    """(name, type, shape in ggml order: ne[0] first)."""
    out = [("token_embd.weight", T.Q4_K, (E, VOCAB))]
    for i in range(layers):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", T.F32, (E,)),
                (p + "attn_q.weight", T.Q4_K, (E, HEADS * HEAD_DIM)),
                (p + "attn_k.weight", T.Q4_K, (E, KV_HEADS * HEAD_DIM)),
                (p + "attn_v.weight", T.Q4_K, (E, KV_HEADS * HEAD_DIM)),
                (p + "attn_output.weight", T.Q4_K, (HEADS * HEAD_DIM, E)),
                (p + "ffn_norm.weight", T.F32, (E,)),
                (p + "ffn_gate.weight", T.Q4_K, (E, FF)),
                (p + "ffn_up.weight", T.Q4_K, (E, FF)),
                (p + "ffn_down.weight", T.Q4_K, (FF, E))]
    out += [("output_norm.weight", T.F32, (E,)), ("output.weight", T.Q6_K, (E, VOCAB))]
    return out


def n_bytes(t, shape) -> int:
    fmt = block_format(t)
    return int(np.prod(shape)) // fmt.block_values * fmt.block_bytes


class Pool:
    """Random sane blocks of one type, handed out from a moving offset."""

    def __init__(self, t, n_blocks: int, rng):
        self.t, self.blocks, self.at = t, sane_blocks(t, n_blocks, rng), 0

    def take(self, n: int) -> np.ndarray:
        idx = (self.at + np.arange(n)) % len(self.blocks)
        self.at = (self.at + 7919 * 1021) % len(self.blocks)
        return self.blocks[idx]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="path of the model (shards are named after it)")
    ap.add_argument("--layers", type=int, default=40, help="layers of Llama-3-70B's 80 (default 40)")
    ap.add_argument("--shard-gb", type=float, default=5.0, help="shard size limit in GB, 0: one file")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    import gguf
    rng = np.random.default_rng(a.seed)
    spec = tensors(a.layers)
    total = sum(n_bytes(t, s) for _, t, s in spec)
    print(f"{len(spec)} tensors, {total / 1e9:.2f} GB", flush=True)
    w = gguf.GGUFWriter(a.out, "llama", split_max_size=int(a.shard_gb * 1e9))
    w.add_name(f"synthetic Llama-3-70B shapes, {a.layers} layers")
    w.add_block_count(a.layers)
    w.add_context_length(8192)
    w.add_embedding_length(E)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    for name, t, shape in spec:
        if t == T.F32:
            w.add_tensor_info(name, shape[::-1], np.dtype(np.float32), n_bytes(t, shape))
        else:
            row = n_bytes(t, shape[:1])
            w.add_tensor_info(name, (int(np.prod(shape[1:])), row), np.dtype(np.uint8),
                              n_bytes(t, shape), raw_dtype=gguf.GGMLQuantizationType(int(t)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pools = {T.Q4_K: Pool(T.Q4_K, 1 << 20, rng), T.Q6_K: Pool(T.Q6_K, 1 << 18, rng)}
    t0, done = time.perf_counter(), 0
    for name, t, shape in spec:
        if t == T.F32:
            data = (1.0 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32)
        else:
            nb = int(np.prod(shape)) // block_format(t).block_values
            data = pools[t].take(nb).reshape(int(np.prod(shape[1:])), -1)
        w.write_tensor_data(data)
        done += data.nbytes
        print(f"\r{done / 1e9:6.2f} / {total / 1e9:.2f} GB", end="", flush=True)
    w.close()
    dt = time.perf_counter() - t0
    print(f"\nwrote {total / 1e9:.2f} GB in {dt:.0f} s ({total / dt / 1e9:.2f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
