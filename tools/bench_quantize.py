"""Quantize throughput: strata_ref.quantize vs gguf.quants.quantize, one run.

    python tools/bench_quantize.py [--mib 16] [--repeat 3] [--types Q4_0,...]

Input: float32 N(0,1), `--mib` MiB (rows of 4096 values), the same array for
both. Each side: best of `--repeat` calls, output allocation included, after
one warm-up call (numba compilation is excluded). Prints M values/s of each
and the ratio; gguf-py columns are empty for the types it cannot quantize
(../shared/spec/formats.md §10). The goal is a ratio >= 3 for every type
gguf-py quantizes. Timings on a shared machine are noisy (±40 %).
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

GGUF_Q = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4"]
OURS = GGUF_Q + ["Q8_1", "NVFP4", "Q1_0", "Q2_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=float, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--types", default=",".join(OURS))
    args = ap.parse_args(argv)

    import gguf
    from strata_ref.quantize import quantize

    n = int(args.mib * (1 << 20) / 4) // 4096 * 4096
    x = np.random.default_rng(0).standard_normal((n // 4096, 4096)).astype(np.float32)
    print(f"input: {n / 1e6:.1f} M float32 values (rows of 4096), best of {args.repeat}")
    print(f"{'type':7} {'ours Mv/s':>10} {'gguf Mv/s':>10} {'ratio':>7}")
    for name in args.types.split(","):
        quantize(x[:4], name)                    # compile
        quantize(x, name)                        # compile the parallel loop
        t_ours = best_of(lambda: quantize(x, name), args.repeat)
        line = f"{name:7} {n / t_ours / 1e6:10.0f}"
        if name in GGUF_Q:
            qt = gguf.GGMLQuantizationType[name]
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                t_ref = best_of(lambda: gguf.quants.quantize(x, qt), args.repeat)
            line += f" {n / t_ref / 1e6:10.0f} {t_ref / t_ours:7.1f}x"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
