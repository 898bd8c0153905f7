"""Parity of the native mat-vec and expert kernels with the routes, bitwise.

* `run_parity_mmvq(quick)`: every native type × 1..8 columns × rows per
  warp {plain, 1, 2, 4} × row counts around 2048/4096/8192/12288 × K (odd K
  224 and 2880 for the 32-value types), bitwise (u32, NaN canonical) against
  routes/mmvq.py, plus the q8_1 quantizer against routes/q8_1.py; no
  non-finite output on sane blocks (routes/mmvq_inputs.py).
* `run_parity_experts(quick)`: expert modes 0 and 8 against
  routes/experts.moe_ffn, bitwise, random and real-model shapes.
The benches are `mmvq.bench`. Each returns a process exit status: 0 all good, 1 a mismatch, 2 no GPU.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from ...numerics import canonicalize_nan
from ...routes.experts import moe_ffn
from ...routes.mmvq import mmvq
from ...routes.mmvq_inputs import sane_blocks
from ...routes.q8_1 import quantize_q8_1
from ...types import GGMLType, block_format
from ..loader import NativeUnavailable, unavailable_line
from .tables import LEGAL_ROWS
from .wrapper import NATIVE_TYPES, experts_native, load_mmvq, quantize_q8_1_native

__all__ = ["run_parity_mmvq", "run_parity_experts", "load_or_report", "experts_case", "u32_bits",
           "EXPERT_CONFIGS", "PLAIN_KERNELS", "SEED"]

T = GGMLType
SEED = 20261130


#: smv_set_plain_kernel's kinds by name
PLAIN_KERNELS = {0: "auto", 1: "plain/1", 2: "plain/2", 3: "lanes"}


def u32_bits(a: np.ndarray) -> np.ndarray:
    return canonicalize_nan(np.asarray(a, np.float32)).view(np.uint32)


def load_or_report(out, tool: str):
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
    return t, rows, k, w, q8, u32_bits(mmvq(t, w, q8))


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
    nat = load_or_report(out, "parity mmvq")
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
            if not np.array_equal(u32_bits(y), ref[:ncols]):
                fails += 1
                n = int(np.sum(u32_bits(y) != ref[:ncols]))
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


def experts_case(rng, n_exp, h, ff, t_gu, t_down, n_tok, k):
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
    case = experts_case(np.random.default_rng(seed), 8, h, ff, t_gu, t_down, n_tok, k)
    return args, case, u32_bits(moe_ffn(*case, t_gu, t_down))


def run_parity_experts(quick: bool = False, out=print) -> int:
    """Expert modes 0 and 8 against the oracle, bitwise."""
    nat = load_or_report(out, "parity experts")
    if nat is None:
        return 2
    configs = EXPERT_CONFIGS[:2] if quick else EXPERT_CONFIGS
    tokens = ((1, 2), (3, 4)) if quick else ((1, 1), (1, 8), (3, 4))
    jobs = [(*c, n_tok, k, SEED + 7 * i + j) for i, c in enumerate(configs)
            for j, (n_tok, k) in enumerate(tokens)]
    cases = fails = 0
    for (t_gu, t_down, h, ff, n_tok, k, _), case, ref in _pool_map(_experts_oracle, jobs):
        for mode in (0, 8):
            got = u32_bits(experts_native(mode, *case, t_gu, t_down, nat=nat))
            cases += 1
            if not np.array_equal(got, ref):
                fails += 1
                out(f"DIFFERS mode {mode} {t_gu.name}/{t_down.name} H={h} FF={ff} "
                    f"tokens={n_tok} k={k}: {int(np.sum(got != ref))} values")
    out(f"experts parity: {cases} cases (modes 0 and 8), {fails} differ")
    return 0 if fails == 0 else 1
