"""Reference data from prebuilt llama.cpp: the x64 libraries that
node-llama-cpp ships on npm (a `GGML_CPU_ALL_VARIANTS=ON GGML_BACKEND_DL=ON`
build: one libggml-cpu-<variant>.so per x86 CPU variant), one variant forced
at a time, through the shipped libllama itself.

From a bare machine (Node/npm, git and a C compiler; the registry models are
fetched as `strata-ref models fetch` does), one command makes everything:

    python tools/prebuilt_ref.py all

which is, step by step:

    python tools/prebuilt_ref.py fetch      # npm i -E node-llama-cpp@3.21.1
                                            # @node-llama-cpp/linux-x64@3.21.1
                                            # into <cache>/prebuilt/v0.4.0/npm,
                                            # its llama.cpp source (the git bundle
                                            # in the package) cloned beside it,
                                            # the C driver built against it
    python tools/prebuilt_ref.py variants   # which variants this CPU executes,
                                            # which one the loader picks itself
                                            # (as every command, first fetches
                                            # what is missing and rebuilds the
                                            # driver when its source is newer)
    python tools/prebuilt_ref.py run [--variants A,B] [--models M,N]
                                            # the logits, kept in <cache>/prebuilt/
                                            # v0.4.0/runs/<variant>/<model>.npz
    python tools/prebuilt_ref.py store      # tests/data/v0.4.0-<variant>/...
    python tools/prebuilt_ref.py classes    # variants whose logits are bitwise
                                            # equal, per model and FA setting
    python tools/prebuilt_ref.py loader     # which library the loader takes
                                            # here, from the shipped folder and
                                            # from folders without the best k

and, to set the data beside llama-cpp-python 0.3.36 (this project's peer
builds, tools/peer_build.py):

    python tools/prebuilt_ref.py peer --profile avx512 [--models M,N]
                                            # the same passes through the peer,
                                            # kept as row hashes in the cache
    python tools/prebuilt_ref.py compare [--variants A] [--models M]
                                            # rows bitwise equal, per profile

(<cache> is `strata_ref.models.cache_dir()`, ~/.cache/strata-ref.) Nothing is
downloaded or built inside the repository.

The driver (tools/prebuilt_driver.c, its docstring says what it computes)
is handed a folder that holds only libggml-cpu-<variant>.so, which it passes
to `ggml_backend_load_all_from_path` before llama.cpp looks for backends
(ggml-backend-reg.cpp `ggml_backend_load_best`: among the folder's
libggml-cpu-*.so, the one with the highest nonzero `ggml_backend_score`; with
one file, that one or none). The library's dependencies (libggml-base.so)
are already loaded by libllama, so the folder needs nothing else. The driver
records the library the process actually mapped, `llama_print_system_info()`
and the CPU backend's feature list next to the data.

Each run: the prompt `PROMPT` tokenized by that llama.cpp (BOS added), then
llama.cpp's own settings of that version (`llama_context_default_params`)
with n_ctx 512, n_batch 512, n_ubatch 512, 2 threads, F16 K and V, a logit
at every position, flash attention on and off (and `auto`, for SmolLM2,
to show what it resolves to):
  incr     the prompt in one llama_decode, then `N_GEN` greedy ids one per
           call (argmax, lowest id on ties);
  batched  prompt + greedy ids in one teacher-forced llama_decode.

Stored files (`store`), tests/data/<version>-<variant>/, e.g.
tests/data/v0.4.0-haswell/:
  llama_ref_<model>.npz     flash attention off
  llama_ref_<model>-fa.npz  flash attention on
with the keys of tools/llama_ref.py `logits` (prompt, prompt_ids, greedy_ids,
n_vocab, sha256, <kind>_ids / <kind>_logits / <kind>_lse: each row's top-k
ids and logits and its log-sum-exp, kind batched or incr) plus
<kind>_hash (uint64 per row: FNV-1a 64, strata_ref.hashing.fnv1a64, of the
row's raw float32 bytes over the whole vocabulary, so a test checks every
logit), <kind>_top1 (argmax of the whole row), topk (128 for the registry
models, 32 for the requantized SmolLM2 variants), flash_attn, variant,
cpu_library, system_info, llama_version, package, n_ctx, n_batch, n_ubatch,
n_threads, type_k, type_v, n_prompt (the incremental pass's first call),
buffers (llama.cpp's log lines naming where the weights went: CPU_REPACK,
AMX), fa_auto (for SmolLM2's -fa files: how `auto` resolved and
whether its rows equal those of `on`) and command.

A variant this CPU cannot execute (its score is 0 here) is reported by
`variants` and skipped by `run`; its data is made the same way on a CPU
that executes it, or here under an emulator that runs the driver
(`--wrapper "sde64 -spr --"`, Intel SDE), which the stored `command` names.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

PROMPT = "The capital of France is"
N_GEN = 32
TOPK = 128
N_CTX = N_BATCH = N_UBATCH = 512
N_THREADS = 2

#: llama.cpp versions as node-llama-cpp ships them: npm packages, the
#: libraries in the x64 package, the tag its llama.cpp source bundle holds
VERSIONS = {
    "v0.4.0": {
        "npm": ("node-llama-cpp@3.21.1", "@node-llama-cpp/linux-x64@3.21.1"),
        "bins": "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64",
        "bundle": "node_modules/node-llama-cpp/llama/gitRelease.bundle",
        "info": "node_modules/node-llama-cpp/llama/llama.cpp.info.json",
        "libs": ("libllama.v0.4.0.so", "libggml.v0.4.0.so", "libggml-base.so"),
    },
}
VERSION = "v0.4.0"

# the x86 variants of ggml/src/CMakeLists.txt (`check_variants` compares
# with the source) and the loader's score: declared once, in the library
from strata_ref.cpu.loader import X86_VARIANTS, score  # noqa: E402


REGISTRY_MODELS = ("SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct", "gemma-3-270m")
#: the model also run with flash attention `auto` (its rows compared with `on`)
AUTO_MODEL = "SmolLM2-135M-Instruct"

#: top-k rows kept in tests/data: `TOPK` for the registry models, fewer for
#: the requantized SmolLM2 variants (the size budget of tests/data; the row
#: hashes check every logit either way)
TOPK_STORED_VARIANT = 32


def model_names() -> list:
    from model_variants import VARIANTS
    return list(REGISTRY_MODELS) + list(VARIANTS)


def model_path(name: str) -> Path:
    if name in REGISTRY_MODELS:
        from strata_ref.models import resolve
        return resolve(name)
    from model_variants import build_variant
    return build_variant(name)


# ---------------------------------------------------------------- fetching

def root(version: str = VERSION) -> Path:
    from strata_ref.models import cache_dir
    return cache_dir() / "prebuilt" / version


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(shlex.quote, map(str, cmd))), flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, **kw)


def fetch(version: str = VERSION) -> None:
    """npm packages, llama.cpp source and the driver of `version`, in the
    cache (each step skipped when its result is there)."""
    v = VERSIONS[version]
    npm = root(version) / "npm"
    bins = npm / v["bins"]
    if not all((bins / lib).is_file() for lib in v["libs"]):
        npm.mkdir(parents=True, exist_ok=True)
        if not (npm / "package.json").is_file():
            (npm / "package.json").write_text('{"private": true}\n')
        # --ignore-scripts: the postinstall would look for GPUs and build;
        # --omit=optional: not the CUDA / Vulkan / ARM binaries (0.7 GB)
        _run(["npm", "install", "--save-exact", "--ignore-scripts", "--omit=optional",
              "--no-audit", "--no-fund", *v["npm"]], cwd=npm)
    meta = json.loads((bins / "_nlcBuildMetadata.json").read_text())
    tag = json.loads((npm / v["info"]).read_text())["tag"]
    if meta["buildOptions"]["llamaCpp"]["release"] != tag or tag != version:
        raise SystemExit(f"the binaries were built from {meta['buildOptions']['llamaCpp']} "
                         f"but the source bundle is {tag}; expected {version}")
    src = root(version) / "llama.cpp"
    if not (src / "include" / "llama.h").is_file():
        shutil.rmtree(src, ignore_errors=True)
        _run(["git", "-c", "advice.detachedHead=false", "clone", "--quiet", npm / v["bundle"], src])
    check_variants(src)
    build_driver(version)


def check_variants(src: Path) -> None:
    """The x86 variant list of `src`'s ggml/src/CMakeLists.txt must be
    X86_VARIANTS (names, order and options)."""
    text = (src / "ggml" / "src" / "CMakeLists.txt").read_text()
    block = text.split('GGML_SYSTEM_ARCH STREQUAL "x86")', 2)[2].split("elseif", 1)[0]
    found = {m[0]: tuple(m[1].split()) for m in
             re.findall(r"ggml_add_cpu_backend_variant\(([^\s)]+)\s*([^)]*)\)", block)}
    if found != X86_VARIANTS or list(found) != list(X86_VARIANTS):
        raise SystemExit(f"{src}: the x86 variants are {found}, not X86_VARIANTS")


def driver(version: str = VERSION) -> Path:
    return root(version) / "prebuilt_driver"


def build_driver(version: str = VERSION) -> Path:
    """Compile tools/prebuilt_driver.c against the version's headers and
    shipped libraries (rpath to the npm folder)."""
    v = VERSIONS[version]
    c = REPO / "tools" / "prebuilt_driver.c"
    exe = driver(version)
    if exe.is_file() and exe.stat().st_mtime >= c.stat().st_mtime:
        return exe
    src = root(version) / "llama.cpp"
    bins = root(version) / "npm" / v["bins"]
    _run([os.environ.get("CC", "cc"), "-O2", "-std=c11", "-Wall", "-Wextra", "-o", exe, c,
          f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}", f"-L{bins}",
          *[f"-l:{lib}" for lib in v["libs"]], f"-Wl,-rpath,{bins}"])
    return exe


def variant_dir(variant: str, version: str = VERSION) -> Path:
    """A folder holding only libggml-cpu-<variant>.so (a hard link, or a
    copy across file systems)."""
    if variant not in X86_VARIANTS:
        raise SystemExit(f"unknown variant {variant!r} (known: {', '.join(X86_VARIANTS)})")
    d = root(version) / "cpu" / variant
    lib = f"libggml-cpu-{variant}.so"
    if not (d / lib).is_file():
        d.mkdir(parents=True, exist_ok=True)
        src = root(version) / "npm" / VERSIONS[version]["bins"] / lib
        try:
            os.link(src, d / lib)
        except OSError:
            shutil.copy2(src, d / lib)
    return d


# ---------------------------------------------------------------- running

class NotExecutable(Exception):
    """The CPU backend of a variant did not load here (score 0)."""


def _meta(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        k, _, v = line.partition("=")
        out[k] = v
    return out


def run_driver(backend_dir: Path, model: Path, modes, n_gen: int = N_GEN, wrapper=(),
               version: str = VERSION, ids=None) -> dict:
    """One driver process: {"meta": dict, "log": str, mode: {"prompt_ids",
    "greedy_ids", "incr", "batched"}} (float32 rows over the vocabulary).
    The prompt is `PROMPT`, or the token ids `ids` when given.
    Raises NotExecutable when no CPU backend loaded from `backend_dir`."""
    with tempfile.TemporaryDirectory(prefix="prebuilt_") as out:
        prompt = ["--text", PROMPT] if ids is None else ["--ids", ",".join(map(str, ids))]
        cmd = [*wrapper, driver(version), backend_dir, model, out, n_gen, ",".join(modes), *prompt]
        p = subprocess.run(list(map(str, cmd)), capture_output=True, text=True)
        if p.returncode == 3:
            raise NotExecutable(p.stderr.strip())
        if p.returncode != 0:
            raise RuntimeError(f"driver failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
        res = {"meta": _meta(Path(out) / "meta.txt"), "log": (Path(out) / "log.txt").read_text()}
        n_vocab = int(res["meta"]["n_vocab"])
        for m in modes:
            d = Path(out) / m
            ids = np.fromfile(d / "prompt.i32", np.int32)
            gen = np.fromfile(d / "greedy.i32", np.int32)
            n = ids.size + gen.size
            res[m] = {"prompt_ids": ids, "greedy_ids": gen,
                      "incr": np.fromfile(d / "incr.f32", np.float32).reshape(n, n_vocab),
                      "batched": np.fromfile(d / "batched.f32", np.float32).reshape(n, n_vocab)}
    return res


def row_hashes(rows: np.ndarray) -> np.ndarray:
    """uint64 (n,): FNV-1a 64 of each row's raw float32 bytes."""
    from strata_ref.hashing import fnv1a64
    rows = np.ascontiguousarray(rows, np.float32)
    return np.array([fnv1a64(r.view(np.uint8)) for r in rows], np.uint64)


