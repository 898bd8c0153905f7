"""Golden hashes through the native kernels (`strata-ref hash MODEL --device cuda`).

`hash_tensors_device(tensors, out_dtypes, kernel=...)` dequantizes every
tensor of a GGUF file with the CUDA kernels of `strata_ref.native`, copies
the outputs back and hashes them as `strata-ref hash` hashes the NumPy
oracle's: FNV-1a 64 (`strata_ref.hashing.fnv1a64`) over the output
bytes, rows x cols in row-major order, one state per tensor, and per output
dtype the chained hash `hashing.chain_hashes` of the tensor hashes in the
order given. The bytes are hashed
as they come back from the device: the kernels store canonical NaNs by
contract (../shared/spec/kernels.md §5), and the oracle's bytes are hashed
the same way, so a kernel that broke the contract gives a different hash
instead of being repaired before hashing.

Kernel per tensor (`kernel`):

* "auto": `dequant.policy.select` with the device's compute capability and
  os.environ (on an H200: Q8_0 wide, the K-quants and IQ4_XS generic unless
  STRATA_DEQUANT_WIDE=1);
* "wide": the wide kernel for every type that has one (Q8_0, Q4_K, Q5_K,
  Q6_K, IQ4_XS), the generic kernel for the others (the reason says so);
* "generic": the generic kernel for every type.

A tensor no kernel serves (plain I8..I64 and F64, which are not converted)
is hashed by the NumPy oracle (`hashing.hash_tensor`) and marked so
(`TensorRun.kernel == "oracle"`), never silently.

Streaming: a tensor is processed in chunks of at most `chunk_values`
values (whole rows): its blocks are copied to the device, each output dtype
is dequantized into a reused device buffer and copied back. One thread per
output dtype hashes the chunks as they arrive, fed through queues of depth
one, so device memory is one chunk of blocks plus one chunk per dtype (and
the L2-flush scratch below), and host memory a few chunks per dtype, however
large the model.

Timing: each chunk's launch for each dtype is timed with CUDA events,
`reps` times (median), by one C call (`strata_dequant_timed`) that enqueues
every event pair around its launch with no host work in between, each
launch after a kernel that reads twice the L2 size (L2 evicted and left
clean), so the figures are kernel times of reads from device memory, like
the copy they are set against, whatever the Python side and the hashing
threads are doing. Where the type has both kernels the other one is timed
on the same chunk first (its output is then overwritten by the selected
kernel's launches before the copy back), which gives the wide/generic ratio
in one run. The device-to-device copy bandwidth (up to 1 GiB, read +
written) is measured at the start of the same run.

`compare=True` also runs the oracle on every chunk and compares the bits,
recording per tensor and dtype the number of differing values and the first
one (`Diff`).
"""
from __future__ import annotations

import os
import queue
import statistics
import threading
from dataclasses import dataclass, field

import numpy as np

from ..types import GGMLType
from . import loader
from .dequant import policy

__all__ = ["KERNELS", "CHUNK_VALUES", "Diff", "TensorRun", "DeviceHashRun",
           "MAX_REPS", "hash_tensors_device", "copy_bandwidth", "summary_lines", "compare_lines",
           "tensor_rows", "device_json"]

KERNELS = ("auto", "generic", "wide")
#: Values per chunk (whole rows): 128 MiB of f32 output.
CHUNK_VALUES = 1 << 25
#: Timed launches per chunk at most (STRATA_TIMED_MAX_REPS, native/strata_dequant.h).
MAX_REPS = 64
_OUT_CODE = {"f32": 0, "f16": 1, "bf16": 2}
_KERNEL_CODE = {"generic": 0, "wide": 1}
_OUT_SIZE = {"f32": 4, "f16": 2, "bf16": 2}
_UINT = {"f32": np.uint32, "f16": np.uint16, "bf16": np.uint16}
_BUF_DTYPE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


@dataclass(frozen=True)
class Diff:
    """The first differing value of one tensor's output in one dtype:
    `count` values differ; the first is element `index` (row-major), at
    `row`, `col`, with bits `device` (kernel) and `oracle`."""
    count: int
    index: int
    row: int
    col: int
    device: int
    oracle: int


