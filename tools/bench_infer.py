"""Prompt and decode speed of strata-ref's CPU inference next to llama.cpp's.

    python tools/bench_infer.py [--models SmolLM2-135M-Instruct,Qwen2.5-Coder-0.5B-Instruct]
                                [--threads 2] [--repeats 3] [--tokens 32] [--cpu PROFILE]

`--cpu` picks the CPU profile strata-ref runs (default: native, as
`strata-ref generate`); llama.cpp is then the peer built for that profile by
tools/peer_build.py when that build exists (the same arithmetic, bit for
bit), else whatever llama_cpp is importable. The header names both.

Workload (spec/models.md §5): the prompt "The capital of France is" in one
pass, then greedy decoding; "decode" times the single-token calls after the
prompt pass (tokens - 1 of them). Wall clock, best of `--repeats`. When
llama-cpp-python is importable it is measured in the same run with the same
thread count (n_ctx 512, n_batch 512), in a child process with the
environment this script started with (llama.cpp uses the same libgomp, so
the OpenMP settings strata-ref makes must not reach it); otherwise the
reference figures of
spec/models.md §5 are printed (a 2-core Zen 3 VM, idle). Timings on a
machine shared with other work are noise: say so when reporting them.

strata-ref is measured as the library and `strata-ref generate` run it:
`strata_ref.infer.kernels` is imported before numba's thread count is set,
so its threading setup (layer, OpenMP wait policy) is the one in effect,
and the layer numba actually picked is printed. To compare another setup,
set NUMBA_THREADING_LAYER (or OMP_WAIT_POLICY / GOMP_SPINCOUNT) in the
environment. `--busy N` runs N busy-looping processes during the timings,
to see the speed on a loaded machine (each takes a core from both engines).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "The capital of France is"
# spec/models.md §5: llama.cpp 0.3.36, 2 threads, best of 3 on an idle 2-core Zen 3 VM
ENV_AT_START = dict(os.environ)
SPEC_TPS = {"SmolLM2-135M-Instruct": (203.0, 111.0), "Qwen2.5-Coder-0.5B-Instruct": (71.0, 35.0)}


def bench_ours(path, n_tokens, repeats, profile):
    import numpy as np
    from strata_ref.infer.model import load
    m = load(path, profile=profile)
    m.prepare()
    ids = m.tokenizer.encode(PROMPT)
    best_p = best_d = float("inf")
    for rep in range(repeats + 1):          # the first round compiles and packs
        cache = m.new_cache(512)
        t0 = time.perf_counter()
        logits = m.forward(ids, cache)
        t1 = time.perf_counter()
        for _ in range(n_tokens - 1):
            logits = m.forward([int(np.argmax(logits))], cache)
        t2 = time.perf_counter()
        if rep:
            best_p, best_d = min(best_p, t1 - t0), min(best_d, t2 - t1)
    return len(ids) / best_p, (n_tokens - 1) / best_d


def bench_llama(path, n_tokens, repeats, threads):
    import numpy as np
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=threads,
                n_threads_batch=threads, seed=0, verbose=False)
    ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
    n_vocab = llm.n_vocab()
    best_p = best_d = float("inf")
    for rep in range(repeats + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(n_tokens - 1):
            row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
            llm.eval([int(np.argmax(row))])
        t2 = time.perf_counter()
        if rep:
            best_p, best_d = min(best_p, t1 - t0), min(best_d, t2 - t1)
    return len(ids) / best_p, (n_tokens - 1) / best_d


def peer_site(profile: str):
    """The site folder of tools/peer_build.py's build for `profile`, or None."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from peer_build import peer_dir
    site = peer_dir(profile) / "site"
    return site if (site / "llama_cpp").is_dir() else None


def bench_llama_clean(path, n_tokens, repeats, threads, site=None):
    """`bench_llama` in a child process with the environment at start (and
    the peer build `site` first on PYTHONPATH when given)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import bench_infer as b; "
            "print(json.dumps(b.bench_llama(sys.argv[2], *map(int, sys.argv[3:]))))")
    env = dict(ENV_AT_START)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    r = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent), str(path),
                        str(n_tokens), str(repeats), str(threads)],
                       env=env, capture_output=True, text=True, check=True)
    return tuple(json.loads(r.stdout.strip().splitlines()[-1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="SmolLM2-135M-Instruct,Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes to run meanwhile")
    ap.add_argument("--cpu", default=None, help="CPU profile (scalar, avx2, avx512, native)")
    args = ap.parse_args(argv)
    # first the library's own threading setup, as `strata-ref generate` has it;
    # touching numba's threads before it would fix numba's default layer
    import strata_ref.cpu.matmul  # noqa: F401
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from strata_ref import cpu
    from strata_ref.models import resolve
    prof = cpu.select(args.cpu)
    site = peer_site(prof.name)
    try:
        if site is not None:
            peer = f"llama.cpp built for the {prof.name} profile ({site}), measured now"
            llama_cpp = True
        else:
            import llama_cpp  # noqa: F401
            peer = f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, importable build), measured now"
    except ImportError:
        llama_cpp = None
        peer = "llama.cpp (spec/models.md §5 reference figures, not measured here)"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"threads {args.threads}; best of {args.repeats}; load average {load:.2f}; "
          f"busy processes {args.busy}; cpu profile: {prof.name}; peer: {peer}")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        print(f"{'model':30s} {'ours prompt':>12s} {'ours decode':>12s} {'llama prompt':>13s} "
              f"{'llama decode':>13s} {'decode ratio':>13s}")
        for name in args.models.split(","):
            path = resolve(name)
            op, od = bench_ours(path, args.tokens, args.repeats, prof)
            if llama_cpp is not None:
                lp, ld = bench_llama_clean(path, args.tokens, args.repeats, args.threads, site)
            else:
                lp, ld = SPEC_TPS.get(name, (float("nan"), float("nan")))
            print(f"{name:30s} {op:10.1f}/s {od:10.1f}/s {lp:11.1f}/s {ld:11.1f}/s {od / ld:12.2f}x")
    finally:
        for b in busy:
            b.kill()
            b.wait()
    wait = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}
    print(f"strata-ref: numba threading layer {numba.threading_layer()!r}, "
          f"{numba.get_num_threads()} threads; {wait or 'OpenMP wait policy unset'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