def blake2b_rows(rows: np.ndarray) -> np.ndarray:
    from infer_helpers import row_hashes as rh
    return rh(rows)


def topk(rows: np.ndarray, k: int = TOPK):
    """tools/llama_ref.py `_topk`: (ids int32 (n, k), logits float32 (n, k),
    log-sum-exp float64 (n,)); ids by descending logit, ties by id."""
    sys.path.insert(0, str(REPO / "tools"))
    from llama_ref import _topk
    return _topk(rows, k)


def _log_lines(log: str, mode: str) -> tuple:
    """(the model-load lines naming buffer types, the lines of context
    `mode` that say how flash attention resolved)."""
    head, _, rest = log.partition("### prebuilt_driver: context")
    buffers = [ln.strip() for ln in head.splitlines() if "buffer" in ln or "repack" in ln.lower()
               or "AMX" in ln]
    ctx = ""
    for part in log.split("### prebuilt_driver: context flash_attn=")[1:]:
        if part.startswith(mode + "\n"):
            ctx = part
    fa = [ln.strip() for ln in ctx.splitlines() if "flash" in ln.lower() or "Flash" in ln]
    return buffers, fa


def run_one(variant: str, model: str, wrapper=(), version: str = VERSION) -> Path:
    """Run the driver for (variant, model) and keep the result, small, in
    the cache: per mode the row hashes, the top-k rows, the argmax and
    log-sum-exp of every row. Returns the file."""
    from strata_ref.models import sha256_file
    path = model_path(model)
    modes = ("on", "off", "auto") if model == AUTO_MODEL else ("on", "off")
    t0 = time.time()
    res = run_driver(variant_dir(variant, version), path, modes, wrapper=wrapper, version=version)
    meta = res["meta"]
    lib = Path(meta.get("cpu_library", "")).name
    if lib != f"libggml-cpu-{variant}.so":
        raise RuntimeError(f"asked for {variant}, the process loaded {lib or 'no CPU library'}")
    out = {"variant": np.array(variant), "model": np.array(model), "prompt": np.array(PROMPT),
           "sha256": np.array(sha256_file(path)), "n_vocab": np.int64(meta["n_vocab"]),
           "cpu_library": np.array(lib),
           "system_info": np.array(meta["system_info"]),
           "llama_version": np.array(meta["llama_version"]),
           "features": np.array(json.dumps({k[8:]: v for k, v in meta.items()
                                            if k.startswith("feature.")})),
           "modes": np.array(list(modes)), "seconds": np.float64(time.time() - t0),
           "wrapper": np.array(" ".join(wrapper))}
    for m in modes:
        r = res[m]
        buffers, fa = _log_lines(res["log"], m)
        out["buffers"] = np.array("\n".join(buffers))
        out[f"{m}:fa_log"] = np.array("\n".join(fa))
        out[f"{m}:prompt_ids"] = r["prompt_ids"]
        out[f"{m}:greedy_ids"] = r["greedy_ids"]
        for kind in ("batched", "incr"):
            i, v, lse = topk(r[kind])
            out[f"{m}:{kind}_ids"] = i
            out[f"{m}:{kind}_logits"] = v
            out[f"{m}:{kind}_lse"] = lse
            out[f"{m}:{kind}_hash"] = row_hashes(r[kind])
            # tests/infer_helpers.py `row_hashes` (blake2b), the hash of the
            # llama-cpp-python data (llama_kv_*.npz), for `compare`
            out[f"{m}:{kind}_b2"] = blake2b_rows(r[kind])
            out[f"{m}:{kind}_top1"] = np.argmax(r[kind], axis=1).astype(np.int32)
    f = root(version) / "runs" / variant / f"{model}.npz"
    f.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(f, **out)
    return f


