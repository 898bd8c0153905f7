"""Kernel selection for native dequantization, as a pure function.

`select(cc, type, rows, cols, ld, blocks_ptr, out_ptr, out_dtype, env)`
returns the decision as data (`Selection`), with no GPU and no global state,
so every rule is unit-tested on the CPU. Rules (../shared/spec/kernels.md
§4 and §12):

1. A type without a generic kernel, or a call the kernels cannot serve
   (rows or cols 0, cols not a multiple of the block size QK, ld < cols, a
   null pointer), selects no kernel: the NumPy path serves it.
2. Q8_0 takes the wide kernel whenever its guard holds: ld == cols, blocks
   2-byte aligned, output 16-byte aligned. STRATA_DEQUANT_WIDE does not
   change this.
3. Q4_K, Q5_K, Q6_K and IQ4_XS take their wide kernels by default on
   compute capability 6.1 only; `STRATA_DEQUANT_WIDE=0` / `=1` forces them
   off / on on any card. The guard still applies: ld % 8 == 0, output
   16-byte aligned, blocks aligned to WIDE_BLOCKS_ALIGN (8 bytes for the
   8-byte qs loads of Q4_K/Q5_K/IQ4_XS; 2 for Q6_K, whose 210-byte blocks
   are read as u16).
4. Any other STRATA_DEQUANT_WIDE value (including "") is invalid: the
   selection carries a warning and uses the default. `warn_once` prints it
   once per process and value.
5. Everything else takes the generic kernel.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Mapping

from ..._env import zero_one
from ...types import GGMLType, UnsupportedTypeError, block_format, parse_type

__all__ = ["Selection", "select", "parse_wide_env", "warn_once", "GENERIC_TYPES",
           "WIDE_BLOCKS_ALIGN", "WIDE_OUT_ALIGN", "WIDE_DEFAULT_CC", "ENV_WIDE",
           "OUT_DTYPES"]

T = GGMLType
ENV_WIDE = "STRATA_DEQUANT_WIDE"



def _generic_types() -> frozenset:
    """GENERIC_TYPES, the types with a generic kernel: every type the oracle
    converts to float (`formats.oracle_types`). The STRATA_GENERIC_TYPES
    list of the generated native/strata_blocks.h is made from the same set,
    so a type the oracle gains without its `Fmt<>` in
    native/strata_formats.cuh fails to compile. Computed on first use (it
    loads the oracle's format modules), then a module attribute."""
    g = globals()
    if "GENERIC_TYPES" not in g:
        from ...formats import oracle_types
        g["GENERIC_TYPES"] = frozenset(oracle_types())
    return g["GENERIC_TYPES"]


def __getattr__(name):
    if name == "GENERIC_TYPES":
        return _generic_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: Wide kernels and the alignment (bytes) each needs of the blocks pointer
#: (native/dequant_wide.cu `wide_blocks_align`).
WIDE_BLOCKS_ALIGN = {T.Q8_0: 2, T.Q4_K: 8, T.Q5_K: 8, T.Q6_K: 2, T.IQ4_XS: 8}
WIDE_OUT_ALIGN = 16
#: Compute capabilities on which the Q4_K/Q5_K/Q6_K/IQ4_XS wide kernels are
#: the default (Strata's P40 work; on other cards they are opt-in).
WIDE_DEFAULT_CC = frozenset({61})
OUT_DTYPES = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class Selection:
    """The decision: `kernel` is "wide", "generic" or None (no native kernel
    can serve the call: use the NumPy path); `reason` says why in words;
    `warning` is the text of an invalid-environment warning, or None."""
    kernel: str | None
    reason: str
    warning: str | None = None


def parse_wide_env(value: str | None) -> tuple[bool | None, str | None]:
    """(override, warning) for a STRATA_DEQUANT_WIDE value: None (unset) or
    empty -> (None, None); "0" -> (False, None); "1" -> (True, None);
    anything else -> (None, warning text)."""
    return zero_one(ENV_WIDE, value, "wide Q4_K/Q5_K/Q6_K/IQ4_XS kernels on compute capability 6.1 only")


_WARNED: set[str] = set()


def warn_once(sel: Selection) -> Selection:
    """Emit `sel.warning` as a RuntimeWarning the first time this process
    meets it; return `sel` unchanged."""
    if sel.warning and sel.warning not in _WARNED:
        _WARNED.add(sel.warning)
        warnings.warn(sel.warning, RuntimeWarning, stacklevel=3)
    return sel


def _int(name: str, v) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{name} must be an integer, got {v!r}")
    return int(v)


def select(cc: int, t, rows: int, cols: int, ld: int, blocks_ptr: int, out_ptr: int,
           out_dtype: str = "f16", env: Mapping[str, str] | None = None) -> Selection:
    """The kernel for one dequant call.

    cc: compute capability as major·10 + minor (61 for a P40). t: ggml type
    (GGMLType, id or name). rows, cols, ld: output shape and row stride in
    elements. blocks_ptr, out_ptr: device addresses (only their alignment and
    nullness matter). out_dtype: "f32", "f16" or "bf16". env: the environment
    mapping to read STRATA_DEQUANT_WIDE from (None: empty).

    Returns a Selection. Raises TypeError for non-integer arguments and
    ValueError for an unknown out_dtype; an unknown or removed type is not an
    error here (no kernel: Selection(None, ...)).
    """
    cc, rows, cols, ld = _int("cc", cc), _int("rows", rows), _int("cols", cols), _int("ld", ld)
    blocks_ptr, out_ptr = _int("blocks_ptr", blocks_ptr), _int("out_ptr", out_ptr)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype!r}")
    override, warning = parse_wide_env(None if env is None else env.get(ENV_WIDE))
    try:
        tt = parse_type(t)
        qk = block_format(tt).block_values
    except UnsupportedTypeError as e:
        return Selection(None, f"no kernel: {e}", warning)
    if tt not in _generic_types():
        return Selection(None, f"no kernel for {tt.name}", warning)
    if rows <= 0 or cols <= 0:
        return Selection(None, f"empty call (rows={rows}, cols={cols})", warning)
    if cols % qk:
        return Selection(None, f"cols={cols} is not a multiple of {tt.name}'s QK={qk}", warning)
    if ld < cols:
        return Selection(None, f"ld={ld} < cols={cols}", warning)
    if blocks_ptr == 0 or out_ptr == 0:
        return Selection(None, "null pointer", warning)
    if tt not in WIDE_BLOCKS_ALIGN:
        return Selection("generic", f"{tt.name} has no wide kernel", warning)
    if tt != T.Q8_0:
        enabled = (cc in WIDE_DEFAULT_CC) if override is None else override
        if not enabled:
            why = (f"{ENV_WIDE}=0" if override is False
                   else f"wide {tt.name} is off by default on compute capability {cc}")
            return Selection("generic", why, warning)
    guard = _wide_guard_failure(tt, cols, ld, blocks_ptr, out_ptr)
    if guard:
        return Selection("generic", f"wide {tt.name} guard: {guard}", warning)
    why = ("Q8_0 guard holds" if tt == T.Q8_0
           else f"{ENV_WIDE}=1" if override else f"default on compute capability {cc}")
    return Selection("wide", why, warning)


def _wide_guard_failure(tt: GGMLType, cols: int, ld: int, blocks_ptr: int, out_ptr: int) -> str | None:
    if tt == T.Q8_0 and ld != cols:
        return f"ld={ld} != cols={cols}"
    if ld % 8:
        return f"ld={ld} is not a multiple of 8"
    if out_ptr % WIDE_OUT_ALIGN:
        return f"output pointer is not {WIDE_OUT_ALIGN}-byte aligned"
    a = WIDE_BLOCKS_ALIGN[tt]
    if blocks_ptr % a:
        return f"blocks pointer is not {a}-byte aligned"
    return None
