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

Importing this module also makes numba's on-disk cache safe for several
processes at once (`lock_numba_cache`): numba saves a cache entry as a
read-modify-write of the function's index file with no lock (numba issue
10128), so two processes compiling two signatures of one function at the
same time could both take data file 1, and the index could name the other
signature's machine code: here a later process got float64 f(1.5) = 2
from the int64 entry, reported as a cache hit (tests/test_cli_hostile.py).
It also loads a cached function's callees before the function itself
(`callees_before_cached_code`): a cached caller of a parallel function
could otherwise jump to a kernel nothing had defined.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from pathlib import Path

from numba.core import caching
from numba.core.caching import FunctionCache

__all__ = ["cached", "sources_digest", "lock_numba_cache", "callees_before_cached_code"]


@contextlib.contextmanager
def _dir_lock(path: str, exclusive: bool):
    """flock on the cache directory itself (no lock file is left behind):
    exclusive for a save, shared for a load. Where the directory is missing
    or the file system has no locks, nothing is locked."""
    try:
        import fcntl
        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)            # and with it the lock


def _locked(method, exclusive: bool):
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with _dir_lock(self._cache_path, exclusive):
            return method(self, *args, **kwargs)
    run._strata_ref_locked = True
    return run


def lock_numba_cache() -> None:
    """Run every save of numba's on-disk cache (`IndexDataCacheFile.save`:
    read the index, pick a data file, write both) under an exclusive lock
    of the cache directory and every load under a shared one, so that no
    process sees another's save half done. Applies to every cached numba
    function of this process; idempotent; the files are numba's own, so a
    process without the lock still reads them."""
    cls = caching.IndexDataCacheFile
    if not getattr(cls.save, "_strata_ref_locked", False):
        cls.save = _locked(cls.save, True)
        cls.load = _locked(cls.load, False)


def _callees(py_func) -> list:
    """The numba dispatchers a function's code can call: its closure's
    cells and the globals it names."""
    from numba.core.dispatcher import Dispatcher
    found = []
    for cell in py_func.__closure__ or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:          # an empty cell
            pass
    g = getattr(py_func, "__globals__", {})
    found += [g[n] for n in py_func.__code__.co_names if n in g]
    return [d for d in found if isinstance(d, Dispatcher)]


_PRELOADED: set = set()


def _preload(dispatcher) -> None:
    """Load every current entry of `dispatcher`'s on-disk cache (the
    signatures its index holds for this code, sources and CPU), and with
    them, by the hook below, those of its own callees."""
    if id(dispatcher) in _PRELOADED:
        return
    _PRELOADED.add(id(dispatcher))
    cache = dispatcher._cache
    if not isinstance(cache, caching.Cache):
        for d in _callees(dispatcher.py_func):      # an uncached helper: its callees
            _preload(d)
        return
    codegen = dispatcher.targetctx.codegen()
    try:
        keys = list(cache._cache_file._load_index())
    except Exception:       # no index yet, or one numba cannot read: nothing to load
        return
    for key in keys:
        try:
            if cache._index_key(key[0], codegen) == key and key[0] not in dispatcher.overloads:
                dispatcher.compile(key[0])
        except Exception:   # an entry numba refuses is compiled when it is needed
            pass


def _with_callees(load):
    @functools.wraps(load)
    def run(self, sig, target_context):
        for d in _callees(self._py_func):
            _preload(d)
        return load(self, sig, target_context)
    run._strata_ref_callees = True
    return run


def callees_before_cached_code() -> None:
    """Before a function is loaded from numba's on-disk cache
    (`Cache.load_overload`), load the cached entries of the dispatchers it
    calls. A cached function compiled in a process that had loaded a
    parallel callee (or a caller of one) from the cache holds only a
    reference to the callee's parfor kernel (the gufunc numba lowers
    beside it), not its code; loaded in a fresh process where nothing
    defines that symbol, it jumped to address 0: a segmentation fault
    (numba issues 4807, 8578; tests/test_jitcache.py: a mat-mul runner
    calling the parallel row kernels, a compiled layer calling the
    runners). Loading the callees first defines it. Idempotent."""
    cls = caching.Cache
    if not getattr(cls.load_overload, "_strata_ref_callees", False):
        cls.load_overload = _with_callees(cls.load_overload)


lock_numba_cache()
callees_before_cached_code()

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
