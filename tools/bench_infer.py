"""Prompt and decode speed of strata-ref's CPU inference next to llama.cpp's.

    python tools/bench_infer.py [--models SmolLM2-135M-Instruct,Qwen2.5-Coder-0.5B-Instruct]
                                [--threads 2] [--repeats 3] [--tokens 32]

Workload (spec/models.md §5): the prompt "The capital of France is" in one
pass, then greedy decoding; "decode" times the single-token calls after the
prompt pass (tokens - 1 of them). Wall clock, best of `--repeats`. When
llama-cpp-python is importable it is measured in the same run with the same
thread count (n_ctx 512, n_batch 512); otherwise the reference figures of
spec/models.md §5 are printed (a 2-core Zen 3 VM, idle). Timings on a
machine shared with other work are noise: say so when reporting them.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "The capital of France is"
# spec/models.md §5: llama.cpp 0.3.36, 2 threads, best of 3 on an idle 2-core Zen 3 VM
SPEC_TPS = {"SmolLM2-135M-Instruct": (203.0, 111.0), "Qwen2.5-Coder-0.5B-Instruct": (71.0, 35.0)}


def bench_ours(path, n_tokens, repeats):
    import numpy as np
    from strata_ref.infer.model import load
    m = load(path)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="SmolLM2-135M-Instruct,Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args(argv)
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from strata_ref.models import resolve
    try:
        import llama_cpp  # noqa: F401
        peer = f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, measured now)"
    except ImportError:
        llama_cpp = None
        peer = "llama.cpp (spec/models.md §5 reference figures, not measured here)"
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"threads {args.threads}; best of {args.repeats}; peer: {peer}")
    print(f"{'model':30s} {'ours prompt':>12s} {'ours decode':>12s} {'llama prompt':>13s} "
          f"{'llama decode':>13s} {'decode ratio':>13s}")
    for name in args.models.split(","):
        path = resolve(name)
        op, od = bench_ours(path, args.tokens, args.repeats)
        if llama_cpp is not None:
            lp, ld = bench_llama(path, args.tokens, args.repeats, args.threads)
        else:
            lp, ld = SPEC_TPS.get(name, (float("nan"), float("nan")))
        print(f"{name:30s} {op:10.1f}/s {od:10.1f}/s {lp:11.1f}/s {ld:11.1f}/s {od / ld:12.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
