"""Offline rotation of the residual stream (QuaRot / SpinQuant style):
`strata-ref rotate IN.gguf OUT.gguf [--type TYPE] [--seed S]`.

A decoder's residual stream carries a few massive channels, so a per-token
quantization of a linear's input is dominated by one value (a crest factor
max|x| / rms(x) of ~70). An orthogonal Q applied to the stream spreads every
channel over all of them, and folded into the weights it leaves the
function unchanged:

* each RMSNorm weight g is folded into the linears that read its output
  (W <- W diag(g): q, k, v after `attn_norm`, gate and up after `ffn_norm`,
  the output matrix after `output_norm`) and set to 1, so that the norm
  commutes with Q (RMSNorm without a weight is rotation-invariant: mean(x^2)
  and its epsilon do not change);
* the embedding rows become e Q (and a tied output matrix is written out as
  its own `output.weight`, since it now needs diag(g) Q where the embedding
  needs Q); every linear that reads the stream becomes W Q, every linear
  that writes it (attn_output, ffn_down) Q^T W (their biases Q^T b);
* per head, V and the attention output: v' = R v with R a Hadamard matrix of
  head_dim (attn_v rows and bias per KV head), and attn_output's input
  columns of every query head times R^T. Attention mixes values linearly, so
  the heads' outputs are rotated by R and un-rotated by attn_output; q and k
  are left alone (RoPE would not commute).

Q = H_d diag(s) / sqrt(d) is a seeded randomized Hadamard matrix (s: signs
from `numpy.random.default_rng(seed)`), R = H_hd diag(s') / sqrt(hd) with the
next seed. H_n is built as a Kronecker product of Paley and Sylvester
matrices (`hadamard_factors`: 576 = 12 * 12 * 4, 896 = 28 * 8 * 4, 64 = 8 *
8, ...) and applied factor by factor, each a fixed-order float64 loop, so
the rotated weights are the same bits on every machine. Weights are
dequantized by the oracle, rotated in float64, rounded to float32 and
re-quantized by the reference quantizers (`strata_ref.quantize`): to each
tensor's own type, or to `--type` (with llama.cpp's fallback for a row
length the type's block does not divide, `variants.fallback_type`). The
output is written with gguf-py (`strata_ref.gguf.write_gguf`), same
architecture and metadata, so llama.cpp loads it.

Architectures: llama, qwen2, qwen3 (its per-head q/k norms act on q and k,
which are not rotated). gemma3 is refused: its post-attention and post-FFN
norms sit on the residual path, after the linears that write it, where a
norm weight cannot be folded.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import _jitcache  # noqa: F401  (numba's cache, locked across processes)
from ..infer.archs import ARCHS
from ..types import GGMLType

__all__ = ["RotateError", "hadamard_factors", "hadamard_matrix", "RandomizedHadamard",
           "rotate_gguf", "SUPPORTED"]

#: the architectures whose norms can be folded: the dense graphs without
#: norms on the residual path (`archs.ArchSpec.post_norms`) and with
#: separate q / k / v and gate / up matrices (not phi3's fused ones)
SUPPORTED = tuple(a for a, s in ARCHS.items() if s.module == "dense" and not s.post_norms
                  and not s.fused_qkv and not s.fused_up)


class RotateError(ValueError):
    """A model or option `rotate` cannot handle (names it)."""


# ------------------------------------------------------------ Hadamard
def _is_prime(p: int) -> bool:
    if p < 2:
        return False
    return all(p % f for f in range(2, int(math.isqrt(p)) + 1))


def _jacobsthal(q: int) -> np.ndarray:
    """Q[i, j] = chi(j - i) for the quadratic character chi mod prime q."""
    sq = np.zeros(q, np.int64)
    sq[(np.arange(1, q) ** 2) % q] = 1
    chi = np.where(sq == 1, 1, -1)
    chi[0] = 0
    i = np.arange(q)
    return chi[(i[None, :] - i[:, None]) % q]


def _paley(n: int) -> np.ndarray | None:
    """A Hadamard matrix of order n by Paley's constructions (prime q):
    I (n = q + 1, q = 3 mod 4) or II (n = 2 (q + 1), q = 1 mod 4); None."""
    q = n - 1
    if _is_prime(q) and q % 4 == 3:
        s = np.zeros((n, n), np.int64)
        s[0, 1:] = 1
        s[1:, 0] = -1
        s[1:, 1:] = _jacobsthal(q)
        return np.eye(n, dtype=np.int64) + s
    if n % 2 == 0:
        q = n // 2 - 1
        if _is_prime(q) and q % 4 == 1:
            c = np.zeros((q + 1, q + 1), np.int64)
            c[0, 1:] = 1
            c[1:, 0] = 1
            c[1:, 1:] = _jacobsthal(q)
            return np.kron(c, np.array([[1, 1], [1, -1]])) + np.kron(np.eye(q + 1, dtype=np.int64),
                                                                     np.array([[1, -1], [-1, -1]]))
    return None


def _sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1), np.int64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def _base_orders(n: int):
    """Orders dividing n of the non-power-of-two Paley matrices, smallest
    first (small factors make a cheap transform: per value, the sum of the
    factors' orders)."""
    return [m for m in range(3, n + 1) if m & (m - 1) and n % m == 0 and _paley(m) is not None]


def hadamard_factors(n: int) -> list:
    """Hadamard matrices (int64, entries +-1) whose Kronecker product, in
    order, is a Hadamard matrix of order n: Paley factors for the part of
    n that is not a power of two, one Sylvester factor for the rest.
    Raises RotateError when n has no such construction."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise RotateError(f"Hadamard order must be a positive integer, got {n!r}")
    n = int(n)
    memo = {}

    def search(m):
        # a list of Paley orders whose product divides m with a power-of-two rest
        if m & (m - 1) == 0:
            return []
        if m in memo:
            return memo[m]
        memo[m] = None
        for b in _base_orders(m):
            rest = search(m // b)
            if rest is not None:
                memo[m] = [b] + rest
                break
        return memo[m]

    orders = search(n)
    if orders is None:
        raise RotateError(f"no Hadamard matrix construction for order {n} (it must be a power of "
                          f"two times a product of Paley orders q + 1 or 2 (q + 1), q prime)")
    rest = n // int(np.prod(orders)) if orders else n
    out = [_paley(b) for b in orders]
    # the power-of-two part: Sylvester's H_(2^k) is the Kronecker power of
    # H_2, so it splits into factors of at most 8 with the same matrix
    while rest > 8:
        out.append(_sylvester(8))
        rest //= 8
    if rest > 1 or not out:
        out.append(_sylvester(rest))
    for h in out:
        assert np.array_equal(h @ h.T, h.shape[0] * np.eye(h.shape[0], dtype=np.int64))
    return out


def hadamard_matrix(n: int) -> np.ndarray:
    """The Hadamard matrix of order n that `hadamard_factors` describes
    (int64, entries +-1), built as the Kronecker product."""
    h = np.ones((1, 1), np.int64)
    for f in hadamard_factors(n):
        h = np.kron(h, f)
    return h


@njit(cache=True)
def _apply_axis(x, f, out):
    # x, out: (A, m, B) float64; f: (m, m) float64 (+-1). out[a, k, b] =
    # sum_i x[a, i, b] * f[i, k], i in increasing order
    A, m, B = x.shape
    for a in range(A):
        for k in range(m):
            for b in range(B):
                out[a, k, b] = 0.0
            for i in range(m):
                c = f[i, k]
                for b in range(B):
                    out[a, k, b] += x[a, i, b] * c


class RandomizedHadamard:
    """Q = H_n diag(s) / sqrt(n): H_n from `hadamard_factors`, s the signs of
    `numpy.random.default_rng(seed)` (n draws of {-1, 1}). `right(X)` =
    X Q and `right_t(X)` = X Q^T for float rows X (r, n), in float64, the
    transform applied factor by factor in a fixed order."""

    def __init__(self, n: int, seed: int):
        self.n = int(n)
        self.factors = [np.asarray(f, np.float64) for f in hadamard_factors(n)]
        self.signs = np.random.default_rng(seed).choice(np.array([-1.0, 1.0]), size=self.n)
        self.scale = 1.0 / math.sqrt(self.n)

    def _h(self, x: np.ndarray, transpose: bool) -> np.ndarray:
        # x (r, n) -> x H (or x H^T): with H = F1 x ... x Fm, row index
        # (i1, ..., im) row-major, each axis j takes F_j (or F_j^T)
        r = x.shape[0]
        dims = [f.shape[0] for f in self.factors]
        y = np.ascontiguousarray(x, np.float64)
        for j, f in enumerate(self.factors):
            a = r * int(np.prod(dims[:j]))
            b = int(np.prod(dims[j + 1:]))
            y3 = y.reshape(a, dims[j], b)
            out = np.empty_like(y3)
            _apply_axis(y3, np.ascontiguousarray(f.T if transpose else f), out)
            y = out
        return y.reshape(r, self.n)

    def right(self, x: np.ndarray) -> np.ndarray:
        """X Q, float64 (r, n)."""
        return self._h(x, False) * self.signs * self.scale

    def right_t(self, x: np.ndarray) -> np.ndarray:
        """X Q^T = (X diag(s)) H^T / sqrt(n), float64 (r, n)."""
        return self._h(np.asarray(x, np.float64) * self.signs, True) * self.scale

    def matrix(self) -> np.ndarray:
        """Q itself, float64 (n, n)."""
        return self.right(np.eye(self.n))


# ------------------------------------------------------------ the model
#: values per chunk when a tensor is rotated and re-quantized rows at a time
CHUNK_VALUES = 1 << 18


def _f64(t) -> np.ndarray:
    """A tensor's values, float64 in numpy shape (rows, cols) or (n,)."""
    if len(t.shape) == 1:
        return _rows_f64(t, 0, 1).reshape(t.shape[0])
    return _rows_f64(t, 0, t.rows)


def _rows_f64(t, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of tensor t, float64 (r1 - r0, cols) (a 1-D tensor is
    one row)."""
    from ..dequant import dequant_f32
    cols = t.shape[0] if len(t.shape) == 1 else t.cols
    if t.type == GGMLType.F32:
        v = t.data.view(np.float32).reshape(-1, cols)[r0:r1]
    else:
        v = dequant_f32(t.type, t.data, r1 - r0, cols, row0=r0)
    return np.asarray(v, np.float64)


def _encode(values: np.ndarray, t: GGMLType, name: str) -> np.ndarray:
    """float values (rows, cols) or (n,) as the raw uint8 data of type t."""
    from ..quantize import quantize
    x32 = np.ascontiguousarray(values, np.float32)
    if t == GGMLType.F32:
        return x32.reshape(-1).view(np.uint8)
    try:
        return np.asarray(quantize(x32 if x32.ndim == 2 else x32.reshape(1, -1), t), np.uint8).reshape(-1)
    except ValueError as e:
        raise RotateError(f"tensor `{name}`: {e}") from None


def _by_rows(t, fn, tt: GGMLType, name: str) -> np.ndarray:
    """The raw data of type tt of fn(rows of t): rows are read, transformed
    and encoded CHUNK_VALUES values at a time (fn acts on each row alone and
    every quantizer on whole rows, so the bytes are those of the whole
    tensor at once), into one output buffer."""
    from ..types import block_format
    fmt = block_format(tt)
    rows, cols = t.rows, t.cols
    out = np.empty(rows * (cols // fmt.block_values) * fmt.block_bytes, np.uint8)
    step, at = max(1, CHUNK_VALUES // cols), 0
    for r0 in range(0, rows, step):
        b = _encode(fn(_rows_f64(t, r0, min(rows, r0 + step))), tt, name)
        out[at:at + b.size] = b
        at += b.size
    return out


def _atomic_path(dst: str):
    """(temporary path beside dst's real file, real path): the file is
    written under the first and renamed to the second when complete, so
    that a failure leaves the old file whole and no half file."""
    import os
    import tempfile
    real = os.path.realpath(dst)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=".strata-ref-rotate-",
                               suffix=".gguf")
    try:
        from .._npio import user_mode
        user_mode(fd)
    finally:
        os.close(fd)
    return tmp, real


def rotate_gguf(src_path, dst_path, type=None, seed: int = 0, progress=None) -> dict:
    """Write the rotated model (module docstring) of GGUF `src_path` to
    `dst_path`. type: None (each tensor keeps its type) or a ggml type (name
    or GGMLType) for every 2-D weight; seed: the signs' seed, 0 .. 2^32 - 1
    (written as a UINT32 key). progress(n): called as layers are done.
    Tensors are rotated and written one at a time (the embedding and the
    linears that read the stream in chunks of rows), so memory holds about
    one output tensor, not the model; the file is written beside
    `dst_path` and renamed to it when complete. Returns a summary dict
    (arch, dims, Hadamard factors, seed, tensors and their types). Raises
    RotateError for an architecture or shape it cannot rotate, GGUFError
    for a malformed input, ValueError for a bad type or seed."""
    import os

    from .. import gguf
    from ..gguf import GGUFValueType as V, write_gguf
    from ..infer.dense import HParams
    from ..types import parse_type
    from .variants import fallback_type
    if (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
            or not 0 <= seed < 1 << 32):
        raise ValueError(f"--seed must be a whole number from 0 to {(1 << 32) - 1}, got {seed!r}")
    target = None if type is None else parse_type(type)
    src = gguf.read(src_path)
    md = src.metadata
    arch = md.get("general.architecture")
    if arch not in SUPPORTED:
        spec = ARCHS.get(arch) if isinstance(arch, str) else None
        why = (": its post-attention / post-FFN norms sit on the residual path, where a norm "
               "weight cannot be folded" if spec is not None and spec.post_norms else "")
        raise RotateError(f"rotate: architecture {arch!r} is not supported{why} "
                          f"(supported: {', '.join(SUPPORTED)})")
    hp = HParams.from_metadata(md)
    tensors = {t.name: t for t in src.tensors}
    if "blk.0.attn_qkv.weight" in tensors:
        raise RotateError("rotate: fused `attn_qkv` tensors are not supported")
    d, hd = hp.n_embd, hp.head_dim
    Q = RandomizedHadamard(d, int(seed))
    R = RandomizedHadamard(hd, int(seed) + 1)

    def need(name):
        if name not in tensors:
            raise RotateError(f"rotate: missing tensor `{name}`")
        return tensors[name]

    # name -> (ggml type, ggml shape, make): every tensor checked and typed
    # before the file is opened, each made when it is written
    made = {}

    def matrix_type(t):
        return fallback_type(target, t.cols) if target is not None else t.type

    def reading(name, g_name, per_head=False, t=None):
        # a linear reading normed input: (W diag(g)) Q, by rows
        t = t or need(name)
        if len(t.shape) != 2 or t.cols != d:
            raise RotateError(f"tensor `{name}` has rows of {t.shape[0]}, expected {d}")
        g_t, tt = need(g_name), matrix_type(t)

        def make():
            g = _f64(g_t)
            if per_head:
                return _encode(per_head_rows(Q.right(_f64(t) * g[None, :])), tt, name)
            return _by_rows(t, lambda w: Q.right(w * g[None, :]), tt, name)
        made[name] = (tt, t.shape, make)

    def per_head_rows(w):
        # R w_h for every head block of rows: (R W_h)^T = W_h^T R^T
        r = w.shape[0] // hd
        blocks = w.reshape(r, hd, -1)
        return np.concatenate([R.right_t(b.T).T for b in blocks])

    def writing(name, fn):
        # a linear writing the stream: Q^T W (columns mix: the whole tensor)
        t = need(name)
        tt = matrix_type(t)
        made[name] = (tt, t.shape, lambda: _encode(fn(_f64(t)), tt, name))

    def attn_output(wo):
        # columns of each query head times R^T, then Q^T on the output side
        wo = np.concatenate([R.right_t(wo[:, j * hd:(j + 1) * hd]) for j in range(wo.shape[1] // hd)],
                            axis=1)
        return Q.right(wo.T).T

    def vector(name, fn):
        t = tensors[name]
        made[name] = (GGMLType.F32, (t.shape[0],), lambda: _encode(fn(_f64(t)), GGMLType.F32, name))

    def ones(name):
        need(name)
        made[name] = (GGMLType.F32, (d,), lambda: np.ones(d, np.float32).view(np.uint8))

    for i in range(hp.n_layer):
        p = f"blk.{i}."
        for n in ("attn_q.weight", "attn_k.weight"):
            reading(p + n, p + "attn_norm.weight")
        reading(p + "attn_v.weight", p + "attn_norm.weight", per_head=True)
        if p + "attn_v.bias" in tensors:
            vector(p + "attn_v.bias", lambda b: per_head_rows(b.reshape(-1, 1)).reshape(-1))
        writing(p + "attn_output.weight", attn_output)
        for n in ("ffn_gate.weight", "ffn_up.weight"):
            reading(p + n, p + "ffn_norm.weight")
        writing(p + "ffn_down.weight", lambda w: Q.right(w.T).T)
        for n in ("attn_output.bias", "ffn_down.bias"):
            if p + n in tensors:
                vector(p + n, lambda b: Q.right(b.reshape(1, -1)).reshape(-1))
        ones(p + "attn_norm.weight")
        ones(p + "ffn_norm.weight")
    emb_t = need("token_embd.weight")
    tied = "output.weight" not in tensors
    # a tied output is written out: it needs diag(g) Q where the embedding needs Q
    reading("output.weight", "output_norm.weight", t=emb_t if tied else None)
    made["token_embd.weight"] = (matrix_type(emb_t), emb_t.shape,
                                 lambda: _by_rows(emb_t, Q.right, matrix_type(emb_t),
                                                  "token_embd.weight"))
    ones("output_norm.weight")
    # the layer of each tensor, for progress: a layer is done when its last one is
    last = {f"blk.{i}.ffn_norm.weight": i for i in range(hp.n_layer)}

    meta = {}
    for k, v in md.items():
        if k.startswith("general.alignment") or k.startswith("split."):
            continue                    # the output is one file, not a split set
        vt = src.metadata_types[k]
        if k in src.array_types:
            meta[k] = (vt, v.tolist() if isinstance(v, np.ndarray) else v, src.array_types[k])
        else:
            meta[k] = (vt, v)
    meta["general.architecture"] = arch
    if target is not None:
        meta.pop("general.file_type", None)
    meta["strata_ref.rotate.seed"] = (V.UINT32, int(seed))
    meta["strata_ref.rotate.hadamard"] = (V.STRING, " x ".join(str(f.shape[0]) for f in Q.factors))

    order = [t.name for t in src.tensors]
    if tied:
        order.insert(order.index("token_embd.weight"), "output.weight")
    written = []
    for name in order:
        if name in made:
            tt, shape, make = made[name]
            if name in last and progress:
                make = (lambda mk, i: lambda: (mk(), progress(1))[0])(make, last[name])
            written.append((name, tt, shape, make))
        else:
            # untouched (rope_freqs, q/k norms, q/k biases): copied as is
            t = tensors[name]
            written.append((name, t.type, t.shape, t.data))
    tmp, real = _atomic_path(os.fspath(dst_path))
    try:
        write_gguf(tmp, meta, written, alignment=src.alignment if src.alignment != 32 else None)
        os.replace(tmp, real)
    except BaseException:
        os.unlink(tmp)
        raise
    return {"arch": arch, "n_embd": d, "head_dim": hd, "seed": int(seed),
            "hadamard": [f.shape[0] for f in Q.factors],
            "head_hadamard": [f.shape[0] for f in R.factors], "tied_output_written": tied,
            "tensors": [(n, GGMLType(tt).name) for n, tt, _, _ in written]}


# ------------------------------------------------------------ measuring
#: the inputs of a dense layer's linears: which linear reads which
_INPUTS = (("attn", "wq"), ("attn_out", "wo"), ("ffn", "w_gate"), ("ffn_mid", "w_down"))


def _calibrate(m, target, profile, seqs):
    """Crest statistics of every layer's four linear inputs and each
    linear's error statistics (`layers._Probe`) over teacher-forced passes
    of the token sequences `seqs` through float model m."""
    from .layers import LINEARS, _owner, _Probe, _unstack, crest_stats
    _unstack(m)
    sink = {}
    crest = {(i, k): [] for i in range(len(m.layers)) for k, _ in _INPUTS}
    readers = {a: k for k, a in _INPUTS}
    saved = {}
    for i, L in enumerate(m.layers):
        for a, _ in LINEARS:
            fm = getattr(_owner(L, a), a)
            saved[(i, a)] = fm
            c = crest[(i, readers[a])] if a in readers else None
            setattr(_owner(L, a), a, _Probe(fm, target, profile, sink, f"{i}.{a}", c))
    try:
        for ids in seqs:
            m.forward(list(ids), m.new_cache(min(m.hp.n_ctx_train, len(ids) + 1)), all_logits=True)
    finally:
        for (i, a), fm in saved.items():
            setattr(_owner(m.layers[i], a), a, fm)
    layers = []
    for i in range(len(m.layers)):
        lin = {}
        for a, _ in LINEARS:
            s = sink[f"{i}.{a}"]
            y2 = max(s["y2"], 1e-300)
            lin[a] = {"out_a8": float(np.sqrt(s["e_a8"] / y2)),
                      "out_blocks": float(np.sqrt(s["e_blocks"] / y2)),
                      "out_w": float(np.sqrt(s["e_w"] / y2)), "w_err": s["w_err"]}
        layers.append({"layer": i, **{k: crest_stats(np.concatenate(crest[(i, k)])) for k, _ in _INPUTS},
                       "linears": lin})
    return layers


def rotation_study(model, rotated, prompts, max_tokens: int = 24, types=("Q8_0", "Q4_0"),
                   profile=None, progress=None) -> dict:
    """Rotated against unrotated (docs/quality.md, "Rotation"): `model` the
    original (registry name or path), `rotated` its rotation (a path; F32
    weights, `rotate --type F32`, so that every weight type starts from the
    same float weights as the original's requantization does). On the
    original's greedy continuations of `prompts` (max_tokens each):

    * per layer, for both models (@float): the crest factors of the four
      linear inputs (attention, attention output, FFN, FFN middle) and each
      linear's relative output error with its input quantized per token to
      int8 (`out_a8`) and to ggml's activation blocks of the first of
      `types` (`out_blocks`), weights in float (`layers._Probe`);
    * KL(model@float || TEST) at the generated positions (`kl.kl_rows`) for
      TEST = rotated@float (the same function), model@a8token and
      rotated@a8token (float weights, per-token int8 activations), and
      model@T / rotated@T for each weight type T (as llama.cpp runs it);
      with the noise floor (model@float's batched pass).

    Returns a dict ("layers": [{"layer", "orig", "rot"}], "kl": {name:
    statistics}, "floor", settings). progress(n): called as work is done."""
    from .. import cpu
    from ..infer.sampling import Sampler
    from ..types import parse_type
    from .kl import kl_rows, reference_pass, summarize, teacher_forced
    from .variants import load_variant
    prof = cpu.select(profile)
    types = [parse_type(t) for t in types]
    ref = load_variant(f"{model}@float", prof)
    sampler = Sampler(0.0)
    runs = []
    for text in prompts:
        ids = ref.tokenizer.encode(text, add_special=True, parse_special=False)
        toks, rlog = reference_pass(ref, ids, max_tokens, sampler)
        runs.append((ids, toks, rlog))
        if progress:
            progress(1)
    seqs = [list(ids) + list(toks[:-1]) for ids, toks, _ in runs]
    floor = [kl_rows(rlog, teacher_forced(ref, ids, toks), toks) for ids, toks, rlog in runs]
    orig_layers = _calibrate(ref, types[0], prof, seqs)
    del ref
    rot = load_variant(f"{rotated}@float", prof)
    rot_layers = _calibrate(rot, types[0], prof, seqs)
    del rot
    if progress:
        progress(1)
    tests = [("rot@float", f"{rotated}@float"), ("orig@a8token", f"{model}@a8token"),
             ("rot@a8token", f"{rotated}@a8token")]
    for t in types:
        tests += [(f"orig@{t.name}", f"{model}@{t.name}"), (f"rot@{t.name}", f"{rotated}@{t.name}")]
    kls = {}
    for name, spec in tests:
        m = load_variant(spec, prof)
        rows = [kl_rows(rlog, teacher_forced(m, ids, toks), toks) for ids, toks, rlog in runs]
        kls[name] = summarize({k: np.concatenate([r[k] for r in rows]) for k in ("kl", "dp", "top1")})
        del m
        if progress:
            progress(1)
    return {"model": str(model), "rotated": str(rotated), "cpu": prof.name, "prompts": len(prompts),
            "positions": int(sum(len(t) for _, t, _ in runs)), "types": [t.name for t in types],
            "layers": [{"layer": i, "orig": a, "rot": b} for i, (a, b) in enumerate(zip(orig_layers, rot_layers))],
            "kl": kls,
            "floor": summarize({k: np.concatenate([r[k] for r in floor]) for k in ("kl", "dp", "top1")})}
