"""Golden corpus, golden files and `compare` (strata_ref.golden).

The corpus generator is checked against the format definitions
(../shared/spec/formats.md §5, §12.3) with index decoders written here from
the spec, independently of the packers in golden.py: the IQ grid cases must
contain every grid index, sign pattern and scale value, the special-scale
cases must carry the stated bit patterns.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from strata_ref import golden
from strata_ref.cli.golden import run_golden_check, run_golden_make
from strata_ref.cli.inspect import run_compare
from strata_ref.gguf import write_gguf
from strata_ref.hashing import hash_array
from strata_ref.types import GGMLType as T, block_format

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "golden" / "corpus.json"
FAST_TYPES = (T.F16, T.Q4_0, T.Q4_K, T.IQ2_XXS, T.MXFP4)


def _case(name):
    return {c.name: c for c in golden.corpus_cases()}[name]


def _blocks(case):
    return case.data().reshape(case.n_blocks, block_format(case.type).block_bytes)


# ------------------------------------------------------------------ generator

def test_case_bytes_are_deterministic_and_order_free():
    a = golden.corpus_cases()
    b = golden.corpus_cases([T.Q4_K])
    ca = next(c for c in a if c.name == "Q4_K/sane")
    cb = next(c for c in b if c.name == "Q4_K/sane")
    assert np.array_equal(ca.data(), cb.data())
    assert not np.array_equal(ca.data(), _case("Q4_K/raw").data()[:ca.data().size])


def test_case_names_unique_and_every_type_covered():
    cs = golden.corpus_cases()
    names = [c.name for c in cs]
    assert len(names) == len(set(names))
    assert {c.type for c in cs} == set(golden.CORPUS_TYPES)
    for c in cs:
        assert c.row0 + c.rows <= c.tensor_rows and c.ld >= c.cols
        assert c.cols % block_format(c.type).block_values == 0
    # odd row counts, row slices and padded ld exist for every type
    for t in golden.CORPUS_TYPES:
        mine = [c for c in cs if c.type == t]
        assert any(c.rows % 2 == 1 and c.rows > 1 for c in mine), t
        assert any(c.row0 > 0 for c in mine), t
        assert any(c.ld > c.cols for c in mine), t


def test_special_scales_carry_their_bits():
    b = _blocks(_case("Q4_1/scale/m=snan"))
    assert (b[:, 2:4].copy().view("<u2") == 0x7C01).all()          # m@2
    b = _blocks(_case("Q2_K/scale/dmin=-min_sub"))
    assert (b[:, 82:84].copy().view("<u2") == 0x8001).all()        # dmin@82
    b = _blocks(_case("Q8_K/scale/d=max"))
    assert (b[:, 0:4].copy().view("<u4") == 0x7F7FFFFF).all()      # f32 d
    b = _blocks(_case("MXFP4/scale/e=e=255"))
    assert (b[:, 0] == 255).all()
    b = _blocks(_case("NVFP4/scale/d=0xff"))
    assert (b[:, 0:4] == 0xFF).all()
    # IQ1_M: d reassembled from the top nibbles of the four u16 scales
    sc = _blocks(_case("IQ1_M/scale/d=-inf"))[:, 48:56].copy().view("<u2").astype(np.uint32)
    d = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00) | (sc[:, 3] & 0xF000)
    assert (d == 0xFC00).all()


def test_sane_scales_are_finite():
    for t, off in ((T.Q4_0, 0), (T.Q6_K, 208), (T.IQ4_XS, 0)):
        d = _blocks(_case(f"{t.name}/sane"))[:, off:off + 2].copy().view("<u2")
        assert ((d & 0x7C00) != 0x7C00).all()
    e = _blocks(_case("MXFP4/sane"))[:, 0]
    assert e.min() >= 2 and e.max() <= 253


def test_q4_0_q8_with_negative_d_is_present():
    # formats.md §9: CUDA's contiguous Q4_0 path gives +0 where C gives -0
    b = _blocks(_case("Q4_0/fill=88/neg"))
    assert (b[:, 0:2].copy().view("<u2") == 0xB800).all() and (b[:, 2:] == 0x88).all()
    y = golden.case_output(_case("Q4_0/fill=88/neg"))
    assert (y.view(np.uint32) == 0x80000000).all()      # (8 - 8) * -0.5 = -0.0


def test_f16_and_bf16_ramp_is_every_pattern():
    for t in (T.F16, T.BF16):
        v = _case(f"{t.name}/ramp").data().view("<u2")
        assert np.array_equal(np.sort(v), np.arange(65536))


def _nibbles(a):
    return np.concatenate([a & 15, a >> 4], axis=-1)


# Index decoders written from formats.md §5 (not from golden.py's packers).
def _iq_indices(t, b):
    u16 = lambda o, n: b[:, o:o + 2 * n].copy().view("<u2").astype(np.int64)   # noqa: E731
    u32 = lambda o, n: b[:, o:o + 4 * n].copy().view("<u4").astype(np.int64)   # noqa: E731
    if t == T.IQ2_XXS:
        q = u32(2, 16).reshape(-1, 8, 2)
        a0, a1 = q[..., 0], q[..., 1]
        grid = np.stack([(a0 >> 8 * l) & 255 for l in range(4)], -1)
        signs = np.stack([(a1 >> 7 * l) & 127 for l in range(4)], -1)
        return grid, 256, signs, 128, a1 >> 28, 16
    if t == T.IQ2_XS:
        w = u16(2, 32)
        return w & 511, 512, w >> 9, 128, _nibbles(b[:, 66:74]), 16
    if t == T.IQ2_S:
        qh = b[:, 66:74].astype(np.int64)
        idx = np.stack([b[:, 2 + 4 * ib + l].astype(np.int64) | ((qh[:, ib] >> 2 * l) & 3) << 8
                        for ib in range(8) for l in range(4)], -1)
        return idx, 1024, b[:, 34:66], 256, _nibbles(b[:, 74:82]), 16
    if t == T.IQ3_XXS:
        a = u32(66, 8)
        signs = np.stack([(a >> 7 * l) & 127 for l in range(4)], -1)
        return b[:, 2:66], 256, signs, 128, a >> 28, 16
    if t == T.IQ3_S:
        qh = b[:, 66:74].astype(np.int64)
        idx = np.stack([b[:, 2 + 8 * ib + k].astype(np.int64) | ((qh[:, ib] >> k) & 1) << 8
                        for ib in range(8) for k in range(8)], -1)
        return idx, 512, b[:, 74:106], 256, _nibbles(b[:, 106:110]), 16
    if t == T.IQ1_S:
        qh = u16(34, 8)
        idx = np.stack([b[:, 2 + 4 * ib + l].astype(np.int64) | ((qh[:, ib] >> 3 * l) & 7) << 8
                        for ib in range(8) for l in range(4)], -1)
        return idx, 2048, qh >> 15, 2, (qh >> 12) & 7, 8
    if t == T.IQ1_M:
        qh = b[:, 32:48].astype(np.int64)
        idx = np.stack([b[:, 4 * ib + l].astype(np.int64) | ((qh[:, 2 * ib + l // 2] >> 4 * (l % 2)) & 7) << 8
                        for ib in range(8) for l in range(4)], -1)
        delta = np.stack([(qh >> 3) & 1, (qh >> 7) & 1], -1)
        sc = u16(48, 4)
        s3 = np.stack([(sc >> 3 * k) & 7 for k in range(4)], -1)
        return idx, 2048, delta, 2, s3, 8
    raise AssertionError(t)


@pytest.mark.parametrize("t", [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M])
def test_iq_grid_case_covers_every_index_sign_and_scale(t):
    idx, n_idx, signs, n_signs, scales, n_scales = _iq_indices(t, _blocks(_case(f"{t.name}/grid")))
    assert set(np.unique(idx)) == set(range(n_idx))
    assert set(np.unique(signs)) == set(range(n_signs))
    assert set(np.unique(scales)) == set(range(n_scales))


def test_quant_cases():
    qs = golden.quant_cases()
    assert len({q.name for q in qs}) == len(qs)
    for q in qs:
        x = q.inputs()
        assert x.dtype == np.float32 and x.shape == (q.rows, q.cols)
        assert q.cols % 256 == 0
        assert q.nonfinite == (not np.isfinite(x).all())
    zn = {q.name: q for q in qs}["zero-neg"].inputs()
    assert (zn == 0).all() and np.signbit(zn[0, ::32]).all()


# ------------------------------------------------------------------ golden files

def test_corpus_file_header():
    doc = json.loads(CORPUS.read_text())
    assert doc["format_version"] == golden.FORMAT_VERSION
    assert doc["generator_version"] == golden.CORPUS_VERSION
    assert doc["seed"] == golden.CORPUS_SEED
    assert doc["missing_types"] == []
    assert len(doc["cases"]) == len(golden.corpus_cases())
    assert CORPUS.stat().st_size < 1 << 20


def test_corpus_check_fast_subset():
    rows, ok = golden.check_corpus(CORPUS, types=FAST_TYPES)
    assert ok, [r for r in rows if r["status"] != "pass"][:5]
    assert len(rows) == len(golden.corpus_cases(FAST_TYPES))


@pytest.mark.slow
def test_corpus_check_everything():
    rows, ok = golden.check_corpus(CORPUS)
    assert ok, [r for r in rows if r["status"] != "pass"][:5]


def test_changed_bit_shows_as_named_failure(tmp_path):
    doc = json.loads(CORPUS.read_text())
    victim = "Q4_0/scale/d=neg"
    for it in doc["cases"]:
        if it["name"] == victim:
            h = int(it["f16"], 16) ^ 1
            it["f16"] = f"{h:016x}"
    p = tmp_path / "corpus.json"
    p.write_text(json.dumps(doc))
    rows, ok = golden.check_corpus(p, types=[T.Q4_0])
    assert not ok
    bad = [r for r in rows if r["status"] != "pass"]
    assert [(r["name"], r["detail"]) for r in bad] == [(victim, "hash differs: f16")]


def test_make_then_check_roundtrip_and_missing_case(tmp_path):
    p = tmp_path / "c.json"
    doc = golden.make_corpus(p, types=[T.Q4_0])
    assert len(doc["cases"]) == len(golden.corpus_cases([T.Q4_0]))
    rows, ok = golden.check_corpus(p, types=[T.Q4_0])
    assert ok
    # the stored hashes are those of the oracle output, hashed independently here
    c = _case("Q4_0/shape/ld+35")
    it = next(i for i in doc["cases"] if i["name"] == c.name)
    y = golden.case_output(c, "bf16")
    assert y.shape == (c.rows, c.cols)
    assert it["bf16"] == f"{hash_array(y):016x}"
    doc = json.loads(p.read_text())
    doc["cases"] = doc["cases"][1:]
    p.write_text(json.dumps(doc))
    rows, ok = golden.check_corpus(p, types=[T.Q4_0])
    assert not ok and [r["status"] for r in rows].count("new") == 1


def test_bad_golden_file_is_a_clear_error(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        golden.check_corpus(p)
    with pytest.raises(ValueError, match="no golden file"):
        golden.check_corpus(tmp_path / "missing.json")
    p.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="format version"):
        golden.check_corpus(p)
    p.write_text("[]")                      # valid JSON, not an object
    with pytest.raises(ValueError, match="format version"):
        golden.check_corpus(p)
    head = {"format": "strata-ref golden", "format_version": golden.FORMAT_VERSION}
    for key, bad in (("cases", {"a": 1}), ("cases", [1, 2]), ("tensors", [1, 2])):
        p.write_text(json.dumps({**head, key: bad}))
        with pytest.raises(ValueError, match=f"'{key}' must be a list of objects"):
            golden.check_corpus(p)


def test_run_golden_check_exit_status(tmp_path, capsys):
    d = tmp_path / "g"
    d.mkdir()
    golden.make_corpus(d / "corpus.json", types=[T.F16])
    doc = json.loads((d / "corpus.json").read_text())
    # a check of the full corpus against a one-type file: every other case is "new"
    assert run_golden_check(d) == 1
    assert "FAIL" in capsys.readouterr().out
    assert run_golden_check(tmp_path / "nowhere") == 2
    assert doc["cases"]


# ------------------------------------------------------------------ models and compare

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A small GGUF: a Q4_K tensor (sane random blocks), an F16 and an F32 one."""
    d = tmp_path_factory.mktemp("m")
    rng = np.random.default_rng(7)
    q4k = rng.integers(0, 256, (6 * 2, 144), dtype=np.uint8)
    q4k[:, 0:4] = np.array([0x2E66, 0x1C00], "<u2").view(np.uint8)   # d = 0.1, dmin = 0.0039
    f16 = rng.standard_normal(3 * 64).astype(np.float16).view(np.uint16)
    f32 = rng.standard_normal(40).astype(np.float32)
    q8 = rng.integers(0, 256, (2, 34), dtype=np.uint8)
    q8[:, 0:2] = np.array([0x3C00, 0x7E00], "<u2").view(np.uint8).reshape(2, 2)  # d = 1, NaN
    p = d / "tiny.gguf"
    write_gguf(p, {}, [("blk.0.w", T.Q4_K, (512, 6), q4k.reshape(-1)),
                       ("blk.0.h", T.F16, (64, 3), f16),
                       ("norm", T.F32, (40,), f32),
                       ("nan.q8", T.Q8_0, (64,), q8.reshape(-1))])
    return p


