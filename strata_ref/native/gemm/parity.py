"""gemm_f32_parity: both prompt-path GEMM routes against the oracle on the GPU.

../shared/spec/kernels.md §13. For the dense projection shapes of the
registry's models and for the shape set of Strata's `gemm_bf16_parity`:

* every chunk size T of the sweep (quick: 200 sizes from 1 to 4096; full:
  every T from 1 to 5,120, the models' output heads keeping the quick set)
  runs both routes over the same f16 operands (Q8_0 weights dequantized by
  the oracle, f16 activations). Each route's worst |y − oracle| as a
  fraction of `routes.gemm.error_bound` must be <= 1; the number of sizes at
  which the two routes are bitwise equal is reported, as a property of the
  cuBLAS build that ran (its version is printed), never asserted;
* the prompt path (`gemm_device`: native dequant into the scratch, one GEMM
  per slice) unsliced must equal, bit for bit, the GEMM over the
  oracle-dequantized weights (same operands, same call); sliced by several
  scratch budgets it must stay within the bound, and whether each slicing is
  bitwise equal to the unsliced result of the same route is reported;
* each shape of Strata's set runs twice, the second time accumulating
  (beta = 1) the product of the low part of X (x − f16(x), rounded to f16)
  onto the first result; columns past N of a wider ldy must keep their
  guard value.

The oracle's value: the operands are `routes.gemm.operands` (exact float64);
their product is formed on the GPU in float64 (cuBLAS DGEMM: exact products,
float64 sums in some order, like the NumPy oracle, whose own error
K·2^-53·S the bound includes) and rounded once to float32. A sample of rows
is checked against `routes.gemm.gemm` on the CPU.

Needs CuPy (on the GPU machine) and the native library. Exit status 0: every
bound, guard and bitwise-plumbing check held; 1: one failed; 2: not runnable.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ...routes import gemm as G

__all__ = ["MODEL_DIMS", "model_shapes", "SPEC_SHAPES", "quick_sizes", "full_sizes", "NativeBackend",
           "q8_0_weights", "f16_activations", "slice_rows_set", "run_parity_gemm"]

#: (n_embd, n_ff, n_kv = n_head_kv·head_dim, vocab) of the registry's models
#: (their GGUF metadata: SmolLM2-135M and Qwen2.5-0.5B / Coder-0.5B).
MODEL_DIMS = {"SmolLM2-135M": (576, 1536, 192, 49152),
              "Qwen2.5-0.5B": (896, 4864, 128, 151936)}

#: Strata's gemm_bf16_parity set: (T, N, K, ldy or None).
SPEC_SHAPES = ((4096, 320, 10240, None), (4096, 10240, 320, None), (777, 2560, 2560, None),
               (512, 512, 2560, None), (300, 4, 10240, None), (2048, 1, 2560, None),
               (333, 128, 2560, 136))

GUARD = np.float32(-12345.0)
FULL_T = 5120
QUICK_T_MAX = 4096


def model_shapes() -> list[tuple[str, int, int, bool]]:
    """(label, N, K, is_head) of each distinct dense projection: q/o
    (n_embd x n_embd), k/v (n_kv x n_embd), gate/up (n_ff x n_embd), down
    (n_embd x n_ff) and the output head (vocab x n_embd)."""
    out = []
    for name, (e, ff, kv, vocab) in MODEL_DIMS.items():
        out += [(f"{name} q,o", e, e, False), (f"{name} k,v", kv, e, False),
                (f"{name} gate,up", ff, e, False), (f"{name} down", e, ff, False),
                (f"{name} head", vocab, e, True)]
    return out


def quick_sizes() -> list[int]:
    """200 chunk sizes: every T in 1..64, then 136 sizes spread
    geometrically to 4096 (odd neighbours where rounding collides)."""
    sizes = set(range(1, 65))
    for v in np.geomspace(65, QUICK_T_MAX, 136):
        t = int(round(v))
        while t in sizes:
            t += 1
        sizes.add(min(t, QUICK_T_MAX))
    s = sorted(sizes)
    while len(s) < 200:                                  # collisions at the top end
        s.append(QUICK_T_MAX - len(s))
        s = sorted(set(s))
    return s[:200]


def full_sizes() -> list[int]:
    """Every chunk size T from 1 to 5,120."""
    return list(range(1, FULL_T + 1))


def q8_0_weights(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Q8_0 bytes of an N x K weight: scales d uniform in [1e-3, 2e-2] (as
    f16), codes uniform in [-127, 127]; d·q rounds to f16 with full
    mantissas. K must be a multiple of 32."""
    nb = n * k // 32
    blocks = np.empty((nb, 34), np.uint8)
    d = rng.uniform(1e-3, 2e-2, nb).astype(np.float16)
    blocks[:, :2] = d.view(np.uint8).reshape(nb, 2)
    blocks[:, 2:] = rng.integers(-127, 128, (nb, 32)).astype(np.int8).view(np.uint8)
    return blocks.reshape(-1)


