"""Check that the GPU prompt path writes every value of Y.

The path is `native.gemm.wrapper.gemm_device` with Q8_0 W, sliced or
whole (issue 34: initcheck's reports over `parity gemm`, docs/native.md).

    python tools/gemm_write_probe.py sentinel
    compute-sanitizer --tool initcheck --print-limit 1000000 --show-backtrace no \
        python tools/gemm_write_probe.py initcheck

SmolLM2's q,o shape (576 x 576), T = 1, 37, 512, both routes, the whole W and
the slicings of `parity.slice_rows_set`. 'sentinel': Y is filled with the NaN
bit pattern 0x7FBADBAD before each call, and the values still holding it are
counted (expected 0). 'initcheck': Y comes from cupy.empty and a cupy sum reads
it after each call; a MARK line before each call says which call the checker's
reports that follow belong to. Needs CuPy and the native library."""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SENTINEL = np.uint32(0x7FBADBAD)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("sentinel", "initcheck"))
    mode = ap.parse_args().mode
    try:
        import cupy as cp
    except ImportError as e:
        print(f"gemm_write_probe: needs CuPy and a GPU: {e}", file=sys.stderr)
        return 2
    from strata_ref.native.gemm import wrapper as NG
    from strata_ref.native.gemm.parity import f16_activations, q8_0_weights, slice_rows_set
    n = k = 576
    rng = np.random.default_rng(1)
    w = cp.asarray(q8_0_weights(n, k, rng))
    x_all = cp.asarray(f16_activations(512, k, rng))
    scratch = cp.empty(n * k, cp.float16)
    unwritten_total = 0
    for route in ("f16", "f32"):
        for t in (1, 37, 512):
            for rows in [n] + slice_rows_set(n):
                if mode == "sentinel":
                    y = cp.full((t, n), SENTINEL, cp.uint32).view(cp.float32)
                else:
                    y = cp.empty((t, n), cp.float32)
                    print(f"MARK route={route} T={t} rows={rows}", flush=True)
                NG.gemm_device("Q8_0", w, n, k, x_all[:t], y, scratch=scratch,
                               scratch_elems=rows * k, route=route)
                cp.cuda.Device().synchronize()
                if mode == "sentinel":
                    left = int((y.view(cp.uint32) == SENTINEL).sum())
                    unwritten_total += left
                    print(f"route={route} T={t} rows={rows}: {left} of {t * n} values unwritten",
                          flush=True)
                else:
                    float(y.sum())
    print(f"probe done; {unwritten_total} values unwritten in all" if mode == "sentinel"
          else "probe done", flush=True)
    return 1 if unwritten_total else 0


if __name__ == "__main__":
    sys.exit(main())