def executes(variant: str, version: str = VERSION, wrapper=()) -> bool:
    """Whether this CPU (or the wrapper) loads the variant's backend."""
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run(list(map(str, [*wrapper, driver(version), variant_dir(variant, version),
                                          "/nonexistent.gguf", out, 0, "off", "--ids", "1"])),
                           capture_output=True, text=True)
    return p.returncode != 3


def loader_pick(version: str = VERSION, libs=None) -> str:
    """The variant ggml's loader picks by itself from the shipped folder
    (all 14 libraries present), or from a folder holding only the
    libraries of the variants `libs`."""
    bins = root(version) / "npm" / VERSIONS[version]["bins"]
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as some:
        if libs is not None:
            for v in libs:
                lib = variant_dir(v, version) / f"libggml-cpu-{v}.so"
                os.link(lib, Path(some) / lib.name)
            bins = Path(some)
        subprocess.run(list(map(str, [driver(version), bins, "/nonexistent.gguf", out, 0, "off",
                                      "--ids", "1"])), capture_output=True, text=True)
        lib = _meta(Path(out) / "meta.txt").get("cpu_library", "")
    return Path(lib).name.removeprefix("libggml-cpu-").removesuffix(".so")


def loader_file(version: str = VERSION) -> Path:
    return REPO / "tests" / "data" / f"{version}-loader.json"


