"""The key/value cache of the attention layers, in every type llama.cpp's
CPU backend stores (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1;
default f16, llama.cpp's `type_k = type_v = F16`), with llama.cpp's
Hadamard rotation around a quantized cache and the attention it runs over
the cache, flash attention or not.

Source: llama.cpp vendored by llama-cpp-python 0.3.36:

* storing (`llama_kv_cache::cpy_k` / `cpy_v`, ggml `set_rows`): each row
  of K (and V) converted by the `from_float` of the cache type in ggml-cpu
  (`type_traits_cpu`): F16 round to nearest even, BF16 ggml's rule
  (`GGML_FP32_TO_BF16`), F32 as is, Q8_0 by the profile's activation
  quantizer (`quantize_row_q8_0`: the AVX version on the AVX builds, the
  reference on the baseline build), Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL by
  ggml's reference quantizers (`quantize_row_*_ref` in ggml-base), as the
  build's compiler made them: as written on x86, contracted into FMAs on
  arm64 (`strata_ref.cpu.base_quant`).
* the rotation (`llama_kv_cache` constructor, `build_input_k_rot` /
  `build_input_v_rot`, `llm_graph_context::build_attn`): when K's type is a
  block type and head_dim % 64 == 0, q and k are rotated (after RoPE and
  any q scaling) by the Hadamard matrix of size nrot_k, the largest power
  of two from 64 up that divides head_dim; when V's type is a block type and
  head_dim % 64 == 0, v and the attention output by the one of size 64.
  `$LLAMA_ATTN_ROT_DISABLE` (read as C's `atoi`, non-zero: off) turns both
  off; ggml-cpu computes each rotation by its fast Walsh-Hadamard path
  (`strata_ref.cpu.hadamard`).
* flash attention (`llama_context` / `llama_init_from_model`): a block-type
  V cache requires it. llama-cpp-python passes `flash_attn=False` by default
  (off), llama.cpp's own default `auto` resolves to on with the CPU backend;
  here `flash_attn=None` means off, except on for a block-type V cache,
  True / "on" / "auto" on, False / "off" off (refused with a block-type V
  cache, as llama.cpp refuses it).
* the KV length ggml sees (`llama_kv_cache::get_n_kv`): the cells used,
  rounded up to a multiple of 256, at least 256.

* MLA (`llm_graph_input_attn_k`, deepseek2): only K is cached, one head
  per layer; V is a view of the first `v_of_k` values of each K cell,
  made contiguous (`ggml_cont`, F16 bits unchanged) before the V p mul_mat.
  Here the F16 cache with flash attention off, and with it on (V's DV =
  v_of_k values per cell, `cpu.flash_attn` with v_width) the types of
  `MLA_FA_CACHE_TYPES`; llama.cpp requires K's and V's types to be equal
  for MLA (ValueError where they differ); other types are refused as not
  emulated (NotEmulated). MLA is never rotated: llama.cpp's cache decides
  `attn_rot_k` by the head size (a block type and kv_lora_rank + n_rot a
  multiple of 64, DeepSeek V3's 576), but `build_attn_inp_k` builds no
  `attn_inp_k_rot` input and `build_attn` for `llm_graph_input_attn_k`
  multiplies neither q nor k by it (the decision only reaches a K shift,
  which this cache never does). A block-type MLA cache with such a head is
  emulated for the types of `MLA_HEAD64_CACHE_TYPES`, checked against
  llama.cpp (tests/test_mla_head64.py), and refused (NotEmulated) for the
  others.

Cells are positions 0 .. n-1 in order (one sequence; no ring buffer: a
sliding-window layer keeps every cell and masks the old ones, which is
llama.cpp's layout as long as the positions fit its SWA cache).
"""
from __future__ import annotations

import os

import numpy as np

from ..types import GGMLType, block_format

__all__ = ["KVCache", "IswaCache", "CACHE_TYPES", "cache_type", "rotation_sizes", "rotation_disabled",
           "resolve_flash_attn", "kv_length"]

#: the most threads ggml runs a graph with (ggml.h `GGML_MAX_N_THREADS`,
#: llama.cpp vendored by llama-cpp-python 0.3.36): the bound of fa_threads
MAX_THREADS = 512

