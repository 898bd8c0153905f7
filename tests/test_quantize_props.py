"""Properties of the reference quantizers (hypothesis).

1. Error bound: dequantize(quantize(x)) stays within a bound derived, per
   format, from its scale rule in ggml's `quantize_row_*_ref` (comments at
   each bound). Notation: A = max|x| over the block (float64), R = max - min,
   q the integer code, d the scale; H = 2^-10 covers the fp16 rounding of a
   scale (relative 2^-11) and the float32 roundings of x·id (relative 2^-24)
   with room to spare; ABS = 2^-17 covers scales that fall into the fp16
   subnormal range (absolute error 2^-25 per unit of |q| <= 127).
   Dequantization: gguf-py 0.19.0 where it can (bitwise equal to ggml's
   `dequantize_row_*` on valid blocks, spec/formats.md §9), else the oracle.
2. K-quants: the codes are recomputed from the *stored* sub-block scale and
   min (`nearest_int((x + dm)/d)` or `nearest_int(x/d)`, clamped), so every
   value dequantizes to the grid point of its sub-block nearest to x. The
   test decodes the stored scales itself, from ggml-common.h's struct order
   (spec/formats.md §3, §5), and checks that.
3. Idempotence: re-quantizing an exactly dequantized block gives the same
   bytes where the rule implies it (the dequantized block's max reproduces
   the stored scale exactly): F16, BF16, Q4_0, Q5_0, Q8_0, Q8_1, TQ1_0,
   TQ2_0, Q2_0, Q1_0 (scale != 0), MXFP4/NVFP4 (up to the code of -0, which
   re-quantizes to the first zero code) and Q8_K's codes. Not implied for
   Q4_1/Q5_1 (max·d + m rounds in float32, which can move the fp16 scale)
   nor for the K-quants' searched scales.
"""
import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_ref.formats import dequantize_blocks
from strata_ref.numerics import bf16_bits_to_f32, f16_bits_to_f32
from strata_ref.quantize import quantize
from strata_ref.types import block_format

H = 2.0 ** -10
ABS = 2.0 ** -17
SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


KINDS = ["normal", "t2", "ties", "constant", "spike", "uniform", "wide", "zeros"]


@st.composite
def blocks(draw, qk, lo=1e-2, hi=1e3, nmax=3):
    """(n, qk) float32 with max|x| <= s, s in [lo, hi]: a seeded background of
    one kind (normal, heavy-tailed t2, half-integer ties, constant, one spike,
    uniform, magnitudes spread over 30 decades, zeros) with up to 6 values
    drawn by hypothesis itself at drawn positions (so it can shrink them)."""
    n = draw(st.integers(1, nmax))
    kind = draw(st.sampled_from(KINDS))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    shape = (n, qk)
    u = {"normal": lambda: rng.standard_normal(shape),
         "t2": lambda: rng.standard_t(2, shape),
         "ties": lambda: rng.integers(-16, 17, shape) / 2.0,
         "constant": lambda: np.full(shape, rng.choice([-1.0, 1.0])),
         "spike": lambda: np.where(np.arange(qk) == rng.integers(qk), 1.0, rng.standard_normal(shape) * 1e-3),
         "uniform": lambda: rng.uniform(-1, 1, shape),
         "wide": lambda: rng.standard_normal(shape) * 10.0 ** rng.uniform(-30, 0, shape),
         "zeros": lambda: np.zeros(shape)}[kind]()
    top = np.abs(u).max(axis=1, keepdims=True)
    u = np.where(top > 0, u / np.where(top > 0, top, 1), u)
    picks = draw(st.lists(st.tuples(st.integers(0, n * qk - 1), st.floats(-1, 1, width=32)), max_size=6))
    flat = u.reshape(-1)
    for pos, v in picks:
        flat[pos] = v
    s = draw(st.floats(float(np.float32(lo)), float(np.float32(hi)), width=32))
    return (u * s).astype(np.float32)


# gguf-py's dequantizers are an independent implementation and need no
# compilation; the oracle's (numba) serves the types gguf-py lacks.
GGUF_DEQ = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
            "Q6_K", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4"}


