"""What every architecture graph shares: reading a GGUF file's
hyperparameters (`ArchKeys`, `common_params`, `swa_params`), its tensors
(`Weights`: shape checks, and that every tensor was used), the `Model`
base class (the forward-pass driver in chunks of llama.cpp's ubatch size,
the output head) and the error types.

Which graph runs which architecture is the table of `archs` (`ARCHS`);
`loader.load` picks it. The graphs (one module each, after llama.cpp
vendored by llama-cpp-python 0.3.36, `src/llama-model.cpp` and
`src/models/*.cpp`):

| graph | module | architectures |
|---|---|---|
| dense | `dense` | llama, qwen2, qwen3, gemma3, phi3 |
| mixture of experts | `moe` | qwen3moe, glm4moe, deepseek2 (MLA attention: `mla`), gpt-oss (llama.cpp's `openai-moe`) |
| hybrid (Gated DeltaNet + gated attention + experts or a dense FFN) | `hybrid` | qwen3next, qwen35moe, qwen35 |
| Gemma 4 (two kinds of layers, shared KV, per-layer embeddings, dense or MoE) | `gemma4` | gemma4 |

Every operation follows ggml-cpu's arithmetic, order of float operations
included, in the CPU profile the model was loaded with (`strata_ref.cpu`:
one per llama.cpp CPU build), so that the logits equal that build's bit for
bit (docs/inference.md). The graphs never ask which profile runs.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from .. import cpu
from .._text import count
from ..cpu import ops
from ..cpu.matmul import QMatrix
from ..cpu.profiles import ARM64_PROFILES
from ..types import PLAIN_TYPES, GGMLType, block_format
from . import trace
from .archs import ARCHS, SUPPORTED_ARCHS, ArchSpec, Swa
from .kv_cache import KVCache
from .tokenizer import Tokenizer

__all__ = ["Model", "CommonHParams", "ModelLoadError", "ModelOutputError", "SUPPORTED_ARCHS", "ArchKeys", "Weights",
           "architecture", "arch_spec", "common_params", "swa_params", "check_logits"]


class ModelLoadError(ValueError):
    """A GGUF file this engine cannot run: unsupported architecture, missing
    metadata key or tensor, a hyperparameter of the wrong type or out of
    range (the message names the key and its value), or inconsistent
    shapes."""


class ModelOutputError(ValueError):
    """The forward pass gave logits that cannot be sampled (non-finite, or
    all equal): a damaged model that loaded (`check_logits`)."""


#: llama.cpp's `LLAMA_MAX_LAYERS` (src/llama-hparams.h): more layers than
#: this is a damaged file, refused before anything per layer is built
MAX_LAYERS = 512


def _shown(v) -> str:
    """repr of a metadata value for a message, at most about 80 characters
    (an array of 10^5 strings is not quoted whole)."""
    r = repr(v)
    return r if len(r) <= 80 else r[:60] + " ... " + r[-15:]


def _int_param(k: str, v, lo: int, hi: int | None = None) -> int:
    """Metadata value `v` of key `k` as an int in [lo, hi]; a bool, float,
    string or out-of-range value raises ModelLoadError naming key and value
    (llama.cpp reads these keys as integers and refuses other types)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ModelLoadError(f"`{k}` = {_shown(v)} is not an integer")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ModelLoadError(f"`{k}` = {v} is out of range (must be {rng})")
    return v


