"""The float operations of attention, the FFN activations, RoPE and the
norms, in ggml-cpu's order of arithmetic for each CPU profile (numba), so
that they equal llama.cpp's bit for bit.

Sources: ggml-cpu of the llama.cpp vendored by llama-cpp-python 0.3.36 (GCC
12); `fp` has the primitives (FMA, lane reductions, ggml's expf per build).
Every function takes the profile (`profiles.Profile`), whose instruction-set
chain (`strata_ref.cpu.isa`) decides:

* F16 mat-muls (`f16_products`): K q and V p, whose F16 operands are exact
  in float32 and whose products are exact too, so only the order of the
  additions matters. With two or more tokens ggml hands them to llamafile's
  `tinyBLAS` (`llamafile/sgemm.cpp`) when the build has it (16 lanes on
  AVX-512, 8 on AVX2; lane l accumulates elements l, l + lanes, ... by FMA,
  then `_mm512_reduce_add_ps` / `hsum`), the length is a multiple of the
  lanes and the output rows a multiple of 4. Otherwise it is
  `ggml_vec_dot_f16` (`vec.cpp`): on AVX-512 four 16-lane accumulators over
  steps of 64, on AVX2 four 8-lane ones over steps of 32, reduced pairwise
  and then across lanes (`GGML_F32x16_REDUCE` / `GGML_F32x8_REDUCE`), the
  rest of the row added in double; on the baseline build every product
  added in double. V p runs over the KV length padded with zero-weighted
  cells (llama.cpp pads it to 256; a multiple of 64 sums the same).
* `soft_max` (`ggml_compute_forward_soft_max_f32`): x * scale, masked to
  -inf, max, then per 16 (AVX-512), 8 (AVX2) or 4 (SSE2) values
  `ggml_v_expf(x - max)` and the lane sum added to a double; every value
  times (float)(1 / sum).
* `swiglu` (`ggml_vec_swiglu_f32`): `ggml_v_silu(g) * u` a vector of lanes
  at a time, the values left of a row with libm's expf.
* RoPE (`ggml_rope_cache_init`, `rotate_pairs` in `ops.cpp`): angles by
  repeated float32 products, libm cosf / sinf, and the rotation as GCC
  compiles it: contracted into FMAs where the build has FMA.
* RMSNorm (`ggml_compute_forward_rms_norm_f32`): the same in every build.
* GeGLU (`ggml_vec_geglu_f32`, GGML_GELU_FP16): ggml's fp16 GELU table,
  computed as ggml_cpu_init does (`ggml_gelu_f32`, contracted on FMA builds).

These run on the calling thread: they are small next to the mat-muls, and a
parallel region per call costs more than it saves on a busy machine.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._digest import jit
from ..numerics import f32_bits_to_f16_bits
from . import fp16_va
from .act_quant import round_to_f16
from .fp import f32_bits, fma32
from .libm import tanhf
from .simd import HOST_F16C, f8_f16_store, f8_load, f8_mul, f8_splat, f8_store, f8_sub

__all__ = ["f16_products", "soft_max", "soft_max_rows", "swiglu", "silu", "sigmoid",
           "softplus", "sum_rows", "swiglu_oai", "softcap", "rope_cache", "rope", "rms_norm", "geglu", "gelu",
           "gelu_table"]

_F32 = np.float32


@njit(inline="always", cache=True)
def tinyblas_takes(isa, n, k, m):
    """Whether llamafile's sgemm takes an F16 product of n tokens
    (tinyBLAS::matmul): the build has it and takes F16 (`TINYBLAS_F16`:
    not without F16C), n at least the chain's `TINYBLAS_F16_MIN_ROWS`,
    k % lanes == 0 (`F16_EPR` with FP16 arithmetic: `tinyBLAS<8,
    float16x8_t>`) and m % 4 == 0."""
    if isa.TINYBLAS == 0 or not isa.TINYBLAS_F16 or n < isa.TINYBLAS_F16_MIN_ROWS:
        return False
    lanes = isa.F16_EPR if isa.F16_VA else isa.TINYBLAS
    return k % lanes == 0 and m % 4 == 0


@njit(inline="always", cache=True)
def f16_tinyblas_dot(isa, a, ao, b, bo, n, acc):
    """llamafile's tinyBLAS dot of F16 operands on the chain: binary16
    `tinyBLAS<8, float16x8_t>` with FP16 arithmetic (`F16_VA`), else the
    chain's `tinyblas_dot` (operands widened)."""
    if isa.F16_VA:
        return fp16_va.tinyblas_f16x8(a, ao, b, bo, n, acc)
    return isa.tinyblas_dot(a, ao, b, bo, n, acc)


