"""The trace container: every intermediate tensor of a forward pass, as
written by `strata-ref trace`, by tools/llama_trace.c and by
tools/llama_dump.py --trace (llama.cpp's own graph through `cb_eval`), so
that `strata-ref diff` compares any two of them (docs/trace.md).

A trace is a zip of .npy files (an .npz NumPy loads), written entry by
entry as the tensors come, so that memory stays bounded by one tensor:

| entry | dtype, shape | what |
|---|---|---|
| `format` | str | `strata-ref-trace 1` |
| `producer` | str | the program that wrote it |
| `tokens` | int32 (n_tokens,) | the token ids of the pass |
| `calls` | int32 (n_calls,) | tokens per decode call, in order (a batched pass: one call) |
| `model.arch`, `model.name` | str | `general.architecture`, `general.name` ('' without) |
| `model.n_params`, `model.size`, `model.n_vocab`, `model.n_embd`, `model.n_layer` | int64 () | values, tensor data bytes, vocabulary, embedding, layers (llama.cpp's `llama_model_n_params`, `llama_model_size`, ...) |
| `options` | str | JSON: cpu profile, flash_attn, type_k, type_v, ... of the run |
| `t:SEQ:CALL:OP:NAME` | float32, float16 or int32 | one graph node (below) |
| `n_tensors` | int64 () | the number of `t:` entries, written last: a container without it is incomplete |

A node's entry: SEQ its position in the whole trace (6 digits, graph order
within each call, calls in order), CALL the decode call, OP ggml's op name
as `ggml_op_desc` gives it (`MUL_MAT`, `RMS_NORM`, `SWIGLU`, ...), NAME
the node's name in llama.cpp's graph (`attn_norm-0`, `Qcur-0`,
`result_output`). A node ggml left unnamed (`node_<i>`) is named after its
op and sources, `OP(src0,src1,...)`, each source by its own (so derived)
name without ggml's view suffixes (`MUL_MAT(blk.0.attn_output.weight,kqv_out-0)`;
`derived_name`). The values are the node's in ggml's `ne` order reversed
(NumPy's row-major shape) with the dimensions above the last one that is
not 1 dropped (`canonical_shape`): `attn_norm-0` of 5 tokens is (5, 576),
of one token (576,); `kq-0` is (n_head, n_tokens, n_kv).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._text import printable

__all__ = ["FORMAT", "TraceError", "TraceWriter", "Trace", "TraceEntry", "open_trace",
           "canonical_shape", "derived_name", "strip_view_suffixes", "is_auto_name",
           "SKIPPED_OPS", "model_info", "MODEL_KEYS"]

FORMAT = "strata-ref-trace 1"
#: ops the drivers leave out by default: views (no arithmetic) and the
#: copies into the KV cache or recurrent state
SKIPPED_OPS = frozenset({"NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "SET_ROWS", "CPY"})
#: the model identity every trace carries (`model_info`)
MODEL_KEYS = ("arch", "name", "n_params", "size", "n_vocab", "n_embd", "n_layer")
_TENSOR_DTYPES = {np.dtype("<f4"), np.dtype("<f2"), np.dtype("<i4")}
_VIEW_SUFFIX = re.compile(r"( \((view|reshaped|permuted|transposed)\))+$")
_AUTO = re.compile(r"^(node|leaf)_\d+$")
#: most bytes a string or index entry may have (names, JSON options)
_SMALL = 1 << 20


class TraceError(ValueError):
    """A file that is not a complete, well-formed trace container; the
    message names the file and what is wrong, in one line."""


def canonical_shape(shape) -> tuple:
    """`shape` (NumPy order) without its leading dimensions of 1, at least
    one dimension kept: the shape a trace stores (module docstring)."""
    s = tuple(int(d) for d in shape)
    while len(s) > 1 and s[0] == 1:
        s = s[1:]
    return s or (1,)


def is_auto_name(name: str) -> bool:
    """Whether `name` is one ggml gives a tensor nobody named (`node_<i>`,
    `leaf_<i>`, or empty)."""
    return name == "" or bool(_AUTO.match(name))


def strip_view_suffixes(name: str) -> str:
    """`name` without the suffixes ggml's view ops append (" (view)",
    " (reshaped)", " (permuted)", " (transposed)")."""
    return _VIEW_SUFFIX.sub("", name)


def derived_name(op: str, sources) -> str:
    """The name a trace gives a node ggml left unnamed: `OP(s0,s1,...)`
    with each source's name (already derived when it was unnamed) without
    its view suffixes; a source that has no name of its own (ggml's
    `node_<i>`, or a view of an unnamed node, named " (view)") as `_`."""
    names = [strip_view_suffixes(s) for s in sources]
    return f"{op}({','.join('_' if is_auto_name(s) else s for s in names)})"


def model_info(gf) -> dict:
    """The model identity of a `strata_ref.gguf` file (MODEL_KEYS): the
    values llama.cpp reports for the same file (`llama_model_n_params` =
    the sum of tensor elements, `llama_model_size` = of tensor bytes,
    `llama_vocab_n_tokens`, `llama_model_n_embd`, `llama_model_n_layer`)."""
    md = gf.metadata
    arch = md.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""
    name = md.get("general.name")

    def num(key):
        v = md.get(f"{arch}.{key}")
        try:
            return int(v)
        except (TypeError, ValueError):
            return 0
    toks = md.get("tokenizer.ggml.tokens")
    return {"arch": arch, "name": name if isinstance(name, str) else "",
            "n_params": int(sum(t.n_elements for t in gf.tensors)),
            "size": int(sum(t.n_bytes for t in gf.tensors)),
            "n_vocab": len(toks) if toks is not None else 0,
            "n_embd": num("embedding_length"),
            # llama_model_base::load_hparams: the MTP layers are not counted
            "n_layer": num("block_count") - num("nextn_predict_layers")}


# ------------------------------------------------------------------ writing
class TraceWriter:
    """Writes a trace container entry by entry (module docstring).

    `TraceWriter(path, tokens, calls, model, producer, options)`, then
    `add(call, op, name, array)` for each node in graph order, then
    `close()` (or use it as a context manager). The file is written as
    `<path>.<random>.part` (a unique name: two writers of one path never
    share it) and renamed to `path` by close(); an exception inside the
    `with` removes the part file, so a half-written trace never carries the
    final name. compress: deflate each entry (smaller, slower); the
    default stores them. Memory: one array at a time."""

    def __init__(self, path, tokens, calls, model: dict, producer: str, options: dict | None = None,
                 compress: bool = False):
        self.path = Path(path)
        tokens = np.asarray(tokens, np.int32).reshape(-1)
        calls = np.asarray(calls, np.int32).reshape(-1)
        if int(calls.sum()) != tokens.size or (calls < 1).any():
            raise ValueError(f"calls {calls.tolist()} do not split {tokens.size} tokens")
        # a name of this writer's own (two runs writing one path never share it)
        real = Path(os.path.realpath(self.path))
        fd, part = tempfile.mkstemp(dir=real.parent, prefix=real.name + ".", suffix=".part")
        try:
            from ._npio import user_mode
            user_mode(fd)
        finally:
            os.close(fd)
        self.part, self._final = Path(part), real
        try:
            self._zip = zipfile.ZipFile(self.part, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED,
                                        allowZip64=True)
        except BaseException:
            self.part.unlink()
            raise
        self.n = 0
        self._put("format", np.array(FORMAT))
        self._put("producer", np.array(str(producer)))
        self._put("tokens", tokens)
        self._put("calls", calls)
        for k in MODEL_KEYS:
            v = model.get(k, "" if k in ("arch", "name") else 0)
            self._put(f"model.{k}", np.array(str(v)) if k in ("arch", "name") else np.int64(v))
        self._put("options", np.array(json.dumps(options or {}, sort_keys=True)))

    def _put(self, key: str, a: np.ndarray) -> None:
        with self._zip.open(key + ".npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)

    def add(self, call: int, op: str, name: str, a: np.ndarray) -> None:
        """Append one node: `a` float32, float16 or int32 (any other float
        type is stored as float32), its shape made canonical."""
        if not op or ":" in op:
            raise ValueError(f"op {op!r}: a trace needs a non-empty op name without ':' "
                             f"(ggml's, or any label of another engine)")
        a = np.asarray(a)
        if a.dtype.kind == "f" and a.dtype not in (np.float32, np.float16):
            a = a.astype(np.float32)
        elif a.dtype.kind in "iu" and a.dtype != np.int32:
            a = a.astype(np.int32)
        a = np.ascontiguousarray(a).reshape(canonical_shape(a.shape))
        self._put(f"t:{self.n:06d}:{int(call)}:{op}:{name}", a)
        self.n += 1

    def close(self) -> None:
        if self._zip is None:
            return
        self._put("n_tensors", np.int64(self.n))
        try:
            self._zip.close()
            self._zip = None
            os.replace(self.part, self._final)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop the part file (after an error)."""
        if self._zip is not None:
            self._zip.close()
            self._zip = None
        try:
            self.part.unlink()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


