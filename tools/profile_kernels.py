"""One launch of each kernel that Nsight Compute should profile.

Run it under ncu (docs/native.md, docs/mmvq.md: "Profile"), e.g.

    ncu --clock-control none --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section LaunchStats --csv --page raw \\
        -k regex:'dequant_wide|k_mmvq_lanes|k_read' python tools/profile_kernels.py

It launches the wide dequant kernel once per type and output dtype on the
bench's tensor (32768 x 4096 values, sane random blocks; `--dequant`), and
the 1-column mat-vec's default kernel plus the read-only peer once per type
on a 7B and a 70B FFN shape (`--mmvq`). Between ncu's replay passes the
caches are flushed (its default), so every pass reads its inputs from DRAM,
as the benches' cold timings do. Needs CuPy and the native libraries.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def dequant(types, dtypes) -> None:
    import cupy as cp

    from strata_ref.native.loader import load
    from strata_ref.native.dequant.parity import make_blocks
    from strata_ref.types import block_format, parse_type

    nat = load()
    rows, cols = 32768, 4096
    rng = np.random.default_rng(7)
    code = {"f32": 0, "f16": 1, "bf16": 2}
    for name in types:
        t = parse_type(name)
        blocks = cp.asarray(make_blocks(t, rows * cols // block_format(t).block_values, "sane",
                                        rng).reshape(-1))
        for dt in dtypes:
            out = cp.empty(rows * cols * (4 if dt == "f32" else 2), cp.uint8)
            st = nat.lib.strata_dequant(int(t), nat.ffi.cast("void *", blocks.data.ptr), 0, rows,
                                        cols, cols, code[dt], nat.ffi.cast("void *", out.data.ptr),
                                        1, nat.ffi.NULL)
            assert st == 0, (name, dt, st)
            cp.cuda.Device().synchronize()
            print(f"dequant wide {name} -> {dt}", flush=True)


def mmvq(types) -> None:
    from strata_ref.native.mmvq.wrapper import load_mmvq
    from strata_ref.routes.mmvq_inputs import sane_blocks
    from strata_ref.routes.q8_1 import quantize_q8_1
    from strata_ref.types import parse_type

    nat = load_mmvq()
    f = nat.ffi
    rng = np.random.default_rng(3)
    for name in types:
        t = parse_type(name)
        for rows, k in ((4096, 14336), (28672, 8192)):
            w = sane_blocks(t, rows * k // 256, rng).reshape(rows, -1)
            q8 = quantize_q8_1(rng.standard_normal((1, k)).astype(np.float32))
            dw, dq, dy = nat.put(w), nat.put(q8), nat.alloc(rows * 4)
            nat.check(nat.lib.smv_mmvq(int(t), dw.ptr, rows, k, dq.ptr, 1,
                                       f.cast("float *", dy.ptr), 0, f.NULL), "mmvq")
            ms = f.new("float *")
            # one warm-up and one timed launch of the read-only peer
            nat.check(nat.lib.smv_time_read(dw.ptr, 0, 1, w.nbytes // 16 * 16, 1, ms), "read")
            nat.check(nat.lib.smv_synchronize(), "sync")
            print(f"mmvq {name} {rows} x {k} (lanes kernel, then k_read twice)", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dequant", action="store_true")
    ap.add_argument("--mmvq", action="store_true")
    ap.add_argument("--types", default="Q8_0,Q4_K,Q5_K,Q6_K,IQ4_XS")
    ap.add_argument("--dtypes", default="f16,f32")
    args = ap.parse_args(argv)
    if args.dequant:
        dequant(args.types.split(","), args.dtypes.split(","))
    if args.mmvq:
        mmvq([t for t in args.types.split(",") if t in ("Q4_K", "Q6_K", "IQ4_XS")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