def _float_param(k: str, v, positive: bool = True) -> float:
    """Metadata value `v` of key `k` as a finite float, > 0 when `positive`
    else >= 0; anything else raises ModelLoadError naming key and value."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ModelLoadError(f"`{k}` = {_shown(v)} is not a number")
    f = float(v)
    if not math.isfinite(f) or f < 0.0 or (positive and f == 0.0):
        raise ModelLoadError(f"`{k}` = {f!r} must be finite and {'> 0' if positive else '>= 0'}")
    return f


def architecture(md) -> str:
    """`general.architecture` of metadata `md`; ModelLoadError when it is
    missing or names an architecture `archs.ARCHS` has no row for."""
    arch = md.get("general.architecture")
    if arch is None:
        raise ModelLoadError("GGUF metadata has no `general.architecture`")
    if not isinstance(arch, str):
        raise ModelLoadError(f"`general.architecture` = {_shown(arch)} is not a string")
    if arch not in ARCHS:
        raise ModelLoadError(f"unsupported architecture {arch!r} "
                             f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    return arch


def arch_spec(md, module: str) -> ArchSpec:
    """The `archs.ArchSpec` of metadata `md`'s architecture (`architecture`),
    which must run in graph module `module` (a family's `from_metadata`
    given another family's file raises ModelLoadError saying so)."""
    spec = ARCHS[architecture(md)]
    if spec.module != module:
        ours = ", ".join(a for a, s in ARCHS.items() if s.module == module)
        raise ModelLoadError(f"architecture {spec.name!r} is not one of the {module} graph's "
                             f"({ours}): load it with strata_ref.infer.load")
    return spec


class ArchKeys:
    """The `<arch>.<name>` metadata keys of one file, read as llama.cpp's
    `llama_model_loader::get_key` / `get_key_or_arr` read them, every bad
    value a ModelLoadError naming the key."""

    def __init__(self, md, arch: str):
        self.md, self.arch = md, arch

    def full(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def __contains__(self, name: str) -> bool:
        return self.full(name) in self.md

    def value(self, name: str, default=None, required: bool = False):
        """The raw value; an array of equal values counts as that value
        (per-layer arrays with differing values are refused)."""
        k = self.full(name)
        if k in self.md:
            v = self.md[k]
            if isinstance(v, np.ndarray):
                if v.size and np.all(v == v.flat[0]):
                    return v.flat[0].item()
                raise ModelLoadError(f"per-layer values of `{k}` are not supported")
            return v
        if required:
            raise ModelLoadError(f"GGUF metadata has no `{k}`")
        return default

    def int(self, name: str, default=None, required: bool = False, lo: int = 1, hi=None) -> int:
        return _int_param(self.full(name), self.value(name, default, required), lo, hi)

    def float(self, name: str, default=None, required: bool = False, positive: bool = True) -> float:
        return _float_param(self.full(name), self.value(name, default, required), positive)

    def ints_per_layer(self, name: str, n_layer: int, default=None, required: bool = False,
                       lo: int = 1, hi=None) -> tuple:
        """An integer key llama.cpp reads with `get_key_or_arr`: one value
        for every layer, or an array of one value per layer; a tuple of
        n_layer ints either way (ModelLoadError naming the key for a wrong
        length, type or range)."""
        k = self.full(name)
        v = self.md.get(k, default)
        if v is None:
            if required:
                raise ModelLoadError(f"GGUF metadata has no `{k}`")
            return None
        if isinstance(v, (list, np.ndarray)):
            if len(v) != n_layer:
                raise ModelLoadError(f"`{k}` has {count(len(v), 'value')} for {count(n_layer, 'layer')}")
            return tuple(_int_param(k, x.item() if isinstance(x, np.generic) else x, lo, hi) for x in v)
        return (_int_param(k, v, lo, hi),) * n_layer

    def per_layer_bools(self, name: str, n_layer: int):
        """A BOOL / integer array of one value per layer as a tuple of bools,
        or None when the key is absent."""
        k = self.full(name)
        if k not in self.md:
            return None
        v = self.md[k]
        if not isinstance(v, (list, np.ndarray)):
            raise ModelLoadError(f"`{k}` = {v!r} is not an array")
        if len(v) != n_layer:
            raise ModelLoadError(f"`{k}` has {len(v)} values for {n_layer} layers")
        return tuple(bool(b) for b in v)


@dataclass(frozen=True)
class CommonHParams:
    """The hyperparameters every family reads (`common_params`): counts,
    head sizes, n_ctx_train, the RMSNorm eps and the RoPE base and
    frequency scale. Each family's hyperparameters (`dense.HParams`,
    `moe.MoEHParams`, `hybrid.HybridHParams`) extend it."""
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_ctx_train: int
    eps: float
    rope_base: float
    rope_freq_scale: float


def common_params(k: ArchKeys, spec: ArchSpec, ff_required: bool = True, per_layer: tuple = ()) -> dict:
    """The hyperparameters every family reads, in llama.cpp's order and with
    its defaults (`llama_model_base::load_hparams`): n_layer, n_embd, n_ff
    (0 when absent and not `ff_required`), n_head, n_head_kv, head_dim,
    n_rot, n_ctx_train, eps, rope_base and the RoPE scaling: freq_scale
    (linear or YaRN factor) and, for an architecture whose `spec` runs YaRN
    (`ArchSpec.rope_scaling`), the YaRN fields of `rope_yarn_params`. A
    RoPE scaling the architecture does not run raises ModelLoadError naming
    the key. per_layer: of "feed_forward_length" and
    "attention.head_count_kv", those that may hold one value per layer
    (gemma4); n_ff and n_head_kv are then their largest values, and the
    graph reads the per-layer ones (`ArchKeys.ints_per_layer`)."""
    arch = k.arch
    n_layer = k.int("block_count", required=True, hi=MAX_LAYERS)
    n_embd = k.int("embedding_length", required=True)
    if "feed_forward_length" in per_layer:
        n_ff = max(k.ints_per_layer("feed_forward_length", n_layer, required=True))
    else:
        n_ff = k.int("feed_forward_length", required=True) if ff_required or "feed_forward_length" in k else 0
    n_head = k.int("attention.head_count", required=True)
    if "attention.head_count_kv" in per_layer:
        kvs = k.ints_per_layer("attention.head_count_kv", n_layer, n_head, hi=n_head)
        bad = [v for v in kvs if n_head % v]
        if bad:
            raise ModelLoadError(f"`{arch}.attention.head_count` = {n_head} is not a multiple of "
                                 f"`{arch}.attention.head_count_kv` = {bad[0]}")
        n_head_kv = max(kvs)
    else:
        n_head_kv = k.int("attention.head_count_kv", n_head, hi=n_head)
    if n_head % n_head_kv:
        raise ModelLoadError(f"`{arch}.attention.head_count` = {n_head} is not a multiple of "
                             f"`{arch}.attention.head_count_kv` = {n_head_kv}")
    if "attention.key_length" not in k and n_embd % n_head:
        # llama.cpp's default head size is n_embd / n_head
        raise ModelLoadError(f"`{arch}.embedding_length` = {n_embd} is not a multiple of "
                             f"`{arch}.attention.head_count` = {n_head} (and there is no "
                             f"`{arch}.attention.key_length`)")
    head_dim = k.int("attention.key_length", n_embd // n_head)
    if not spec.mla and k.int("attention.value_length", head_dim) != head_dim:
        raise ModelLoadError(f"`{arch}.attention.value_length` differs from key_length: not supported")
    n_rot = k.int("rope.dimension_count", head_dim, lo=2, hi=head_dim)
    if n_rot % 2:
        raise ModelLoadError(f"`{arch}.rope.dimension_count` = {n_rot} is odd (RoPE rotates pairs)")
    n_ctx_train = k.int("context_length", 2048)
    eps = k.float("attention.layer_norm_rms_epsilon", required=True)
    base = k.float("rope.freq_base", 10000.0)
    scaling = k.value("rope.scaling.type", "none")
    if not isinstance(scaling, str):
        raise ModelLoadError(f"`{arch}.rope.scaling.type` = {_shown(scaling)} is not a string")
    factor = k.float("rope.scaling.factor", 0.0, positive=False)
    yarn = "yarn" in spec.rope_scaling
    if scaling not in spec.rope_scaling and factor not in (0.0, 1.0):
        raise ModelLoadError(f"RoPE scaling `{arch}.rope.scaling.type` = {scaling!r} is not supported")
    freq_scale = 1.0 / factor if scaling in ("linear", "yarn") and factor > 0 else 1.0
    out = dict(arch=arch, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
               n_head_kv=n_head_kv, head_dim=head_dim, n_rot=n_rot, n_ctx_train=n_ctx_train,
               eps=eps, rope_base=base, rope_freq_scale=freq_scale)
    if yarn:
        out["rope_yarn"] = rope_yarn_params(k, scaling, freq_scale, n_ctx_train, spec.yarn_log_mul)
    return out


def refuse_rope_attn_factor(k: ArchKeys, yarn) -> None:
    """ModelLoadError naming `rope.scaling.attn_factor` when a file of a
    graph that does not apply it (the MoE and hybrid graphs without YaRN)
    sets it to another value than 1: llama.cpp multiplies RoPE's cos and
    sin by it (llama-context.cpp), and running without would be wrong."""
    if yarn is None and k.float("rope.scaling.attn_factor", 1.0) != 1.0:
        raise ModelLoadError(f"`{k.full('rope.scaling.attn_factor')}` is not supported "
                             f"by the {k.arch} graph")


def swa_params(k: ArchKeys, swa: Swa | None, n_layer: int, rope_base: float, rope_freq_scale: float) -> dict:
    """The sliding-window hyperparameters of an architecture whose layers
    follow `swa` (`archs.Swa`; None: no window), as llama.cpp reads them:
    n_swa (`attention.sliding_window`; 0: none), swa_layers (a bool per
    layer, `llama_model_base::load_swa_pattern`: an array of BOOL, or the
    pattern p of `llama_hparams::set_swa_pattern`), rope_base_swa and
    rope_freq_scale_swa (the local layers' RoPE: `rope.freq_base_swa`, else
    the full layers' or llama.cpp's defaults 10000 and 1, as `swa` says).
    Every bad value is a ModelLoadError naming the key."""
    out = dict(n_swa=0, swa_layers=(False,) * n_layer, rope_base_swa=rope_base,
               rope_freq_scale_swa=rope_freq_scale)
    if swa is None:
        return out
    if swa.disabled:
        if "attention.sliding_window" in k:
            k.int("attention.sliding_window", lo=0)     # read (a wrong type refuses the file), unused
        return out
    n_swa = 0
    if swa.required or "attention.sliding_window" in k:
        n_swa = k.int("attention.sliding_window", required=True)
    if n_swa == 0:
        return out
    kp = k.full("attention.sliding_window_pattern")
    pattern = k.md.get(kp, swa.pattern)
    if isinstance(pattern, (list, np.ndarray)):
        if not (pattern.dtype.kind in "bui" if isinstance(pattern, np.ndarray) else
                all(isinstance(b, (bool, int, np.integer, np.bool_)) for b in pattern)):
            raise ModelLoadError(f"`{kp}` must be an array of BOOL or integers, got {_shown(pattern)}")
        if len(pattern) != n_layer:
            raise ModelLoadError(f"`{kp}` has {count(len(pattern), 'value')} for {count(n_layer, 'layer')}")
        layers = tuple(bool(b) for b in pattern)
    else:
        p = _int_param(kp, pattern, 0)
        layers = tuple(p == 0 or il % p < p - 1 for il in range(n_layer))
    # llama.cpp's `rope_freq_base_train_swa` / `rope_freq_scale_train_swa`
    # default to 10000 and 1 (llama-hparams.h), kept unless the
    # architecture sets them to the full layers' (gpt-oss)
    base = rope_base if swa.rope_of_full else 10000.0
    return dict(n_swa=n_swa, swa_layers=layers,
                rope_base_swa=k.float("rope.freq_base_swa", base),
                rope_freq_scale_swa=rope_freq_scale if swa.rope_of_full else 1.0)


def rope_yarn_params(k: ArchKeys, scaling: str, freq_scale: float, n_ctx_train: int,
                     log_mul_key: bool = False) -> tuple:
    """(ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig) as
    llama.cpp's context sets them with llama-cpp-python's defaults
    (`llama_context::llama_context`, src/llama-context.cpp; the Python
    wrapper passes yarn_ext_factor -1 = from the model, attn_factor 1,
    beta_fast 32, beta_slow 1): ext_factor 1 for YaRN scaling else 0;
    with ext_factor != 0 attn_factor = get_mscale(s, mscale) /
    get_mscale(s, mscale_all_dims) / (1 + 0.1 logf(s)), s = 1 /
    freq_scale, get_mscale(s, m) = 0.1 m logf(s) + 1 for s > 1 (else 1);
    mscale_all_dims is hparams' `rope_yarn_log_mul` and mscale 1, except
    for an architecture whose loader reads it (`log_mul_key`:
    `ArchSpec.yarn_log_mul`, deepseek2), `rope.scaling.yarn_log_multiplier` divided
    by 0.1 (`llama_model_deepseek2::load_arch_hparams`) and takes mscale =
    mscale_all_dims unless that is 1 (so its ratio is 1); without the key
    the ratio is get_mscale(s, 1). The key is refused for the other
    architectures (their loaders do not read it). Then times
    `rope.scaling.attn_factor`. float32 arithmetic of the library's plain
    (no FMA) build; n_ctx_orig from `rope.scaling.original_context_length`,
    else the training context."""
    f = np.float32
    ext = f(1.0) if scaling == "yarn" else f(0.0)
    attn = f(1.0)
    log_mul = f(0.0)
    if "rope.scaling.yarn_log_multiplier" in k:
        if not log_mul_key:
            if k.float("rope.scaling.yarn_log_multiplier", positive=False):
                raise ModelLoadError(f"`{k.full('rope.scaling.yarn_log_multiplier')}` is not supported")
        else:
            # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: the converter's 0.1 cancelled
            log_mul = f(f(k.float("rope.scaling.yarn_log_multiplier", positive=False)) / f(0.1))
    if ext != 0:
        factor = f(f(1.0) / f(freq_scale))

        def get_mscale(m):
            # (0.1f * mscale) * logf(scale) + 1.0f, for scale > 1
            return f(1.0) if factor <= 1.0 else f(f(f(f(0.1) * f(m)) * _logf(factor)) + f(1.0))
        if log_mul != 0:
            mscale = log_mul if log_mul != 1 else f(1.0)
            attn = f(get_mscale(mscale) / get_mscale(log_mul))
        else:
            attn = get_mscale(f(1.0))
        attn = f(attn * f(f(1.0) / f(f(1.0) + f(f(0.1) * _logf(factor)))))
    attn = f(attn * f(k.float("rope.scaling.attn_factor", 1.0)))
    n_orig = k.int("rope.scaling.original_context_length", n_ctx_train)
    return (float(ext), float(attn), 32.0, 1.0, n_orig)


def _logf(x) -> np.float32:
    """The C library's logf (what llama.cpp calls), for the few scalar
    hyperparameter formulas evaluated at context creation."""
    import ctypes
    global _LIBM_LOGF
    if _LIBM_LOGF is None:
        fn = ctypes.CDLL(None).logf
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
        _LIBM_LOGF = fn
    return np.float32(_LIBM_LOGF(float(np.float32(x))))


_LIBM_LOGF = None


class Weights:
    """The tensors of a GGUF file, handed out as the graphs use them, with
    llama.cpp's shape checks (`llama_model_loader::create_tensor`): a
    missing required tensor or a shape other than the expected one raises
    ModelLoadError naming the tensor."""

    def __init__(self, gf, arch: str, profile):
        self.tensors = {t.name: t for t in gf.tensors}
        self.arch, self.profile = arch, profile
        self.used = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, required: bool = True):
        t = self.tensors.get(name)
        if t is None and required:
            raise ModelLoadError(f"{self.arch}: missing tensor `{name}`")
        if t is not None:
            self.used.add(name)
        return t

    def check_all_used(self, ignore=None) -> None:
        """ModelLoadError naming the first tensor (in file order) that no
        part of the graph took: llama.cpp refuses such a file ("wrong number
        of tensors"). ignore(name) -> True skips a tensor llama.cpp loads
        but does not run (MTP layers)."""
        for name in self.tensors:
            if name not in self.used and not (ignore is not None and ignore(name)):
                raise ModelLoadError(f"{self.arch}: tensor `{name}` is not part of llama.cpp's "
                                     f"{self.arch} graph (llama.cpp refuses files with tensors "
                                     f"it does not load)")

    def checked(self, name: str, t, ne):
        """t, after llama.cpp `create_tensor`'s checks: the ggml shape is
        exactly `ne`, the dimensions beyond it 1 (a (64, 32, 2) tensor is
        not 64 x 64), and the type is a float or quantized one."""
        have = tuple(t.shape) + (1,) * (4 - len(t.shape))
        want = tuple(ne) + (1,) * (4 - len(ne))
        if have != want:
            raise ModelLoadError(f"tensor `{name}` has ggml shape {list(t.shape)}, expected "
                                 f"{list(ne)}")
        if t.type in PLAIN_TYPES:
            raise ModelLoadError(f"tensor `{name}` is of type {t.type.name}, a plain "
                                 f"{block_format(t.type).field('v').kind} array; model "
                                 f"weights are float or quantized types")
        return t

    def vec(self, name: str, n: int, required: bool = True):
        """A 1-D tensor of n values as float32 (n,) (quantized ones
        dequantized by the oracle), or None when absent and not required."""
        t = self.get(name, required)
        if t is None:
            return None
        self.checked(name, t, (n,))
        if t.type != GGMLType.F32:
            from ..dequant import dequant_f32
            return dequant_f32(t.type, t.data, 1, n)[0]
        return np.array(t.data.view(np.float32))

    def table(self, name: str, rows: int, cols: int, required: bool = True):
        """A (rows, cols) tensor of values (biases per expert) as float32."""
        t = self.get(name, required)
        if t is None:
            return None
        self.checked(name, t, (cols, rows))
        from ..dequant import dequant_f32
        return dequant_f32(t.type, t.data, rows, cols)

    def mat(self, name: str, rows: int, cols: int, required: bool = True):
        """A weight matrix of rows x cols (ggml ne[1] x ne[0]) as a
        `cpu.matmul.QMatrix`, or None when absent and not required."""
        t = self.get(name, required)
        if t is None:
            return None
        self.checked(name, t, (cols, rows))
        return QMatrix(t.type, t.data, rows, cols, name, self.profile)

    def experts(self, name: str, n_expert: int, rows: int, cols: int, required: bool = True):
        """A 3-D expert tensor {cols, rows, n_expert} (`*_exps`) as a
        `cpu.moe.ExpertMatrix`, or None when absent and not required."""
        from ..cpu.moe import ExpertMatrix
        t = self.get(name, required)
        if t is None:
            return None
        self.checked(name, t, (cols, rows, n_expert))
        return ExpertMatrix(t.type, t.data, n_expert, rows, cols, name, self.profile)


# ------------------------------------------------------------------ ops
#: ggml `rms_norm` then `mul`, the same in every build (`cpu.ops.rms_norm`)
rms_norm = ops.rms_norm


def rope_cos_sin(pos: np.ndarray, n_rot: int, base: float, freq_scale: float,
                 freq_factors: np.ndarray | None = None):
    """cos and sin float32 (n, n_rot/2) as ggml `ggml_rope_cache_init`
    (`ops.rope_cache`): theta starts at the position and is multiplied by
    powf(base, -2/n_rot) in float32 for each pair; freq_factors divide it
    (llama3 `rope_freqs`); libm cosf / sinf."""
    return ops.rope_cache(pos, n_rot, base, freq_scale, freq_factors)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool,
               profile=None) -> np.ndarray:
    """Rotate the first n_rot values of each head. x (n, heads, head_dim);
    cos, sin (n, n_rot/2). Normal style pairs (2i, 2i+1); NeoX pairs
    (i, i + n_rot/2) (ggml `rotate_pairs` as the profile's build compiles
    it: `ops.rope`). profile: a `strata_ref.cpu` profile or name (None:
    `cpu.select()`)."""
    return ops.rope(x, cos, sin, n_rot, neox, cpu.select(profile))


# ------------------------------------------------------------------ model
class Model:
    """A loaded GGUF model: `spec` (its architecture's `archs.ArchSpec`),
    `hp` (the graph's hyperparameters), `tokenizer`, weights. A graph module
    subclasses it with `HPARAMS` (a class with `from_metadata(md)`),
    `_load_layers()` (which ends with `self.w.check_all_used()`),
    `_forward(tokens, cache, all_logits)` and `_matrices()`;
    `_make_cache(n_ctx)` / `_cache_bytes` when its cache is not the plain
    KV cache.

    `forward(tokens, cache, all_logits=False)` runs the tokens (int list)
    at positions cache.n .. cache.n + len - 1, appends their K/V (and
    recurrent state) to `cache`, and returns float32 logits (n_vocab,) of
    the last token, or (len, n_vocab) for every token when `all_logits`.
    """

    HPARAMS = None

    def __init__(self, gf, path=None, profile=None):
        self.path = path
        #: the CPU profile (`strata_ref.cpu.Profile`) whose arithmetic runs
        self.cpu = cpu.select(profile)
        md = gf.metadata
        self.metadata = md
        self.hp = hp = self.HPARAMS.from_metadata(md)
        #: the architecture's row of the spec table (`archs.ARCHS`)
        self.spec = ARCHS[hp.arch]
        self.tokenizer = Tokenizer.from_metadata(md)
        self.w = Weights(gf, hp.arch, self.cpu)
        self._load_io()
        self._load_layers()

    def _load_io(self) -> None:
        """token_embd, output_norm and output (tied to token_embd when the
        file has none and the spec's `output` is "tied"), as llama.cpp's
        `load_arch_tensors`."""
        w, e = self.w, self.hp.n_embd
        # the vocabulary is the tokenizer's (llama.cpp: n_vocab = the number
        # of tokens); the embedding and the output have exactly that many rows
        self.n_vocab = nv = self.tokenizer.n_vocab
        for name in ("token_embd.weight", "output.weight"):
            t = w.get(name, required=name == "token_embd.weight")
            if t is not None and len(t.shape) == 2 and t.cols == e and t.rows != nv:
                raise ModelLoadError(f"tensor `{name}` has {t.rows} rows, but the vocabulary "
                                     f"(`tokenizer.ggml.tokens`) has {nv} tokens")
        self.tok_embd = w.mat("token_embd.weight", nv, e)
        self.output_norm = w.vec("output_norm.weight", e)
        out = w.mat("output.weight", nv, e, required=self.spec.output == "own")
        self.output = out if out is not None else self.tok_embd

    def _load_layers(self) -> None:
        raise NotImplementedError

    def _matrices(self) -> list:
        raise NotImplementedError

    # -------------------------------------------------------------- API
    def prepare(self) -> None:
        """Pack every matrix the forward pass multiplies now rather than at
        its first use (so that timings exclude it)."""
        for q in self._matrices():
            q.prepare()

    def _cache_bytes(self, n_ctx: int, **options) -> int:
        hp = self.hp
        return KVCache.bytes_needed(hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx,
                                    options.get("type_k", "f16"), options.get("type_v", "f16"))

    def _make_cache(self, n_ctx: int, **options):
        hp = self.hp
        return KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx, **options)

    #: the KV cache options `new_cache` uses unless told otherwise (`load`
    #: sets them): KVCache's type_k, type_v, flash_attn, rotate, fa_threads
    cache_options: dict = {}

    def new_cache(self, n_ctx: int | None = None, **options):
        """An empty cache for n_ctx positions (default: the training
        context, at most 4096): the KV cache, plus the recurrent state for
        hybrid models, with `KVCache`'s options (type_k, type_v,
        flash_attn, rotate, fa_threads) from `options`, else
        `cache_options`, else the defaults of the profile's llama.cpp (F16;
        flash attention off for llama-cpp-python 0.3.36's, `auto`, i.e. on,
        for v0.4.0's: `Profile.default_flash_attn`).

        Raises ValueError, before allocating anything, when n_ctx is below 1
        or above the model's training context (`<arch>.context_length`, also
        the limit of `strata-ref generate --ctx`, `infer.ctx_problem`: this
        engine has no context extension), when the cache would need more bytes than this
        machine's physical memory, or for an option KVCache refuses."""
        hp = self.hp
        opts = {**self.cache_options, **options}
        if opts.get("flash_attn") is None:
            opts["flash_attn"] = self.cpu.default_flash_attn
        if opts.get("fa_threads") is not None and not _flash_attn_on(opts):
            if "fa_threads" not in options:
                # `load`'s fa_threads is for the caches with flash attention
                opts.pop("fa_threads")
            elif options.get("flash_attn") is None and self.cache_options.get("flash_attn") is None:
                raise ValueError(f"fa_threads {options['fa_threads']} needs flash attention, which is "
                                 f"off by default on the {self.cpu.name} profile: pass flash_attn=True "
                                 f"or leave fa_threads out")
        _refuse_unemulated_cache(self.cpu, opts)
        n_ctx = min(hp.n_ctx_train, 4096) if n_ctx is None else int(n_ctx)
        if not 1 <= n_ctx <= hp.n_ctx_train:
            raise ValueError(f"n_ctx {n_ctx} is outside 1 .. {hp.n_ctx_train} ({hp.n_ctx_train}: "
                             f"the model's training context, `{hp.arch}.context_length`)")
        need = self._cache_bytes(n_ctx, **opts)
        have = _physical_memory()
        if have and need > have:
            raise ValueError(f"context length (--ctx) {n_ctx}: the KV cache would take "
                             f"{need / 2**30:.1f} GiB, more than this machine's "
                             f"{have / 2**30:.1f} GiB of memory")
        return self._make_cache(n_ctx, **opts)

    def embed(self, tokens) -> np.ndarray:
        """float32 (n, n_embd) token embeddings (ggml `get_rows`; llama.cpp's
        node name: the spec's `names.embd`), times hp.embd_scale where the
        graph has one other than 1 (gemma: ggml_scale by sqrtf(n_embd),
        node `inp_scaled`)."""
        x = self.tok_embd.rows_f32([int(t) for t in tokens])
        trace.emit(self.spec.names.embd, "GET_ROWS", x)
        s = getattr(self.hp, "embd_scale", 1.0)
        if s != 1.0:
            x = (x * np.float32(s)).astype(np.float32)
            trace.emit("inp_scaled", "SCALE", x)
        return x

    def forward(self, tokens, cache, all_logits: bool = False) -> np.ndarray:
        # A damaged model (NaN epsilon, wrong tensor type) overflows or makes
        # NaN in numpy steps; the caller checks the logits (`check_logits`)
        # and names the problem once, instead of a RuntimeWarning per step.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._forward_chunks(tokens, cache, all_logits)

    def _forward_chunks(self, tokens, cache, all_logits):
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("forward needs at least one token")
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {self.n_vocab})")
        n = len(tokens)
        if cache.n + n > cache.n_ctx:
            raise ValueError(f"context full: {cache.n} + {n} tokens exceed n_ctx = {cache.n_ctx}")
        if n > self.CHUNK:
            # Long inputs run in chunks, as llama.cpp splits a batch into
            # ubatches of n_ubatch (512 by default) tokens. ggml's code path
            # depends on the number of tokens in a pass (one token or more;
            # 8 or more for the tiled K-quants; whole groups of 4 for the
            # repacked gemm), so a chunk can differ from one pass in the
            # last bits where those counts change.
            parts = [self._forward_chunks(tokens[i:i + self.CHUNK], cache, all_logits)
                     for i in range(0, n, self.CHUNK)]
            return np.concatenate(parts) if all_logits else parts[-1]
        return self._forward(tokens, cache, all_logits)

    #: tokens per internal pass of `forward` (llama.cpp's default n_ubatch)
    CHUNK = 512

    def _forward(self, tokens, cache, all_logits):
        raise NotImplementedError

    def _head(self, x: np.ndarray, all_logits: bool) -> np.ndarray:
        """The output head: RMSNorm with output_norm, the output mat-mul,
        gemma's final soft-capping; x float32 (n, n_embd) after the last
        layer. Returns (n, n_vocab), or (n_vocab,) for the last row."""
        hp, names = self.hp, self.spec.names
        if not all_logits:
            x = x[-1:]
        x = trace.norm(x, self.output_norm, hp.eps, names.result_norm, None)
        if names.head_rows:
            trace.emit(names.head_rows, "GET_ROWS", x)
        logits = self.output.matmul(x)
        if getattr(hp, "final_softcap", 0.0):
            # ggml scale, tanh, scale (`ops.softcap` fuses them: their
            # intermediate nodes are not recorded)
            trace.emit(trace.derived_name("MUL_MAT", [self.output.name, names.head_rows or names.result_norm]),
                       "MUL_MAT", logits)
            logits = ops.softcap(logits, hp.final_softcap, self.cpu)
            trace.emit("result_output", "SCALE", logits)
        else:
            trace.emit("result_output", "MUL_MAT", logits)
        return logits if all_logits else logits[0]

    def _trace_out_rows(self, name: str, x) -> None:
        """The `get_rows(x, inp_out_ids)` llama.cpp's graph takes of the
        last layer's tensors (every row in a trace: all logits are
        computed), recorded as its unnamed node."""
        if trace.on():
            trace.emit(trace.derived_name("GET_ROWS", [name, "out_ids"]), "GET_ROWS", x)