# ------------------------------------------------------------------ reading
@dataclass(frozen=True)
class TraceEntry:
    """One node of a trace: its position, call, op, name, and the zip
    member holding it; `key` = (call, name, op, occurrence) identifies the
    node across traces (occurrence counts the earlier nodes of the same
    call, name and op)."""
    seq: int
    call: int
    op: str
    name: str
    member: str
    occurrence: int = 0
    shape: tuple = ()
    dtype: str = ""

    @property
    def key(self) -> tuple:
        return (self.call, self.name, self.op, self.occurrence)

    @property
    def layer(self) -> int | None:
        """The layer in a llama.cpp name (`ffn_out-3` -> 3), else None."""
        m = re.search(r"-(\d+)(?: \(|$)", self.name)
        return int(m.group(1)) if m and not self.name.startswith(("node_", "leaf_")) else None


@dataclass
class Trace:
    """An open trace container (`open_trace`): its header values and the
    node entries in graph order; `array(entry)` reads one node."""
    path: Path
    producer: str
    tokens: np.ndarray
    calls: np.ndarray
    model: dict
    options: dict
    entries: list = field(repr=False)
    _zip: zipfile.ZipFile = field(repr=False, default=None)

    def array(self, e: TraceEntry) -> np.ndarray:
        """The node's values (its dtype, canonical shape); TraceError for a
        damaged entry."""
        return _read_npy(self._zip, e.member, self.path, _TENSOR_DTYPES)

    def find(self, name: str, op: str | None = None, call: int | None = None) -> list:
        """Entries of this name (and op, call when given), in order."""
        return [e for e in self.entries if e.name == name and (op is None or e.op == op)
                and (call is None or e.call == call)]

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _header(f, path, member):
    """(shape, dtype, data offset) of an .npy stream, TraceError if it is
    not one."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"npy version {version}")
    except zipfile.BadZipFile as e:
        raise TraceError(f"{path}: entry {member!r} is damaged ({e})") from None
    except (ValueError, EOFError, SyntaxError) as e:
        raise TraceError(f"{path}: entry {member!r} is not an .npy array ({e})") from None
    if fortran or dtype.hasobject:
        raise TraceError(f"{path}: entry {member!r} is not a plain C-order array")
    return shape, dtype


def _read_npy(zf, member: str, path, dtypes=None) -> np.ndarray:
    """One .npy member, its size checked against its header before the data
    is read (a header claiming more than the member holds is refused, not
    allocated)."""
    try:
        info = zf.getinfo(member)
        with zf.open(info) as f:
            shape, dtype = _header(f, path, member)
            if dtypes is not None and dtype not in dtypes:
                raise TraceError(f"{path}: entry {member!r} has dtype {dtype}, not float32, "
                                 f"float16 or int32")
            n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            head = f.tell()
            if head + n != info.file_size:
                raise TraceError(f"{path}: entry {member!r} holds {info.file_size - head} data bytes, "
                                 f"its header says {n} ({dtype} {tuple(shape)})")
            raw = f.read(n)
    except zipfile.BadZipFile as e:
        raise TraceError(f"{path}: entry {member!r} is damaged ({e})") from None
    except (OSError, EOFError) as e:
        raise TraceError(f"{path}: entry {member!r} cannot be read ({e})") from None
    if len(raw) != n:
        raise TraceError(f"{path}: entry {member!r} is truncated")
    return np.frombuffer(raw, dtype).reshape(shape)


def _small(zf, names, key, path, kind):
    member = key + ".npy"
    if member not in names:
        raise TraceError(f"{path}: no `{key}` entry: not a complete trace container")
    if zf.getinfo(member).file_size > _SMALL:
        raise TraceError(f"{path}: entry `{key}` is larger than {_SMALL} bytes")
    a = _read_npy(zf, member, path)
    if kind == "str":
        if a.dtype.kind != "U" or a.shape != ():
            raise TraceError(f"{path}: entry `{key}` is not a string")
        return str(a)
    if kind == "int":
        if a.dtype.kind not in "iu" or a.shape != ():
            raise TraceError(f"{path}: entry `{key}` is not an integer")
        return int(a)
    if a.dtype.kind not in "iu" or a.ndim != 1:
        raise TraceError(f"{path}: entry `{key}` is not a 1-D integer array")
    return a.astype(np.int64)


def open_trace(path) -> Trace:
    """Open and check a trace container (module docstring). Raises
    TraceError naming the file and the problem: not a zip or cut short (no
    central directory), another format, an incomplete one (no
    `n_tensors`, or a count that disagrees), tokens and calls that do not
    agree, a tensor entry with a malformed name or header. The arrays
    themselves are read when asked for (`Trace.array`)."""
    from ._npio import input_problem
    path = Path(path)
    bad = input_problem(path)
    if bad:
        raise TraceError(f"{path}: {bad}")
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise TraceError(f"{path}: not a trace container (not a zip file, or cut short: no "
                         f"zip directory at its end)") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        names = set(zf.namelist())
        fmt = _small(zf, names, "format", path, "str") if "format.npy" in names else None
        if fmt is None:
            held = sorted(n[:-4] if n.endswith(".npy") else n for n in names)
            shown = ", ".join(printable(n[:40]) for n in held[:6]) + (", ..." if len(held) > 6 else "")
            raise TraceError(f"{path}: not a trace container (no `format` entry; it holds "
                             f"{shown or 'nothing'}): give a file `strata-ref trace` or "
                             f"tools/llama_trace.c wrote")
        if fmt != FORMAT:
            raise TraceError(f"{path}: not a trace container (format {fmt!r}, expected {FORMAT!r})")
        if "n_tensors.npy" not in names:
            raise TraceError(f"{path}: incomplete trace: no `n_tensors` entry (the writer did not finish)")
        n_tensors = _small(zf, names, "n_tensors", path, "int")
        tokens = _small(zf, names, "tokens", path, "ints")
        calls = _small(zf, names, "calls", path, "ints")
        if calls.sum() != tokens.size or (calls < 1).any():
            raise TraceError(f"{path}: `calls` {calls.tolist()[:8]} do not split the "
                             f"{tokens.size} tokens")
        model = {}
        for k in MODEL_KEYS:
            key = f"model.{k}"
            if key + ".npy" in names:
                model[k] = _small(zf, names, key, path, "str" if k in ("arch", "name") else "int")
        try:
            options = json.loads(_small(zf, names, "options", path, "str")) if "options.npy" in names else {}
        except json.JSONDecodeError:
            raise TraceError(f"{path}: entry `options` is not JSON") from None
        if not isinstance(options, dict):
            raise TraceError(f"{path}: entry `options` is JSON {type(options).__name__}, not an object "
                             f"(of flash_attn, type_k, n_ctx, ...)")
        producer = _small(zf, names, "producer", path, "str") if "producer.npy" in names else ""
        entries = _entries(zf, path, len(calls))
        if len(entries) != n_tensors:
            raise TraceError(f"{path}: incomplete trace: {len(entries)} tensor entries, "
                             f"`n_tensors` says {n_tensors}")
    except BaseException:
        zf.close()
        raise
    return Trace(path, producer, tokens, calls, model, options, entries, zf)


def _entries(zf, path, n_calls: int) -> list:
    raw = []
    for info in zf.infolist():
        m = info.filename
        if not m.startswith("t:"):
            continue
        parts = m[:-4].split(":", 4) if m.endswith(".npy") else []
        if len(parts) != 5 or not parts[1].isdigit() or not parts[2].isdigit() or not parts[3]:
            raise TraceError(f"{path}: malformed tensor entry name {m!r} (expected t:SEQ:CALL:OP:NAME.npy)")
        seq, call = int(parts[1]), int(parts[2])
        if call >= n_calls:
            raise TraceError(f"{path}: entry {m!r} names call {call}, but the trace has {n_calls} calls")
        try:
            with zf.open(info) as f:
                shape, dtype = _header(f, path, m)
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise TraceError(f"{path}: entry {m!r} is damaged ({e})") from None
        raw.append((seq, call, parts[3], parts[4], m, tuple(int(d) for d in shape), dtype.str))
    raw.sort()
    if [r[0] for r in raw] != list(range(len(raw))):
        raise TraceError(f"{path}: tensor entries are not numbered 0 .. {len(raw) - 1}")
    out, seen = [], {}
    for seq, call, op, name, m, shape, dt in raw:
        occ = seen.get((call, name, op), 0)      # occurrences count in graph order
        seen[(call, name, op)] = occ + 1
        out.append(TraceEntry(seq, call, op, name, m, occ, shape, dt))
    return out
