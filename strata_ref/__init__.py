"""strata-ref: the bitwise reference for GGML/GGUF quantized weights.

Public API (../shared/DESIGN.md): GGMLType, block_format, dequantize,
quantize, dequant_f32/f16/bf16, fnv1a64, hash_array, gguf.read, GGUFError,
native.available/select. Heavy submodules are imported on first use.
"""
from .types import GGMLType, BlockFormat, UnsupportedTypeError, block_format, parse_type
from .hashing import FNV64_OFFSET, fnv1a64, hash_array
from .dequant import dequant_f32, dequant_f16, dequant_bf16, dequantize

__version__ = "0.1.0"

__all__ = ["GGMLType", "BlockFormat", "UnsupportedTypeError", "block_format",
           "parse_type", "FNV64_OFFSET", "fnv1a64", "hash_array", "dequant_f32",
           "dequant_f16", "dequant_bf16", "dequantize", "quantize", "GGUFError",
           "gguf", "native", "models", "__version__"]


def __getattr__(name):
    # Lazy: importing strata_ref stays cheap, and optional parts load on use.
    import importlib
    if name == "GGUFError":
        return importlib.import_module(".gguf", __name__).GGUFError
    if name in ("gguf", "native", "models", "golden", "routes", "infer"):
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'strata_ref' has no attribute {name!r}")


# The submodule strata_ref.quantize holds the function of the same name; bind
# the function last so that importing the submodule elsewhere cannot replace it.
from .quantize import quantize  # noqa: E402
