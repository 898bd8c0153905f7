#!/usr/bin/env python3
"""Dequant speed of the oracle against gguf-py, measured in one run.

For every type both implement: IN_MIB of random valid blocks in rows of 4096
values, best of REPS calls of `strata_ref.dequant_f32` and of
`gguf.quants.dequantize` (both including output allocation), M values/s and
the ratio. Also FNV-1a 64 throughput and one `strata-ref hash` timing
when --hash is given.

    python tools/bench_dequant.py [--mib 16] [--reps 3] [--types Q4_K,IQ2_XXS] [--hash]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import gguf
import numpy as np

import strata_ref as sr
from strata_ref.formats import dequant_types
from strata_ref.golden import sane_blocks
from strata_ref.hashing import fnv1a64


def best(fn, reps):
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--types", default=None)
    ap.add_argument("--hash", action="store_true", help="also time `strata-ref hash` (all three dtypes)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    types = [sr.parse_type(t) for t in a.types.split(",")] if a.types else \
        [sr.GGMLType.F16, sr.GGMLType.BF16] + dequant_types()
    print(f"# {os.cpu_count()} CPUs, numba threads {os.environ.get('NUMBA_NUM_THREADS', 'default')}, "
          f"{a.mib} MiB input per type, best of {a.reps}")
    print(f"{'type':<8} {'M values':>9} {'oracle Mv/s':>12} {'gguf-py Mv/s':>13} {'ratio':>6}")
    worst = None
    # Start numba's thread pool before the first row. The first calls of a
    # process can still be several times slower: each new output of tens of
    # MB is a fresh mmap whose page faults dominate until glibc's dynamic mmap
    # threshold rises (measured: Q4_0 150 -> 1100 M values/s after 3-5 calls),
    # which is why every row is a best of several interleaved repetitions.
    warm = sane_blocks(sr.GGMLType.Q8_0, 1 << 17, rng).reshape(-1)
    t_end = time.perf_counter() + 1.0
    while time.perf_counter() < t_end:
        sr.dequant_f32(sr.GGMLType.Q8_0, warm, 1 << 10, 4096)
    for t in types:
        fmt = sr.block_format(t)
        cols = 4096 if 4096 % fmt.block_values == 0 else fmt.block_values * 64
        row_bytes = cols // fmt.block_values * fmt.block_bytes
        rows = max(1, int(a.mib * 2 ** 20) // row_bytes)
        raw = sane_blocks(t, rows * cols // fmt.block_values, rng).reshape(-1)   # finite scales
        nval = rows * cols
        sr.dequant_f32(t, raw, rows, cols)                         # compile and warm up
        try:
            qt = gguf.GGMLQuantizationType(int(t))
            gguf.quants.dequantize(raw[:row_bytes], qt)
            peer = lambda: gguf.quants.dequantize(raw.reshape(rows, row_bytes), qt)  # noqa: E731
        except (ValueError, NotImplementedError):
            peer = None
        # Interleaved, best of REPS each: a shared VM drifts, and drift then
        # hits both sides alike.
        ours, theirs = [], []
        for _ in range(a.reps):
            ours.append(best(lambda: sr.dequant_f32(t, raw, rows, cols), 1))
            if peer is not None:
                theirs.append(best(peer, 1))
        ours, theirs = min(ours), (min(theirs) if theirs else None)
        r = f"{theirs / ours:6.1f}" if theirs else "     -"
        g = f"{nval / theirs / 1e6:13.0f}" if theirs else f"{'n/a':>13}"
        print(f"{t.name:<8} {nval / 1e6:9.1f} {nval / ours / 1e6:12.0f} {g} {r}", flush=True)
        if theirs:
            worst = min(worst or 1e9, theirs / ours)
    if worst is not None:
        print(f"# lowest ratio over gguf-py: {worst:.1f}x")
    data = rng.integers(0, 256, 256 << 20, dtype=np.uint8)
    fnv1a64(data[:16])
    s = best(lambda: fnv1a64(data), a.reps)
    print(f"FNV-1a 64: {data.size / s / 1e9:.2f} GB/s (one core)")
    if a.hash:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "strata_ref.cli", "hash", "--no-progress"],
                       check=True, stdout=subprocess.DEVNULL)
        print(f"strata-ref hash (SmolLM2, f32+f16+bf16, fresh process): {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