def cmd_loader(a) -> None:
    """Store what the shipped loader takes on this CPU from the shipped
    folder, then from folders without the best 1, 2, ... 13 libraries (in
    score order): every comparison of `ggml_backend_score` this CPU can
    make, for `strata_ref.cpu.loader.pick` to be checked against
    (tests/test_cpu_select.py)."""
    fetch(a.version)
    from strata_ref.cpu.profiles import host_flags
    order = sorted(X86_VARIANTS, key=score, reverse=True)
    cases = [{"libraries": "all", "picked": loader_pick(a.version)}]
    for k in range(1, len(order)):
        libs = sorted(order[k:], key=list(X86_VARIANTS).index)
        cases.append({"libraries": libs, "picked": loader_pick(a.version, libs)})
        print(f"without {', '.join(order[:k])}: {cases[-1]['picked']}")
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                  if ln.startswith("model name")), "")
    doc = {"command": f"python tools/prebuilt_ref.py --version {a.version} loader",
           "package": " + ".join(VERSIONS[a.version]["npm"]), "cpu_model": model,
           "cpu_flags": sorted(host_flags()), "cases": cases}
    loader_file(a.version).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"the loader picks: {cases[0]['picked']}; wrote {loader_file(a.version)}")


# ---------------------------------------------------------------- storing

def data_dir(variant: str, version: str = VERSION) -> Path:
    return REPO / "tests" / "data" / f"{version}-{variant}"


