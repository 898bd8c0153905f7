"""`strata-ref parity` and `bench`: the native CUDA kernels against the
oracle, and their timings (needs an NVIDIA GPU)."""
from __future__ import annotations

from .common import err


def cmd_parity(a) -> int:
    if a.full and a.what != "gemm":
        return err(f"--full applies to `parity gemm` only, not `parity {a.what}`")
    if a.what == "dequant":
        from ..native.dequant.parity import run_parity_dequant
        return run_parity_dequant(quick=a.quick)
    if a.what == "gemm":
        from ..native.gemm.parity import run_parity_gemm
        return run_parity_gemm(quick=a.quick, full=a.full)
    from ..native.mmvq import parity as mmvq_parity
    if a.what == "mmvq":
        return mmvq_parity.run_parity_mmvq(a.quick)
    return mmvq_parity.run_parity_experts(a.quick)


def cmd_bench(a) -> int:
    if a.emit_table and a.what != "mmvq":
        return err(f"--emit-table applies to `bench mmvq` only, not `bench {a.what}`")
    from ..native.mmvq import bench as mmvq_bench
    if a.what == "mmvq":
        return mmvq_bench.run_bench_mmvq(a.emit_table)
    return mmvq_bench.run_bench_experts()


def add_parity(sub) -> None:
    pa = sub.add_parser("parity", help="native kernels against the oracle (needs a GPU)")
    pa.add_argument("what", choices=["dequant", "gemm", "mmvq", "experts"],
                    help="which native kernels")
    pa.add_argument("--quick", action="store_true", help="a small run")
    pa.add_argument("--full", action="store_true", help="gemm: >= 5,000 consecutive chunk sizes")
    pa.set_defaults(func=cmd_parity)


def add_bench(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks (needs a GPU)")
    b.add_argument("what", choices=["mmvq", "experts"], help="which native kernels")
    b.add_argument("--emit-table", action="store_true",
                   help="mmvq: print the rows-per-warp table in the source's format")
    b.set_defaults(func=cmd_bench)
