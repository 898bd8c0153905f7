"""FNV-1a 64 over output bytes, with the NaN policy of ../shared/DESIGN.md,
and the hashes of whole models that `strata-ref hash` prints.

FNV-1a 64: offset basis 0xcbf29ce484222325, prime 0x100000001b3; for each
byte `h ^= byte; h *= prime (mod 2^64)` (Fowler, Noll, Vo; the constants of
../shared/spec/kernels.md §5).

A tensor's hash, per output dtype, is FNV-1a 64 over the canonical bytes of
its dequantized output in row-major order. It is one serial chain of
multiplies, so a tensor is hashed by one core; the output is produced and
hashed chunk by chunk (`CHUNK_VALUES` values of whole rows, or whole blocks
of one row when a row is longer), each chunk continuing the same state, so
memory stays bounded by a chunk whatever the tensor's size.

A model's chained hash, per output dtype, is `chain_hashes` of its tensor
hashes in model order (file order; for a gguf-split set shard order, then
file order): FNV-1a 64 over each tensor's hash as 8 little-endian bytes.
It depends on the tensor hashes only, so tensors can be hashed in parallel
(`hash_model` over `strata_ref.tasks`), resumed from a manifest, and a split
set chains to the same number as the file it was split from. (Golden model
files of format version 1 chained the output bytes of all tensors into one
state instead; `hash_tensor(chain=...)` still computes that.)
"""
from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
from numba import njit

from . import tasks
from .numerics import canonicalize_nan

__all__ = ["FNV64_OFFSET", "FNV64_PRIME", "fnv1a64", "fnv1a64_pair",
           "canonical_bytes", "hash_array", "HASH_DTYPES", "CHUNK_VALUES",
           "hash_tensor", "chain_hashes", "TensorSource", "cpu_outputs", "hash_source",
           "TensorHash", "ModelHashes", "hash_model", "MANIFEST_VERSION"]

FNV64_OFFSET = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3


@njit(cache=True, nogil=True)
def _fnv(data, h):
    p = np.uint64(FNV64_PRIME)
    for i in range(data.size):
        h = (h ^ np.uint64(data[i])) * p
    return h


@njit(cache=True, nogil=True)
def _fnv_pair(data, h1, h2):
    # Two independent states over the same bytes in one pass: the per-tensor
    # hash and the chained hash over the whole file.
    p = np.uint64(FNV64_PRIME)
    for i in range(data.size):
        b = np.uint64(data[i])
        h1 = (h1 ^ b) * p
        h2 = (h2 ^ b) * p
    return h1, h2


def _as_u8(data) -> np.ndarray:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, np.uint8)
    a = np.asarray(data)
    if a.dtype != np.uint8:
        raise TypeError(f"fnv1a64 hashes bytes or uint8 arrays, got {a.dtype}; "
                        "use hash_array for typed arrays")
    return np.ascontiguousarray(a).reshape(-1)


def _state(h) -> np.uint64:
    """A hash state: an int in [0, 2**64). TypeError for another type (a
    float would be truncated), ValueError outside the range."""
    if isinstance(h, (bool, np.bool_)) or not isinstance(h, (int, np.integer)):
        raise TypeError(f"an FNV-1a 64 state is an int in [0, 2**64), got {h!r}")
    if not 0 <= int(h) < 1 << 64:
        raise ValueError(f"an FNV-1a 64 state is an int in [0, 2**64), got {int(h)}")
    return np.uint64(int(h))


def fnv1a64(data, h: int = FNV64_OFFSET) -> int:
    """FNV-1a 64 of bytes (or a uint8 array), continuing from state `h` (an
    int in [0, 2**64); TypeError / ValueError otherwise)."""
    return int(_fnv(_as_u8(data), _state(h)))


def fnv1a64_pair(data, h1: int = FNV64_OFFSET, h2: int = FNV64_OFFSET) -> tuple[int, int]:
    """Two FNV-1a 64 states advanced over the same bytes in one pass."""
    a, b = _fnv_pair(_as_u8(data), _state(h1), _state(h2))
    return int(a), int(b)