def stored_name(model: str, fa: bool) -> str:
    return f"llama_ref_{model}{'-fa' if fa else ''}.npz"


def summarize_buffers(text: str) -> str:
    """llama.cpp's model-load lines about buffer types, with the per-tensor
    `amx repack tensor NAME of type T` debug lines counted per type."""
    keep, amx = [], {}
    for line in text.splitlines():
        m = re.search(r"amx repack tensor \S+ of type (\S+)", line)
        if m:
            amx[m.group(1)] = amx.get(m.group(1), 0) + 1
        elif "buffer" in line:
            keep.append(line.strip())
    if amx:
        keep.append("AMX repacked tensors: " + ", ".join(f"{t} x{n}" for t, n in sorted(amx.items())))
    return "\n".join(keep)


def store_one(run: Path, command: str, version: str = VERSION) -> list:
    """Write the two stored files (FA off, on) of one cached run."""
    r = dict(np.load(run))
    variant, model = str(r["variant"]), str(r["model"])
    k = TOPK if model in REGISTRY_MODELS else TOPK_STORED_VARIANT
    written = []
    for fa, m in ((False, "off"), (True, "on")):
        d = {"prompt": r["prompt"], "prompt_ids": r[f"{m}:prompt_ids"],
             "greedy_ids": r[f"{m}:greedy_ids"], "n_vocab": r["n_vocab"], "sha256": r["sha256"],
             "topk": np.int64(k), "flash_attn": np.bool_(fa),
             "variant": r["variant"], "profile": np.array(f"{version}-{variant}"),
             "cpu_library": r["cpu_library"], "system_info": r["system_info"],
             "llama_version": r["llama_version"],
             "package": np.array(" + ".join(VERSIONS[version]["npm"])),
             "n_ctx": np.int64(N_CTX), "n_batch": np.int64(N_BATCH),
             "n_ubatch": np.int64(N_UBATCH), "n_threads": np.int64(N_THREADS),
             "type_k": np.array("f16"), "type_v": np.array("f16"),
             "n_prompt": np.int64(r[f"{m}:prompt_ids"].size),
             "buffers": np.array(summarize_buffers(str(r["buffers"]))),
             "fa_log": r[f"{m}:fa_log"], "command": np.array(command)}
        for kind in ("batched", "incr"):
            d[f"{kind}_hash"] = r[f"{m}:{kind}_hash"]
            d[f"{kind}_top1"] = r[f"{m}:{kind}_top1"]
            d[f"{kind}_ids"] = r[f"{m}:{kind}_ids"][:, :k]
            d[f"{kind}_logits"] = r[f"{m}:{kind}_logits"][:, :k]
            d[f"{kind}_lse"] = r[f"{m}:{kind}_lse"]
        if fa and "auto:batched_hash" in r:
            same = all(np.array_equal(r[f"auto:{k}"], r[f"on:{k}"])
                       for k in ("batched_hash", "incr_hash", "greedy_ids"))
            d["fa_auto"] = np.array(f"{r['auto:fa_log']}\nrows equal to flash_attn on: {same}")
        out = data_dir(variant, version) / stored_name(model, fa)
        out.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(out, **d)
        written.append(out)
    return written


# ---------------------------------------------------------------- classes

def classes(version: str = VERSION) -> dict:
    """{(model, fa): [[variants with bitwise equal rows], ...]} from the
    cached runs: two variants are one class when the row hashes of both
    passes and the greedy ids are equal."""
    out = {}
    runs = root(version) / "runs"
    for model in model_names():
        for fa, m in ((False, "off"), (True, "on")):
            groups = {}
            for variant in X86_VARIANTS:
                f = runs / variant / f"{model}.npz"
                if not f.is_file():
                    continue
                r = np.load(f)
                key = (r[f"{m}:batched_hash"].tobytes(), r[f"{m}:incr_hash"].tobytes(),
                       r[f"{m}:greedy_ids"].tobytes())
                groups.setdefault(key, []).append(variant)
            if groups:
                out[(model, fa)] = list(groups.values())
    return out


def alias_classes(version: str = VERSION) -> list:
    """[[variants]]: the variants that give the same bits for every model
    and flash-attention setting run for both (the finest partition that
    every per-model grouping of `classes` refines), in X86_VARIANTS order."""
    per_model = classes(version)
    out = []
    for v in X86_VARIANTS:
        for cls in out:
            w = cls[0]
            if all(any(v in g and w in g for g in groups) or
                   not any(v in g for g in groups) or not any(w in g for g in groups)
                   for groups in per_model.values()):
                cls.append(v)
                break
        else:
            out.append([v])
    return out


# ---------------------------------------------------------------- comparing

#: llama-cpp-python 0.3.36 profiles (tools/peer_build.py) and the ggml
#: variant whose options each one is built with
PEER_VARIANT = {"scalar": "x64", "avx2": "haswell", "avx512": "zen4"}


