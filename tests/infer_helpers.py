"""Shared fixtures of the test_infer_* modules: models from the registry and
the vocab-only GGUF files of llama-cpp-python's source distribution.

Everything is fetched into the user cache (`strata_ref.models.cache_dir()`)
and a test skips cleanly when it cannot be fetched (offline).
"""
from __future__ import annotations

import functools
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
DATA = Path(__file__).parent / "data"


@functools.lru_cache(maxsize=None)
def model_path(name: str) -> Path:
    """GGUF path of a registry model, fetched when missing; skip if offline."""
    from strata_ref import models
    try:
        return models.resolve(name)
    except Exception as e:  # ModelError, OSError: no network or no pip
        pytest.skip(f"model {name} unavailable: {e}")


@functools.lru_cache(maxsize=None)
def load_model(name: str):
    from strata_ref.infer.model import load
    return load(model_path(name))


def _find_sdist(cache: Path) -> Path | None:
    for p in (cache / "sdist" / SDIST_FILE, cache / "ggml" / "sdist" / SDIST_FILE):
        if p.is_file():
            return p
    return None


@functools.lru_cache(maxsize=None)
def vocab_dir() -> Path:
    """Folder holding ggml-vocab-*.gguf(.inp/.out) from the 0.3.36 sdist."""
    from strata_ref.models import cache_dir
    cache = cache_dir()
    out = cache / "ggml-vocab-0.3.36"
    if (out / "ggml-vocab-qwen2.gguf.out").is_file():
        return out
    sd = _find_sdist(cache)
    if sd is None:
        dest = cache / "sdist"
        dest.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                            ":all:", "-d", str(dest), SDIST], capture_output=True, text=True)
        sd = _find_sdist(cache)
        if r.returncode or sd is None:
            pytest.skip(f"cannot fetch {SDIST} (offline?): {r.stderr.strip()[-200:]}")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sd) as tf:
        for m in tf.getmembers():
            name = m.name.rsplit("/", 1)[-1]
            if "/vendor/llama.cpp/models/" in m.name and name.startswith("ggml-vocab-") and m.isfile():
                with tf.extractfile(m) as src:
                    part = out / (name + ".part")
                    part.write_bytes(src.read())
                    part.replace(out / name)
    return out
