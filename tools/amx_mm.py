"""ggml's own AMX mat-mul, stored as test vectors: `ggml_mul_mat` of a
weight tensor allocated in ggml-cpu's AMX buffer type, computed by the CPU
backend of node-llama-cpp 3.21.1's shipped `libggml-cpu-sapphirerapids.so`
(llama.cpp v0.4.0; ctypes, no build), for every weight type the AMX buffer
takes, at M = 1 (`tinygemm_kernel_vnni`), 2 and 33 (`tinygemm_kernel_amx`,
a partial second block of 32) activation rows.

    python tools/amx_mm.py [--out FILE]

Needs a CPU with AMX (and AVX512-VNNI) whose kernel grants AMX tile data
(`ggml_amx_init`), and the shipped libraries (`python tools/prebuilt_ref.py
fetch`). The weight is placed with `ggml_backend_alloc_ctx_tensors_from_buft`
in the buffer type `ggml_backend_amx_buffer_type()` returns (exported by the
library, C++ name), filled with `ggml_backend_tensor_set` (which repacks it,
`ggml_backend_amx_convert_weight`), and the graph computed by
`ggml_backend_graph_compute` on `ggml_backend_cpu_init()` with 2 threads,
as in llama.cpp: the CPU backend hands a MUL_MAT whose weight sits in the
AMX buffer to `ggml_backend_amx_mul_mat`.

Per type (ROWS x COLS): rows 0..47 random sane blocks (F16: normals * 0.05);
for Q4_K, Q5_K, Q6_K and IQ4_XS rows 48..95 are `tests/_amx.big_blocks`
(integer sums above 2^24 against positive activations). Activation row m
is `positive_rows` for even m, standard normals for odd m. The file
(default tests/data/v0.4.0-sapphirerapids/ggml_amx_mm.npz) holds `<T>_w`
(raw blocks), `<T>_y<n>` (float32 (n, ROWS)), `x<n>` (float32 (n, COLS)),
and the command, library and CPU flags.
"""
from __future__ import annotations

import argparse
import ctypes
import shlex
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))

ROWS, COLS = 96, 512
NS = (1, 2, 33)
TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16")
N_THREADS = 2
VARIANT = "sapphirerapids"


class _Params(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def _sig(lib, name, res, *args):
    f = getattr(lib, name)
    f.restype, f.argtypes = res, list(args)
    return f


def libs():
    """(base, cpu) ctypes libraries: the shipped libggml-base.so and
    libggml-cpu-sapphirerapids.so of v0.4.0, their signatures set."""
    from prebuilt_ref import VERSIONS, VERSION, root, variant_dir
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    base = ctypes.CDLL(str(root() / "npm" / VERSIONS[VERSION]["bins"] / "libggml-base.so"),
                       mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(variant_dir(VARIANT) / f"libggml-cpu-{VARIANT}.so"), mode=ctypes.RTLD_GLOBAL)
    _sig(base, "ggml_init", vp, _Params)
    _sig(base, "ggml_free", None, vp)
    _sig(base, "ggml_tensor_overhead", sz)
    _sig(base, "ggml_new_tensor_2d", vp, vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    _sig(base, "ggml_mul_mat", vp, vp, vp, vp)
    _sig(base, "ggml_new_graph", vp, vp)
    _sig(base, "ggml_build_forward_expand", None, vp, vp)
    _sig(base, "ggml_get_data", vp, vp)
    _sig(base, "ggml_nbytes", sz, vp)
    _sig(base, "ggml_backend_alloc_ctx_tensors_from_buft", vp, vp, vp)
    _sig(base, "ggml_backend_buffer_free", None, vp)
    _sig(base, "ggml_backend_buffer_name", ctypes.c_char_p, vp)
    _sig(base, "ggml_backend_tensor_set", None, vp, vp, sz, sz)
    _sig(base, "ggml_backend_graph_compute", ctypes.c_int, vp, vp)
    _sig(base, "ggml_backend_free", None, vp)
    _sig(cpu, "ggml_cpu_init", None)
    _sig(cpu, "ggml_backend_cpu_init", vp)
    _sig(cpu, "ggml_backend_cpu_set_n_threads", None, vp, ctypes.c_int)
    _sig(cpu, "_Z28ggml_backend_amx_buffer_typev", vp)     # ggml_backend_amx_buffer_type()
    cpu.ggml_cpu_init()
    return base, cpu


def amx_mul_mat(base, cpu, backend, type_id: int, w_raw: np.ndarray, rows: int, cols: int,
                x: np.ndarray) -> np.ndarray:
    """y = ggml_mul_mat(W, x) with W (rows, cols) of ggml type `type_id`
    (raw blocks) in the AMX buffer; x float32 (n, cols) -> float32 (n, rows).
    RuntimeError when there is no AMX buffer type or the graph fails."""
    buft = cpu._Z28ggml_backend_amx_buffer_typev()
    if not buft:
        raise RuntimeError("no AMX buffer type here (ggml_amx_init refused: no AMX tile permission)")
    wctx = base.ggml_init(_Params(4 * base.ggml_tensor_overhead(), None, True))
    n = x.shape[0]
    ctx = base.ggml_init(_Params(x.nbytes + 4 * n * rows + (16 << 20), None, False))
    buf = None
    try:
        w = base.ggml_new_tensor_2d(wctx, type_id, cols, rows)
        if base.ggml_nbytes(w) != w_raw.nbytes:
            raise ValueError(f"type {type_id}: {w_raw.nbytes} bytes for a tensor of {base.ggml_nbytes(w)}")
        buf = base.ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft)
        if not buf or base.ggml_backend_buffer_name(buf) != b"AMX":
            raise RuntimeError("the weight did not get an AMX buffer")
        raw = np.ascontiguousarray(w_raw)
        base.ggml_backend_tensor_set(w, raw.ctypes.data, 0, raw.nbytes)
        b = base.ggml_new_tensor_2d(ctx, 0, cols, n)
        xc = np.ascontiguousarray(x, np.float32)
        ctypes.memmove(base.ggml_get_data(b), xc.ctypes.data, xc.nbytes)
        y = base.ggml_mul_mat(ctx, w, b)
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, y)
        if base.ggml_backend_graph_compute(backend, gf) != 0:
            raise RuntimeError("ggml_backend_graph_compute failed")
        out = np.empty((n, rows), np.float32)
        ctypes.memmove(out.ctypes.data, base.ggml_get_data(y), out.nbytes)
        return out
    finally:
        if buf:
            base.ggml_backend_buffer_free(buf)
        base.ggml_free(ctx)
        base.ggml_free(wctx)


