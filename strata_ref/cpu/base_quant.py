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
tools/arm_ref.py disasm`; docs/arm64.md "Flash attention and the KV caches"):

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


def _fused_blocks(t: GGMLType):
    """The contracted block quantizer of t, float32 (n, QK) -> uint8 (n, B),
    in the form `quantize_with` takes."""
    if t == GGMLType.IQ4_NL:
        from ..formats.iquants_quant import _quantize_iq4_nl
        return lambda blocks: _quantize_iq4_nl(blocks, -1, True)
    fmt, fn = block_format(t), _FUSED_BLOCKS[t]

    def run(blocks, check_finite=False):
        return run_blocks(fn, blocks, fmt.block_bytes, check_finite)
    run.checks_finite = True
    return run


def quantize_base(x, t, isa) -> np.ndarray:
    """ggml-base's `quantize_row_<t>_ref` of x as the build of
    instruction-set chain `isa` (`strata_ref.cpu.select(profile).isa`)
    computes it: `strata_ref.quantize` where the chain's `BASE_FMA` is
    False, else the contracted form (module docstring). x, t, the result's
    shape and dtype and the errors are `strata_ref.quantize`'s (1-D or 2-D
    float input, rows of whole blocks; ValueError naming the position of a
    NaN / Inf), plus NotImplementedError for a type outside `FUSED_TYPES`
    on a contracting build and TypeError for an `isa` that is not a
    chain."""
    from ..quantize import quantize, quantize_with
    from .isa import Isa
    if not isinstance(isa, Isa):
        raise TypeError(f"quantize_base: isa must be an instruction-set chain "
                        f"(strata_ref.cpu.select(profile).isa), got {type(isa).__name__}")
    t = parse_type(t)
    if not isa.resolve("BASE_FMA"):
        return quantize(x, t)
    if t not in FUSED_TYPES:
        raise NotImplementedError(f"{t.name}'s reference quantizer as an FMA-contracting ggml-base "
                                  f"computes it is not emulated")
    return quantize_with(x, t, lambda: _fused_blocks(t))