@jit
def _products(a, b, n_tok, isa, m_rows, out):
    # a (H, M, D), b (H, C, D) -> out (H, M, C); m_rows: ggml's m (rows of
    # the weight-side operand) for the tinyBLAS test
    H, M, D = a.shape
    C = b.shape[1]
    tiny = tinyblas_takes(isa, n_tok, D, m_rows)
    acc = np.empty(64, np.float32)
    for hm in range(H * M):
        h, m = hm // M, hm % M
        for c in range(C):
            if tiny:
                out[h, m, c] = f16_tinyblas_dot(isa, a[h, m], 0, b[h, c], 0, D, acc)
            else:
                out[h, m, c] = isa.vec_dot_f16(a[h, m], 0, b[h, c], 0, D, acc)


def _pad_last(a, D):
    """a float32 with its last axis zero-padded to D, contiguous."""
    if a.shape[-1] == D:
        return np.ascontiguousarray(a, np.float32)
    out = np.zeros(a.shape[:-1] + (D,), np.float32)
    out[..., :a.shape[-1]] = a
    return out


def f16_products(a: np.ndarray, b: np.ndarray, batched, profile, m_rows: int = 4) -> np.ndarray:
    """out[h, m, c] = sum_d a[h, m, d] * b[h, c, d] as ggml-cpu's F16 mat-mul
    of `profile` sums it (module docstring): `batched`, the token count of
    the call (or a bool: True for two or more tokens, False for one),
    selects tinyBLAS's order where the build takes that many (two, eight
    with Arm's FP16 arithmetic: `tinyblas_takes`), the length is a multiple
    of its lanes and `m_rows` (ggml's m, the rows of the weight-side
    operand: the KV length for K q, head_dim for V p) a multiple of 4; else
    `ggml_vec_dot_f16`, as for one token.

    a, b: float32 holding fp16 values, (H, M, Da) and (H, C, Db); the
    shorter rows count as zero-padded to the longer. The length summed over
    is llama.cpp's: head_dim for K q, and for V p the KV length, which
    llama.cpp pads to a multiple of 256 with zero-weighted cells (callers
    pass p padded to a multiple of 64, which sums the same). Returns float32
    (H, M, C)."""
    D = max(a.shape[2], b.shape[2])
    a, b = _pad_last(a, D), _pad_last(b, D)
    out = np.empty((a.shape[0], a.shape[1], b.shape[1]), np.float32)
    n_tok = (2 if batched else 1) if isinstance(batched, (bool, np.bool_)) else int(batched)
    _products(a, b, n_tok, profile.isa, int(m_rows), out)
    return out


@njit(inline="always", cache=True)
def _soft_max_row(srow, T, scale, qpos, n_swa, w, out, isa, has_sink, sink):
    # one row: srow (>= T) scores, w / out (Tp, a multiple of 64) scratch and
    # result; key c masked when c >= T, c > qpos or (n_swa and qpos - c >= n_swa).
    # ggml_vec_soft_max_f32: a vector of the build's `EXPF_LANES` at a time,
    # its lane sum added to the double sum (Tp is a multiple of every width,
    # so no scalar tail). has_sink: ggml_soft_max_add_sinks (gpt-oss): the
    # head's sink logit enters the max (MAX(max, sink)) and, through libm's
    # expf(sink - max), the double sum; it has no output column.
    Tp = w.shape[0]
    mx = _F32(-np.inf)
    for c in range(Tp):
        v = _F32(-np.inf)
        if c < T and c <= qpos and not (n_swa > 0 and qpos - c >= n_swa):
            v = _F32(srow[c] * scale)
        w[c] = v
        if v > mx:
            mx = v
    if has_sink and not mx > sink:
        mx = sink
    tot = 0.0
    mv = f8_splat(mx)
    for c0 in range(0, Tp, 8):          # Tp is a multiple of 64
        f8_store(w, c0, isa.expf8(f8_sub(f8_load(w, c0), mv)))
    for c0 in range(0, Tp, isa.EXPF_LANES):
        tot += np.float64(isa.lane_sum(w, c0))
    if has_sink:
        tot += np.float64(math.exp(_F32(sink - mx)))
    inv = _F32(1.0 / tot)
    for c in range(Tp):
        out[c] = _F32(w[c] * inv)


