"""ggml's own CPU mat-mul (`ggml_mul_mat` through a ggml graph, ctypes on the
peer's libggml-base / libggml-cpu) for every weight type, stored per CPU
profile as test vectors for tests/test_cpu_types.py.

    python tools/ggml_mm.py --profile P [--types Q4_0,IQ2_XXS,...] [--out FILE]
    python tools/ggml_mm.py --prebuilt VARIANT [--types ...] [--out FILE]

For each weight type: random valid blocks (`routes.mmvq_inputs.sane_blocks`,
seeded) for a ROWS x COLS matrix, float32 activations for each n in NS
(seeded normals), and y = ggml_mul_mat(W, x) computed by the peer built for
profile P (tools/peer_build.py) with 2 threads, as llama.cpp runs it. A graph
built this way uses the plain CPU buffer: the vec_dot (n = 1), llamafile
(n >= 2) and tiled (n >= 8) paths, not the CPU_REPACK layouts (those are
covered by whole-model reference data). The file (default
tests/data/P/ggml_mm.npz) holds for each type `<T>_w` (the raw blocks) and
`<T>_y<n>` (float32 (n, ROWS)), and `x<n>` (float32 (n, COLS)), with the
command, the build's system info and the profile. Types ggml-cpu cannot
multiply are listed in `skipped`.

With `--prebuilt VARIANT` the product comes from node-llama-cpp 3.21.1's
shipped llama.cpp v0.4.0 instead: its libggml-base.so and
libggml-cpu-VARIANT.so (fetched by `python tools/prebuilt_ref.py fetch`),
stored as tests/data/v0.4.0-VARIANT/ggml_mm.npz for the profile
`v0.4.0-VARIANT`. On the AVX2 variants this reaches v0.4.0's IQ panel gemm
(iqp.cpp: I-quants from 8 activation rows, weight rows % 8 == 0).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

ROWS, COLS = 40, 512
NS = (1, 2, 3, 4, 8, 13)
TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q1_0", "Q2_0", "MXFP4",
         "NVFP4", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S",
         "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS", "TQ1_0", "TQ2_0")


class _Params(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def _lib_paths(prebuilt: str | None) -> tuple:
    """(libggml-base, libggml-cpu) of the peer llama-cpp-python, or of the
    prebuilt v0.4.0 variant."""
    if prebuilt is None:
        import llama_cpp
        libdir = Path(llama_cpp.__file__).parent / "lib"
        return libdir / "libggml-base.so", libdir / "libggml-cpu.so"
    import prebuilt_ref
    root = prebuilt_ref.root()
    cpu = root / "cpu" / prebuilt / f"libggml-cpu-{prebuilt}.so"
    if not cpu.is_file():
        cpu = root / "npm" / prebuilt_ref.VERSIONS[prebuilt_ref.VERSION]["bins"] / cpu.name
    base = root / "npm" / prebuilt_ref.VERSIONS[prebuilt_ref.VERSION]["bins"] / "libggml-base.so"
    for f in (base, cpu):
        if not f.is_file():
            raise SystemExit(f"{f} is missing: run `python tools/prebuilt_ref.py fetch` first")
    return base, cpu


def _libs(prebuilt: str | None = None):
    base_path, cpu_path = _lib_paths(prebuilt)
    base = ctypes.CDLL(str(base_path), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(cpu_path), mode=ctypes.RTLD_GLOBAL)
    vp = ctypes.c_void_p
    base.ggml_init.restype = vp
    base.ggml_init.argtypes = [_Params]
    base.ggml_new_tensor_2d.restype = vp
    base.ggml_new_tensor_2d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_mul_mat.restype = vp
    base.ggml_mul_mat.argtypes = [vp, vp, vp]
    base.ggml_new_graph.restype = vp
    base.ggml_new_graph.argtypes = [vp]
    base.ggml_build_forward_expand.restype = None
    base.ggml_build_forward_expand.argtypes = [vp, vp]
    base.ggml_get_data.restype = vp
    base.ggml_get_data.argtypes = [vp]
    base.ggml_free.restype = None
    base.ggml_free.argtypes = [vp]
    base.ggml_nbytes.restype = ctypes.c_size_t
    base.ggml_nbytes.argtypes = [vp]
    cpu.ggml_cpu_init.restype = None
    cpu.ggml_cpu_init()
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
    return base, cpu


def ggml_mul_mat(base, cpu, type_id: int, w_raw: np.ndarray, rows: int, cols: int,
                 x: np.ndarray, threads: int = 2) -> np.ndarray:
    """y = ggml_mul_mat(W, x): W (rows, cols) of ggml type `type_id` as raw
    blocks, x float32 (n, cols); returns float32 (n, rows)."""
    n = x.shape[0]
    need = w_raw.nbytes + x.nbytes + 4 * n * rows + (64 << 20)
    ctx = base.ggml_init(_Params(need, None, False))
    try:
        a = base.ggml_new_tensor_2d(ctx, type_id, cols, rows)
        b = base.ggml_new_tensor_2d(ctx, 0, cols, n)
        if base.ggml_nbytes(a) != w_raw.nbytes:
            raise ValueError(f"type {type_id}: {w_raw.nbytes} bytes for a tensor of {base.ggml_nbytes(a)}")
        ctypes.memmove(base.ggml_get_data(a), w_raw.ctypes.data, w_raw.nbytes)
        xc = np.ascontiguousarray(x, np.float32)
        ctypes.memmove(base.ggml_get_data(b), xc.ctypes.data, xc.nbytes)
        y = base.ggml_mul_mat(ctx, a, b)
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, y)
        if cpu.ggml_graph_compute_with_ctx(ctx, gf, threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        out = np.empty((n, rows), np.float32)
        ctypes.memmove(out.ctypes.data, base.ggml_get_data(y), out.nbytes)
        return out
    finally:
        base.ggml_free(ctx)


def weights(t: str, seed: int, cols: int = COLS) -> np.ndarray:
    """The raw test matrix of type t: uint8 (ROWS * cols / block values *
    block bytes,), seeded; float types as normals * 0.05."""
    from strata_ref.routes.mmvq_inputs import sane_blocks
    from strata_ref.types import GGMLType, block_format
    rng = np.random.default_rng(seed)
    if t == "F32":
        return (rng.standard_normal((ROWS, cols)) * 0.05).astype(np.float32).view(np.uint8).reshape(-1)
    if t in ("F16", "BF16"):
        from strata_ref.quantize import quantize
        w = (rng.standard_normal((ROWS, cols)) * 0.05).astype(np.float32)
        return quantize(w, GGMLType[t]).reshape(-1)
    fmt = block_format(GGMLType[t])
    b = sane_blocks(GGMLType[t], ROWS * cols // fmt.block_values, rng)
    if t == "NVFP4":
        # UE4M3 scales well inside the finite range (0x7F is NaN)
        for f in fmt.fields:
            if f.name.startswith("d"):
                b[:, f.offset:f.offset + f.nbytes] = rng.integers(0x20, 0x40, (b.shape[0], f.nbytes))
    return b.reshape(-1)


def _prebuilt_provenance(variant: str) -> dict:
    import shlex
    import prebuilt_ref
    return dict(llama_cpp_version=np.array(prebuilt_ref.VERSION),
                system_info=np.array(f"node-llama-cpp 3.21.1 libggml-cpu-{variant}.so"),
                profile=np.array(f"{prebuilt_ref.VERSION}-{variant}"),
                command=np.array("python tools/ggml_mm.py " + " ".join(map(shlex.quote, sys.argv[1:]))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="run against the peer built for this CPU profile")
    ap.add_argument("--prebuilt", metavar="VARIANT",
                    help="run against node-llama-cpp's prebuilt v0.4.0 library of this x86 variant")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.prebuilt is None:
        from peer_env import data_dir, ensure_profile, provenance
        ensure_profile(__file__)
        prov, default_out = provenance("tools/ggml_mm.py"), data_dir() / "ggml_mm.npz"
    else:
        import prebuilt_ref
        prov = _prebuilt_provenance(a.prebuilt)
        default_out = prebuilt_ref.data_dir(a.prebuilt) / "ggml_mm.npz"
    from strata_ref.types import GGMLType
    base, cpu = _libs(a.prebuilt)
    rng = np.random.default_rng(20261201)
    res = {}
    xs = {n: rng.standard_normal((n, COLS)).astype(np.float32) for n in NS}
    for n, x in xs.items():
        res[f"x{n}"] = x
    skipped = []
    for i, t in enumerate(a.types.split(",")):
        w = weights(t, 1000 + i)
        try:
            for n, x in xs.items():
                res[f"{t}_y{n}"] = ggml_mul_mat(base, cpu, int(GGMLType[t]), w, ROWS, COLS, x)
        except (ValueError, RuntimeError) as e:
            skipped.append(t)
            print(f"{t}: skipped ({e})")
            continue
        res[f"{t}_w"] = w
        print(f"{t}: {w.nbytes} bytes, n in {NS}")
    out = Path(a.out or default_out)
    np.savez_compressed(out, rows=np.int64(ROWS), cols=np.int64(COLS), ns=np.array(NS),
                        skipped=np.array(skipped), **res, **prov)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
