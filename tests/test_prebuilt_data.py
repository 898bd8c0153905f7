"""The reference data of prebuilt llama.cpp, checked on itself.

tests/data/v0.4.0-<variant>/ holds, per model, the logits of node-llama-cpp
3.21.1's shipped libraries (llama.cpp v0.4.0) with one CPU variant forced,
made by `python tools/prebuilt_ref.py` (docs/prebuilt.md). These tests need
nothing but the stored files:

* each file says what it is (its variant's library was the one loaded, the
  settings of the run, flash attention as its name says), its arrays have
  the shapes of its prompt and continuation, its stored top-k rows agree with
  its whole-row argmax, and the greedy continuation is the argmax of the
  incremental rows (what the driver fed back);
* flash attention `auto` gave the rows of `on` (SmolLM2, every variant);
* the alias classes of docs/prebuilt.md: variants listed as one class have
  equal row hashes (every logit of every row, both passes) and equal greedy
  ids for every stored model, flash attention on and off; two different
  classes differ on at least one stored model, so each needs its own
  profile.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data"
VERSION = "v0.4.0"
DIRS = sorted(p for p in DATA.glob(f"{VERSION}-*") if p.is_dir())
FILES = sorted(f for d in DIRS for f in d.glob("llama_ref_*.npz"))

#: docs/prebuilt.md "Alias classes": the variants of one class give the same
#: bits for every model stored; the first of each is its representative
CLASSES = (
    ("x64",),
    ("sse42",),
    ("sandybridge",),
    ("ivybridge",),
    ("piledriver",),
    ("haswell", "alderlake"),
    ("skylakex", "cannonlake", "cascadelake", "icelake"),
    ("cooperlake", "zen4"),
    ("sapphirerapids",),
)


def _variant(path: Path) -> str:
    return path.parent.name[len(VERSION) + 1:]


def _stem(path: Path) -> tuple:
    """(model, flash attention) of a stored file name."""
    name = path.stem[len("llama_ref_"):]
    return (name[:-3], True) if name.endswith("-fa") else (name, False)


def test_there_is_data():
    # the tool writes both flash attention settings of every model it ran
    assert DIRS, "no tests/data/v0.4.0-* folders"
    for d in DIRS:
        names = {f.name for f in d.glob("llama_ref_*.npz")}
        for n in names:
            twin = n.replace("-fa.npz", ".npz") if n.endswith("-fa.npz") else n.replace(".npz", "-fa.npz")
            assert twin in names, (d.name, n)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_file_is_consistent(path):
    r = np.load(path)
    variant = _variant(path)
    model, fa = _stem(path)
    assert str(r["profile"]) == path.parent.name
    assert str(r["variant"]) == variant
    assert str(r["cpu_library"]) == f"libggml-cpu-{variant}.so"
    assert bool(r["flash_attn"]) == fa
    assert (int(r["n_ctx"]), int(r["n_batch"]), int(r["n_ubatch"]), int(r["n_threads"])) == (512, 512, 512, 2)
    assert (str(r["type_k"]), str(r["type_v"])) == ("f16", "f16")
    p, g = r["prompt_ids"], r["greedy_ids"]
    n = p.size + g.size
    assert int(r["n_prompt"]) == p.size
    expected_fa = "enabled" if fa else "disabled"
    assert expected_fa in str(r["fa_log"])
    k = int(r["topk"])
    for kind in ("batched", "incr"):
        assert r[f"{kind}_hash"].shape == (n,) and r[f"{kind}_hash"].dtype == np.uint64
        top1 = r[f"{kind}_top1"]
        assert top1.shape == (n,) and (top1 >= 0).all() and (top1 < int(r["n_vocab"])).all()
        ids, vals, lse = r[f"{kind}_ids"], r[f"{kind}_logits"], r[f"{kind}_lse"]
        assert ids.shape == vals.shape == (n, k)
        # top-k sorted by logit, ties by id: the first is the whole row's argmax
        assert np.array_equal(ids[:, 0], top1)
        assert (np.diff(vals, axis=1) <= 0).all()
        # the log-sum-exp over the vocabulary is above the largest logit
        assert (lse >= vals[:, 0]).all() and (lse <= vals[:, 0] + np.log(int(r["n_vocab"]))).all()
    # the incremental pass fed back its own argmax
    assert np.array_equal(r["incr_top1"][p.size - 1:n - 1], g)
    # both passes see the same ids; the batched argmax at the last prompt
    # position picks the first greedy token too unless the two passes differ
    # there (they are compared bit for bit elsewhere)
    if r["batched_hash"][p.size - 1] == r["incr_hash"][p.size - 1]:
        assert r["batched_top1"][p.size - 1] == g[0]


@pytest.mark.parametrize("path", [f for f in FILES if _stem(f) == ("SmolLM2-135M-Instruct", True)],
                         ids=lambda p: p.parent.name)
def test_flash_attention_auto_is_on(path):
    # flash attention `auto` resolves to on for the CPU and gives on's rows
    note = str(np.load(path)["fa_auto"])
    assert "Flash Attention enabled" in note
    assert note.endswith("rows equal to flash_attn on: True")


@functools.lru_cache(maxsize=None)
def _signature(path: Path) -> tuple:
    r = np.load(path)
    return (r["batched_hash"].tobytes(), r["incr_hash"].tobytes(), r["greedy_ids"].tobytes())


def _by_model() -> dict:
    """{(model, fa): {variant: path}}"""
    out = {}
    for f in FILES:
        out.setdefault(_stem(f), {})[_variant(f)] = f
    return out


def test_classes_cover_the_14_variants():
    names = [v for c in CLASSES for v in c]
    assert sorted(names) == sorted(set(names)) and len(names) == 14


@pytest.mark.parametrize("cls", [c for c in CLASSES if len(c) > 1], ids=lambda c: "=".join(c))
def test_alias_class_gives_the_same_bits(cls):
    # every model stored for two variants of one class: equal rows, both passes
    compared = 0
    for (model, fa), files in _by_model().items():
        have = [v for v in cls if v in files]
        for v in have[1:]:
            assert _signature(files[v]) == _signature(files[have[0]]), (model, fa, have[0], v)
            compared += 1
    assert compared > 0


def test_classes_differ_from_each_other():
    # each pair of classes differs on at least one stored (model, fa)
    by_model = _by_model()
    reps = [c[0] for c in CLASSES]
    for i, a in enumerate(reps):
        for b in reps[i + 1:]:
            differ = [key for key, files in by_model.items()
                      if a in files and b in files and _signature(files[a]) != _signature(files[b])]
            assert differ, f"{a} and {b} give the same bits for every stored model"
