"""tools/make_tiny_model.py writes the very files whose llama.cpp logits
are stored under tests/data: its output's SHA-256 equals the one
tools/llama_ref.py recorded when it ran llama.cpp on them."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import make_tiny_model as mt  # noqa: E402
from infer_helpers import DATA  # noqa: E402


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "qwen3moe", "phi3", "glm4moe", "qwen35",
                                  "deepseek2", "deepseek2-lite", "deepseek2-v3", "deepseek2-kvb",
                                  "gemma4", "gemma4-moe"])
def test_the_written_model_is_the_one_llama_cpp_ran(tmp_path, arch, capsys):
    out = tmp_path / f"{arch}.gguf"
    assert mt.main([arch, str(out)]) == 0
    if arch in mt.DENSE:
        want = str(np.load(DATA / "avx2" / "llama_ref_tiny.npz")[f"{arch}_sha256"])
    else:
        want = str(np.load(DATA / "avx2" / f"llama_ref_moe_{arch}.npz")["sha256"])
    assert _sha(out) == want


def test_bad_arguments_are_one_line(tmp_path, capsys):
    (tmp_path / "keep.npz").write_bytes(b"PK\x03\x04 not a model")
    for argv, msg in ((["nope", str(tmp_path / "x.gguf")], "unknown architecture 'nope'"),
                      (["qwen3", str(tmp_path / "no" / "x.gguf")], "must be a file in an existing folder"),
                      (["qwen3", str(tmp_path / "x.gguf"), "--seed", "-1"], "--seed must be from 0"),
                      (["qwen3"], "give ARCH and OUT"),
                      (["qwen3", str(tmp_path / "keep.npz")], "exists and is not a GGUF file")):
        with pytest.raises(SystemExit) as e:
            mt.main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err
    assert (tmp_path / "keep.npz").read_bytes().startswith(b"PK")     # left as it was
    assert mt.main(["qwen3", str(tmp_path / "keep.npz"), "--force"]) == 0
    assert (tmp_path / "keep.npz").read_bytes()[:4] == b"GGUF"
    assert mt.main(["--list"]) == 0
    assert "phi3: seed 1" in capsys.readouterr().out
