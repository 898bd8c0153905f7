"""Throughput and peak memory of `strata-ref hash` on a (large) model.

Each configuration runs `strata-ref hash MODEL --jobs N --out D` in a fresh
child process (imports, numba's cache, worker start-up and all, as a user
sees it) and the table gives, per configuration: the wall time, the
throughput in GB/s of model bytes, the ratio to the `--jobs 1` run with the
same --out measured in the same invocation (the peer), the peak resident
memory of the main process and of the largest worker process
(getrusage: RUSAGE_SELF and RUSAGE_CHILDREN of the child), and these
against the model's size. The chained hashes of runs with the same --out
must agree; the tool says so or fails. The load average before each run is
printed, since the figures mean little on a busy machine.

    python tools/bench_hash.py /path/big-00001-of-00005.gguf --jobs 1,2 \\
        --out f32,f16,bf16 --out f32
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _child(model: str, jobs: int, out: str) -> int:
    import io
    import resource
    from contextlib import redirect_stdout
    sys.path.insert(0, str(ROOT))
    from strata_ref.cli import main
    buf = io.StringIO()
    t0 = time.perf_counter()
    with redirect_stdout(buf):
        rc = main(["hash", model, "--no-progress", "--jobs", str(jobs), "--out", out])
    wall = time.perf_counter() - t0
    chained = [line for line in buf.getvalue().splitlines() if line.startswith("chained")]
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    print(json.dumps({"rc": rc, "wall": wall, "cpu": cpu, "chained": chained[-1] if chained else "",
                      "rss_main_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "rss_worker_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
    return rc


def _cpu() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="model file, any shard of a split set, or its directory")
    ap.add_argument("--jobs", default="1,2", help="comma-separated --jobs values (default 1,2)")
    ap.add_argument("--out", action="append", default=None,
                    help="an --out list to measure (repeatable; default f32,f16,bf16)")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "JOBS", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a.child[0], int(a.child[1]), a.child[2])
    sys.path.insert(0, str(ROOT))
    from strata_ref.gguf import read
    f = read(a.model)
    size = sum(s.file_size for s in f.shards)
    data = sum(t.n_bytes for t in f.tensors)
    jobs = [int(j) for j in a.jobs.split(",")]
    outs = a.out or ["f32,f16,bf16"]
    print(f"{_cpu()}, {os.cpu_count()} CPUs; model {len(f.shards)} file(s), {size / 1e9:.2f} GB, "
          f"{len(f.tensors)} tensors, {data / 1e9:.2f} GB of tensor data")
    rows = []
    for out in outs:
        peer = None
        chained = None
        for j in jobs:
            load = os.getloadavg()[0]
            p = subprocess.run([sys.executable, __file__, a.model, "--child", a.model, str(j), out],
                               capture_output=True, text=True)
            if p.returncode:
                print(p.stderr, file=sys.stderr)
                return 1
            r = json.loads(p.stdout.strip().splitlines()[-1])
            if chained is not None and r["chained"] != chained:
                print(f"--jobs {j} --out {out}: chained hashes differ:\n  {chained}\n  {r['chained']}",
                      file=sys.stderr)
                return 1
            chained = r["chained"]
            gbs = data / r["wall"] / 1e9
            peer = peer or gbs
            after = os.getloadavg()[0]
            rows.append((out, j, f"{load:.2f} / {after:.2f}", r["wall"], r["cpu"], gbs, gbs / peer,
                         r["rss_main_kb"] / 1024, r["rss_worker_kb"] / 1024))
            print(f"  --out {out} --jobs {j}: {r['wall']:.1f} s ({r['cpu']:.0f} CPU s), "
                  f"load average before / after {load:.2f} / {after:.2f}", flush=True)
        print(f"  {chained}")
    print(f"\n| --out | --jobs | load avg before / after | wall s | CPU s | GB/s of input "
          f"| vs --jobs {jobs[0]} | peak RSS main MiB | peak RSS largest worker MiB "
          f"| peak RSS / model size |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for out, j, load, wall, cpu, gbs, ratio, main_mb, worker_mb in rows:
        peak = max(main_mb, worker_mb) * 2 ** 20
        print(f"| {out} | {j} | {load} | {wall:.1f} | {cpu:.0f} | {gbs:.3f} | {ratio:.2f}× "
              f"| {main_mb:.0f} | {worker_mb:.0f} | {peak / size * 100:.2f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
