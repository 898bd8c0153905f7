"""Progress bars of the command line's long jobs (tqdm, on stderr).

A bar is drawn only when stderr is a terminal (tqdm's `disable=None`) and
the caller has not turned it off (`--json`, `--no-progress`), so logs,
pipes and machine-readable output never receive one.
"""
from __future__ import annotations

import sys

__all__ = ["progress_bar"]


def progress_bar(total: int | None, desc: str, unit: str = "it", enabled: bool = True,
                 **kw):
    """A tqdm bar on stderr of `total` units, drawn only on a terminal and
    when `enabled`; other tqdm keywords pass through (`unit_scale`,
    `delay` seconds before it first appears, `leave`). Use it as a context
    manager and call `.update(n)`."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr,
                disable=None if enabled else True, dynamic_ncols=True, **kw)
