"""Parity and bench tools of the native mat-vec and expert kernels.

* `run_parity_mmvq(quick)`: every native type × 1..8 columns × rows per
  warp {plain, 1, 2, 4} × row counts around 2048/4096/8192/12288 × K (odd K
  224 and 2880 for the 32-value types), bitwise (u32, NaN canonical) against
  routes/mmvq.py, plus the q8_1 quantizer against routes/q8_1.py; no
  non-finite output on sane blocks (routes/mmvq_inputs.py).
* `run_parity_experts(quick)`: expert modes 0 and 8 against
  routes/experts.moe_ffn, bitwise, random and real-model shapes.
* `run_bench_mmvq(emit_table)`: 1-column mat-vec against the device copy
  bandwidth; with `emit_table`, the rows-per-warp table cells (fastest rows
  value if >= 3 % faster than the plain kernel, else 0), printed in the
  format of strata_ref/native/mmvq_tables.py.
* `run_bench_experts()`: mode 0 against mode 8 (and their bitwise equality).

Each returns a process exit status: 0 all good, 1 a mismatch, 2 no GPU.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from ..numerics import canonicalize_nan
from ..routes.experts import moe_ffn
from ..routes.mmvq import mmvq
from ..routes.mmvq_inputs import sane_blocks
from ..routes.q8_1 import quantize_q8_1
from ..types import GGMLType, block_format
from .loader import NativeUnavailable, unavailable_line
from .mmvq import NATIVE_TYPES, experts_native, load_mmvq, quantize_q8_1_native
from .mmvq_tables import IL_TYPES, LEGAL_ROWS

__all__ = ["run_parity_mmvq", "run_parity_experts", "run_bench_mmvq", "run_bench_experts"]

T = GGMLType
SEED = 20261130


#: smv_set_plain_kernel's kinds by name
PLAIN_KERNELS = {0: "auto", 1: "plain/1", 2: "plain/2", 3: "lanes"}


def _bits(a: np.ndarray) -> np.ndarray:
    return canonicalize_nan(np.asarray(a, np.float32)).view(np.uint32)


def _load(out, tool: str):
    """The native mat-vec library, or None after one line on stderr naming
    the tool (e.g. "parity mmvq") and why it is unavailable
    (`loader.unavailable_line`)."""
    try:
        return load_mmvq()
    except NativeUnavailable as e:
        print(unavailable_line(tool, e), file=sys.stderr)
        return None


def _shapes(t, quick: bool):
    """(rows, K) cases. Row counts straddle the table's class bounds and end
    in partial warp groups (rows % 4 != 0); K is odd where the type allows
    (224 = 7 blocks, 2880 = 90 blocks). Small K keeps the oracle's time down:
    the row count only picks the table class and the last partial group.
    5003 rows of the big K is more rows than one pass of the 1-column lanes
    kernel's resident warps on an H200, so its warps walk several rows with a
    block count (10) that is not a multiple of their iteration stride."""
    if block_format(t).block_values == 32:
        small, big = 224, 2880
    else:
        small, big = 512, 2560
    if quick:
        return [(67, small), (259, big)]
    return [(2047, small), (2051, small), (4099, small), (8195, small // 2 if small > 256 else small),
            (12289, 256 if small > 256 else small), (517, big), (5003, big)]


def _q8_parity(nat, rng, out) -> tuple[int, int]:
    # random, .5-boundary, zero, tiny, huge (fp16 sum overflow) blocks,
    # non-finite ones (one NaN value, all NaN, one Inf, +Inf and -Inf, one
    # signalling NaN), and subnormal ones whose x/d leaves the int8 range
    # (exactly or after rounding) or is +-Inf (d = 0)
    x = rng.standard_normal(32 * 4096).astype(np.float32)
    x[:32 * 64] = (rng.integers(-127, 128, 32 * 64) + 0.5).astype(np.float32)
    x[32 * 64:32 * 65] = 0.0
    x[32 * 65:32 * 66] = 1e-30
    x[32 * 66:32 * 67] = 3000.0
    x[32 * 67:32 * 68] = rng.uniform(-1e5, 1e5, 32).astype(np.float32)
    x[32 * 68 + 5] = np.nan
    x[32 * 69:32 * 70] = np.nan
    x[32 * 70 + 9] = np.inf
    x[32 * 71 + 3], x[32 * 71 + 30] = np.inf, -np.inf
    tiny = np.float32(2.0 ** -149)
    x[32 * 72:32 * 73] = rng.integers(-200, 201, 32) * tiny
    x[32 * 72] = 190 * tiny
    x[32 * 73:32 * 74] = rng.integers(-1, 2, 32) * tiny
    x[32 * 73] = tiny
    x[32 * 74:32 * 75] = rng.integers(-1000, 1001, 32) * tiny   # d = 8·2^-149: x/d rounds
    x[32 * 74] = 1000 * tiny
    x[32 * 75:32 * 76] = rng.standard_normal(32)
    x.view(np.uint32)[32 * 75 + 7] = 0x7FA00000                  # a signalling NaN
    ref = quantize_q8_1(x)
    got = quantize_q8_1_native(x, nat)
    bad = int(np.sum(np.any(ref != got, axis=1)))
    if bad:
        out(f"q8_1: {bad} of {len(ref)} blocks differ")
    return len(ref), bad


def _mmvq_case(args):
    """Inputs and oracle output of one (type, rows, K) case, seeded: run in
    worker processes (the oracle is the slow part)."""
    t, rows, k, seed = args
    rng = np.random.default_rng(seed)
    fmt = block_format(t)
    w = sane_blocks(t, rows * k // fmt.block_values, rng).reshape(rows, -1)
    q8 = quantize_q8_1(rng.standard_normal((8, k)).astype(np.float32)).reshape(8, -1, 36)
    return t, rows, k, w, q8, _bits(mmvq(t, w, q8))


def _pool_map(fn, jobs):
    import multiprocessing as mp
    import os
    from concurrent.futures import ProcessPoolExecutor
    n = max(1, min(len(jobs), (os.cpu_count() or 1)))
    # spawn workers re-import the caller's __main__: call the parity tools
    # from the CLI or a script with an `if __name__ == "__main__"` guard
    if n == 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(fn, jobs))


def run_parity_mmvq(quick: bool = False, out=print) -> int:
    """Bitwise parity of the native q8_1 quantizer and mat-vec kernels."""
    nat = _load(out, "parity mmvq")
    if nat is None:
        return 2
    rng = np.random.default_rng(SEED)
    n_q8, bad_q8 = _q8_parity(nat, rng, out)
    cases = fails = nonfinite = 0
    t0 = time.time()
    jobs = [(t, rows, k, SEED + 1000 * i + j) for i, t in enumerate(NATIVE_TYPES)
            for j, (rows, k) in enumerate(_shapes(t, quick))]
    for t, rows, k, w, q8, ref in _pool_map(_mmvq_case, jobs):
        dw, dq = nat.put(w), nat.put(q8)
        dy = nat.alloc(8 * rows * 4)
        yp = nat.ffi.cast("float *", dy.ptr)
        # arms: (columns, rows per warp, 1-column kernel of rows per warp 0:
        # 0 automatic, 1/2 plain with 1/2 rows per block, 3 lanes)
        arms = [(ncols, rpw, 0) for ncols in range(1, 9) for rpw in LEGAL_ROWS]
        arms += [(1, 0, pk) for pk in (1, 2)]
        if nat.lib.smv_has_lanes(int(t)):
            arms.append((1, 0, 3))
        for ncols, rpw, pk in arms:
            nat.check(nat.lib.smv_set_plain_kernel(pk), "plain kernel")
            nat.check(nat.lib.smv_mmvq(int(t), dw.ptr, rows, k, dq.ptr, ncols, yp, rpw,
                                       nat.ffi.NULL), f"mmvq {t.name}")
            nat.lib.smv_set_plain_kernel(0)
            y = nat.get(dy, np.float32, ncols * rows).reshape(ncols, rows)
            cases += 1
            nonfinite += int(not np.isfinite(y).all())
            if not np.array_equal(_bits(y), ref[:ncols]):
                fails += 1
                n = int(np.sum(_bits(y) != ref[:ncols]))
                out(f"DIFFERS {t.name} rows={rows} K={k} ncols={ncols} rows/warp={rpw} "
                    f"1-column kernel={PLAIN_KERNELS[pk]}: {n} values")
    out(f"mmvq parity: {cases} mat-vec cases ({len(NATIVE_TYPES)} types, {len(jobs)} shapes), "
        f"{fails} differ, {nonfinite} with non-finite output; q8_1 {n_q8} blocks, {bad_q8} differ "
        f"({time.time() - t0:.0f} s)")
    ok = fails == 0 and bad_q8 == 0 and nonfinite == 0
    if ok:
        out("mmvq parity: OK (every type, 1-8 columns, plain (1-column: 1/2 rows per block, "
            "and the lanes kernel of Q4_K/Q6_K/IQ4_XS) and rows per warp 1/2/4, bitwise)")
    return 0 if ok else 1


def _experts_case(rng, n_exp, h, ff, t_gu, t_down, n_tok, k):
    mk = lambda t, rows, kk: sane_blocks(   # noqa: E731
        t, rows * kk // block_format(t).block_values, rng).reshape(rows, -1)
    gate = [mk(t_gu, ff, h) for _ in range(n_exp)]
    up = [mk(t_gu, ff, h) for _ in range(n_exp)]
    down = [mk(t_down, h, ff) for _ in range(n_exp)]
    x = rng.standard_normal((n_tok, h)).astype(np.float32)
    ids = np.stack([rng.permutation(n_exp)[:k] for _ in range(n_tok)]).astype(np.int32)
    wts = rng.dirichlet(np.ones(k), n_tok).astype(np.float32)
    return x, ids, wts, gate, up, down


#: (gate/up type, down type, H, FF): random shapes, then Strata's H = 2560,
#: FF = 640 expert shape (down in a 32-value type, FF not a multiple of 256)
EXPERT_CONFIGS = ((T.Q4_K, T.Q6_K, 1024, 512), (T.IQ4_XS, T.Q8_0, 2560, 640),
                  (T.Q4_0, T.Q5_0, 2560, 640), (T.Q5_K, T.IQ4_NL, 2048, 768))


def _experts_oracle(args):
    t_gu, t_down, h, ff, n_tok, k, seed = args
    case = _experts_case(np.random.default_rng(seed), 8, h, ff, t_gu, t_down, n_tok, k)
    return args, case, _bits(moe_ffn(*case, t_gu, t_down))


def run_parity_experts(quick: bool = False, out=print) -> int:
    """Expert modes 0 and 8 against the oracle, bitwise."""
    nat = _load(out, "parity experts")
    if nat is None:
        return 2
    configs = EXPERT_CONFIGS[:2] if quick else EXPERT_CONFIGS
    tokens = ((1, 2), (3, 4)) if quick else ((1, 1), (1, 8), (3, 4))
    jobs = [(*c, n_tok, k, SEED + 7 * i + j) for i, c in enumerate(configs)
            for j, (n_tok, k) in enumerate(tokens)]
    cases = fails = 0
    for (t_gu, t_down, h, ff, n_tok, k, _), case, ref in _pool_map(_experts_oracle, jobs):
        for mode in (0, 8):
            got = _bits(experts_native(mode, *case, t_gu, t_down, nat=nat))
            cases += 1
            if not np.array_equal(got, ref):
                fails += 1
                out(f"DIFFERS mode {mode} {t_gu.name}/{t_down.name} H={h} FF={ff} "
                    f"tokens={n_tok} k={k}: {int(np.sum(got != ref))} values")
    out(f"experts parity: {cases} cases (modes 0 and 8), {fails} differ")
    return 0 if fails == 0 else 1


def _time_mmvq(nat, t, dw, nbuf, rows, k, dq, ncols, dy, rpw, iters):
    """Mean ms per call; call i reads weight copy i % nbuf of the buffer dw."""
    ms = nat.ffi.new("float *")
    nat.check(nat.lib.smv_time_mmvq(int(t), dw.ptr, dw.nbytes // nbuf, nbuf, rows, k, dq.ptr,
                                    ncols, nat.ffi.cast("float *", dy.ptr), rpw, iters, ms),
              "time")
    return float(ms[0])


def _copy_bw(nat, nbytes=1 << 30, iters=20) -> float:
    a, b = nat.alloc(nbytes), nat.alloc(nbytes)
    ms = nat.ffi.new("float *")
    nat.check(nat.lib.smv_time_copy(b.ptr, a.ptr, nbytes, iters, ms), "copy")
    return 2 * nbytes / (ms[0] * 1e-3)        # bytes read + written per second


#: the bench rotates over weight copies of at least this many bytes together,
#: several times the L2 (50 MB on an H100/H200), so each call reads DRAM
COLD_BYTES = 256 << 20


def _bench_cell(nat, rng, t, rows, k, ncols, iters, hot=False):
    """{rows per warp: ms per call}, weight bytes. Weights L2-cold (calls
    rotate over COLD_BYTES of copies). With `hot` also, in this order:
    {rows per warp: ms} of calls that all read one copy (partly L2-resident);
    the ms of the read-only peer kernel over the same cold copies; and the
    default arm's and the peer's ms when the calls are replayed from a CUDA
    graph (`_graph_ms`)."""
    fmt = block_format(t)
    w = sane_blocks(t, rows * k // fmt.block_values, rng).reshape(rows, -1)
    nbuf = -(-COLD_BYTES // w.nbytes)
    dw = nat.alloc(nbuf * w.nbytes)
    for i in range(nbuf):
        nat.check(nat.lib.smv_memcpy_htod(nat.ffi.cast("char *", dw.ptr) + i * w.nbytes,
                                          nat.ffi.from_buffer(w), w.nbytes), "copy in")
    q8 = quantize_q8_1(rng.standard_normal((ncols, k)).astype(np.float32))
    dq, dy = nat.put(q8), nat.alloc(ncols * rows * 4)
    cold = _time_arms(nat, t, dw, nbuf, rows, k, dq, ncols, dy, iters)
    if not hot:
        return cold, w.nbytes
    read = lambda: _time_read(nat, dw, w.nbytes, nbuf, iters)   # noqa: E731
    default = lambda: _time_mmvq(nat, t, dw, nbuf, rows, k, dq, ncols, dy, 0, iters)  # noqa: E731
    one = _DevView(dw.ptr, w.nbytes)
    return (cold, w.nbytes, _time_arms(nat, t, one, 1, rows, k, dq, ncols, dy, iters), read(),
            _graph_ms(nat, default), _graph_ms(nat, read))


def _time_read(nat, dw, nbytes, nbuf, iters):
    """Mean ms per call of the read-only peer over the first nbytes (rounded
    down to 16) of each of the nbuf copies in dw, rotating."""
    ms = nat.ffi.new("float *")
    nat.check(nat.lib.smv_time_read(dw.ptr, nbytes, nbuf, nbytes // 16 * 16, iters, ms),
              "time read")
    return float(ms[0])


def _graph_ms(nat, timed):
    """timed() with the timing helpers in CUDA-graph mode (smv_set_time_graph)."""
    nat.check(nat.lib.smv_set_time_graph(1), "graph timing")
    try:
        return timed()
    finally:
        nat.lib.smv_set_time_graph(0)


def _time_arms(nat, t, dw, nbuf, rows, k, dq, ncols, dy, iters):
    """{rows per warp: ms}; for one column also the 1-column kernels of rows
    per warp 0 by name ("plain/1", "plain/2", "lanes"; key 0 is the automatic
    choice)."""
    res = {rpw: _time_mmvq(nat, t, dw, nbuf, rows, k, dq, ncols, dy, rpw, iters)
           for rpw in LEGAL_ROWS}
    if ncols == 1:
        kinds = (1, 2, 3) if nat.lib.smv_has_lanes(int(t)) else (1, 2)
        try:
            for pk in kinds:
                nat.check(nat.lib.smv_set_plain_kernel(pk), "plain kernel")
                res[PLAIN_KERNELS[pk]] = _time_mmvq(nat, t, dw, nbuf, rows, k, dq, 1, dy, 0, iters)
        finally:
            nat.lib.smv_set_plain_kernel(0)
    return res


class _DevView:
    """The first `nbytes` of a device buffer (not owned)."""

    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes


#: 1-column bench shapes (rows, K): a 7-8B model's FFN (4096 x 14336 and
#: back) and a 70B model's (8192 x 28672 and back)
BENCH_SHAPES = ((4096, 14336), (14336, 4096), (8192, 28672), (28672, 8192))

#: one shape per row class for --emit-table (K = 2560, kernels.md §13)
TABLE_ROWS = (1024, 2560, 6144, 10240, 12288)


def run_bench_mmvq(emit_table: bool = False, out=print) -> int:
    """1-column mat-vec bandwidth against the device copy; optionally the
    rows-per-warp table cells."""
    nat = _load(out, "bench mmvq")
    if nat is None:
        return 2
    rng = np.random.default_rng(SEED + 2)
    bw = _copy_bw(nat)
    out(f"device copy: {bw / 1e12:.2f} TB/s (bytes read + written); mat-vec weights L2-cold "
        f"(calls rotate over {COLD_BYTES >> 20} MiB of copies)")
    out("'default' is what smv_mmvq runs for 1 column (rows_per_warp 0); 'read' is a read-only "
        "kernel over the same cold bytes; 'graph' times the same cold calls replayed from one "
        "CUDA graph (no host launch gaps, as decode engines run a step)")
    out("'/read' is the default's speed as a fraction of the read-only kernel's (issue 20's "
        "goal: >= 0.90 on every shape, both timings)")
    out("type    rows x K       | cold: default us  GB/s  % of copy | best us (arm)  % of copy "
        "| read us  % of copy  /read | graph: default us  % | read us  %  /read "
        "| one copy (L2-warm): default us")
    ratios = []
    for t in (T.Q4_K, T.Q6_K, T.IQ4_XS):
        for rows, k in BENCH_SHAPES:
            times, nbytes, warm, read_ms, g_ms, g_read = _bench_cell(nat, rng, t, rows, k, 1, 200,
                                                                     hot=True)
            best = min(times, key=times.get)
            pct = lambda ms: 100 * nbytes / (ms * 1e-3) / bw   # noqa: E731
            out(f"{t.name:7s} {rows:5d} x {k:5d} |    {times[0] * 1e3:8.1f}  "
                f"{nbytes / (times[0] * 1e-3) / 1e9:5.0f}  {pct(times[0]):8.1f} | "
                f"{times[best] * 1e3:6.1f} ({best})  {pct(times[best]):5.1f} | "
                f"{read_ms * 1e3:6.1f}  {pct(read_ms):5.1f}  {read_ms / times[0]:5.2f} | "
                f"{g_ms * 1e3:11.1f}  {pct(g_ms):5.1f} | {g_read * 1e3:6.1f}  {pct(g_read):5.1f}  "
                f"{g_read / g_ms:5.2f} | {warm[0] * 1e3:8.1f}")
            ratios.append((t.name, rows, k, read_ms / times[0], g_read / g_ms, pct(times[0]),
                           pct(g_ms)))
            out("        every arm, cold us: " + ", ".join(f"{a}: {v * 1e3:.1f}" for a, v in times.items()))
    for name in dict.fromkeys(r[0] for r in ratios):
        mine = [r for r in ratios if r[0] == name]
        big = [r for r in mine if r[1] * r[2] >= 8192 * 28672]
        out(f"{name}: default / read-only {min(min(r[3], r[4]) for r in mine):.2f}-"
            f"{max(max(r[3], r[4]) for r in mine):.2f} (stream and graph, every shape); "
            f"70B shapes {min(min(r[5], r[6]) for r in big):.1f}-"
            f"{max(max(r[5], r[6]) for r in big):.1f} % of copy")
    if emit_table:
        out("// emitted by strata-ref bench mmvq --emit-table (K = 2560, 200 reps per arm)")
        for t in IL_TYPES:
            cells = []
            for ncols in (2, 3, 4):
                row = []
                for rows in TABLE_ROWS:
                    times, _ = _bench_cell(nat, rng, t, rows, 2560, ncols, 200)
                    best = min((r for r in LEGAL_ROWS if r), key=times.get)   # ncols >= 2
                    row.append(best if times[best] <= 0.97 * times[0] else 0)
                cells.append("(" + ", ".join(map(str, row)) + ")")
            out(f"    T.{t.name}: ({', '.join(cells)}),")
    return 0


def run_bench_experts(out=print) -> int:
    """Expert mode 0 against mode 8 on Strata's expert shape (H 2560, FF 640)."""
    nat = _load(out, "bench experts")
    if nat is None:
        return 2
    rng = np.random.default_rng(SEED + 3)
    status = 0
    for t_gu, t_down, h, ff in EXPERT_CONFIGS[1:3]:
        for n_tok, k in ((1, 8), (4, 8)):
            x, ids, wts, gate, up, down = _experts_case(rng, 32, h, ff, t_gu, t_down, n_tok, k)
            bufs = [nat.put(np.stack(m)) for m in (gate, up, down)]
            dx, di, dw = nat.put(x), nat.put(ids.astype(np.int32)), nat.put(wts)
            outs = {m: nat.alloc(x.nbytes) for m in (0, 8)}
            scratch = nat.alloc(nat.lib.smv_experts_scratch_bytes(h, ff, n_tok, k))
            f = nat.ffi
            res = {}
            for mode in (0, 8, 0, 8):
                ms = f.new("float *")
                nat.check(nat.lib.smv_time_experts(
                    mode, int(t_gu), int(t_down), bufs[0].ptr, bufs[1].ptr, bufs[2].ptr, h, ff,
                    f.cast("float *", dx.ptr), n_tok, f.cast("int *", di.ptr),
                    f.cast("float *", dw.ptr), k, f.cast("float *", outs[mode].ptr), scratch.ptr,
                    200, ms), "time experts")
                res[mode] = min(res.get(mode, 1e30), float(ms[0]))
            same = np.array_equal(_bits(nat.get(outs[0], np.float32, x.size)),
                                  _bits(nat.get(outs[8], np.float32, x.size)))
            status |= 0 if same else 1
            out(f"experts {t_gu.name}/{t_down.name} H={h} FF={ff} tokens={n_tok} k={k}: "
                f"mode 0 {res[0] * 1e3:.1f} us, mode 8 {res[8] * 1e3:.1f} us "
                f"({res[0] / res[8]:.2f}x), {'bitwise equal' if same else 'DIFFERS'}")
    return status