@jit
def _soft_max_rows(s, scale, qpos, n_swa, isa, has_sinks, sinks, out):
    # s (R, T) scores; qpos (R,) position of each row's query; sinks (R,)
    w = np.empty(out.shape[1], np.float32)
    for r in range(s.shape[0]):
        _soft_max_row(s[r], s.shape[1], scale, qpos[r], n_swa, w, out[r], isa, has_sinks, sinks[r])


def soft_max(s: np.ndarray, scale: float, qpos: np.ndarray, profile, n_swa: int = 0,
             sinks: np.ndarray | None = None) -> np.ndarray:
    """ggml `soft_max_ext(s, mask, scale)` with llama.cpp's causal (and
    sliding-window) mask, in `profile`'s order: s float32 (R, T) raw scores,
    qpos int (R,) the position of each row's query (key c is visible when c
    <= qpos and, with n_swa > 0, qpos - c < n_swa); sinks: float32 (R,) each
    row's attention-sink logit (`ggml_soft_max_add_sinks`) or None. Returns
    float32 (R, T') probabilities with T' = T rounded up to a multiple of 64
    (the extra columns are 0)."""
    s = np.ascontiguousarray(s, np.float32)
    Tp = s.shape[1] + (-s.shape[1] % 64)
    out = np.empty((s.shape[0], Tp), np.float32)
    sk = np.zeros(s.shape[0], np.float32) if sinks is None else np.ascontiguousarray(sinks, np.float32)
    _soft_max_rows(s, _F32(scale), np.ascontiguousarray(qpos, np.int64), int(n_swa),
                   profile.isa, sinks is not None, sk, out)
    return out


@jit
def _soft_max_plain(x, scale, isa, out):
    # ggml_compute_forward_soft_max_f32 without a mask: per row wp = x *
    # scale, max, then ggml_vec_soft_max_f32 (whole vectors of the build's
    # EXPF_LANES through ggml_v_expf, each vector's lane sum added to a
    # double; the values past the last whole vector through libm's expf,
    # each added to the double), every value times (float)(1 / sum)
    R, n = x.shape
    width = isa.EXPF_LANES
    main = n - n % width
    w = np.empty(max(n, 1), np.float32)
    for r in range(R):
        mx = _F32(-np.inf)
        for c in range(n):
            w[c] = _F32(x[r, c] * scale)
            if w[c] > mx:
                mx = w[c]
        tot = 0.0
        mv = f8_splat(mx)
        main8 = main - main % 8
        for c0 in range(0, main8, 8):
            f8_store(w, c0, isa.expf8(f8_sub(f8_load(w, c0), mv)))
        for c in range(main8, main):
            w[c] = isa.expf_v(_F32(w[c] - mx))
        for c0 in range(0, main, width):
            tot += np.float64(isa.lane_sum(w, c0))
        for c in range(main, n):
            w[c] = math.exp(_F32(w[c] - mx))
            tot += np.float64(w[c])
        inv = _F32(1.0 / tot)
        for c in range(n):
            out[r, c] = _F32(w[c] * inv)


def soft_max_rows(x: np.ndarray, profile, scale: float = 1.0) -> np.ndarray:
    """ggml `soft_max` / `soft_max_ext(x, NULL, scale)` of each row of x
    (float32 (..., n)) as `profile`'s build computes it (`_soft_max_plain`;
    the router probabilities of an MoE layer). Returns float32, x's shape."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    n = x.shape[-1]
    _soft_max_plain(x.reshape(-1, n), _F32(scale), profile.isa, out.reshape(-1, n))
    return out


@jit
def _silu(x, isa, out):
    # ggml_vec_silu_f32 per row: whole vectors through ggml_v_silu, the
    # rest through ggml_silu_f32 (x / (1 + expf(-x)), libm expf)
    R, n = x.shape
    main = n - n % isa.EXPF_LANES
    for r in range(R):
        for i in range(main):
            out[r, i] = isa.silu_v(x[r, i])
        for i in range(main, n):
            v = x[r, i]
            out[r, i] = _F32(v / _F32(_F32(1.0) + math.exp(-v)))


def silu(x: np.ndarray, profile) -> np.ndarray:
    """ggml `silu` (`ggml_vec_silu_f32` on each row of x's last axis, whose
    length decides which values take the vector SiLU) in `profile`'s order.
    x float32 (..., n)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    n = x.shape[-1]
    _silu(x.reshape(-1, n), profile.isa, out.reshape(-1, n))
    return out


