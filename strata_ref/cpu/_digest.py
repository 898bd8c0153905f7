"""The digest of the sources the CPU kernels inline (this package, numerics,
types), for the on-disk cache of the kernels made by factories
(`strata_ref._jitcache`)."""
from __future__ import annotations

from pathlib import Path

from .._jitcache import sources_digest

__all__ = ["cpu_digest"]


def cpu_digest() -> str:
    here = Path(__file__).resolve().parent
    return sources_digest(here, here.parent / "numerics.py", here.parent / "types.py")