def _equal_topk(a_ids, a_val, b_ids, b_val) -> np.ndarray:
    """bool per row: the same top-k ids and bitwise the same logits."""
    k = min(a_ids.shape[1], b_ids.shape[1])
    return ((a_ids[:, :k] == b_ids[:, :k]).all(1)
            & (a_val[:, :k].view(np.uint32) == b_val[:, :k].view(np.uint32)).all(1))


def peer_file(profile: str, model: str) -> Path:
    from strata_ref.models import cache_dir
    return cache_dir() / "prebuilt" / "peer" / profile / f"{model}.npz"


def peer_run(model: str) -> Path:
    """In a process re-executed under a llama-cpp-python 0.3.36 peer build
    (tools/peer_env.py): the same passes as the driver (tools/llama_ref.py
    `_kv_run`, F16 K and V, flash attention off and on), kept as per-row
    FNV-1a 64 hashes, greedy ids and top-k rows in the cache, for `compare`."""
    sys.path.insert(0, str(REPO / "tools"))
    from llama_ref import _kv_run
    from peer_env import profile
    out = {}
    for m, fa in (("off", False), ("on", True)):
        r = _kv_run(model_path(model), ("f16", "f16", fa, False, "short"))
        out[f"{m}:prompt_ids"] = r["prompt_ids"]
        out[f"{m}:greedy_ids"] = r["greedy_ids"]
        for kind in ("batched", "incr"):
            out[f"{m}:{kind}_hash"] = row_hashes(r[kind])
            i, v, _ = topk(r[kind])
            out[f"{m}:{kind}_ids"] = i
            out[f"{m}:{kind}_logits"] = v
    f = peer_file(profile(), model)
    f.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(f, **out)
    return f


def compare(variant: str, model: str, profile: str, version: str = VERSION) -> dict:
    """A cached run against the stored llama-cpp-python 0.3.36 data of
    `profile`: per pass, which rows are bitwise equal. Flash attention off:
    tests/data/<profile>/llama_ref_<model>.npz (each row's top-128 ids and
    logits); on: the `f16-f16-fa` configuration of llama_kv_<model>.npz
    (blake2b of the whole row); both whole rows when `peer` made the
    profile's hashes (then only those are used). Returns {(fa, kind): bool array or None},
    plus "greedy_off" / "greedy_on": whether the greedy ids are equal (the
    teacher-forced rows past a divergence see other inputs)."""
    r = np.load(root(version) / "runs" / variant / f"{model}.npz")
    out = {}
    pf = peer_file(profile, model)
    if pf.is_file():
        # the whole rows, from `peer`
        d = np.load(pf)
        for fa in ("off", "on"):
            out[f"greedy_{fa}"] = bool(np.array_equal(d[f"{fa}:greedy_ids"], r[f"{fa}:greedy_ids"]))
            for kind in ("batched", "incr"):
                out[(fa, kind)] = d[f"{fa}:{kind}_hash"] == r[f"{fa}:{kind}_hash"]
        return out
    ref = REPO / "tests" / "data" / profile / f"llama_ref_{model}.npz"
    if ref.is_file():
        d = np.load(ref)
        out["greedy_off"] = bool(np.array_equal(d["greedy_ids"], r["off:greedy_ids"]))
        for kind in ("batched", "incr"):
            out[("off", kind)] = _equal_topk(d[f"{kind}_ids"], d[f"{kind}_logits"],
                                             r[f"off:{kind}_ids"], r[f"off:{kind}_logits"])
    kv = REPO / "tests" / "data" / profile / f"llama_kv_{model}.npz"
    if kv.is_file() and "on:batched_b2" in r:
        d = np.load(kv)
        if "f16-f16-fa:batched_hash" in d:
            out["greedy_on"] = bool(np.array_equal(d["f16-f16-fa:greedy_ids"], r["on:greedy_ids"]))
            for kind in ("batched", "incr"):
                out[("on", kind)] = d[f"f16-f16-fa:{kind}_hash"] == r[f"on:{kind}_b2"]
    return out


# ---------------------------------------------------------------- commands

def cmd_fetch(a) -> None:
    fetch(a.version)
    print(f"ready: {root(a.version)}")


def cmd_variants(a) -> None:
    fetch(a.version)
    wrapper = shlex.split(a.wrapper or "")
    for v, feats in X86_VARIANTS.items():
        print(f"{v:15s} score {score(v):4d}  "
              f"{'executes' if executes(v, a.version, wrapper) else 'NOT executable here':20s}"
              f" {' '.join(feats)}")
    print(f"the loader picks: {loader_pick(a.version)}")


def _selected(a):
    variants = a.variants.split(",") if a.variants else list(X86_VARIANTS)
    models = a.models.split(",") if a.models else model_names()
    for v in variants:
        if v not in X86_VARIANTS:
            raise SystemExit(f"unknown variant {v!r} (known: {', '.join(X86_VARIANTS)})")
    known = model_names()
    for m in models:
        if m not in known:
            raise SystemExit(f"unknown model {m!r} (known: {', '.join(known)})")
    return variants, models


