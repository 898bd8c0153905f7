"""One task runner for per-tensor / per-layer work, with two back ends.

`run(fn, items, jobs=..., scheduler=...)` calls `fn(item)` once per item and
yields `(index, result)` as each call finishes, whichever back end runs it:

- **here**: in this process, in item order (`jobs == 1`, or a single item);
- **processes**: a `concurrent.futures.ProcessPoolExecutor` of `jobs`
  spawned workers on this machine;
- **dask.distributed** (the optional extra `strata-ref[dask]`):
  `scheduler="local"` starts a `LocalCluster` of `jobs` worker processes for
  the run, any other value is the address of a running scheduler
  (`tcp://host:8786`), whose workers must have strata-ref installed and see
  every file an item names under the same path.

The pool and dask call the same wrapper (`_call`) around the same `fn`, so
the two back ends cannot drift apart. `fn` must be a module-level function
(pickled by reference) and items and results must pickle. Items are handed
out largest `weight` first, which shortens the run when a few items are
much bigger than the rest (a token embedding among layer matrices).

Progress: `fn` calls `report(n)` as it goes; the caller's
`progress(n)` receives it (from pool workers through a queue), and when an
item finishes the runner adds what its weight still lacks, so the total
always ends at the sum of the weights. Dask workers do not report: there
the progress moves one finished item at a time.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Sequence

__all__ = ["cpu_count", "run", "report", "SCHEDULER_LOCAL"]

#: `scheduler` value that starts a dask `LocalCluster` for one run.
SCHEDULER_LOCAL = "local"

# Where `report` sends progress in this process: the caller's callback when
# items run here, a queue in a pool worker, nothing in a dask worker.
_sink: Callable[[int], None] | None = None
_queue = None
_threads_set = False


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:              # not on Linux
        return max(1, os.cpu_count() or 1)


def report(n: int) -> None:
    """Add `n` units of progress for the item running now (no-op when
    nobody listens)."""
    if _sink is not None:
        _sink(n)


def _call(fn: Callable, index: int, item: Any, threads: int | None) -> Any:
    """The one task wrapper, for pool and dask workers alike."""
    global _sink, _threads_set
    if threads and not _threads_set:
        # N worker processes on N cores: numba's own parallel loops
        # (dequant, conversions) get a share each instead of N threads each.
        import numba
        from ._threads import configure
        configure()             # the layer is fixed by the first use of numba's threads
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
        _threads_set = True
    q = _queue
    _sink = (lambda n: q.put((index, n))) if q is not None else None
    try:
        return fn(item)
    finally:
        _sink = None


def _init_pool_worker(queue, parent: int) -> None:
    global _queue
    import signal
    # Ctrl-C reaches every process of the terminal's group: the parent
    # decides what stops (it terminates the workers), not each worker alone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    _queue = queue


def _die_with_parent(parent: int) -> None:
    """Linux: have the kernel send this worker SIGTERM when the process that
    started it dies, even by SIGKILL (a pool worker would otherwise finish
    its item, orphaned). Elsewhere a no-op."""
    import sys
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:           # it died before the call above
        os._exit(1)


def run(fn: Callable[[Any], Any], items: Sequence[Any], *, jobs: int | None = None,
        scheduler: str | None = None, weights: Sequence[int] | None = None,
        progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, Any]]:
    """Run `fn(item)` for every item; yield `(index, result)` as each finishes.

    jobs: worker processes (default `cpu_count()`); 1 runs everything in this
    process, in order. On this machine (scheduler None or "local") at most
    `cpu_count()` workers start, whatever `jobs` asks: each one imports numba
    and holds its own chunk buffers, so more processes than cores only add
    start-up time and memory (`--jobs 1000` on 2 cores started 272 and took
    minutes). scheduler: None (this machine), "local" (a dask LocalCluster of
    that many workers) or a dask scheduler address. weights:
    one non-negative number per item (default 1 each), the order of hand-out
    and the progress units. progress: called with units as work is done.
    An exception raised by `fn` comes out of the iteration, after the
    pending items are cancelled and the workers stopped (so does ImportError
    for a scheduler without dask.distributed installed); ValueError for
    jobs < 1 or a weights list of the wrong length is raised at once.
    """
    n = len(items)
    jobs = cpu_count() if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    weights = [1] * n if weights is None else list(weights)
    if len(weights) != n:
        raise ValueError(f"{len(weights)} weights for {n} items")
    order = sorted(range(n), key=lambda i: -weights[i])
    if scheduler is None or scheduler == SCHEDULER_LOCAL:
        jobs = min(jobs, cpu_count())
    if scheduler is not None:
        return _run_dask(fn, items, jobs, scheduler, weights, order, progress)
    if jobs == 1 or n <= 1:
        return _run_here(fn, items, weights, progress)
    return _run_pool(fn, items, min(jobs, n), weights, order, progress)


def _run_here(fn, items, weights, progress) -> Iterator[tuple[int, Any]]:
    global _sink
    for i, item in enumerate(items):
        done = 0

        def sink(k):
            nonlocal done
            done += k
            if progress is not None:
                progress(k)

        _sink = sink
        try:
            result = fn(item)
        finally:
            _sink = None
        if progress is not None and weights[i] > done:
            progress(weights[i] - done)
        yield i, result


class _Progress:
    """Per-item progress of a parallel run: reports for finished items are
    dropped (they can arrive after the result), the rest is topped up."""

    def __init__(self, weights, progress):
        self.weights, self.progress = weights, progress
        self.done: dict[int, int] = {}
        self.finished: set[int] = set()

    def add(self, i: int, k: int) -> None:
        if i in self.finished or self.progress is None:
            return
        k = min(k, self.weights[i] - self.done.get(i, 0))
        if k > 0:
            self.done[i] = self.done.get(i, 0) + k
            self.progress(k)

    def finish(self, i: int) -> None:
        self.add(i, self.weights[i])
        self.finished.add(i)


def _run_pool(fn, items, jobs, weights, order, progress) -> Iterator[tuple[int, Any]]:
    import concurrent.futures as cf
    import multiprocessing
    import queue as queue_mod

    # spawn: a fresh interpreter per worker, safe beside the threads this
    # process may already run (tqdm's monitor, thread pools).
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue() if progress is not None else None
    track = _Progress(weights, progress)
    threads = max(1, cpu_count() // jobs)
    ex = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx,
                                initializer=_init_pool_worker, initargs=(q, os.getpid()))
    clean = False

    def drain():
        while q is not None:
            try:
                i, k = q.get_nowait()
            except queue_mod.Empty:
                return
            track.add(i, k)

    futures: dict = {}
    stopped: list = []
    try:
        for i in order:
            futures[ex.submit(_call, fn, i, items[i], threads)] = i
        pending = set(futures)
        while pending:
            done, pending = cf.wait(pending, timeout=0.2, return_when=cf.FIRST_COMPLETED)
            drain()
            for fut in sorted(done, key=lambda f: futures[f]):
                i = futures[fut]
                result = fut.result()
                track.finish(i)
                yield i, result
        clean = True
    finally:
        if not clean:
            stopped = _stop_pool(ex, futures)
        ex.shutdown(wait=True, cancel_futures=True)
        for p in stopped:
            p.join()
        if q is not None:
            q.close()
            q.join_thread()


def _stop_pool(ex, futures) -> list:
    """Cancel what has not started and terminate a pool's workers now (an
    error, Ctrl-C, or the caller stopped iterating): running items are not
    waited for. Returns the worker processes, to be joined after the pool's
    shutdown (joining them while the pool's own thread does races it)."""
    for fut in futures:
        fut.cancel()
    stop = getattr(ex, "terminate_workers", None)      # Python >= 3.14
    if stop is not None:
        stop()
        return []
    procs = list((getattr(ex, "_processes", None) or {}).values())
    for p in procs:
        p.terminate()
    return procs


def _run_dask(fn, items, jobs, scheduler, weights, order, progress) -> Iterator[tuple[int, Any]]:
    import logging
    import uuid
    try:
        import distributed
    except ImportError:
        raise ImportError("a dask scheduler needs dask.distributed: "
                          "pip install 'strata-ref[dask]'") from None
    track = _Progress(weights, progress)
    cluster = None
    if scheduler == SCHEDULER_LOCAL:
        cluster = distributed.LocalCluster(
            n_workers=jobs, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=None, silence_logs=logging.ERROR)
        threads = max(1, cpu_count() // jobs)
    else:
        threads = None      # a remote worker's cores are its own business
    try:
        client = distributed.Client(cluster if cluster is not None else scheduler)
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise
    try:
        run_id = uuid.uuid4().hex[:12]
        futures = {}
        for rank, i in enumerate(order):
            fut = client.submit(_call, fn, i, items[i], threads, key=f"strata-ref-{run_id}-{i}",
                                priority=len(order) - rank, pure=False)
            futures[fut.key] = (i, fut)
        done_keys = set()
        try:
            for fut, result in distributed.as_completed([f for _, f in futures.values()],
                                                        with_results=True):
                i = futures[fut.key][0]
                done_keys.add(fut.key)
                track.finish(i)
                yield i, result
        finally:
            left = [f for k, (_, f) in futures.items() if k not in done_keys]
            if left:
                client.cancel(left)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

