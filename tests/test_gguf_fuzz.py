"""Fuzzing strata_ref.gguf: every mutation of a small valid file ends in a
GGUFError or in a file whose tensors are consistent, within one second.

The mutations are seeded and deterministic: every truncation, bit flips,
byte overwrites, insertions and deletions, and u32/u64 overwrites with
boundary values (0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, ...) at every
byte of the header, metadata and tensor infos. Accepted files are also read
by gguf-py's GGUFReader, which must find the same tensors.
"""
from __future__ import annotations

import random
import struct
import time

import gguf
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from gguf.constants import GGUFValueType as V

from strata_ref.gguf import GGUFError, read, read_bytes, write_gguf
from strata_ref.types import GGMLType, block_format

SEED = 20261130
CASE_LIMIT_S = 1.0   # the bound per case; a parse here takes ~0.1 ms


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> bytes:
    rng = np.random.default_rng(SEED)
    path = tmp_path_factory.mktemp("fuzz") / "base.gguf"
    write_gguf(path, {
        "general.architecture": "llama",
        "general.name": "fuzz",
        "llama.block_count": (V.UINT32, 1),
        "t.flag": (V.BOOL, True),
        "t.scale": (V.FLOAT64, 0.5),
        "tokenizer.ggml.tokens": (V.ARRAY, ["<s>", "a", "bc"], V.STRING),
        "tokenizer.ggml.scores": (V.ARRAY, [0.0, -1.0, -2.0], V.FLOAT32),
        "t.nested": (V.ARRAY, [[1], [2, 3]], V.ARRAY),
    }, [
        ("w.f32", GGMLType.F32, (4, 2), np.arange(8, dtype=np.float32)),
        ("w.q4_0", GGMLType.Q4_0, (32, 2), rng.integers(0, 256, 36, dtype=np.uint8)),
        ("w.q8_0", GGMLType.Q8_0, (32, 1), rng.integers(0, 256, 34, dtype=np.uint8)),
    ], alignment=32)
    blob = path.read_bytes()
    f = read_bytes(blob)
    assert len(f.tensors) == 3 and len(f.metadata) == 9
    return blob


_BOUNDARY = [0, 1, 2, 31, 32, 0x7F, 0xFF, 2**16 - 1, 2**31, 2**32 - 1, 2**32,
             2**62, 2**63 - 1, 2**63, 2**64 - 1]


def _overwrite(blob: bytes, pos: int, width: int, value: int) -> bytes:
    fmt = "<I" if width == 4 else "<Q"
    field = struct.pack(fmt, value & ((1 << (8 * width)) - 1))
    return blob[:pos] + field[:len(blob) - pos] + blob[pos + width:]


