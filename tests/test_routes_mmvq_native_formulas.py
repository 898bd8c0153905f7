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
from strata_ref.routes.mmvq_inputs import inf_dot_blocks, ones_q8_1, sane_blocks
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
    subprocess.run([cxx, "-O1", "-std=c++20", "-ffp-contract=off", "-shared", "-fPIC",
                    "-I", str(d), "-I", str(NATIVE), str(NATIVE / "mmvq_host_check.cpp"),
                    "-o", str(so)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    lib.smv_host_dot.restype = ctypes.c_float
    lib.smv_host_dot.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.c_void_p]
    lib.smv_host_lane_dots.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.smv_host_q8_chunk.argtypes = [ctypes.c_int]
    lib.smv_host_lanes_matvec.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong,
                                          ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int,
                                          ctypes.c_void_p, ctypes.c_void_p]
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
    from strata_ref.native.mmvq.wrapper import NATIVE_TYPES
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
    from strata_ref.native.mmvq.bench import run_bench_experts
    from strata_ref.native.mmvq.parity import run_parity_mmvq
    lines = []
    assert run_parity_mmvq(True, out=lines.append) == 2
    assert run_bench_experts(out=lines.append) == 2
    err = capsys.readouterr().err.splitlines()
    assert lines == [] and len(err) == 2
    assert err[0].startswith("strata-ref: error: parity mmvq: native path unavailable: ")
    assert err[1].startswith("strata-ref: error: bench experts: native path unavailable: ")


def test_bench_mmvq_goal_lines():
    # Issue 34's goal is judged on the lowest of the cold and graph ratios of
    # the 70B shapes only; a 7B shape below the goal does not fail it.
    from strata_ref.native.mmvq.bench import goal_lines
    rows = [("Q4_K", 4096, 14336, 0.70, 0.72, 60.0, 61.0, 71.0, 72.0),
            ("Q4_K", 8192, 28672, 0.91, 0.90, 80.0, 81.0, 88.0, 89.0),
            ("Q4_K", 28672, 8192, 0.93, 0.95, 82.0, 83.0, 88.5, 87.5),
            ("Q6_K", 8192, 28672, 0.86, 0.849, 70.0, 71.0, 82.0, 83.0)]
    assert goal_lines(rows) == [
        "Q4_K: 70B shapes /read 0.90-0.95 (goal >= 0.90: met), 80.0-83.0 % of copy;"
        " 7B shapes /read 0.70-0.72, the read-only kernel at 71.0-72.0 % of copy",
        "Q6_K: 70B shapes /read 0.84-0.86 (goal >= 0.85: not met), 70.0-71.0 % of copy"]
    # a ratio just below the goal is not printed as the goal itself
    assert goal_lines([("Q4_K", 8192, 28672, 0.89996, 0.95, 80.0, 81.0, 88.0, 89.0)]) == [
        "Q4_K: 70B shapes /read 0.89-0.95 (goal >= 0.90: not met), 80.0-81.0 % of copy"]


LANE_TYPES = [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.IQ4_XS]


