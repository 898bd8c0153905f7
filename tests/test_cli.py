"""The command line on the default model: `strata-ref hash` checked against gguf-py."""
import json

import gguf
import numpy as np
import pytest

from strata_ref import hash_array, models
from strata_ref.cli import main
from strata_ref.hashing import fnv1a64


@pytest.fixture(scope="module")
def smollm2():
    try:
        return models.resolve("SmolLM2-135M-Instruct")
    except models.ModelError as e:
        pytest.skip(f"SmolLM2 not available: {e}")


def test_hash_every_tensor_equals_gguf_py(smollm2, capsys):
    assert main(["hash", str(smollm2), "--json", "--no-progress", "--out", "f32,bf16"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["tensors"]) == 272 and doc["types"] == ["F32", "Q4_1", "Q8_0"]
    reader = gguf.GGUFReader(smollm2)
    by_name = {t.name: t for t in reader.tensors}
    hashes = []
    for row in doc["tensors"]:
        t = by_name[row["name"]]
        # gguf-py is an independent implementation: its f32 values, hashed here.
        ref = gguf.quants.dequantize(np.asarray(t.data).reshape(-1).view(np.uint8)
                                     if t.tensor_type != gguf.GGMLQuantizationType.F32
                                     else np.asarray(t.data), t.tensor_type)
        ref = np.ascontiguousarray(ref, dtype=np.float32)
        assert row["hash"]["f32"] == f"{hash_array(ref):016x}", row["name"]
        assert row["type"] == t.tensor_type.name
        hashes.append(hash_array(ref))
    # the chained hash: FNV-1a 64 over the tensor hashes (8 bytes each, little-endian)
    chain = fnv1a64(b"".join(h.to_bytes(8, "little") for h in hashes))
    assert doc["chained"]["f32"] == f"{chain:016x}"


def test_hash_type_filter_and_table(smollm2, capsys):
    assert main(["hash", str(smollm2), "--types", "Q8_0", "--out", "f16", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("token_embd.weight") and "Q8_0" in out[1] and "576x49152" in out[1]
    assert out[-1].startswith("chained (1 tensor, file order)")
    # dtype and type names are case-insensitive alike
    assert main(["hash", str(smollm2), "--types", "q8_0", "--out", "F16", "--no-progress"]) == 0
    assert capsys.readouterr().out.splitlines() == out


def test_info(smollm2, capsys):
    assert main(["info", str(smollm2)]) == 0
    out = capsys.readouterr().out
    assert "general.architecture = 'llama'" in out
    assert any(l.split()[:2] == ["Q4_1", "210"] for l in out.splitlines())


def test_errors_are_one_line(tmp_path, capsys):
    assert main(["hash", str(tmp_path / "nope.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)
    assert main(["info", str(bad)]) == 2
    # the problem and the byte offset, as a sentence (no class name)
    assert capsys.readouterr().err == (f"strata-ref: error: {bad}: file truncated in kv_count: "
                                       "needs 8 bytes, the file ends after 0 (at byte offset 16)\n")
    assert main(["hash", "--out", "f64", str(bad)]) == 2


def test_committed_model_golden_file_checks(smollm2):
    """golden/models/SmolLM2-135M-Instruct.json (the numbers `strata-ref hash`
    prints) still matches a fresh computation on the real file."""
    from pathlib import Path

    from strata_ref import golden
    g = Path(__file__).resolve().parent.parent / "golden" / "models" / "SmolLM2-135M-Instruct.json"
    rows, ok = golden.check_model_golden(smollm2, g)
    assert ok, [r for r in rows if r["status"] != "pass"][:3]
    assert len(rows) == 272