def _oracle(path, name, dtype, row0=0, rows=None):
    from strata_ref.dequant import dequant
    from strata_ref.gguf import read
    t = read(path).tensor(name)
    rows = t.rows - row0 if rows is None else rows
    return dequant(t.type, t.data, rows, t.cols, row0=row0, out_dtype=dtype)


def test_model_golden_roundtrip(model, tmp_path):
    g = tmp_path / "tiny.json"
    doc = golden.make_model_golden(model, g)
    assert [t["name"] for t in doc["tensors"]] == ["blk.0.w", "blk.0.h", "norm", "nan.q8"]
    y = _oracle(model, "blk.0.w", "f32")
    assert doc["tensors"][0]["f32"] == f"{hash_array(y):016x}"
    rows, ok = golden.check_model_golden(model, g)
    assert ok and len(rows) == 4
    doc["tensors"][2]["bf16"] = "0" * 16
    g.write_text(json.dumps(doc))
    rows, ok = golden.check_model_golden(model, g)
    assert not ok and [r["name"] for r in rows if r["status"] == "FAIL"] == ["norm"]
    other = tmp_path / "other.gguf"
    shutil.copy(model, other)
    with open(other, "ab") as f:
        f.write(b"\0" * 32)
    rows, ok = golden.check_model_golden(other, g)
    assert not ok and "sha256" in rows[0]["detail"]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_compare_equal_then_one_flipped_bit(model, tmp_path, dtype):
    y = _oracle(model, "blk.0.w", dtype, row0=1, rows=4)
    dump = tmp_path / "d.bin"
    dump.write_bytes(y.tobytes())
    rep = golden.compare_dump(model, "blk.0.w", dump, dtype, row0=1, rows=4)
    assert rep["equal"] and rep["n_diff"] == 0 and rep["rows"] == 4
    assert rep["fnv_oracle"] == rep["fnv_dump"] == f"{hash_array(y):016x}"
    bits = y.copy().view(np.uint32 if dtype == "f32" else np.uint16).reshape(-1)
    i = 777
    bits[i] ^= 1
    dump.write_bytes(bits.tobytes())
    rep = golden.compare_dump(model, "blk.0.w", dump, dtype, row0=1, rows=4)
    assert not rep["equal"] and rep["n_diff"] == 1 and rep["max_ulp"] == 1
    fd = rep["first_diff"]
    assert (fd["index"], fd["row"], fd["col"]) == (i, 1 + i // 512, i % 512)
    want = int(y.view(bits.dtype).reshape(-1)[i])
    assert int(fd["oracle_bits"], 16) == want and int(fd["dump_bits"], 16) == want ^ 1
    assert rep["fnv_dump"] != rep["fnv_oracle"]
    assert run_compare(model, "blk.0.w", dump, dtype, 1, 4) == 1


def test_compare_with_ld_padding_and_hash(model, tmp_path, capsys):
    y = _oracle(model, "blk.0.h", "f32")
    ld = 70
    buf = np.full((3, ld), np.nan, np.float32)
    buf[:, :64] = y
    dump = tmp_path / "p.bin"
    dump.write_bytes(buf.reshape(-1)[:2 * ld + 64].tobytes())     # (rows-1)*ld + cols
    assert run_compare(model, "blk.0.h", dump, "f32", 0, None, ld) == 0
    assert "EQUAL" in capsys.readouterr().out
    h = f"{hash_array(y):016x}"
    assert run_compare(model, "blk.0.h", None, "f32", hash_hex=h) == 0
    assert run_compare(model, "blk.0.h", None, "f32", hash_hex="0x" + "1" * 16) == 1


def test_compare_nan_encodings_count_as_equal(model, tmp_path):
    # block 1 of "nan.q8" has d = NaN: the oracle writes the canonical NaN,
    # another engine may write any NaN; equality is on canonical bits
    y = _oracle(model, "nan.q8", "f32")
    assert (y.view(np.uint32)[0, 32:64] == 0x7FFFFFFF).all()
    other = y.copy()
    other.view(np.uint32)[0, 32:64] = 0xFFC00000
    dump = tmp_path / "n.bin"
    dump.write_bytes(other.tobytes())
    rep = golden.compare_dump(model, "nan.q8", dump, "f32")
    assert rep["equal"] and rep["nan_encoding_diffs"] == 32 and rep["n_diff"] == 0
    other.view(np.uint32)[0, 40] = 0x3F800000     # a number where the oracle has NaN
    dump.write_bytes(other.tobytes())
    rep = golden.compare_dump(model, "nan.q8", dump, "f32")
    assert rep["n_diff"] == 1 and rep["nan_vs_number"] == 1 and rep["max_ulp"] is None


def test_compare_bad_input(model, tmp_path, capsys):
    dump = tmp_path / "x.bin"
    dump.write_bytes(b"\0" * 10)
    assert run_compare(model, "nope", dump) == 2
    assert "no tensor 'nope'" in capsys.readouterr().err
    assert run_compare(model, "norm", dump) == 2           # 2.5 f32 values
    dump.write_bytes(b"\0" * 4 * 41)
    assert run_compare(model, "norm", dump) == 2           # 41 values, cols 40
    assert run_compare(model, "blk.0.w", None, "f32", 0, None, None, None) == 2
    assert run_compare(model, "norm", dump, "f64") == 2
    assert run_compare(model, "norm", None, "f32", 5, None, None, "00") == 2
    assert run_compare(tmp_path / "missing.gguf", "norm", dump) == 2
    assert "no such file" in capsys.readouterr().err
    # each bad input names itself
    for args, kw, text in [
            (("norm", tmp_path / "none.bin"), {}, "cannot read the dump"),
            (("norm", tmp_path / "empty.bin"), {}, "is empty"),
            (("norm", None, "f32"), {"hash_hex": "-5"}, "is negative"),
            (("norm", None, "f32"), {"hash_hex": "1" * 17}, "wider than 64 bits"),
            (("norm", None, "f32"), {"hash_hex": "00", "ld": 48}, "no meaning with --hash"),
            (("blk.0.w", dump, "f32"), {"rows": 0}, "at least one row"),
            (("blk.0.w", dump, "f32"), {"rows": -3}, "at least one row")]:
        (tmp_path / "empty.bin").write_bytes(b"")
        assert run_compare(model, *args, **kw) == 2, text
        assert text in capsys.readouterr().err


@pytest.mark.slow
def test_real_model_flipped_bit_is_found(tmp_path):
    from strata_ref.models import ModelError, resolve
    try:
        p = resolve("SmolLM2-135M-Instruct", fetch_missing=False)
    except ModelError:
        pytest.skip("SmolLM2-135M-Instruct is not in the cache")
    from strata_ref.gguf import read
    t = next(t for t in read(p).tensors if t.type not in (T.F32,) and t.rows >= 8)
    y = _oracle(p, t.name, "f32", rows=8)
    bits = y.copy().view(np.uint32).reshape(-1)
    bits[12345 % bits.size] ^= 1 << 30
    dump = tmp_path / "real.bin"
    dump.write_bytes(bits.tobytes())
    rep = golden.compare_dump(p, t.name, dump, "f32", rows=8)
    assert rep["n_diff"] == 1 and rep["first_diff"]["index"] == 12345 % bits.size


# ------------------------------------------------------------------ compare: the dump's size (issue 16)

def test_compare_dump_one_row_short_is_refused(model, tmp_path, capsys):
    # it used to compare the 2 rows it held and say EQUAL
    y = _oracle(model, "blk.0.h", "f32")
    dump = tmp_path / "short.bin"
    dump.write_bytes(y[:2].tobytes())
    assert run_compare(model, "blk.0.h", dump) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"strata-ref: error: the dump {dump} has 512 bytes, but rows [0, 3) of 'blk.0.h' in f32 "
        "take 768 bytes (64 values a row); its size fits --dtype f32 --rows 2"]
    # the rows asked for are compared, and only those
    rep = golden.compare_dump(model, "blk.0.h", dump, rows=2)
    assert rep["equal"] and rep["rows"] == 2 and rep["n_values"] == 128