@jit
def _sigmoid(x, out):
    for i in range(x.size):
        out[i] = _F32(_F32(1.0) / _F32(_F32(1.0) + math.exp(-x[i])))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """ggml `sigmoid` (unary-ops.cpp `op_sigmoid`, every build): 1 / (1 +
    expf(-x)) with libm's expf. x float32, any shape."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    _sigmoid(x.reshape(-1), out.reshape(-1))
    return out


@jit
def _softplus(x, out):
    for i in range(x.size):
        v = x[i]
        out[i] = v if v > _F32(20.0) else _F32(math.log(_F32(_F32(1.0) + math.exp(v))))


def softplus(x: np.ndarray) -> np.ndarray:
    """ggml `softplus` (unary-ops.cpp `op_softplus`, every build): x for x
    > 20, else logf(1 + expf(x)) (libm). x float32, any shape."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    _softplus(x.reshape(-1), out.reshape(-1))
    return out


@jit
def _sum_rows(x, out):
    for r in range(x.shape[0]):
        tot = 0.0
        for c in range(x.shape[1]):
            tot += np.float64(x[r, c])
        out[r] = _F32(tot)


def sum_rows(x: np.ndarray) -> np.ndarray:
    """ggml `sum_rows` (`ggml_vec_sum_f32`, every x86 build): each row of x
    (float32 (..., n)) summed in double, in order, then rounded to float32.
    Returns float32 (...,)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty(x.shape[:-1], np.float32)
    _sum_rows(x.reshape(-1, x.shape[-1]), out.reshape(-1))
    return out


@jit
def _swiglu_oai(g, u, alpha, limit, out):
    for i in range(g.size):
        x = g[i] if not limit < g[i] else limit            # std::min(g, limit)
        y = u[i]
        if y < -limit:                                     # std::clamp(u, -limit, limit)
            y = -limit
        elif limit < y:
            y = limit
        glu = _F32(x / _F32(_F32(1.0) + math.exp(_F32(alpha * -x))))
        out[i] = _F32(glu * _F32(y + _F32(1.0)))


def swiglu_oai(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """ggml `swiglu_oai(g, u, alpha, limit)` (ops.cpp
    `ggml_compute_forward_swiglu_oai_f32`, the same in every build): x =
    min(g, limit), y = clamp(u, -limit, limit), x / (1 + expf(alpha * -x))
    * (y + 1), libm's expf, float32 steps (nothing for GCC to contract).
    g, u float32 of one shape."""
    g = np.ascontiguousarray(g, np.float32)
    u = np.ascontiguousarray(u, np.float32)
    if g.shape != u.shape:
        raise ValueError(f"swiglu_oai: shapes {g.shape} and {u.shape} differ")
    out = np.empty_like(g)
    _swiglu_oai(g.reshape(-1), u.reshape(-1), _F32(alpha), _F32(limit), out.reshape(-1))
    return out


@jit
def _swiglu(g, u, isa, out):
    # rows of n values: the first n - n % EXPF_LANES through the build's
    # vector SiLU, the tail through the scalar `ggml_silu_f32` (libm expf;
    # numba lowers float32 math.exp to it) (8 lanes at a time through the
    # chain's `silu8`: the same bits as its silu_v)
    R, n = g.shape
    main = n - n % isa.EXPF_LANES
    main8 = main - main % 8
    gf = g.reshape(-1)
    uf = u.reshape(-1)
    of = out.reshape(-1)
    for r in range(R):
        o = r * n
        for i in range(0, main8, 8):
            f8_store(of, o + i, f8_mul(isa.silu8(f8_load(gf, o + i)), f8_load(uf, o + i)))
        for i in range(main8, main):
            out[r, i] = _F32(isa.silu_v(g[r, i]) * u[r, i])
        for i in range(main, n):
            x = g[r, i]
            out[r, i] = _F32(_F32(x / _F32(_F32(1.0) + math.exp(-x))) * u[r, i])


def swiglu(g: np.ndarray, u: np.ndarray, profile) -> np.ndarray:
    """ggml `swiglu` (`ggml_vec_swiglu_f32` per row) of `profile`: silu(g)
    * u with ggml's vector SiLU for each whole vector of a row, the scalar
    `ggml_silu_f32` for the rest. g, u float32 of one shape (..., n)."""
    g = np.ascontiguousarray(g, np.float32)
    u = np.ascontiguousarray(u, np.float32)
    out = np.empty_like(g)
    n = g.shape[-1]
    _swiglu(g.reshape(-1, n), u.reshape(-1, n), profile.isa, out.reshape(-1, n))
    return out


@jit
def _softcap(x, inv, c, fused, out):
    for i in range(x.size):
        out[i] = _F32(tanhf(_F32(x[i] * inv), fused) * c)


def _profile(profile, fn: str):
    """A `Profile` from a profile or its name (`cpu.select`); TypeError for
    anything else."""
    from . import Profile, select
    if isinstance(profile, str):
        return select(profile)
    if not isinstance(profile, Profile):
        raise TypeError(f"{fn}: profile must be a CPU profile or its name, got {type(profile).__name__}")
    return profile


def softcap(x: np.ndarray, c: float, profile) -> np.ndarray:
    """Final logit soft-capping as llama.cpp builds it (gemma2 / gemma4):
    ggml_scale by the float32 1/c, `ggml_tanh` (libm `tanhf` per value:
    `cpu.libm`, the build's glibc, `LIBM_FMA`), ggml_scale by c. x float32,
    any shape; c a finite non-zero cap (ValueError otherwise); profile a
    `Profile` or its name. Returns a new float32 array of x's shape."""
    prof = _profile(profile, "softcap")
    c = float(c)
    if not np.isfinite(c) or c == 0.0:
        raise ValueError(f"softcap: the cap must be finite and non-zero, got {c!r}")
    x = np.asarray(x, np.float32)
    out = np.empty(x.shape, np.float32)
    _softcap(np.ascontiguousarray(x).reshape(-1), _F32(_F32(1.0) / _F32(c)), _F32(c),
             bool(prof.isa.resolve("LIBM_FMA")), out.reshape(-1))
    return out


def _check_n_rot(n_rot) -> int:
    """n_rot / 2 for a valid n_rot (an even int >= 2), else ValueError."""
    if isinstance(n_rot, bool) or not isinstance(n_rot, (int, np.integer)) or n_rot < 2 or n_rot % 2:
        raise ValueError(f"RoPE: n_rot must be an even integer >= 2, got {n_rot!r}")
    return int(n_rot) // 2


@jit
def _rope_cache(pos, n_rot, base, freq_scale, freq_factors, has_ff, ext, mscale, low, high, fused,
                cos, sin):
    # ggml_rope_cache_init with rope_yarn per pair (ops.cpp): theta_interp =
    # freq_scale * theta_extrap; with ext != 0 the YaRN ramp mixes the two
    # (theta_interp * (1 - mix) + theta_extrap * mix, contracted by GCC into
    # fma(theta_interp, 1 - mix, theta_extrap * mix) on FMA builds) and the
    # magnitude gets mscale * (1 + 0.1 logf(1 / freq_scale)) (the same
    # contraction); cos and sin times it (exact when it is 1)
    ts = _F32(_F32(base) ** _F32(_F32(-2.0) / _F32(n_rot)))
    fs = _F32(freq_scale)
    ms = _F32(mscale)
    if ext != 0:
        lg = _F32(math.log(_F32(_F32(1.0) / fs)))
        ms = _F32(ms * (fma32(_F32(0.1), lg, _F32(1.0)) if fused else
                        _F32(_F32(1.0) + _F32(_F32(0.1) * lg))))
    den = _F32(high - low)
    if _F32(0.001) > den:           # MAX(0.001f, high - low)
        den = _F32(0.001)
    for p in range(pos.shape[0]):
        theta = _F32(pos[p])
        for i in range(n_rot // 2):
            te = _F32(theta / freq_factors[i]) if has_ff else theta
            th = _F32(fs * te)
            if ext != 0:
                y = _F32(_F32(_F32(i) - low) / den)
                m = y if not _F32(0.0) > y else _F32(0.0)
                m = _F32(1.0) if _F32(1.0) < m else m
                mix = _F32(_F32(_F32(1.0) - m) * ext)
                if fused:
                    th = fma32(th, _F32(_F32(1.0) - mix), _F32(te * mix))
                else:
                    th = _F32(_F32(th * _F32(_F32(1.0) - mix)) + _F32(te * mix))
            cos[p, i] = _F32(math.cos(th) * ms)     # libm cosf / sinf, as ggml
            sin[p, i] = _F32(math.sin(th) * ms)
            theta = _F32(theta * ts)


@jit
def _yarn_corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow, out):
    # ggml.c ggml_rope_yarn_corr_dims (ggml-base: built without FMA):
    # n_dims * logf(n_ctx_orig / (beta * 2 * pi)) / (2 * logf(base)),
    # floorf for beta_fast, ceilf for beta_slow, clamped to [0, n_dims - 1]
    pi = _F32(math.pi)
    lb = _F32(_F32(2.0) * _F32(math.log(base)))
    for j in range(2):
        beta = beta_fast if j == 0 else beta_slow
        a = _F32(_F32(n_ctx_orig) / _F32(_F32(beta * _F32(2.0)) * pi))
        v = _F32(_F32(_F32(n_dims) * _F32(math.log(a))) / lb)
        out[j] = np.floor(v) if j == 0 else np.ceil(v)
    if _F32(0.0) > out[0]:
        out[0] = 0.0
    if _F32(n_dims - 1) < out[1]:
        out[1] = _F32(n_dims - 1)


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float,
                   beta_slow: float) -> tuple:
    """ggml `ggml_rope_yarn_corr_dims`: the (low, high) pair indices of the
    YaRN ramp, float32, as ggml computes them (libm logf, floorf / ceilf)."""
    out = np.zeros(2, np.float32)
    _yarn_corr_dims(int(n_dims), int(n_ctx_orig), _F32(base), _F32(beta_fast), _F32(beta_slow), out)
    return float(out[0]), float(out[1])


