"""The float order of strata_ref.cpu.dots_small, against hand-made cases and
a plain NumPy restatement of each ggml order, with data where the order
changes the result (each test also checks that a plausible other order
gives different bits, so it can fail for a wrong order).

The NumPy references use `numerics.fma_f32` (one rounding) and float32
adds; the integer lanes are exact sums of 4 products (ggml's
maddubs + madd). Bitwise agreement with llama.cpp itself is
tests/test_cpu_types.py and tests/test_cpu_typed_models.py; this file pins
the orders those pass with and adds cases their random data does not reach
(a denormal bf16, an FMA-sensitive tail element, the pairing of vdpbf16ps).
"""
from __future__ import annotations

import numpy as np
import pytest

from infer_helpers import f32_bits
from strata_ref import GGMLType as T, block_format
from strata_ref.cpu import act_quant
from strata_ref.cpu.dots_small import pack_small
from strata_ref.cpu.matmul import QMatrix
from strata_ref.numerics import f32_to_bf16_bits, fma_f32

f32 = np.float32


def _fma(a, b, c):
    return f32(fma_f32(f32(a), f32(b), f32(c)))


def _hsum8(v):
    s = (v[4:] + v[:4]).astype(f32)
    return f32(f32(s[0] + s[2]) + f32(s[1] + s[3]))


def _lanes(w, x):
    """int64 (8,): lane L = exact dot of values 4L..4L+3 of 32."""
    return (w.astype(np.int64) * x.astype(np.int64)).reshape(8, 4).sum(axis=1)


def _wide_blocks(t, rows, cols, rng):
    """Random valid blocks of type t with block scales spread over 2^-8..2^8
    (so that the order of the float sums matters)."""
    fmt = block_format(t)
    nb = rows * cols // fmt.block_values
    b = rng.integers(0, 256, (nb, fmt.block_bytes), dtype=np.uint8)
    for f in fmt.fields:
        if f.dtype == np.float16:
            d = (2.0 ** rng.uniform(-8, 8, nb) * 1e-2).astype(np.float16)
            b[:, f.offset:f.offset + 2] = d.view(np.uint8).reshape(nb, 2)
        elif f.name == "e":
            b[:, f.offset] = rng.integers(112, 144, nb)
        elif f.name == "d":                          # NVFP4's UE4M3 scales
            b[:, f.offset:f.offset + f.nbytes] = rng.integers(0x10, 0x70, (nb, f.nbytes))
    return b.reshape(-1)


def _wide_acts(n, cols, rng):
    return (rng.standard_normal((n, cols)) * 2.0 ** rng.uniform(-6, 6, (n, cols))).astype(f32)


def _mm(t, raw, rows, cols, x, profile):
    qm = QMatrix(t, raw, rows, cols, t.name, profile)
    qm.repackable = False
    return qm.matmul(x)


# --------------------------------------------------- NumPy restatements
def _b32_avx2(w, ws, xq, xs):
    # ggml_vec_dot_iq4_nl_q8_0 / _mxfp4_q8_0 (AVX2): even blocks and odd
    # blocks in two accumulators, an odd last block in the scalar tail
    nb = ws.size
    acc = np.zeros((2, 8), f32)
    ib = 0
    while ib + 1 < nb:
        for k in (0, 1):
            j = ib + k
            d = f32(xs[j] * ws[j])
            acc[k] = fma_f32(np.full(8, d, f32), _lanes(w[32 * j:32 * j + 32], xq[32 * j:32 * j + 32]).astype(f32),
                             acc[k])
        ib += 2
    s = _hsum8((acc[0] + acc[1]).astype(f32))
    if ib < nb:
        s = _fma(f32(xs[ib] * ws[ib]), f32(_lanes(w[32 * ib:], xq[32 * ib:]).sum()), s)
    return s


def _b32_one_acc(w, ws, xq, xs):
    # tinyBLAS_Q0_AVX: one accumulator, every block
    acc = np.zeros(8, f32)
    for j in range(ws.size):
        d = f32(ws[j] * xs[j])
        acc = fma_f32(np.full(8, d, f32), _lanes(w[32 * j:32 * j + 32], xq[32 * j:32 * j + 32]).astype(f32), acc)
    return _hsum8(acc)


def _b32_repacked(w, ws, xq, xs):
    # iq4_nl_8x8 / mxfp4_8x8 gemv and gemm: one scalar accumulator of block dots
    s = f32(0)
    for j in range(ws.size):
        s = _fma(f32(np.dot(w[32 * j:32 * j + 32].astype(np.int64), xq[32 * j:32 * j + 32])), f32(ws[j] * xs[j]), s)
    return s


