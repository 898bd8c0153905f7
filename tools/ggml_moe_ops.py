"""ggml's own MoE operations (`ggml_argsort`, `ggml_mul_mat_id`) through a
ggml graph (ctypes on the peer's libggml-base / libggml-cpu), stored per CPU
profile as test vectors for tests/test_cpu_moe.py.

    python tools/ggml_moe_ops.py --profile P [--types Q4_K,IQ4_NL,...] [--out FILE]

* argsort: rows of n in N_SORT values with many ties (small integers, equal
  halves, signed zeros, infinities), `ggml_argsort(x, GGML_SORT_ORDER_DESC)`:
  the indices as ggml-cpu's `std::sort` leaves them (the top-k of
  `build_moe_ffn` is its first k columns).
* mul_mat_id: for each weight type, N_EXPERT random experts of ROWS x COLS
  (valid blocks, seeded), T_TOK tokens of float32 activations and expert ids
  chosen so that the experts get 0, 1, 3, 7, 8 and 13 routed rows (ggml
  takes vec_dot below 8 and the tiled kernel from 8 for the types that
  have it, never tinyBLAS); y = ggml_mul_mat_id(W, x, ids) with 2 threads,
  in a plain CPU buffer (the repacked layouts are checked on whole models,
  tests/test_infer_moe.py).

The file (default tests/data/P/ggml_moe_ops.npz) holds `sort_<n>_x` /
`sort_<n>_idx`, and per type `<T>_w` (raw blocks, experts in order),
`<T>_y` (float32 (T_TOK, K, ROWS)); `mmid_x16` (the activations, fp16
values, float16 (T_TOK, COLS): use them as float32) and `mmid_ids` (int32
(T_TOK, K)); with the command, the build's system info
and the profile. Types ggml-cpu cannot multiply are listed in `skipped`.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

N_SORT = (8, 16, 17, 20, 32, 64, 128)
N_EXPERT, ROWS, COLS, K = 6, 8, 256, 2
#: routed rows per expert (sum = T_TOK * K)
ROUTED = (0, 1, 3, 7, 8, 13)
T_TOK = sum(ROUTED) // K
#: the types whose MUL_MAT_ID path can differ from a mul_mat of as many rows
#: (IQ4_NL: tinyBLAS for a mul_mat, vec_dot here; the tiled K- and I-quants
#: from 8 routed rows) and MXFP4, gpt-oss's expert type
TYPES = ("IQ4_NL", "MXFP4", "Q4_K", "Q6_K", "IQ3_S")


def _libs():
    from ggml_mm import _libs as mm_libs
    base, cpu = mm_libs()
    vp = ctypes.c_void_p
    base.ggml_new_tensor_3d.restype = vp
    base.ggml_new_tensor_3d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    base.ggml_argsort.restype = vp
    base.ggml_argsort.argtypes = [vp, vp, ctypes.c_int]
    base.ggml_mul_mat_id.restype = vp
    base.ggml_mul_mat_id.argtypes = [vp, vp, vp, vp]
    return base, cpu


def _run(base, cpu, build, need, threads=2):
    from ggml_mm import _Params
    ctx = base.ggml_init(_Params(need + (64 << 20), None, False))
    try:
        y, out = build(ctx)
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, y)
        if cpu.ggml_graph_compute_with_ctx(ctx, gf, threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        ctypes.memmove(out.ctypes.data, base.ggml_get_data(y), out.nbytes)
        return out
    finally:
        base.ggml_free(ctx)


def _set(base, t, a):
    a = np.ascontiguousarray(a)
    if base.ggml_nbytes(t) != a.nbytes:
        raise ValueError(f"{a.nbytes} bytes for a tensor of {base.ggml_nbytes(t)}")
    ctypes.memmove(base.ggml_get_data(t), a.ctypes.data, a.nbytes)


def ggml_argsort_desc(base, cpu, x: np.ndarray) -> np.ndarray:
    rows, n = x.shape

    def build(ctx):
        a = base.ggml_new_tensor_2d(ctx, 0, n, rows)
        _set(base, a, x.astype(np.float32))
        return base.ggml_argsort(ctx, a, 1), np.empty((rows, n), np.int32)
    return _run(base, cpu, build, x.nbytes * 4)


def ggml_mul_mat_id(base, cpu, type_id: int, w: np.ndarray, x: np.ndarray, ids: np.ndarray):
    T, k = ids.shape

    def build(ctx):
        a = base.ggml_new_tensor_3d(ctx, type_id, COLS, ROWS, N_EXPERT)
        _set(base, a, w)
        b = base.ggml_new_tensor_3d(ctx, 0, COLS, 1, T)
        _set(base, b, x.astype(np.float32))
        i = base.ggml_new_tensor_2d(ctx, 26, k, T)            # GGML_TYPE_I32
        _set(base, i, ids.astype(np.int32))
        return base.ggml_mul_mat_id(ctx, a, b, i), np.empty((T, k, ROWS), np.float32)
    return _run(base, cpu, build, w.nbytes + x.nbytes * 4)


def sort_rows(n: int, rng) -> np.ndarray:
    """Rows with ties for argsort: small integers, two equal halves, equal
    runs with signed zeros and infinities, and plain normals."""
    rows = [rng.integers(0, 4, n), rng.integers(-2, 3, n) * 0.25,
            np.repeat(rng.standard_normal((n + 1) // 2), 2)[:n], rng.standard_normal(n)]
    special = np.zeros(n)
    special[::3] = -0.0
    special[1::5] = np.inf
    special[2::7] = -np.inf
    special[3::4] = 1.5
    rows.append(special)
    rows.append(np.full(n, 0.5))
    return np.array(rows, np.float32)


def routing(rng) -> np.ndarray:
    """ids (T_TOK, K): expert e appears ROUTED[e] times, never twice for one
    token."""
    while True:
        slots = rng.permutation(np.repeat(np.arange(N_EXPERT), ROUTED)).reshape(T_TOK, K)
        if all(len(set(r)) == K for r in slots.tolist()):
            return slots.astype(np.int32)


def main(argv=None) -> int:
    from peer_env import data_dir, ensure_profile, provenance
    ensure_profile(__file__)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="run against the peer built for this CPU profile")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    from strata_ref.types import GGMLType, block_format
    base, cpu = _libs()
    rng = np.random.default_rng(20261202)
    res = {}
    for n in N_SORT:
        x = sort_rows(n, rng)
        res[f"sort_{n}_x"] = x
        res[f"sort_{n}_idx"] = ggml_argsort_desc(base, cpu, x)
    # activations of fp16 values (stored as such: half the bytes), in float32
    x16 = rng.standard_normal((T_TOK, COLS)).astype(np.float16)
    x = x16.astype(np.float32)
    ids = routing(rng)
    res["mmid_x16"], res["mmid_ids"] = x16, ids
    skipped = []
    from strata_ref.routes.mmvq_inputs import sane_blocks
    for j, t in enumerate(a.types.split(",")):
        fmt = block_format(GGMLType[t])
        w = sane_blocks(GGMLType[t], N_EXPERT * ROWS * COLS // fmt.block_values,
                        np.random.default_rng(3000 + j)).reshape(-1)
        try:
            res[f"{t}_y"] = ggml_mul_mat_id(base, cpu, int(GGMLType[t]), w, x[:, None, :], ids)
        except (ValueError, RuntimeError) as e:
            skipped.append(t)
            print(f"{t}: skipped ({e})")
            continue
        res[f"{t}_w"] = w
        print(f"{t}: {w.nbytes} bytes")
    out = Path(a.out or data_dir() / "ggml_moe_ops.npz")
    np.savez_compressed(out, n_expert=np.int64(N_EXPERT), rows=np.int64(ROWS), cols=np.int64(COLS),
                        routed=np.array(ROUTED), skipped=np.array(skipped), **res,
                        **provenance("tools/ggml_moe_ops.py"))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