def cmd_run(a) -> None:
    variants, models = _selected(a)
    fetch(a.version)
    wrapper = shlex.split(a.wrapper or "")
    skipped = [v for v in variants if not executes(v, a.version, wrapper)]
    for v in skipped:
        print(f"{v}: not executable on this CPU, skipped")
    # model by model, so that each model's variant classes are complete early
    for m in models:
        for v in variants:
            if v in skipped:
                continue
            f = root(a.version) / "runs" / v / f"{m}.npz"
            if f.is_file() and not a.force:
                continue
            f = run_one(v, m, wrapper, a.version)
            r = np.load(f)
            print(f"{v} {m}: {float(r['seconds']):.0f} s, {r['cpu_library']}, greedy(on) "
                  f"{r['on:greedy_ids'][:6].tolist()}...", flush=True)


def cmd_store(a) -> None:
    variants, models = _selected(a)
    for v in variants:
        for m in models:
            f = root(a.version) / "runs" / v / f"{m}.npz"
            if f.is_file():
                wrapper = str(np.load(f)["wrapper"])
                w = f" --wrapper {shlex.quote(wrapper)}" if wrapper else ""
                cmd = (f"python tools/prebuilt_ref.py run --variants {v} --models {m}{w} && "
                       f"python tools/prebuilt_ref.py store --variants {v} --models {m}")
                for out in store_one(f, cmd, a.version):
                    print(out.relative_to(REPO))


def cmd_compare(a) -> None:
    variants, models = _selected(a)
    print("| variant | model | llama-cpp-python profile | FA off: batched / incr rows equal | "
          "FA on: batched / incr rows equal |")
    print("|---|---|---|---|---|")
    for v in variants:
        for m in models:
            if not (root(a.version) / "runs" / v / f"{m}.npz").is_file():
                continue
            for prof in (a.profiles.split(",") if a.profiles else PEER_VARIANT):
                c = compare(v, m, prof, a.version)
                if not c:
                    continue
                cells = []
                for fa in ("off", "on"):
                    if (fa, "batched") not in c:
                        cells.append("no data")
                        continue
                    b, i = c[(fa, "batched")], c[(fa, "incr")]
                    g = "" if c[f"greedy_{fa}"] else " (greedy differs)"
                    cells.append(f"{b.sum()}/{b.size} / {i.sum()}/{i.size}{g}")
                print(f"| {v} | {m} | {prof} | {cells[0]} | {cells[1]} |")


#: the tiny seeded MoE models run by `moe` (tests/infer_helpers.py
#: `tiny_moe_model`), and the variants by default
MOE_ARCHS = ("deepseek2", "deepseek2-v3")
MOE_VARIANTS = ("haswell", "x64")


def moe_name(arch: str) -> str:
    return f"moe_{arch}.npz"


def cmd_moe(a) -> None:
    """The tiny deepseek2 models (MLA) through the prebuilt libraries:
    tests/data/<version>-<variant>/moe_<arch>.npz with, for flash attention
    off and on (keys off:* / on:*), the prompt `TINY_IDS`, the
    `MOE_N_GREEDY` greedy ids and every logit of the batched and the
    incremental pass (float32, as tools/llama_ref.py `moe` stores them),
    and with flash attention on the long run of `FA_LONG_IDS` (long_*: the
    greedy ids and the blake2b `row_hashes` of every row; its batched pass
    takes the tiled path, its decode steps the split-KV path)."""
    import hashlib
    from infer_helpers import (FA_LONG_IDS, FA_LONG_N_GREEDY, MOE_N_GREEDY, TINY_IDS, moe_seed,
                               tiny_moe_model)
    from infer_helpers import row_hashes as b2
    fetch(a.version)
    variants = a.variants.split(",") if a.variants else list(MOE_VARIANTS)
    archs = a.archs.split(",") if a.archs else list(MOE_ARCHS)
    with tempfile.TemporaryDirectory(prefix="prebuilt_moe_") as t:
        for arch in archs:
            path = Path(t) / f"tiny_{arch}.gguf"
            tiny_moe_model(arch, path, seed=moe_seed(arch))
            for v in variants:
                if not executes(v, a.version):
                    print(f"{v}: not executable on this CPU, skipped")
                    continue
                res = run_driver(variant_dir(v, a.version), path, ("off", "on"), MOE_N_GREEDY,
                                 version=a.version, ids=TINY_IDS)
                lon = run_driver(variant_dir(v, a.version), path, ("on",), FA_LONG_N_GREEDY,
                                 version=a.version, ids=FA_LONG_IDS)
                meta = res["meta"]
                lib = Path(meta.get("cpu_library", "")).name
                if lib != f"libggml-cpu-{v}.so":
                    raise RuntimeError(f"asked for {v}, the process loaded {lib or 'no CPU library'}")
                d = {"arch": np.array(arch), "seed": np.int64(moe_seed(arch)),
                     "sha256": np.array(hashlib.sha256(path.read_bytes()).hexdigest()),
                     "variant": np.array(v), "profile": np.array(f"{a.version}-{v}"),
                     "cpu_library": np.array(lib), "system_info": np.array(meta["system_info"]),
                     "llama_version": np.array(meta["llama_version"]),
                     "package": np.array(" + ".join(VERSIONS[a.version]["npm"])),
                     "n_ctx": np.int64(N_CTX), "n_threads": np.int64(N_THREADS),
                     "type_k": np.array("f16"), "type_v": np.array("f16"),
                     "command": np.array(f"python tools/prebuilt_ref.py moe --variants {v} --archs {arch}")}
                for m in ("off", "on"):
                    for k in ("prompt_ids", "greedy_ids", "batched", "incr"):
                        d[f"{m}:{k}"] = res[m][k]
                    d[f"{m}:fa_log"] = np.array("\n".join(_log_lines(res["log"], m)[1]))
                r = lon["on"]
                d.update({"long_prompt_ids": r["prompt_ids"], "long_greedy_ids": r["greedy_ids"],
                          "long_batched_hash": b2(r["batched"]), "long_incr_hash": b2(r["incr"])})
                out = data_dir(v, a.version) / moe_name(arch)
                out.parent.mkdir(parents=True, exist_ok=True)
                np.savez_compressed(out, **d)
                print(out.relative_to(REPO), "greedy off/on", d["off:greedy_ids"][:4].tolist(),
                      d["on:greedy_ids"][:4].tolist(), flush=True)