def imrope_text_pairs(n_rot: int, sections, head_dim: int | None = None) -> np.ndarray:
    """Which rotation pairs of ggml's interleaved M-RoPE (`ggml_mrope_cache_init`
    with `is_imrope`, qwen35moe) turn for a text token: llama.cpp gives text
    the same position on the first three sections and 0 on the fourth
    (`llm_graph_input_pos::set_input`), so pair i (sector s = i % sum of the
    sections) has the token's angle when s % 3 == 0 and s < 3 * sections[0],
    s % 3 == 1 and s < 3 * sections[1], or s % 3 == 2 and s < 3 *
    sections[2], and angle 0 (cos 1, sin 0) otherwise. Returns bool (n_rot /
    2,). ValueError for sections ggml refuses (their sum above head_dim,
    default n_rot: `GGML_ASSERT(sect_dims <= ne0)`) or negative ones."""
    sec = [int(v) for v in sections]
    total = sum(sec)
    limit = n_rot if head_dim is None else int(head_dim)
    if len(sec) != 4 or total <= 0 or min(sec) < 0 or total > limit:
        raise ValueError(f"rope sections {sec} do not fit heads of {limit} values")
    out = np.zeros(n_rot // 2, bool)
    for i in range(n_rot // 2):
        sct = i % total
        out[i] = ((sct % 3 == 1 and sct < 3 * sec[1]) or (sct % 3 == 2 and sct < 3 * sec[2])
                  or (sct % 3 == 0 and sct < 3 * sec[0]))
    return out


def rope_cache(pos: np.ndarray, n_rot: int, base: float, freq_scale: float,
               freq_factors: np.ndarray | None = None, yarn: tuple | None = None, profile=None,
               sections=None):
    """cos and sin float32 (n, n_rot/2) as ggml `ggml_rope_cache_init`:
    theta_scale = powf(base, -2/n_rot); theta starts at the position
    and is multiplied by theta_scale in float32 for each pair; freq_factors
    divide it (llama3 `rope_freqs`), freq_scale multiplies it; then libm's
    cosf and sinf (numba lowers float32 math.cos / math.sin to them).
    yarn: (ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig) for
    ggml's `rope_yarn` (gpt-oss; needs the `profile`, whose FMA flag decides
    the contraction), or None (no YaRN, attn_factor 1). sections: the four
    interleaved M-RoPE sections (qwen35moe) for text tokens
    (`imrope_text_pairs`: the pairs of the fourth stream get angle 0).
    pos: int positions (n,). Raises ValueError for an odd or non-positive
    n_rot, or freq_factors not of shape (n_rot/2,)."""
    pos = np.ascontiguousarray(pos, np.int64).reshape(-1)
    half = _check_n_rot(n_rot)
    if freq_factors is not None and np.shape(freq_factors) != (half,):
        raise ValueError(f"rope_cache: freq_factors has shape {np.shape(freq_factors)}, "
                         f"expected ({half},) for n_rot = {n_rot}")
    cos = np.empty((len(pos), half), np.float32)
    sin = np.empty_like(cos)
    ff = np.ones(half, np.float32) if freq_factors is None else np.ascontiguousarray(freq_factors, np.float32)
    ext, mscale, low, high, fused = 0.0, 1.0, 0.0, 0.0, False
    if yarn is not None:
        ext, mscale, beta_fast, beta_slow, n_orig = yarn
        low, high = yarn_corr_dims(n_rot, n_orig, base, beta_fast, beta_slow)
        if profile is None:
            raise ValueError("rope_cache: YaRN needs the CPU profile")
        fused = bool(profile.fma)
    _rope_cache(pos, int(n_rot), _F32(base), _F32(freq_scale), ff, freq_factors is not None,
                _F32(ext), _F32(mscale), _F32(low), _F32(high), fused, cos, sin)
    if sections is not None:
        # angle 0: cosf(0) * mscale and sinf(0) * mscale, computed as ggml does
        still = ~imrope_text_pairs(n_rot, sections)
        if still.any():
            c0, s0 = np.empty((1, half), np.float32), np.empty((1, half), np.float32)
            _rope_cache(np.zeros(1, np.int64), int(n_rot), _F32(base), _F32(freq_scale), ff,
                        freq_factors is not None, _F32(ext), _F32(mscale), _F32(low), _F32(high),
                        fused, c0, s0)
            cos[:, still] = c0[0, still]
            sin[:, still] = s0[0, still]
    return cos, sin


@jit
def _rope(x, cos, sin, n_rot, neox, fused, out):
    # fused: the chain's ROPE_FMA (0: no contraction; 1: y0 = fma(x0, c,
    # -(x1 s)); 2: the same for NeoX pairs, y0 = fma(-x1, s, x0 c) for
    # normal-style pairs, which aarch64 GCC vectorizes); y1 = fma(x0, s,
    # x1 c) in both
    n, H, D = x.shape
    half = n_rot // 2
    for th in range(n * H):
        t, h = th // H, th % H
        for j in range(D):
            out[t, h, j] = x[t, h, j]
        for i in range(half):
            i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
            c, s = cos[t, i], sin[t, i]
            x0, x1 = x[t, h, i0], x[t, h, i1]
            if fused == 2 and not neox:
                out[t, h, i0] = fma32(-x1, s, _F32(x0 * c))
                out[t, h, i1] = fma32(x0, s, _F32(x1 * c))
            elif fused:
                out[t, h, i0] = fma32(x0, c, -_F32(x1 * s))
                out[t, h, i1] = fma32(x0, s, _F32(x1 * c))
            else:
                out[t, h, i0] = _F32(_F32(x0 * c) - _F32(x1 * s))
                out[t, h, i1] = _F32(_F32(x0 * s) + _F32(x1 * c))


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool,
         profile) -> np.ndarray:
    """Rotate the first n_rot values of each head, ggml `rotate_pairs` as GCC
    compiles it for `profile` (its chain's `ROPE_FMA`): on FMA builds
    contracted, y0 = fma(x0, cos, -(x1 sin)), y1 = fma(x0, sin, x1 cos),
    except y0 = fma(-x1, sin, x0 cos) for normal-style pairs on arm64
    (GCC's vectorized loop); else y0 = x0 cos - x1 sin, y1 = x0 sin + x1
    cos. Normal style pairs (2i, 2i+1), NeoX (i, i + n_rot/2).
    x float32 (n, heads, head_dim); cos, sin (n, n_rot/2). Raises
    ValueError for an odd n_rot, n_rot outside 2 .. head_dim, or cos / sin
    of another shape (the kernel indexes by them unchecked)."""
    x = np.ascontiguousarray(x, np.float32)
    half = _check_n_rot(n_rot)
    if x.ndim != 3 or n_rot > x.shape[2]:
        raise ValueError(f"rope: x must be (n, heads, head_dim) with head_dim >= n_rot = {n_rot}, "
                         f"got shape {x.shape}")
    want = (x.shape[0], half)
    if np.shape(cos) != want or np.shape(sin) != want:
        raise ValueError(f"rope: cos and sin must be {want} for x {x.shape} and n_rot = {n_rot}, "
                         f"got {np.shape(cos)} and {np.shape(sin)}")
    out = np.empty_like(x)
    _rope(x, np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32),
          int(n_rot), bool(neox), int(profile.isa.resolve("ROPE_FMA")), out)
    return out


