"""q8_1 mat-vec oracle: dp4a, hand-computed dots, the canonical reduction
order, column independence, and every type against a float64 reference
within a derived bound."""
import numpy as np
import pytest

from strata_ref.formats import dequantize_blocks
from strata_ref.routes import mmvq as M
from strata_ref.routes.mmvq_inputs import sane_blocks
from strata_ref.routes.q8_1 import q8_1_fields, quantize_q8_1
from strata_ref.types import GGMLType, block_format

T = GGMLType


def _f16(v):
    return np.array([v], np.float16).view("<u2").view(np.uint8)


def _q8(x):
    x = np.asarray(x, np.float32).reshape(-1, np.asarray(x).shape[-1])
    return quantize_q8_1(x).reshape(x.shape[0], -1, 36)


def test_dp4a_bytes_and_wraparound():
    a = np.array([0x7F80FF01], np.int32)            # bytes 1, -1, -128, 127
    b = np.array([0x01020304], np.int32)            # bytes 4, 3, 2, 1
    assert M.dp4a(a, b, 10)[0] == 10 + 4 - 3 - 256 + 127
    big = np.int32(2**31 - 1)
    one = np.array([0x00000001], np.int32)
    assert M.dp4a(one, one, big)[0] == -2**31      # int32 wraparound


def test_q8_0_hand_dot():
    # d_w = 1, q_w = 0..31 - 16; x = 127 at lane 0 and small integers: with
    # amax 127, d8 = 1 and q8 = x, so y = sum q_w · x exactly.
    fmt = block_format(T.Q8_0)
    w = np.zeros((1, fmt.block_bytes), np.uint8)
    w[0, :2] = _f16(1.0)
    qw = np.arange(32) - 16
    w[0, 2:] = qw.astype(np.int8).view(np.uint8)
    x = np.arange(32, dtype=np.float32) % 7 - 3
    x[0] = 127
    y = M.mmvq(T.Q8_0, w, _q8(x))
    assert y.shape == (1, 1)
    assert y[0, 0] == np.float32(np.dot(qw, x))


def test_q4_0_hand_dot_uses_fp16_sum():
    # Q4_0: d_w·(sumi·d8 − 4·s8) per thread; with d_w = 0.5, d8 = 1, all
    # nibbles 9 (value 9 - 8 = 1, times 0.5): y = 0.5·(9·Σq8 − 8·s8) = 0.5·Σx.
    fmt = block_format(T.Q4_0)
    w = np.zeros((1, fmt.block_bytes), np.uint8)
    w[0, :2] = _f16(0.5)
    w[0, 2:] = 0x99
    x = np.zeros(32, np.float32)
    x[0], x[5], x[20] = 127, -3, 40
    y = M.mmvq(T.Q4_0, w, _q8(x))
    assert y[0, 0] == np.float32(0.5 * (127 - 3 + 40))


def test_q4_k_hand_dot():
    # Q4_K, d = 1, dmin = 0.5, every sub-block scale 2 and min 3 (j < 4 use
    # the low 6 bits of bytes j / j+4; j >= 4 the nibbles of bytes 8..11),
    # all nibbles 5: value = 1·2·5 − 0.5·3 = 8.5; x = 127 at v = 0 and v = 255 (d8 = 1).
    fmt = block_format(T.Q4_K)
    b = np.zeros(fmt.block_bytes, np.uint8)
    b[fmt.offset("d"):fmt.offset("d") + 2] = _f16(1.0)
    b[fmt.offset("dmin"):fmt.offset("dmin") + 2] = _f16(0.5)
    sc = fmt.offset("scales")
    b[sc:sc + 4] = 2
    b[sc + 4:sc + 8] = 3
    b[sc + 8:sc + 12] = 2 | (3 << 4)
    b[fmt.offset("qs"):] = 0x55
    assert np.all(dequantize_blocks(T.Q4_K, b[None]) == 8.5)
    x = np.zeros(256, np.float32)
    x[0], x[255] = 127, 127
    y = M.mmvq(T.Q4_K, b[None], _q8(x))
    assert y[0, 0] == np.float32(8.5 * 254)


