"""ggml's own MoE operations in every CPU profile, bit for bit.

tests/data/<profile>/ggml_moe_ops.npz (`python tools/ggml_moe_ops.py
--profile P`, ggml's graph API through ctypes on the peer built for P, 2
threads) holds `ggml_argsort` of rows full of ties, and `ggml_mul_mat_id`
of random expert weights with experts getting 0, 1, 3, 7, 8 and 13 routed
rows (vec_dot below 8, the tiled kernel from 8 for the types that have it,
never tinyBLAS), in a plain CPU buffer (the repacked layouts are checked on
whole models, tests/test_infer_moe.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from infer_helpers import profile_files
from strata_ref import GGMLType
from strata_ref.cpu import moe as cmoe
from strata_ref.cpu.traits import TRAITS

_DATA = {}


def _data(path):
    if path not in _DATA:
        _DATA[path] = np.load(path)
    return _DATA[path]


def _types(path):
    return [k[:-2] for k in _data(path).files if k.endswith("_w")]


@pytest.mark.parametrize("profile, path", profile_files("ggml_moe_ops.npz"))
def test_argsort_is_ggml_order(profile, path):
    v = _data(path)
    assert str(v["profile"]) == profile
    sizes = sorted(int(k.split("_")[1]) for k in v.files if k.startswith("sort_") and k.endswith("_x"))
    assert 8 in sizes and max(sizes) > 16          # insertion sort alone, and introsort
    for n in sizes:
        got = cmoe.argsort_desc(v[f"sort_{n}_x"])
        want = v[f"sort_{n}_idx"]
        bad = np.flatnonzero((got != want).any(axis=1))
        assert bad.size == 0, f"n={n}: rows {bad.tolist()} differ from ggml's order"


CASES = [pytest.param(t, *p.values, id=f"{t}-{p.values[0]}")
         for p in profile_files("ggml_moe_ops.npz") for t in _types(p.values[1])]


@pytest.mark.parametrize("t, profile, path", CASES)
def test_mul_mat_id_is_ggml_bits(t, profile, path):
    tt = GGMLType[t]
    if tt not in TRAITS:
        pytest.skip(f"{t}: profile kernels not written yet")
    v = _data(path)
    E, R, C = int(v["n_expert"]), int(v["rows"]), int(v["cols"])
    em = cmoe.ExpertMatrix(tt, v[f"{t}_w"], E, R, C, t, profile)
    for q in em.experts:
        q.repackable = False         # ggml's graph API kept the plain layout
    x = v["mmid_x16"].astype(np.float32)[:, None, :]
    ids = v["mmid_ids"]
    assert sorted(np.bincount(ids.ravel(), minlength=E).tolist()) == sorted(v["routed"].tolist())
    y = em.mul_mat_id(x, ids)
    want = v[f"{t}_y"]
    bad = np.flatnonzero(y.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (f"{t} {profile}: {bad.size} of {y.size} differ, first at "
                           f"{np.unravel_index(bad[0], y.shape)}")