def roundtrip(x, name):
    fmt = block_format(name)
    raw = quantize(x, name)
    if name in GGUF_DEQ:
        y = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
        return raw, y.astype(np.float32).reshape(x.shape)
    if name == "F16":
        return raw, f16_bits_to_f32(raw.view("<u2")).reshape(x.shape)
    if name == "BF16":
        return raw, bf16_bits_to_f32(raw.view("<u2")).reshape(x.shape)
    b = raw.reshape(-1, fmt.block_bytes)
    return raw, dequantize_blocks(name, b).reshape(x.shape)


def per_block(x, qk, fn):
    """fn over each block of qk values (float64), broadcast back to x's shape."""
    xb = x.astype(np.float64).reshape(-1, qk)
    return np.repeat(fn(xb), qk, axis=1).reshape(x.shape)


def amax(xb):
    return np.abs(xb).max(axis=1, keepdims=True)


# name -> (QK used for the bound, bound(x) -> per-element limit)
BOUNDS = {
    # f16 RNE: half an ulp, 2^-11 relative for normals, 2^-25 absolute below.
    "F16": (1, lambda x: np.abs(x) * 2.0 ** -11 + 2.0 ** -25),
    # bf16 RNE: 2^-8 relative (8 significant bits), 2^-133 absolute for subnormals.
    "BF16": (1, lambda x: np.abs(x) * 2.0 ** -8 + 2.0 ** -133),
    # d = A/127, q = roundf(x/d): half a step, plus q·(fp16 error of d) <= A·2^-11.
    "Q8_0": (32, lambda x: per_block(x, 32, lambda b: 0.5 * amax(b) / 127 * (1 + H) + amax(b) * H) + ABS),
    "Q8_1": (32, lambda x: per_block(x, 32, lambda b: 0.5 * amax(b) / 127 * (1 + H) + amax(b) * H) + ABS),
    # d = max/-8, codes -8..7: the opposite extreme (+8 steps) is clipped to 7, one full step |d| = A/8.
    "Q4_0": (32, lambda x: per_block(x, 32, lambda b: amax(b) / 8 * (1 + H) + amax(b) * H) + ABS),
    # d = max/-16, codes -16..15: likewise one step A/16 at worst.
    "Q5_0": (32, lambda x: per_block(x, 32, lambda b: amax(b) / 16 * (1 + H) + amax(b) * H) + ABS),
    # d = R/15, m = min: half a step, fp16 error of d over 15 steps and of m.
    "Q4_1": (32, lambda x: per_block(x, 32, lambda b: 0.5 * np.ptp(b, 1, keepdims=True) / 15 * (1 + H)
                                    + np.ptp(b, 1, keepdims=True) * H + amax(b) * H) + ABS),
    "Q5_1": (32, lambda x: per_block(x, 32, lambda b: 0.5 * np.ptp(b, 1, keepdims=True) / 31 * (1 + H)
                                    + np.ptp(b, 1, keepdims=True) * H + amax(b) * H) + ABS),
    # d = A, codes -1, 0, 1 (Q2_0: 0..2 used): half of A.
    "TQ1_0": (256, lambda x: per_block(x, 256, lambda b: 0.5 * amax(b) * (1 + H) + amax(b) * H) + ABS),
    "TQ2_0": (256, lambda x: per_block(x, 256, lambda b: 0.5 * amax(b) * (1 + H) + amax(b) * H) + ABS),
    "Q2_0": (64, lambda x: per_block(x, 64, lambda b: 0.5 * amax(b) * (1 + H) + amax(b) * H) + ABS),
    # ±d with d = mean|x| <= A: |x ∓ d| <= max(|x|, d) <= A (same sign).
    "Q1_0": (128, lambda x: per_block(x, 128, lambda b: amax(b) * (1 + H)) + ABS),
    # 2^(k-2)·E2M1 grid, k = floor(log2 A): max gap 2·2^(k-2), clip above 6·2^(k-2)
    # costs < 2^(k-1) <= A/2, while the exponent byte k + 125 is in range
    # (A >= 2^-125); code 0 is always a candidate, so always <= |x|.
    "MXFP4": (32, lambda x: np.where(per_block(x, 32, amax) >= 2.0 ** -125,
                                     np.minimum(per_block(x, 32, lambda b: 0.5 * amax(b)), np.abs(x)),
                                     np.abs(x)) * (1 + 2.0 ** -20)),
    # per 16 values U = ue4m3(A/6), within 1/16 of A/6 when A/6 is a normal UE4M3
    # (>= 2^-6): max gap 2U -> U <= 0.177·A, clipping above 6U -> A/16. Below
    # that (3-bit subnormal scales) only "code 0 is a candidate": <= |x|.
    "NVFP4": (16, lambda x: np.where(per_block(x, 16, amax) / 6 >= 2.0 ** -6,
                                     np.minimum(per_block(x, 16, lambda b: 0.18 * amax(b)), np.abs(x)),
                                     np.abs(x)) * (1 + 2.0 ** -20)),
    # f32 d = 1/iscale, q = nearest_int(-127·x/max): half a step, no fp16 rounding;
    # d's own float32 rounding over |q| <= 127 steps adds < A·2^-23.
    # For A < 2^-100, -127/max overflows to -Inf, d = -0 and every value is -0: |x|.
    "Q8_K": (256, lambda x: np.where(per_block(x, 256, amax) >= 2.0 ** -100,
                                     per_block(x, 256, lambda b: 0.5 * amax(b) / 127 + amax(b) * 2.0 ** -20),
                                     np.abs(x))),
}


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_error_within_format_bound(name):
    qk = block_format(name).block_values
    width = max(qk, 32)

    @SETTINGS
    @given(x=blocks(width))
    def check(x):
        _, y = roundtrip(x, name)
        err = np.abs(y.astype(np.float64) - x.astype(np.float64))
        lim = BOUNDS[name][1](x)
        bad = np.flatnonzero(err > lim)
        assert bad.size == 0, (name, x.reshape(-1)[bad[:3]], y.reshape(-1)[bad[:3]], lim.reshape(-1)[bad[:3]])
    check()


