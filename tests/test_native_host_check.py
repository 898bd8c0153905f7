"""The CUDA kernels' per-value formulas, compiled as plain C++ and run on the
CPU (native/host_check.cpp), against the NumPy oracle, bitwise.

This is the CI check of the native code paths (generic `Fmt<T>::group` for
every type, wide `Wide*::chunk` for Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS and the chunk
pairs `Wide*::pair` of Q4_K/Q5_K/Q6_K/IQ4_XS) where there is
no GPU; the GPU parity tool checks the kernels themselves. Blocks: random
bytes with finite scales ("sane") and uniform random bytes ("raw": NaN/Inf
scales, every E8M0/UE4M3 byte). NaNs are canonical on both sides."""
import shutil
import subprocess

import numpy as np
import pytest

from strata_ref import dequant as oracle
from strata_ref.formats import dequant_types
from strata_ref.native import build
from strata_ref.native.dequant import policy as dispatch
from strata_ref.native.dequant.parity import make_blocks
from strata_ref.types import GGMLType as T
from strata_ref.types import block_format

CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


@pytest.fixture(scope="module")
def host_check(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("host_check")
    (d / build.TABLES_HEADER).write_text(build.iq_tables_header())
    exe = d / "host_check"
    src = build.source_dir()
    subprocess.run([CXX, "-O1", "-std=c++20", "-ffp-contract=off", "-Wno-unknown-pragmas",
                    "-I", str(d), "-I", str(src), str(src / "host_check.cpp"), "-o", str(exe)],
                   check=True, capture_output=True)
    return exe


def _run(exe, t, kernel, blocks) -> np.ndarray:
    p = subprocess.run([str(exe), str(int(t)), kernel], input=blocks.tobytes(),
                       capture_output=True, check=True)
    return np.frombuffer(p.stdout, np.uint32)


def test_oracle_types_all_have_generic_kernels():
    assert set(dequant_types()) <= dispatch.GENERIC_TYPES


TYPES = [T.F32, T.F16, T.BF16, *sorted(dispatch.GENERIC_TYPES - {T.F32, T.F16, T.BF16})]


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_formulas_match_oracle(host_check, t):
    fmt = block_format(t)
    rng = np.random.default_rng(int(t) + 100)
    kernels = ["generic"] + (["wide"] if t in dispatch.WIDE_BLOCKS_ALIGN else [])
    kernels += ["pairs"] if t in (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS) else []
    for kind in ("sane", "raw"):
        n = 4096 if fmt.block_values == 1 else max(8, 8192 // fmt.block_values)
        blocks = make_blocks(t, n, kind, rng).reshape(-1)
        ref = np.ascontiguousarray(oracle.dequantize(blocks, t)).view(np.uint32)
        for k in kernels:
            got = _run(host_check, t, k, blocks)
            assert got.size == ref.size
            bad = np.flatnonzero(got != ref)
            assert bad.size == 0, (f"{t.name} {kind} {k}: {bad.size} mismatches, first at "
                                   f"{bad[0]}: {got[bad[0]]:#010x} != {ref[bad[0]]:#010x}")


def test_hand_block_q4_0_signed_zero(host_check):
    # q = 8 with d < 0: C's (q - 8) * d is -0.0; the CUDA contiguous path's
    # d*q + dm would give +0.0 (formats.md §9). The kernel must give -0.0.
    b = np.zeros(18, np.uint8)
    b[0:2] = (0x00, 0xC0)            # d = -2.0
    b[2:] = 0x88                     # every nibble 8
    got = _run(host_check, T.Q4_0, "generic", b)
    assert np.all(got == 0x80000000)


def test_hand_block_mxfp4_subnormal(host_check):
    # e = 0: D = 2^-128, the f32 subnormal 0x00200000 (2^21 units of 2^-149).
    # Code 3 (kv 3) gives 3 * 2^-128 = 0x00600000, code 9 (kv -1) gives
    # -2^-128 = 0x80200000; flush-to-zero would give ±0.
    b = np.zeros(17, np.uint8)
    b[1] = 0x93                      # value 0: low nibble 3; value 16: high nibble 9
    got = _run(host_check, T.MXFP4, "generic", b)
    assert got[0] == 0x00600000 and got[16] == 0x80200000


def test_unknown_type_is_refused(host_check):
    p = subprocess.run([str(host_check), "24", "generic"], input=b"", capture_output=True)
    assert p.returncode == 2
    p = subprocess.run([str(host_check), "2", "wide"], input=b"", capture_output=True)
    assert p.returncode == 2
    p = subprocess.run([str(host_check), "8", "pairs"], input=b"", capture_output=True)
    assert p.returncode == 2


def test_fast_division_used_by_the_wide_kernels(host_check):
    # The wide kernels split chunk indices into (row, chunk) with a
    # multiply-high division (strata_common.cuh FastDiv); compare with '/'.
    p = subprocess.run([str(host_check), "divcheck"], capture_output=True, text=True)
    assert p.returncode == 0 and "0 mismatches" in p.stdout, p.stdout
