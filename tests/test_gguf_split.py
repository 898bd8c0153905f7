"""gguf-split sets: one model from any shard or its directory, the split keys
checked, and every command giving the numbers of the unsplit file."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from _split import MIXED, resplit, write_mixed

from strata_ref import gguf
from strata_ref.cli import main
from strata_ref.gguf import GGUFError, GGUFValueType as V
from strata_ref.hashing import chain_hashes, hash_array, hash_model
from strata_ref.types import GGMLType as T

# gguf-py's split options, each cutting the 8 tensors at other points;
# small_first_shard puts the metadata alone into a first shard of no tensors.
SPLITS = [dict(split_max_tensors=1), dict(split_max_tensors=3),
          dict(split_max_tensors=5, small_first_shard=True), dict(split_max_size=3000)]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return write_mixed(tmp_path_factory.mktemp("whole") / "mixed.gguf")[0]


def _split(tmp_path, **opts):
    d = tmp_path / "set"
    d.mkdir()
    return write_mixed(d / "mixed.gguf", **opts)


def _table(f):
    return [(t.name, t.type, t.shape, t.n_bytes, bytes(t.data)) for t in f.tensors]


@pytest.mark.parametrize("opts", SPLITS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_any_shard_or_directory_opens_the_whole_model(whole, tmp_path, opts):
    shards = _split(tmp_path, **opts)
    assert len(shards) > 1
    ref = gguf.read(whole)
    want = _table(ref)
    for p in shards + [shards[0].parent]:
        f = gguf.read(p)
        assert isinstance(f, gguf.GGUFSplit)
        assert f.path == str(shards[0]) and [s.path for s in f.shards] == [str(s) for s in shards]
        assert _table(f) == want            # shard order, then file order
        assert f.metadata["general.name"] == "mixed" and f.get("split.count") == len(shards)
        assert f.tensor("output.weight").n_bytes == ref.tensor("output.weight").n_bytes
        assert f.shard_of("output.weight").path == str(shards[-1])
        assert f.file_size == sum(s.stat().st_size for s in shards)
    # only the first shard carries the architecture (gguf-py, like llama.cpp)
    assert "general.architecture" not in gguf.read_file(shards[-1]).metadata


@pytest.mark.parametrize("opts", SPLITS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_split_model_hashes_as_the_unsplit_file(whole, tmp_path, opts):
    shards = _split(tmp_path, **opts)
    ref = hash_model(gguf.read(whole))
    got = hash_model(gguf.read(shards[len(shards) // 2]))
    assert [(t.name, t.hashes) for t in got.tensors] == [(t.name, t.hashes) for t in ref.tensors]
    assert got.chained == ref.chained
    assert got.shards == [str(s) for s in shards]
    # the tensor hashes are those of the dequantized output; the chain is over them
    from strata_ref.dequant import dequant_bf16
    t = gguf.read(whole).tensor("blk.0.attn_q.weight")
    assert ref.tensors[2].hashes["bf16"] == hash_array(dequant_bf16(t.type, t.data, t.rows, t.cols))
    assert ref.chained["f16"] == chain_hashes(r.hashes["f16"] for r in ref.tensors)


def test_cli_hash_on_a_shard_prints_the_unsplit_numbers(whole, tmp_path, capsys):
    shards = _split(tmp_path, split_max_tensors=3)
    assert main(["hash", str(whole), "--no-progress", "--jobs", "1"]) == 0
    ref = capsys.readouterr().out.splitlines()
    assert main(["hash", str(shards[1]), "--no-progress", "--jobs", "2"]) == 0
    got = capsys.readouterr().out.splitlines()
    assert got[:-2] == ref[:-1]                 # header and one line per tensor
    assert got[-2] == "split set: 3 shards, mixed-00001-of-00003.gguf ... mixed-00003-of-00003.gguf"
    assert got[-1].split(":", 1)[1] == ref[-1].split(":", 1)[1]
    assert got[-1].startswith(f"chained ({len(MIXED)} tensors, shard order, then file order)")
    assert main(["hash", str(shards[0].parent), "--json", "--no-progress", "--jobs", "1",
                 "--out", "f32"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["shards"] == [str(s) for s in shards] and len(doc["tensors"]) == len(MIXED)
    assert doc["chained"]["f32"] == ref[-1].split("f32=")[1].split()[0]


def test_cli_info_and_compare_on_a_split_model(whole, tmp_path, capsys):
    shards = _split(tmp_path, split_max_tensors=3)
    assert main(["info", str(shards[2])]) == 0
    out = capsys.readouterr().out
    assert f"{len(MIXED)} tensors" in out.splitlines()[1]
    assert "split set of 3 shards" in out and "mixed-00003-of-00003.gguf  2 tensors" in out
    assert "general.name = 'mixed'" in out and "split.count = 3" in out
    assert any(line.split()[:2] == ["Q6_K", "1"] for line in out.splitlines())
    # a tensor of the last shard, through the first shard's path
    t = gguf.read(whole).tensor("output.weight")
    from strata_ref.dequant import dequant_f16
    h = hash_array(dequant_f16(t.type, t.data, t.rows, t.cols))
    assert main(["compare", str(shards[0]), "output.weight", "--dtype", "f16",
                 "--hash", f"{h:016x}"]) == 0
    assert "EQUAL" in capsys.readouterr().out


def test_golden_make_and_check_on_a_split_model(whole, tmp_path):
    from strata_ref import golden
    shards = _split(tmp_path, split_max_tensors=3)
    doc = golden.make_model_golden(shards[1], tmp_path / "g.json")
    assert doc["format_version"] == golden.MODEL_FORMAT_VERSION
    assert [s["file"] for s in doc["shards"]] == [s.name for s in shards]
    from strata_ref.models import sha256_file
    assert doc["shards"][2]["sha256"] == sha256_file(shards[2])
    ref = golden.make_model_golden(whole, tmp_path / "w.json")
    assert doc["tensors"] == ref["tensors"] and doc["chained"] == ref["chained"]
    rows, ok = golden.check_model_golden(shards[0].parent, tmp_path / "g.json")
    assert ok and len(rows) == len(MIXED)
    # the golden file of the split set is not the unsplit file's
    rows, ok = golden.check_model_golden(whole, tmp_path / "g.json")
    assert not ok and "is not the golden file's" in rows[0]["detail"]


def test_generate_on_a_split_model_gives_the_unsplit_logits(tmp_path):
    from infer_helpers import TINY_IDS, tiny_model

    from strata_ref.cli.inference import run_generate
    from strata_ref.infer.loader import load
    whole = tmp_path / "tiny.gguf"
    tiny_model("qwen3", whole, seed=0)
    d = tmp_path / "set"
    d.mkdir()
    shards = resplit(whole, d / "tiny.gguf", split_max_tensors=20)
    assert len(shards) == 4
    a, b = load(whole), load(shards[3])
    want = a.forward(TINY_IDS, a.new_cache(64), all_logits=True)
    got = b.forward(TINY_IDS, b.new_cache(64), all_logits=True)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    import io
    outs = []
    for p in (whole, d):
        out = io.StringIO()
        assert run_generate(str(p), "Hello", max_tokens=6, out=out, err=io.StringIO()) == 0
        outs.append(out.getvalue())         # the text alone: the speeds go to err
    assert outs[0] == outs[1] and outs[0].startswith("Hello") and len(outs[0]) > len("Hello\n")


# ------------------------------------------------------------------ broken sets

def _shard(path, no, count, total, names, **keys):
    """Write one hand-made shard: split keys as llama.cpp types them, with
    overrides (a value of None drops the key)."""
    md = {"split.no": (V.UINT16, no), "split.count": (V.UINT16, count),
          "split.tensors.count": (V.INT32, total)}
    for k, v in keys.items():
        md.pop(k.replace("_", "."), None)
        if v is not None:
            md[k.replace("_", ".")] = v
    ts = [(n, T.F32, (4,), np.arange(4, dtype=np.float32) + i) for i, n in enumerate(names)]
    gguf.write_gguf(path, md, ts)


def _set(d, n=3, **per_shard):
    """Shards m-0000k-of-0000n.gguf of tensors a, b, c...; per_shard[k-1] =
    keyword overrides of shard k."""
    d.mkdir(exist_ok=True)
    for k in range(n):
        kw = dict(per_shard.get(f"s{k}", {}))
        names = kw.pop("names", [chr(ord("a") + k)])
        _shard(d / gguf.shard_name("m", k + 1, n), k, n, n, names, **kw)
    return d / "m-00001-of-00003.gguf"


def _error(path) -> GGUFError:
    with pytest.raises(GGUFError) as ei:
        gguf.read(path)
    assert "\n" not in str(ei.value)
    return ei.value


def test_hand_made_set_reads(tmp_path):
    f = gguf.read(_set(tmp_path / "ok"))
    assert [t.name for t in f.tensors] == ["a", "b", "c"]


def test_missing_shard_is_named(tmp_path):
    first = _set(tmp_path / "s")
    os.remove(tmp_path / "s" / "m-00002-of-00003.gguf")
    e = _error(first)
    assert e.path == str(tmp_path / "s" / "m-00002-of-00003.gguf")
    assert "shard 2 of 3 is missing" in str(e)
    assert "shard 2 of 3 is missing" in str(_error(tmp_path / "s"))     # from the directory too


@pytest.mark.parametrize("shard,keys,words", [
    ("s1", {"split_no": (V.UINT16, 2)}, ["split.no is 2, expected 1", "counts from 0"]),
    ("s1", {"split_no": None}, ["shard 2 of 3 has no split.no"]),
    ("s2", {"split_count": (V.UINT16, 4)}, ["split.count is 4", "say 3 shards"]),
    ("s0", {"split_tensors_count": (V.INT32, 4)}, ["split.tensors.count is 4", "hold 3 tensors"]),
    ("s2", {"split_tensors_count": (V.INT32, 2)}, ["split.tensors.count is 2"]),
    ("s0", {"split_tensors_count": None}, ["first shard has no split.tensors.count"]),
    ("s1", {"split_no": (V.STRING, "1")}, ["split.no must be a non-negative integer", "STRING"]),
    ("s2", {"names": ["a"]}, ["tensor 'a' is also in shard 1 (m-00001-of-00003.gguf)"]),
])
def test_broken_split_keys_name_the_shard_and_the_key(tmp_path, shard, keys, words):
    first = _set(tmp_path / "s", **{shard: keys})
    k = int(shard[1:])
    for p in (first, tmp_path / "s" / gguf.shard_name("m", k + 1, 3)):
        e = _error(p)
        msg = str(e)
        for w in words:
            assert w in msg, msg
        assert e.path == str(tmp_path / "s" / gguf.shard_name("m", k + 1, 3)), msg


def test_shard_without_its_names_or_keys(tmp_path):
    d = tmp_path / "s"
    _set(d)
    renamed = tmp_path / "model.gguf"
    os.rename(d / "m-00001-of-00003.gguf", renamed)
    e = _error(renamed)
    assert "split.count is 3, but the file name does not follow" in str(e)
    assert e.offset is not None and f"byte offset {e.offset}" in str(e)
    # a shard's name without split keys: refused, never read as a whole model
    plain = tmp_path / "p" / "x-00001-of-00002.gguf"
    plain.parent.mkdir()
    gguf.write_gguf(plain, {}, [("a", T.F32, (4,), np.zeros(4, np.float32))])
    assert "says shard 1 of 2, but the file has no split.count" in str(_error(plain))
    # the one-shard set llama.cpp's gguf-split writes is a plain model
    one = tmp_path / "p" / "y-00001-of-00001.gguf"
    _shard(one, 0, 1, 1, ["a"])
    assert isinstance(gguf.read(one), gguf.GGUFFile)


def test_directory_must_hold_one_model(tmp_path):
    e = _error(tmp_path)
    assert "holds no .gguf file" in str(e) and e.path == str(tmp_path)
    _set(tmp_path / "s")
    write_mixed(tmp_path / "s" / "other.gguf")
    e = _error(tmp_path / "s")
    assert "holds 2 models (m-*-of-00003.gguf, other.gguf)" in str(e)
    one = tmp_path / "one"
    one.mkdir()
    write_mixed(one / "only.gguf")
    assert gguf.read(one).path == str(one / "only.gguf")


def test_cli_errors_on_broken_sets_are_one_line(tmp_path, capsys):
    first = _set(tmp_path / "s", s1={"split_no": (V.UINT16, 0)})
    assert main(["hash", str(first), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "m-00002-of-00003.gguf: split.no is 0, expected 1" in err
    assert main(["info", str(tmp_path)]) == 2
    assert "holds no .gguf file" in capsys.readouterr().err