# ---------------------------------------------------------------- K-quant grids

def _f16(b, o):
    return b[:, o:o + 2].copy().view("<f2").astype(np.float64)[:, 0]


def _grid_q2_k(b):
    # scales[16]@0 (low nibble scale, high nibble min), d@80, dmin@82; codes 0..3
    s = b[:, 0:16].astype(np.int64)
    return 16, _f16(b, 80)[:, None] * (s & 15), _f16(b, 82)[:, None] * (s >> 4), range(0, 4)


def _grid_q3_k(b):
    # scales[12]@96: low 4 bits in bytes 0..7 (nibbles), high 2 bits in bytes 8..11; d@108; codes -4..3
    sc = b[:, 96:108].astype(np.int64)
    s = np.arange(16)
    low = np.where(s < 8, sc[:, s % 8] & 15, sc[:, s % 8] >> 4)
    hi = (sc[:, 8 + s % 4] >> (2 * (s // 4))) & 3
    return 16, _f16(b, 108)[:, None] * ((low | hi << 4) - 32), 0.0, range(-4, 4)


def _k4_scales(sc):
    j = np.arange(8)
    s = np.where(j < 4, sc[:, j % 4] & 63, (sc[:, (j + 4) % 12] & 15) | ((sc[:, (j - 4) % 12] >> 6) << 4))
    m = np.where(j < 4, sc[:, (j + 4) % 12] & 63, (sc[:, (j + 4) % 12] >> 4) | ((sc[:, j] >> 6) << 4))
    return s, m


def _grid_q4_k(b, nmax=15):
    # d@0, dmin@2, scales[12]@4 (get_scale_min_k4); codes 0..nmax per 32 values
    s, m = _k4_scales(b[:, 4:16].astype(np.int64))
    return 32, _f16(b, 0)[:, None] * s, _f16(b, 2)[:, None] * m, range(0, nmax + 1)


def _grid_q6_k(b):
    # scales:i8[16]@192, d@208; codes -32..31
    return 16, _f16(b, 208)[:, None] * b[:, 192:208].view(np.int8).astype(np.float64), 0.0, range(-32, 32)


def _grid_q8_k(b):
    # d:f32@0; codes -128..127 (the quantizer caps at 127)
    return 256, b[:, 0:4].copy().view("<f4").astype(np.float64), 0.0, range(-128, 128)


GRIDS = {"Q2_K": _grid_q2_k, "Q3_K": _grid_q3_k, "Q4_K": _grid_q4_k,
         "Q5_K": lambda b: _grid_q4_k(b, 31), "Q6_K": _grid_q6_k, "Q8_K": _grid_q8_k}


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_k_quant_values_are_nearest_grid_points(name):
    fmt = block_format(name)

    @settings(SETTINGS, max_examples=20)
    @given(x=blocks(256, nmax=2))
    def check(x):
        raw, y = roundtrip(x, name)
        sub, D, M, codes = GRIDS[name](raw.reshape(-1, fmt.block_bytes))
        D = np.broadcast_to(np.asarray(D, np.float64), (len(x), 256 // sub))
        M = np.broadcast_to(np.asarray(M, np.float64), D.shape)
        xv = x.astype(np.float64).reshape(len(x), 256 // sub, sub)
        grid = D[..., None] * np.array(list(codes), np.float64) - M[..., None]
        best = np.abs(xv[..., None] - grid[:, :, None, :]).min(axis=-1)
        got = np.abs(xv - y.astype(np.float64).reshape(xv.shape))
        # (x + dm)/d and x/d are float32 operations: allow their rounding.
        tol = np.abs(D)[..., None] * 2.0 ** -16 + (np.abs(xv) + np.abs(M)[..., None]) * 2.0 ** -20
        assert (got <= best + tol).all(), name
    check()


# ---------------------------------------------------------------- idempotence

def _zero_code_canonical(raw, name):
    # the -0 code (8) re-quantizes to the first exact zero code (0): same value
    if name not in ("MXFP4", "NVFP4"):
        return raw
    fmt = block_format(name)
    b = raw.reshape(-1, fmt.block_bytes).copy()
    qs = b[:, fmt.offset("qs"):]
    lo, hi = qs & 15, qs >> 4
    qs[...] = np.where(lo == 8, 0, lo) | (np.where(hi == 8, 0, hi) << 4)
    return b.reshape(raw.shape)


IDEMPOTENT = ["F16", "BF16", "Q4_0", "Q5_0", "Q8_0", "Q8_1", "TQ1_0", "TQ2_0", "Q2_0",
              "Q1_0", "MXFP4", "NVFP4", "Q8_K"]


@pytest.mark.parametrize("name", IDEMPOTENT)
def test_requantizing_dequantized_block_reproduces_it(name):
    fmt = block_format(name)
    width = max(fmt.block_values, 32)
    lo = 0.1 if name == "NVFP4" else 1e-2       # keep NVFP4's scale out of UE4M3 subnormals

    @SETTINGS
    @given(x=blocks(width, lo=lo))
    def check(x):
        raw, y = roundtrip(x, name)
        again = quantize(y, name)
        keep = implied_blocks(name, x, raw)
        r = _zero_code_canonical(raw, name).reshape(len(keep), -1)[keep]
        a = _zero_code_canonical(again, name).reshape(len(keep), -1)[keep]
        if name == "Q8_K":
            r, a = r[:, 4:], a[:, 4:]       # the f32 d = 1/iscale may move by an ulp
        if name == "Q8_1":
            # s = fp16(Σq · d) uses the unrounded f32 d, the re-quantization the fp16 one
            o = block_format(name).offset("s")
            r, a = np.delete(r, [o, o + 1], axis=1), np.delete(a, [o, o + 1], axis=1)
        assert np.array_equal(r, a), name
    check()


def implied_blocks(name, x, raw):
    """Blocks for which ggml's rule implies that re-quantizing reproduces them.

    Scales of 0 (fp16 underflow of a tiny block) lose the codes. MXFP4 needs
    A >= 2^-100 (else the uint8 exponent wraps). NVFP4 needs each 16-value
    amax to be 0 or give a normal UE4M3 scale (A/6 >= 2^-6), where the top
    code is 6·U. Q8_K: a +127 code (an element of the other sign rounding to
    the top) can precede the -127 of the max and win the re-scan's tie.
    """
    fmt = block_format(name)
    qk = max(fmt.block_values, 32)
    xb = np.abs(x.astype(np.float64)).reshape(-1, qk)
    rb = raw.reshape(len(xb), -1)
    keep = np.ones(len(xb), bool)
    if fmt.quantized and "d" in [f.name for f in fmt.fields] and fmt.field("d").kind == "f16":
        o = fmt.offset("d")
        d = rb[:, o:o + 2].copy().view("<u2")[:, 0]
        keep &= (d & 0x7FFF) != 0
    if name == "MXFP4":
        keep &= xb.max(axis=1) >= 2.0 ** -100
    if name == "NVFP4":
        a = xb.reshape(len(xb), -1, 16).max(axis=2)
        keep &= ((a == 0) | (a / 6 >= 2.0 ** -6)).all(axis=1)
    if name == "Q8_K":
        keep &= ~(rb[:, 4:260].view(np.int8) == 127).any(axis=1)
    return keep
