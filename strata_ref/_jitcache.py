"""numba's on-disk cache for compiled closures.

Kernels made by a factory (one per format, weight type or mode, with the
varying parts as closure constants so that numba inlines them) are closures,
which numba's own cache cannot key across processes: a captured dispatcher
pickles with a random uuid, so every process compiles the closure again and
adds another entry to the cache. `cached` gives such a dispatcher a cache of
its own: the index file is named after `name` (which must say what the
closure's constants are), and the key holds, besides the signature and the
CPU, a digest of every source file the closure inlines (`sources_digest`),
so that editing any of them invalidates the entry.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from numba.core.caching import FunctionCache

__all__ = ["cached", "sources_digest"]

_DIGESTS: dict[tuple, str] = {}


def sources_digest(*dirs_or_files) -> str:
    """sha256 over the names and bytes of the given .py files and of every
    .py file in the given directories (sorted), computed once per argument
    tuple in a process."""
    key = tuple(str(p) for p in dirs_or_files)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        files = []
        for p in map(Path, dirs_or_files):
            files += sorted(p.glob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(f.name.encode())
            h.update(f.read_bytes())
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


class _ClosureCache(FunctionCache):
    def __init__(self, py_func, name: str, digest):
        py_func.__qualname__ = name
        super().__init__(py_func)
        self._digest = digest

    def _index_key(self, sig, codegen):
        code = hashlib.sha256(self._py_func.__code__.co_code).hexdigest()
        return (sig, codegen.magic_tuple(), (code, self._digest()))


def cached(dispatcher, name: str, digest):
    """Give the numba `dispatcher` (not yet compiled) an on-disk cache
    indexed as `name`, keyed on `digest()` (a callable returning the
    sources digest, called at the first compilation). Where numba finds no
    writable cache location the dispatcher stays uncached (compiled once per
    process). Returns the dispatcher."""
    try:
        dispatcher._cache = _ClosureCache(dispatcher.py_func, name, digest)
    except RuntimeError:
        pass
    return dispatcher
