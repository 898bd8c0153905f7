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