@pytest.mark.parametrize("dump_dtype, flag, fits", [
    ("f16", "f32", "--dtype f32 --rows 1 or --dtype f16 or --dtype bf16"),
    ("f32", "f16", "--dtype f32"),
    ("f32", "bf16", "--dtype f32"),
])
def test_compare_dump_of_another_dtype_names_the_dtype(model, tmp_path, capsys, dump_dtype, flag, fits):
    # f16 read as f32 was DIFFERENT with a max ulp of 2e9; f32 read as f16
    # failed on rows outside the tensor
    dump = tmp_path / "d.bin"
    dump.write_bytes(_oracle(model, "blk.0.h", dump_dtype, rows=2).tobytes())
    assert run_compare(model, "blk.0.h", dump, flag, 0, 2) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith(f"its size fits {fits}")


def test_compare_values_that_differ_mention_a_size_that_fits_another_dtype(model, tmp_path, capsys):
    # 2 rows of f16 have the size of 1 row of f32: compared, DIFFERENT, with a note
    dump = tmp_path / "h.bin"
    dump.write_bytes(_oracle(model, "blk.0.h", "f16", rows=2).tobytes())
    assert run_compare(model, "blk.0.h", dump, "f32", 0, 1) == 1
    out = capsys.readouterr().out
    assert "note: the dump's size also fits --dtype f16 --rows 2 or --dtype bf16 --rows 2" in out
    assert out.rstrip().endswith("DIFFERENT")


