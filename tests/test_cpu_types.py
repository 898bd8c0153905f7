"""Every weight type's mat-mul in every CPU profile against ggml's own.

tests/data/<profile>/ggml_mm.npz holds, per weight type, a 40 x 512 matrix of
random valid blocks, activations of n = 1, 2, 3, 4, 8 and 13 rows, and
y = ggml_mul_mat(W, x) computed by the llama.cpp build of that profile
(`python tools/ggml_mm.py --profile P`, ggml's graph API through ctypes, 2
threads): its vec_dot (one row), llamafile (two or more rows) and tiled
(eight or more rows) paths, in a plain CPU buffer (the repacked layouts are
checked on whole models, tests/test_cpu_profiles.py). Each result must be
equal bit for bit.

tests/data/v0.4.0-<variant>/ggml_mm.npz hold the same products computed by
node-llama-cpp 3.21.1's prebuilt llama.cpp v0.4.0 library of that variant
(`python tools/ggml_mm.py --prebuilt VARIANT`), for the v0.4.0 profiles
with AVX2 (there K-quants take their `vec_dot` at every n, no tiled
mat-mul, and I-quants v0.4.0's IQ panel gemm from n = 8, iqp.cpp) and for
those without (sse42's SSSE3 `vec_dot`s, sandybridge / ivybridge /
piledriver's AVX ones, with and without FMA: every weight type).
"""
from __future__ import annotations

import numpy as np
import pytest

from infer_helpers import DATA, profile_files
from strata_ref import GGMLType, cpu
from strata_ref.cpu.matmul import QMatrix

TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q1_0", "Q2_0", "MXFP4",
         "NVFP4", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S",
         "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS", "TQ1_0", "TQ2_0")
#: types whose profile kernels are not written yet (an entry here is work left)
PENDING = frozenset(TYPES) - {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                              "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                              "IQ1_S", "IQ1_M", "IQ4_XS", "F32", "F16", "BF16", "Q1_0", "Q2_0",
                              "MXFP4", "NVFP4", "IQ4_NL", "TQ1_0", "TQ2_0"}

#: (profile, path) of every stored ggml_mm.npz: the 0.3.36 profiles' and
#: the v0.4.0 ones'
FILES = [p.values for p in profile_files("ggml_mm.npz")] + [
    (n, DATA / n / "ggml_mm.npz") for n, p in cpu.PROFILES.items()
    if p.version == cpu.profiles.V0_4_0 and (DATA / n / "ggml_mm.npz").is_file()]
CASES = [pytest.param(t, prof, path, id=f"{t}-{prof}") for prof, path in FILES for t in TYPES]
_DATA = {}


def _data(path):
    if path not in _DATA:
        _DATA[path] = np.load(path)
    return _DATA[path]


@pytest.mark.parametrize("t, profile, path", CASES)
def test_matmul_is_ggml_bits(t, profile, path):
    if t in PENDING:
        pytest.skip(f"{t}: profile kernels not written yet")
    v = _data(path)
    assert str(v["profile"]) == profile
    rows, cols = int(v["rows"]), int(v["cols"])
    w = QMatrix(GGMLType[t], v[f"{t}_w"], rows, cols, t, profile)
    w.repackable = False         # ggml's graph API kept the plain layout
    for n in v["ns"]:
        y = w.matmul(v[f"x{n}"])
        want = v[f"{t}_y{n}"]
        bad = np.flatnonzero(y.view(np.uint32) != want.view(np.uint32))
        assert bad.size == 0, (f"{t} {profile} n={n}: {bad.size} of {y.size} differ, first at "
                               f"{np.unravel_index(bad[0], y.shape)}: {y.flat[bad[0]]!r} vs "
                               f"{want.flat[bad[0]]!r}")


def test_v0_4_0_files_are_the_simd_variants():
    # every v0.4.0 variant with its own SIMD code, each file from its own
    # library: the builds without AVX2 (their SSSE3 / AVX vec_dots) and the
    # IQ panel gemm's three (x64 is the scalar profile's generic C,
    # sapphirerapids' AMX products are tests/test_cpu_amx.py's)
    v040 = [(prof, path) for prof, path in FILES if prof.startswith("v0.4.0-")]
    assert [prof for prof, _ in v040] == ["v0.4.0-sse42", "v0.4.0-sandybridge", "v0.4.0-ivybridge",
                                          "v0.4.0-piledriver", "v0.4.0-haswell", "v0.4.0-skylakex",
                                          "v0.4.0-zen4"]
    for prof, path in v040:
        v = _data(path)
        assert str(v["command"]) == f"python tools/ggml_mm.py --prebuilt {prof.removeprefix('v0.4.0-')}"
        assert {k[:-2] for k in v.files if k.endswith("_w")} == set(TYPES)


def test_every_profile_covers_every_type():
    files = profile_files("ggml_mm.npz")
    assert len(files) == 3
    for p in files:
        v = _data(p.values[1])
        assert {k[:-2] for k in v.files if k.endswith("_w")} == set(TYPES)
