"""Prompt-path projection time on the GPU: dequant vs GEMM, per route.

For the dense projection shapes of the registry's models
(`strata_ref.native.gemm.parity.model_shapes`) and chunk sizes T, with W in
Q8_0 (every shape) and Q4_K (shapes with K % 256 == 0), it times with CUDA
events (median of `--reps` replays of a CUDA graph holding a batch of calls,
after warm-up, so that Python's per-call cost is not timed):

* the dequant of all of W to f16 with the generic and the wide kernel
  (`native.dequant_device`, kernel forced), and its GB/s (bytes read plus
  written) against the 4.25 TB/s copy ceiling of kernels.md §1;
* the GEMM of each route over the f16 weights (`gemm_dense_device`): the
  FP16-operand route (cublasGemmEx) and the FP32 route (widening + Sgemm),
  and their TFLOP/s (2·T·N·K per call);
* the dequant share of the prompt projection time, wide dequant / (wide
  dequant + FP16-route GEMM), per shape and summed over one layer's seven
  projections (q, k, v, o, gate, up, down) of each model;
* per layer (types whose block size divides every K), the dequant of the
  seven projections to f16 three ways: the sum of the single calls above
  (seven launches), the seven single wide launches back to back in one
  stream, and one launch for all seven (`native.gemm.wrapper.dequant_weights_f16`,
  i.e. `dequant_device_many`); both layouts are checked to give the same
  bits. The layer table shows the dequant share with seven launches and with
  one launch.

Goal (issue 5): dequant share <= 10 % at T = 4096 with the wide kernels.
Needs CuPy and the native libraries. Usage:
  python -m strata_ref.native.gemm.bench [--T 1,512,4096,16384] [--types Q8_0,Q4_K] [--reps 3]
                             [--skip-heads]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

COPY_CEILING = 4.25e12          # bytes/s read + written, kernels.md §1 (H200)
LAYER = {"q,o": 2, "k,v": 2, "gate,up": 2, "down": 1}


def _timer(cp, fn, reps: int, budget_s: float = 0.02) -> float:
    """Median GPU seconds per call of fn(stream).

    A Python call costs tens of µs, more than a small kernel, so timing
    launches from Python measures the host. The calls are therefore captured
    into a CUDA graph (a batch of as many calls as fit in about budget_s)
    and the graph's replays are timed with events: `reps` replays, median.
    If capture is refused, the batch is timed as launched (host-bound for
    small shapes; the table marks such rows with *)."""
    s = cp.cuda.Stream(non_blocking=True)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    fn(s)                                         # warm-up: buffers, cuBLAS heuristics
    start.record(s)
    fn(s)
    stop.record(s)
    stop.synchronize()
    once = max(cp.cuda.get_elapsed_time(start, stop) * 1e-3, 1e-6)
    batch = int(min(max(budget_s / once, 1), 100))
    graph = None
    try:
        mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", None)
        s.begin_capture(mode) if mode is not None else s.begin_capture()
        try:
            for _ in range(batch):
                fn(s)
        finally:
            graph = s.end_capture()
        graph.launch(s)
        s.synchronize()
    except Exception as e:                        # noqa: BLE001 - any capture failure
        _timer.fallbacks.append(repr(e))
        graph = None
    times = []
    for _ in range(reps):
        start.record(s)
        if graph is not None:
            graph.launch(s)
        else:
            for _ in range(batch):
                fn(s)
        stop.record(s)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3 / batch)
    return statistics.median(times)


_timer.fallbacks = []


def _layer_dequant(cp, shapes: dict, t, reps: int, rng) -> tuple[float, float]:
    """GPU seconds to dequantize one layer's seven projections of type t to
    f16 with the wide kernel: (seven single launches in one stream, one
    launch for all). shapes: projection group -> (N, K), as LAYER counts.
    Exits when the one launch did not run as one, or differs in a bit from
    the single launches."""
    from strata_ref.native import dequant_device
    from strata_ref.native.dequant.parity import make_blocks
    from strata_ref.native.gemm.wrapper import dequant_weights_f16
    from strata_ref.types import block_format

    qk = block_format(t).block_values
    weights = []
    for proj, count in LAYER.items():
        n, k = shapes[proj]
        for _ in range(count):
            raw = make_blocks(t, n * k // qk, "sane", rng).reshape(-1)
            weights.append((t, cp.asarray(raw), n, k))
    scratch = cp.zeros(sum(-(-n * k // 8) * 8 for _, _, n, k in weights), cp.float16)
    res = dequant_weights_f16(weights, scratch, kernel="wide")
    if len(res.runs) != 1 or not res.runs[0].one_launch:
        raise SystemExit(f"{t.name} layer: not one launch ({[r.reason for r in res.runs]})")
    one = cp.asnumpy(scratch).view(np.uint16)
    scratch.fill(0)
    for (wt, b, n, k), v in zip(weights, res.views):
        if dequant_device(wt, b, n, k, v, kernel="wide").kernel != "wide":
            raise SystemExit(f"{t.name} {n}x{k}: the single wide kernel did not run")
    if not np.array_equal(cp.asnumpy(scratch).view(np.uint16), one):
        raise SystemExit(f"{t.name} layer: one launch and single launches differ")

    def seven(s):
        for (wt, b, n, k), v in zip(weights, res.views):
            dequant_device(wt, b, n, k, v, kernel="wide", stream=s)

    t_seq = _timer(cp, seven, reps)
    t_one = _timer(cp, lambda s: dequant_weights_f16(weights, scratch, kernel="wide", stream=s), reps)
    return t_seq, t_one


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", default="1,512,4096,16384")
    ap.add_argument("--types", default="Q8_0,Q4_K")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--skip-heads", action="store_true", help="leave out the output heads")
    args = ap.parse_args(argv)
    import cupy as cp

    from strata_ref.native import dequant_device
    from strata_ref.native.dequant.parity import make_blocks
    from strata_ref.native.gemm.parity import f16_activations, model_shapes
    from strata_ref.native.gemm.wrapper import cublas_version, gemm_dense_device
    from strata_ref.types import block_format, parse_type

    ts = [int(v) for v in args.T.split(",")]
    types = [parse_type(v) for v in args.types.split(",")]
    rng = np.random.default_rng(args.seed)
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"bench_gemm: {name}, cuBLAS {cublas_version()}, median of {args.reps} batches")
    print("| model shape | N x K | type | T | dequant generic µs | dequant wide µs | wide GB/s "
          "(% of copy) | FP16 route µs | TFLOP/s | FP32 route µs | TFLOP/s | dequant share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    xmax = max(ts)
    layer = {}                                  # (model, type, T) -> [dequant, gemm]
    layer_shapes = {}                           # model -> {projection group: (N, K)}
    for label, n, k, head in model_shapes():
        model, proj = label.rsplit(" ", 1)
        if proj in LAYER:
            layer_shapes.setdefault(model, {})[proj] = (n, k)
        if head and args.skip_heads:
            continue
        x = cp.asarray(f16_activations(xmax, k, rng))
        y = cp.empty((xmax, n), cp.float32)
        w16 = cp.empty(n * k, cp.float16)
        for t in types:
            fmt = block_format(t)
            if k % fmt.block_values:
                continue
            blocks = cp.asarray(make_blocks(t, n * k // fmt.block_values, "sane", rng).reshape(-1))
            for kern in ("generic", "wide"):
                ran = dequant_device(t, blocks, n, k, w16, kernel=kern).kernel
                if ran != kern:
                    raise SystemExit(f"{t.name} {n}x{k}: the {kern} kernel did not run ({ran})")
            tg = _timer(cp, lambda s: dequant_device(t, blocks, n, k, w16, kernel="generic", stream=s),
                        args.reps)
            tw = _timer(cp, lambda s: dequant_device(t, blocks, n, k, w16, kernel="wide", stream=s),
                        args.reps)
            moved = blocks.size + 2 * n * k
            for T in ts:
                xt, yt = x[:T], y[:T]
                t16 = _timer(cp, lambda s: gemm_dense_device(w16, n, k, xt, yt, route="f16", stream=s),
                             args.reps)
                t32 = _timer(cp, lambda s: gemm_dense_device(w16, n, k, xt, yt, route="f32", stream=s),
                             args.reps)
                flop = 2.0 * T * n * k
                share = tw / (tw + t16)
                print(f"| {label} | {n} x {k} | {t.name} | {T} | {tg * 1e6:.1f} | {tw * 1e6:.1f} | "
                      f"{moved / tw / 1e9:.0f} ({100 * moved / tw / COPY_CEILING:.0f} %) | "
                      f"{t16 * 1e6:.1f} | {flop / t16 / 1e12:.1f} | {t32 * 1e6:.1f} | "
                      f"{flop / t32 / 1e12:.1f} | {100 * share:.1f} % |", flush=True)
                model, proj = label.rsplit(" ", 1)
                if proj in LAYER:
                    acc = layer.setdefault((model, t.name, T), [0.0, 0.0, set()])
                    acc[0] += LAYER[proj] * tw
                    acc[1] += LAYER[proj] * t16
                    acc[2].add(proj)
            del blocks
        del x, y, w16
        cp.get_default_memory_pool().free_all_blocks()
    if _timer.fallbacks:
        print(f"\nCUDA graph capture refused {len(_timer.fallbacks)} times (those rows are "
              f"host-bound): {_timer.fallbacks[0]}")
    layer_dq = {}                               # (model, type) -> (7 in one stream, one launch)
    for model, shapes in layer_shapes.items():
        for t in types:
            if all(k % block_format(t).block_values == 0 for _, k in shapes.values()):
                layer_dq[(model, t.name)] = _layer_dequant(cp, shapes, t, args.reps, rng)
                cp.get_default_memory_pool().free_all_blocks()
    print("\nOne layer's seven projections (q, k, v, o, gate, up, down; wide dequant to f16 + "
          "FP16 route). Dequant µs: the sum of the single calls above (7 launches), the 7 "
          "single launches back to back in one stream, and one launch for all 7 "
          "(dequant_weights_f16 -> dequant_device_many):")
    print("| model | type | T | dequant µs, 7 launches (sum) | 7 launches, one stream | "
          "one launch | GEMM µs | dequant share, 7 launches | dequant share, one launch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (model, tname, T), (dq, gm, projs) in sorted(layer.items()):
        if len(projs) == len(LAYER) and (model, tname) in layer_dq:
            seq, one = layer_dq[(model, tname)]
            print(f"| {model} | {tname} | {T} | {dq * 1e6:.1f} | {seq * 1e6:.1f} | {one * 1e6:.1f} | "
                  f"{gm * 1e6:.1f} | {100 * dq / (dq + gm):.1f} % | {100 * one / (one + gm):.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
