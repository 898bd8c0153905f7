"""Requantized variants of the registry models, as llama.cpp's quantizer
makes them, rebuilt here without llama.cpp.

`VARIANTS` names each variant's registry model and llama.cpp file type;
tools/make_variants.py ran `llama_model_quantize` for it and stored the
manifest tests/data/variants/<name>.json (per tensor in file order: the type
llama.cpp chose and the sha256 of its bytes). `build_variant(name)` rebuilds
the file from the registry model: tensors llama.cpp kept are copied, the
others dequantized by the oracle (ggml's `to_float`, bitwise) and quantized
by strata-ref's reference quantizers (ggml's `quantize_row_*_ref`, which
`llama_model_quantize` reaches without an importance matrix), and every
tensor's sha256 must equal the manifest's, so the rebuilt file holds exactly
llama.cpp's weights. Files are cached in the user cache (`variants/`).

The 256-value types that llama.cpp only makes with an importance matrix
(IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ1_S, IQ1_M) have no variant here; the
tiny random models of `typed_model` cover them.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data" / "variants"

#: llama.cpp file types by name (include/llama.h, LLAMA_FTYPE_*)
FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
          "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ3_S": 26,
          "IQ4_XS": 30, "BF16": 32, "TQ1_0": 36, "TQ2_0": 37, "MXFP4_MOE": 38, "NVFP4": 39,
          "Q1_0": 40, "Q2_0": 41}

#: variant name -> (registry model, llama.cpp file type[, tensor type overrides:
#: name regex -> type, llama.cpp's `tt_overrides`, for the types no file type
#: selects: MXFP4, NVFP4, Q1_0, Q2_0])
_BLOCKS = r"blk\..*\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight"
VARIANTS = {
    "smollm2-q4_0": ("SmolLM2-135M-Instruct", "Q4_0"),
    "smollm2-q5_1": ("SmolLM2-135M-Instruct", "Q5_1"),
    # the Q2_K file type gives ffn_down Q3_K (and the 576-wide rows Q4_0):
    # Q2_K itself by an override of ffn_down
    "smollm2-q2_k": ("SmolLM2-135M-Instruct", "Q2_K", {r"blk\..*\.ffn_down\.weight": "Q2_K"}),
    "smollm2-q3_k_m": ("SmolLM2-135M-Instruct", "Q3_K_M"),
    "smollm2-q5_k_m": ("SmolLM2-135M-Instruct", "Q5_K_M"),
    "smollm2-iq4_nl": ("SmolLM2-135M-Instruct", "IQ4_NL"),
    "smollm2-iq4_xs": ("SmolLM2-135M-Instruct", "IQ4_XS"),
    "smollm2-iq3_s": ("SmolLM2-135M-Instruct", "IQ3_S"),
    "smollm2-tq1_0": ("SmolLM2-135M-Instruct", "TQ1_0"),
    "smollm2-tq2_0": ("SmolLM2-135M-Instruct", "TQ2_0"),
    "smollm2-mxfp4": ("SmolLM2-135M-Instruct", "Q8_0", {_BLOCKS: "MXFP4"}),
    "smollm2-nvfp4": ("SmolLM2-135M-Instruct", "Q8_0", {_BLOCKS: "NVFP4"}),
    # Q1_0's 128-value blocks fit only ffn_down's 1536-wide rows, and
    # llama.cpp has no fallback type for it
    "smollm2-q1_0": ("SmolLM2-135M-Instruct", "Q8_0", {r"blk\..*\.ffn_down\.weight": "Q1_0"}),
    "smollm2-q2_0": ("SmolLM2-135M-Instruct", "Q8_0", {_BLOCKS: "Q2_0"}),
    "smollm2-f16": ("SmolLM2-135M-Instruct", "F16"),
    "smollm2-bf16": ("SmolLM2-135M-Instruct", "BF16"),
    "smollm2-f32": ("SmolLM2-135M-Instruct", "F32"),
}


class VariantMismatch(AssertionError):
    """A rebuilt tensor's bytes differ from llama.cpp's."""


def manifest(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def _cache(name: str) -> Path:
    from strata_ref.models import cache_dir
    d = cache_dir() / "variants"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{name}.gguf"


def _rebuild_tensor(t, new_type):
    """The bytes of source tensor t in type new_type, as llama_model_quantize
    makes them: the same bytes when the type is kept, else ggml's to_float
    (the oracle's dequant_f32) then the reference quantizer."""
    from strata_ref import GGMLType, quantize
    from strata_ref.dequant import dequant_f32
    new = GGMLType[new_type]
    if new == t.type:
        return np.asarray(t.data, np.uint8)
    if t.type == GGMLType.F32:
        x = np.asarray(t.data).view(np.float32).reshape(t.rows, t.cols)
    else:
        x = dequant_f32(t.type, t.data, t.rows, t.cols)
    if new == GGMLType.F32:
        return np.ascontiguousarray(x, np.float32).view(np.uint8).reshape(-1)
    if new == GGMLType.IQ4_NL:
        # llama_model_quantize reaches `quantize_iq4_nl` through
        # ggml_quantize_chunk (15 more trial scales than the _ref entry point)
        from strata_ref.formats.iquants_quant import quantize_iq4_nl_chunk
        return np.asarray(quantize_iq4_nl_chunk(x.reshape(-1, 32)), np.uint8).reshape(-1)
    return np.asarray(quantize(x, new), np.uint8).reshape(-1)


def build_variant(name: str, rebuild: bool = False) -> Path:
    """Path of variant `name`, rebuilt (and cached) when missing. Raises
    VariantMismatch naming the first tensor whose bytes differ from
    llama.cpp's, KeyError for an unknown variant."""
    from strata_ref import GGMLType, gguf
    from strata_ref.gguf import GGUFValueType as V, write_gguf
    from strata_ref.models import resolve
    man = manifest(name)
    out = _cache(name)
    stamp = out.with_suffix(".sha256")
    if out.is_file() and not rebuild and stamp.is_file() and stamp.read_text().strip() == man["sha256"]:
        return out
    src = gguf.read(resolve(man["model"]))
    md = {}
    for k, v in src.metadata.items():
        if k.startswith("general.alignment"):
            continue
        vt = src.metadata_types[k]
        if k in src.array_types:
            val = v.tolist() if isinstance(v, np.ndarray) else v
            md[k] = (vt, val, src.array_types[k])
        else:
            md[k] = (vt, v)
    md["general.architecture"] = src.metadata["general.architecture"]   # gguf-py takes it plain
    md["general.file_type"] = (V.UINT32, FTYPES[man["ftype"]])
    tensors = []
    for tname, ttype, h in man["tensors"]:
        t = src.tensor(tname)
        data = _rebuild_tensor(t, ttype)
        if hashlib.sha256(data.tobytes()).hexdigest() != h:
            raise VariantMismatch(f"{name}: tensor {tname} ({t.type.name} -> {ttype}) differs from "
                                  f"llama.cpp's quantizer")
        tensors.append((tname, GGMLType[ttype], t.shape, data))
    tmp = out.with_suffix(f".{os.getpid()}.part")   # one per process: pytest-xdist workers
    write_gguf(tmp, md, tensors, alignment=src.alignment if src.alignment != 32 else None)
    tmp.replace(out)
    stamp.write_text(man["sha256"] + "\n")
    return out
