"""Activation quantizers (bitwise: hand-computed blocks and ggml-cpu's own
from_float, stored by tools/llama_ref.py) and the integer-dot mat-mul
(against a float64 dot of the oracle's dequantized operands)."""
from __future__ import annotations

import numpy as np
import pytest

from strata_ref import GGMLType, block_format, dequant_f32
from strata_ref.cpu import act_quant
from strata_ref.cpu.matmul import QMatrix
from strata_ref.cpu.traits import TRAITS

#: the legacy quants and K-quants, with their activation types
VEC_DOT_TYPE = {t: r.vec_dot_type for t, r in TRAITS.items() if r.family in ("matvec", "kquant_unpacked")}
from strata_ref.quantize import quantize
from infer_helpers import profile_files


def _f16_bits(v):
    return int(np.float16(v).view(np.uint16))


# ---------------------------------------------------------------- Q8_0 / Q8_1
def test_q8_0_hand_block_rounds_half_to_even():
    # amax 127: d = 1, id = 127/127 = 1, so q = rne(x): ggml-cpu's AVX2 path.
    x = np.zeros(32, np.float32)
    x[:8] = [127.0, 63.5, 62.5, -0.5, 0.5, 1.5, -2.5, 3.25]
    blk = act_quant.quantize_q8_0_act(x)
    assert blk.shape == (1, 34)
    assert int(blk[0, :2].view(np.uint16)[0]) == _f16_bits(1.0)
    # half-even: 63.5 -> 64, 62.5 -> 62, +-0.5 -> 0, 1.5 -> 2, -2.5 -> -2 (roundf would give 63, 63, +-1, 2, -3)
    assert blk[0, 2:10].view(np.int8).tolist() == [127, 64, 62, 0, 0, 2, -2, 3]


def test_q8_1_hand_block_sum_uses_float_d():
    x = np.zeros(32, np.float32)
    x[0], x[1], x[2] = 0.3, -0.1, 0.2
    blk = act_quant.quantize_q8_1_act(x)
    d = np.float32(0.3) / np.float32(127.0)
    idd = np.float32(127.0) / np.float32(0.3)
    q = [int(np.rint(np.float32(v * idd))) for v in (np.float32(0.3), np.float32(-0.1), np.float32(0.2))]
    assert blk[0, 4:7].view(np.int8).tolist() == q
    fields = blk[0, :4].view(np.uint16)
    assert int(fields[0]) == _f16_bits(d)
    assert int(fields[1]) == _f16_bits(np.float32(d * np.float32(sum(q))))


def test_q8_k_hand_block_negative_max():
    x = np.zeros(256, np.float32)
    x[5], x[6], x[17] = -2.0, 1.0, 0.5
    blk = act_quant.quantize_q8_k_act(x)
    iscale = np.float32(-127.0) / np.float32(-2.0)           # 63.5
    assert blk[0, :4].view(np.float32)[0] == np.float32(1.0) / iscale
    qs = blk[0, 4:260].view(np.int8)
    # q = nearest_int(63.5 * x): -127, 63.5 -> 64 (half-even), 31.75 -> 32
    assert (qs[5], qs[6], qs[17]) == (-127, 64, 32)
    bsums = blk[0, 260:292].view(np.int16)
    assert bsums[0] == -127 + 64 and bsums[1] == 32 and not bsums[2:].any()


@pytest.mark.parametrize("inf", [np.inf, -np.inf])
def test_q8_k_infinite_max_gives_an_infinite_d(inf):
    # ggml's reference: iscale = -127 / max = -+0, d = 1 / iscale = -+inf
    # (C's division; numba's own would raise ZeroDivisionError)
    x = np.ones((1, 512), np.float32)
    x[0, 3] = inf
    q, d, _ = act_quant.q8_k_fields(x)
    assert d[0, 0] == -inf and d[0, 1] == np.float32(1.0) / (np.float32(-127.0) / np.float32(1.0))


def test_zero_blocks_and_bad_input():
    assert not act_quant.quantize_q8_0_act(np.zeros(64, np.float32)).any()
    assert not act_quant.quantize_q8_k_act(np.zeros(256, np.float32)).any()
    with pytest.raises(TypeError, match="float32"):
        act_quant.q8_0_fields(np.zeros(32))
    with pytest.raises(ValueError, match="multiple of 256"):
        act_quant.q8_k_fields(np.zeros(100, np.float32))


@pytest.mark.parametrize("profile, path", profile_files("ggml_act_quant.npz"))
def test_against_ggml_cpu_from_float(profile, path):
    # each build's own from_float (tools/llama_ref.py --profile P actquant):
    # the AVX code on avx2 / avx512, the reference quantizers on scalar
    from strata_ref.cpu import PROFILES
    ref = np.load(path)
    isa = PROFILES[profile].isa
    for name, fn in (("q8_0", lambda v: act_quant.quantize_q8_0_act(v, isa=isa)),
                     ("q8_1", lambda v: act_quant.quantize_q8_1_act(v, isa=isa)),
                     ("q8_k", act_quant.quantize_q8_k_act)):
        for i, row in enumerate(ref["x"]):
            got = fn(row)
            assert np.array_equal(got, ref[name][i]), f"{profile} {name} row {i} differs from ggml-cpu"