@jit
def _rms_norm_rows(x, w, eps, out):
    n = x.shape[1]
    for r in range(x.shape[0]):
        ss = 0.0                                   # double, sequential, as ggml
        for i in range(n):
            v = x[r, i]
            ss += np.float64(np.float32(v * v))
        mean = np.float32(ss / n)
        scale = np.float32(1.0) / np.float32(np.sqrt(np.float32(mean + eps)))
        for i in range(n):
            out[r, i] = np.float32(x[r, i] * scale) * w[i]


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """ggml `rms_norm` then `mul` (the same in every build): float32 squares
    summed in double (sequentially), mean and scale in float32: y = (x * (1
    / sqrtf(mean + eps))) * w. x float32 (..., n), w float32 (n,) or None."""
    shape = x.shape
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, shape[-1])
    w = np.ones(shape[-1], np.float32) if w is None else np.asarray(w, np.float32)
    out = np.empty_like(x2)
    _rms_norm_rows(x2, w, np.float32(eps), out)
    return out.reshape(shape)


_SQRT_2_OVER_PI = _F32(0.79788456080286535587989211986876)
_GELU_COEF_A = _F32(0.044715)


@jit
def _gelu_table(f16, fused, libm_fused, out):
    # ggml_cpu_init: table[i] = fp16(ggml_gelu_f32(fp16 i)), ggml_gelu_f32 =
    # 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x))); GCC
    # contracts the inner 1.0f + (a*x)*x on FMA builds (libm tanhf: the
    # build's glibc, `cpu.libm`)
    for i in range(65536):
        x = f16[i]
        ax = _F32(_GELU_COEF_A * x)
        inner = fma32(ax, x, _F32(1.0)) if fused else _F32(_F32(1.0) + _F32(ax * x))
        t = tanhf(_F32(_F32(_SQRT_2_OVER_PI * x) * inner), libm_fused)
        out[i] = round_to_f16(_F32(_F32(_F32(0.5) * x) * _F32(_F32(1.0) + t)))


