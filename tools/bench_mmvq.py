"""Bench of the native q8_1 mat-vec and expert kernels (needs a CUDA GPU).

    python tools/bench_mmvq.py [--emit-table] [--experts]

Prints 1-column mat-vec bandwidth as a share of the device copy bandwidth
(Q4_K, Q6_K, IQ4_XS at 4096 x 14336, 14336 x 4096, 8192 x 28672 and
28672 x 8192; back to back and replayed from a CUDA graph, next to a
read-only kernel over the same bytes), optionally the
rows-per-warp table cells (strata_ref/native/mmvq_tables.py format), and
expert mode 0 against mode 8. Same code as `strata-ref bench mmvq|experts`.
"""
import argparse
import sys

from strata_ref.native.mmvq_parity import run_bench_experts, run_bench_mmvq


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emit-table", action="store_true")
    ap.add_argument("--experts", action="store_true")
    a = ap.parse_args()
    st = run_bench_mmvq(a.emit_table)
    if a.experts:
        st |= run_bench_experts()
    return st


if __name__ == "__main__":
    sys.exit(main())
