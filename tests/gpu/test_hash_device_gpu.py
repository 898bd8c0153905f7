"""`strata-ref hash --device cuda` on a real GPU and real tensors: the device
hashes (per tensor and chained, f32, f16 and bf16) equal the NumPy oracle's
for the generic, the wide and the auto kernels, in one chunk per tensor and
cut into chunks; SmolLM2's tensors also equal their golden hashes; the CLI
prints the oracle's stdout and `--compare` finds every output equal.

The file of real tensors is $STRATA_REF_REAL_GGUF (written by
tools/make_real_gguf.py and carried to a GPU machine without a registry),
else it is written from the registry models when both are cached; without
either the tests skip, as they do without a GPU."""
import importlib.util
import json
import os
from pathlib import Path

import pytest

import strata_ref.native as native

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
OUTS = ("f32", "f16", "bf16")


def _skip_without_gpu():
    why = native.unavailable_reason()
    if why:
        pytest.skip(f"native path unavailable: {why}")


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory):
    _skip_without_gpu()          # before any oracle work
    env = os.environ.get("STRATA_REF_REAL_GGUF")
    if env:
        return Path(env)
    from strata_ref.models import REGISTRY, cached_path
    if not all(cached_path(m) for m in REGISTRY.values()):
        pytest.skip("no file of real tensors: set STRATA_REF_REAL_GGUF or fetch the "
                    "registry models (strata-ref models fetch NAME)")
    spec = importlib.util.spec_from_file_location("make_real_gguf",
                                                  ROOT / "tools" / "make_real_gguf.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    path = tmp_path_factory.mktemp("real") / "real-tensors.gguf"
    assert tool.main([str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def oracle(real_gguf):
    from strata_ref.gguf import read
    from strata_ref.hashing import chain_hashes, hash_tensor
    f = read(real_gguf)
    per = [hash_tensor(t.type, t.data, t.rows, t.cols, OUTS) for t in f.tensors]
    return per, {d: chain_hashes(h[d] for h in per) for d in OUTS}


@pytest.mark.parametrize("kernel, chunk", [("wide", None), ("generic", None), ("auto", None),
                                           ("wide", 1 << 20)])
def test_device_hashes_are_the_oracles(real_gguf, oracle, kernel, chunk):
    _skip_without_gpu()
    from strata_ref.gguf import read
    from strata_ref.native.dequant.policy import WIDE_BLOCKS_ALIGN
    from strata_ref.native.hash_device import CHUNK_VALUES, hash_tensors_device
    f = read(real_gguf)
    run = hash_tensors_device(f.tensors, OUTS, kernel=kernel, reps=1,
                              chunk_values=chunk or CHUNK_VALUES)
    per, chain = oracle
    for t, want in zip(run.tensors, per):
        assert t.hashes == want, f"{t.name} ({t.type.name}, {t.kernel} kernel)"
    assert run.chained == chain
    for t in run.tensors:
        assert t.kernel in ("wide", "generic")        # every type of the file has a kernel
        assert all(t.time_s[d] > 0 for d in OUTS)
        if kernel == "generic" or t.type not in WIDE_BLOCKS_ALIGN:
            assert t.kernel == "generic"
        elif kernel == "wide":
            assert t.kernel == "wide" and t.peer == "generic"
    assert run.copy_bytes_per_s > 0


def test_smollm2_tensors_keep_their_golden_hashes(real_gguf, oracle):
    _skip_without_gpu()
    from strata_ref.gguf import read
    from strata_ref.native.hash_device import hash_tensors_device
    golden = {t["name"]: t for t in json.loads(
        (ROOT / "golden" / "models" / "SmolLM2-135M-Instruct.json").read_text())["tensors"]}
    f = read(real_gguf)
    run = hash_tensors_device([t for t in f.tensors if t.name.startswith("smollm2.")], OUTS,
                              kernel="wide", reps=1)
    assert run.tensors
    for t in run.tensors:
        g = golden[t.name.removeprefix("smollm2.")]
        assert {d: f"{t.hashes[d]:016x}" for d in OUTS} == {d: g[d] for d in OUTS}, t.name


def test_cli_prints_the_oracles_stdout_and_compare_passes(real_gguf, capsys):
    _skip_without_gpu()
    from strata_ref.cli import main
    assert main(["hash", str(real_gguf), "--no-progress"]) == 0
    cpu = capsys.readouterr().out
    assert main(["hash", str(real_gguf), "--no-progress", "--device", "cuda",
                 "--kernel", "wide"]) == 0
    cap = capsys.readouterr()
    assert cap.out == cpu
    assert "kernel time per output dtype" in cap.err and "wide/generic" in cap.err
    assert main(["hash", str(real_gguf), "--no-progress", "--device", "cuda", "--compare"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "equal the oracle bit for bit" in out[-2]
    assert not any("DIFFERENT" in ln for ln in out)
