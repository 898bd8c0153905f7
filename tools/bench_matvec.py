"""Mat-vec and small-batch mat-mul speed of strata-ref's CPU kernels next to
ggml's own `ggml_mul_mat`, in the same process, on real model shapes.

    python tools/bench_matvec.py [--cpu avx2] [--types Q4_K,Q6_K,Q5_K,Q8_0,IQ4_XS]
                                 [--shapes 1.5b] [--n 1] [--threads 2] [--repeats 5] [--group]

For each weight type and each matrix shape of the model (`SHAPES`: rows x
cols of Qwen2.5-1.5B's q / kv / o / gate-up / down and its 151,936-token
output matrix; `7b`: Llama-3-8B / Mistral-7B's), random valid blocks
(`routes.mmvq_inputs.sane_blocks`, seeded; N(0, 1) values for F32, F16
and BF16: `weight_bytes`) and `--n` activation rows of
N(0, 1) values are multiplied

* by strata-ref (`cpu.QMatrix.matmul`, the profile's kernels, after a
  warm-up call that packs and compiles), twice: as a weight tensor (in
  ggml's CPU_REPACK buffer where the profile's build repacks the type, as
  in inference) and as a plain buffer (`repackable = False`);
* by ggml's CPU library of the llama.cpp peer built for the same profile
  (tools/peer_build.py; `ggml_mul_mat` in a graph, ctypes, tools/ggml_mm.py):
  a plain CPU buffer, so its `vec_dot` (n = 1), llamafile or tiled paths.

The plain-buffer outputs are compared bit for bit (printed as `bits`: `=`
when every value is equal). Timings are the best of `--repeats`
alternating calls (the engines take turns): wall time, or with `--threads
1` the CPU time of the calling thread (both engines then compute in it), which
a machine shared with other work disturbs less; with the weight bytes each call
reads over that time as GB/s, and next to them the weight-streaming
bandwidth of the machine at the same thread count
(`profile_infer._read_bandwidth`: the Q8_0 kernel over a 381 MB matrix). On a machine
shared with other work the figures are noise: say so when reporting them.

`--group` times instead the products a layer makes of one input (`GROUPS`:
q, k, v; gate, up; every matrix of the type given): apart (one runner call
each), as one `matvec.group_runner` call (one parallel region), and as one
ggml graph holding their mul_mats (one compute: llama.cpp's graph runs them
in one OpenMP region); ours called from a compiled loop, ggml through
ctypes (its per-call overhead counts against it). `bits` compares the
outputs where both run the vec_dot (`=`); `rp`: ours runs the type's
repacked kernel (as in inference) and ggml's plain buffer its vec_dot, so
the two are not the same computation and are not compared. Types:
`matvec.RUN_TYPES`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

#: rows x cols (ggml ne[1] x ne[0]) of the matrices a decode step multiplies
SHAPES = {
    "1.5b": {"q/o": (1536, 1536), "k/v": (256, 1536), "gate/up": (8960, 1536), "down": (1536, 8960),
             "output": (151936, 1536)},
    "7b": {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate/up": (14336, 4096), "down": (4096, 14336),
           "output": (151936, 4096)},
}


_CLOCK = time.perf_counter


def weight_bytes(t, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (rows * cols / QK * block bytes): the weights of a benchmark
    matrix of type t. A quantized type: random valid blocks
    (`routes.mmvq_inputs.sane_blocks`); F32, F16, BF16: N(0, 1) values
    converted to the type (random bytes of those types hold NaN, infinities
    and values near the largest finite, so the products compared were NaN)."""
    from strata_ref import GGMLType, block_format
    from strata_ref.numerics import f32_to_bf16_bits, f32_to_f16_bits
    from strata_ref.routes.mmvq_inputs import sane_blocks
    t = GGMLType(t)
    fmt = block_format(t)
    if fmt.quantized:
        return sane_blocks(t, rows * cols // fmt.block_values, rng).reshape(-1)
    v = rng.standard_normal(rows * cols).astype(np.float32)
    bits = {GGMLType.F32: lambda: v, GGMLType.F16: lambda: f32_to_f16_bits(v),
            GGMLType.BF16: lambda: f32_to_bf16_bits(v)}.get(t)
    if bits is None:
        raise ValueError(f"{t.name}: no benchmark weights for this type (ggml-cpu has no mat-mul for it)")
    return bits().view(np.uint8)


def _timed(f) -> float:
    t0 = _CLOCK()
    f()
    return _CLOCK() - t0


class GgmlMul:
    """y = W x by ggml's CPU library through one graph built once; with
    several weights (`more`: (type_id, raw, rows) each, the same x) one
    graph of their mul_mats, run in one compute as llama.cpp's graph runs
    q, k and v."""

    def __init__(self, libs, type_id, raw, rows, cols, x, threads, more=()):
        import ctypes
        from ggml_mm import _Params
        self.base, self.cpu, self.threads = libs[0], libs[1], threads
        n = x.shape[0]
        mats = [(type_id, raw, rows)] + list(more)
        # the graph's work buffer comes from the context at every compute
        need = sum(r.nbytes + 4 * n * m + (16 << 20) for _, r, m in mats) + x.nbytes + (256 << 20)
        self.ctx = self.base.ggml_init(_Params(need, None, False))
        b = self.base.ggml_new_tensor_2d(self.ctx, 0, cols, n)
        ctypes.memmove(self.base.ggml_get_data(b), np.ascontiguousarray(x).ctypes.data, x.nbytes)
        self.gf = self.base.ggml_new_graph(self.ctx)
        self.ys = []
        for tid, r, m in mats:
            a = self.base.ggml_new_tensor_2d(self.ctx, tid, cols, m)
            ctypes.memmove(self.base.ggml_get_data(a), r.ctypes.data, r.nbytes)
            y = self.base.ggml_mul_mat(self.ctx, a, b)
            self.base.ggml_build_forward_expand(self.gf, y)
            self.ys.append((y, np.empty((n, m), np.float32)))
        self.y, self.out = self.ys[0]

    def __call__(self):
        import ctypes
        if self.cpu.ggml_graph_compute_with_ctx(self.ctx, self.gf, self.threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        for y, out in self.ys:
            ctypes.memmove(out.ctypes.data, self.base.ggml_get_data(y), out.nbytes)
        return self.out

    def close(self):
        self.base.ggml_free(self.ctx)


#: the products of one input a decode step makes (`matvec.group_runner`)
GROUPS = {"q,k,v": ("q/o", "k/v", "k/v"), "gate,up": ("gate/up", "gate/up")}


def bench_groups(args, prof, libs) -> None:
    """`--group`: each of `GROUPS` as three (two) runner calls, as one
    `matvec.group_runner` call, and as one ggml graph of the mul_mats;
    the calls made from a compiled loop (as the compiled layers make
    them), best of `--repeats` rounds of 200 (50 for gate, up; 20 for ggml)."""
    from numba import njit
    from strata_ref import GGMLType
    from strata_ref.cpu import matvec

    @njit
    def each(run, flags, raws, x, parts, reps):
        for _ in range(reps):
            for i in range(len(raws)):
                run(flags[i], True, False, raws[i], x, parts)

    @njit
    def grouped(group, flags, raws, x, parts, reps):
        for _ in range(reps):
            group(flags, raws, x, parts)

    print(f"{'type':7s} {'products':8s} {'MB':>6s} | {'apart us':>9s} {'group us':>9s} {'GB/s':>5s} "
          f"{'apart/group':>11s} | {'ggml us':>8s} {'ggml/group':>10s} {'bits':>4s}")
    rng = np.random.default_rng(0)
    for tname in args.types.split(","):
        t = GGMLType[tname]
        for gname, members in GROUPS.items():
            cols = SHAPES[args.shapes][members[0]][1]
            shapes = [SHAPES[args.shapes][m][0] for m in members]
            raws = tuple(weight_bytes(t, r, cols, rng).reshape(r, -1) for r in shapes)
            x = rng.standard_normal((args.n, cols)).astype(np.float32)
            flags = tuple(bool(_qmatrix(t, r, cols, prof).repacked()) for r in raws)
            run = matvec.runner(t, prof.isa)
            group = matvec.group_runner((t,) * len(raws), prof.isa)
            reps = 200 if len(raws) == 3 else 50
            outs = group(flags, raws, x, args.threads)
            each(run, flags, raws, x, args.threads, 1)
            grouped(group, flags, raws, x, args.threads, 1)
            peer = (GgmlMul(libs, int(t), raws[0], shapes[0], cols, x, args.threads,
                            more=[(int(t), r, m) for r, m in zip(raws[1:], shapes[1:])]) if libs else None)
            ta, tg, tp = [], [], []
            for _ in range(args.repeats):
                ta.append(_timed(lambda: each(run, flags, raws, x, args.threads, reps)) / reps)
                tg.append(_timed(lambda: grouped(group, flags, raws, x, args.threads, reps)) / reps)
                if peer:
                    # (each compute takes a new work buffer from the graph's context)
                    tp.append(_timed(lambda: [peer() for _ in range(20)]) / 20)
            mb = sum(r.nbytes for r in raws) / 1e6
            a, g = min(ta), min(tg)
            line = (f"{tname:7s} {gname:8s} {mb:6.2f} | {a * 1e6:9.1f} {g * 1e6:9.1f} {mb / 1e3 / g:5.1f} "
                    f"{a / g:10.2f}x |")
            if peer:
                peer()
                p = min(tp)
                # ggml's plain buffer takes its vec_dot: compared where ours
                # does too; `rp`: ours repacked (another kernel), not compared
                same = all(np.array_equal(o.view(np.uint32), y[1].view(np.uint32))
                           for o, y in zip(outs, peer.ys)) if not any(flags) else None
                line += f" {p * 1e6:8.1f} {p / g:9.2f}x {'rp' if same is None else '=' if same else 'DIFF':>4s}"
                peer.close()
            print(line, flush=True)


def _qmatrix(t, raw, cols, prof):
    from strata_ref.cpu.matmul import QMatrix
    return QMatrix(t, raw.reshape(-1), raw.shape[0], cols, name="w", profile=prof)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", default=None, help="the CPU profile (default: native)")
    ap.add_argument("--types", default="Q4_K,Q6_K,Q5_K,Q8_0,IQ4_XS")
    ap.add_argument("--shapes", default="1.5b", choices=sorted(SHAPES))
    ap.add_argument("--only", default=None, help="matrix names of the shape set, comma-separated")
    ap.add_argument("--n", type=int, default=1, help="activation rows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--group", action="store_true",
                    help="time q, k, v and gate, up as one group call, apart, and as one ggml graph")
    args = ap.parse_args(argv)
    if args.n < 1 or args.threads < 1 or args.repeats < 1:
        ap.error("--n, --threads and --repeats must be >= 1")
    from strata_ref import GGMLType as _T
    bad = [t for t in args.types.split(",") if t not in _T.__members__]
    if bad:
        ap.error(f"--types: unknown ggml type {bad[0]!r} (names as ggml spells them: Q4_K, IQ4_XS, ...)")
    from strata_ref.cpu.traits import family
    for t in args.types.split(","):
        try:
            family(_T[t])
        except ValueError as e:
            ap.error(f"--types: {e}")
    if args.group:
        from strata_ref.cpu.matvec import RUN_TYPES
        other = [t for t in args.types.split(",") if _T[t] not in RUN_TYPES]
        if other:
            ap.error(f"--group: no grouped product for {', '.join(other)} (matvec.group_runner runs "
                     f"{', '.join(t.name for t in RUN_TYPES)})")
        if args.only:
            ap.error("--only names single matrices; --group times the groups of `GROUPS` (leave --only out)")
    if args.only and set(args.only.split(",")) - set(SHAPES[args.shapes]):
        ap.error(f"--only: the matrices of {args.shapes} are {', '.join(SHAPES[args.shapes])}")
    from strata_ref import cpu as _cpu
    try:
        _cpu.select(args.cpu)
    except ValueError as e:
        ap.error(str(e))
    from strata_ref._threads import configure
    configure()
    import numba
    if args.threads > numba.config.NUMBA_NUM_THREADS:
        # both engines must get the same thread count
        ap.error(f"--threads {args.threads}: numba runs at most {numba.config.NUMBA_NUM_THREADS} here "
                 "(NUMBA_NUM_THREADS)")
    numba.set_num_threads(args.threads)
    from strata_ref import GGMLType, cpu
    from strata_ref.cpu.matmul import QMatrix
    from bench_infer import peer_site
    prof = cpu.select(args.cpu)
    site = peer_site(prof.name)
    libs = None
    if site is not None:
        sys.path.insert(0, str(site))
        try:
            from ggml_mm import _libs
            libs = _libs()
        except ModuleNotFoundError as e:
            ap.error(f"the llama.cpp peer in {site} needs {e.name!r}: pip install -e '.[peer]'")
    else:
        print(f"no llama.cpp peer built for {prof.name}: the ggml columns stay empty "
              f"(python tools/peer_build.py {prof.name} builds it)", file=sys.stderr)
    from profile_infer import _read_bandwidth
    bw = _read_bandwidth(args.threads, prof.isa)
    global _CLOCK
    _CLOCK = time.thread_time if args.threads == 1 else time.perf_counter
    load = os.getloadavg()[0]
    print(f"profile {prof.name}; {args.threads} threads; n = {args.n}; read bandwidth {bw:.1f} GB/s; "
          f"load average {load:.2f}; {'thread CPU time' if args.threads == 1 else 'wall time'}; peer: {'ggml of the llama.cpp built for ' + prof.name if libs else 'none'}")
    if args.group:
        bench_groups(args, prof, libs)
        return 0
    print(f"{'type':7s} {'matrix':8s} {'rows x cols':>14s} {'MB':>7s} | {'ours ms':>8s} {'GB/s':>5s} "
          f"{'plain ms':>8s} | {'ggml ms':>8s} {'GB/s':>5s} {'ours/ggml':>9s} {'bits':>4s}")
    rng = np.random.default_rng(0)
    only = set(args.only.split(",")) if args.only else None
    for tname in args.types.split(","):
        t = GGMLType[tname]
        for mname, (rows, cols) in SHAPES[args.shapes].items():
            if only and mname not in only:
                continue
            raw = weight_bytes(t, rows, cols, rng)
            x = rng.standard_normal((args.n, cols)).astype(np.float32)
            ours = QMatrix(t, raw, rows, cols, name=mname, profile=prof)
            plain = QMatrix(t, raw, rows, cols, name=mname, profile=prof)
            plain.repackable = False
            peer = GgmlMul(libs, int(t), raw, rows, cols, x, args.threads) if libs else None
            yo, yp = ours.matmul(x), plain.matmul(x)
            yg = peer().copy() if peer else None
            to, tp, tg = [], [], []
            for rep in range(args.repeats):
                order = [("o", ours), ("p", plain)] + ([("g", peer)] if peer else [])
                if rep % 2:
                    order.reverse()
                for k, eng in order:
                    dt = _timed(eng if k == "g" else (lambda e=eng: e.matmul(x)))
                    {"o": to, "p": tp, "g": tg}[k].append(dt)
            mb = raw.nbytes / 1e6
            o, p = min(to), min(tp)
            line = (f"{tname:7s} {mname:8s} {rows:>6d} x {cols:<6d} {mb:7.1f} | {o * 1e3:8.3f} "
                    f"{mb / 1e3 / o:5.1f} {p * 1e3:8.3f} |")
            if peer:
                g = min(tg)
                same = np.array_equal(yp.view(np.uint32), yg.view(np.uint32))
                line += f" {g * 1e3:8.3f} {mb / 1e3 / g:5.1f} {g / o:8.2f}x {'=' if same else 'DIFF':>4s}"
                peer.close()
            print(line, flush=True)
            del yo
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
