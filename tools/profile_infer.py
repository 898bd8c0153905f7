"""Where a decode step and a prompt pass of strata-ref's CPU inference spend
their time, per token, for the breakdown in docs/inference.md.

    python tools/profile_infer.py [MODEL ...] [--cpu PROFILE] [--threads 2]
                                  [--tokens 32] [--repeats 3]

For each model: the prompt "The capital of France is" then greedy decoding,
as tools/bench_infer.py runs it, once untimed (compilation, packing), then
`--repeats` times with every operation the graphs call wrapped by a timer:
the mat-muls per weight type (activation quantization and the kernel call),
the attention over the cache, RMSNorm, RoPE, the GLUs, the token embedding;
what is left of the wall time is the Python between them. Printed per
decode token and per prompt pass (best repeat), with:

* the bandwidth floor: the bytes of every weight a decode step reads (each
  matrix's GGUF blocks once, the embedding row aside) over the read
  bandwidth of this machine at the same thread count, measured in the same
  run by a numba kernel summing a 512 MiB buffer (each thread its half);
* the cost of one empty numba parallel region and of one empty numba call,
  measured the same way (best of 2000), times the number of each per token.

The timers add about a microsecond per wrapped call; the tool prints the
unwrapped wall time of the same workload too.
"""
from __future__ import annotations

import argparse
import collections
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "The capital of France is"


