"""Bandwidth of the native dequant kernels against the GPU's own copy.

For each type and output dtype it dequantizes a tensor of >= 256 MiB of
output (cols = 4096) with the generic kernel and, where the type has one,
the wide kernel, timed with CUDA events (median of `--reps` batches of
`--batch` back-to-back launches, after warm-up), and prints:

* GB/s counting bytes read (blocks) plus bytes written (outputs),
* the device-to-device copy bandwidth measured in the same run (cudaMemcpy
  of 1 GiB, read + written) and each kernel's ratio to it,
* the wide/generic speedup.

Needs CuPy (events, copy) and the native library (strata_ref.native).
Usage: python -m strata_ref.native.dequant.bench [--types Q8_0,Q4_K] [--dtypes f16,bf16]
       [--all] [--mib 256] [--markdown] [--wide-only]
Goal (issues 4 and 20): wide >= 90 % of copy for Q8_0, Q4_K, Q5_K, Q6_K,
IQ4_XS to f16, bf16 and f32, and >= 5x the generic kernel. The last lines
give the lowest ratio to the copy per output dtype.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np


def _timer(cp, fn, reps: int, batch: int, warmup: int = 3) -> float:
    """Median seconds per call of fn() over `reps` event-timed batches."""
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(batch):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / batch)
    return statistics.median(times)


def copy_bandwidth(cp, nbytes: int, reps: int, batch: int) -> float:
    """Bytes/s of a device-to-device cudaMemcpyAsync, counting read + written."""
    src = cp.empty(nbytes, cp.uint8)
    dst = cp.empty(nbytes, cp.uint8)
    src.fill(1)
    t = _timer(cp, lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, 3,
                                                         cp.cuda.get_current_stream().ptr),
               reps, batch)
    return 2 * nbytes / t


def write_bandwidth(cp, nbytes: int, reps: int, batch: int) -> float:
    """Bytes/s of cudaMemsetAsync (write-only traffic), for context."""
    dst = cp.empty(nbytes, cp.uint8)
    t = _timer(cp, lambda: cp.cuda.runtime.memsetAsync(dst.data.ptr, 0, nbytes,
                                                         cp.cuda.get_current_stream().ptr),
               reps, batch)
    return nbytes / t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="Q8_0,Q4_K,Q5_K,Q6_K,IQ4_XS")
    ap.add_argument("--all", action="store_true", help="every type with a generic kernel")
    ap.add_argument("--dtypes", default="f16,bf16,f32")
    ap.add_argument("--mib", type=int, default=256, help="output size per call, MiB (f16)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--wide-only", action="store_true",
                    help="time only the wide kernels (tuning runs)")
    args = ap.parse_args(argv)

    import cupy as cp

    from strata_ref.native.dequant.parity import make_blocks
    from strata_ref.native.dequant.policy import GENERIC_TYPES, WIDE_BLOCKS_ALIGN
    from strata_ref.native.loader import load
    from strata_ref.types import block_format, parse_type

    nat = load()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    copy_bw = copy_bandwidth(cp, 1 << 30, args.reps, args.batch)
    print(f"device: {name}, compute capability {nat.cc}; CUDA runtime "
          f"{cp.cuda.runtime.runtimeGetVersion()}, driver {cp.cuda.runtime.driverGetVersion()}")
    print(f"device-to-device copy (1 GiB, read + written): {copy_bw / 1e9:.0f} GB/s")
    print(f"memset (256 MiB, written only): "
          f"{write_bandwidth(cp, 256 << 20, args.reps, args.batch) / 1e9:.0f} GB/s")
    import os
    if os.environ.get("STRATA_REF_NVCC_DEFINES"):
        print(f"tuning defines: {os.environ['STRATA_REF_NVCC_DEFINES']}")

    types = (sorted(GENERIC_TYPES) if args.all
             else [parse_type(s) for s in args.types.split(",")])
    types = [t for t in types if block_format(t).quantized]
    dtypes = args.dtypes.split(",")
    code = {"f32": 0, "f16": 1, "bf16": 2}
    size = {"f32": 4, "f16": 2, "bf16": 2}
    cols = 4096
    rows = args.mib * (1 << 20) // (2 * cols)
    rng = np.random.default_rng(7)
    hdr = ("| type | out | shape | MB read+written | generic µs | generic GB/s | wide µs | "
           "wide GB/s | wide / copy | wide / generic |")
    rows_out = [hdr, "|" + "---|" * 10]
    worst = []
    for t in types:
        fmt = block_format(t)
        n_blocks = rows * cols // fmt.block_values
        host = make_blocks(t, n_blocks, "sane", rng).reshape(-1)
        blocks = cp.asarray(host)
        del host
        for dt in dtypes:
            out = cp.empty(rows * cols * size[dt], cp.uint8)
            moved = blocks.nbytes + out.nbytes
            bp = nat.ffi.cast("void *", blocks.data.ptr)
            op = nat.ffi.cast("void *", out.data.ptr)
            stream = nat.ffi.cast("void *", cp.cuda.get_current_stream().ptr)

            def launcher(kernel):
                def fn():
                    st = nat.lib.strata_dequant(int(t), bp, 0, rows, cols, cols, code[dt], op,
                                                kernel, stream)
                    if st != 0:
                        raise RuntimeError(f"strata_dequant {t.name} {dt} kernel {kernel}: "
                                           f"status {st}")
                return fn

            if args.wide_only and t not in WIDE_BLOCKS_ALIGN:
                continue
            tg = float("nan") if args.wide_only else _timer(cp, launcher(0), args.reps, args.batch)
            cells = [t.name, dt, f"{rows}x{cols}", f"{moved / 1e6:.0f}",
                     f"{tg * 1e6:.1f}", f"{moved / tg / 1e9:.0f}"]
            if t in WIDE_BLOCKS_ALIGN:
                tw = _timer(cp, launcher(1), args.reps, args.batch)
                ratio = moved / tw / copy_bw
                cells += [f"{tw * 1e6:.1f}", f"{moved / tw / 1e9:.0f}", f"{ratio:.1%}",
                          f"{tg / tw:.1f}x"]
                worst.append((ratio, tg / tw, t.name, dt))
            else:
                cells += ["", "", f"({moved / tg / copy_bw:.1%} generic)", ""]
            line = "| " + " | ".join(cells) + " |"
            rows_out.append(line)
            print(line if args.markdown else "  ".join(cells), flush=True)
            del out
        del blocks
        cp.get_default_memory_pool().free_all_blocks()
    print()
    print("\n".join(rows_out))
    if worst:
        print()
        for dt in dtypes:
            cells = [w for w in worst if w[3] == dt]
            if cells:
                r, _, tn, _ = min(cells)
                sp = min(w[1] for w in cells)
                print(f"wide {dt}: lowest ratio to copy {r:.1%} ({tn}), goal 90 %: "
                      f"{'met' if r >= 0.9 else 'not met'}; lowest wide/generic speedup "
                      f"{sp:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
