"""ggml-cpu's AMX mat-mul (`strata_ref.cpu.amx`, the v0.4.0-sapphirerapids
profile), bit for bit.

* Against ggml itself: tests/data/v0.4.0-sapphirerapids/ggml_amx_mm.npz
  holds `ggml_mul_mat` of a weight in the AMX buffer, computed by the
  shipped `libggml-cpu-sapphirerapids.so` (made by `python
  tools/amx_mm.py`), for every type the AMX buffer takes at M = 1 (its
  VNNI kernel), 2 and 33 (its AMX tile kernel), with rows whose integer
  sums pass 2^24 (`_amx.big_blocks`).
* Against an independent computation: the module docstring's formula
  evaluated in Python, its integers from the format oracle (a block
  dequantized with d = 1 and the mins' scale 0 is exactly scale * q), its
  FMAs by `numerics.fma_f32`, on blocks where that rounding differs from
  zen4's `vec_dot` (the integer above 2^24, one FMA chain against lanes).
* Where ggml's AMX buffer takes a weight (`traits.amx_buffer`,
  `extra_buffer_type::supports_op`), and that nothing else is taken.
"""
from __future__ import annotations

import numpy as np
import pytest

from _amx import BIG_TYPES, big_blocks, positive_rows
from infer_helpers import DATA, f32_bits
from strata_ref import cpu
from strata_ref.cpu.act_quant import q8_0_fields, q8_1_fields, q8_k_fields
from strata_ref.cpu.matmul import QMatrix
from strata_ref.cpu.traits import amx_buffer
from strata_ref.dequant import dequant_f32
from strata_ref.numerics import fma_f32
from strata_ref.types import GGMLType as T
from strata_ref.types import block_format

SPR = "v0.4.0-sapphirerapids"
ZEN4 = "v0.4.0-zen4"
STORED = DATA / "v0.4.0-sapphirerapids" / "ggml_amx_mm.npz"
f32 = np.float32


# ------------------------------------------------------------- ggml's own
@pytest.fixture(scope="module")
def stored():
    return np.load(STORED)


def test_stored_file_is_ggml_amx(stored):
    assert str(stored["cpu_library"]) == "libggml-cpu-sapphirerapids.so"
    assert str(stored["command"]).startswith("python tools/amx_mm.py")
    assert {str(t) for t in stored["types"]} == {"Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16"}
    assert stored["ns"].tolist() == [1, 2, 33]