def weights(t: str, rng) -> np.ndarray:
    """The raw ROWS x COLS test matrix of type t (module docstring)."""
    from _amx import BIG_TYPES, big_blocks
    from strata_ref.routes.mmvq_inputs import sane_blocks
    from strata_ref.types import GGMLType, block_format
    tt = GGMLType[t]
    if tt == GGMLType.F16:
        from strata_ref.quantize import quantize
        return quantize((rng.standard_normal((ROWS, COLS)) * 0.05).astype(np.float32), tt).reshape(-1)
    per_row = COLS // block_format(tt).block_values
    half = ROWS // 2
    top = sane_blocks(tt, half * per_row, rng)
    low = big_blocks(tt, half * per_row, rng) if tt in BIG_TYPES else sane_blocks(tt, half * per_row, rng)
    return np.concatenate([top, low]).reshape(-1)


def activations(n: int, rng) -> np.ndarray:
    from _amx import positive_rows
    x = rng.standard_normal((n, COLS)).astype(np.float32)
    x[0::2] = positive_rows(len(range(0, n, 2)), COLS, rng)
    return x


def main(argv=None) -> int:
    from prebuilt_ref import data_dir, variant_dir
    from strata_ref.cpu import host_flags
    from strata_ref.types import GGMLType
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="default tests/data/v0.4.0-sapphirerapids/ggml_amx_mm.npz")
    a = ap.parse_args(argv)
    if not {"amx_int8", "amx_tile", "avx512_vnni"} <= host_flags():
        raise SystemExit("amx_mm: this CPU has no AMX-INT8 / AVX512-VNNI: ggml's AMX path cannot run here")
    base, cpu = libs()
    backend = cpu.ggml_backend_cpu_init()
    cpu.ggml_backend_cpu_set_n_threads(backend, N_THREADS)
    rng = np.random.default_rng(20261206)
    xs = {n: activations(n, rng) for n in NS}
    res = {f"x{n}": x for n, x in xs.items()}
    try:
        for t in TYPES:
            w = weights(t, rng)
            res[f"{t}_w"] = w
            for n, x in xs.items():
                res[f"{t}_y{n}"] = amx_mul_mat(base, cpu, backend, int(GGMLType[t]), w, ROWS, COLS, x)
            print(f"{t}: {w.nbytes} bytes, n in {NS}")
    finally:
        base.ggml_backend_free(backend)
    out = Path(a.out or data_dir(VARIANT) / "ggml_amx_mm.npz")
    lib = variant_dir(VARIANT) / f"libggml-cpu-{VARIANT}.so"
    np.savez_compressed(out, rows=np.int64(ROWS), cols=np.int64(COLS), ns=np.array(NS), types=np.array(TYPES),
                        cpu_library=np.array(lib.name), n_threads=np.int64(N_THREADS),
                        cpu_flags=np.array(" ".join(sorted(f for f in host_flags() if f.startswith(("avx512", "amx"))))),
                        command=np.array("python tools/amx_mm.py " + " ".join(map(shlex.quote, sys.argv[1:]))),
                        **res)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