@dataclass
class TensorRun:
    """One tensor. kernel: "wide", "generic" or "oracle" (no native kernel:
    hashed by the NumPy oracle), with `reason` in words. hashes: {dtype:
    FNV-1a 64}. time_s: {dtype: seconds}, the selected kernel's time summed
    over the tensor's chunks (each the median of the run's reps); empty for
    "oracle". peer: the other kernel, timed on the same chunks (None when the
    type has only one); peer_time_s likewise. in_bytes: the tensor's block
    bytes; n_values: its element count. diffs (compare runs only): {dtype:
    Diff, or None when every bit is equal}."""
    name: str
    type: GGMLType
    shape: tuple
    kernel: str
    reason: str
    in_bytes: int
    n_values: int
    hashes: dict = field(default_factory=dict)
    time_s: dict = field(default_factory=dict)
    peer: str | None = None
    peer_time_s: dict = field(default_factory=dict)
    diffs: dict | None = None


@dataclass
class DeviceHashRun:
    """What `hash_tensors_device` did: the device (`device_name`, compute
    capability `cc` as major·10 + minor), the `kernel` option, `out_dtypes`,
    `reps`, the copy bandwidth measured in the run (`copy_bytes_per_s`,
    counting bytes read and written, over a copy of `copy_bytes`), the
    per-tensor results in file order and the chained hash per dtype."""
    device_name: str
    cc: int
    kernel: str
    out_dtypes: tuple
    reps: int
    copy_bytes_per_s: float
    copy_bytes: int
    tensors: list
    chained: dict
    compared: bool = False

    @property
    def all_equal(self) -> bool:
        """Compare runs: True when every natively served output equals the
        oracle's bit for bit."""
        return all(df is None for t in self.tensors if t.diffs for df in t.diffs.values())

    def timing(self, d: str) -> dict:
        """Timing summary of dtype `d`: total kernel seconds and bytes moved
        (blocks read + outputs written) of the natively served tensors,
        GB/s, the ratio to the copy bandwidth, per-kernel tensor counts and
        seconds, and where both kernels were timed, the generic/wide time
        ratio over those tensors."""
        served = [t for t in self.tensors if t.kernel != "oracle"]
        secs = sum(t.time_s[d] for t in served)
        moved = sum(t.in_bytes + t.n_values * _OUT_SIZE[d] for t in served)
        by = {}
        for k in ("wide", "generic"):
            ts = [t for t in served if t.kernel == k]
            by[k] = {"tensors": len(ts), "s": sum(t.time_s[d] for t in ts)}
        both = [t for t in served if t.peer is not None]
        wide_s = sum(t.time_s[d] if t.kernel == "wide" else t.peer_time_s[d] for t in both)
        gen_s = sum(t.time_s[d] if t.kernel == "generic" else t.peer_time_s[d] for t in both)
        out = {"tensors": len(served), "s": secs, "bytes": moved,
               "bytes_per_s": moved / secs if secs > 0 else 0.0,
               "of_copy": (moved / secs / self.copy_bytes_per_s) if secs > 0 else 0.0,
               "by_kernel": by, "both": None}
        if both and wide_s > 0:
            out["both"] = {"tensors": len(both), "wide_s": wide_s, "generic_s": gen_s,
                           "wide_over_generic": gen_s / wide_s}
        return out


# ---------------------------------------------------------------- device helpers

def _check(nat, status: int, what: str) -> None:
    from .dequant.wrapper import _check as check
    check(nat, status, what)