@pytest.mark.parametrize("t,mis", [(t, 0) for t in LANE_TYPES] + [(GGMLType.Q6_K, 2)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_host_lane_dots_equal_oracle(host, t, mis):
    """Lane j of the lanes kernel (native/mmvq_lanes.cuh) returns the dots of
    canonical threads 4j..4j+3, bitwise; mis = 2 puts the block 2 bytes off a
    word boundary (odd Q6_K super-blocks; the other types need 16-byte
    alignment and are given it)."""
    fmt = block_format(t)
    rng = np.random.default_rng(100 + int(t) + mis)
    nb = 6
    w = sane_blocks(t, nb, rng)
    x = rng.standard_normal(nb * 256).astype(np.float32)
    x[:32] *= 1000
    q8 = quantize_q8_1(x)
    ref = M.thread_dots(t, w.reshape(1, nb, -1), q8.reshape(1, -1, 36))[0, 0]   # (nb, T)
    n_lanes = M.GEOMETRY[t].T // 4
    tbl = np.ascontiguousarray(iq_tables.KVALUES_IQ4NL, dtype=np.int8)
    out = np.empty(4, np.float32)
    buf = np.zeros(fmt.block_bytes + 32, np.uint8)
    base = (-buf.ctypes.data) % 16 + mis            # 16-byte aligned + mis
    got = np.empty_like(ref)
    for b in range(nb):
        buf[base:base + fmt.block_bytes] = w[b]
        qb = np.ascontiguousarray(q8[8 * b:8 * b + 8])
        for j in range(n_lanes):
            assert host.smv_host_lane_dots(int(t), buf.ctypes.data + base, mis, qb.ctypes.data, j,
                                           tbl.ctypes.data, out.ctypes.data) == 0
            got[b, 4 * j:4 * j + 4] = out
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), np.argwhere(got != ref)[:5]


def test_host_lane_dots_refuse_other_types(host):
    out = np.empty(4, np.float32)
    z = np.zeros(512, np.uint8)
    assert host.smv_host_lane_dots(int(GGMLType.Q5_K), z.ctypes.data, 0, z.ctypes.data, 0,
                                   z.ctypes.data, out.ctypes.data) == 1


def test_q8_chunk_swizzle_is_a_permutation_of_each_group_of_8(host):
    """The staged ints' chunk swizzle moves chunks only within their aligned
    group of 8, so it is a permutation of [0, 2·nq8) whenever nq8 is a
    multiple of 4 (8 q8_1 blocks per 256-value super-block)."""
    for n in (8, 16, 64, 2 * 448):
        got = sorted(host.smv_host_q8_chunk(c) for c in range(n))
        assert got == list(range(n))


def _phase_banks(host, addrs):
    # 16-byte chunk addresses of the 8 lanes of one 128-bit access phase ->
    # their bank groups (chunk mod 8) after the swizzle
    return sorted(host.smv_host_q8_chunk(c) % 8 for c in addrs)


def test_q8_chunk_swizzle_is_conflict_free_for_the_lane_layouts(host):
    """Each 128-bit shared load of the lanes kernel reads 8 lanes per phase;
    with the swizzle their chunks fall in 8 distinct bank groups (a property
    of the layouts in mmvq_lanes.cuh: Q4_K lanes (g, j) read blocks
    8·kbx + 2j + i, kbx = g + 8·it; Q6_K lanes j read half j%2 of blocks
    8·kbx + 4(j/4) + (j%4)/2 + 2i; IQ4_XS lanes (g, h) read block 8·kbx + 4h + k)."""
    for it in range(3):
        for a in range(4):                               # Q4_K: lanes 8a..8a+7
            for i in range(2):
                for half in range(2):
                    c = [2 * (8 * (g + 8 * it) + 2 * j + i) + half
                         for g in (2 * a, 2 * a + 1) for j in range(4)]
                    assert _phase_banks(host, c) == list(range(8))
        for g in range(4):                               # Q6_K: lanes 8g..8g+7
            for i in range(2):
                c = [2 * (8 * (g + 4 * it) + 4 * (j // 4) + (j % 4) // 2 + 2 * i) + j % 2
                     for j in range(8)]
                assert _phase_banks(host, c) == list(range(8))
        for a in range(4):                               # IQ4_XS: lanes 8a..8a+7
            for k in range(4):
                for half in range(2):
                    c = [2 * (8 * (g + 16 * it) + 4 * h + k) + half
                         for g in range(4 * a, 4 * a + 4) for h in range(2)]
                    assert _phase_banks(host, c) == list(range(8))


# (type, rows, K, warps): K not a multiple of BPI blocks (some lanes have one
# iteration fewer, then move on to the next row), K below one iteration (lanes
# idle), odd Q6_K row lengths (rows alternate between word-aligned and 2 bytes
# off), and fewer warps than rows so that every warp walks several rows.
LANE_MATVEC_CASES = [(GGMLType.Q4_K, 29, 2560, 5), (GGMLType.Q4_K, 13, 256, 3),
                     (GGMLType.Q4_K, 11, 4608, 2), (GGMLType.Q6_K, 23, 2816, 4),
                     (GGMLType.Q6_K, 17, 2560, 3), (GGMLType.IQ4_XS, 21, 14336, 4),
                     (GGMLType.IQ4_XS, 9, 1024, 2),
                     # fewer rows than warps (idle warps load a clamped block)
                     (GGMLType.Q4_K, 3, 2560, 8), (GGMLType.Q6_K, 1, 2816, 8),
                     (GGMLType.IQ4_XS, 5, 1280, 8),
                     # whole iterations (lane_full: the walk without idle-lane tests)
                     (GGMLType.Q4_K, 19, 4096, 3), (GGMLType.Q6_K, 13, 1024, 5),
                     (GGMLType.Q6_K, 7, 4096, 2), (GGMLType.IQ4_XS, 11, 4096, 3),
                     (GGMLType.Q6_K, 2, 1024, 8)]


def test_iq4nl_table_suits_the_sign_mode_lookup():
    """Lanes<IQ4_XS> (mmvq_lanes.cuh) looks kv[q] up as the sum of two
    sign-mode byte permutes: that needs entries 0-7 negative and entries 8-15
    + 1 in 1..127 (so the +1 never carries into the next byte)."""
    kv = np.asarray(iq_tables.KVALUES_IQ4NL, dtype=np.int64)
    assert (kv[:8] < 0).all() and (kv[8:] >= 0).all() and (kv[8:] + 1 <= 127).all()


def test_host_lane_dots_q6k_extremes(host):
    """Lanes<Q6_K> feeds dp4a the bytes 4·(q - 32) and stages d8/4: exact
    for every byte value, up to |4·dq·sc| = 2^23 (quants 0 or 63, scales
    -128 or 127, q8_1 ints -128 or 127; -128 is no quantizer's output but a
    block may hold it), and for fp16 scales at their edges (signed zeros,
    subnormals, the largest, inf, NaN) in the weight's d and the q8_1 d:
    bitwise the oracle's thread dots, at both alignments."""
    rng = np.random.default_rng(9)
    blocks, q8s = [], []
    for ql, qh, sc, u in [(0x00, 0x00, -128, -128), (0xFF, 0xFF, 127, 127), (0x00, 0x00, 127, -128),
                          (0xFF, 0xFF, -128, -128), (0x0F, 0xAA, -1, 127), (0xF0, 0x55, 1, -1)]:
        b = np.zeros(210, np.uint8)
        b[:128], b[128:192] = ql, qh
        b[192:208] = np.int8(sc).view(np.uint8)
        b[208:210] = np.frombuffer(np.float16(1.5).tobytes(), np.uint8)
        q = np.zeros((8, 36), np.uint8)
        q[:, 0:2] = np.frombuffer(np.float16(0.75).tobytes(), np.uint8)
        q[:, 4:] = np.int8(u).view(np.uint8)
        blocks.append(b)
        q8s.append(q)
    for _ in range(4):          # random bytes everywhere, finite scales
        b = rng.integers(0, 256, 210, dtype=np.uint8)
        b[208:210] = np.frombuffer(np.float16(rng.standard_normal()).tobytes(), np.uint8)
        q = rng.integers(0, 256, (8, 36), dtype=np.uint8)
        q[:, 0:4] = np.frombuffer(np.float16(rng.uniform(0.5, 2)).tobytes() * 2, np.uint8)
        blocks.append(b)
        q8s.append(q)
    # fp16 scales at the edges (zeros, subnormals, the largest, inf, NaN) for
    # the weight's d and the q8_1 d: d8/4 must stay exact for every one
    edges = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00]
    for wd in edges:
        for qd in edges:
            b = rng.integers(0, 256, 210, dtype=np.uint8)
            b[208:210] = np.frombuffer(np.uint16(wd).tobytes(), np.uint8)
            q = rng.integers(0, 256, (8, 36), dtype=np.uint8)
            q[:, 0:2] = np.frombuffer(np.uint16(qd).tobytes(), np.uint8)
            blocks.append(b)
            q8s.append(q)
    w = np.stack(blocks)
    q8 = np.concatenate(q8s)
    ref = M.thread_dots(GGMLType.Q6_K, w.reshape(1, len(w), -1), q8.reshape(1, -1, 36))[0, 0]
    tbl = np.ascontiguousarray(iq_tables.KVALUES_IQ4NL, dtype=np.int8)
    out = np.empty(4, np.float32)
    for mis in (0, 2):
        buf = np.zeros(210 + 32, np.uint8)
        base = (-buf.ctypes.data) % 16 + mis
        got = np.empty_like(ref)
        for i in range(len(w)):
            buf[base:base + 210] = w[i]
            qb = np.ascontiguousarray(q8[8 * i:8 * i + 8])
            for j in range(8):
                assert host.smv_host_lane_dots(int(GGMLType.Q6_K), buf.ctypes.data + base, mis,
                                               qb.ctypes.data, j, tbl.ctypes.data, out.ctypes.data) == 0
                got[i, 4 * j:4 * j + 4] = out
        # NaNs compare as NaNs (the host's payloads differ from the oracle's
        # canonical one; the GPU returns the canonical NaN)
        same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
        assert same.all(), (mis, np.argwhere(~same)[:5])


def test_host_lanes_matvec_refuses_shapes_the_kernel_refuses(host):
    """The host emulation answers 4 for a K that is not a positive multiple
    of 256, no rows or no warps (the kernel's entry refuses those), instead
    of walking block -1."""
    w = np.zeros(4096, np.uint8)
    q8 = np.zeros(36 * 8, np.uint8)
    y = np.zeros(4, np.float32)
    tbl = np.ascontiguousarray(iq_tables.KVALUES_IQ4NL, dtype=np.int8)
    for rows, k, warps in [(1, 0, 1), (1, 128, 1), (1, -256, 1), (0, 256, 1), (1, 256, 0)]:
        assert host.smv_host_lanes_matvec(int(GGMLType.Q4_K), w.ctypes.data, rows, k, q8.ctypes.data,
                                          warps, tbl.ctypes.data, y.ctypes.data) == 4, (rows, k, warps)


@pytest.mark.parametrize("t,rows,k,warps", LANE_MATVEC_CASES,
                         ids=lambda v: getattr(v, "name", str(v)))
def test_host_lanes_matvec_equals_oracle(host, t, rows, k, warps):
    """The lanes kernel's whole walk (native/mmvq_lanes.cuh lane_rows: the
    per-lane block pointers across iterations and rows, the staged q8_1 column,
    every lane's group and iteration offsets) and the canonical combine, run
    on the host, give routes/mmvq.py's output bit for bit. The host loads
    also check what the GPU needs: status 2 is a misaligned load, 3 a load
    outside the weights and the q8_1 column (exact-size buffers here)."""
    fmt = block_format(t)
    rng = np.random.default_rng(rows * k + warps)
    w = sane_blocks(t, rows * k // fmt.block_values, rng).reshape(rows, -1)
    q8 = quantize_q8_1(rng.standard_normal(k).astype(np.float32))
    ref = M.mmvq(t, w, q8)[0]
    buf = np.zeros(w.nbytes + 16, np.uint8)
    base = (-buf.ctypes.data) % 16                   # the kernel's 16-byte aligned weights
    buf[base:base + w.nbytes] = w.ravel()
    tbl = np.ascontiguousarray(iq_tables.KVALUES_IQ4NL, dtype=np.int8)
    got = np.empty(rows, np.float32)
    st = host.smv_host_lanes_matvec(int(t), buf.ctypes.data + base, rows, k, q8.ctypes.data,
                                    warps, tbl.ctypes.data, got.ctypes.data)
    assert st == 0, {2: "misaligned load", 3: "load outside the inputs"}.get(st, st)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), np.flatnonzero(got != ref)[:8]


@pytest.mark.parametrize("t,k", [(GGMLType.Q4_K, 256), (GGMLType.Q4_K, 2560), (GGMLType.Q6_K, 256),
                                 (GGMLType.Q6_K, 2560), (GGMLType.IQ4_XS, 256),
                                 (GGMLType.IQ4_XS, 1280)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_host_lanes_matvec_discards_idle_lanes(host, t, k):
    """Lanes without a block in an iteration (K not a multiple of the blocks
    per iteration) evaluate dots on a reloaded block and the staged zero
    q8_1 padding, and the walk must discard them: with d = +inf every real
    dot is +inf, a discarded one inf·0 = NaN. The rows' sums stay +inf, as
    the oracle's."""
    rows, warps = 3, 2
    w = inf_dot_blocks(t, rows * (k // 256)).reshape(rows, -1)
    q8 = ones_q8_1(k)
    ref = M.mmvq(t, w, q8)[0]
    assert np.isposinf(ref).all(), ref
    buf = np.zeros(w.nbytes + 16, np.uint8)
    base = (-buf.ctypes.data) % 16
    buf[base:base + w.nbytes] = w.ravel()
    tbl = np.ascontiguousarray(iq_tables.KVALUES_IQ4NL, dtype=np.int8)
    got = np.empty(rows, np.float32)
    assert host.smv_host_lanes_matvec(int(t), buf.ctypes.data + base, rows, k, q8.ctypes.data, warps,
                                      tbl.ctypes.data, got.ctypes.data) == 0
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), got


def test_inf_dot_inputs_refuse_what_they_cannot_build():
    with pytest.raises(ValueError, match="Q5_K is not Q4_K, Q6_K or IQ4_XS"):
        inf_dot_blocks(GGMLType.Q5_K, 1)
    for k in (0, 31, -32):
        with pytest.raises(ValueError, match=f"k = {k} is not a positive multiple of 32"):
            ones_q8_1(k)


_ASAN_DRIVER = r"""
#include "mmvq_host_check.cpp"
#include <cstdio>
#include <cstdlib>
int main() {
    struct C { int t; long long rows, k; int warps; } cs[] = {CASES};
    int8_t tbl[16] = {0};
    int bad = 0;
    for (auto &c : cs) {
        const int bytes = c.t == T_Q4_K ? 144 : c.t == T_Q6_K ? 210 : 136;
        const size_t wn = c.rows * (c.k / 256) * bytes, qn = c.k / 32 * 36;
        uint8_t *w = (uint8_t *)aligned_alloc(16, (wn + 15) / 16 * 16);
        uint8_t *q = (uint8_t *)aligned_alloc(16, (qn + 15) / 16 * 16);
        for (size_t i = 0; i < wn; ++i) w[i] = (uint8_t)(i * 37);
        for (size_t i = 0; i < qn; ++i) q[i] = (uint8_t)(i * 11);
        float *y = (float *)malloc(c.rows * sizeof(float));
        bad |= smv_host_lanes_matvec(c.t, w, c.rows, c.k, q, c.warps, tbl, y);
        free(w); free(q); free(y);
    }
    return bad;
}
"""


def test_lanes_walk_reads_stay_inside_under_asan(tmp_path):
    """The host emulation of the lanes kernel, built with AddressSanitizer and
    exact-size buffers (weights, q8_1 column, staged copies): no lane reads
    outside them, idle lanes included. Skipped where g++ cannot build with
    -fsanitize=address."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    from strata_ref.native.build import TABLES_HEADER, iq_tables_header
    (tmp_path / TABLES_HEADER).write_text(iq_tables_header())
    cases = ", ".join(f"{{{int(t)}, {rows}, {k}, {warps}}}" for t, rows, k, warps in LANE_MATVEC_CASES)
    (tmp_path / "drv.cpp").write_text(_ASAN_DRIVER.replace("CASES", cases))
    exe = tmp_path / "drv"
    build = subprocess.run([cxx, "-O1", "-std=c++20", "-ffp-contract=off", "-fsanitize=address",
                            "-I", str(tmp_path), "-I", str(NATIVE), str(tmp_path / "drv.cpp"),
                            "-o", str(exe)], capture_output=True, text=True)
    if build.returncode:
        pytest.skip(f"no AddressSanitizer build: {build.stderr.strip().splitlines()[-1:]}")
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert "AddressSanitizer" not in run.stderr, run.stderr[:2000]
    assert run.returncode == 0


def test_device_reset_bumps_the_epoch_after_the_reset(host):
    """smv_device_reset's order (native/mmvq_setup.h, the code the library
    runs): a launch set-up that another thread makes while cudaDeviceReset
    runs is stale once the reset returns, and one made after it is fresh.
    With the epoch bumped before the reset, the set-up made during it would
    carry the new epoch and survive (status 1)."""
    assert host.smv_host_reset_order() == 0
