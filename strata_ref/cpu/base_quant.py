"""ggml-base's reference quantizers as the build's compiler made them: what
a block-type KV cache is stored with.

ggml-cpu's `from_float` of Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL (`set_rows`
into a KV cache of that type) calls ggml-base's `quantize_row_<type>_ref`
(ggml/src/ggml-quants.c; ggml-cpu/quants.c `quantize_row_iq4_nl`). ggml-base
is compiled without the variant's instruction-set flags, so on x86 there is
no FMA to contract and the quantizers compute as written
(`strata_ref.quantize`). On aarch64 FMA is part of the base instruction set
and GCC 12 contracts (`-ffp-contract=fast`, GNU C's default), as the
disassembly of the arm64 builds' `ggml-quants.c.o` shows (`python
tools/arm_ref.py disasm`; docs/arm64.md "KV caches"):

* Q4_0 / Q5_0: `(int8_t)(x*id + 8.5f)` (16.5f) is `fmla` then `fcvtzs`:
  fma(x, id, 8.5) truncated;
* Q4_1 / Q5_1: `(x - min)*id + 0.5f`: the difference rounded, then one
  fma with id and 0.5;
* IQ4_NL (`quantize_row_iq4_nl_impl`, ntry = -1): `sumqx += w*q*x` and
  `sumq2 += w*q*q` are `fmul` (w*q) then one `fmadd` each.

Which build contracts is its instruction-set chain's `BASE_FMA`
(`strata_ref.cpu.isa`). The rest of each quantizer is unchanged; the bytes
differ only where a fused sum crosses a truncation boundary or moves a
rounded scale, rare, but a KV cache holds many values (the IQ4_NL cache of
SmolLM2 differs from the unfused bytes within 9 tokens).
"""
from __future__ import annotations

import numpy as np

from ..formats import legacy_quant as _lq
from ..formats._qdrive import run_blocks
from ..types import GGMLType, block_format, parse_type

__all__ = ["FUSED_TYPES", "quantize_base"]

_FUSED_BLOCKS = {GGMLType.Q4_0: _lq.quant_q4_0_fma, GGMLType.Q4_1: _lq.quant_q4_1_fma,
                 GGMLType.Q5_0: _lq.quant_q5_0_fma, GGMLType.Q5_1: _lq.quant_q5_1_fma}
#: the types whose contracted reference quantizer is reproduced
FUSED_TYPES = frozenset(_FUSED_BLOCKS) | {GGMLType.IQ4_NL}


def quantize_base(x: np.ndarray, t, isa) -> np.ndarray:
    """ggml-base's `quantize_row_<t>_ref` of float32 rows x (rows,
    n_per_row), n_per_row a whole number of blocks, as the build of
    instruction-set chain `isa` computes it: `strata_ref.quantize` where
    the chain's `BASE_FMA` is False, else the contracted form (module
    docstring). Returns uint8 (rows, blocks per row * block bytes). Raises
    NotImplementedError for a type outside `FUSED_TYPES` on a contracting
    build, and quantize's errors (ValueError for NaN / Inf or a bad
    shape)."""
    from ..quantize import quantize
    t = parse_type(t)
    if not isa.resolve("BASE_FMA"):
        return quantize(x, t)
    if t not in FUSED_TYPES:
        raise NotImplementedError(f"{t.name}'s reference quantizer as an FMA-contracting ggml-base "
                                  f"computes it is not emulated")
    x = np.ascontiguousarray(x, np.float32)
    fmt = block_format(t)
    if x.ndim != 2 or x.shape[1] % fmt.block_values:
        raise ValueError(f"{t.name}: rows of a whole number of {fmt.block_values}-value blocks "
                         f"expected, got shape {x.shape}")
    blocks = x.reshape(-1, fmt.block_values)
    if t == GGMLType.IQ4_NL:
        from ..formats.iquants_quant import _quantize_iq4_nl
        out = _quantize_iq4_nl(blocks, -1, True)
    else:
        out = run_blocks(_FUSED_BLOCKS[t], blocks, fmt.block_bytes, True)
    return out.reshape(x.shape[0], -1)