def f16_activations(t: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """(T, K) f16 activations, normal with σ = 1 and one large column in 16
    (σ = 30), as after an RMS norm with outlier channels."""
    x = rng.standard_normal((t, k), np.float32)
    x[:, ::16] *= 30.0
    return x.astype(np.float16)


def slice_rows_set(n: int, max_slices: int = 2000) -> list[int]:
    """Rows per slice to try for N rows: N/2, N/3 + 1, 256, 100, 17 and 1,
    keeping those below N with at most `max_slices` slices."""
    cand = [-(-n // 2), n // 3 + 1, 256, 100, 17, 1]
    return sorted({r for r in cand if 1 <= r < n and -(-n // r) <= max_slices}, reverse=True)


@dataclass
class _Tally:
    out: object
    failures: list = field(default_factory=list)

    def fail(self, what: str) -> None:
        self.failures.append(what)
        self.out(f"  FAIL {what}")


class NativeBackend:
    """The routes under test: `gemm.gemm_dense_device` and `gemm.gemm_device`
    (Q8_0 weights) on the local GPU. A CPU test substitutes a stand-in with
    the same four members to exercise the harness."""

    def __init__(self):
        from . import wrapper as NG
        self.NG = NG
        self.cc = NG.load_gemm().cc

    def cublas_version(self) -> int:
        return self.NG.cublas_version()

    def dense(self, route, w16, n, k, x, y, ldy=None, beta=0) -> None:
        self.NG.gemm_dense_device(w16, n, k, x, y, route=route, ldy=ldy, beta=beta)

    def quant(self, route, wdev, n, k, x, y, scratch, scratch_elems, ldy=None, beta=0) -> None:
        self.NG.gemm_device("Q8_0", wdev, n, k, x, y, ldy=ldy, beta=beta, scratch=scratch,
                            scratch_elems=scratch_elems, route=route)


class _Runner:
    def __init__(self, cp, out, backend):
        self.cp, self.out, self.backend = cp, out, backend
        self.tally = _Tally(out)
        # max over entries of |y − ref| / bound; 1e300 for a NaN or a
        # non-zero difference where the bound is 0 (S = 0: exact zero).
        self.ratio = cp.ReductionKernel(
            "float32 y, float32 r, float64 bd", "float64 m",
            "(isnan(y) || isnan(r)) ? 1e300 : (bd > 0 ? fabs((double)y - (double)r) / bd"
            " : ((double)y == (double)r ? 0.0 : 1e300))",
            "max(a, b)", "m = a", "0", "strata_gemm_bound_ratio")

    # -- oracle -------------------------------------------------------------
    def reference(self, x16: np.ndarray, w_raw: np.ndarray, n: int, k: int,
                  y_old=None, w64_dev=None):
        """(ref f32, bound f64, W f64 on the device) of X·W^T (+ y_old)."""
        cp = self.cp
        xo, wo = G.operands("f16", x16, "Q8_0", w_raw, n, k)
        x64 = cp.asarray(xo)
        w64 = cp.asarray(wo) if w64_dev is None else w64_dev
        acc = x64 @ w64.T
        s = cp.abs(x64) @ cp.abs(w64).T
        if y_old is not None:
            old = y_old[:, :n].astype(cp.float64)
            acc += old
            s += cp.abs(old)
        coef = float(G.error_bound(k, 1.0))
        return acc.astype(cp.float32), s * coef, w64

    def check_oracle_sample(self, label, x16, w_raw, n, k, ref32) -> None:
        rows = min(4, x16.shape[0])
        cpu = G.gemm("f16", x16[:rows], "Q8_0", w_raw, n, k)
        gpu = self.cp.asnumpy(ref32[:rows])
        ulps = np.abs(cpu.view(np.int32).astype(np.int64) - gpu.view(np.int32).astype(np.int64))
        if ulps.max() > 1:
            self.tally.fail(f"{label}: the float64 reference differs from routes.gemm.gemm by "
                            f"{ulps.max()} ulp")

    # -- runs ---------------------------------------------------------------
    def dense(self, route, w16, n, k, x, y, ldy=None, beta=0):
        self.backend.dense(route, w16, n, k, x, y, ldy, beta)

    def quant(self, route, wdev, n, k, x, y, scratch, scratch_elems, ldy=None, beta=0):
        self.backend.quant(route, wdev, n, k, x, y, scratch, scratch_elems, ldy, beta)

    def worst(self, y, ref, bound, n) -> float:
        return float(self.ratio(y[:, :n], ref, bound))

    def bitwise(self, a, b) -> bool:
        cp = self.cp
        return bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


def _sweep(run: _Runner, label: str, n: int, k: int, sizes: list[int], rng) -> dict:
    """Both routes over the dense GEMM for every T in sizes; returns the
    per-shape summary and leaves what `_slicing` needs."""
    cp = run.cp
    t0 = time.perf_counter()
    tmax = max(sizes)
    w_raw = q8_0_weights(n, k, rng)
    x16 = f16_activations(tmax, k, rng)
    ref, bound, w64 = run.reference(x16, w_raw, n, k)
    run.check_oracle_sample(label, x16, w_raw, n, k, ref)
    w16 = w64.astype(cp.float16)                       # exact: the oracle's f16 values
    x = cp.asarray(x16)
    y16 = cp.empty((tmax, n), cp.float32)
    y32 = cp.empty((tmax, n), cp.float32)
    r16, r32, eq = [], [], []
    for t in sizes:
        run.dense("f16", w16, n, k, x[:t], y16[:t])
        run.dense("f32", w16, n, k, x[:t], y32[:t])
        r16.append(run.ratio(y16[:t], ref[:t], bound[:t]))
        r32.append(run.ratio(y32[:t], ref[:t], bound[:t]))
        eq.append(cp.array_equal(y16[:t].view(cp.uint32), y32[:t].view(cp.uint32)))
    r16 = cp.asnumpy(cp.stack(r16))
    r32 = cp.asnumpy(cp.stack(r32))
    eq = cp.asnumpy(cp.stack(eq))
    res = {"label": label, "n": n, "k": k, "sizes": len(sizes), "tmin": min(sizes),
           "tmax": tmax, "equal": int(eq.sum()), "worst16": float(r16.max()),
           "worst32": float(r32.max()), "t16": sizes[int(r16.argmax())],
           "t32": sizes[int(r32.argmax())]}
    for route, worst, t in (("f16", res["worst16"], res["t16"]), ("f32", res["worst32"], res["t32"])):
        if not worst <= 1.0:
            run.tally.fail(f"{label} {route} route: error {worst:.3g} x bound at T={t}")
    run.out(f"  {label:24s} N={n:6d} K={k:5d} T {min(sizes)}..{tmax} ({len(sizes)} sizes): "
            f"routes bitwise equal at {res['equal']}/{len(sizes)}; worst/bound f16 "
            f"{res['worst16']:.3g} (T={res['t16']}), f32 {res['worst32']:.3g} (T={res['t32']}) "
            f"[{time.perf_counter() - t0:.1f} s]")
    res.update(w_raw=w_raw, x=x, w16=w16, ref=ref, bound=bound)
    return res


def _slicing(run: _Runner, sh: dict, ts: list[int]) -> tuple[int, int]:
    """The prompt path over the native dequant, unsliced and sliced, at the
    chunk sizes ts; returns (bitwise-equal slicings, slicings)."""
    cp = run.cp
    t0 = time.perf_counter()
    n, k, label = sh["n"], sh["k"], sh["label"]
    wdev = cp.asarray(sh["w_raw"])
    scratch = cp.empty(n * k, cp.float16)
    equal = total = 0
    notes = []
    for t in ts:
        x, ref, bound = sh["x"][:t], sh["ref"][:t], sh["bound"][:t]
        for route in G.ROUTES:
            dense = cp.empty((t, n), cp.float32)
            run.dense(route, sh["w16"], n, k, x, dense)
            whole = cp.empty((t, n), cp.float32)
            run.quant(route, wdev, n, k, x, whole, scratch, n * k)
            if not run.bitwise(whole, dense):
                run.tally.fail(f"{label} T={t} {route}: prompt path (native dequant) is not "
                               "bitwise the GEMM over the oracle's f16 weights")
            for rows in slice_rows_set(n):
                part = cp.empty((t, n), cp.float32)
                run.quant(route, wdev, n, k, x, part, scratch, rows * k)
                w = run.worst(part, ref, bound, n)
                if not w <= 1.0:
                    run.tally.fail(f"{label} T={t} {route} rows/slice={rows}: {w:.3g} x bound")
                same = run.bitwise(part, whole)
                equal += same
                total += 1
                if not same:
                    notes.append(f"{route}:T={t}:rows={rows}")
    run.out(f"  {label:24s} slicing (T in {ts}, rows/slice {slice_rows_set(n)}): "
            f"{equal}/{total} bitwise equal to unsliced"
            + (f"; differ: {', '.join(notes[:8])}{' ...' if len(notes) > 8 else ''}" if notes else "")
            + f" [{time.perf_counter() - t0:.1f} s]")
    return equal, total


def _spec_shape(run: _Runner, t: int, n: int, k: int, ldy, rng) -> tuple[int, int]:
    """One shape of Strata's set: beta = 0, then beta = 1 with the low part
    of X, both routes, guard columns past N, and slicings of the first pass."""
    cp = run.cp
    t0 = time.perf_counter()
    ldy = n if ldy is None else ldy
    label = f"{t}x{n}x{k}" + (f" ldy={ldy}" if ldy != n else "")
    w_raw = q8_0_weights(n, k, rng)
    x32 = rng.standard_normal((t, k), np.float32)
    x32[:, ::16] *= 30.0
    hi = x32.astype(np.float16)
    lo = (x32 - hi.astype(np.float32)).astype(np.float16)
    ref, bound, w64 = run.reference(hi, w_raw, n, k)
    run.check_oracle_sample(label, hi, w_raw, n, k, ref)
    wdev = cp.asarray(w_raw)
    scratch = cp.empty(n * k, cp.float16)
    first, msg = {}, []
    for route in G.ROUTES:
        y = cp.full((t, ldy), GUARD, cp.float32)
        run.quant(route, wdev, n, k, cp.asarray(hi), y, scratch, n * k, ldy=ldy)
        w0 = run.worst(y, ref, bound, n)
        first[route] = y[:, :n].copy()
        ref1, bound1, _ = run.reference(lo, w_raw, n, k, y_old=y, w64_dev=w64)
        run.quant(route, wdev, n, k, cp.asarray(lo), y, scratch, n * k, ldy=ldy, beta=1)
        w1 = run.worst(y, ref1, bound1, n)
        guard_ok = ldy == n or bool((y[:, n:] == GUARD).all())
        for what, w in (("beta=0", w0), ("beta=1", w1)):
            if not w <= 1.0:
                run.tally.fail(f"{label} {route} {what}: {w:.3g} x bound")
        if not guard_ok:
            run.tally.fail(f"{label} {route}: columns past N were written")
        msg.append(f"{route} {w0:.3g}/{w1:.3g}")
    same = run.bitwise(first["f16"], first["f32"])
    run.out(f"  {label:24s} worst/bound (beta=0/beta=1): {', '.join(msg)}; routes bitwise "
            f"{'equal' if same else 'different'}" + ("; guard columns intact" if ldy != n else "")
            + f" [{time.perf_counter() - t0:.1f} s]")
    sh = {"label": label, "n": n, "k": k, "w_raw": w_raw, "x": cp.asarray(hi),
          "w16": w64.astype(cp.float16), "ref": ref, "bound": bound}
    return _slicing(run, sh, [t])


def run_parity_gemm(quick: bool = True, full: bool = False, *, seed: int = 20261130,
                    out=print, shapes=None, spec_shapes=None, sizes=None, _cp=None,
                    _backend=None) -> int:
    """Run gemm_f32_parity on the local GPU (see the module docstring).

    quick: the 200-size sweep; full: T = 1..5,120 for the projections (heads
    keep the quick sizes; `full` wins over `quick`). shapes / spec_shapes:
    restrict to these (label, N, K, is_head) / (T, N, K, ldy) tuples (default
    `model_shapes()` / SPEC_SHAPES); sizes: replace the chunk sizes. out: receives each report line. Returns
    0 (every check held), 1 (a bound, guard or plumbing check failed) or 2
    (no CuPy, GPU or native library). `_cp`/`_backend` substitute the array
    module and the routes (CPU tests of the harness)."""
    from ..loader import NativeUnavailable, unavailable_line
    try:
        cp = _cp
        if cp is None:
            import cupy as cp
        run = _Runner(cp, out, _backend if _backend is not None else NativeBackend())
    except ImportError as e:
        print(unavailable_line("parity gemm", f"needs CuPy (cupy-cuda12x / cupy-cuda13x): {e}"),
              file=sys.stderr)
        return 2
    except NativeUnavailable as e:
        print(unavailable_line("parity gemm", e), file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    props = cp.cuda.runtime.getDeviceProperties(0)
    ver = run.backend.cublas_version()
    mode = "full" if full else "quick"
    out(f"gemm_f32_parity: cuBLAS {ver} ({ver // 10000}.{ver // 100 % 100}.{ver % 100}), "
        f"{props['name'].decode() if isinstance(props['name'], bytes) else props['name']} "
        f"(compute capability {run.backend.cc}), {mode} run, seed {seed}")
    q, f = quick_sizes(), full_sizes()
    if sizes is not None:
        q = f = sorted(set(int(t) for t in sizes))
    eq_sizes = tot_sizes = 0
    sl_eq = sl_tot = 0
    worst = {"f16": 0.0, "f32": 0.0}
    out("chunk-size sweep (dense GEMM over the oracle's f16 weights, Q8_0 source, f16 X):")
    for label, n, k, head in (model_shapes() if shapes is None else shapes):
        sizes = f if (full and not head) else q
        sh = _sweep(run, label, n, k, sizes, rng)
        eq_sizes += sh["equal"]
        tot_sizes += sh["sizes"]
        worst["f16"] = max(worst["f16"], sh["worst16"])
        worst["f32"] = max(worst["f32"], sh["worst32"])
        e, tt = _slicing(run, sh, [t for t in (1, 37, 512) if t <= sh["tmax"]])
        sl_eq += e
        sl_tot += tt
        del sh
        cp.get_default_memory_pool().free_all_blocks()
    out("Strata's gemm_bf16_parity shapes (T x N x K, prompt path, Q8_0):")
    for t, n, k, ldy in (SPEC_SHAPES if spec_shapes is None else spec_shapes):
        e, tt = _spec_shape(run, t, n, k, ldy, rng)
        sl_eq += e
        sl_tot += tt
        cp.get_default_memory_pool().free_all_blocks()
    fails = run.tally.failures
    out(f"gemm_f32_parity: routes bitwise equal at {eq_sizes}/{tot_sizes} (shape, T) pairs; "
        f"worst error/bound f16 {worst['f16']:.3g}, f32 {worst['f32']:.3g}; slicing bitwise "
        f"equal to unsliced in {sl_eq}/{sl_tot}; {len(fails)} failures; "
        f"{time.perf_counter() - t0:.1f} s")
    out("gemm_f32_parity: OK" if not fails else "gemm_f32_parity: FAILED")
    return 0 if not fails else 1


if __name__ == "__main__":   # python -m strata_ref.native.gemm.parity [--quick|--full]
    sys.exit(run_parity_gemm(quick="--full" not in sys.argv[1:], full="--full" in sys.argv[1:]))
