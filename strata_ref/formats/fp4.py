"""FP4 formats: MXFP4 (32 values, one E8M0 scale) and NVFP4 (64 values, four
UE4M3 scales, one per 16 values).

Formulas: ../shared/spec/formats.md §5 "FP4 types", in the operation order of
ggml `dequantize_row_mxfp4` and `dequantize_row_nvfp4` (ggml-org/ggml
src/ggml-quants.c @ d99724f2). Elements are E2M1 codes looked up in
`KVALUES_MXFP4` (the E2M1 values doubled), so the scales are *half* values:
`ggml_e8m0_to_fp32_half` and `ggml_ue4m3_to_fp32` (formats.md §4), taken
here as 256-entry float32 tables built from strata_ref.numerics.
"""
import numpy as np
from numba import njit

from .. import numerics
from ..types import GGMLType, block_format
from . import register_dequant

#: `kvalues_mxfp4` of ggml-org/ggml src/ggml-common.h @ d99724f2 (also
#: gguf-py's `MXFP4.kvalues`): E2M1 codes 0..15 -> twice their value.
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                         dtype=np.int8)
KVALUES_MXFP4.setflags(write=False)

#: float32[256]: ggml_e8m0_to_fp32_half(e) for every byte e.
E8M0_HALF = numerics.e8m0_half_to_f32(np.arange(256))
E8M0_HALF.setflags(write=False)

#: float32[256]: ggml_ue4m3_to_fp32(x) for every byte x (half the UE4M3 value).
UE4M3_HALF = numerics.ue4m3_to_f32(np.arange(256))
UE4M3_HALF.setflags(write=False)

_MXFP4 = block_format(GGMLType.MXFP4)
_MXFP4_E = _MXFP4.offset("e")
_MXFP4_QS = _MXFP4.offset("qs")
_MXFP4_NQ = _MXFP4.field("qs").count        # QK / 2

_NVFP4 = block_format(GGMLType.NVFP4)
_NVFP4_D = _NVFP4.offset("d")
_NVFP4_QS = _NVFP4.offset("qs")
_NVFP4_NSUB = _NVFP4.field("d").count       # sub-blocks, one scale each
_NVFP4_NQ = _NVFP4.field("qs").count // _NVFP4_NSUB   # qs bytes per sub-block


@njit(inline="always", cache=True)
def _fp4_pairs(b, y, q0, y0, n, s):
    # n bytes at q0: low nibble -> y[y0 + j], high nibble -> y[y0 + n + j],
    # each (float)kvalues_mxfp4[code] * s.
    for j in range(n):
        x = np.int64(b[q0 + j])
        y[y0 + j] = np.float32(KVALUES_MXFP4[x & 15]) * s
        y[y0 + n + j] = np.float32(KVALUES_MXFP4[x >> 4]) * s


@register_dequant(GGMLType.MXFP4)
@njit(inline="always", cache=True)
def dequant_mxfp4(b, y):
    """MXFP4 block (17 bytes) -> 32 float32 (ggml `dequantize_row_mxfp4`):
    y[j] = (float)kv[qs[j] & 15] * D, y[j+16] = (float)kv[qs[j] >> 4] * D,
    D = e8m0_half(e) = 2^(e-128). e >= 254 can overflow to ±Inf, as in C."""
    _fp4_pairs(b, y, _MXFP4_QS, 0, _MXFP4_NQ, E8M0_HALF[b[_MXFP4_E]])


@register_dequant(GGMLType.NVFP4)
@njit(inline="always", cache=True)
def dequant_nvfp4(b, y):
    """NVFP4 block (36 bytes) -> 64 float32 (ggml `dequantize_row_nvfp4`):
    for sub-block s < 4, D = ue4m3(d[s]); y[16s+j] = (float)kv[qs[8s+j] & 15] * D,
    y[16s+8+j] = (float)kv[qs[8s+j] >> 4] * D (j < 8). Bit 7 of a scale byte
    is ignored, as in C."""
    for s in range(_NVFP4_NSUB):
        _fp4_pairs(b, y, _NVFP4_QS + _NVFP4_NQ * s, 2 * _NVFP4_NQ * s, _NVFP4_NQ,
                   UE4M3_HALF[b[_NVFP4_D + s]])
