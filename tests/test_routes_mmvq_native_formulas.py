"""The CUDA thread dots (native/mmvq_dots.cuh), built for the host with the
intrinsics emulated exactly, against routes/mmvq.py's thread dots, bitwise.
Skipped without a C++ compiler."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from strata_ref.formats import iq_tables
from strata_ref.formats.fp4 import KVALUES_MXFP4
from strata_ref.routes import mmvq as M
from strata_ref.routes.mmvq_inputs import sane_blocks
from strata_ref.routes.q8_1 import quantize_q8_1
from strata_ref.types import GGMLType, block_format

NATIVE = Path(__file__).resolve().parent.parent / "native"
TYPES = [2, 3, 6, 7, 8, 20, 39, 10, 11, 12, 13, 14, 23, 16, 17, 22, 18, 21, 19, 29]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    from strata_ref.native.build import TABLES_HEADER, iq_tables_header
    d = tmp_path_factory.mktemp("mmvq")
    (d / TABLES_HEADER).write_text(iq_tables_header())
    so = d / "host.so"
    subprocess.run([cxx, "-O1", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC",
                    "-I", str(d), "-I", str(NATIVE), str(NATIVE / "mmvq_host_check.cpp"),
                    "-o", str(so)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    lib.smv_host_dot.restype = ctypes.c_float
    lib.smv_host_dot.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.c_void_p]
    return lib


@pytest.mark.parametrize("tid", TYPES, ids=lambda t: GGMLType(t).name)
def test_host_dots_equal_oracle(host, tid):
    t = GGMLType(tid)
    fmt = block_format(t)
    rng = np.random.default_rng(tid)
    nb = 6
    k = nb * fmt.block_values
    w = sane_blocks(t, nb, rng)
    x = rng.standard_normal(k).astype(np.float32)
    x[:32] *= 1000                      # large block sums too
    q8 = quantize_q8_1(x)
    ref = M.thread_dots(t, w.reshape(1, nb, -1), q8.reshape(1, -1, 36))[0, 0]   # (nb, T)
    tbl = np.ascontiguousarray(KVALUES_MXFP4 if t == GGMLType.MXFP4 else iq_tables.KVALUES_IQ4NL,
                               dtype=np.int8)
    nq = fmt.block_values // 32
    got = np.empty_like(ref)
    for b in range(nb):
        wb = np.ascontiguousarray(w[b])
        qb = np.ascontiguousarray(q8[b * nq:(b + 1) * nq])
        for th in range(ref.shape[1]):
            got[b, th] = host.smv_host_dot(tid, wb.ctypes.data, qb.ctypes.data, th,
                                           tbl.ctypes.data)
    assert host.smv_host_threads(tid) == M.GEOMETRY[t].T
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), np.argwhere(got != ref)[:5]


def test_kernel_block_geometry_matches_types(host):
    from strata_ref.native.mmvq import NATIVE_TYPES
    assert sorted(int(t) for t in NATIVE_TYPES) == sorted(TYPES)
    for tid in TYPES:
        fmt = block_format(GGMLType(tid))
        assert host.smv_host_block_bytes(tid) == fmt.block_bytes, fmt.name
        assert host.smv_host_block_values(tid) == fmt.block_values, fmt.name
    assert host.smv_host_block_bytes(int(GGMLType.TQ2_0)) == 0


def test_tools_without_gpu_report_status_2(capsys):
    # On a machine without a CUDA driver the tools say why (on stderr) and return 2.
    from strata_ref.native.loader import NativeUnavailable, driver_compute_capability
    try:
        driver_compute_capability()
    except NativeUnavailable:
        pass
    else:
        pytest.skip("a CUDA device is present")
    from strata_ref.native.mmvq_parity import run_bench_experts, run_parity_mmvq
    lines = []
    assert run_parity_mmvq(True, out=lines.append) == 2
    assert run_bench_experts(out=lines.append) == 2
    err = capsys.readouterr().err.splitlines()
    assert lines == [] and len(err) == 2
    assert all(ln.startswith("native mat-vec unavailable") for ln in err)
