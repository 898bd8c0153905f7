"""Decode-like speed of the CPU profile mat-muls of one weight type next to
the dense fallback they replaced.

    python tools/bench_cpu_types.py [--types F16,IQ4_NL,...] [--size 4096]
                                    [--rows 1] [--profile avx2] [--repeats 20]

For each type: a `size` x `size` matrix of random valid blocks (random code
bytes, moderate scales; float types: normals), `rows` activation rows, and
the wall time of `QMatrix.matmul` (ggml's order, the kernels of
strata_ref.cpu: dots_small and matmul) against the dense fallback that ran
before them: the oracle's dequantized float32 weights times the activation
(rounded to the weight's vec_dot type as before) through NumPy's BLAS.
Both are timed after a warm-up call (packing / dequantizing and numba
compiling are not counted), best and median of `repeats`. Also printed:
the bytes of weights each reads per call. Timings on a machine shared with
other work are noise: say so when reporting them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT = "F32,F16,BF16,Q1_0,Q2_0,MXFP4,NVFP4,IQ4_NL,TQ1_0,TQ2_0"


def random_matrix(t, rows: int, cols: int, rng) -> np.ndarray:
    """Raw bytes of a rows x cols matrix of type t: random code bytes with
    every scale field set to a moderate value (float types: normals)."""
    from strata_ref import GGMLType, block_format
    from strata_ref.quantize import quantize
    if t in ("F32", "F16", "BF16"):
        w = (0.05 * rng.standard_normal((rows, cols))).astype(np.float32)
        return w.view(np.uint8).reshape(-1) if t == "F32" else quantize(w, GGMLType[t]).reshape(-1)
    fmt = block_format(GGMLType[t])
    nb = rows * cols // fmt.block_values
    b = rng.integers(0, 256, (nb, fmt.block_bytes), dtype=np.uint8)
    for f in fmt.fields:
        if f.dtype == np.float16:
            b[:, f.offset:f.offset + 2] = np.full(nb, 1e-3, np.float16).view(np.uint8).reshape(nb, 2)
        elif f.name == "e":                      # MXFP4's E8M0 exponent
            b[:, f.offset] = 121
        elif f.name == "d":                      # NVFP4's UE4M3 scales
            b[:, f.offset:f.offset + f.nbytes] = 0x30
    return b.reshape(-1)


def _time(fn, repeats: int):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=DEFAULT)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--profile", default="avx2")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    from strata_ref import GGMLType
    from strata_ref.cpu.matmul import QMatrix
    from strata_ref.dequant import dequant_f32
    rng = np.random.default_rng(0)
    n, k = a.size, a.size
    x = rng.standard_normal((a.rows, k)).astype(np.float32)
    print(f"{n} x {k}, {a.rows} activation row(s), profile {a.profile}, "
          f"load average {os.getloadavg()[0]:.1f}, best / median of {a.repeats}")
    print(f"{'type':8} {'kernel ms':>16} {'dense ms':>16} {'speed-up':>9} {'kernel MB':>10} {'dense MB':>9}")
    for t in a.types.split(","):
        raw = random_matrix(t, n, k, rng)
        qm = QMatrix(GGMLType[t], raw, n, k, t, a.profile)
        qm.repackable = False
        qm.prepare()
        dense = dequant_f32(GGMLType[t], raw, n, k)
        kb, km = _time(lambda: qm.matmul(x), a.repeats)
        db, dm = _time(lambda: x @ dense.T, a.repeats)
        packed = qm.packed.data
        mb = sum(p.nbytes for p in packed if isinstance(p, np.ndarray) and p.size > 1) / 1e6
        print(f"{t:8} {kb * 1e3:7.2f} / {km * 1e3:6.2f} {db * 1e3:7.2f} / {dm * 1e3:6.2f} "
              f"{dm / km:8.2f}x {mb:10.1f} {dense.nbytes / 1e6:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