#: the cache types of MLA's cache (`KVCache` v_of_k, deepseek2) emulated,
#: each checked against llama.cpp's logits: F16 with flash attention off
#: (tests/test_infer_moe.py) ...
MLA_CACHE_TYPES = frozenset({GGMLType.F16})
#: ... and these with flash attention on (tests/test_mla_flash_attn.py)
MLA_FA_CACHE_TYPES = frozenset({GGMLType.F16, GGMLType.F32, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0,
                                GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.IQ4_NL})

#: the block types of MLA's cache emulated with flash attention where its
#: head (kv_lora_rank + n_rot) is a multiple of 64, checked against
#: llama.cpp's logits on the profiles of `mla.MLA_HEAD64_PROFILES`
#: (tests/test_mla_head64.py): unrotated, as for any other head size
MLA_HEAD64_CACHE_TYPES = frozenset({GGMLType.Q8_0, GGMLType.Q4_0})

#: the cache types llama.cpp accepts (`kv_cache_types`, common/arg.cpp), by name
CACHE_TYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16,
               "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0, "q4_1": GGMLType.Q4_1,
               "iq4_nl": GGMLType.IQ4_NL, "q5_0": GGMLType.Q5_0, "q5_1": GGMLType.Q5_1}
_FLOAT = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
_STORE_DTYPE = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.BF16: np.uint16}
#: the environment variable llama.cpp reads to turn the rotation off
ROT_DISABLE_ENV = "LLAMA_ATTN_ROT_DISABLE"


def cache_type(t, option: str = "type_k") -> GGMLType:
    """A cache type given by name ("q8_0", any case), GGMLType or id; a
    ValueError naming `option` and the accepted names for anything else."""
    if isinstance(t, GGMLType) and t in CACHE_TYPES.values():
        return t
    if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
        for v in CACHE_TYPES.values():
            if int(v) == int(t):
                return v
    if isinstance(t, str) and t.strip().lower() in CACHE_TYPES:
        return CACHE_TYPES[t.strip().lower()]
    raise ValueError(f"{option} {t!r} is not a KV cache type llama.cpp accepts "
                     f"({', '.join(CACHE_TYPES)})")


def _is_block(t: GGMLType) -> bool:
    return t not in _FLOAT


def _atoi(s: str) -> int:
    """C's atoi: optional whitespace and sign, then the leading digits (0
    when there are none)."""
    s = s.lstrip(" \t\n\v\f\r")
    sign = 1
    if s[:1] in "+-" and s[:1]:
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    digits = ""
    for ch in s:
        if not "0" <= ch <= "9":
            break
        digits += ch
    return sign * int(digits) if digits else 0


def rotation_disabled(environ=None) -> bool:
    """Whether `$LLAMA_ATTN_ROT_DISABLE` turns llama.cpp's rotation off
    (set and `atoi` of it non-zero)."""
    env = os.environ if environ is None else environ
    v = env.get(ROT_DISABLE_ENV)
    return v is not None and _atoi(v) != 0


def rotation_sizes(head_dim_k: int, head_dim_v: int, type_k, type_v, disabled: bool = False):
    """(nrot_k, nrot_v): the Hadamard sizes llama.cpp rotates K (and q) and
    V (and the attention output) by, 0 for none (module docstring)."""
    tk, tv = cache_type(type_k), cache_type(type_v, "type_v")
    nk = nv = 0
    if not disabled and _is_block(tk) and head_dim_k % 64 == 0:
        nk = 64
        while head_dim_k % (2 * nk) == 0:
            nk *= 2
    if not disabled and _is_block(tv) and head_dim_v % 64 == 0:
        nv = 64
    return nk, nv


def resolve_flash_attn(flash_attn, type_v) -> bool:
    """Whether flash attention runs (module docstring): None, True / False,
    or "on" / "off" / "auto". ValueError for another value, or for "off"
    with a block-type V cache."""
    tv = cache_type(type_v, "type_v")
    if flash_attn is None:
        return _is_block(tv)
    if isinstance(flash_attn, str):
        key = flash_attn.strip().lower()
        if key not in ("on", "off", "auto"):
            raise ValueError(f"flash_attn {flash_attn!r} must be on, off or auto")
        on = key != "off"
    elif isinstance(flash_attn, (bool, np.bool_)):
        on = bool(flash_attn)
    else:
        raise ValueError(f"flash_attn {flash_attn!r} must be on, off, auto or a bool")
    if not on and _is_block(tv):
        name = tv.name.lower()
        raise ValueError(f"{'an' if name[0] in 'aeiou' else 'a'} {name} V cache requires flash attention (llama.cpp: "
                         f"\"quantized V cache requires flash_attn to be enabled\")")
    return on


