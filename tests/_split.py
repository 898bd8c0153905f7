"""Test helpers: small models of several types, and gguf-py writing them
whole or split into shards (`GGUFWriter(split_max_tensors=...)`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from strata_ref import gguf
from strata_ref.golden import sane_blocks
from strata_ref.gguf import GGUFValueType as V
from strata_ref.types import GGMLType as T, block_format

#: (name, type, shape in ggml order) of `mixed_tensors`: quantized matrices,
#: norms, a plain integer tensor, one row longer than a hash chunk in tests
#: that shrink the chunk.
MIXED = (
    ("token_embd.weight", T.Q8_0, (256, 9)),
    ("blk.0.attn_norm.weight", T.F32, (64,)),
    ("blk.0.attn_q.weight", T.Q4_K, (512, 6)),
    ("blk.0.ffn_down.weight", T.Q6_K, (256, 7)),
    ("blk.0.ffn_up.weight", T.IQ4_XS, (256, 3)),
    ("blk.0.ffn_norm.weight", T.F16, (64,)),
    ("blk.0.pos.weight", T.I32, (11,)),
    ("output.weight", T.Q4_1, (1024, 2)),
)


def mixed_tensors(seed: int = 0):
    """write_gguf tensors of MIXED with seeded contents (finite scales)."""
    rng = np.random.default_rng(seed)
    out = []
    for name, t, shape in MIXED:
        n = int(np.prod(shape))
        if t == T.I32:
            data = rng.integers(-2**31, 2**31, n).astype("<i4")
        else:
            data = sane_blocks(t, n // block_format(t).block_values, rng).reshape(-1)
        out.append((name, t, shape, data))
    return out


def write_mixed(path, seed: int = 0, **split) -> list[Path]:
    """Write the mixed model to `path`, or its shards beside it with gguf-py's
    split options; returns the files written, first to last."""
    path = Path(path)
    gguf.write_gguf(path, {"general.name": "mixed", "general.architecture": "llama"},
                    mixed_tensors(seed), **split)
    if path.exists():
        return [path]
    return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))


def resplit(src, dst, **split) -> list[Path]:
    """Copy the GGUF file `src` (metadata with its types, tensors as bytes)
    to `dst` with gguf-py, split with `split` (e.g. split_max_tensors=5);
    returns the shards written."""
    f = gguf.read_file(src)
    md = {}
    for k, v in f.metadata.items():
        if k.startswith("split.") or k == "general.alignment":
            continue
        vt = f.metadata_types[k]
        if k == "general.architecture":
            md[k] = v                # write_gguf hands it to GGUFWriter(arch=...)
        elif vt == V.ARRAY:
            md[k] = (V.ARRAY, list(v.tolist() if isinstance(v, np.ndarray) else v), f.array_types[k])
        else:
            md[k] = (vt, v)
    tensors = [(t.name, t.type, t.shape, np.asarray(t.data)) for t in f.tensors]
    dst = Path(dst)
    gguf.write_gguf(dst, md, tensors, alignment=f.alignment if f.alignment != 32 else None, **split)
    return sorted(dst.parent.glob(f"{dst.stem}-*-of-*.gguf")) or [dst]