@pytest.mark.parametrize("t", [T.IQ4_NL, T.MXFP4], ids=lambda t: t.name)
def test_iq4_nl_mxfp4_orders(t):
    # 5 blocks: two pairs in the two accumulators, one in the scalar tail
    rng = np.random.default_rng(1)
    rows, cols = 24, 160
    raw = _wide_blocks(t, rows, cols, rng)
    _, wq, ws = pack_small(t, raw, rows, cols)
    x = _wide_acts(2, cols, rng)
    xq, xs = act_quant.q8_0_fields(x)
    vec = np.array([_b32_avx2(wq[r], ws[r], xq[0], xs[0]) for r in range(rows)])
    one = np.array([[_b32_one_acc(wq[r], ws[r], xq[t_], xs[t_]) for r in range(rows)] for t_ in range(2)])
    rep = np.array([[_b32_repacked(wq[r], ws[r], xq[t_], xs[t_]) for r in range(rows)] for t_ in range(2)])
    assert (f32_bits(vec) != f32_bits(one[0])).any() and (f32_bits(rep[0]) != f32_bits(one[0])).any()
    assert np.array_equal(f32_bits(_mm(t, raw, rows, cols, x[:1], "avx2")[0]), f32_bits(vec))
    if t == T.IQ4_NL:        # two rows: tinyBLAS_Q0 (the Q4_0 order, not vec_dot's)
        assert np.array_equal(f32_bits(_mm(t, raw, rows, cols, x, "avx512")), f32_bits(one))
    qm = QMatrix(t, raw, rows, cols, "", "avx2")        # 24 rows: repacked
    assert qm.repacked()
    assert np.array_equal(f32_bits(qm.matmul(x)), f32_bits(rep))