# ---------------------------------------------------------------- mat-mul
def _act_dequant(vdt, x):
    """float64 values of the quantized activations (q * d per block)."""
    if vdt == GGMLType.Q8_K:
        q, d, _ = act_quant.q8_k_fields(x)
        qk = 256
    else:
        q, d = act_quant.q8_0_fields(x)[:2]
        qk = 32
    return (q.reshape(q.shape[0], -1, qk).astype(np.float64) * d[..., None]).reshape(q.shape)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("t", sorted(VEC_DOT_TYPE, key=int))
def test_matmul_matches_float64_dot_of_the_quantized_operands(t, parallel, monkeypatch):
    from strata_ref.cpu import matmul
    monkeypatch.setattr(matmul, "PARALLEL_MIN_MACS", 0 if parallel else 1 << 62)
    rng = np.random.default_rng(int(t))
    rows, cols, n = 24, 512, 3
    w = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(0.05)
    w[0] = 0.0  # an all-zero row
    raw = quantize(w, t).reshape(-1)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[1, :256] *= np.float32(1e-3)
    W = QMatrix(t, raw, rows, cols, "w", "avx2")
    got = W.matmul(x)
    wd = dequant_f32(t, raw, rows, cols).astype(np.float64)
    xd = _act_dequant(VEC_DOT_TYPE[t], x)
    if VEC_DOT_TYPE[t] == GGMLType.Q8_1:
        # ggml's min term is m * s with s = fp16(d * sum q) of the activation
        # block, not m * sum(q * d): split the weight into d*q and m.
        fmt = block_format(t)
        blocks = raw.reshape(rows, -1, fmt.block_bytes)
        o = fmt.offset("m")
        m = blocks[:, :, o:o + 2].copy().view(np.float16)[..., 0].astype(np.float64)
        s = act_quant.q8_1_fields(x)[2].astype(np.float64)
        wd = wd - np.repeat(m, 32, axis=1)
        ref = xd @ wd.T + s @ m.T
    else:
        ref = xd @ wd.T
    # bound: each of the <= cols/16 sub-block terms carries two float32
    # roundings and the sum over them adds one per term; the oracle's own
    # dequant rounds each weight once: 1e-5 * sum |w x| is far above that
    # (< 40 * 2^-24 relative) and far below what a wrong index gives.
    bound = 1e-5 * (np.abs(xd) @ np.abs(wd).T)
    assert np.all(np.abs(got - ref) <= bound), (t, np.max(np.abs(got - ref) / (bound + 1e-30)))
    assert np.all(got[:, 0] == 0.0)


def test_matmul_type_and_shape_errors():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 256)).astype(np.float32)
    # a plain type ggml-cpu does not multiply: refused at the first product
    with pytest.raises(ValueError, match="no mat-mul for I8"):
        QMatrix(GGMLType.I8, np.zeros(4 * 256, np.uint8), 4, 256, "w", "avx2").prepare()
    W = QMatrix(GGMLType.IQ4_XS, quantize(w, GGMLType.IQ4_XS).reshape(-1), 4, 256, "w", "avx2")
    raw = W.raw
    with pytest.raises(ValueError, match=r"\(n, 256\)"):
        W.matmul(np.zeros((2, 128), np.float32))
    with pytest.raises(ValueError, match="do not hold"):
        QMatrix(GGMLType.Q8_0, raw[:10], 4, 256, "w")
    with pytest.raises(ValueError, match="multiple of the Q8_0 block size"):
        QMatrix(GGMLType.Q8_0, raw, 4, 250, "w")


def test_row_f32_is_the_oracle_row():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 64)).astype(np.float32)
    raw = quantize(w, GGMLType.Q4_1).reshape(-1)
    W = QMatrix(GGMLType.Q4_1, raw, 5, 64)
    full = dequant_f32(GGMLType.Q4_1, raw, 5, 64)
    assert np.array_equal(W.row_f32(3).view(np.uint32), full[3].view(np.uint32))


def test_f16_weights_round_the_activations_to_f16():
    # ggml multiplies F16 weights with the activations converted to F16
    w = np.array([[1.0, 1.0]], np.float16)
    W = QMatrix(GGMLType.F16, w.view(np.uint8).reshape(-1), 1, 2)
    x = np.array([[1.0 + 2.0 ** -12, 0.0]], np.float32)      # rounds to 1.0 in fp16
    assert W.matmul(x)[0, 0] == np.float32(1.0)
    W32 = QMatrix(GGMLType.F32, np.array([[1.0, 1.0]], np.float32).view(np.uint8).reshape(-1), 1, 2)
    assert W32.matmul(x)[0, 0] == x[0, 0]


def test_q8_k_tie_rule_of_the_4_row_quantizer():
    # +amax and -amax in one super-block, the negative first:
    # quantize_row_q8_K_ref takes the first (max = -5, iscale = 127/5 > 0),
    # ggml_quantize_mat_q8_K_4x8 (repacked Q4_K rows) the positive one
    # (iscale = -127/5): d = 1/iscale flips sign, so do the quants.
    x = np.zeros((2, 256), np.float32)
    x[:, 10], x[:, 200], x[:, 3] = -5.0, 5.0, 1.0
    q, d, _ = act_quant.q8_k_fields(x, mat_rows=1)
    iscale = np.float32(127.0) / np.float32(5.0)
    assert d[1, 0] == np.float32(1.0) / iscale and d[0, 0] == np.float32(1.0) / -iscale
    assert (q[1, 10], q[1, 200], q[1, 3]) == (-127, 127, 25)      # rne(25.4) = 25
    assert (q[0, 10], q[0, 200], q[0, 3]) == (127, -127, -25)