class _Events:
    """A start/stop pair of CUDA events on the legacy default stream."""

    def __init__(self, nat):
        self.nat = nat
        ffi = nat.ffi
        self._p = [ffi.new("void **"), ffi.new("void **")]
        for p in self._p:
            _check(nat, nat.lib.strata_event_create(p), "cudaEventCreate")
        self.start, self.stop = self._p[0][0], self._p[1][0]

    def time(self, fn) -> float:
        """Seconds between events recorded before and after fn()."""
        nat = self.nat
        null = nat.ffi.cast("void *", 0)
        _check(nat, nat.lib.strata_event_record(self.start, null), "cudaEventRecord")
        fn()
        _check(nat, nat.lib.strata_event_record(self.stop, null), "cudaEventRecord")
        ms = nat.ffi.new("float *")
        _check(nat, nat.lib.strata_event_elapsed_ms(ms, self.start, self.stop),
               "cudaEventElapsedTime")
        return float(ms[0]) / 1e3

    def close(self) -> None:
        for e in (self.start, self.stop):
            self.nat.lib.strata_event_destroy(e)


def _mem_free(nat) -> int:
    f, t = nat.ffi.new("long long *"), nat.ffi.new("long long *")
    _check(nat, nat.lib.strata_mem_get_info(f, t), "cudaMemGetInfo")
    return int(f[0])


def _device_name(nat, device: int) -> str:
    buf = nat.ffi.new("char[256]")
    _check(nat, nat.lib.strata_device_name(device, buf, 256), "cudaGetDeviceProperties")
    s = nat.ffi.string(buf)
    return s.decode() if isinstance(s, bytes) else str(s)


def _l2_bytes(nat, device: int) -> int:
    p = nat.ffi.new("int *")
    _check(nat, nat.lib.strata_l2_cache_bytes(device, p), "cudaDeviceGetAttribute(L2)")
    return int(p[0])