def mutations(blob: bytes):
    """(label, bytes) for every mutation, in a fixed order."""
    rng = random.Random(SEED)
    meta_end = read_bytes(blob).data_offset
    for n in range(len(blob)):
        yield f"truncate {n}", blob[:n]
    for _ in range(600):
        bit = rng.randrange(len(blob) * 8)
        b = bytearray(blob)
        b[bit // 8] ^= 1 << (bit % 8)
        yield f"flip bit {bit}", bytes(b)
    for _ in range(200):
        b = bytearray(blob)
        for _ in range(rng.randint(2, 8)):
            b[rng.randrange(meta_end)] = rng.randrange(256)
        yield "random bytes", bytes(b)
    for _ in range(100):
        pos, k = rng.randrange(meta_end), rng.randint(1, 16)
        junk = bytes(rng.randrange(256) for _ in range(k))
        yield f"insert {k} at {pos}", blob[:pos] + junk + blob[pos:]
        yield f"delete {k} at {pos}", blob[:pos] + blob[pos + k:]
    for pos in range(meta_end):
        for width in (4, 8):
            for value in _BOUNDARY + [len(blob), -1, -len(blob)]:
                yield f"u{8 * width} {value} at {pos}", _overwrite(blob, pos, width, value)


@pytest.fixture(scope="module")
def cases(base) -> list[tuple[str, bytes]]:
    return list(mutations(base))


def _check_accepted(f, blob: bytes) -> None:
    """What read() promises about a file it accepts."""
    assert f.alignment & (f.alignment - 1) == 0 and f.data_offset % f.alignment == 0
    spans = []
    for t in f.tensors:
        fmt = block_format(t.type)
        assert all(0 <= ne < 2**63 for ne in t.shape) and len(t.shape) <= 4
        assert t.cols % fmt.block_values == 0
        assert t.n_bytes == t.n_elements // fmt.block_values * fmt.block_bytes
        assert t.offset >= f.data_offset and t.offset % f.alignment == 0
        assert t.offset + t.n_bytes <= len(blob)
        assert t.data.tobytes() == blob[t.offset:t.offset + t.n_bytes]
        if t.n_bytes:      # an empty tensor holds no bytes to overlap
            spans.append((t.offset, t.offset + t.n_bytes))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert len({t.name for t in f.tensors}) == len(f.tensors)


def _read_once(blob: bytes, path=None):
    t0 = time.process_time()
    try:
        f = read_bytes(blob) if path is None else read(path)
    except GGUFError as e:
        f = e
        assert 0 <= e.offset <= len(blob), str(e)
    return f, time.process_time() - t0


def run_case(blob: bytes, path=None):
    """Read `blob` (from `path` when given, else from memory): the GGUFFile
    or the GGUFError, and the CPU seconds it took. The bound is against a
    hang or a runaway loop, so it uses this process's CPU time (other load on
    a shared machine does not count) and a case over the bound is read once
    more, keeping the faster time (one scheduler stall is not a hang)."""
    f, dt = _read_once(blob, path)
    if dt >= CASE_LIMIT_S:
        dt = min(dt, _read_once(blob, path)[1])
    return f, dt


def test_fuzz_mutations(cases, tmp_path):
    n_cases, n_ok, accepted = 0, 0, []
    for label, blob in cases:
        f, dt = run_case(blob)
        n_cases += 1
        assert dt < CASE_LIMIT_S, f"{label}: {dt:.3f} s"
        if not isinstance(f, GGUFError):
            n_ok += 1
            _check_accepted(f, blob)
            accepted.append((label, blob, f))
    assert n_cases >= 200
    # both outcomes occur: mutations of tensor data or values stay readable
    assert 0 < n_ok < n_cases
    _agree_with_gguf_py(accepted[::max(1, len(accepted) // 150)], tmp_path)


def _agree_with_gguf_py(cases, tmp_path) -> None:
    """gguf-py reads the accepted files to the same tensors, except for the
    type id it does not know (Q2_0, 42)."""
    path = tmp_path / "case.gguf"
    for label, blob, f in cases:
        if any(t.type == GGMLType.Q2_0 for t in f.tensors):
            continue
        path.write_bytes(blob)
        r = gguf.GGUFReader(path)
        got = [(t.name, int(t.tensor_type), t.data_offset, t.n_bytes) for t in r.tensors]
        assert got == [(t.name, int(t.type), t.offset, t.n_bytes) for t in f.tensors], label
        del r


def test_fuzz_through_files(cases, tmp_path):
    """read(path) (the memory-mapped route) gives the same outcome as
    read_bytes on a sample of the mutations, tiny and empty files included."""
    path = tmp_path / "m.gguf"
    for i, (label, blob) in enumerate(cases):
        if i % 61 and len(blob) > 30:
            continue
        path.write_bytes(blob)
        f, dt = run_case(blob, path)
        assert dt < CASE_LIMIT_S, label
        g, _ = run_case(blob)
        if isinstance(g, GGUFError):
            assert isinstance(f, GGUFError) and f.offset == g.offset, label
        else:
            assert not isinstance(f, GGUFError), label
            assert [t.offset for t in f.tensors] == [t.offset for t in g.tensors]
        del f


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_property_random_edits(base, data):
    blob = bytearray(base)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        chunk = data.draw(st.binary(min_size=1, max_size=9))
        blob[pos:pos + len(chunk)] = chunk
    cut = data.draw(st.integers(0, len(blob)))
    f, dt = run_case(bytes(blob[:cut]))
    assert dt < CASE_LIMIT_S
    if not isinstance(f, GGUFError):
        _check_accepted(f, bytes(blob[:cut]))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(tail=st.binary(max_size=200),
                  counts=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)))
def test_property_arbitrary_body(tail, counts):
    blob = b"GGUF" + struct.pack("<IQQ", 3, *counts) + tail
    f, dt = run_case(blob)
    assert dt < CASE_LIMIT_S
    if not isinstance(f, GGUFError):
        _check_accepted(f, blob)


# ---------------------------------------------------------------- tokenizer metadata
# Every `tokenizer.ggml.*` key of a tiny runnable model (and the optional
# ones it lacks) replaced by values of other types, lengths and nesting, or
# removed: `generate` either runs or fails with one of the engine's own
# errors naming a tokenizer key, never with a Python-internal error (issue
# 16). The files are written as bytes, so that what gguf-py's writer refuses
# (empty arrays, invalid UTF-8) is covered too.

_PACK = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I",
         V.INT32: "<i", V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q",
         V.FLOAT64: "<d"}


def _gstr(s) -> bytes:
    b = s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _payload(vtype, value) -> bytes:
    """GGUF bytes of a value; an ARRAY value is (element type, items)."""
    if vtype == V.STRING:
        return _gstr(value)
    if vtype == V.ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(_payload(etype, x) for x in items)
    return struct.pack(_PACK[vtype], value)


def _rebuild(f, blob: bytes, kvs) -> bytes:
    """`blob` (parsed as `f`) with its key/value section replaced by `kvs`
    [(key, vtype, value)]; tensor infos and data kept."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(f.tensors), len(kvs)))
    for key, vtype, value in kvs:
        out += _gstr(key) + struct.pack("<I", vtype) + _payload(vtype, value)
    for t in f.tensors:
        out += _gstr(t.name) + struct.pack("<I", len(t.shape))
        out += b"".join(struct.pack("<Q", n) for n in t.shape)
        out += struct.pack("<IQ", int(t.type), t.offset - f.data_offset)
    out += bytes(-len(out) % f.alignment)
    return bytes(out) + blob[f.data_offset:]


def _kvs_of(f):
    out = []
    for k, v in f.metadata.items():
        vt = f.metadata_types[k]
        if vt == V.ARRAY:
            items = v.tolist() if isinstance(v, np.ndarray) else list(v)
            v = (f.array_types[k], items)
        out.append((k, vt, v))
    return out


TOKENIZER_KEYS = ["model", "pre", "tokens", "token_type", "scores", "merges", "bos_token_id",
                  "eos_token_id", "eot_token_id", "eom_token_id", "add_bos_token",
                  "add_eos_token", "add_space_prefix"]


def _replacements(n: int, old):
    """(label, vtype, value) values to put in place of a key's value; `old`
    is the current (vtype, value) or None."""
    yield from [
        ("u32 5", V.UINT32, 5), ("i32 -1", V.INT32, -1), ("u64 max", V.UINT64, 2**64 - 1),
        ("u8 0", V.UINT8, 0), ("f32 nan", V.FLOAT32, float("nan")), ("f64 1.5", V.FLOAT64, 1.5),
        ("bool", V.BOOL, True), ("str false", V.STRING, "false"), ("str empty", V.STRING, ""),
        ("str gpt2", V.STRING, "gpt2"), ("str llama", V.STRING, "llama"),
        ("str bad utf-8", V.STRING, b"\xff\xfe"),
        ("[] i32", V.ARRAY, (V.INT32, [])), ("[] str", V.ARRAY, (V.STRING, [])),
        ("[1,2,3] i32", V.ARRAY, (V.INT32, [1, 2, 3])),
        ("n f32", V.ARRAY, (V.FLOAT32, [0.5] * n)), ("n i32", V.ARRAY, (V.INT32, [1] * n)),
        ("n u8", V.ARRAY, (V.UINT8, [3] * n)), ("n bool", V.ARRAY, (V.BOOL, [True] * n)),
        ("n str", V.ARRAY, (V.STRING, ["a b"] * n)), ("3 str", V.ARRAY, (V.STRING, ["a b", "c", ""])),
        ("n bad utf-8", V.ARRAY, (V.STRING, [b"\xff" + bytes([i % 256]) for i in range(n)])),
        ("nested", V.ARRAY, (V.ARRAY, [(V.INT32, [1]), (V.INT32, [2, 3])])),
        ("nested str", V.ARRAY, (V.ARRAY, [(V.STRING, ["a b"])] * n)),
    ]
    if old is not None and old[0] == V.ARRAY:
        etype, items = old[1]
        yield "one short", V.ARRAY, (etype, items[:-1])
        yield "one more", V.ARRAY, (etype, items + items[-1:])
        yield "half", V.ARRAY, (etype, items[: len(items) // 2])
        yield "reversed", V.ARRAY, (etype, items[::-1])


@pytest.fixture(scope="module")
def tokenizer_bases(tmp_path_factory):
    """(label, bytes, parsed) of two tiny runnable models: byte-level BPE
    (gpt2) and SentencePiece (llama, with scores), both with a chat template."""
    from infer_helpers import tiny_model
    path = tmp_path_factory.mktemp("tokfuzz") / "tiny.gguf"
    tiny_model("qwen3", path)
    blob = path.read_bytes()
    f = read_bytes(blob)
    kvs = _kvs_of(f) + [("tokenizer.chat_template", V.STRING, "{{ '<|im_start|>' }}")]
    n = len(f.metadata["tokenizer.ggml.tokens"])
    spm = [kv for kv in kvs if kv[0] not in ("tokenizer.ggml.model", "tokenizer.ggml.merges",
                                             "tokenizer.ggml.pre")]
    spm += [("tokenizer.ggml.model", V.STRING, "llama"),
            ("tokenizer.ggml.scores", V.ARRAY, (V.FLOAT32, [-float(i) for i in range(n)]))]
    out = []
    for label, kv in (("bpe", kvs), ("spm", spm)):
        b = _rebuild(f, blob, kv)
        out.append((label, b, read_bytes(b), kv))
    return out


def _tokenizer_cases(bases):
    for label, blob, f, kvs in bases:
        n = len(f.metadata["tokenizer.ggml.tokens"])
        keys = [f"tokenizer.ggml.{k}" for k in TOKENIZER_KEYS] + ["tokenizer.chat_template"]
        for key in keys:
            i = next((j for j, kv in enumerate(kvs) if kv[0] == key), None)
            old = None if i is None else kvs[i][1:]
            if i is not None:
                yield f"{label} {key} removed", key, _rebuild(f, blob, kvs[:i] + kvs[i + 1:])
            for what, vt, val in _replacements(n, old):
                new = list(kvs)
                if i is None:
                    new.append((key, vt, val))
                else:
                    new[i] = (key, vt, val)
                yield f"{label} {key} = {what}", key, _rebuild(f, blob, new)


def test_fuzz_tokenizer_metadata(tokenizer_bases, tmp_path, monkeypatch, capsys):
    import re

    from strata_ref.cli import main
    # STRATA_REF_DEBUG=1 prints the traceback before the one-line error (exit
    # 2), so the exception's class is read from stderr: a TypeError or an
    # IndexError (a bug) fails here, only these three name bad metadata
    monkeypatch.setenv("STRATA_REF_DEBUG", "1")
    expected = ("strata_ref.infer.tokenizer.TokenizerError",
                "strata_ref.infer.model.ModelLoadError",
                "strata_ref.infer.chat.ChatTemplateError")
    path = tmp_path / "case.gguf"
    counts = {"ran": 0, "refused": 0}
    names_a_key = re.compile(r"`tokenizer\.(ggml\.[a-z_]+|chat_template)`")
    for _, blob, _, _ in tokenizer_bases:
        # untimed warm-up: a cold numba cache compiles the whole run here
        path.write_bytes(blob)
        assert main(["generate", str(path), "Hi", "--max-tokens", "2"]) == 0
        capsys.readouterr()
    for label, key, blob in _tokenizer_cases(tokenizer_bases):
        path.write_bytes(blob)
        argv = ["generate", str(path), "Hi", "--max-tokens", "2"]
        for chat in ([False, True] if key == "tokenizer.chat_template" else [False]):
            t0 = time.process_time()
            rc = main(argv + (["--chat"] if chat else []))
            out, errs = capsys.readouterr()
            if rc == 0:
                # the text on stdout, the speed line on stderr
                assert out.endswith("\n") and "[prompt: " not in out, label
                assert re.search(r"^\[prompt: \d+ tokens?, .* tok/s.*\]$", errs, re.M), label
                counts["ran"] += 1
            else:
                assert rc == 2, f"{label}: exit {rc}"
                lines = errs.rstrip("\n").split("\n")
                # the traceback's last line is "module.Class: message"
                cls, _, msg = lines[-2].partition(": ")
                assert lines[-1] == f"strata-ref: error: {msg}", f"{label}: {errs}"
                if cls == "ValueError":         # the prompt itself cannot be encoded
                    assert msg.startswith("the prompt gives no tokens: the vocabulary "
                                          "(`tokenizer.ggml.tokens`"), f"{label}: {msg}"
                else:
                    assert cls in expected and names_a_key.search(msg), f"{label}: {errs}"
                counts["refused"] += 1
            assert time.process_time() - t0 < 10 * CASE_LIMIT_S, label
    # both outcomes occur, over a few hundred files
    assert counts["ran"] > 20 and counts["refused"] > 200, counts