def test_canonical_reduce_order():
    # Two blocks of one thread each (T = 32, Q6_K geometry): values chosen so
    # that a different order gives different bits.
    dots = np.zeros((1, 9, 32), np.float32)        # nb = 9, BPI = 4
    dots[0, 0, 0] = 2.0 ** 24                      # tid 0, i = 0
    dots[0, 4, 0] = 1.0                            # tid 0, i = 1 -> 2^24 + 1 = 2^24
    dots[0, 8, 0] = 1.0                            # tid 0, i = 2 -> still 2^24
    dots[0, 1, 0] = 1.0                            # tid 32 (warp 1, lane 0)
    dots[0, 2, 0] = 1.0                            # warp 2, lane 0
    # lane 0: ((2^24 + 1) + 1) + 0 = 2^24 under RNE; the butterfly then adds 0s
    assert M.canonical_reduce(dots)[0] == np.float32(2.0 ** 24)
    # a lane-first order would have kept 2 + 2^24:
    dots2 = dots.copy()
    dots2[0, 1, 0], dots2[0, 1, 1] = 0.0, 0.0
    dots2[0, 2, 0] = 2.0
    assert M.canonical_reduce(dots2)[0] == np.float32(2.0 ** 24 + 2)


@pytest.mark.parametrize("t", [T.Q4_K, T.IQ4_XS, T.Q4_0, T.IQ2_S])
def test_columns_are_bitwise_single_column(t):
    rng = np.random.default_rng(11)
    fmt = block_format(t)
    k = 2 * 256
    w = sane_blocks(t, 7 * k // fmt.block_values, rng).reshape(7, -1)
    x = rng.standard_normal((8, k)).astype(np.float32)
    y = M.mmvq_f32(t, w, x)
    for c in range(8):
        assert np.array_equal(y[c].view(np.uint32), M.mmvq_f32(t, w, x[c])[0].view(np.uint32))


# ---- float64 reference with a derived bound --------------------------------
# ref = sum_v w_v · a_v in float64, w_v the dequantized weight (formats.md)
# and a_v = q8_v · d8 the dequantized activation. The kernel differs from ref by
#  (1) float32 rounding: every result is a sum tree of depth at most
#      niter + 3 (warps) + 5 (butterfly) + 12 (the per-thread combine), each
#      step with relative error 2^-24 on magnitudes bounded by A below, so
#      |err| <= n·2^-24/(1 - n·2^-24)·A  (Higham's gamma_n);
#  (2) types whose offset uses the fp16 sum s8 of the original floats
#      (Q4_0, Q5_0, Q4_1, Q5_1, IQ1_S) instead of sum_v a_v:
#      |c_b|·|s8 − sum_v a_v| per q8_1 block, c_b the per-value offset;
#  (3) the integer truncations of vecdotq.cuh (IQ2_XXS, IQ2_XS, IQ2_S,
#      IQ3_XXS): below 2·|d_w·d8| per thread call, T calls per block.
# A = sum_v (|w_v| + |c_b|)·|a_v| + sum_b |c_b|·|s8_b| bounds every partial sum.

def _offset_coeff(t, blocks):
    """Per (block, q8 sub-block): |c| the value offset times d the kernel
    takes from s8, or 0 for types that do not read s8."""
    f = block_format(t).split(blocks)
    h = lambda a: a[:, 0].view(np.float16).astype(np.float64)   # noqa: E731
    if t == T.Q4_0:
        return np.abs(8 * h(f["d"]))[:, None]
    if t == T.Q5_0:
        return np.abs(16 * h(f["d"]))[:, None]
    if t in (T.Q4_1, T.Q5_1):
        return np.abs(h(f["m"]))[:, None]
    if t == T.IQ1_S:
        return np.repeat(np.abs(h(f["d"])) * 15 * 1.125, 8).reshape(-1, 8)
    return None


@pytest.mark.parametrize("t", M.SUPPORTED_TYPES, ids=lambda t: t.name)
def test_against_float64_reference(t):
    rng = np.random.default_rng(int(t) + 100)
    fmt = block_format(t)
    rows, ncols = 6, 2
    k = 1024 if fmt.block_values == 256 else 224
    nb = k // fmt.block_values
    w = sane_blocks(t, rows * nb, rng)
    x = rng.standard_normal((ncols, k)).astype(np.float32)
    q8 = _q8(x)
    y = M.mmvq(t, w.reshape(rows, -1), q8).astype(np.float64)

    wv = dequantize_blocks(t, w).astype(np.float64).reshape(rows, k)
    d8, s8, qs = q8_1_fields(q8.reshape(-1, 36))
    a = (qs.astype(np.float64) * d8.astype(np.float64)[:, None]).reshape(ncols, k)
    ref = a @ wv.T
    c = _offset_coeff(t, w)
    nsub = fmt.block_values // 32
    if c is None:
        cv = np.zeros((rows, k))
        e_s = np.zeros((ncols, rows))
        a_s = 0.0
    else:
        cb = c.reshape(rows, nb * nsub)                        # per q8 block
        cv = np.repeat(cb, 32, axis=1)
        s8b = s8.astype(np.float64).reshape(ncols, -1)
        asum = a.reshape(ncols, -1, 32).sum(axis=2)
        e_s = np.abs(s8b - asum) @ cb.T
        a_s = np.abs(s8b) @ cb.T
    big_a = np.abs(a) @ (np.abs(wv) + cv).T + a_s
    niter = -(-nb // M.GEOMETRY[t].bpi)
    n = niter + 3 + 5 + 12
    e_round = n * 2.0 ** -24 / (1 - n * 2.0 ** -24) * big_a
    e_trunc = 0.0
    if t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS):
        dw = block_format(t).split(w)["d"][:, 0].view(np.float16).astype(np.float64)
        e_trunc = 2 * M.GEOMETRY[t].T * np.abs(dw.reshape(rows, nb)).sum(axis=1) * np.abs(d8).max()
    bound = e_round + e_s + e_trunc
    err = np.abs(y - ref)
    assert np.isfinite(y).all()
    assert (err <= bound).all(), (err.max(), bound.min())
    # the bound is not vacuous: it is small against the result's scale
    assert bound.max() < 0.05 * (np.abs(a) @ np.abs(wv).T).max()


def test_bad_arguments():
    w = np.zeros((2, 144), np.uint8)
    with pytest.raises(ValueError):
        M.mmvq(T.Q4_K, w, np.zeros((1, 7, 36), np.uint8))        # K = 224 not / 256
    with pytest.raises(ValueError):
        M.mmvq(T.F16, w, np.zeros((1, 8, 36), np.uint8))
    with pytest.raises(TypeError):
        M.mmvq(T.Q4_K, w.astype(np.int8), np.zeros((1, 8, 36), np.uint8))
    with pytest.raises(ValueError):
        M.mmvq(T.Q4_K, w, np.zeros((9, 8, 36), np.uint8))        # 9 columns
    with pytest.raises(TypeError):
        M.mmvq_f32(T.Q4_K, w, np.zeros(256, np.float64))


def test_bad_activation_shapes_name_the_shape():
    w = np.zeros((4, 144), np.uint8)
    with pytest.raises(ValueError, match=r"\(K,\) or \(ncols, K\).*\(1, 2, 256\)"):
        M.mmvq_f32(T.Q4_K, w, np.zeros((1, 2, 256), np.float32))
    with pytest.raises(ValueError, match=r"\(256, 1\).*multiple of 32"):
        M.mmvq_f32(T.Q4_K, w, np.zeros((256, 1), np.float32))     # 256 columns of K = 1
    with pytest.raises(ValueError, match="K = 0"):
        M.mmvq(T.Q4_K, w, np.zeros((1, 0, 36), np.uint8))
    rng = np.random.default_rng(5)
    wq = sane_blocks(T.Q4_K, 4, rng).reshape(4, 144)
    q8 = quantize_q8_1(rng.standard_normal(256).astype(np.float32))
    by_name, by_type = M.mmvq("q4_k", wq, q8), M.mmvq(T.Q4_K, wq, q8)          # names accepted
    assert np.array_equal(by_name.view(np.uint32), by_type.view(np.uint32))