def test_compare_refuses_devices_pipes_and_directories_without_reading(model, tmp_path, capsys):
    import threading
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for dump in ("/dev/zero", fifo, tmp_path):
        done = []
        th = threading.Thread(target=lambda: done.append(run_compare(model, "norm", dump)),
                              daemon=True)
        th.start()
        th.join(20)          # a FIFO without a writer blocked forever; /dev/zero never ended
        assert done == [2], dump
        assert capsys.readouterr().err.splitlines() == [
            f"strata-ref: error: the dump {dump} is not a regular file (a pipe, device or "
            "directory): write the dump to a file first"]


def test_compare_huge_dump_is_refused_by_its_size(model, tmp_path, capsys):
    # a sparse 1 TiB file: its size is known, nothing of it is read
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(1 << 40)
    assert run_compare(model, "norm", big) == 2
    err = capsys.readouterr().err
    assert f"has {1 << 40} bytes, but rows [0, 1) of 'norm' in f32 take 160 bytes" in err


def test_compare_plain_and_empty_tensors_are_named(tmp_path, capsys):
    p = tmp_path / "plain.gguf"
    write_gguf(p, {}, [("ids", T.I32, (8,), np.arange(8, dtype=np.int32)),
                       ("none", T.F32, (16, 0), np.zeros(0, np.float32))])
    dump = tmp_path / "d.bin"
    dump.write_bytes(bytes(32))
    assert run_compare(p, "ids", dump) == 2
    assert run_compare(p, "none", dump) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: tensor 'ids' is I32, a plain array of i32 values, not a float format: "
        "there is no f32/f16/bf16 output to compare",
        "strata-ref: error: tensor 'none' is empty (shape [16, 0]): there is nothing to compare"]


