"""The GEMM route policy as a pure function (../shared/spec/kernels.md §12).

`select_route(cc, env, route)`: the FP16-operand route by default;
`STRATA_DENSE_F32=1` opts a compute-capability 6.x card into the FP32
route and is ignored, with a one-time note, on any other card;
`STRATA_DENSE_F32=0` is the default; any other value warns once and keeps
the default; an explicit `route=` forces either route on any card (for
testing and parity). No GPU, no global state; `notice_once` turns the note
or warning into a RuntimeWarning, once per process.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Mapping

from ..._env import zero_one
from ...routes.gemm import ROUTES

__all__ = ["ENV_DENSE_F32", "RouteSelection", "select_route", "parse_dense_f32_env", "notice_once"]

ENV_DENSE_F32 = "STRATA_DENSE_F32"


@dataclass(frozen=True)
class RouteSelection:
    """The route decision: `route` ("f16" or "f32"), `reason` in words, and
    `notice`: the text of a one-time note (STRATA_DENSE_F32=1 ignored on
    this card) or warning (an invalid value), else None."""
    route: str
    reason: str
    notice: str | None = None


def parse_dense_f32_env(value: str | None) -> tuple[bool | None, str | None]:
    """(opt-in, warning) for a STRATA_DENSE_F32 value: unset or empty ->
    (None, None); "0" -> (False, None); "1" -> (True, None); anything else
    -> (None, warning text)."""
    return zero_one(ENV_DENSE_F32, value, "the FP16-operand route")


def select_route(cc: int, env: Mapping[str, str] | None = None,
                 route: str | None = None) -> RouteSelection:
    """The GEMM route for dense projections on a card of compute capability
    `cc` (major·10 + minor), with the environment `env` (None: empty) and an
    optional explicit `route` ("f16"/"f32", forced on any card; None or
    "auto": the policy). Pure: no GPU, no global state.

    Raises TypeError for a non-integer cc and ValueError for an unknown route.
    """
    if isinstance(cc, bool) or not hasattr(cc, "__index__"):
        raise TypeError(f"cc must be an integer, got {cc!r}")
    cc = int(cc)
    if route not in (None, "auto"):
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES} or 'auto', got {route!r}")
        return RouteSelection(route, f"route={route!r} forced")
    opt_in, warning = parse_dense_f32_env(None if env is None else env.get(ENV_DENSE_F32))
    if warning:
        return RouteSelection("f16", "default (invalid STRATA_DENSE_F32)", warning)
    if not opt_in:
        why = f"{ENV_DENSE_F32}=0" if opt_in is False else "default"
        return RouteSelection("f16", why)
    if 60 <= cc < 70:
        return RouteSelection("f32", f"{ENV_DENSE_F32}=1 on compute capability {cc}")
    return RouteSelection("f16", f"{ENV_DENSE_F32}=1 ignored on compute capability {cc}",
                          f"note: {ENV_DENSE_F32}=1 applies to compute capability 6.x only; "
                          f"this card is {cc // 10}.{cc % 10}, so the FP16-operand route is used")


_NOTICED: set[str] = set()


def notice_once(sel: RouteSelection) -> RouteSelection:
    """Emit `sel.notice` as a RuntimeWarning the first time this process
    meets it; return `sel` unchanged."""
    if sel.notice and sel.notice not in _NOTICED:
        _NOTICED.add(sel.notice)
        warnings.warn(sel.notice, RuntimeWarning, stacklevel=3)
    return sel
