#!/usr/bin/env python3
"""Live check of the I-quant quantizers against ggml's C library.

    python tools/quantize_iq_vs_c.py [--blocks N] [--types IQ4_NL,IQ3_S,...] [--lib PATH]

Loads ggml-base through tools/ggml_c.py (the portable build of
`tools/ggml_vectors.py --build`, or STRATA_REF_GGML_LIB / --lib) and
compares, per type and input set, strata-ref's quantizer with ggml's
`from_float_ref` (`quantize_row_*_ref`, one block per call) bit for bit;
for IQ4_NL also `quantize_iq4_nl_chunk` with `ggml_quantize_chunk`, and
for IQ1_M (no `from_float_ref`) `quantize_iq1_m_chunk` with it.

Input sets, N blocks each (seeded): normal N(0,1); t2 (Student t, 2
degrees); special (tiny, near fp16 overflow, isolated spikes, zero and -0
blocks, values near GROUP_MAX_EPS, quarter-step ties, half-zero blocks, all
positive, x1e15 magnitudes, small integers); subscale (sub-blocks of 8 or
16 values scaled by 10^U(-4,4), 15 % of them zero); fp16sub (blocks scaled
into fp16-subnormal d).

Where strata-ref raises ValueError because ggml would abort (GGML_ASSERT in
the grid searches, e.g. the x1e15 blocks), the tool checks, in a forked
child per block (at most --abort-checks of them), that C does abort, and
compares the other blocks. IQ4_NL's `_ref` leaves the codes of blocks below
1e-15 undefined (uninitialised stack), so there only d is compared; the
count is printed. Exit status 1 if any compared byte differs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("GGML_NO_BACKTRACE", "1")     # an abort must not attach gdb

import ggml_c  # noqa: E402
from strata_ref.formats import get_quantizer  # noqa: E402
from strata_ref.formats import iquants_quant as iq  # noqa: E402
from strata_ref.types import GGMLType, block_format  # noqa: E402

TYPES = ["IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_S", "IQ1_M"]


def input_sets(qk: int, n: int, seed: int) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    sets = {"normal": r.standard_normal((n, qk)), "t2": r.standard_t(2, (n, qk))}
    sp = r.standard_normal((n, qk))
    k = max(n // 10, 1)
    sp[0:k] *= 1e-6
    sp[k:2 * k] *= 3e4
    sp[2 * k:3 * k] = 0
    sp[2 * k:3 * k, ::37] = r.choice([1, -1, 2.0 ** -20, 1024], size=sp[2 * k:3 * k, ::37].shape)
    sp[3 * k:3 * k + 10] = 0
    sp[3 * k + 10:3 * k + 20] = -0.0
    sp[3 * k + 20:4 * k] *= 1e-12
    sp[4 * k:5 * k] = np.round(sp[4 * k:5 * k] * 4) / 4
    sp[5 * k:6 * k, :qk // 2] = 0
    sp[6 * k:7 * k] = np.abs(sp[6 * k:7 * k])
    sp[7 * k:8 * k] *= 1e15
    sp[8 * k:9 * k] = r.integers(-3, 4, (k, qk))
    sets["special"] = sp
    sub = 16 if qk == 256 else 8
    v = r.standard_normal((n, qk // sub, sub)) * 10.0 ** r.uniform(-4, 4, (n, qk // sub, 1))
    v[r.random((n, qk // sub)) < 0.15] = 0
    sets["subscale"] = v.reshape(n, qk)
    sets["fp16sub"] = r.standard_normal((n, qk)) * 10.0 ** r.uniform(-9, -4, (n, 1))
    return {name: a.astype(np.float32) for name, a in sets.items()}


def c_aborts(fn, xb: np.ndarray) -> bool:
    """True when fn(xb) ends its (forked) process abnormally."""
    pid = os.fork()
    if pid == 0:
        os.close(2)
        try:
            fn(xb)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status != 0


def ours_or_abort(fn, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes of the blocks that quantize, mask of those blocks)."""
    try:
        return fn(x), np.ones(len(x), bool)
    except ValueError:
        ok = np.ones(len(x), bool)
        for i in range(len(x)):
            try:
                fn(x[i:i + 1])
            except ValueError:
                ok[i] = False
        return fn(x[ok]), ok


def compare(label, ours_fn, c_fn, x, args, undefined_codes=None) -> int:
    t0 = time.perf_counter()
    a, ok = ours_or_abort(ours_fn, x)
    t1 = time.perf_counter()
    b = c_fn(x[ok])
    t2 = time.perf_counter()
    note = ""
    if (~ok).any():
        idx = np.flatnonzero(~ok)[:args.abort_checks]
        n_c = sum(c_aborts(c_fn, x[i:i + 1]) for i in idx)
        note += f"; {int((~ok).sum())} blocks refused, C aborts on {n_c} of {len(idx)} checked"
        if n_c != len(idx):
            note += " (MISMATCH)"
    diff = a != b
    if undefined_codes is not None:
        und = undefined_codes(x[ok])
        diff[und, 2:] = False
        if und.any():
            note += f"; {int(und.sum())} blocks with undefined codes (d compared)"
    bad = int(diff.any(axis=1).sum())
    print(f"{label:<26} {int(ok.sum()):>6} blocks  differing {bad:>4}   "
          f"strata {t1 - t0:6.2f} s  C {t2 - t1:6.2f} s{note}", flush=True)
    return bad + (1 if "MISMATCH" in note else 0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=10000)
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--lib", default=None)
    p.add_argument("--abort-checks", type=int, default=50)
    args = p.parse_args(argv)
    g = ggml_c.load(args.lib)
    if g is None:
        print("no ggml-base library: run tools/ggml_vectors.py --build", file=sys.stderr)
        return 2
    print(f"ggml: {g.path}")
    failures = 0
    for name in args.types.split(","):
        t = GGMLType[name]
        fmt = block_format(t)
        g.init_quantizer(int(t))
        for set_name, x in input_sets(fmt.block_values, args.blocks, 1234 + int(t)).items():
            if t == GGMLType.IQ1_M:
                failures += compare(f"{name} {set_name} (chunk)", iq.quantize_iq1_m_chunk,
                                    lambda xx: g.quantize_chunk(int(t), xx), x, args)
                continue

            def c_ref(xx, t=t):
                return g.quantize_ref(int(t), xx)
            und = None
            if t == GGMLType.IQ4_NL:
                und = lambda xx: np.abs(xx).max(axis=1) < np.float32(1e-15)  # noqa: E731
            failures += compare(f"{name} {set_name}", get_quantizer(t), c_ref, x, args, und)
            if t == GGMLType.IQ4_NL:
                failures += compare(f"{name} {set_name} (chunk)", iq.quantize_iq4_nl_chunk,
                                    lambda xx: g.quantize_chunk(int(t), xx), x, args)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
