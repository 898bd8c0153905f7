"""strata-ref: the bitwise reference for GGML/GGUF quantized weights.

Public API (../shared/DESIGN.md): GGMLType, block_format, dequantize,
quantize, dequant_f32/f16/bf16, fnv1a64, hash_array, gguf.read, GGUFError,
native.available/select. Heavy submodules are imported on first use: the
names that need numba (hashing, dequantization) load it on first access,
after NUMBA_NUM_THREADS is checked (`_env`), so that `import strata_ref`
and the command line never fail inside numba.
"""
from .types import GGMLType, BlockFormat, UnsupportedTypeError, block_format, parse_type

__version__ = "0.1.0"

__all__ = ["GGMLType", "BlockFormat", "UnsupportedTypeError", "block_format",
           "parse_type", "FNV64_OFFSET", "fnv1a64", "hash_array", "dequant_f32",
           "dequant_f16", "dequant_bf16", "dequantize", "quantize", "GGUFError",
           "gguf", "native", "models", "__version__"]

# name -> submodule that defines it (loaded on first access)
_LAZY = {"FNV64_OFFSET": "hashing", "fnv1a64": "hashing", "hash_array": "hashing",
         "dequant_f32": "dequant", "dequant_f16": "dequant", "dequant_bf16": "dequant",
         "dequantize": "dequant", "GGUFError": "gguf"}


def __getattr__(name):
    # Lazy: importing strata_ref stays cheap, and optional parts load on use.
    import importlib
    if name in _LAZY:
        if _LAZY[name] != "gguf":           # the reader needs no numba
            from ._env import check_numba_env
            check_numba_env()
        value = getattr(importlib.import_module("." + _LAZY[name], __name__), name)
        globals()[name] = value
        return value
    if name in ("gguf", "native", "models", "golden", "routes", "infer"):
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'strata_ref' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


# The submodule strata_ref.quantize holds the function of the same name; bind
# the function last so that importing the submodule elsewhere cannot replace
# it. (strata_ref.quantize imports numba only when a quantizer is first used.)
from .quantize import quantize  # noqa: E402