# ------------------------------------------------------------------ golden make / check: before and during (issue 16)

@pytest.mark.parametrize("where", ["proc", "file", "file/sub"])
def test_golden_make_checks_its_directory_first(tmp_path, capsys, monkeypatch, where):
    # it used to compute the corpus for three minutes, then fail to write
    import time
    if where == "proc":
        if not os.path.isdir("/proc/self"):
            pytest.skip("no /proc")
        d, why = Path("/proc/strata-ref-nope"), "No such file or directory"
    else:
        (tmp_path / "file").write_text("x")
        d, why = tmp_path / where, "a file, not a directory, is in the way"
    monkeypatch.setattr(golden, "make_corpus", lambda *a, **k: pytest.fail("computed first"))
    t0 = time.monotonic()
    assert run_golden_make(d) == 2
    assert time.monotonic() - t0 < 5
    assert capsys.readouterr().err.splitlines() == [
        f"strata-ref: error: cannot write golden files into {d}: {why}"]


def test_check_corpus_reports_progress_per_case(tmp_path):
    p = tmp_path / "corpus.json"
    golden.make_corpus(p, types=[T.Q8_0])
    seen = []
    rows, ok = golden.check_corpus(p, types=[T.Q8_0], progress=seen.append)
    assert ok and len(seen) == len(rows) == len(golden.corpus_cases([T.Q8_0]))
    assert [c.name for c in seen] == [r["name"] for r in rows]