def canonical_bytes(a: np.ndarray) -> np.ndarray:
    """uint8 view of the canonical bytes of `a`: NaNs canonical (float32
    0x7FFFFFFF, float16/bf16 0x7FFF, float64 0x7FFF...F), little-endian,
    C order; complex values part by part. Raises TypeError for object
    arrays and for extended-precision floats (np.longdouble and its complex
    form), whose padding bytes hold no defined value."""
    a = np.asarray(a)
    if a.dtype.hasobject:
        raise TypeError("cannot hash an object array")
    if a.dtype.kind in "fc" and a.dtype.itemsize > (8 if a.dtype.kind == "f" else 16):
        raise TypeError(f"cannot hash {a.dtype} values: extended precision has padding "
                        "bytes of no defined value; convert to float64 first")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    a = canonicalize_nan(a)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def hash_array(a: np.ndarray, h: int = FNV64_OFFSET) -> int:
    """FNV-1a 64 of the canonical little-endian bytes of `a` (row-major)."""
    return fnv1a64(canonical_bytes(a), h)


# ---------------------------------------------------------------------------
# Hashing dequantized tensors (the numbers of `strata-ref hash` and of the
# golden model files).

#: The output dtypes a tensor hash can be taken of.
HASH_DTYPES = ("f32", "f16", "bf16")

#: Output values per chunk: 16 MiB of f32, plus 8 MiB each of f16 and bf16.
CHUNK_VALUES = 1 << 22


