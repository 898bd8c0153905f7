"""Compare `QMatrix.matmul` with ggml's own `ggml_mul_mat` live, on shapes
and inputs of your choice, for one CPU profile (the peer build of that
profile, tools/peer_build.py, through tools/ggml_mm.py's ctypes graph).

    python tools/ggml_mm_check.py --profile P [--types IQ2_XXS,...]
        [--rows 67] [--cols 4096] [--ns 1,2,7,8,9,17] [--seeds 3] [--threads 2]

Per type and seed: random valid blocks (`routes.mmvq_inputs.sane_blocks`)
and activations whose 256-value blocks have magnitudes spread over six
decades (so the per-block scales and the float order of the reduction
matter); prints the count of outputs whose bits differ for each n, and
exits 1 if any do. Nothing is stored: tests/data/<P>/ggml_mm.npz is the
stored reference (tools/ggml_mm.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

DEFAULT_TYPES = "IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S,IQ1_S,IQ1_M,IQ4_XS"


def activations(rng, n: int, cols: int) -> np.ndarray:
    """float32 (n, cols): normals, each 256-value block scaled by 10^u,
    u uniform in [-3, 3]."""
    x = rng.standard_normal((n, cols // 256, 256))
    x *= 10.0 ** rng.uniform(-3, 3, (n, cols // 256, 1))
    return x.reshape(n, cols).astype(np.float32)


def main(argv=None) -> int:
    from peer_env import ensure_profile, profile
    ensure_profile(__file__)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--types", default=DEFAULT_TYPES)
    ap.add_argument("--rows", type=int, default=67)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--ns", default="1,2,7,8,9,17")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    from ggml_mm import _libs, ggml_mul_mat
    from strata_ref.cpu.matmul import QMatrix
    from strata_ref.routes.mmvq_inputs import sane_blocks
    from strata_ref.types import GGMLType, block_format
    base, cpu = _libs()
    ns = [int(v) for v in a.ns.split(",")]
    bad_total = 0
    for t in a.types.split(","):
        tt = GGMLType[t]
        nblk = a.rows * a.cols // block_format(tt).block_values
        for seed in range(a.seeds):
            rng = np.random.default_rng([seed, int(tt)])
            w = sane_blocks(tt, nblk, rng).reshape(-1)
            qm = QMatrix(tt, w, a.rows, a.cols, t, profile())
            qm.repackable = False              # a plain ggml graph keeps the plain layout
            line = []
            for n in ns:
                x = activations(rng, n, a.cols)
                want = ggml_mul_mat(base, cpu, int(tt), w, a.rows, a.cols, x, a.threads)
                got = qm.matmul(x)
                bad = int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))
                bad_total += bad
                line.append(f"n={n}: {bad}")
            print(f"{profile()} {t} seed {seed}: " + ", ".join(line), flush=True)
    print("all bitwise" if bad_total == 0 else f"{bad_total} outputs differ")
    return 1 if bad_total else 0


if __name__ == "__main__":
    raise SystemExit(main())