_GELU_TABLES = {}


def gelu_table(profile) -> np.ndarray:
    """ggml's GELU table of `profile` (a `Profile` or its name) as float32
    (65536,): the value for each fp16 bit pattern; a copy of the table
    cached per FMA and `LIBM_FMA` flag, so a caller's change to it reaches
    no other computation."""
    profile = _profile(profile, "gelu_table")
    key = (bool(profile.fma), bool(profile.isa.resolve("LIBM_FMA")))
    if key not in _GELU_TABLES:
        from ..numerics import F16_TO_F32
        out = np.empty(65536, np.float32)
        _gelu_table(F16_TO_F32, *key, out)
        _GELU_TABLES[key] = out
    return _GELU_TABLES[key].copy()


@njit(inline="always", cache=True)
def _geglu_one(x, h, tab, u):
    # h: fp16 bits of x (RNE); a NaN takes numerics' 0x7FFF, as before.
    # ggml_vec_geglu_f32 stores +0.0f for x <= -10, whatever u is (not
    # 0 * u, which is -0.0 for a negative u and NaN for an infinite one)
    if x <= _F32(-10.0):
        return _F32(0.0)
    if x >= _F32(10.0):
        a = x
    else:
        a = tab[h] if x == x else tab[f32_bits_to_f16_bits(np.int64(f32_bits(x)) & 0xFFFFFFFF, False)]
    return _F32(a * u)


