"""A/B timing of 1-column lanes-kernel builds (needs a CUDA GPU).

    STRATA_MMVQ_LIB=build.so python tools/bench_lanes_ab.py NAME [--cache DIR] [--json FILE]

Times what `strata-ref bench mmvq` prints in its default and read-only
columns (L2-cold weights, 200 calls, back to back and from a CUDA graph;
best of two repeats) for Q4_K, Q6_K and IQ4_XS on the bench shapes, for
the library STRATA_MMVQ_LIB names, and records a hash of each output: builds
that differ only in speed must give the same bits (the parity tools check
the bits against the oracle). Weights are generated once into --cache and
reused, so several builds see the same bytes.
"""
import argparse
import hashlib
import json
import os
import tempfile
import sys
from pathlib import Path

import numpy as np

from strata_ref.native.mmvq import bench as P
from strata_ref.native.mmvq.wrapper import load_mmvq
from strata_ref.routes.mmvq_inputs import sane_blocks
from strata_ref.routes.q8_1 import quantize_q8_1
from strata_ref.types import GGMLType as T, block_format


def weights(t, rows, k, cache: Path):
    f = cache / f"{t.name}_{rows}_{k}.npy"
    if f.is_file():
        return np.load(f)
    rng = np.random.default_rng(rows * 7 + k + int(t))
    w = sane_blocks(t, rows * k // block_format(t).block_values, rng).reshape(rows, -1)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(f, w)
    return w


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "lanes_ab"))
    ap.add_argument("--json")
    ap.add_argument("--types", default="Q4_K,Q6_K,IQ4_XS")
    a = ap.parse_args()
    nat = load_mmvq()
    res = []
    for tn in a.types.split(","):
        t = T[tn]
        for rows, k in P.BENCH_SHAPES:
            w = weights(t, rows, k, Path(a.cache))
            nbuf = -(-P.COLD_BYTES // w.nbytes)
            dw = nat.alloc(nbuf * w.nbytes)
            for i in range(nbuf):
                nat.check(nat.lib.smv_memcpy_htod(nat.ffi.cast("char *", dw.ptr) + i * w.nbytes,
                                                  nat.ffi.from_buffer(w), w.nbytes), "copy in")
            q8 = quantize_q8_1(np.random.default_rng(k).standard_normal((1, k)).astype(np.float32))
            dq, dy = nat.put(q8), nat.alloc(rows * 4)
            mm = lambda: P._time_mmvq(nat, t, dw, nbuf, rows, k, dq, 1, dy, 0, 200)   # noqa: E731
            rd = lambda: P._time_read(nat, dw, w.nbytes, nbuf, 200)                    # noqa: E731
            best = [1e9] * 4
            for _ in range(2):
                for i, v in enumerate((mm(), rd(), P._graph_ms(nat, mm), P._graph_ms(nat, rd))):
                    best[i] = min(best[i], v)
            y = nat.get(dy, np.float32, rows)
            h = hashlib.sha256(y.tobytes()).hexdigest()[:16]
            d, r, gd, gr = best
            res.append(dict(name=a.name, type=tn, rows=rows, k=k, us=d * 1e3, read_us=r * 1e3,
                            g_us=gd * 1e3, g_read_us=gr * 1e3, ratio=r / d, g_ratio=gr / gd,
                            bytes=w.nbytes, hash=h))
            print(f"{a.name:8s} {tn:7s} {rows:5d} x {k:5d}  {d * 1e3:6.1f} us  read {r * 1e3:6.1f}"
                  f"  /read {r / d:4.2f} | graph {gd * 1e3:6.1f}  read {gr * 1e3:6.1f}  /read "
                  f"{gr / gd:4.2f} | {h}", flush=True)
            del dw
    if a.json:
        Path(a.json).write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