def kv_length(n_used: int) -> int:
    """llama.cpp's n_kv for `n_used` filled cells: rounded up to a multiple
    of 256, at least 256 (`llama_kv_cache::get_n_kv`; the cache itself is
    at least that long, llama.cpp pads n_ctx to 256)."""
    return max(256, -(-int(n_used) // 256) * 256)


def _row_width(t: GGMLType, head_dim: int) -> int:
    """Elements of one head's cell as stored: values for float types,
    bytes for block types."""
    if t in _FLOAT:
        return head_dim
    fmt = block_format(t)
    return head_dim // fmt.block_values * fmt.block_bytes


class KVCache:
    """K and V of `n_layer` layers in types `type_k`, `type_v` (module
    docstring): arrays `k`, `v` of shape (n_layer, n_head_kv, n_ctx, w),
    float16 (f16), uint16 bf16 bits (bf16), float32 (f32), or uint8 block
    bytes (w = a head's row bytes).

    `n` is the number of positions filled. `attend(il, q, k, v, pos,
    kq_scale, profile, n_swa)` rotates (when llama.cpp does), stores k and
    v at positions n .. n + len - 1 and returns the layer's attention
    output as llama.cpp computes it for this cache; the model advances `n`
    after the last layer. `store(il, k, v)` stores without attending;
    `keys(il, T)` / `values(il, T)` return the stored cells as float32
    (n_head_kv, T, head_dim).

    v_of_k > 0: MLA's cache (module docstring): no V array (`v` is None),
    `attend` takes v None and returns (n, n_head * v_of_k).

    head_dim_v (None: head_dim): V's head size where it differs from K's
    (deepseek2's non-absorbed MLA files, llama.cpp's n_embd_head_v; F16
    without flash attention only): `attend` returns (n, n_head *
    head_dim_v).

    Raises ValueError for n_ctx < 1, an unknown type, a head_dim that is
    not a multiple of a block type's block, flash attention off with a
    block-type V, or fa_threads (llama.cpp's thread count for flash
    attention's split; default 2) given with flash attention off;
    NotEmulated (a NotImplementedError) for an MLA cache of a type not
    emulated (`MLA_CACHE_TYPES`, `MLA_FA_CACHE_TYPES`); ValueError for one
    whose type_k and type_v differ (llama.cpp refuses it).
    """

    @staticmethod
    def bytes_needed(n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int,
                     type_k="f16", type_v="f16", v_of_k: int = 0, head_dim_v: int | None = None) -> int:
        """Bytes of K and V for these sizes and types (K only for MLA's
        cache, `v_of_k` > 0; V's head size head_dim_v, None: head_dim)."""
        per = 0
        dims = (head_dim, head_dim if head_dim_v is None else head_dim_v)
        for (t, opt), d in list(zip(((type_k, "type_k"), (type_v, "type_v")), dims))[:1 if v_of_k else 2]:
            t = cache_type(t, opt)
            w = _row_width(t, d) if t not in _FLOAT else d * np.dtype(_STORE_DTYPE[t]).itemsize
            per += w
        return int(n_layer) * int(n_head_kv) * int(n_ctx) * per

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int,
                 type_k="f16", type_v="f16", flash_attn=None, rotate: bool | None = None,
                 fa_threads: int | None = None, v_of_k: int = 0, head_dim_v: int | None = None):
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        self.type_k = cache_type(type_k, "type_k (--cache-type-k)")
        self.type_v = cache_type(type_v, "type_v (--cache-type-v)")
        for t, opt in ((self.type_k, "--cache-type-k"), (self.type_v, "--cache-type-v")):
            qk = block_format(t).block_values
            if head_dim % qk:
                raise ValueError(f"{opt} {t.name.lower()}: its block of {qk} values does not "
                                 f"divide head_dim {head_dim}")
        self.flash_attn = resolve_flash_attn(flash_attn, self.type_v)
        if fa_threads is not None:
            if (isinstance(fa_threads, bool) or not isinstance(fa_threads, (int, np.integer))
                    or not 1 <= fa_threads <= MAX_THREADS):
                raise ValueError(f"fa_threads must be a whole number in 1 .. {MAX_THREADS} (ggml's "
                                 f"GGML_MAX_N_THREADS), got {fa_threads!r}")
            if not self.flash_attn:
                # it sets flash attention's split only: silently unused otherwise
                why = ("flash attention is off by default" if flash_attn is None
                       else f"flash_attn={flash_attn!r} turns flash attention off")
                raise ValueError(f"fa_threads {int(fa_threads)} needs flash attention, but {why}: "
                                 f"pass flash_attn=True or leave fa_threads out")
        #: llama.cpp's thread count for flash attention's split of the cells
        self.fa_threads = 2 if fa_threads is None else int(fa_threads)
        #: MLA: V is the first v_of_k values of each K cell (0: V of its own)
        self.v_of_k = int(v_of_k)
        if self.v_of_k and not 0 < self.v_of_k <= head_dim:
            raise ValueError(f"v_of_k {self.v_of_k} is outside 1 .. head_dim {head_dim}")
        if self.v_of_k and self.type_k != self.type_v:
            # llama_init_from_model: "model does not support different K (..) and V (..) cache types"
            raise ValueError(f"the MLA cache (deepseek2) caches K only, its V a view of K: llama.cpp "
                             f"refuses different K ({self.type_k.name.lower()}) and V "
                             f"({self.type_v.name.lower()}) cache types; give both the same type "
                             f"(--cache-type-k and --cache-type-v)")
        if self.v_of_k and self.type_k not in (MLA_FA_CACHE_TYPES if self.flash_attn else MLA_CACHE_TYPES):
            # not emulated yet (`which` lists such a candidate as not run)
            from .._notemulated import NotEmulated, cache_phrase, names_in_order
            fa = names_in_order(t.name.lower() for t in MLA_FA_CACHE_TYPES)
            fa_only = names_in_order(t.name.lower() for t in MLA_FA_CACHE_TYPES - MLA_CACHE_TYPES)
            how = (f"with flash attention, the MLA cache (deepseek2) is emulated with the cache types "
                   f"{fa} only" if self.flash_attn else
                   f"without flash attention, the MLA cache (deepseek2) is emulated with an F16 cache "
                   f"only; the cache types {fa_only} need flash attention on (--flash-attn on; which "
                   f"profiles: docs/inference.md, \"deepseek2 with flash attention\")")
            raise NotEmulated(how,
                              cache_phrase(self.type_k, self.type_v, False),
                              "for the MLA cache (deepseek2)")
        if (self.v_of_k and _is_block(self.type_k) and head_dim % 64 == 0
                and self.type_k not in MLA_HEAD64_CACHE_TYPES):
            # llama.cpp decides a Hadamard rotation for such a head size
            # (`attn_rot_k`) that MLA's graph never applies (module
            # docstring): checked for MLA_HEAD64_CACHE_TYPES only
            from .._notemulated import NotEmulated, cache_phrase, names_in_order
            ok = names_in_order(t.name.lower() for t in MLA_HEAD64_CACHE_TYPES)
            raise NotEmulated(f"a block-type MLA cache (deepseek2) with heads of kv_lora_rank + n_rot "
                              f"a multiple of 64 (here {head_dim}) is checked against llama.cpp with "
                              f"the block types {ok} only; use one of them, or f16, bf16 or f32 (never rotated)",
                              cache_phrase(self.type_k, self.type_v, False),
                              f"for the MLA cache (deepseek2) with heads of {head_dim}")
        #: V's head size (head_dim but for deepseek2's non-absorbed MLA files)
        self.head_dim_v = int(head_dim if head_dim_v is None else head_dim_v)
        if self.head_dim_v != head_dim and (self.v_of_k or self.head_dim_v < 1 or self.flash_attn
                                            or self.type_k != GGMLType.F16 or self.type_v != GGMLType.F16):
            if self.v_of_k or self.head_dim_v < 1:
                raise ValueError(f"head_dim_v {self.head_dim_v} with v_of_k {self.v_of_k}")
            from .._notemulated import NotEmulated, cache_phrase
            raise NotEmulated("a cache whose V heads differ in size from its K heads (deepseek2's "
                              "non-absorbed MLA files) is emulated with F16 K / V and flash attention "
                              "off only: pass --flash-attn off and leave the cache types at f16",
                              cache_phrase(self.type_k, self.type_v, self.flash_attn),
                              "for K and V heads of different sizes")
        # MLA's `build_attn` (`llm_graph_input_attn_k`) never rotates: llama.cpp
        # makes the Hadamard input only for `llm_graph_input_attn_kv`
        disabled = rotation_disabled() if rotate is None else not rotate
        disabled = disabled or bool(self.v_of_k)
        #: Hadamard sizes of K's and V's rotation (0: none)
        self.rot_k, self.rot_v = rotation_sizes(head_dim, self.head_dim_v, self.type_k, self.type_v, disabled)
        #: whether K or V is rotated (`IswaCache` has the same attribute)
        self.rotated = bool(self.rot_k or self.rot_v)
        self.n_ctx = int(n_ctx)
        self.n = 0
        self.head_dim = int(head_dim)
        self.k = self._alloc(self.type_k, n_layer, n_head_kv, self.head_dim)
        self.v = None if self.v_of_k else self._alloc(self.type_v, n_layer, n_head_kv, self.head_dim_v)

    def _alloc(self, t, n_layer, n_head_kv, d):
        dt = _STORE_DTYPE.get(t, np.uint8)
        return np.zeros((n_layer, n_head_kv, self.n_ctx, _row_width(t, d)), dt)

    # ------------------------------------------------------------ storing
    def _encode(self, t: GGMLType, x: np.ndarray, profile) -> np.ndarray:
        """float32 (m, Hkv, D) -> the cells as stored, (Hkv, m, w)."""
        m, Hkv, D = x.shape
        rows = np.ascontiguousarray(x.transpose(1, 0, 2), np.float32).reshape(Hkv * m, D)
        if t == GGMLType.F16:
            return rows.astype(np.float16).reshape(Hkv, m, D)
        if t == GGMLType.F32:
            return rows.reshape(Hkv, m, D)
        if t == GGMLType.BF16:
            from ..numerics import f32_to_bf16_bits
            return f32_to_bf16_bits(rows).reshape(Hkv, m, D)
        bad = ~np.isfinite(rows)
        if bad.any():
            raise ValueError(f"the {t.name.lower()} KV cache got non-finite values: the model "
                             f"is damaged (NaN or huge weights)")
        if t == GGMLType.Q8_0:
            # the build's `quantize_row_q8_0` (AVX or reference)
            from ..cpu.act_quant import q8_0_fields
            from ..numerics import f32_to_f16_bits
            q, d = q8_0_fields(rows, isa=profile.isa)
            nb = D // 32
            blocks = np.empty((Hkv * m, nb, 34), np.uint8)
            blocks[:, :, :2] = f32_to_f16_bits(d).reshape(Hkv * m, nb, 1).view(np.uint8)
            blocks[:, :, 2:] = q.reshape(Hkv * m, nb, 32).view(np.uint8)
            return blocks.reshape(Hkv, m, -1)
        # ggml-base's reference quantizer, as the build compiled it (contracted on arm64)
        from ..cpu.base_quant import quantize_base
        return quantize_base(rows, t, profile.isa).reshape(Hkv, m, -1)

    def store(self, il: int, k: np.ndarray, v: np.ndarray, profile=None) -> None:
        """Write k, v (float32 (m, n_head_kv, head_dim)) at positions n ..
        n + m - 1 of layer il, converted to the cache types by `profile`'s
        build (None: `strata_ref.cpu.select()`; it matters for q8_0)."""
        from .. import cpu
        m = k.shape[0]
        if self.n + m > self.n_ctx:
            raise ValueError(f"KV cache full: {self.n} + {m} > n_ctx {self.n_ctx}")
        prof = cpu.select(profile)
        self.k[il, :, self.n:self.n + m] = self._encode(self.type_k, k, prof)
        if not self.v_of_k:
            self.v[il, :, self.n:self.n + m] = self._encode(self.type_v, v, prof)

    def _decode(self, t, a: np.ndarray, d: int) -> np.ndarray:
        from ..cpu.flash_attn import _v_to_float
        if t == GGMLType.F32:
            return np.array(a, np.float32)
        return _v_to_float(t, a, a.shape[1], d)

    def _v_view(self, il: int) -> np.ndarray:
        """MLA's V cells of layer il (`v_of_k`): the first v_of_k values of
        each K cell as stored, (n_head_kv, n_ctx, w) (a block type: the
        first v_of_k / block_values blocks; ggml's `ggml_view_4d` of K)."""
        return self.k[il][:, :, :_row_width(self.type_k, self.v_of_k)]

    def keys(self, il: int, T: int) -> np.ndarray:
        return self._decode(self.type_k, self.k[il, :, :T], self.head_dim)

    def values(self, il: int, T: int) -> np.ndarray:
        if self.v_of_k:
            return self.keys(il, T)[:, :, :self.v_of_k]
        return self._decode(self.type_v, self.v[il, :, :T], self.head_dim_v)

    def truncate(self, n: int) -> None:
        """Forget positions n and later."""
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot truncate a cache of {self.n} positions to {n}")
        self.n = n

    # ---------------------------------------------------------- attention
    def attend(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: np.ndarray,
               kq_scale: float, profile, n_swa: int = 0, sinks: np.ndarray | None = None) -> np.ndarray:
        """llama.cpp's `build_attn` for layer il over this cache on
        `profile`: q float32 (n, n_head, head_dim), k, v float32 (n,
        n_head_kv, head_dim) of the positions `pos` (= n .. n + len - 1),
        after RoPE and q's scaling; rotation (`rot_k`, `rot_v`), store,
        attention (flash: `cpu.flash_attn`; else F16 / F16 `cpu.f16_attention`,
        other types `cpu.attention.attention_mm`), the output rotated back.
        sinks: float32 (n_head,) attention-sink logits (gpt-oss) or None.
        k and v None: a layer that reuses the cells of an earlier one
        (gemma4's shared-KV layers, llama.cpp's `layer_reuse_cb`): nothing
        is stored, q attends to the slot as that layer left it this pass.
        Returns float32 (n, n_head * head_dim)."""
        from ..cpu import f16_attention
        from ..cpu.attention import attention_mm
        from ..cpu.flash_attn import flash_attn_ext
        from ..cpu.hadamard import fwht
        if self.rot_k:
            q = fwht(np.ascontiguousarray(q, np.float32), self.rot_k)
            if k is not None:
                k = fwht(np.ascontiguousarray(k, np.float32), self.rot_k)
        if self.rot_v and v is not None:
            v = fwht(np.ascontiguousarray(v, np.float32), self.rot_v)
        if k is not None:
            self.store(il, k, v, profile)
        T = self.n + q.shape[0]
        n_kv = kv_length(T)
        if self.v_of_k and self.flash_attn:
            # V: a view of each K cell's first v_of_k values, K's type
            out = flash_attn_ext(q, self.type_k, self.k[il], self.type_k, self._v_view(il), T, n_kv, pos,
                                 kq_scale, profile, n_swa, self.fa_threads, sinks, v_width=self.v_of_k)
        elif self.v_of_k:
            kb = self.k[il].view(np.uint16)
            out = f16_attention.attention(q, kb, kb, T, pos, kq_scale, profile, n_swa, sinks=sinks,
                                          v_width=self.v_of_k)
        elif self.flash_attn:
            out = flash_attn_ext(q, self.type_k, self.k[il], self.type_v, self.v[il], T, n_kv, pos,
                                 kq_scale, profile, n_swa, self.fa_threads, sinks)
        elif self.type_k == self.type_v == GGMLType.F16:
            vw = None if self.head_dim_v == self.head_dim else self.head_dim_v
            out = f16_attention.attention(q, self.k[il].view(np.uint16), self.v[il].view(np.uint16), T, pos,
                                kq_scale, profile, n_swa, sinks=sinks, v_width=vw)
        else:
            out = attention_mm(q, self.type_k, self.k[il], self.type_v, self.v[il], T, n_kv, pos,
                               kq_scale, profile, n_swa, sinks)
        if self.rot_v:
            out = fwht(out, self.rot_v)
        return out


class IswaCache:
    """The KV cache of an architecture whose sliding-window and full
    layers have heads of different sizes (gemma4), as llama.cpp's
    `llama_kv_cache_iswa`: two `KVCache`s, `base` for the full layers and
    `swa` for the sliding-window ones, each with its own KV head count and
    head size and the same options (type_k, type_v, flash_attn, rotate,
    fa_threads); the rotation of a quantized cache follows each one's head
    size, as llama.cpp's `self_k_rot` / `self_k_rot_swa`.

    kinds: one entry per layer, (swa, owner): swa the layer's kind, owner
    the layer whose cells it attends to (itself, or for a layer without
    KV of its own the earlier layer llama.cpp's reuse callback names).
    full, swa: (n_head_kv, head_dim) of each kind. `attend(il, ...)` is
    `KVCache.attend` on layer il's cache and slot (k, v None for a reusing
    layer); `n` is the positions filled (both caches advance together)."""

    @staticmethod
    def bytes_needed(kinds, full, swa, n_ctx: int, type_k="f16", type_v="f16") -> int:
        owners = [(s, o) for il, (s, o) in enumerate(kinds) if o == il]
        return sum(KVCache.bytes_needed(sum(1 for s, _ in owners if s == kind), *shape, n_ctx, type_k, type_v)
                   for kind, shape in ((False, full), (True, swa)))

    def __init__(self, kinds, full, swa, n_ctx: int, **options):
        self._where = []
        count = {False: 0, True: 0}
        slot_of = {}
        for il, (kind, owner) in enumerate(kinds):
            if owner == il:
                slot_of[il] = count[kind]
                count[kind] += 1
            elif owner not in slot_of or kinds[owner][0] != kind:
                raise ValueError(f"layer {il} reuses the cells of layer {owner}, which is not an earlier "
                                 f"layer of its kind")
            self._where.append((kind, slot_of[owner], owner != il))
        self.base = KVCache(max(count[False], 1), *full, n_ctx, **options)
        self.swa = KVCache(max(count[True], 1), *swa, n_ctx, **options)
        self.n_ctx = self.base.n_ctx
        self.flash_attn, self.type_k, self.type_v = self.base.flash_attn, self.base.type_k, self.base.type_v
        self.rotated = self.base.rotated or self.swa.rotated

    @property
    def n(self) -> int:
        return self.base.n

    @n.setter
    def n(self, value: int) -> None:
        self.base.n = self.swa.n = value

    def of(self, il: int):
        """(the KVCache, slot, reused) of layer il."""
        kind, slot, reused = self._where[il]
        return (self.swa if kind else self.base), slot, reused

    def attend(self, il: int, q, k, v, pos, kq_scale: float, profile, n_swa: int = 0, sinks=None):
        cache, slot, _ = self.of(il)
        return cache.attend(slot, q, k, v, pos, kq_scale, profile, n_swa, sinks)

    def truncate(self, n: int) -> None:
        self.base.truncate(n)
        self.swa.truncate(n)


class HybridCache(KVCache):
    """The memory of a hybrid model (llama.cpp `llama_memory_hybrid`): the
    KV cache of the attention layers (slot i for the i-th of them; its
    options as KVCache's) and, for each recurrent layer (slot i for the
    i-th), the Gated DeltaNet's float32 state: `conv` (n_recr, channels,
    d_conv - 1), the last d_conv - 1 inputs of the short convolution per
    channel, and `ssm` (n_recr, n_v_heads, S, S), the delta-rule state (row
    j = column j of S, ggml's layout); both start at zero and are F32 as in
    llama.cpp (`llama_memory_recurrent` with GGML_TYPE_F32).

    The recurrent state cannot be rewound: `truncate(n)` only accepts n ==
    self.n (a no-op) or 0 (everything cleared)."""

    @staticmethod
    def bytes_needed(n_attn: int, n_head_kv: int, head_dim: int, n_ctx: int, n_recr: int = 0,
                     conv_state: int = 0, ssm_state: int = 0, type_k="f16", type_v="f16") -> int:
        return KVCache.bytes_needed(n_attn, n_head_kv, head_dim, n_ctx, type_k, type_v) + \
            4 * int(n_recr) * (int(conv_state) + int(ssm_state))

    def __init__(self, n_attn: int, n_head_kv: int, head_dim: int, n_ctx: int, n_recr: int,
                 channels: int, d_conv: int, n_v_heads: int, state: int, **options):
        super().__init__(n_attn, n_head_kv, head_dim, n_ctx, **options)
        self.conv = np.zeros((n_recr, channels, d_conv - 1), np.float32)
        self.ssm = np.zeros((n_recr, n_v_heads, state, state), np.float32)

    def truncate(self, n: int) -> None:
        if n == self.n:
            return
        if n != 0:
            raise ValueError(f"the recurrent state of a hybrid model cannot be rewound to {n} "
                             f"positions (only cleared, or kept at {self.n})")
        self.n = 0
        self.conv[:] = 0
        self.ssm[:] = 0