@pytest.mark.parametrize("t", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16"])
def test_amx_is_ggml_amx_bitwise(stored, t):
    rows, cols = int(stored["rows"]), int(stored["cols"])
    q = QMatrix(T[t], stored[f"{t}_w"], rows, cols, t, SPR)
    for n in stored["ns"]:
        assert q.segments(int(n)) == [(0, rows, "amx")]
        got = q.matmul(stored[f"x{n}"])
        bad = np.flatnonzero((f32_bits(got) != f32_bits(stored[f"{t}_y{n}"])).any(axis=0))
        assert bad.size == 0, f"{t} n={n}: weight rows {bad.tolist()} differ"


# each type compiles zen4's mat-mul (about 20 s on a 2-core Zen 3): two by
# default, the others under `-m slow` (CI time)
@pytest.mark.parametrize("t", [pytest.param(t, marks=() if t in ("Q8_0", "Q4_K") else (pytest.mark.slow,))
                               for t in ("Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16")])
def test_zen4_is_not_amx(stored, t):
    # the stored outputs tell the AMX path from zen4's for every type but
    # Q4_0 (zen4 takes its weights, rows % 8 == 0, in CPU_REPACK's
    # q4_0_8x8, whose per-block chain rounds as AMX's does here)
    rows, cols = int(stored["rows"]), int(stored["cols"])
    q = QMatrix(T[t], stored[f"{t}_w"], rows, cols, t, ZEN4)
    assert (f32_bits(q.matmul(stored["x2"])) != f32_bits(stored[f"{t}_y2"])).any(), t


# ------------------------------------------------- independent computation
def _ints(t, blocks, d_field: str, zero: tuple):
    """float32 -> int64 values of the oracle's dequantization with the fp16
    field `d_field` set to 1.0 and the fields in `zero` set to 0: scale *
    q exactly (every product of small integers and 1.0 is exact)."""
    fmt = block_format(t)
    b = blocks.copy()
    for name, val in ((d_field, 0x3C00),) + tuple((z, 0) for z in zero):
        o = fmt.offset(name)
        b[:, o:o + 2] = np.array([val], np.uint16).view(np.uint8)
    v = dequant_f32(t, b.reshape(-1), b.shape[0], fmt.block_values)
    assert np.array_equal(v, np.round(v))
    return v.astype(np.int64)


def _f16_field(t, blocks, name):
    o = block_format(t).offset(name)
    return np.ascontiguousarray(blocks[:, o:o + 2]).view(np.float16)[:, 0].astype(np.float32)


def _reference(t, raw, rows, cols, x, isa):
    """The AMX formula (strata_ref.cpu.amx docstring), evaluated in Python
    for weight type t (not F16): float32 (n, rows)."""
    fmt = block_format(t)
    qk = fmt.block_values
    nb = cols // qk
    blocks = raw.reshape(rows * nb, fmt.block_bytes)
    mins_field = {T.Q4_1: ("m",), T.Q4_K: ("dmin",), T.Q5_K: ("dmin",)}.get(t, ())
    w = _ints(t, blocks, "d", mins_field).reshape(rows, nb, qk)
    d_w = _f16_field(t, blocks, "d").reshape(rows, nb)
    if t in (T.Q4_K, T.Q5_K):
        # the mins: d = 0, dmin = 1 gives -min_j over sub-block j
        b0 = blocks.copy()
        for name, val in (("d", 0), ("dmin", 0x3C00)):
            o = fmt.offset(name)
            b0[:, o:o + 2] = np.array([val], np.uint16).view(np.uint8)
        mins = -dequant_f32(t, b0.reshape(-1), b0.shape[0], qk).reshape(rows, nb, 8, 32)[..., 0]
        dmin = _f16_field(t, blocks, "dmin").reshape(rows, nb)
    if t == T.Q4_1:
        m_w = _f16_field(t, blocks, "m").reshape(rows, nb)
        aq, ad, as_ = q8_1_fields(x, isa=isa)
    elif qk == 32:
        aq, ad = q8_0_fields(x, isa=isa)
    else:
        aq, ad, _ = q8_k_fields(x, isa=isa)
    aq = aq.astype(np.int64).reshape(x.shape[0], nb, qk)
    out = np.empty((x.shape[0], rows), np.float32)
    for m in range(x.shape[0]):
        for r in range(rows):
            c = f32(0.0)
            for b in range(nb):
                i_b = int(np.dot(w[r, b], aq[m, b]))
                if qk == 32:
                    c = f32(fma_f32(f32(i_b), f32(d_w[r, b] * ad[m, b]), c))
                    if t == T.Q4_1:
                        c = f32(fma_f32(m_w[r, b], as_[m, b], c))
                    continue
                c = f32(fma_f32(f32(i_b), f32(ad[m, b] * d_w[r, b]), c))
                if t in (T.Q4_K, T.Q5_K):
                    j_b = int(sum(int(mins[r, b, j]) * int(aq[m, b, 32 * j:32 * j + 32].sum()) for j in range(8)))
                    c = f32(fma_f32(f32(j_b), -f32(ad[m, b] * dmin[r, b]), c))
            out[m, r] = c
    return out


@pytest.mark.parametrize("t", BIG_TYPES, ids=lambda t: t.name)
def test_integer_above_2_24_rounds_once(t):
    # big_blocks against activations near +1: every super-block's I_b is
    # above 2^24, so float(I_b) rounds; zen4's vec_dot sums lanes of
    # smaller integers and rounds elsewhere
    rng = np.random.default_rng(35)
    rows, cols = 32, 512
    fmt = block_format(t)
    raw = big_blocks(t, rows * cols // fmt.block_values, rng).reshape(-1)
    x = positive_rows(2, cols, rng)
    isa = cpu.select(SPR).isa
    want = _reference(t, raw, rows, cols, x, isa)
    # the premise: the integers pass 2^24 (q8_K's scale is negative for
    # positive activations: iscale = -127 / max)
    w = _ints(t, raw.reshape(-1, fmt.block_bytes), "d", ("dmin",) if t in (T.Q4_K, T.Q5_K) else ())
    aq = q8_k_fields(x, isa=isa)[0].astype(np.int64)
    i_b = np.einsum("rbk,bk->rb", w.reshape(rows, -1, 256), aq[0].reshape(-1, 256))
    assert (np.abs(i_b) > 1 << 24).all()
    got = QMatrix(t, raw, rows, cols, "w", SPR).matmul(x)
    assert np.array_equal(f32_bits(got), f32_bits(want))
    z = QMatrix(t, raw, rows, cols, "w", ZEN4).matmul(x)
    assert (f32_bits(z) != f32_bits(want)).any()


@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0, T.Q4_0], ids=lambda t: t.name)
def test_one_fma_chain_over_blocks(t):
    # 16 blocks of 32 per row: one fma per block in order (Q4_1: two),
    # where zen4 keeps 8 lanes (vec_dot) or 16 (tinyBLAS) and sums them
    from strata_ref import synth
    rng = np.random.default_rng(36)
    rows, cols = 64, 512
    raw = synth.blocks(t, rows * cols // 32, rng, "narrow").reshape(-1)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    want = _reference(t, raw, rows, cols, x, cpu.select(SPR).isa)
    got = QMatrix(t, raw, rows, cols, "w", SPR).matmul(x)
    assert np.array_equal(f32_bits(got), f32_bits(want))
    if t != T.Q4_0:     # Q4_0: zen4's repacked q4_0_8x8 rounds the same (test_zen4_is_not_amx)
        assert (f32_bits(QMatrix(t, raw, rows, cols, "w", ZEN4).matmul(x)) != f32_bits(want)).any()


def test_f16_lanes_of_unrounded_activations():
    # tinygemm_kernel_avx: the activations stay F32; 16 lanes of fma, then
    # _mm512_reduce_add_ps ((l, l+8), (l, l+4), (l, l+2), (0, 1))
    rng = np.random.default_rng(37)
    rows, cols = 32, 64
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    want = np.empty((2, rows), np.float32)
    for m in range(2):
        for r in range(rows):
            acc = np.zeros(16, np.float32)
            for k in range(0, cols, 16):
                acc = fma_f32(x[m, k:k + 16], w[r, k:k + 16].astype(np.float32), acc).astype(np.float32)
            for h in (8, 4, 2, 1):
                acc = (acc[h:2 * h] + acc[:h]).astype(np.float32)
            want[m, r] = acc[0]
    raw = w.view(np.uint8).reshape(-1)
    got = QMatrix(T.F16, raw, rows, cols, "w", SPR).matmul(x)
    assert np.array_equal(f32_bits(got), f32_bits(want))
    assert (f32_bits(QMatrix(T.F16, raw, rows, cols, "w", ZEN4).matmul(x)) != f32_bits(want)).any()


# ------------------------------------------------------------ which weights
def test_amx_buffer_predicate():
    isa = cpu.select(SPR).isa
    for t in (T.Q4_0, T.Q4_1, T.Q8_0):
        assert amx_buffer(isa, t, 32, 32) and amx_buffer(isa, t, 576, 1536)
        assert not amx_buffer(isa, t, 48, 32) and not amx_buffer(isa, t, 16, 64)
    for t in (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS):
        assert amx_buffer(isa, t, 576, 1536)
        assert not amx_buffer(isa, t, 576, 768 + 32) and not amx_buffer(isa, t, 40, 256)
    # smollm2-iq4_xs: the 576-long IQ4_XS rows are not taken, ffn_down's are
    assert not amx_buffer(isa, T.IQ4_XS, 1536, 576)
    assert amx_buffer(isa, T.F16, 32, 16) and not amx_buffer(isa, T.F16, 32, 8)
    for t in (T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.IQ4_NL, T.BF16, T.F32, T.MXFP4):
        assert not amx_buffer(isa, t, 576, 1536), t
    for name in ("v0.4.0-zen4", "avx512", "v0.4.0-haswell", "scalar"):
        assert not amx_buffer(cpu.select(name).isa, T.Q4_0, 576, 1536), name


def test_only_mul_mat_weights_go_to_amx():
    rows, cols = 64, 256
    raw = np.zeros(rows * cols // 32 * 34, np.uint8)
    q = QMatrix(T.Q8_0, raw, rows, cols, "w", SPR)
    assert q.segments(1) == q.segments(40) == [(0, rows, "amx")]
    # a MUL_MAT_ID (an expert's rows) is not an op the AMX buffer takes
    assert "amx" not in {p for _, _, p in q.segments(3, mmid=True)}
    # a KV cache view is no weight in a model buffer
    q.repackable = False
    assert q.segments(3) != [(0, rows, "amx")] and not q.amx()
    # Q4_0 rows of 576 + 40: the first part in AMX, the second repacked
    # (rows % 8) on zen4's path
    q2 = QMatrix.stack([QMatrix(T.Q4_0, np.zeros(r * cols // 32 * 18, np.uint8), r, cols, "p", SPR)
                        for r in (576, 40)])
    assert q2.segments(3) == [(0, 576, "amx"), (576, 616, "repack")]


def test_mixed_stack_computes_each_part_on_its_path():
    from strata_ref import synth
    rng = np.random.default_rng(38)
    cols = 256
    parts = [QMatrix(T.Q8_0, synth.blocks(T.Q8_0, r * cols // 32, rng, "narrow").reshape(-1), r, cols, "p", SPR)
             for r in (32, 8)]
    x = rng.standard_normal((3, cols)).astype(np.float32)
    got = QMatrix.stack(parts).matmul(x)
    want = np.concatenate([p.matmul(x) for p in parts], axis=1)
    assert np.array_equal(f32_bits(got), f32_bits(want))
    z = QMatrix(T.Q8_0, parts[1].raw, 8, cols, "p", ZEN4).matmul(x)
    assert np.array_equal(f32_bits(got[:, 32:]), f32_bits(z))