def copy_bandwidth(nat, nbytes: int = 1 << 30, reps: int = 5, batch: int = 3) -> tuple[float, int]:
    """(bytes/s, bytes copied) of a device-to-device `cudaMemcpyAsync`,
    counting bytes read plus bytes written: median over `reps` event-timed
    batches of `batch` copies, after two warm-up copies. The copy is
    `nbytes` (default 1 GiB), less when the device has under 8 times that
    free (at least 1 MiB). Raises NativeError when CUDA fails."""
    from .dequant.wrapper import DeviceBuffer
    n = min(int(nbytes), _mem_free(nat) // 8) >> 20 << 20
    n = max(n, 1 << 20)
    src, dst = DeviceBuffer(n, np.uint8), DeviceBuffer(n, np.uint8)
    src.fill_bytes(1)
    ev = _Events(nat)
    null = nat.ffi.cast("void *", 0)
    sp, dp = nat.ffi.cast("void *", src.ptr), nat.ffi.cast("void *", dst.ptr)

    def copies(k):
        for _ in range(k):
            _check(nat, nat.lib.strata_memcpy_dtod_async(dp, sp, n, null), "cudaMemcpyAsync")
    try:
        copies(2)
        times = [ev.time(lambda: copies(batch)) / batch for _ in range(reps)]
    finally:
        ev.close()
    return 2 * n / statistics.median(times), n


# ---------------------------------------------------------------- selection

@dataclass(frozen=True)
class _Choice:
    kernel: str           # "wide", "generic" or "oracle"
    reason: str
    peer: str | None


def _choose(cc: int, t, kernel: str, rows: int, cols: int, blocks_ptr: int, out_ptr: int,
            env) -> _Choice:
    tt = t.type
    if tt not in policy.GENERIC_TYPES:
        return _Choice("oracle", f"no native kernel for {tt.name} (hashed by the NumPy oracle)",
                       None)
    has_wide = tt in policy.WIDE_BLOCKS_ALIGN
    if kernel == "generic":
        return _Choice("generic", "--kernel generic", "wide" if has_wide else None)
    if kernel == "wide":
        if has_wide:
            return _Choice("wide", "--kernel wide", "generic")
        return _Choice("generic", f"{tt.name} has no wide kernel", None)
    sel = policy.warn_once(policy.select(cc, tt, rows, cols, cols, blocks_ptr, out_ptr,
                                             "f16", env))
    if sel.kernel is None:                  # cannot happen for a valid GGUF tensor
        return _Choice("oracle", f"not served natively: {sel.reason}", None)
    peer = None if not has_wide else ("generic" if sel.kernel == "wide" else "wide")
    return _Choice(sel.kernel, sel.reason, peer)


# ---------------------------------------------------------------- hashing threads

class _Hasher(threading.Thread):
    """Advances the current tensor's state of one dtype over the chunks put
    in its queue, in order."""

    def __init__(self, d: str, results: list):
        super().__init__(name=f"strata-hash-{d}", daemon=True)
        self.d, self.results = d, results
        self.q: queue.Queue = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self._state = 0

    def run(self) -> None:
        from ..hashing import FNV64_OFFSET, fnv1a64
        while True:
            item = self.q.get()
            try:
                if item is None:
                    return
                if self.error is None:
                    i, data, first, last = item
                    if first:
                        self._state = FNV64_OFFSET
                    self._state = fnv1a64(data.reshape(-1).view(np.uint8), self._state)
                    if last:
                        self.results[i].hashes[self.d] = self._state
            except BaseException as e:      # keep draining: the producer must never block
                self.error = e
            finally:
                self.q.task_done()


# ---------------------------------------------------------------- the run

def _oracle_chunk(tt: GGMLType, raw: np.ndarray, r0: int, n: int, cols: int, outs) -> dict:
    """The oracle's output bits of rows [r0, r0 + n), per dtype, as
    `hashing.hash_tensor` computes them (f32, then the f16 / bf16 rules)."""
    from .. import numerics
    from ..dequant import dequant_f32
    f32 = dequant_f32(tt, raw, n, cols, row0=r0)
    res = {}
    for d in outs:
        if d == "f32":
            res[d] = f32.reshape(-1).view(np.uint32)
        elif d == "f16":
            res[d] = numerics.f32_to_f16_bits(f32).reshape(-1)
        else:
            res[d] = numerics.f32_to_bf16_bits(f32).reshape(-1)
    return res


def _first_diff(dev: np.ndarray, ref: np.ndarray, base: int, cols: int):
    ne = dev != ref
    k = int(np.count_nonzero(ne))
    if not k:
        return 0, None
    j = int(np.flatnonzero(ne)[0])
    i = base + j
    return k, Diff(k, i, i // cols, i % cols, int(dev[j]), int(ref[j]))


def hash_tensors_device(tensors, out_dtypes=("f32", "f16", "bf16"), *, kernel: str = "auto",
                        compare: bool = False, reps: int = 3, progress=None,
                        device: int | None = None, chunk_values: int = CHUNK_VALUES,
                        env=None) -> DeviceHashRun:
    """Hash every tensor's dequantized output through the native kernels.

    tensors: a sequence of `strata_ref.gguf.GGUFTensor` (name, type, shape,
    rows, cols, n_bytes, n_elements, data: the raw uint8 bytes; every
    dimension >= 1, as `strata_ref.gguf.read` guarantees), in the order
    their chained hash is taken. out_dtypes: a sequence of "f32",
    "f16", "bf16". kernel: "auto", "generic" or "wide" (module docstring).
    compare: also compute the oracle's output of every chunk and record
    the first differing value per tensor and dtype. reps: timed launches per
    chunk, kernel and dtype (>= 1; median). progress: called with the input
    bytes of each finished chunk. device: CUDA device (default
    $STRATA_REF_DEVICE or 0). chunk_values: values per chunk (whole rows;
    a row longer than that is one chunk). env: the mapping STRATA_DEQUANT_WIDE
    is read from for "auto" (default os.environ).

    Returns a DeviceHashRun whose per-tensor hashes and chained hashes are,
    when the kernels meet their contract, those of `strata-ref hash` (the
    oracle) for the same tensors.

    Raises ValueError for an unknown kernel or dtype, reps < 1 or
    chunk_values < 1; NativeUnavailable when the native library cannot run
    here; NativeError when a CUDA call fails or a kernel refuses a tensor.
    """
    from ..hashing import chain_hashes, hash_tensor
    from .dequant.wrapper import _STATUS, DeviceBuffer, NativeError

    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    outs = tuple(out_dtypes)
    bad = [d for d in outs if d not in _OUT_SIZE]
    if bad or not outs:
        raise ValueError(f"out dtypes must be among f32, f16, bf16, got {list(outs)!r}")
    if not 1 <= int(reps) <= MAX_REPS:
        raise ValueError(f"reps must be in 1..{MAX_REPS}, got {reps}")
    if int(chunk_values) < 1:
        raise ValueError(f"chunk_values must be >= 1, got {chunk_values}")
    reps, chunk_values = int(reps), int(chunk_values)
    env = os.environ if env is None else env
    dev_no = loader.env_device() if device is None else int(device)
    nat = loader.load(dev_no)
    tensors = list(tensors)

    # Buffers sized for the largest chunk, allocated once and reused.
    def rows_per_chunk(t) -> int:
        return max(1, chunk_values // max(t.cols, 1))

    served = [t for t in tensors if t.type in policy.GENERIC_TYPES]
    max_vals = max([min(t.rows, rows_per_chunk(t)) * t.cols for t in served] + [1])
    max_in = max([min(t.rows, rows_per_chunk(t)) * (t.n_bytes // max(t.rows, 1))
                  for t in served] + [1])
    name = _device_name(nat, dev_no)
    copy_bps, copy_n = copy_bandwidth(nat)
    blocks = DeviceBuffer(max_in, np.uint8, dev_no)
    obuf = {d: DeviceBuffer(max_vals, _BUF_DTYPE[d], dev_no) for d in outs}
    # zero-filled: the flush kernel's guarded store never fires (api.cu)
    scratch = DeviceBuffer(max(2 * _l2_bytes(nat, dev_no), 1 << 20), np.uint8, dev_no)
    scratch.fill_bytes(0)
    ffi, lib = nat.ffi, nat.lib
    null = ffi.cast("void *", 0)
    sp = ffi.cast("void *", scratch.ptr)
    bp = ffi.cast("void *", blocks.ptr)
    op = {d: ffi.cast("void *", obuf[d].ptr) for d in outs}
    ms = ffi.new("float[]", reps)

    def timed(tt, name, n, cols, d, k) -> float:
        """Median seconds of `reps` L2-cold launches of kernel k."""
        st = lib.strata_dequant_timed(int(tt), bp, 0, n, cols, cols, _OUT_CODE[d], op[d],
                                      _KERNEL_CODE[k], sp, scratch.nbytes, reps, ms, null)
        if st in (1, 2, 4):
            raise NativeError(f"{name}: the {k} kernel refused {tt.name} {n}x{cols} to {d} "
                              f"({_STATUS[st]})")
        _check(nat, st, f"dequant {tt.name} ({k}, timed)")
        return statistics.median(float(ms[j]) for j in range(reps)) / 1e3

    results = [TensorRun(t.name, t.type, tuple(t.shape), "", "", int(t.n_bytes),
                         int(t.n_elements)) for t in tensors]
    hashers = {d: _Hasher(d, results) for d in outs}
    for h in hashers.values():
        h.start()

    def drain():
        for h in hashers.values():
            h.q.join()
        for h in hashers.values():
            if h.error is not None:
                raise h.error

    try:
        for i, t in enumerate(tensors):
            res = results[i]
            tt = t.type
            raw = np.asarray(t.data).reshape(-1)
            ch = _choose(nat.cc, t, kernel, t.rows, t.cols, blocks.ptr, obuf[outs[0]].ptr, env)
            res.kernel, res.reason, res.peer = ch.kernel, ch.reason, ch.peer
            if ch.kernel == "oracle":
                res.hashes = hash_tensor(tt, raw, t.rows, t.cols, outs, progress=progress)
                continue
            res.time_s = {d: 0.0 for d in outs}
            if ch.peer:
                res.peer_time_s = {d: 0.0 for d in outs}
            if compare:
                res.diffs = {d: None for d in outs}
            step = rows_per_chunk(t)
            row_bytes = t.n_bytes // t.rows
            for r0 in range(0, t.rows, step):
                n = min(step, t.rows - r0)
                blocks.upload(raw[r0 * row_bytes:(r0 + n) * row_bytes])
                oracle = _oracle_chunk(tt, raw, r0, n, t.cols, outs) if compare else None
                for d in outs:
                    if ch.peer:
                        res.peer_time_s[d] += timed(tt, t.name, n, t.cols, d, ch.peer)
                    # last: its output is the one copied back
                    res.time_s[d] += timed(tt, t.name, n, t.cols, d, ch.kernel)
                    host = obuf[d].download(_UINT[d], n * t.cols)
                    if compare:
                        k_, df = _first_diff(host, oracle[d], r0 * t.cols, t.cols)
                        if df is not None:
                            old = res.diffs[d]
                            res.diffs[d] = df if old is None else Diff(
                                old.count + k_, old.index, old.row, old.col, old.device,
                                old.oracle)
                    hashers[d].q.put((i, host, r0 == 0, r0 + n >= t.rows))
                if progress is not None:
                    progress(n * row_bytes)
        drain()
    finally:
        for h in hashers.values():
            h.q.put(None)
        for h in hashers.values():
            h.join()
    chained = {d: chain_hashes(r.hashes[d] for r in results) for d in outs}
    return DeviceHashRun(name, nat.cc, kernel, outs, reps, copy_bps, copy_n, results,
                         chained, compare)


# ---------------------------------------------------------------- reports

def _n(k: int, word: str) -> str:
    return f"{k} {word}" if k == 1 else f"{k} {word}s"


def summary_lines(run: DeviceHashRun) -> list[str]:
    """The device report of a run, in words: device, copy bandwidth, and per
    output dtype the summed kernel time, GB/s, share of the copy bandwidth,
    per-kernel counts and the wide/generic ratio; then any tensor the
    oracle served."""
    cc = f"{run.cc // 10}.{run.cc % 10}"
    lines = [f"device: {run.device_name}, compute capability {cc}, --kernel {run.kernel}; "
             f"device-to-device copy {run.copy_bytes_per_s / 1e9:.0f} GB/s "
             f"({run.copy_bytes >> 20} MiB, read + written, this run)"]
    served = [t for t in run.tensors if t.kernel != "oracle"]
    launches = "1 launch" if run.reps == 1 else f"{run.reps} launches"
    lines.append(f"kernel time per output dtype, summed over {_n(len(served), 'tensor')} "
                 f"(CUDA events, median of {launches} "
                 "per chunk, L2 flushed before each; GB/s of blocks read + outputs written):")
    for d in run.out_dtypes:
        s = run.timing(d)
        parts = [f"{k} {_n(v['tensors'], 'tensor')} {v['s'] * 1e6:.1f} us"
                 for k, v in s["by_kernel"].items() if v["tensors"]]
        line = (f"  {d:<4} {s['s'] * 1e6:10.1f} us  {s['bytes_per_s'] / 1e9:6.0f} GB/s  "
                f"{s['of_copy']:6.1%} of copy  ({', '.join(parts) or 'no tensor'})")
        if s["both"]:
            b = s["both"]
            line += (f"; wide/generic {b['wide_over_generic']:.1f}x on the "
                     f"{_n(b['tensors'], 'tensor')} with both kernels "
                     f"(wide {b['wide_s'] * 1e6:.1f} us, generic {b['generic_s'] * 1e6:.1f} us)")
        lines.append(line)
    orc = [t for t in run.tensors if t.kernel == "oracle"]
    if orc:
        names = ", ".join(f"{t.name} ({t.type.name})" for t in orc[:5])
        more = f" and {len(orc) - 5} more" if len(orc) > 5 else ""
        lines.append(f"not served natively, hashed by the NumPy oracle: {_n(len(orc), 'tensor')}: "
                     f"{names}{more}")
    return lines


def compare_lines(run: DeviceHashRun) -> list[str]:
    """Per tensor: name, type, shape, kernel, then per dtype "equal" or
    "DIFFERENT"; a line per differing dtype with the count and the first
    differing value (row, column, both bit patterns); a closing verdict."""
    w = max([len(t.name) for t in run.tensors] + [4])
    lines = [f"{'name':<{w}}  {'type':<7} {'shape':<16} {'kernel':<8} "
             + " ".join(f"{d:<9}" for d in run.out_dtypes)]
    n_diff = 0
    detail = []
    for t in run.tensors:
        shape = "x".join(map(str, t.shape))
        if t.diffs is None:
            cells = ["-" for _ in run.out_dtypes]
        else:
            cells = ["equal" if t.diffs[d] is None else "DIFFERENT" for d in run.out_dtypes]
        lines.append(f"{t.name:<{w}}  {t.type.name:<7} {shape:<16} {t.kernel:<8} "
                     + " ".join(f"{c:<9}" for c in cells))
        for d in run.out_dtypes:
            df = (t.diffs or {}).get(d)
            if df is not None:
                n_diff += 1
                digits = 8 if d == "f32" else 4
                lines.append(f"  {t.name} {d}: {df.count} of {t.n_values} values differ; first "
                             f"at row {df.row}, col {df.col}: device 0x{df.device:0{digits}x}, "
                             f"oracle 0x{df.oracle:0{digits}x}")
                detail.append(t.name)
    cmp = [t for t in run.tensors if t.diffs is not None]
    orc = len(run.tensors) - len(cmp)
    tail = f"; {_n(orc, 'tensor')} without a native kernel not compared" if orc else ""
    if n_diff:
        lines.append(f"compare: {n_diff} of {len(cmp) * len(run.out_dtypes)} tensor outputs "
                     f"DIFFER from the oracle ({_n(len(set(detail)), 'tensor')}){tail}")
    else:
        lines.append(f"compare: all {len(cmp) * len(run.out_dtypes)} tensor outputs "
                     f"({_n(len(cmp), 'tensor')} x {', '.join(run.out_dtypes)}) equal the oracle "
                     f"bit for bit{tail}")
    return lines


def tensor_rows(run: DeviceHashRun) -> list[dict]:
    """Per tensor, the `strata-ref hash --json` row (name, type, shape, hash:
    {dtype: 16 hex digits}) plus kernel, kernel_reason, time_us, and where
    timed peer_kernel / peer_time_us, and in compare runs compare: {dtype:
    "equal" or the Diff's fields}."""
    rows = []
    for t in run.tensors:
        r = {"name": t.name, "type": t.type.name, "shape": list(t.shape),
             "hash": {d: f"{t.hashes[d]:016x}" for d in run.out_dtypes},
             "kernel": t.kernel, "kernel_reason": t.reason,
             "time_us": {d: round(v * 1e6, 3) for d, v in t.time_s.items()}}
        if t.peer:
            r["peer_kernel"] = t.peer
            r["peer_time_us"] = {d: round(v * 1e6, 3) for d, v in t.peer_time_s.items()}
        if t.diffs is not None:
            r["compare"] = {d: "equal" if df is None else vars(df) for d, df in t.diffs.items()}
        rows.append(r)
    return rows


def device_json(run: DeviceHashRun) -> dict:
    """The device part of `hash --device cuda --json`: name, compute
    capability, kernel option, reps, copy bandwidth and per dtype the
    timing summary (`DeviceHashRun.timing`) in microseconds and GB/s."""
    def timing(s: dict) -> dict:
        out = {"tensors": s["tensors"], "kernel_us": round(s["s"] * 1e6, 3),
               "bytes": s["bytes"], "gb_s": round(s["bytes_per_s"] / 1e9, 1),
               "of_copy": round(s["of_copy"], 4),
               "by_kernel": {k: {"tensors": v["tensors"], "us": round(v["s"] * 1e6, 3)}
                             for k, v in s["by_kernel"].items()}}
        if s["both"]:
            b = s["both"]
            out["wide_over_generic"] = {"tensors": b["tensors"],
                                        "wide_us": round(b["wide_s"] * 1e6, 3),
                                        "generic_us": round(b["generic_s"] * 1e6, 3),
                                        "ratio": round(b["wide_over_generic"], 3)}
        return out
    return {"name": run.device_name, "compute_capability": run.cc, "kernel": run.kernel,
            "reps": run.reps, "copy_gb_s": round(run.copy_bytes_per_s / 1e9, 1),
            "copy_bytes": run.copy_bytes,
            "timing": {d: timing(run.timing(d)) for d in run.out_dtypes}}
