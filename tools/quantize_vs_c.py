"""Live check: strata_ref's reference quantizers against ggml's C library.

Usage:
    python tools/quantize_vs_c.py [--lib PATH] [--blocks N] [--types Q4_0,Q4_K,...]

Loads ggml's portable C library (libggml-base.so built without -march and with
-ffp-contract=off; default path ~/.cache/strata-ref/ggml/build/src/libggml-base.so,
or $STRATA_GGML_LIB) and calls `quantize_row_<type>_ref` (F16:
`ggml_fp32_to_fp16_row`, BF16: `ggml_fp32_to_bf16_row_ref`) on the same
inputs as `strata_ref.formats.get_quantizer(t)`. Inputs per type: N blocks of
N(0,1), N blocks of Student t2 (heavy tails), and a set of special blocks
(zeros, -0.0 first, tiny and huge magnitudes, fp16-subnormal scales, spikes,
constant blocks, halves and other rounding ties). Prints, per type and set,
the number of blocks whose bytes differ. Exit status 1 if any finite block
differs. A last set "nonfinite" (NaN/±Inf inside blocks) is informational
only: `strata_ref.quantize` rejects such input, C's result there is undefined
behaviour, and the block functions' fast scans do not try to reproduce it.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

import numpy as np

import strata_ref.quantize as _q  # registers the quantizers
from strata_ref.formats import get_quantizer
from strata_ref.types import GGMLType, block_format

DEFAULT_LIB = "~/.cache/strata-ref/ggml/build/src/libggml-base.so"

TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
         "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "TQ1_0", "TQ2_0", "MXFP4",
         "NVFP4", "Q1_0", "Q2_0"]


def load_c(path: str):
    lib = ctypes.CDLL(os.path.expanduser(path))
    fns = {}
    for name in TYPES:
        sym = {"F16": "ggml_fp32_to_fp16_row",
               "BF16": "ggml_fp32_to_bf16_row_ref"}.get(
            name, "quantize_row_" + name.lower().replace("_k", "_K") + "_ref")
        try:
            f = getattr(lib, sym)
        except AttributeError:
            continue
        f.restype = None
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        fns[name] = f
    return fns


def c_quantize(fn, x: np.ndarray, fmt) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    nb = x.size // fmt.block_values
    out = np.zeros((nb, fmt.block_bytes), np.uint8)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


def special_blocks(qk: int, rng) -> np.ndarray:
    """Hand-picked hard cases, each a whole number of QK-blocks."""
    rows = []
    def add(v):
        rows.append(np.asarray(v, np.float32).reshape(-1, qk))
    n = max(qk, 32)
    z = np.zeros(qk, np.float32)
    add(z)
    add(np.where(np.arange(qk) == 0, np.float32(-0.0), z))           # -0.0 first
    add(-z)                                                           # all -0.0
    base = rng.standard_normal((64, qk)).astype(np.float32)
    base /= np.abs(base).max(axis=1, keepdims=True)                   # |max| = 1
    for s in (1e-45, 1e-42, 1e-39, 1e-30, 6e-8, 1e-6, 3e-5, 1e-3,
              1e3, 6e4, 65504.0, 7e4, 1e10, 1e20, 3e38):
        add(base[:8] * np.float32(s))
    for c in (1.0, -1.0, 0.5, -3.0, 1e-7):                          # constant blocks
        add(np.full(qk, c, np.float32))
    sp = np.zeros((16, qk), np.float32)                               # one spike
    sp[np.arange(16), rng.integers(0, qk, 16)] = rng.choice([-1, 1], 16) * 10.0 ** rng.integers(-3, 4, 16)
    add(sp)
    add(sp + rng.standard_normal((16, qk)).astype(np.float32) * np.float32(1e-3))
    ints = rng.integers(-16, 17, (32, qk)).astype(np.float32)         # exact ties
    add(ints)
    add(ints / 2)
    add(ints / 4 + np.float32(0.125))
    add(rng.integers(-3, 4, (16, qk)).astype(np.float32))
    add(rng.choice(np.float32([-1, 0, 1]), (16, qk)))
    mx = (rng.integers(0, 16, (16, qk)) - 8).astype(np.float32)       # q4-like grid
    add(mx * np.float32(0.37))
    pw = np.exp2(rng.integers(-20, 20, (16, 1))).astype(np.float32)   # powers of two
    add(np.nextafter(pw, np.float32(0)) * rng.choice(np.float32([-1, 1]), (16, qk)))
    add(pw * rng.uniform(-1, 1, (16, qk)).astype(np.float32))
    del n
    return np.concatenate(rows)


def nonfinite_blocks(qk: int, rng) -> np.ndarray:
    """Blocks holding NaN or ±Inf (informational: strata_ref.quantize rejects
    them, the block functions are still compared)."""
    x = rng.standard_normal((12, qk)).astype(np.float32)
    x[0:3, 0] = np.inf
    x[3:6, 1] = -np.inf
    x[6:9, qk // 2] = np.nan
    x[9, :] = np.nan
    x[10, :] = np.inf
    x[11, ::2] = -np.inf
    return x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.environ.get("STRATA_GGML_LIB", DEFAULT_LIB))
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    _q._load_quantizers()
    fns = load_c(args.lib)
    bad = 0
    print(f"{'type':7} {'set':8} {'blocks':>8} {'mismatch':>8}")
    for name in args.types.split(","):
        t = GGMLType[name]
        fmt = block_format(t)
        qk = fmt.block_values
        rng = np.random.default_rng(args.seed)
        if name not in fns:
            print(f"{name:7} (no C symbol)")
            continue
        nvals = args.blocks * max(qk, 32)        # F16/BF16: same value count as Q8_0
        sets = {
            "normal": rng.standard_normal(nvals).astype(np.float32),
            "t2": rng.standard_t(2, nvals).astype(np.float32),
            "special": special_blocks(max(qk, 32), rng).reshape(-1),
            "nonfinite": nonfinite_blocks(max(qk, 32), rng).reshape(-1),
        }
        for sname, x in sets.items():
            x2 = x.reshape(-1, qk)
            with np.errstate(all="ignore"):
                ours = get_quantizer(t)(x2)
            ref = c_quantize(fns[name], x2, fmt)
            nbad = int((ours != ref).any(axis=1).sum())
            if sname != "nonfinite":
                bad += nbad
            print(f"{name:7} {sname:8} {len(x2):8d} {nbad:8d}", flush=True)
            if nbad:
                i = int(np.flatnonzero((ours != ref).any(axis=1))[0])
                print("   first:", i, x2[i][:8], "\n   ours:", ours[i][:24], "\n   C:   ", ref[i][:24])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