def _plan(t, n_elements: int, cols: int, chunk_values: int | None = None):
    """Yield (byte offset in the tensor, bytes, rows, cols) of each chunk in
    row order: whole rows when a row fits `chunk_values` (default
    CHUNK_VALUES), else pieces of whole blocks of one row. Plain I8..I64 /
    F64 tensors: runs of elements."""
    from .types import PLAIN_TYPES, block_format
    chunk_values = CHUNK_VALUES if chunk_values is None else chunk_values
    fmt = block_format(t)
    bv, bb = fmt.block_values, fmt.block_bytes
    if n_elements == 0:
        return
    if t in PLAIN_TYPES or cols <= 0:
        step = max(1, chunk_values)
        for e0 in range(0, n_elements, step):
            n = min(step, n_elements - e0)
            yield e0 * bb, n * bb, 1, n
        return
    rows = n_elements // cols
    row_bytes = cols // bv * bb
    if cols <= chunk_values:
        step = max(1, chunk_values // cols)
        for r0 in range(0, rows, step):
            n = min(step, rows - r0)
            yield r0 * row_bytes, n * row_bytes, n, cols
        return
    piece = max(bv, chunk_values // bv * bv)
    for r in range(rows):
        for c0 in range(0, cols, piece):
            n = min(piece, cols - c0)
            yield r * row_bytes + c0 // bv * bb, n // bv * bb, 1, n


def cpu_outputs(t, raw: np.ndarray, rows: int, cols: int, out_dtypes) -> dict[str, np.ndarray]:
    """The oracle's output bytes of one chunk, the CPU producer of `hash_source`.

    t: GGMLType; raw: uint8 bytes of `rows` x `cols` values (whole rows, or
    whole blocks of one row). Returns {dtype: canonical little-endian uint8
    bytes of the rows x cols output, row-major}. A plain I8..I64 / F64 chunk
    is not converted: every dtype gets its element bytes (F64 NaNs
    canonical). Another producer (a device back end) takes the same
    arguments and must return the same bytes.
    """
    from . import numerics
    from .dequant import dequant_f32
    from .types import PLAIN_TYPES, block_format
    if t in PLAIN_TYPES:
        b = canonical_bytes(raw.view(block_format(t).field("v").dtype))
        return {d: b for d in out_dtypes}
    f32 = dequant_f32(t, raw, rows, cols)
    out = {}
    for d in out_dtypes:
        if d == "f32":
            out[d] = f32.reshape(-1).view(np.uint8)
        elif d == "f16":
            out[d] = numerics.f32_to_f16_bits(f32).reshape(-1).view(np.uint8)
        else:
            out[d] = numerics.f32_to_bf16_bits(f32).reshape(-1).view(np.uint8)
    return out


def _check_dtypes(out_dtypes) -> tuple[str, ...]:
    out_dtypes = tuple(out_dtypes)
    bad = [d for d in out_dtypes if d not in HASH_DTYPES]
    if bad or not out_dtypes:
        raise ValueError(f"output dtypes must be some of {', '.join(HASH_DTYPES)}, "
                         f"got {list(out_dtypes)}")
    return out_dtypes


def _hash_outputs(parts: Iterable[tuple[dict[str, np.ndarray], int]], out_dtypes,
                  chain: dict | None, progress) -> dict[str, int]:
    """Advance one FNV state per dtype over each part's bytes; `progress`
    gets each part's input bytes."""
    states = {d: FNV64_OFFSET for d in out_dtypes}

    def advance(d, b):
        # The FNV loops release the GIL, so the dtypes' streams run in parallel.
        if chain is not None:
            states[d], chain[d] = fnv1a64_pair(b, states[d], chain[d])
        else:
            states[d] = fnv1a64(b, states[d])

    for part, n_in in parts:
        if len(part) > 1 and sum(b.size for b in part.values()) >= 1 << 20:
            list(_pool().map(lambda kv: advance(*kv), part.items()))
        else:
            for d, b in part.items():
                advance(d, b)
        if progress is not None:
            progress(n_in)
        # drop this chunk's outputs before the next one is made: one chunk
        # in memory at a time, not two
        del part
    return states


def hash_tensor(t, raw, rows: int, cols: int, out_dtypes=HASH_DTYPES,
                chain: dict | None = None, progress=None) -> dict[str, int]:
    """FNV-1a 64 of the dequantized output of one tensor held in memory, per
    out dtype.

    t: ggml type; raw: the tensor's bytes (bytes or uint8 array, whole
    rows); rows x cols: its 2-D shape (cols = ne0). Hashes the canonical
    bytes of the rows x cols output in row-major order (NaNs canonical, no
    padding), chunk by chunk. If `chain` is given ({dtype: state}), each
    state is advanced over the same bytes (the chained hash of golden model
    files of format version 1). `progress(nbytes)` is called per chunk of
    input. Plain I8..I64 and F64 tensors are not converted: every out dtype
    hashes their element bytes (F64 NaNs canonical), so an F32 tensor
    retagged I32 keeps its f32 hash and only the recorded type tells them
    apart. An empty tensor (rows or cols 0) hashes no bytes: every hash is
    FNV64_OFFSET and `chain` is unchanged. Returns {dtype: hash}. Raises ValueError when `raw` does not hold
    rows x cols values of the type, or for an unknown dtype.
    """
    from .dequant import as_bytes
    from .types import block_format, parse_type
    tt = parse_type(t)
    out_dtypes = _check_dtypes(out_dtypes)
    raw = as_bytes(raw)
    fmt = block_format(tt)
    n = rows * cols
    if cols % fmt.block_values or raw.size != n // fmt.block_values * fmt.block_bytes:
        raise ValueError(f"{raw.size} bytes do not hold {rows} x {cols} {fmt.name} values")
    parts = ((cpu_outputs(tt, raw[b0:b0 + nb], r, c, out_dtypes), nb)
             for b0, nb, r, c in _plan(tt, n, cols))
    return _hash_outputs(parts, out_dtypes, chain, progress)


def chain_hashes(hashes: Iterable[int]) -> int:
    """A model's chained hash: FNV-1a 64 over each tensor hash (one output
    dtype) as 8 little-endian bytes, in model order."""
    b = b"".join(int(h).to_bytes(8, "little") for h in hashes)
    return fnv1a64(b)


# --------------------------------------------------------------------------
# tensors in files: what a worker process (or a dask worker) needs

@dataclass(frozen=True)
class TensorSource:
    """Where one tensor's bytes lie in a file and what they hold; picklable
    (no memory map), so that any worker can read the tensor itself.

    path: the file (absolute, so that dask workers sharing the path find
    it); offset: absolute byte offset of the data; n_bytes; type: ggml type
    id; n_elements; cols: ne[0]; name: for messages.
    """
    path: str
    offset: int
    n_bytes: int
    type: int
    n_elements: int
    cols: int
    name: str = ""

    @classmethod
    def of(cls, path, t) -> "TensorSource":
        """The source of GGUFTensor `t` of the file at `path`."""
        return cls(os.path.abspath(os.fspath(path)), int(t.offset), int(t.n_bytes),
                   int(t.type), int(t.n_elements), int(t.shape[0]) if t.shape else 1, t.name)


def _read_chunks(src: TensorSource, plan) -> Iterator[tuple[np.ndarray, int, int, int]]:
    """Yield (bytes, rows, cols, n_bytes) per planned chunk, read from the
    file into one reused buffer (consume each before asking for the next)."""
    plan = list(plan)
    if not plan:
        return
    buf = np.empty(max(nb for _, nb, _, _ in plan), np.uint8)
    with open(src.path, "rb", buffering=0) as f:
        for b0, nb, rows, cols in plan:
            view = memoryview(buf)[:nb]
            f.seek(src.offset + b0)
            got = 0
            while got < nb:
                k = f.readinto(view[got:])
                if not k:
                    raise ValueError(f"{src.path}: tensor {src.name!r} ends early: byte "
                                     f"{src.offset + b0 + got} is past the end of the file "
                                     "(was it changed since it was opened?)")
                got += k
            yield buf[:nb], rows, cols, nb


def hash_source(src: TensorSource, out_dtypes=HASH_DTYPES,
                producer: Callable = cpu_outputs) -> dict[str, int]:
    """FNV-1a 64 per out dtype of the tensor `src`, read from its file chunk
    by chunk (memory: one chunk, whatever the tensor's size).

    producer(t, raw, rows, cols, out_dtypes) -> {dtype: uint8 bytes} makes
    each chunk's output bytes (`cpu_outputs`, or a device back end's).
    Progress goes to `strata_ref.tasks.report` in input bytes. Returns
    {dtype: hash}. Raises ValueError when the file is shorter than `src` says.
    """
    from .types import GGMLType
    t = GGMLType(src.type)
    out_dtypes = _check_dtypes(out_dtypes)
    chunks = _read_chunks(src, _plan(t, src.n_elements, src.cols))
    parts = ((producer(t, raw, rows, cols, out_dtypes), nb) for raw, rows, cols, nb in chunks)
    return _hash_outputs(parts, out_dtypes, None, tasks.report)


def _hash_task(item) -> dict[str, int]:
    # one task of `hash_model`, for every back end of `tasks.run`
    src, out_dtypes, producer = item
    return hash_source(src, out_dtypes, producer)


# --------------------------------------------------------------------------
# whole models

@dataclass
class TensorHash:
    """One tensor's hashes: name, type (GGMLType), shape (ggml order),
    hashes {dtype: int}, shard (0-based index of its file)."""
    name: str
    type: object
    shape: tuple[int, ...]
    hashes: dict[str, int]
    shard: int = 0


@dataclass
class ModelHashes:
    """What `hash_model` found: `tensors` (TensorHash, model order),
    `chained` {dtype: int}, `out_dtypes`, `shards` (file paths, first to
    last), `resumed` (tensors taken from the manifest)."""
    tensors: list[TensorHash]
    chained: dict[str, int]
    out_dtypes: tuple[str, ...]
    shards: list[str]
    resumed: int = 0


#: Version of the manifest's JSON-lines layout.
MANIFEST_VERSION = 1


def hash_model(model, out_dtypes=HASH_DTYPES, *, types=None, select=None, jobs: int | None = 1,
               scheduler: str | None = None, manifest=None, resume: bool = False,
               progress: Callable[[int], None] | None = None,
               producer: Callable = cpu_outputs) -> ModelHashes:
    """Hash every tensor of a model and chain the hashes.

    model: what `strata_ref.gguf.read` returns (one file or a split set:
    anything with `.shards`, each with `.path` and `.tensors`). types: only
    tensors of these GGMLTypes (None: all). select(name) -> bool: only the
    tensors it accepts (None: all). jobs / scheduler: how the per-tensor
    tasks run (`strata_ref.tasks.run`: 1 in this process, N
    worker processes, or dask). manifest: a JSON-lines file that receives
    each tensor's hashes as it completes, one whole line per tensor; the
    run holds the file's lock (`flock`) while it writes it; a manifest of
    this model is started afresh unless `resume`. resume: take tensors the
    manifest already holds (with every dtype asked for) from it and hash
    only the others; the result equals a fresh run. progress(nbytes):
    input bytes as they are hashed (the resumed tensors' bytes in one call
    first). producer: each chunk's output bytes (`cpu_outputs`). Returns
    ModelHashes. Raises ValueError, naming the file, for a manifest another
    run is writing, for a manifest of another model (with or without
    resume), for a file that is not a manifest, for a damaged manifest on
    resume (naming the line), for an unknown dtype, or when resume is asked
    without a manifest.
    """
    out_dtypes = _check_dtypes(out_dtypes)
    if resume and manifest is None:
        raise ValueError("resume needs a manifest to resume from")
    shards = list(model.shards)
    entries = [(k, t) for k, f in enumerate(shards) for t in f.tensors
               if (types is None or t.type in types) and (select is None or select(t.name))]
    n = len(entries)
    results: list[dict[str, int] | None] = [None] * n
    writer = None
    if manifest is not None:
        held, writer = _open_manifest(manifest, shards, entries, out_dtypes, resume)
        for i, h in held.items():
            results[i] = {d: h[d] for d in out_dtypes}
    resumed = sum(r is not None for r in results)
    try:
        if progress is not None and resumed:
            progress(sum(t.n_bytes for (_, t), r in zip(entries, results) if r is not None))
        todo = [i for i in range(n) if results[i] is None]
        items = [(TensorSource.of(shards[entries[i][0]].path, entries[i][1]), out_dtypes, producer)
                 for i in todo]
        weights = [entries[i][1].n_bytes for i in todo]
        for j, h in tasks.run(_hash_task, items, jobs=jobs, scheduler=scheduler,
                              weights=weights, progress=progress):
            i = todo[j]
            results[i] = h
            if writer is not None:
                k, t = entries[i]
                writer.write_record(k, t, h)
    finally:
        if writer is not None:
            writer.close()
    rows = [TensorHash(t.name, t.type, tuple(t.shape), results[i], k)
            for i, (k, t) in enumerate(entries)]
    chained = {d: chain_hashes(r.hashes[d] for r in rows) for d in out_dtypes}
    return ModelHashes(rows, chained, out_dtypes, [f.path for f in shards], resumed)


def _manifest_head(shards) -> dict:
    """The manifest's first line: each shard's file name, size and
    modification time (ns), so that a manifest of another file of the same
    name and size (a model re-quantized in place) is refused on --resume."""
    return {"strata_ref_manifest": MANIFEST_VERSION,
            "shards": [{"file": os.path.basename(f.path), "size": int(f.file_size),
                        "mtime_ns": int(os.stat(f.path).st_mtime_ns)} for f in shards]}


class _ManifestWriter:
    """The open manifest of one `hash_model` run: a descriptor opened with
    O_APPEND that holds the file's exclusive lock (`flock`) until `close`,
    so that a second run on the same file is refused rather than mixing
    its lines in. Every line goes to the end of the file in one write."""

    def __init__(self, fd: int):
        self.fd = fd

    def write_line(self, obj) -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:                     # a regular file takes it in one write
            view = view[os.write(self.fd, view):]

    def write_record(self, k: int, t, h: dict[str, int]) -> None:
        """Append tensor `t`'s (of shard k) hashes {dtype: int}."""
        self.write_line({"name": t.name, "type": t.type.name, "shape": list(t.shape), "shard": k,
                         "offset": int(t.offset), "hash": {d: f"{v:016x}" for d, v in h.items()}})

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)           # and with it the lock
            self.fd = -1


def _lock(fd: int, path: str) -> None:
    """Take the manifest's exclusive lock without waiting; ValueError naming
    the file when another process holds it. Where the file system has no
    locks (some network mounts) the run goes on without one."""
    try:
        import fcntl
    except ImportError:             # not on a POSIX system
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(f"{path} is being written by another strata-ref hash (it holds the "
                         "file's lock); wait for it, or give another --manifest") from None
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            os.close(fd)
            raise


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    parts, pos = [], 0
    while pos < size:
        b = os.pread(fd, min(size - pos, 1 << 24), pos)
        if not b:
            break
        parts.append(b)
        pos += len(b)
    return b"".join(parts)


def _show_head(h) -> str:
    return ", ".join(f"{s.get('file')} ({s.get('size')} bytes, modified {s.get('mtime_ns')} ns)"
                     for s in h.get("shards") or [] if isinstance(s, dict))


def _other_model(path, first: dict, head: dict) -> ValueError:
    return ValueError(f"{path}: the manifest is of {_show_head(first) or 'no files'}, not of "
                      f"{_show_head(head)}; give another --manifest, or remove it to start afresh")


def _open_manifest(path, shards, entries, out_dtypes, resume):
    """(held, writer): held = {entry index: {dtype: int}} for the tensors the
    manifest holds with every dtype of `out_dtypes` (empty unless resume);
    writer = a `_ManifestWriter` holding the file's lock.

    The file is locked before it is read or changed. A file that is not a
    manifest is never replaced; a manifest of another model (another
    header) is refused with or without resume; without resume a manifest
    of this model starts afresh."""
    path = os.fspath(path)
    head = _manifest_head(shards)
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{path} is not a regular file; give a file for --manifest")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    _lock(fd, path)
    try:
        held: dict[int, dict[str, int]] = {}
        keep = 0                      # bytes of the file that stay (whole lines)
        if os.fstat(fd).st_size:
            if not _is_manifest(path):
                # another file under that name: never overwrite it
                raise ValueError(f"{path} exists and is not a strata-ref hash manifest; give "
                                 "another --manifest or remove it")
            data = _read_all(fd) if resume else os.pread(fd, 1 << 20, 0).split(b"\n", 1)[0] + b"\n"
            keep = data.rfind(b"\n") + 1     # a last line cut short by a kill is dropped
            lines = data[:keep].split(b"\n")[:-1]
            if resume:
                held = _read_manifest(path, lines, head, entries, out_dtypes)
            else:
                first = json.loads(lines[0])
                if (first.get("strata_ref_manifest") == MANIFEST_VERSION
                        and first.get("shards") != head["shards"]):
                    raise _other_model(path, first, head)
                keep = 0
        os.ftruncate(fd, keep)
        w = _ManifestWriter(fd)
        if not keep:
            w.write_line(head)
    except BaseException:
        os.close(fd)
        raise
    return held, w


def _is_manifest(path) -> bool:
    """Whether the file's first line (read up to 1 MiB) is a strata-ref
    hash manifest header of any version."""
    with open(path, "rb") as f:
        line = f.read(1 << 20).split(b"\n", 1)[0]
    try:
        first = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(first, dict) and "strata_ref_manifest" in first


def _read_manifest(path, lines, head, entries, out_dtypes) -> dict[int, dict[str, int]]:
    def load(no, line):
        try:
            return json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: line {no} is not JSON ({e}); remove the file "
                             "to start afresh") from None

    first = load(1, lines[0])
    if not isinstance(first, dict) or first.get("strata_ref_manifest") != MANIFEST_VERSION:
        raise ValueError(f"{path}: line 1 is not a strata-ref hash manifest header "
                         f"(version {MANIFEST_VERSION})")
    if first.get("shards") != head["shards"]:
        raise _other_model(path, first, head)
    index = {t.name: i for i, (_, t) in enumerate(entries)}
    found: dict[int, dict[str, int]] = {}
    for no, line in enumerate(lines[1:], start=2):
        rec = load(no, line)
        try:
            name, rtype, shape, shard, offset = (rec["name"], rec["type"], list(rec["shape"]),
                                                 rec["shard"], rec["offset"])
            values = {d: int(v, 16) for d, v in rec["hash"].items()}
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"{path}: line {no} is not a tensor record ({e!r})") from None
        i = index.get(name)
        if i is None:
            continue                # a tensor outside this run's --types
        k, t = entries[i]
        if (rtype, shape, shard, offset) != (t.type.name, list(t.shape), k, int(t.offset)):
            raise ValueError(f"{path}: line {no}: tensor {name!r} is {rtype} {shape} at shard "
                             f"{shard} offset {offset} there, {t.type.name} {list(t.shape)} at "
                             f"shard {k} offset {t.offset} in the model")
        found.setdefault(i, {}).update(values)
    return {i: h for i, h in found.items() if all(d in h for d in out_dtypes)}


_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
        import concurrent.futures
        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=min(3, tasks.cpu_count()))
    return _POOL