def cmd_peer(a) -> None:
    _, models = _selected(a)
    for m in models:
        print(peer_run(m), flush=True)


def cmd_classes(a) -> None:
    print("alias classes over every model run: "
          + " / ".join(", ".join(c) for c in alias_classes(a.version)) + "\n")
    cl = classes(a.version)
    print("| model | flash attention | classes (bitwise equal logits) |")
    print("|---|---|---|")
    for (model, fa), groups in cl.items():
        print(f"| {model} | {'on' if fa else 'off'} | "
              + " / ".join(", ".join(g) for g in groups) + " |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default=VERSION, choices=list(VERSIONS))
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch")
    p = sub.add_parser("variants")
    p.add_argument("--wrapper", help="command prefix that runs the driver (an emulator)")
    for name in ("run", "store", "all"):
        p = sub.add_parser(name)
        p.add_argument("--variants", help="comma-separated (default: all 14)")
        p.add_argument("--models", help="comma-separated (default: registry models and variants)")
        if name != "store":
            p.add_argument("--wrapper", help="command prefix that runs the driver (an emulator)")
            p.add_argument("--force", action="store_true", help="run again when cached")
    sub.add_parser("classes")
    p = sub.add_parser("moe", help="the tiny deepseek2 models, flash attention off and on "
                                   "(tests/data/<version>-<variant>/moe_<arch>.npz)")
    p.add_argument("--variants", help=f"comma-separated (default: {','.join(MOE_VARIANTS)})")
    p.add_argument("--archs", help=f"comma-separated (default: {','.join(MOE_ARCHS)})")
    sub.add_parser("loader", help="what the shipped loader takes on this CPU, from every folder "
                                  "without the best k libraries (tests/data/<version>-loader.json)")
    p = sub.add_parser("peer", help="row hashes of llama-cpp-python 0.3.36 (needs --profile)")
    p.add_argument("--profile", required=True, help="scalar, avx2 or avx512 (tools/peer_build.py)")
    p.add_argument("--models", help="comma-separated (default: every model)")
    p.add_argument("--variants", help=argparse.SUPPRESS)
    p = sub.add_parser("compare", help="cached runs against llama-cpp-python 0.3.36's stored data")
    p.add_argument("--variants", help="comma-separated (default: all 14)")
    p.add_argument("--models", help="comma-separated (default: every model)")
    p.add_argument("--profiles", help="scalar,avx2,avx512 (default: all three)")
    if argv is None and "peer" in sys.argv[1:]:
        sys.path.insert(0, str(REPO / "tools"))
        from peer_env import ensure_profile
        ensure_profile(__file__)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "all":
            cmd_variants(a)
            cmd_run(a)
            cmd_store(a)
            cmd_classes(a)
        else:
            {"fetch": cmd_fetch, "variants": cmd_variants, "run": cmd_run, "store": cmd_store,
             "classes": cmd_classes, "compare": cmd_compare, "peer": cmd_peer,
             "loader": cmd_loader, "moe": cmd_moe}[a.cmd](a)
    except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
        # a missing npm / git / cc, a failed download or build, a driver failure
        raise SystemExit(f"prebuilt_ref: error: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