def test_golden_files_that_are_no_golden_files(tmp_path, capsys):
    import threading
    head = {"format": "strata-ref golden", "format_version": golden.FORMAT_VERSION}
    p = tmp_path / "g.json"
    p.write_text(json.dumps({**head, "cases": [{"type": "F32"}]}))
    with pytest.raises(ValueError, match=r"cases\[0\] has no \"name\" string"):
        golden.check_corpus(p)
    p.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=r"is not UTF-8 text"):
        golden.check_corpus(p)
    # a FIFO in place of corpus.json blocked `golden check` forever
    d = tmp_path / "fifo"
    d.mkdir()
    os.mkfifo(d / "corpus.json")
    done = []
    th = threading.Thread(target=lambda: done.append(run_golden_check(d)), daemon=True)
    th.start()
    th.join(20)
    assert done == [2]
    assert capsys.readouterr().err.splitlines() == [
        f"strata-ref: error: {d / 'corpus.json'} is not a regular file"]


def test_model_golden_file_without_tensors_fails_not_crashes(model, tmp_path):
    from strata_ref.models import sha256_file
    g = tmp_path / "m.json"
    g.write_text(json.dumps({"format": "strata-ref golden", "format_version": golden.FORMAT_VERSION,
                             "sha256": sha256_file(model)}))
    rows, ok = golden.check_model_golden(model, g)
    assert not ok and {r["status"] for r in rows} == {"new"} and len(rows) == 4


