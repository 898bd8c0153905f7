"""Mat-vec table and expert-mode selection, as a pure function.

`select_mmvq(cc, env)` -> `MmvqSelection` (no GPU, no global state). Rules
(../shared/spec/kernels.md §12):

* IL table: cc 61 -> "sm_61" (`STRATA_SM61_TABLE=0` turns it off); cc >= 80
  -> "shared"; cc 70 -> "sm_70" only with `STRATA_SM70_TABLE=1`; any other
  cc -> none (plain kernels). `STRATA_MMVQ_IL=0` disables IL everywhere.
* `STRATA_MMVQ_IL_ROWS="type:ncols:r0,r1,r2,r3,r4;..."` replaces one table
  row per entry, on any card (type by name or id; ncols 2..4, or 1 for the
  1-column row, which by default only cc 61 has; rows in {0, 1, 2, 4}). A bad
  entry is ignored with a message; the other entries still apply.
* Expert mode: 8 on cc 61 (0 with `STRATA_SM61_TABLE=0`), 8 on cc 70 with
  `STRATA_SM70_TABLE=1`, 0 otherwise; an explicit `STRATA_EXP_MODE` wins.
  strata-ref builds modes 0 and 8 only, so those are its valid values.
* Any value outside a variable's listed set gives one message and the
  default. `warn_once` turns the messages into RuntimeWarnings, once each.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Mapping

from ...types import GGMLType, parse_type
from .tables import IL_TYPES, LEGAL_ROWS, SM61_1COL, TABLES, lookup, row_class

__all__ = ["MmvqSelection", "select_mmvq", "parse_il_rows", "warn_once", "EXP_MODES"]

EXP_MODES = (0, 8)
_BOOL = ("0", "1")


@dataclass(frozen=True)
class MmvqSelection:
    """`table_name` ("shared", "sm_70", "sm_61" or None), `table` (type ->
    rows per warp [ncols-2][class], overrides applied), `one_col` (type ->
    5 rows per class, cc 61 only, else empty), `exp_mode` (0 or 8),
    `messages` (tuple of str: invalid values met)."""
    cc: int
    table_name: str | None
    table: dict
    one_col: dict
    exp_mode: int
    messages: tuple = field(default=())

    def rows_per_warp(self, t, ncols: int, n_out: int) -> int:
        """Rows per warp for this call; 0 = plain kernel."""
        if ncols == 1:
            try:
                row = self.one_col.get(GGMLType(t))
            except ValueError:
                return 0
            return row[row_class(n_out)] if row else 0
        return lookup(self.table, t, ncols, n_out)


def _flag(env, name, default, msgs):
    v = env.get(name)
    if v is None or not v.strip():     # empty: unset
        return default
    if v not in _BOOL:
        msgs.append(f"{name}={v!r} is not 0 or 1; using the default ({int(default)})")
        return default
    return v == "1"


def parse_il_rows(text: str) -> tuple[dict, list[str]]:
    """Parse STRATA_MMVQ_IL_ROWS: ({(type, ncols): (r0..r4)}, messages)."""
    out, msgs = {}, []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        try:
            tname, nc, rows = entry.split(":")
            t = parse_type(tname.strip() if not tname.strip().isdigit() else int(tname))
            ncols = int(nc)
            r = tuple(int(x) for x in rows.split(","))
            if t not in IL_TYPES:
                raise ValueError(f"type {t.name} has no IL kernel")
            if not 1 <= ncols <= 4:
                raise ValueError(f"ncols {ncols} not in 1..4")
            if len(r) != 5 or any(x not in LEGAL_ROWS for x in r):
                raise ValueError(f"rows {rows!r} must be 5 values from {LEGAL_ROWS}")
        except ValueError as e:
            msgs.append(f"STRATA_MMVQ_IL_ROWS entry {entry!r} ignored: {e}")
            continue
        out[(t, ncols)] = r
    return out, msgs


def select_mmvq(cc: int, env: Mapping[str, str] | None = None) -> MmvqSelection:
    """The selection for compute capability `cc` (major·10 + minor) under
    `env` (default: an empty mapping; pass os.environ for the process)."""
    env = {} if env is None else env
    cc = int(cc)
    msgs: list[str] = []
    sm61 = _flag(env, "STRATA_SM61_TABLE", True, msgs)
    sm70 = _flag(env, "STRATA_SM70_TABLE", False, msgs)
    il = _flag(env, "STRATA_MMVQ_IL", True, msgs)
    if cc == 61:
        name = "sm_61" if sm61 else None
    elif cc == 70:
        name = "sm_70" if sm70 else None
    elif cc >= 80:
        name = "shared"
    else:
        name = None
    overrides, m = parse_il_rows(env.get("STRATA_MMVQ_IL_ROWS", ""))
    msgs += m
    table = {t: tuple(rows) for t, rows in (TABLES[name].items() if name else ())}
    one_col = dict(SM61_1COL) if name == "sm_61" else {}
    if not il:
        name, table, one_col = None, {}, {}
    else:
        for (t, ncols), r in overrides.items():
            if ncols == 1:
                one_col[t] = r
                continue
            rows = list(table.get(t, ((0,) * 5,) * 3))
            rows[ncols - 2] = r
            table[t] = tuple(rows)
    default_mode = 8 if (cc == 61 and sm61) or (cc == 70 and sm70) else 0
    mode = default_mode
    raw = env.get("STRATA_EXP_MODE")
    if raw is not None and raw.strip():
        if raw.strip() in tuple(str(x) for x in EXP_MODES):
            mode = int(raw)
        else:
            msgs.append(f"STRATA_EXP_MODE={raw!r} is not one of {EXP_MODES}; "
                        f"using the default ({default_mode})")
    return MmvqSelection(cc, name, table, one_col, mode, tuple(msgs))


_WARNED: set = set()


def warn_once(sel: MmvqSelection) -> MmvqSelection:
    """Emit each message of `sel` as a RuntimeWarning once per process."""
    for m in sel.messages:
        if m not in _WARNED:
            _WARNED.add(m)
            warnings.warn(m, RuntimeWarning, stacklevel=2)
    return sel
