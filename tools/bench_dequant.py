#!/usr/bin/env python3
"""Dequant speed of the oracle against ggml's C `to_float` and gguf-py, in one run.

For every type: IN_MIB of random valid blocks in rows of 4096 values, best
of REPS interleaved calls of `strata_ref.dequant_f32` and of its peers, in
M values/s, and the ratios ours / peer.

The ggml C column calls each type's `to_float` of the peer build's
libggml-base.so through tools/ggml_c.py (--ggml PATH, else
$STRATA_REF_GGML_LIB, else the first of the peer builds
<cache>/peer/{native,avx512,avx2,scalar}/ of tools/peer_build.py; every one
compiles ggml-quants.c without vector ISA flags, so they run the same code).
It is measured at one and at two threads (--threads 1,2): the oracle with
numba's thread count set to N (`numba.set_num_threads`, the same as
NUMBA_NUM_THREADS=N), ggml with the rows split into N contiguous parts each
dequantized by one `to_float` call in its own Python thread (ctypes releases
the GIL), as ggml's own ops split rows over threads. Both write into an
output allocated once per type, as `to_float(x, y, n)` writes into the
caller's y (ours through `out=`); --alloc allocates inside every timed call
instead, which adds the same page zeroing to both sides. Every output is
checked bitwise equal to ggml's (NaNs canonical on both sides; sane blocks
have none). The gguf-py column (`gguf.quants.dequantize`, NumPy, one thread,
allocating) is compared with the oracle allocating too, at the first thread
count; --no-gguf-py drops it.

Also FNV-1a 64 throughput on one core and one `strata-ref hash` timing
when --hash is given. The CPU model and the load average are printed first.

    python tools/bench_dequant.py [--mib 16] [--reps 3] [--types Q4_K,IQ2_XXS]
        [--threads 1,2] [--ggml PATH|none] [--alloc] [--no-gguf-py] [--hash]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import gguf
import numba
import numpy as np

import strata_ref as sr
from strata_ref.formats import dequant_types
from strata_ref.golden import sane_blocks
from strata_ref.hashing import fnv1a64

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggml_c  # noqa: E402


def best(fn, reps):
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def find_ggml(arg: str | None) -> Path | None:
    """The libggml-base.so to measure against (see the module doc)."""
    if arg == "none":
        return None
    if arg:
        return Path(arg)
    if os.environ.get(ggml_c.ENV_LIB):
        return Path(os.environ[ggml_c.ENV_LIB])
    from peer_build import peer_dir
    for prof in ("native", "avx512", "avx2", "scalar"):
        lib = peer_dir(prof) / "site" / "llama_cpp" / "lib" / "libggml-base.so"
        if lib.is_file():
            return lib
    return None


class CToFloat:
    """ggml's `to_float` of one type over rows, split in `threads` parts."""

    def __init__(self, lib: ggml_c.GGML, t: int):
        tr = lib.traits(t)
        self.qk, self.bb = tr.blck_size, tr.type_size
        self.fn = lib._q8k_deq if t == ggml_c._Q8_K else ggml_c._to_float_t(tr.to_float)

    def __call__(self, raw: np.ndarray, rows: int, cols: int, threads: int,
                 out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            out = np.empty((rows, cols), np.float32)
        row_bytes = cols // self.qk * self.bb
        src, dst = raw.ctypes.data, out.ctypes.data
        if threads == 1:
            self.fn(src, dst, rows * cols)
            return out
        cut = [rows * k // threads for k in range(threads + 1)]
        work = [threading.Thread(target=self.fn, args=(src + cut[k] * row_bytes, dst + cut[k] * cols * 4,
                                                        (cut[k + 1] - cut[k]) * cols))
                for k in range(threads)]
        for w in work:
            w.start()
        for w in work:
            w.join()
        return out


def host() -> str:
    model, flags = "unknown CPU", []
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("Flags"):
                flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16")
            if f in flags]
    return f"{model}, {os.cpu_count()} CPUs ({' '.join(simd)})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--types", default=None)
    ap.add_argument("--threads", default="1,2", help="thread counts for the ggml C comparison")
    ap.add_argument("--ggml", default=None, help="libggml-base.so to compare with, or 'none'")
    ap.add_argument("--no-gguf-py", action="store_true", help="leave out the gguf-py column")
    ap.add_argument("--alloc", action="store_true",
                    help="allocate every output (ours and ggml's) inside the timed call")
    ap.add_argument("--hash", action="store_true", help="also time `strata-ref hash` (all three dtypes)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    types = [sr.parse_type(t) for t in a.types.split(",")] if a.types else \
        [sr.GGMLType.F16, sr.GGMLType.BF16] + dequant_types()
    threads = [int(n) for n in a.threads.split(",")]
    if max(threads) > numba.config.NUMBA_NUM_THREADS:
        raise SystemExit(f"--threads {a.threads}: numba has only {numba.config.NUMBA_NUM_THREADS} threads "
                         "(NUMBA_NUM_THREADS)")
    libpath = find_ggml(a.ggml)
    lib = ggml_c.GGML(libpath) if libpath is not None and libpath.is_file() else None
    la = os.getloadavg()
    print(f"# {host()}; load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    print(f"# {a.mib} MiB input per type, best of {a.reps} interleaved, output "
          f"{'allocated per call' if a.alloc else 'preallocated'}; ggml C: {libpath if lib else 'not found'}")
    head = f"{'type':<8} {'M values':>9}"
    if lib:
        for n in threads:
            head += f" {f'ours {n}t':>9} {f'ggml {n}t':>9} {'ratio':>6}"
        head += f" {'bits':>5}"
    else:
        head += f" {f'ours {threads[0]}t':>9}"
    if not a.no_gguf_py:
        head += f" {'gguf-py':>9} {'ratio':>6}"
    print(head + "   (M values/s; ratio = ours / peer)")
    worst_c = {n: None for n in threads}
    worst_py = None
    # Start numba's thread pool before the first row. The first calls of a
    # process can still be several times slower: each new output of tens of
    # MB is a fresh mmap whose page faults dominate until glibc's dynamic mmap
    # threshold rises (measured: Q4_0 150 -> 1100 M values/s after 3-5 calls),
    # which is why every row is a best of several interleaved repetitions.
    warm = sane_blocks(sr.GGMLType.Q8_0, 1 << 17, rng).reshape(-1)
    t_end = time.perf_counter() + 1.0
    while time.perf_counter() < t_end:
        sr.dequant_f32(sr.GGMLType.Q8_0, warm, 1 << 10, 4096)
    all_equal = True
    for t in types:
        fmt = sr.block_format(t)
        cols = 4096 if 4096 % fmt.block_values == 0 else fmt.block_values * 64
        row_bytes = cols // fmt.block_values * fmt.block_bytes
        rows = max(1, int(a.mib * 2 ** 20) // row_bytes)
        raw = sane_blocks(t, rows * cols // fmt.block_values, rng).reshape(-1)   # finite scales
        nval = rows * cols
        sr.dequant_f32(t, raw, rows, cols)                         # compile and warm up
        cfn = CToFloat(lib, int(t)) if lib and lib.has_to_float(int(t)) else None
        peer = None
        if not a.no_gguf_py:
            try:
                qt = gguf.GGMLQuantizationType(int(t))
                gguf.quants.dequantize(raw[:row_bytes], qt)
                peer = lambda: gguf.quants.dequantize(raw.reshape(rows, row_bytes), qt)  # noqa: E731
            except (ValueError, NotImplementedError):
                peer = None
        equal = True
        if cfn is not None:
            want = cfn(raw, rows, cols, 1).view(np.uint32)
            want[((want & 0x7F800000) == 0x7F800000) & ((want & 0x7FFFFF) != 0)] = 0x7FFFFFFF
        # Both sides write into an output allocated once, as ggml's
        # `to_float(x, y, n)` writes into the caller's y (ours through
        # `out=`): a fresh output per call would add the kernel's page
        # zeroing, the same on both sides, to both. --alloc allocates per call.
        mine = np.empty((rows, cols), np.float32)
        theirs_out = np.empty((rows, cols), np.float32)
        if a.alloc:
            ours_call = lambda: sr.dequant_f32(t, raw, rows, cols)  # noqa: E731
        else:
            ours_call = lambda: sr.dequant_f32(t, raw, rows, cols, out=mine)  # noqa: E731
        # Interleaved, best of REPS each: a shared VM drifts, and drift then
        # hits both sides alike.
        ours = {n: [] for n in threads}
        theirs = {n: [] for n in threads}
        py, ours_alloc = [], []
        for _ in range(a.reps):
            for n in threads:
                numba.set_num_threads(n)
                t0 = time.perf_counter()
                got = ours_call()
                ours[n].append(time.perf_counter() - t0)
                if cfn is not None:
                    equal &= np.array_equal(got.view(np.uint32), want)
                    del got
                    t0 = time.perf_counter()
                    cfn(raw, rows, cols, n, None if a.alloc else theirs_out)
                    theirs[n].append(time.perf_counter() - t0)
            if peer is not None:
                # gguf-py allocates its output: compare with ours allocating
                numba.set_num_threads(threads[0])
                py.append(best(peer, 1))
                ours_alloc.append(best(lambda: sr.dequant_f32(t, raw, rows, cols), 1))
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        line = f"{t.name:<8} {nval / 1e6:9.1f}"
        if lib:
            for n in threads:
                o = min(ours[n])
                if theirs[n]:
                    c = min(theirs[n])
                    line += f" {nval / o / 1e6:9.0f} {nval / c / 1e6:9.0f} {c / o:6.2f}"
                    worst_c[n] = min(worst_c[n] or 1e9, c / o)
                else:
                    line += f" {nval / o / 1e6:9.0f} {'n/a':>9} {'-':>6}"
            line += f" {('equal' if equal else 'DIFF') if cfn else '-':>5}"
            all_equal &= equal
        else:
            line += f" {nval / min(ours[threads[0]]) / 1e6:9.0f}"
        if not a.no_gguf_py:
            if py:
                r = min(py) / min(ours_alloc)
                line += f" {nval / min(py) / 1e6:9.0f} {r:6.1f}"
                worst_py = min(worst_py or 1e9, r)
            else:
                line += f" {'n/a':>9} {'-':>6}"
        print(line, flush=True)
    for n in threads:
        if worst_c[n] is not None:
            print(f"# lowest ratio over ggml C at {n} thread(s): {worst_c[n]:.2f}x")
    if worst_py is not None:
        print(f"# lowest ratio over gguf-py: {worst_py:.1f}x")
    if lib and not all_equal:
        print("# OUTPUTS DIFFER from ggml's to_float")
    data = rng.integers(0, 256, 256 << 20, dtype=np.uint8)
    fnv1a64(data[:16])
    s = best(lambda: fnv1a64(data), a.reps)
    print(f"FNV-1a 64: {data.size / s / 1e9:.2f} GB/s (one core)")
    la = os.getloadavg()
    print(f"# load average at the end {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    if a.hash:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "strata_ref.cli", "hash", "--no-progress"],
                       check=True, stdout=subprocess.DEVNULL)
        print(f"strata-ref hash (SmolLM2, f32+f16+bf16, fresh process): {time.perf_counter() - t0:.1f} s")
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
