"""Prompt and decode speed of strata-ref's CPU inference next to llama.cpp's,
measured in the same run, repeat by repeat.

    python tools/bench_infer.py [--models SmolLM2-135M-Instruct,Qwen2.5-Coder-0.5B-Instruct,gemma-3-270m]
                                [--cpu avx2[,avx512,scalar]] [--threads 2] [--repeats 5]
                                [--tokens 32] [--prompt-tokens N] [--busy N] [--json FILE]

`--models` takes registry names, GGUF paths, and `bench-1.5b` / `bench-7b`:
dense Q4_K_M models of Qwen2.5-1.5B's and Llama-3-8B / Mistral-7B's layer shapes from seeded
random weights (tools/make_bench_model.py), written into
<cache>/bench/ the first time (about 1 and 5 GB; <cache> is $STRATA_REF_CACHE, else
~/.cache/strata-ref).

`--cpu` lists the CPU profiles strata-ref runs (default: native, as
`strata-ref generate`); for each, llama.cpp is the peer built for that
profile by tools/peer_build.py (the same arithmetic, bit for bit), else
whatever llama_cpp is importable. The header names both.

Workload (the project spec's models.md §5, in the shared design folder): the prompt "The capital of France is" in one
pass, then greedy decoding; "decode" times the single-token calls after the
prompt pass (tokens - 1 of them). Wall clock. `--prompt-tokens N` takes the
first N tokens of a longer English text instead (one pass; the context is
made large enough for it and the decoding). Both engines get the token ids
strata-ref's tokenizer made.

The decode floor: the bytes of every weight matrix a decode step reads
(`profile_infer.weight_bytes`) over the read bandwidth measured at the start
with the same thread count (`profile_infer._read_bandwidth`: the Q8_0 mat-vec
kernel streaming a 381 MB matrix); `floor` is that rate in tokens/s and
`%floor` strata-ref's decode rate as a share of it. llama.cpp runs in a child
process (n_ctx 512, n_batch 512, the same thread count) with the
environment this script started with (llama.cpp uses the same libgomp, so
the OpenMP settings strata-ref makes must not reach it). The two engines
take turns: one untimed round each (compilation, packing, caches), then
`--repeats` rounds of [strata-ref once, llama.cpp once] (the order swapped
every round), and the best round of each engine is reported. Taking turns
puts both under the same load when the machine is shared; a machine that
is not idle still shifts both, so say so when reporting. Without
llama-cpp-python the reference figures of that §5 are printed
(a 2-core Zen 3 VM, idle).

strata-ref is measured as the library and `strata-ref generate` run it:
the library's threading setup (`strata_ref._threads.configure`: layer,
OpenMP wait policy) runs before numba's thread count is set, so it is the
one in effect, and
the layer numba actually picked is printed. `--busy N` runs N busy-looping
processes during the timings, to see the speed on a loaded machine.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT = "The capital of France is"
#: the text `--prompt-tokens` cuts its prompt from (repeated as needed)
LONG_TEXT = ("The history of the city begins with a small settlement on an island in the river, "
             "where fishermen and traders met to exchange goods from the north and the south. "
             "Over the centuries the town grew into a center of learning, commerce and government, "
             "and its bridges, markets and churches were rebuilt many times after floods and fires. ")
BENCH_MODELS = {"bench-1.5b": "1.5b", "bench-7b": "7b"}
DEFAULT_MODELS = "SmolLM2-135M-Instruct,Qwen2.5-Coder-0.5B-Instruct,gemma-3-270m"
# spec/models.md §5: llama.cpp 0.3.36, 2 threads, best of 3 on an idle 2-core Zen 3 VM
ENV_AT_START = dict(os.environ)
SPEC_TPS = {"SmolLM2-135M-Instruct": (203.0, 111.0), "Qwen2.5-Coder-0.5B-Instruct": (71.0, 35.0)}


# --------------------------------------------------------------- strata-ref
class Ours:
    """strata-ref on one model and profile; `round()` -> (prompt s, decode s)."""

    def __init__(self, path, n_tokens, profile, prompt_tokens=None):
        from strata_ref.infer.loader import load
        self.m = load(path, profile=profile)
        self.m.prepare()
        self.ids = prompt_ids(self.m.tokenizer, prompt_tokens)
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx(len(self.ids), n_tokens)

    def round(self):
        import numpy as np
        cache = self.m.new_cache(self.n_ctx)
        t0 = time.perf_counter()
        logits = self.m.forward(self.ids, cache)
        t1 = time.perf_counter()
        for _ in range(self.n_tokens - 1):
            logits = self.m.forward([int(np.argmax(logits))], cache)
        return t1 - t0, time.perf_counter() - t1


# --------------------------------------------------------------- llama.cpp
def prompt_ids(tokenizer, n=None) -> list:
    """The benchmark prompt's token ids: PROMPT's, or the first n of
    LONG_TEXT repeated."""
    if n is None:
        return list(tokenizer.encode(PROMPT))
    ids = []
    while len(ids) < n:
        ids = list(tokenizer.encode(LONG_TEXT * (1 + 2 * len(ids) // 64 + 1)))
    return ids[:n]


def n_ctx(n_prompt: int, n_tokens: int) -> int:
    """The context both engines get: 512, or what the prompt and the
    decoding need."""
    return max(512, n_prompt + n_tokens)


def llama_worker(path, n_tokens, threads, ids):
    """The child's loop: load the model, print "ready", then for every
    line "round" on stdin run one round and print [prompt s, decode s]."""
    import numpy as np
    from llama_cpp import Llama
    ctx = n_ctx(len(ids), n_tokens)
    llm = Llama(model_path=str(path), n_ctx=ctx, n_batch=512, n_threads=threads,
                n_threads_batch=threads, seed=0, verbose=False)
    n_vocab = llm.n_vocab()
    print(json.dumps({"ready": len(ids)}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(n_tokens - 1):
            row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
            llm.eval([int(np.argmax(row))])
        print(json.dumps([t1 - t0, time.perf_counter() - t1]), flush=True)


class Llama:
    """llama.cpp in a child process (`llama_worker`); `round()` as Ours."""

    def __init__(self, path, n_tokens, threads, ids, site=None):
        env = dict(ENV_AT_START)
        if site is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import bench_infer as b; "
                "b.llama_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]))")
        self.p = subprocess.Popen([sys.executable, "-c", "import json; " + code,
                                   str(Path(__file__).resolve().parent), str(path),
                                   str(n_tokens), str(threads), json.dumps([int(i) for i in ids])],
                                  env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        first = self.p.stdout.readline()
        if not first:
            self.p.wait()
            raise RuntimeError(f"the llama.cpp worker did not start (exit status {self.p.returncode}; "
                               "its error is printed above; a peer build of tools/peer_build.py needs "
                               "llama-cpp-python's own dependencies in this interpreter: "
                               "pip install -e '.[peer]')")
        self.n_prompt = json.loads(first)["ready"]

    def round(self):
        self.p.stdin.write("round\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("the llama.cpp worker stopped")
        return tuple(json.loads(line))

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.wait(timeout=60)


def bench_model(name: str) -> Path:
    """The path of bench model `name` (BENCH_MODELS), written by
    tools/make_bench_model.py into <cache>/bench/ when missing (<cache>:
    `strata_ref.models.cache_dir()`)."""
    from strata_ref.models import cache_dir
    shape = BENCH_MODELS[name]
    path = cache_dir() / "bench" / f"bench-{shape}-q4_k_m.gguf"
    if not path.is_file():
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from make_bench_model import write
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        write(part, shape, seed=0)
        part.replace(path)
    return path


def peer_site(profile: str):
    """The site folder of tools/peer_build.py's build for `profile`, or None."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from peer_build import peer_dir
    site = peer_dir(profile) / "site"
    return site if (site / "llama_cpp").is_dir() else None


