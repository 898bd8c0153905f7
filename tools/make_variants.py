"""Requantized variants of the registry models, made by llama.cpp's own
quantizer (`llama_model_quantize` of llama-cpp-python 0.3.36), and the
manifests that let the tests rebuild them without llama.cpp.

    python tools/make_variants.py [--only NAME,...] [--keep DIR]

Each variant in `tests/model_variants.py` (VARIANTS) names a registry model
and a llama.cpp file type; llama.cpp requantizes the model (no importance
matrix) and picks each tensor's type itself, falling back to other types
where a row length does not fit the block (576-, 640- and 896-wide rows
push the 256-value types to 32-value ones). The manifest written to
tests/data/variants/<name>.json records, per tensor, the type llama.cpp
chose and the sha256 of its bytes, and the sha256 of the file.
`tests/model_variants.py` rebuilds the file from the registry model with
strata-ref's dequantizers and reference quantizers and checks every tensor
against the manifest: equal bytes mean the rebuilt file computes what
llama.cpp's file computes. Quantization is profile-independent (ggml-base is
built without the CPU flags), so any installed peer build makes it; the
per-profile logits are then made by `tools/llama_ref.py --profile P variant
NAME`.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))


def quantize_with_llama(src: Path, dst: Path, ftype: int, overrides: dict | None = None) -> None:
    """llama_model_quantize(src -> dst, ftype), requantizing quantized
    tensors, 2 threads; `overrides`: tensor-name regex -> ggml type name
    (llama.cpp's `tt_overrides`, as `llama-quantize --tensor-type`)."""
    import llama_cpp
    from strata_ref import GGMLType
    p = llama_cpp.llama_model_quantize_default_params()
    p.nthread = 2
    p.ftype = ftype
    p.allow_requantize = True
    if overrides:
        arr = (llama_cpp.llama_model_tensor_override * (len(overrides) + 1))()
        for i, (pat, t) in enumerate(overrides.items()):
            arr[i].pattern = pat.encode()
            arr[i].type = int(GGMLType[t])
        arr[len(overrides)].pattern = None
        p.tt_overrides = ctypes.cast(arr, type(p.tt_overrides))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc}) for ftype {ftype}")


def manifest_of(path: Path) -> dict:
    """{"sha256": file, "tensors": [[name, type name, sha256 of bytes], ...]} in file order."""
    from strata_ref import gguf
    f = gguf.read(path)
    h = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return {"sha256": h, "tensors": [[t.name, t.type.name, hashlib.sha256(bytes(t.data)).hexdigest()]
                                     for t in f.tensors]}


def main(argv=None) -> int:
    from peer_env import ensure_profile
    ensure_profile(__file__)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="the peer build whose quantizer to use (any: it is the same)")
    ap.add_argument("--only", help="comma-separated variant names")
    ap.add_argument("--keep", help="also keep llama.cpp's files in this folder")
    a = ap.parse_args(argv)
    from model_variants import VARIANTS, FTYPES, build_variant
    from strata_ref.models import resolve
    out_dir = REPO / "tests" / "data" / "variants"
    out_dir.mkdir(parents=True, exist_ok=True)
    names = a.only.split(",") if a.only else list(VARIANTS)
    for name in names:
        model, ftype, overrides = (VARIANTS[name] + ({},))[:3]
        with tempfile.TemporaryDirectory() as d:
            dst = Path(a.keep or d) / f"{name}.gguf"
            quantize_with_llama(resolve(model), dst, FTYPES[ftype], overrides)
            man = manifest_of(dst)
        man.update(model=model, ftype=ftype, overrides=overrides,
                   command="python tools/make_variants.py " + " ".join(sys.argv[1:]))
        (out_dir / f"{name}.json").write_text(json.dumps(man, indent=1) + "\n")
        types = {}
        for _, t, _ in man["tensors"]:
            types[t] = types.get(t, 0) + 1
        print(f"{name}: {ftype} -> " + ", ".join(f"{t} x{n}" for t, n in sorted(types.items())))
        # the rebuild must give llama.cpp's bytes for every tensor
        path = build_variant(name)
        print(f"  rebuilt by strata-ref: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