def test_nvfp4_two_scales_per_vector():
    # AVX2: lanes 0-3 carry the first sub-block of 16 (its own UE4M3
    # scale), lanes 4-7 the second, in one accumulator over the row; the
    # generic code (the baseline build, no FMA) adds one product per 16
    # values to a float
    rng = np.random.default_rng(2)
    rows, cols = 8, 256
    raw = _wide_blocks(T.NVFP4, rows, cols, rng)
    _, wq, ws = pack_small(T.NVFP4, raw, rows, cols)
    x = _wide_acts(1, cols, rng)

    def sub_dot(r, xq, g):
        return f32(np.dot(wq[r, 16 * g:16 * g + 16].astype(np.int64), xq[0, 16 * g:16 * g + 16]))

    xq, xs = act_quant.q8_0_fields(x)
    want, per16 = [], []
    for r in range(rows):
        acc = np.zeros(8, f32)
        for h in range(cols // 32):
            lanes = _lanes(wq[r, 32 * h:32 * h + 32], xq[0, 32 * h:32 * h + 32]).astype(f32)
            sc = np.repeat([f32(ws[r, 2 * h] * xs[0, h]), f32(ws[r, 2 * h + 1] * xs[0, h])], 4).astype(f32)
            acc = fma_f32(sc, lanes, acc)
        want.append(_hsum8(acc))
        s = f32(0)
        for g in range(cols // 16):
            s = _fma(f32(xs[0, g // 2] * ws[r, g]), sub_dot(r, xq, g), s)
        per16.append(s)
    assert (f32_bits(want) != f32_bits(per16)).any()
    assert np.array_equal(f32_bits(_mm(T.NVFP4, raw, rows, cols, x, "avx2")[0]), f32_bits(want))
    xq, xs = act_quant.q8_0_fields(x, ref=True)
    gen = []
    for r in range(rows):
        s = f32(0)
        for g in range(cols // 16):
            s = f32(s + f32(f32(xs[0, g // 2] * ws[r, g]) * sub_dot(r, xq, g)))
        gen.append(s)
    assert np.array_equal(f32_bits(_mm(T.NVFP4, raw, rows, cols, x, "scalar")[0]), f32_bits(gen))


def test_q1_0_block_then_row_scale():
    # per block of 128: b = d_a0 * lanes_0 (a multiply), b = fma(d_aK,
    # lanes_K, b), then acc = fma(d_w, b, acc)
    rng = np.random.default_rng(3)
    rows, cols = 8, 512
    raw = _wide_blocks(T.Q1_0, rows, cols, rng)
    _, wq, ws = pack_small(T.Q1_0, raw, rows, cols)
    x = _wide_acts(1, cols, rng)
    xq, xs = act_quant.q8_0_fields(x)
    want, flat = [], []
    for r in range(rows):
        acc = np.zeros(8, f32)
        alt = np.zeros(8, f32)
        for b in range(cols // 128):
            blk = None
            for k in range(4):
                o = 128 * b + 32 * k
                lanes = _lanes(wq[r, o:o + 32], xq[0, o:o + 32]).astype(f32)
                blk = (xs[0, 4 * b] * lanes).astype(f32) if k == 0 else fma_f32(np.full(8, xs[0, 4 * b + k], f32),
                                                                               lanes, blk)
                alt = fma_f32(np.full(8, f32(ws[r, b] * xs[0, 4 * b + k]), f32), lanes, alt)
            acc = fma_f32(np.full(8, ws[r, b], f32), blk, acc)
        want.append(_hsum8(acc))
        flat.append(_hsum8(alt))
    assert (f32_bits(want) != f32_bits(flat)).any()
    assert np.array_equal(f32_bits(_mm(T.Q1_0, raw, rows, cols, x, "avx2")[0]), f32_bits(want))


@pytest.mark.parametrize("t", [T.TQ1_0, T.TQ2_0], ids=lambda t: t.name)
def test_tq_lanes_carry_their_bsums(t):
    # the -1 of each code goes through the Q8_K bsums per lane (lane L gets
    # bsums 2L and 2L+1), the lanes are FMAed with d_a * d_w per super-block
    rng = np.random.default_rng(4)
    rows, cols = 8, 1024
    raw = _wide_blocks(t, rows, cols, rng)
    _, wq, ws = pack_small(t, raw, rows, cols)
    x = _wide_acts(1, cols, rng)
    xq, xd, xb = act_quant.q8_k_fields(x)
    want, signed = [], []
    for r in range(rows):
        acc = np.zeros(8, f32)
        alt = np.zeros(8, f32)
        for b in range(cols // 256):
            lanes = sum(_lanes(wq[r, 256 * b + 32 * c:256 * b + 32 * c + 32], xq[0, 256 * b + 32 * c:256 * b + 32 * c + 32])
                        for c in range(8))
            lanes = lanes - xb[0, 16 * b:16 * b + 16].reshape(8, 2).sum(axis=1)
            d = np.full(8, f32(xd[0, b] * ws[r, b]), f32)
            acc = fma_f32(lanes.astype(f32), d, acc)
            # signed values in the lanes instead: the same total, other lanes
            sl = sum(_lanes(wq[r, 256 * b + 32 * c:256 * b + 32 * c + 32].astype(np.int64) - 1,
                            xq[0, 256 * b + 32 * c:256 * b + 32 * c + 32]) for c in range(8))
            alt = fma_f32(sl.astype(f32), d, alt)
        want.append(_hsum8(acc))
        signed.append(_hsum8(alt))
    assert (f32_bits(want) != f32_bits(signed)).any()
    assert np.array_equal(f32_bits(_mm(t, raw, rows, cols, x, "avx2")[0]), f32_bits(want))


# ----------------------------------------------------------- float types
def _bf16(v):
    """float32 values exactly representable in bf16 -> uint16 bits."""
    return (np.asarray(v, f32).view(np.uint32) >> 16).astype(np.uint16)


def test_vdpbf16ps_adds_the_odd_pair_first():
    # one output of tinyBLAS<32, __m512, __m512bh> (AVX512-BF16), k = 64:
    # lane 0 takes elements 0, 1 (first step) and 32, 33 (second step).
    # Step 1 makes it 2^24; step 2 adds the odd pair's 1 first (2^24 + 1
    # is a tie, kept at 2^24) and then 1.5 (2^24 + 1.5 -> 2^24 + 2). The
    # even pair first would give 2^24 + 1.5 -> 2^24 + 2, then + 1 -> a tie
    # rounded to 2^24 + 4.
    w = np.zeros((4, 64), f32)
    x = np.zeros((2, 64), f32)
    w[0, 1], x[:, 1] = 2.0 ** 12, 2.0 ** 12
    w[0, 33], x[:, 33] = 1.0, 1.0
    w[0, 32], x[:, 32] = 1.5, 1.0
    raw = _bf16(w).view(np.uint8).reshape(-1)
    y = _mm(T.BF16, raw, 4, 64, x, "avx512")
    assert y[0, 0] == f32(2.0 ** 24 + 2)
    # the AVX2 build's 8 FMA lanes: lane 0 takes 0, 8, 16, ..., lane 1 the
    # odd elements 1, 33: 2^24 + 1 -> 2^24; lane 0: 1.5; hsum: 2^24 + 1.5
    assert _mm(T.BF16, raw, 4, 64, x, "avx2")[0, 0] == f32(2.0 ** 24 + 2)


def test_vdpbf16ps_reads_denormals_as_zero():
    # a denormal bf16 weight (bits 0x0001, 2^-133) times 2^100: vdpbf16ps
    # (the AVX512-BF16 build, vec_dot and tinyBLAS) counts it as zero; the
    # AVX2 build's float FMAs and the baseline build's products keep 2^-33
    w = np.zeros((4, 64), np.uint16)
    w[:, 5] = 0x0001
    x = np.zeros((2, 64), f32)
    x[:, 5] = 2.0 ** 100
    raw = w.view(np.uint8).reshape(-1)
    for n in (1, 2):            # vec_dot (ggml_vec_dot_bf16) and tinyBLAS
        assert np.all(_mm(T.BF16, raw, 4, 64, x[:n], "avx512") == 0)
        for prof in ("avx2", "scalar"):
            assert np.all(_mm(T.BF16, raw, 4, 64, x[:n], prof) == f32(2.0 ** -33))


@pytest.mark.parametrize("pos, want_avx2, want_avx512", [(64, 0.0, 2.0 ** -24), (70, 2.0 ** -24, 2.0 ** -24)])
def test_f32_vec_dot_tail_is_fused_only_at_the_end(pos, want_avx2, want_avx512):
    # ggml_vec_dot_f32 on 71 values: 64 in the vector loop, the 7 left over
    # as GCC vectorized them: rounded products of whole vectors of 4 (AVX2)
    # or 8 (AVX-512) added in order, the last ones by FMA. Element 0 puts
    # -(1 + 2^-11) in the sum; the element at `pos` multiplies (1 + 2^-12)
    # by itself, 1 + 2^-11 + 2^-24: rounded first it cancels to 0, fused
    # it leaves 2^-24. The baseline build adds rounded products in double.
    cols = 71
    w = np.zeros((3, cols), f32)
    x = np.zeros((1, cols), f32)
    w[:, 0], x[0, 0] = -(1 + 2.0 ** -11), 1.0
    w[:, pos] = x[0, pos] = 1 + 2.0 ** -12
    raw = w.view(np.uint8).reshape(-1)
    assert _mm(T.F32, raw, 3, cols, x, "avx2")[0, 0] == f32(want_avx2)
    assert _mm(T.F32, raw, 3, cols, x, "avx512")[0, 0] == f32(want_avx512)
    assert _mm(T.F32, raw, 3, cols, x, "scalar")[0, 0] == 0.0


def test_bf16_avx2_vec_dot_reduction():
    # ggml_vec_dot_bf16 (AVX2): four 8-lane FMA accumulators c1..c4 over
    # steps of 32, then (c1 + c3) + (c2 + c4) and hsum, into a double; the
    # F32 / F16 reduction (c1 + c3) + (c2 + c4) then (lo + hi) and two hadds
    # differs from it in the last step
    rng = np.random.default_rng(5)
    rows, cols = 64, 100
    w = (rng.standard_normal((rows, cols)) * 2.0 ** rng.uniform(-8, 8, (rows, cols))).astype(f32)
    raw16 = _bf16(w)
    wv = (raw16.astype(np.uint32) << 16).view(f32)
    x = _wide_acts(1, cols, rng)
    xv = (f32_to_bf16_bits(x).astype(np.uint32) << 16).view(f32)[0]     # ggml's rounding
    want, other = [], []
    for r in range(rows):
        c = np.zeros((4, 8), f32)
        for i in range(0, 96, 32):
            for k in range(4):
                c[k] = fma_f32(wv[r, i + 8 * k:i + 8 * k + 8], xv[i + 8 * k:i + 8 * k + 8], c[k])
        v = ((c[0] + c[2]).astype(f32) + (c[1] + c[3]).astype(f32)).astype(f32)
        tot = np.float64(_hsum8(v))
        t4 = (v[:4] + v[4:]).astype(f32)
        alt = np.float64(f32(f32(t4[0] + t4[1]) + f32(t4[2] + t4[3])))
        for i in range(96, cols):          # the rest in double, in order
            tot += np.float64(f32(wv[r, i] * xv[i]))
            alt += np.float64(f32(wv[r, i] * xv[i]))
        want.append(f32(tot))
        other.append(f32(alt))
    assert (f32_bits(want) != f32_bits(other)).any()
    assert np.array_equal(f32_bits(_mm(T.BF16, raw16.view(np.uint8).reshape(-1), rows, cols, x, "avx2")[0]),
                          f32_bits(want))


def test_vdpbf16ps_is_the_instruction():
    # tests/data/avx512/vdpbf16ps.npz: `_mm512_dpbf16_ps` run on an
    # AVX512-BF16 CPU (tools/vdpbf16ps_vectors.py), including sums that land
    # within an ulp of +-FLT_MIN, where the instruction rounds as if the
    # exponent were unbounded and then flushes, and raw random bits
    from numba import njit

    from strata_ref.cpu.isa.x86_avx512 import dpbf16

    @njit
    def run(acc, a, b):
        for i in range(0, acc.shape[0], 16):
            dpbf16(acc, i, a, 2 * i, b, 2 * i)

    from infer_helpers import DATA
    v = np.load(DATA / "avx512" / "vdpbf16ps.npz")
    acc = v["acc"].copy()
    a = (v["a"].astype(np.uint32) << 16).view(f32).reshape(-1)
    b = (v["b"].astype(np.uint32) << 16).view(f32).reshape(-1)
    run(acc, np.ascontiguousarray(a), np.ascontiguousarray(b))
    want = v["out"]
    same = (f32_bits(acc) == f32_bits(want)) | (np.isnan(acc) & np.isnan(want))
    assert same.all(), np.flatnonzero(~same)[:10]
    near = np.abs(v["acc"]) < 2.0 ** -125
    assert (want[near] == 0).sum() > 50 and (want[near] != 0).sum() > 50


def test_both_f16_widenings_are_the_table():
    # the F16 weight rows are widened in the kernel: by LLVM's fpext where
    # it is an instruction, else by integer code; both must give ggml's
    # fp16 -> f32 value of every bit pattern (NaNs quieted, as vcvtph2ps)
    from numba import njit

    from strata_ref.cpu.dots_float import _HOST_F16C, _fpext_half, _half_to_f32
    from strata_ref.numerics import F16_TO_F32

    @njit
    def widen(h, out, fpext):
        for i in range(h.shape[0]):
            out[i] = _fpext_half(h[i]) if fpext else _half_to_f32(h[i])

    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    for fpext in ([False, True] if _HOST_F16C else [False]):
        out = np.empty(65536, f32)
        widen(h, out, fpext)
        assert np.array_equal(f32_bits(out), f32_bits(F16_TO_F32)), fpext


@pytest.mark.parametrize("t, parts", [(T.IQ4_NL, (16, 12, 8)), (T.MXFP4, (8, 4)), (T.F16, (8, 6, 4)),
                                      (T.BF16, (6, 8))], ids=lambda v: getattr(v, "name", str(v)))
def test_stacked_parts_keep_their_own_paths(t, parts):
    # ggml picks a path per GGUF tensor: in a stack of q|k|v the parts with
    # rows % 8 == 0 stay repacked (IQ4_NL, MXFP4) and those with rows % 4
    # == 0 take tinyBLAS (float types) even when a neighbour does not
    rng = np.random.default_rng(7)
    cols = 128
    mats = []
    for rows in parts:
        if t in (T.F16, T.BF16):
            w = (rng.standard_normal((rows, cols)) * 2.0 ** rng.uniform(-4, 4, (rows, cols))).astype(f32)
            bits = _bf16(w) if t == T.BF16 else w.astype(np.float16).view(np.uint16)
            raw = bits.view(np.uint8).reshape(-1)
        else:
            raw = _wide_blocks(t, rows, cols, rng)
        mats.append(QMatrix(t, raw, rows, cols, "", "avx2"))
    x = _wide_acts(5, cols, rng)
    stacked = QMatrix.stack(mats)
    want = np.concatenate([m.matmul(x) for m in mats], axis=1)
    assert np.array_equal(f32_bits(stacked.matmul(x)), f32_bits(want))
    # and it matters: one path for the whole stack gives other bits
    one = QMatrix(t, stacked.raw, stacked.rows, cols, "", "avx2")
    one.repackable = False           # as the old whole-stack rule: a part is not % 8
    assert (f32_bits(one.matmul(x)) != f32_bits(want)).any()
