"""The arm64 reference data (tests/data/<variant>/, made under qemu by
`python tools/arm_ref.py data`) is what the x86 profiles' tests read, made
from the same models.

For every ARM variant directory: each file has the keys of its x86
counterpart (tests/data/avx2/, made by tools/llama_ref.py, tools/ggml_mm.py,
tools/llama_ref_iq.py) and names its variant and build; llama.cpp's greedy
continuation is the argmax of its own incremental rows; the models the runs
read the same model files as the x86 runs (whose sha256 the x86 tests check
against the models they rebuild).
"""
from __future__ import annotations

import numpy as np
import pytest

from infer_helpers import DATA

#: the ARM builds of tools/arm_ref.py (VARIANTS), by profile name
ARM = ("armv8.0", "armv8.2-dotprod", "armv8.2-fp16", "armv8.6-i8mm", "sve256", "sve128")
#: keys only the ARM files have: the build (tools/arm_ref.py `provenance`),
#: the whole-row hashes of the registry logits files, and the model's sha256
#: (the x86 registry files predate that key)
ARM_EXTRA = {"cmake_args", "qemu_cpu", "sve_bytes", "repack", "ggml_cpu_info", "batched_hash",
             "incr_hash", "sha256"}


def _files():
    return [pytest.param(v, p, id=f"{v}-{p.stem}") for v in ARM if (DATA / v).is_dir()
            for p in sorted((DATA / v).glob("*.npz"))]


def test_every_arm_variant_has_data():
    # a variant without files would silently thin the checks below
    missing = [v for v in ARM if not (DATA / v).is_dir()]
    assert not missing, missing


@pytest.mark.parametrize("variant, path", _files())
def test_file_has_the_x86_layout_and_names_its_build(variant, path):
    ref = np.load(path)
    x86 = DATA / "avx2" / path.name
    if x86.is_file():
        want = set(np.load(x86).files) - {"sha256"}
        if "configs" in ref.files:
            # a KV-cache file: the ARM builds ran a subset of the x86
            # configurations (tools/arm_ref.py `_kv_arm`: all of them since 2026-12-07), each with every key
            run = {str(c) for c in ref["configs"]}
            assert run <= {str(c) for c in np.load(x86)["configs"]}
            want = {k for k in want if ":" not in k or k.split(":")[0] in run}
        assert set(ref.files) - ARM_EXTRA == want, sorted((set(ref.files) - ARM_EXTRA) ^ want)
    assert {"cmake_args", "qemu_cpu", "sve_bytes", "repack"} <= set(ref.files)
    assert str(ref["profile"]) == variant
    assert str(ref["llama_cpp_version"]) == "0.3.36"
    assert "-DGGML_CPU_ARM_ARCH=" in str(ref["cmake_args"])
    assert "NEON = 1" in str(ref["system_info"]) or "ggml_cpu_info" in ref.files
    sve = int(ref["sve_bytes"])
    assert sve == {"sve256": 32, "sve128": 16}.get(variant, 0)


@pytest.mark.parametrize("variant, path", [p for p in _files() if p.values[1].name.startswith("llama_ref_")
                                           and "greedy_ids" in np.load(p.values[1]).files])
def test_greedy_ids_are_the_argmax_of_the_incremental_rows(variant, path):
    ref = np.load(path)
    n = len(ref["prompt_ids"])
    greedy = ref["greedy_ids"].tolist()
    if "incr" in ref.files:   # every logit stored
        top = np.argmax(ref["incr"], axis=1)
    else:                     # top-k ids, stable order: column 0 is the argmax
        top = ref["incr_ids"][:, 0]
    assert top[n - 1:n - 1 + len(greedy)].tolist() == greedy


@pytest.mark.parametrize("variant, path", _files())
def test_runs_used_the_models_the_x86_data_was_made_from(variant, path):
    # the x86 files' sha256 are checked against the models the tests rebuild
    # (test_cpu_profiles.py, test_infer_moe.py, ...); the ARM runs must have
    # read the same files
    ref = np.load(path)
    x86 = DATA / "avx2" / path.name
    other = np.load(x86) if x86.is_file() else None
    keys = [k for k in ref.files if (k == "sha256" or k.endswith("_sha256"))
            and other is not None and k in other.files]
    if not keys:
        pytest.skip("no model hash to compare")
    assert {k: str(ref[k]) for k in keys} == {k: str(other[k]) for k in keys}