@jit
def _geglu(g, u, tab, out):
    # the fp16 conversion 8 values at a time where the CPU has F16C
    n = g.size
    main = n - n % 8 if HOST_F16C else 0
    hb = np.empty(8, np.uint16)
    for i0 in range(0, main, 8):
        f8_f16_store(hb, 0, f8_load(g, i0))
        for l in range(8):
            out[i0 + l] = _geglu_one(g[i0 + l], hb[l], tab, u[i0 + l])
    for i in range(main, n):
        x = g[i]
        out[i] = _geglu_one(x, f32_bits_to_f16_bits(np.int64(f32_bits(x)) & 0xFFFFFFFF, False), tab, u[i])


def geglu(g: np.ndarray, u: np.ndarray, profile) -> np.ndarray:
    """ggml-cpu `ggml_vec_geglu_f32` (GGML_GELU_FP16 build): 0 for g <=
    -10, g itself for g >= 10, else the table value of fp16(g) (round to
    nearest even; `gelu_table`); times u. g, u float32 of one shape."""
    g = np.ascontiguousarray(g, np.float32)
    u = np.ascontiguousarray(u, np.float32)
    if g.shape != u.shape:
        raise ValueError(f"geglu: shapes {g.shape} and {u.shape} differ")
    out = np.empty_like(g)
    _geglu(g.reshape(-1), u.reshape(-1), gelu_table(profile), out.reshape(-1))
    return out

def gelu(x: np.ndarray, profile) -> np.ndarray:
    """ggml-cpu `ggml_vec_gelu_f32` (GGML_GELU_FP16 build; ggml `gelu`,
    one row at a time): 0 for x <= -10, x for x >= 10, else the table value
    of fp16(x) (`gelu_table`). It is `geglu` with every up value 1: each
    case there multiplies the same value by 1.0, which changes no bit.
    x float32, any shape."""
    x = np.ascontiguousarray(x, np.float32)
    return geglu(x, np.ones_like(x), profile)