def have_llama_cpp() -> bool:
    try:
        import importlib.util
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        return False


def measure(ours, peer, repeats):
    """Best (prompt s, decode s) of each engine over `repeats` alternating
    rounds, after one untimed round of each."""
    ours.round()
    if peer is not None:
        peer.round()
    best_o = [float("inf"), float("inf")]
    best_l = [float("inf"), float("inf")]
    for rep in range(repeats):
        order = (ours, peer) if rep % 2 == 0 else (peer, ours)
        for eng in order:
            if eng is None:
                continue
            p, d = eng.round()
            best = best_o if eng is ours else best_l
            best[0], best[1] = min(best[0], p), min(best[1], d)
    return tuple(best_o), (tuple(best_l) if peer is not None else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--cpu", default=None, help="CPU profiles, comma-separated (any of `strata-ref generate --cpu`: scalar, avx2, avx512, the v0.4.0-* profiles, native)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=None,
                    help="a prompt of this many tokens (cut from a longer text) instead of PROMPT")
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes to run meanwhile")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    if args.tokens < 2 or args.repeats < 1 or args.threads < 1:
        ap.error("--tokens must be >= 2, --repeats and --threads >= 1")
    if args.prompt_tokens is not None and not 1 <= args.prompt_tokens <= 8192:
        ap.error("--prompt-tokens must be from 1 to 8192")
    # first the library's own threading setup, as `strata-ref generate` has it;
    # touching numba's threads before it would fix numba's default layer
    from strata_ref._threads import configure
    configure()
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    from strata_ref import cpu
    from strata_ref.models import resolve
    try:
        profiles = [cpu.select(p) for p in (args.cpu.split(",") if args.cpu else [None])]
    except ValueError as e:
        ap.error(str(e))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"threads {args.threads}; best of {args.repeats} alternating rounds; load average {load:.2f} "
          f"at start; busy processes {args.busy}")
    if not args.busy and load >= 0.5 * (os.cpu_count() or 1):
        # other work already holds cores: llama.cpp's threads spin-wait for
        # each other and collapse when one loses its core (docs/inference.md),
        # so its figures, and the ratios, then say little about its code
        print(f"warning: the machine is busy before the bench starts (load average {load:.2f} "
              f"on {os.cpu_count()} CPUs): the figures, llama.cpp's most, will not be its idle speed")
    names = [n for n in args.models.split(",") if n.strip()]
    if not names:
        ap.error("--models names no model")
    try:
        paths = {n: (None if n in BENCH_MODELS else resolve(n)) for n in names}
    except (ValueError, RuntimeError, OSError) as e:    # ModelError: an unknown name, a missing path
        ap.error(f"--models: {e} (or {', '.join(BENCH_MODELS)})")
    from profile_infer import _read_bandwidth, weight_bytes
    bws = {p.name: _read_bandwidth(args.threads, p.isa) for p in profiles}
    print("read bandwidth (the Q8_0 kernel streaming, " + f"{args.threads} threads): "
          + ", ".join(f"{k} {v:.1f} GB/s" for k, v in bws.items()))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rows = []
    try:
        for prof in profiles:
            site = peer_site(prof.name)
            if site is not None:
                peer_name = f"llama.cpp built for {prof.name} (tools/peer_build.py)"
            elif have_llama_cpp():
                peer_name = "llama.cpp (the importable llama-cpp-python, not a profile build)"
            else:
                peer_name = None
            print(f"\nprofile {prof.name}; peer: {peer_name or 'none (spec/models.md §5 figures)'}")
            print(f"{'model':30s} {'ours prompt':>12s} {'llama prompt':>13s} {'ratio':>6s} "
                  f"{'ours decode':>12s} {'llama decode':>13s} {'ratio':>6s} {'floor':>8s} {'%floor':>6s}")
            for name in names:
                path = paths[name] or bench_model(name)
                try:
                    ours = Ours(path, args.tokens, prof, args.prompt_tokens)
                except (ValueError, RuntimeError, OSError) as e:    # GGUFError, ModelLoadError
                    print(f"bench_infer.py: error: {name}: {e}", file=sys.stderr)
                    return 2
                floor = bws[prof.name] * 1e9 / weight_bytes(ours.m)
                peer = Llama(path, args.tokens, args.threads, ours.ids, site) if peer_name else None
                try:
                    (op, od), lt = measure(ours, peer, args.repeats)
                finally:
                    if peer is not None:
                        peer.close()
                n_p = len(ours.ids)
                ops, ods = n_p / op, (args.tokens - 1) / od
                if lt is not None:
                    lps, lds = peer.n_prompt / lt[0], (args.tokens - 1) / lt[1]
                else:
                    lps, lds = SPEC_TPS.get(name, (float("nan"), float("nan")))
                print(f"{name:30s} {ops:10.1f}/s {lps:11.1f}/s {ops / lps:5.2f}x "
                      f"{ods:10.1f}/s {lds:11.1f}/s {ods / lds:5.2f}x {floor:6.1f}/s {ods / floor:6.0%}",
                      flush=True)
                rows.append(dict(profile=prof.name, model=name, prompt_tokens=n_p, ours_prompt=ops,
                                 llama_prompt=lps, ours_decode=ods, llama_decode=lds, floor_decode=floor,
                                 read_gbs=bws[prof.name], peer=peer_name))
                del ours
    finally:
        for b in busy:
            b.kill()
            b.wait()
    wait = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}
    end_load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nstrata-ref: numba threading layer {numba.threading_layer()!r}, "
          f"{numba.get_num_threads()} threads; {wait or 'OpenMP wait policy unset'}; "
          f"load average at the end {end_load:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(threads=args.threads, repeats=args.repeats,
                                                   tokens=args.tokens, load_start=load, load_end=end_load,
                                                   rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