def _physical_memory() -> int:
    """Bytes of physical memory, 0 when the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def check_logits(logits: np.ndarray, where: str, spread: bool = True) -> None:
    """Raise ModelOutputError when `logits` (float32, (n_vocab,)) cannot be
    sampled: any NaN or infinite value, or (`spread`) every value equal,
    which a working model never gives and a damaged one (NaN or zero
    weights, a tensor read as the wrong type) does. `where` names the pass
    in the message ("the prompt pass", "decode step 3"). O(n_vocab)."""
    bad = ~np.isfinite(logits)
    if bad.any():
        n_nan = int(np.isnan(logits).sum())
        raise ModelOutputError(f"the logits of {where} have {int(bad.sum())} non-finite values "
                               f"of {logits.size} ({n_nan} NaN): the model file is damaged "
                               f"(NaN or huge weights or metadata, e.g. the RMS epsilon)")
    if spread and logits.size > 1 and logits.min() == logits.max():
        raise ModelOutputError(f"the logits of {where} are all equal ({float(logits[0])!r}): "
                               f"the model file is damaged (zero weights, or a tensor stored "
                               f"with the wrong type)")


#: the KV-cache types each arm64 profile runs, without and with flash
#: attention: {profile: {flash_attn: frozenset of type names}}; a cache runs
#: when its K and its V type are both in the set of its flash-attention
#: setting. ggml's ARM code for them is emulated and checked bitwise against
#: that ARM build's own logits under qemu (every row of the batched and the
#: incremental pass, the greedy ids; every configuration of
#: tools/llama_ref.py KV_CONFIGS: each type with K = V, quantized K over an
#: F16 or BF16 V, F16 K over a Q4_0 V, Q8_0 K over a Q4_1 V, the vec, tiled
#: and split-KV flash-attention paths, the rotation off:
#: tests/data/<profile>/llama_kv_SmolLM2-135M-Instruct.npz, `python
#: tools/arm_ref.py data PROFILE --only kv:SmolLM2-135M-Instruct`). In ggml
#: the K type sets how q is converted and dotted and the V type how V is
#: accumulated, each on its own, so a checked K type may go with any checked
#: V type.
_ARM64_ALL_TYPES = frozenset({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"})
ARM64_KV_TYPES = {p: {False: _ARM64_ALL_TYPES, True: _ARM64_ALL_TYPES} for p in ARM64_PROFILES}


def unemulated_cache(profile, opts) -> str | None:
    """What of a KV-cache setting (opts: flash_attn, type_k, type_v as
    `load` takes them) the profile's build computes in code not emulated yet,
    as words ("flash attention", "a q8_0 K cache", ...), or None when all of
    it is: on the arm64 profiles, a K or V type outside `ARM64_KV_TYPES`
    for the flash-attention setting (docs/arm64.md); the x86 attention would
    give other bits there, silently. Raises ValueError for an unknown cache
    type."""
    from .._notemulated import cache_phrase
    from ..cpu import select
    from ..cpu.profiles import LLAMA_CPP_ARM64
    from .kv_cache import cache_type, resolve_flash_attn
    prof = select(profile)
    if prof.version != LLAMA_CPP_ARM64:
        return None
    tk = cache_type(opts.get("type_k", "f16"), "type_k (--cache-type-k)")
    tv = cache_type(opts.get("type_v", "f16"), "type_v (--cache-type-v)")
    fa = resolve_flash_attn(opts.get("flash_attn"), tv)
    done = ARM64_KV_TYPES.get(prof.name, {}).get(fa, frozenset())
    if tk.name.lower() in done and tv.name.lower() in done:
        return None
    return cache_phrase(tk, tv, fa) or None


def _flash_attn_on(opts) -> bool:
    """Whether the cache options `opts` (flash_attn resolved from the
    profile's default, type_v) turn flash attention on; False where they are
    invalid (True: KVCache then names the problem)."""
    from .kv_cache import resolve_flash_attn
    try:
        return resolve_flash_attn(opts.get("flash_attn"), opts.get("type_v", "f16"))
    except ValueError:
        return True


def _refuse_unemulated_cache(profile, opts) -> None:
    """NotEmulated (one line, naming what) for a KV cache the profile's
    build computes in code not emulated yet (`unemulated_cache`)."""
    from .._notemulated import NotEmulated
    from ..cpu import select
    what = unemulated_cache(profile, opts)
    if what:
        raise NotEmulated(f"{what} on the arm64 profile {select(profile).name}: ggml's ARM "
                          "code for it is not emulated yet (docs/arm64.md); use the F16 cache "
                          "without flash attention", what, "on this profile")