def test_model_golden_files_of_format_1_still_check(tmp_path):
    # format 1 chained the output bytes of every tensor into one FNV state;
    # such files, made by users with an older strata-ref, keep verifying
    from _split import write_mixed

    from strata_ref.dequant import dequant
    from strata_ref.gguf import read
    from strata_ref.hashing import FNV64_OFFSET, canonical_bytes, fnv1a64
    p = write_mixed(tmp_path / "m.gguf")[0]
    doc = golden.make_model_golden(p, tmp_path / "v2.json")
    assert doc["format_version"] == golden.MODEL_FORMAT_VERSION == 2
    chain = {}
    for k in golden.OUT_KINDS:
        h = FNV64_OFFSET
        for t in read(p).tensors:
            if t.type in (T.I32,):
                out = np.asarray(t.data).view("<i4")
            else:
                out = dequant(t.type, t.data, t.rows, t.cols, out_dtype=k)
            h = fnv1a64(canonical_bytes(out), h)
        chain[k] = f"{h:016x}"
    assert chain != doc["chained"]
    v1 = {**doc, "format_version": 1, "chained": chain}
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    rows, ok = golden.check_model_golden(p, tmp_path / "v1.json")
    assert ok and len(rows) == len(doc["tensors"])
    v1["chained"] = doc["chained"]                  # a format-2 chain in a format-1 file
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    rows, ok = golden.check_model_golden(p, tmp_path / "v1.json")
    assert not ok and rows[-1]["name"] == "(chained)"
    (tmp_path / "v3.json").write_text(json.dumps({**doc, "format_version": 3}))
    with pytest.raises(ValueError, match="format version 1 or 2"):
        golden.check_model_golden(p, tmp_path / "v3.json")