def _read_bandwidth(threads: int, isa) -> float:
    """GB/s at which this machine streams weights from memory: the Q8_0
    mat-vec kernel (`cpu.matvec`, software prefetch) over a 384 MB matrix,
    rows split over `threads`, best of 5, on the profile's chain `isa`. Its arithmetic is light next to
    the bytes, so this is what a decode step that reads every weight once
    can reach (a plain summing loop reached less here)."""
    import numpy as np
    from strata_ref import GGMLType
    from strata_ref.cpu import matvec
    rows, cols = 400_000, 896
    raw = np.ones((rows, cols // 32 * 34), np.uint8)
    x = np.ones((1, cols), np.float32)
    run = matvec.runner(GGMLType.Q8_0, isa)
    run(False, False, False, raw, x, threads)
    best = min(_timed(lambda: run(False, False, False, raw, x, threads)) for _ in range(5))
    return raw.nbytes / best / 1e9


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def _call_overheads() -> tuple[float, float]:
    """(seconds of one empty parallel region, seconds of one empty njit call)."""
    import numba
    import numpy as np

    @numba.njit(parallel=True, cache=False)
    def par(o):
        for i in numba.prange(o.shape[0]):
            o[i] = i

    @numba.njit(cache=False)
    def one(o):
        o[0] = 1

    o = np.empty(2, np.int64)
    par(o)
    one(o)
    return (min(_timed(lambda: par(o)) for _ in range(2000)),
            min(_timed(lambda: one(o)) for _ in range(2000)))


class Timers:
    """Wraps functions and methods; `acc[name]` sums seconds, `calls[name]`
    counts calls. `install()` patches, `remove()` restores."""

    def __init__(self):
        self.acc = collections.defaultdict(float)
        self.calls = collections.Counter()
        self._patched = []

    def wrap(self, owner, attr, name_of):
        orig = getattr(owner, attr)
        acc, calls = self.acc, self.calls

        def timed(*a, **k):
            name = name_of(a)
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                acc[name] += time.perf_counter() - t0
                calls[name] += 1
        self._patched.append((owner, attr, orig))
        setattr(owner, attr, timed)

    def remove(self):
        for owner, attr, orig in reversed(self._patched):
            setattr(owner, attr, orig)
        self._patched.clear()

    def reset(self):
        self.acc.clear()
        self.calls.clear()


def install(timers: Timers) -> None:
    from strata_ref.cpu import ops
    from strata_ref.cpu.matmul import QMatrix
    from strata_ref.infer import eager, kv_cache, model

    def mm_name(a):
        m = a[0]
        n = a[1].shape[0]
        return f"mat-mul {m.type.name}{' (n=1)' if n == 1 else ''}"
    timers.wrap(QMatrix, "matmul", mm_name)
    timers.wrap(kv_cache.KVCache, "attend", lambda a: "attention (store, K q, soft_max, V p)")
    for mod in (ops, model, eager):
        for fn in ("rms_norm",):
            if hasattr(mod, fn):
                timers.wrap(mod, fn, lambda a: "rms_norm")
    timers.wrap(ops, "rope", lambda a: "rope")
    timers.wrap(ops, "swiglu", lambda a: "swiglu / geglu")
    timers.wrap(ops, "geglu", lambda a: "swiglu / geglu")
    timers.wrap(model.Model, "embed", lambda a: "embedding rows")


def run_once(m, ids, n_tokens):
    import numpy as np
    cache = m.new_cache(512)
    t0 = time.perf_counter()
    logits = m.forward(ids, cache)
    t1 = time.perf_counter()
    for _ in range(n_tokens - 1):
        logits = m.forward([int(np.argmax(logits))], cache)
    return t1 - t0, time.perf_counter() - t1


def weight_bytes(m) -> int:
    """Bytes of the GGUF blocks of every matrix a decode step multiplies."""
    return sum(q.raw.nbytes for q in m._matrices())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", default=["SmolLM2-135M-Instruct"])
    ap.add_argument("--cpu", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.tokens < 2 or args.repeats < 1 or args.threads < 1:
        ap.error("--tokens must be >= 2, --repeats and --threads >= 1")
    from strata_ref._threads import configure
    configure()                    # the library's threading setup first
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from strata_ref import cpu
    from strata_ref.infer.loader import load
    from strata_ref.models import ModelError, resolve
    try:
        prof = cpu.select(args.cpu)
        paths = [resolve(name) for name in args.models]       # before the minutes of measuring
    except (ValueError, ModelError) as e:
        ap.error(str(e))
    bw = _read_bandwidth(args.threads, prof.isa)
    t_par, t_call = _call_overheads()
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{load_avg:.2f}; profile {prof.name}; {args.threads} threads; numba layer "
          f"{numba.threading_layer()}")
    print(f"read bandwidth {bw:.1f} GB/s ({args.threads} threads); empty parallel region "
          f"{t_par * 1e6:.1f} us; empty njit call {t_call * 1e6:.2f} us")
    for path in paths:
        m = load(path, profile=prof)
        m.prepare()
        ids = m.tokenizer.encode(PROMPT)
        run_once(m, ids, args.tokens)
        plain = [run_once(m, ids, args.tokens) for _ in range(args.repeats)]
        best_p = min(p for p, _ in plain)
        best_d = min(d for _, d in plain)
        # the breakdown below runs the graph's Python path, whose every
        # operation is a call that can be timed; the compiled layers
        # (infer.compiled, the default for dense models) run the same
        # kernels in one call per layer, so the difference between the two
        # wall times is what the compiled layers save
        compiled_default = getattr(m, "compiled", None)
        if compiled_default:
            m.compiled = False
            run_once(m, ids, args.tokens)
            py = [run_once(m, ids, args.tokens) for _ in range(args.repeats)]
            py_p, py_d = min(p for p, _ in py), min(d for _, d in py)
        n_dec = args.tokens - 1
        timers = Timers()
        install(timers)
        try:
            best = None
            for _ in range(args.repeats):
                timers.reset()
                # the prompt pass and the decode steps separately
                cache = m.new_cache(512)
                import numpy as np
                t0 = time.perf_counter()
                logits = m.forward(ids, cache)
                tp = time.perf_counter() - t0
                pa, pc = dict(timers.acc), dict(timers.calls)
                timers.reset()
                t0 = time.perf_counter()
                for _ in range(n_dec):
                    logits = m.forward([int(np.argmax(logits))], cache)
                td = time.perf_counter() - t0
                if best is None or td < best[2]:
                    best = (tp, pa, td, dict(timers.acc), dict(timers.calls))
        finally:
            timers.remove()
        tp, pa, td, da, dc = best
        wb = weight_bytes(m)
        print(f"\n{path}: prompt {len(ids)} tokens {best_p * 1e3:.2f} ms "
              f"({len(ids) / best_p:.1f} tok/s), decode {best_d / n_dec * 1e3:.3f} ms/token "
              f"({n_dec / best_d:.1f} tok/s), as run by default, unwrapped; weights read per token "
              f"{wb / 1e6:.1f} MB, bandwidth floor {wb / (bw * 1e9) * 1e3:.3f} ms/token")
        if compiled_default:
            print(f"  the Python path of the graph (the breakdown below): prompt {py_p * 1e3:.2f} ms, "
                  f"decode {py_d / n_dec * 1e3:.3f} ms/token, unwrapped")
        print(f"  {'decode, per token':44s} {'ms':>8s} {'share':>7s} {'calls/token':>11s} | "
              f"{'prompt pass':>11s} {'share':>7s}")
        names = sorted(set(da) | set(pa), key=lambda k: -da.get(k, 0.0))
        for k in names:
            print(f"  {k:44s} {da.get(k, 0.0) / n_dec * 1e3:8.3f} {da.get(k, 0.0) / td:7.1%} "
                  f"{dc.get(k, 0) / n_dec:11.1f} | {pa.get(k, 0.0) * 1e3:11.3f} {pa.get(k, 0.0) / tp:7.1%}")
        rest_d = td - sum(da.values())
        rest_p = tp - sum(pa.values())
        print(f"  {'Python between the calls':44s} {rest_d / n_dec * 1e3:8.3f} {rest_d / td:7.1%} "
              f"{'':11s} | {rest_p * 1e3:11.3f} {rest_p / tp:7.1%}")
        print(f"  {'total (wrapped)':44s} {td / n_dec * 1e3:8.3f} {'':7s} {'':11s} | {tp * 1e3:11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
