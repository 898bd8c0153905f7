"""Test vectors of the AVX512-BF16 instruction `vdpbf16ps` itself, which
llama.cpp's avx512 build uses for BF16 weights (`ggml_vec_dot_bf16`,
llamafile `tinyBLAS<32, __m512, __m512bh>`), for
tests/test_cpu_small_orders.py.

    python tools/vdpbf16ps_vectors.py [--out tests/data/avx512/vdpbf16ps.npz]

Compiles a one-function C file with `cc -O2 -mavx512f -mavx512bf16` and
runs `_mm512_dpbf16_ps` on this CPU (refuses without the avx512_bf16 flag)
for: accumulators within a few ulps of +-FLT_MIN with products near 2^-150
(where the instruction's rounding with an unbounded exponent, then its
flush to zero, differs from IEEE rounding onto the denormal grid);
accumulators and bf16 values of every magnitude; and raw random bits
(denormals, infinities, NaNs). The file holds `acc` float32 (n,), `a`, `b`
uint16 (n, 2) (the even and the odd bf16 of each lane's pair) and `out`
float32 (n,), with the command and the CPU model.
"""
from __future__ import annotations

import argparse
import ctypes
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
_C = r"""
#include <immintrin.h>
void dp(const float *acc, const unsigned short *a, const unsigned short *b, float *out, long n16) {
    for (long i = 0; i < n16; i++) {
        __m512 c = _mm512_loadu_ps(acc + 16 * i);
        __m512bh x = (__m512bh)_mm512_loadu_ps((const float *)(a + 32 * i));
        __m512bh y = (__m512bh)_mm512_loadu_ps((const float *)(b + 32 * i));
        _mm512_storeu_ps(out + 16 * i, _mm512_dpbf16_ps(c, x, y));
    }
}
"""


def _inputs(rng, n: int):
    """(acc float32 (n,), a, b uint16 (n, 2)); n a multiple of 48."""
    def bf(m, e_lo, e_hi):
        v = rng.choice([-1.0, 1.0], m) * rng.integers(128, 256, m) * np.exp2(rng.integers(e_lo, e_hi, m) - 7.0)
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    k = n // 3
    acc = [rng.choice([-1, 1], k) * (2.0 ** -126 + rng.integers(0, 8, k) * 2.0 ** -149),
           rng.standard_normal(k) * np.exp2(rng.uniform(-126, 100, k))]
    a = [np.stack([bf(k, -76, -73), bf(k, -76, -73)], 1), np.stack([bf(k, -60, 60), bf(k, -60, 60)], 1)]
    b = [np.stack([bf(k, -76, -73), bf(k, -76, -73)], 1), np.stack([bf(k, -60, 60), bf(k, -60, 60)], 1)]
    acc = [v.astype(np.float32) for v in acc]
    acc.append(rng.integers(0, 2 ** 32, k, dtype=np.uint64).astype(np.uint32).view(np.float32))
    a.append(rng.integers(0, 2 ** 16, (k, 2)).astype(np.uint16))
    b.append(rng.integers(0, 2 ** 16, (k, 2)).astype(np.uint16))
    return np.concatenate(acc), np.concatenate(a).astype(np.uint16), np.concatenate(b).astype(np.uint16)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "tests" / "data" / "avx512" / "vdpbf16ps.npz"))
    ap.add_argument("--n", type=int, default=1536)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from strata_ref.cpu.profiles import host_flags
    if "avx512_bf16" not in host_flags():
        raise SystemExit("this CPU has no avx512_bf16")
    with tempfile.TemporaryDirectory() as d:
        src, lib = Path(d) / "dp.c", Path(d) / "dp.so"
        src.write_text(_C)
        subprocess.run(["cc", "-O2", "-mavx512f", "-mavx512bf16", "-shared", "-fPIC", str(src), "-o", str(lib)],
                       check=True)
        dp = ctypes.CDLL(str(lib)).dp
        dp.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long]
        acc, x, y = _inputs(np.random.default_rng(20261202), a.n - a.n % 48)
        out = np.empty_like(acc)
        dp(acc.ctypes.data, x.ctypes.data, y.ctypes.data, out.ctypes.data, acc.size // 16)
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    np.savez_compressed(a.out, acc=acc, a=x, b=y, out=out, cpu=np.array(model),
                        command=np.array("python tools/vdpbf16ps_vectors.py " + " ".join(map(shlex.quote, sys.argv[1:]))))
    print(a.out, acc.size, "lanes,", int((out == 0).sum()), "zero results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
