"""Reference data of llama.cpp's arm64 builds, made on an x86 machine: the
llama.cpp of llama-cpp-python 0.3.36 cross-compiled for aarch64 per ggml ARM
variant (`VARIANTS`), run under qemu user emulation (docs/arm64.md).

    python tools/arm_ref.py check [--install]
    python tools/arm_ref.py build [VARIANT ...] [--jobs N] [--cpu-only]
    python tools/arm_ref.py data [VARIANT ...] [--only JOB,...] [--missing]
    python tools/arm_ref.py validate [--peer avx2] [--only JOB,...]
    python tools/arm_ref.py classes [VARIANT ...] [--keys FILE ...]
    python tools/arm_ref.py disasm VARIANT FUNCTION ...
    python tools/arm_ref.py list

`check` names what the tool needs from the machine (the Debian packages
qemu-user-static, gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu, cmake and
ninja-build) and installs the missing packages with apt-get only when given
--install.

`build` extracts the sdist (`<cache>/sdist/llama_cpp_python-0.3.36.tar.gz`,
fetched with pip by tools/peer_build.py `fetch_sdist` when missing) into `<cache>/arm/src/`, writes a CMake
toolchain for aarch64-linux-gnu (`<cache>/arm/aarch64-linux-gnu.cmake`) and
builds the static llama.cpp libraries: Release, `-DGGML_NATIVE=OFF
-DGGML_CPU_ARM_ARCH=<march>`, OpenMP, llamafile and repack on (ggml's
defaults, as in the x86 peers; `cmake_flags`). Only ggml-cpu is compiled
with the variant's -march; libllama, libggml and libggml-base get the same
compile commands in every variant, so they are built once
(`<cache>/arm/base/`, which is also the armv8.0 build) and each other -march
builds only its ggml-cpu (`<cache>/arm/<variant>/build/`); the tool compares
the compile commands of every other source with the base's and refuses to
mix them if they differ. Two static drivers (tools/arm_driver/) are linked
per variant: `llama_logits` (a model's raw logits for a token plan, with
llama-cpp-python's settings) and `ggml_ops` (ggml_mul_mat and from_float).
About 15 minutes for everything on 2 shared cores; builds run at nice 10.

`data` runs the drivers under `qemu-aarch64-static -cpu MODEL` (nice 10)
and writes tests/data/<variant>/ with the keys and cases of the x86
profiles' files (tools/llama_ref.py `logits`, `synthetic`, `typed`, `moe`,
`actquant`; tools/llama_ref_iq.py; tools/ggml_mm.py), and `basequant`:
ggml-base's reference quantizers of the KV-cache block types on blocks where
FMA contraction changes the bytes (`ggml_base_quant.npz`, no x86 counterpart): the registry models,
the llama.cpp-quantized SmolLM2 variants (tests/model_variants.py) and the
rotated one, the tiny dense / typed / I-quant / MoE models, every weight
type through ggml_mul_mat and the activation quantizers. The registry
logits files also keep an 8-byte hash of every whole row (`*_hash`,
tests/infer_helpers.py `row_hashes`). Jobs: `actquant`, `mm`, `tiny`,
`mmodd` (the 32-value block types with rows of 5 blocks), `basequant`,
`unary` (ggml's `tanh` and `gelu` ops: libm `tanhf` where
aarch64 glibc's contracted one differs, the F16 GELU table), `typed`,
`iq`, `moe:ARCH`, `logits:MODEL`, `kv:MODEL` (all the
configurations of tools/llama_ref.py `kvcache`), `ops:FILE` (the op-level
vectors of tools/llama_dump.py `--vectors`, `OPS`; needs the model's logits
file first); default: all, `jobs_all`.

`validate` checks the drivers against llama-cpp-python itself: it compiles
them natively against an x86 peer build's shared libraries
(tools/peer_build.py) and compares what they compute with that peer's stored
data (tests/data/avx2/) array by array, bitwise.

`classes` groups the variants by bitwise-equal stored results, file by
file, and counts the rows equal to each x86 profile's; `--keys FILE` does it
per array (per weight type of ggml_mm.npz). `disasm` prints the float
instructions of functions of a variant's ggml-cpu objects in program order
(where GCC fused a multiply-add). `list` prints the variants.

Every stored file records the command that made it, the variant, its CMake
flags, the qemu CPU model, the SVE vector length, the CPU_REPACK layouts
ggml chose (from its debug log) and the build's `llama_print_system_info()`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))

SDIST = "llama_cpp_python-0.3.36.tar.gz"
TRIPLE = "aarch64-linux-gnu"
DRIVER_DIR = REPO / "tools" / "arm_driver"
#: the -march of the shared base build (libllama, libggml, libggml-base and
#: the armv8.0 variant's ggml-cpu)
BASE_MARCH = "armv8-a"


@dataclass(frozen=True)
class Variant:
    """One ARM build: its -march (GGML_CPU_ARM_ARCH), the qemu CPU model it
    runs under, and the ggml `ggml_add_cpu_backend_variant` it matches (the
    feature set of ggml/src/CMakeLists.txt's Linux list, '' if none)."""
    name: str
    march: str
    qemu_cpu: str
    ggml_variant: str
    note: str


VARIANTS = {v.name: v for v in (
    Variant("armv8.0", "armv8-a", "cortex-a72", "armv8.0_1",
            "NEON only (Raspberry Pi 4, Cortex-A72 class)"),
    Variant("armv8.2-dotprod", "armv8.2-a+dotprod", "cortex-a76", "armv8.2_1",
            "dotprod, no FP16 vector arithmetic"),
    Variant("armv8.2-fp16", "armv8.2-a+dotprod+fp16", "cortex-a76", "armv8.2_2",
            "dotprod and FP16 vector arithmetic (Raspberry Pi 5, Graviton 2, "
            "Apple M1 under Linux)"),
    Variant("armv8.6-i8mm", "armv8.6-a+dotprod+fp16+i8mm", "max,sve=off", "",
            "i8mm without SVE (the feature set of ggml's apple_m2_m3 variant plus fp16)"),
    Variant("sve256", "armv8.6-a+dotprod+fp16+sve+i8mm", "max,sve256=on,sve512=off,"
            "sve-default-vector-length=32", "armv8.6_1",
            "SVE at 256 bits with i8mm (Graviton 3)"),
    Variant("sve128", "armv8.6-a+dotprod+fp16+sve+i8mm", "max,sve128=on,sve256=off,"
            "sve-default-vector-length=16", "armv8.6_1",
            "SVE at 128 bits with i8mm"),
)}


def cache() -> Path:
    from strata_ref.models import cache_dir
    return cache_dir() / "arm"


def nice(cmd: list) -> list:
    """Builds and emulated runs share the machine: run them at nice 10."""
    return ["nice", "-n", "10"] + [str(c) for c in cmd]


# ---------------------------------------------------------------- check ---

NEEDS = {  # program -> Debian package
    "qemu-aarch64-static": "qemu-user-static",
    f"{TRIPLE}-gcc": "gcc-aarch64-linux-gnu",
    f"{TRIPLE}-g++": "g++-aarch64-linux-gnu",
    "cmake": "cmake",
    "ninja": "ninja-build",
}


def missing_programs() -> dict:
    return {p: pkg for p, pkg in NEEDS.items() if shutil.which(p) is None}


def cmd_check(a) -> int:
    miss = missing_programs()
    for prog, pkg in NEEDS.items():
        where = shutil.which(prog)
        print(f"{prog:24s} {where or 'MISSING'}  (Debian package {pkg})")
    sd = sdist_path()
    print(f"{'sdist':24s} {sd if sd.is_file() else 'not yet fetched (build fetches it with pip)'}")
    if miss and a.install:
        pkgs = sorted(set(miss.values()))
        subprocess.run(["apt-get", "install", "-y"] + pkgs, check=True)
        miss = missing_programs()
    if miss:
        print("missing: apt-get install -y " + " ".join(sorted(set(miss.values()))))
        return 1
    return 0


# ---------------------------------------------------------------- build ---

def sdist_path() -> Path:
    from strata_ref.models import cache_dir
    return cache_dir() / "sdist" / SDIST


def source_dir() -> Path:
    """The vendored llama.cpp of the sdist, extracted once."""
    src = cache() / "src"
    root = src / SDIST[:-len(".tar.gz")] / "vendor" / "llama.cpp"
    if not (root / "CMakeLists.txt").is_file():
        from peer_build import fetch_sdist
        sd = fetch_sdist()   # pip download into <cache>/sdist, once
        src.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sd) as t:
            t.extractall(src, filter="data")
    return root


def toolchain() -> Path:
    path = cache() / f"{TRIPLE}.cmake"
    text = (f"set(CMAKE_SYSTEM_NAME Linux)\nset(CMAKE_SYSTEM_PROCESSOR aarch64)\n"
            f"set(CMAKE_C_COMPILER {TRIPLE}-gcc)\nset(CMAKE_CXX_COMPILER {TRIPLE}-g++)\n"
            f"set(CMAKE_FIND_ROOT_PATH /usr/{TRIPLE})\n"
            "set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)\n"
            "set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)\n"
            "set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)\n"
            "set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)\n"
            # check_cxx_source_runs during configure runs aarch64 programs
            "set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def cmake_flags(march: str | None) -> list:
    """The CMake cache options of one build (march None: the base build of
    the variant-independent libraries, configured with armv8-a)."""
    return ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF",
            f"-DGGML_CPU_ARM_ARCH={march or BASE_MARCH}", "-DGGML_OPENMP=ON",
            "-DGGML_LLAMAFILE=ON", "-DGGML_CPU_REPACK=ON", "-DGGML_BACKEND_DL=OFF",
            "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]


def _configure(build: Path, march: str | None) -> None:
    src = source_dir()
    flags = cmake_flags(march)
    if march is not None:
        # a variant tree builds ggml-cpu alone: no order dependency on its own
        # copy of ggml-base (the base build's is linked)
        flags = flags + ["-DCMAKE_OPTIMIZE_DEPENDENCIES=ON"]
    stamp = build / "strata_flags.txt"
    if stamp.is_file() and stamp.read_text() == " ".join(flags):
        return
    build.mkdir(parents=True, exist_ok=True)
    subprocess.run(nice(["cmake", "-S", src, "-B", build, "-G", "Ninja",
                         f"-DCMAKE_TOOLCHAIN_FILE={toolchain()}",
                         "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"] + flags), check=True,
                   stdout=subprocess.DEVNULL)
    stamp.write_text(" ".join(flags))


def _commands(build: Path) -> dict:
    """source file -> compile command (build folder replaced by '@')."""
    rows = json.loads((build / "compile_commands.json").read_text())
    return {r["file"].replace(str(build), "@"): r["command"].replace(str(build), "@") for r in rows}


def _check_shared(base: Path, build: Path) -> None:
    """The variant-independent sources must compile the same in `build` as
    in `base`, or the base libraries would not be this variant's."""
    b, v = _commands(base), _commands(build)
    cpu = f"{os.sep}ggml-cpu{os.sep}"
    diff = [f for f in b if cpu not in f and v.get(f) != b[f]]
    if diff or set(b) != set(v):
        raise SystemExit(f"{build}: {len(diff)} shared sources compile differently from the base "
                         f"build (first: {diff[:1]}); build the whole tree instead")


def build_base(jobs: int) -> Path:
    """libllama, libggml, libggml-base (and the armv8-a ggml-cpu) once."""
    base = cache() / "base"
    _configure(base, None)
    subprocess.run(nice(["cmake", "--build", base, "-j", jobs, "--target", "llama", "ggml",
                         "ggml-base"]), check=True)
    return base


def cpu_build_dir(name: str) -> Path:
    """The CMake tree of the variant's ggml-cpu: variants with the same
    -march (sve128, sve256: only the vector length at run time differs)
    share the first one's."""
    march = VARIANTS[name].march
    owner = next(n for n, v in VARIANTS.items() if v.march == march)
    return variant_dir(owner) / "build"


def build_cpu(name: str, jobs: int) -> Path:
    """The variant's libggml-cpu.a (the base build's for -march=armv8-a)."""
    v = VARIANTS[name]
    base = cache() / "base"
    if v.march == BASE_MARCH:
        return base / "ggml" / "src" / "libggml-cpu.a"
    build = cpu_build_dir(name)
    _configure(build, v.march)
    _check_shared(base, build)
    subprocess.run(nice(["cmake", "--build", build, "-j", jobs, "--target", "ggml-cpu"]), check=True)
    return build / "ggml" / "src" / "libggml-cpu.a"


def link_drivers(name: str, cpu_lib: Path) -> None:
    """The static drivers of tools/arm_driver/ against the variant's libraries."""
    v = VARIANTS[name]
    base = cache() / "base"
    out = variant_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    libs = [base / "src" / "libllama.a", base / "ggml" / "src" / "libggml.a", cpu_lib,
            base / "ggml" / "src" / "libggml-base.a"]
    src = source_dir()
    inc = ["-I", src / "include", "-I", src / "ggml" / "include"]
    for prog in ("llama_logits", "ggml_ops"):
        obj = out / f"{prog}.o"
        subprocess.run(nice([f"{TRIPLE}-gcc", "-O2", "-c", DRIVER_DIR / f"{prog}.c", "-o", obj] + inc),
                       check=True)
        # link beside and rename: runs under way keep the file they started with
        subprocess.run(nice([f"{TRIPLE}-g++", "-static", "-o", out / f"{prog}.new", obj] + libs
                            + ["-fopenmp", "-lpthread", "-lm"]), check=True)
        os.replace(out / f"{prog}.new", out / prog)
    (out / "cmake_args.txt").write_text(" ".join(cmake_flags(v.march)) + "\n")


def cmd_build(a) -> int:
    if missing_programs():
        raise SystemExit("missing programs: run python tools/arm_ref.py check")
    names = a.variants or list(VARIANTS)
    t0 = time.time()
    if not a.cpu_only:
        build_base(a.jobs)
    for name in names:
        lib = build_cpu(name, a.jobs)
        if not a.cpu_only:
            link_drivers(name, lib)
        print(f"{name}: built ({time.time() - t0:.0f} s so far)", flush=True)
    return 0


# ----------------------------------------------------------------- runs ---

PROMPT = "The capital of France is"
N_GEN = 32
TOPK = 128


def variant_dir(name: str) -> Path:
    return cache() / name


def qemu(name: str, prog: str, args: list, env: dict | None = None, log: list | None = None) -> str:
    """Run one of the variant's static drivers under qemu-aarch64-static with
    the variant's CPU model; returns stdout (stderr appended to `log`).
    Raises RuntimeError with the driver's stderr tail on failure."""
    v = VARIANTS.get(name) or NATIVE[name]
    exe = variant_dir(name) / prog
    if not exe.is_file():
        raise SystemExit(f"no {exe}: run python tools/arm_ref.py build {name}")
    # OpenMP threads that sleep at a barrier instead of spinning: twice as fast
    # under qemu on a loaded machine, and the same bits (ggml splits work by
    # thread index, never by timing)
    env = dict(os.environ, OMP_WAIT_POLICY="passive", **(env or {}))
    emu = ["qemu-aarch64-static", "-cpu", v.qemu_cpu] if v.qemu_cpu else []
    r = subprocess.run(nice(emu + [exe] + list(args)), capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{name} {prog} {' '.join(map(str, args))[:200]}: exit {r.returncode}: "
                           f"{r.stderr.strip()[-800:]}")
    if log is not None:
        log.append(r.stderr)
    return r.stdout


def read_logits(path: Path) -> tuple:
    """(ids int32 (n_ids,), rows float32 (n_rows, n_vocab)) of a
    llama_logits output file."""
    raw = path.read_bytes()
    if raw[:8] != b"ARMLOG01":
        raise ValueError(f"{path}: not a llama_logits output")
    n_vocab, n_rows, n_ids = np.frombuffer(raw, np.int32, 3, 8)
    ids = np.frombuffer(raw, np.int32, n_ids, 20)
    rows = np.frombuffer(raw, np.float32, n_rows * n_vocab, 20 + 4 * n_ids).reshape(n_rows, n_vocab)
    return ids.copy(), rows.copy()


def run_llama(name: str, model: Path, steps: list, *, n_ctx: int = 512, kv: tuple = (),
              env: dict | None = None, dump: tuple = ()) -> dict:
    """llama_logits under qemu: {'ids', 'rows', 'system_info', 'sve_bytes',
    'repack'}. `kv`: (type_k id, type_v id, flash_attn 0/1) when not the
    default; `dump`: (file, layers) to record those layers' nodes
    (`read_dump`)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.bin"
        opts = ["--n-ctx", n_ctx, "--n-batch", n_ctx]
        if kv:
            opts += ["--type-k", kv[0], "--type-v", kv[1], "--flash-attn", kv[2]]
        if dump:
            opts += ["--dump", dump[0], "--dump-layer", ",".join(map(str, dump[1]))]
        log = []
        text = qemu(name, "llama_logits", opts + [model, out] + steps, env, log)
        ids, rows = read_logits(out)
    info = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    return {"ids": ids, "rows": rows, "system_info": info.get("system_info", ""),
            "sve_bytes": int(info.get("sve_bytes", "0")), "repack": repack_summary(log[0])}


def read_dump(path: Path) -> dict:
    """The nodes of a `llama_logits --dump` file as tools/llama_dump.py
    `dump` keys them: `<call>:<index>:<name>` -> float32 (ne3, ne2, ne1,
    ne0), `<...>:op` -> int32."""
    raw = path.read_bytes()
    store, pos = {}, 0
    while pos < len(raw):
        call, index, op, _type = np.frombuffer(raw, np.int32, 4, pos)
        ne = np.frombuffer(raw, np.int64, 4, pos + 16)
        name = raw[pos + 48:pos + 112].split(b"\0", 1)[0].decode()
        n = int(np.prod(ne))
        key = f"{call}:{index:04d}:{name}"
        store[key] = np.frombuffer(raw, np.float32, n, pos + 112).reshape(ne[::-1]).copy()
        store[key + ":op"] = np.int32(op)
        pos += 112 + 4 * n
    return store


def repack_summary(log: str) -> str:
    """'q4_0_4x4 x180, q8_0_4x4 x1': the CPU_REPACK layouts ggml chose, from
    its debug log (`repack tensor NAME with TYPE_RxC`), '' when none."""
    counts = {}
    for m in re.finditer(r"repack tensor \S+ with (\S+)", log):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))


def provenance(name: str, job: str, system_info: str, sve_bytes: int, repack: str = "") -> dict:
    """The keys every stored file carries (those of tools/peer_env.py, and
    the ARM build: CMake flags, qemu CPU model, SVE vector length)."""
    v = VARIANTS.get(name) or NATIVE[name]
    return dict(llama_cpp_version=np.array("0.3.36"), system_info=np.array(system_info),
                profile=np.array(name), cmake_args=np.array(" ".join(cmake_flags(v.march))),
                qemu_cpu=np.array(v.qemu_cpu), sve_bytes=np.int64(sve_bytes),
                repack=np.array(repack),
                command=np.array(f"python tools/arm_ref.py data {name} --only {job}"))


def topk(rows: np.ndarray, k: int):
    """tools/llama_ref.py `_topk`: ids, logits of the k largest per row
    (stable order), and the float64 log-sum-exp of each whole row."""
    sys.path.insert(0, str(REPO / "tools"))
    from llama_ref import _topk
    return _topk(rows, k)


def row_hashes(rows: np.ndarray) -> np.ndarray:
    from infer_helpers import row_hashes as rh
    return rh(rows)


def data_dir(name: str) -> Path:
    d = NATIVE_OUT[name] if name in NATIVE else REPO / "tests" / "data" / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def greedy_plan(prompt_steps: list, n_gen: int) -> list:
    """The plan of tools/llama_ref.py `logits` / `moe`: the prompt pass, n_gen
    greedy tokens one call each, then `reset` and one batched pass over
    prompt + continuation (Llama.reset, Llama.eval)."""
    return prompt_steps + ["eval:0:", f"gen:{n_gen}", "reset", "eval:0:"]


def split_greedy(r: dict, n_gen: int) -> dict:
    ids, rows = r["ids"], r["rows"]
    n = len(ids)
    if rows.shape[0] != 2 * n:
        raise RuntimeError(f"expected {2 * n} rows, got {rows.shape[0]}")
    return {"prompt_ids": ids[:n - n_gen], "greedy_ids": ids[n - n_gen:],
            "incr": rows[:n], "batched": rows[n:]}


def job_logits(name: str, model: str) -> None:
    """tools/llama_ref.py `logits MODEL`: a registry model, a variant name of
    tests/model_variants.py, or `smollm2-rot-q8_0` (the rotated SmolLM2 of
    tests/test_rotate.py)."""
    from model_variants import VARIANTS as MV, build_variant
    from strata_ref.models import resolve
    with tempfile.TemporaryDirectory() as d:
        if model in MV:
            path, stem = build_variant(model), model
        elif model == "smollm2-rot-q8_0":
            from strata_ref.quality.rotate import rotate_gguf
            path, stem = Path(d) / f"{model}.gguf", model
            rotate_gguf(resolve("SmolLM2-135M-Instruct"), path, type="Q8_0", seed=0)
        else:
            path = resolve(model)
            stem = Path(path).stem
        prompt = Path(d) / "prompt.txt"
        prompt.write_text(PROMPT, encoding="utf-8")
        r = run_llama(name, path, greedy_plan([f"tok:{prompt}"], N_GEN))
        sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    g = split_greedy(r, N_GEN)
    res = dict(prompt=np.array(PROMPT), prompt_ids=g["prompt_ids"], greedy_ids=g["greedy_ids"],
               n_vocab=np.int64(r["rows"].shape[1]), sha256=np.array(sha))
    for kind in ("batched", "incr"):
        i, v, l = topk(g[kind], TOPK)
        res.update({f"{kind}_ids": i, f"{kind}_logits": v, f"{kind}_lse": l,
                    f"{kind}_hash": row_hashes(g[kind])})
    out = data_dir(name) / f"llama_ref_{stem}.npz"
    np.savez_compressed(out, **res, **provenance(name, f"logits:{model}", r["system_info"],
                                                 r["sve_bytes"], r["repack"]))
    print(f"{out.name}: greedy {g['greedy_ids'].tolist()}", flush=True)


#: the KV-cache configurations made per ARM variant: every one of
#: tools/llama_ref.py KV_CONFIGS (the cache types with and without flash
#: attention, the rotation off, the long prompt's tiled / split-KV paths),
#: as for the x86 profiles
def _kv_arm() -> tuple:
    from llama_ref import KV_CONFIGS
    return tuple(KV_CONFIGS)


def _kv_config_run(name: str, model: Path, cfg: str, res: dict, plan) -> tuple:
    """Configuration `cfg` of tools/llama_ref.py `KV_CONFIGS` under qemu
    (its cache types, flash attention, rotation): plan(prompt) gives the
    prompt's driver step and the greedy token count. Adds the
    configuration's keys (type_k, type_v, flash_attn, rot_disable, prompt,
    prompt_ids, greedy_ids) to `res`; returns (the run, `split_greedy`)."""
    from llama_ref import KV_CONFIGS, _GGML_TYPE_ID
    tk, tv, fa, norot, prompt = KV_CONFIGS[cfg]
    step, n_gen = plan(prompt)
    env = {"LLAMA_ATTN_ROT_DISABLE": "1"} if norot else {}
    info = run_llama(name, model, greedy_plan([step], n_gen), env=env,
                     kv=(_GGML_TYPE_ID[tk], _GGML_TYPE_ID[tv], int(fa)))
    g = split_greedy(info, n_gen)
    res.update({f"{cfg}:type_k": np.array(tk), f"{cfg}:type_v": np.array(tv),
                f"{cfg}:flash_attn": np.bool_(fa), f"{cfg}:rot_disable": np.bool_(norot),
                f"{cfg}:prompt": np.array(prompt), f"{cfg}:prompt_ids": g["prompt_ids"],
                f"{cfg}:greedy_ids": g["greedy_ids"]})
    return info, g


def job_kv(name: str, model: str, configs: tuple | None = None) -> None:
    """tools/llama_ref.py `kvcache MODEL --configs ...`: per configuration
    (cache types, flash attention, rotation, prompt) a fresh context, the
    incremental pass with greedy tokens, then the batched one; each row as
    top-32 ids / logits, log-sum-exp and whole-row hash."""
    from llama_ref import N_GEN_LONG, N_LONG
    from strata_ref.models import resolve
    from strata_ref.quality.prompts import DEFAULT_PROMPTS
    configs = _kv_arm() if configs is None else configs
    path = resolve(model)
    stem = Path(path).stem
    res, info = {"configs": np.array(list(configs))}, None
    with tempfile.TemporaryDirectory() as d:
        short, long_ = Path(d) / "short.txt", Path(d) / "long.txt"
        short.write_text(PROMPT, encoding="utf-8")
        long_.write_text("\n".join(DEFAULT_PROMPTS), encoding="utf-8")
        for cfg in configs:
            info, g = _kv_config_run(name, path, cfg, res, lambda prompt: (
                (f"tok:{short}", N_GEN) if prompt == "short" else (f"tok:{long_}:{N_LONG}", N_GEN_LONG)))
            for kind in ("batched", "incr"):
                i, v, l = topk(g[kind], 32)
                res.update({f"{cfg}:{kind}_ids": i, f"{cfg}:{kind}_logits": v,
                            f"{cfg}:{kind}_lse": l, f"{cfg}:{kind}_hash": row_hashes(g[kind])})
            print(f"  {cfg}: greedy {g['greedy_ids'].tolist()}", flush=True)
    out = data_dir(name) / f"llama_kv_{stem}.npz"
    np.savez_compressed(out, n_threads=np.int64(2), n_ctx=np.int64(512), **res,
                        **provenance(name, f"kv:{model}", info["system_info"], info["sve_bytes"],
                                     info["repack"]))
    print(out.name, flush=True)


def job_moekv(name: str, arch: str) -> None:
    """tools/llama_ref.py `moekv --arch ARCH`: the tiny model (its seed)
    with each configuration of `MOEKV_CONFIGS[arch]`: greedy ids, and per
    pass every logit (`MOEKV_FULL`) or each row's hash and argmax, into
    llama_kv_moe_ARCH.npz."""
    from infer_helpers import MOE_N_GREEDY, TINY_IDS, moe_seed, tiny_moe_model
    from llama_ref import MOEKV_CONFIGS, MOEKV_FULL, N_GEN_LONG, moekv_long_ids
    names = MOEKV_CONFIGS[arch]
    res, info = {"configs": np.array(list(names))}, None
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"tiny_{arch}.gguf"
        tiny_moe_model(arch, path, seed=moe_seed(arch))
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        for cfg in names:
            info, g = _kv_config_run(name, path, cfg, res, lambda prompt: (
                ("ids:" + ",".join(map(str, TINY_IDS)), MOE_N_GREEDY) if prompt == "short"
                else ("ids:" + ",".join(map(str, moekv_long_ids())), N_GEN_LONG)))
            for kind in ("batched", "incr"):
                if cfg in MOEKV_FULL:
                    res[f"{cfg}:{kind}"] = g[kind]
                else:
                    res[f"{cfg}:{kind}_hash"] = row_hashes(g[kind])
                    res[f"{cfg}:{kind}_argmax"] = np.argmax(g[kind], axis=1).astype(np.int32)
            print(f"  {cfg}: greedy {g['greedy_ids'].tolist()}", flush=True)
    out = data_dir(name) / f"llama_kv_moe_{arch}.npz"
    np.savez_compressed(out, seed=np.int64(moe_seed(arch)), n_threads=np.int64(2), n_ctx=np.int64(512),
                        sha256=np.array(sha), **res,
                        **provenance(name, f"moekv:{arch}", info["system_info"], info["sve_bytes"],
                                     info["repack"]))
    print(out.name, flush=True)


#: the op-level vectors of tools/llama_dump.py `--vectors` per x86 profile:
#: file -> (model, layers); split 5, decode call 7, ids from the variant's own
#: llama_ref file (`--prompt-ref`)
OPS = {"llama_ops_smollm2.npz": ("SmolLM2-135M-Instruct", (0,)),
       "llama_ops_qwen.npz": ("Qwen2.5-Coder-0.5B-Instruct", (2, 3))}


def job_ops(name: str, fname: str) -> None:
    """tools/llama_dump.py MODEL FILE --prompt-ref --split 5 --vectors
    LAYERS: the inputs and outputs of one or two layers' operations, from
    the build's own nodes (its cb_eval), reusing llama_dump.vectors."""
    import llama_dump
    from strata_ref.models import resolve
    model, layers = OPS[fname]
    path = resolve(model)
    ref = np.load(data_dir(name) / f"llama_ref_{Path(path).stem}.npz")
    ids = [int(t) for t in np.concatenate([ref["prompt_ids"], ref["greedy_ids"]])]
    seen = {}

    def dump(model_path, ids_, split, type_k=1, type_v=1, flash_attn=False, capture=None):
        # llama_dump.dump's contract: a fresh context, ids in one call or the
        # first `split` then one per call
        steps = ["ids:" + ",".join(map(str, ids_))]
        if split is None:
            steps.append("eval:0:")
        else:
            steps += [f"eval:0:{split}"] + [f"eval:{k}:{k + 1}" for k in range(split, len(ids_))]
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "dump.bin"
            r = run_llama(name, Path(model_path), steps, dump=(f, layers))
            store = read_dump(f)
        seen.update(r)
        store["logits"], store["ids"] = r["rows"], np.array(ids_, np.int32)
        return store

    llama_dump.dump = dump
    out = llama_dump.vectors(str(path), ids, list(layers), 5, 7)
    np.savez_compressed(data_dir(name) / fname, **out,
                        **provenance(name, f"ops:{fname}", seen["system_info"], seen["sve_bytes"],
                                     seen["repack"]))
    print(fname, flush=True)


def job_tiny(name: str) -> None:
    """tools/llama_ref.py `synthetic`: the tiny qwen3 / gemma3 models, one
    batched pass over TINY_IDS in a fresh context."""
    from infer_helpers import TINY_IDS, tiny_model
    res, info = {}, None
    with tempfile.TemporaryDirectory() as d:
        for arch in ("qwen3", "gemma3"):
            path = Path(d) / f"tiny_{arch}.gguf"
            tiny_model(arch, path, seed=0)
            info = run_llama(name, path, ["ids:" + ",".join(map(str, TINY_IDS)), "eval:0:"])
            res[f"{arch}_logits"] = info["rows"]
            res[f"{arch}_sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
    out = data_dir(name) / "llama_ref_tiny.npz"
    np.savez_compressed(out, ids=np.array(TINY_IDS, np.int32), **res,
                        **provenance(name, "tiny", info["system_info"], info["sve_bytes"], info["repack"]))
    print(out.name, flush=True)


def job_typed(name: str) -> None:
    """tools/llama_ref.py `typed`: IQ4_NL / MXFP4 models, one batched pass
    over IDS, then (after reset) N_PROMPT ids and one id per call."""
    from typed_models import IDS, N_PROMPT, TYPED, typed_model
    res, info = {}, None
    with tempfile.TemporaryDirectory() as d:
        for t in TYPED:
            path = Path(d) / f"typed_{t}.gguf"
            typed_model(t, path, seed=0)
            steps = ["ids:" + ",".join(map(str, IDS)), "eval:0:", "reset", f"eval:0:{N_PROMPT}"]
            steps += [f"eval:{k}:{k + 1}" for k in range(N_PROMPT, len(IDS))]
            info = run_llama(name, path, steps)
            n = len(IDS)
            res[f"{t}_batched"], res[f"{t}_incr"] = info["rows"][:n], info["rows"][n:]
            res[f"{t}_sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
    out = data_dir(name) / "llama_ref_typed.npz"
    np.savez_compressed(out, ids=np.array(IDS, np.int32), n_prompt=np.int64(N_PROMPT), **res,
                        **provenance(name, "typed", info["system_info"], info["sve_bytes"], info["repack"]))
    print(out.name, flush=True)


def job_iq(name: str) -> None:
    """tools/llama_ref_iq.py: the tiny I-quant model over PASSES one after the
    other (n_ctx 256)."""
    from iq_model import PASSES, tiny_iq_model
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tiny_iq.gguf"
        tiny_iq_model(path)
        steps, n = [], 0
        for ids in PASSES:
            steps += ["ids:" + ",".join(map(str, ids)), f"eval:{n}:"]
            n += len(ids)
        info = run_llama(name, path, steps, n_ctx=256)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
    out = data_dir(name) / "llama_ref_tiny_iq.npz"
    np.savez_compressed(out, logits=info["rows"], sha256=np.array(sha),
                        **provenance(name, "iq", info["system_info"], info["sve_bytes"], info["repack"]))
    print(out.name, flush=True)


def job_moe(name: str, arch: str) -> None:
    """tools/llama_ref.py `moe`: one tiny MoE / hybrid model (seed
    `moe_seed(arch)`), at n_ctx 512 and each smaller context of `MOE_CTX`
    (keys ctx<N>_greedy_ids, ctx<N>_batched, ctx<N>_incr)."""
    from infer_helpers import MOE_CTX, MOE_N_GREEDY, TINY_IDS, moe_seed, tiny_moe_model
    plan = greedy_plan(["ids:" + ",".join(map(str, TINY_IDS))], MOE_N_GREEDY)
    extra, infos = {}, []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"tiny_{arch}.gguf"
        tiny_moe_model(arch, path, seed=moe_seed(arch))
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        for n_ctx in (512, *MOE_CTX.get(arch, ())):
            r = run_llama(name, path, plan, n_ctx=n_ctx)
            g = split_greedy(r, MOE_N_GREEDY)
            key = "" if n_ctx == 512 else f"ctx{n_ctx}_"
            extra.update({key + k: g[k] for k in ("greedy_ids", "batched", "incr")})
            infos.append(r)
    out = data_dir(name) / f"llama_ref_moe_{arch}.npz"
    r = infos[0]
    np.savez_compressed(out, seed=np.int64(moe_seed(arch)), prompt_ids=g["prompt_ids"], **extra,
                        sha256=np.array(sha),
                        **provenance(name, f"moe:{arch}", r["system_info"], r["sve_bytes"], r["repack"]))
    print(f"{out.name}: greedy {extra['greedy_ids'].tolist()}", flush=True)


def _cache_type_id(ct: str) -> int:
    """The ggml type id of KV cache type `ct` (tools/llama_ref.py `_GGML_TYPE_ID`)."""
    sys.path.insert(0, str(REPO / "tools"))
    from llama_ref import _GGML_TYPE_ID
    return _GGML_TYPE_ID[ct]


def job_moefa(name: str, spec: str) -> None:
    """tools/llama_ref.py `moe --flash-attn [--cache-type T] [--kv-lora-rank
    R]`: spec `ARCH[-rR][:T]` (T default f16), the tiny model with flash
    attention on over a cache of type T (K and V), the short run's every
    logit and the long run's (`FA_LONG_IDS`) row hashes, into
    llama_ref_moe_fa[_T]_ARCH[-rR].npz."""
    from infer_helpers import FA_LONG_IDS, FA_LONG_N_GREEDY, MOE_N_GREEDY, TINY_IDS, moe_seed, tiny_moe_model
    stem, _, ct = spec.partition(":")
    ct = ct or "f16"
    arch, rank = stem, None
    m = re.fullmatch(r"(.+)-r(\d+)", stem)
    if m:
        arch, rank = m.group(1), int(m.group(2))
    tid = _cache_type_id(ct)
    kv = (tid, tid, 1)
    runs = {}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"tiny_{stem}.gguf"
        tiny_moe_model(arch, path, seed=moe_seed(arch), **({} if rank is None else {"kv_lora_rank": rank}))
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        for key, ids, n in (("", TINY_IDS, MOE_N_GREEDY), ("long_", FA_LONG_IDS, FA_LONG_N_GREEDY)):
            r = run_llama(name, path, greedy_plan(["ids:" + ",".join(map(str, ids))], n), kv=kv)
            runs[key] = (r, split_greedy(r, n))
    r, g = runs[""]
    lg = runs["long_"][1]
    extra = {} if rank is None else {"kv_lora_rank": np.int64(rank)}
    tag = "fa" if ct == "f16" else f"fa_{ct}"
    out = data_dir(name) / f"llama_ref_moe_{tag}_{stem}.npz"
    np.savez_compressed(out, seed=np.int64(moe_seed(arch)), flash_attn=np.bool_(True), **extra,
                        type_k=np.array(ct), type_v=np.array(ct), prompt_ids=g["prompt_ids"],
                        greedy_ids=g["greedy_ids"], batched=g["batched"], incr=g["incr"],
                        long_prompt_ids=lg["prompt_ids"], long_greedy_ids=lg["greedy_ids"],
                        long_batched_hash=row_hashes(lg["batched"]), long_incr_hash=row_hashes(lg["incr"]),
                        sha256=np.array(sha),
                        **provenance(name, f"moefa:{spec}", r["system_info"], r["sve_bytes"], r["repack"]))
    print(f"{out.name}: greedy {g['greedy_ids'].tolist()} long {lg['greedy_ids'].tolist()}", flush=True)


#: `mmodd`: the types of 32-value blocks (and the float ones) with rows of
#: an odd number of blocks, where the NEON `vec_dot`s end in their scalar
#: tail (MLA's cached head of 160)
MM_ODD_COLS = 160
MM_ODD_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4")


def job_mm(name: str, odd: bool = False) -> None:
    """tools/ggml_mm.py: every weight type through the build's ggml_mul_mat
    (same seeds, shapes and npz layout), into ggml_mm.npz; odd: the types
    of `MM_ODD_TYPES` with rows of `MM_ODD_COLS`, into ggml_mm_odd.npz."""
    import ggml_mm
    from strata_ref.types import GGMLType
    cols = MM_ODD_COLS if odd else ggml_mm.COLS
    rng = np.random.default_rng(20261201)
    xs = {n: rng.standard_normal((n, cols)).astype(np.float32) for n in ggml_mm.NS}
    res = {f"x{n}": x for n, x in xs.items()}
    skipped = []
    with tempfile.TemporaryDirectory() as d:
        for i, t in enumerate(MM_ODD_TYPES if odd else ggml_mm.TYPES):
            w = ggml_mm.weights(t, 1000 + i, cols)
            wf = Path(d) / "w.bin"
            w.tofile(wf)
            try:
                for n, x in xs.items():
                    xf, yf = Path(d) / "x.bin", Path(d) / "y.bin"
                    x.tofile(xf)
                    qemu(name, "ggml_ops", ["mm", int(GGMLType[t]), ggml_mm.ROWS, cols, n, wf, xf, yf])
                    res[f"{t}_y{n}"] = np.fromfile(yf, np.float32).reshape(n, ggml_mm.ROWS)
            except RuntimeError as e:
                skipped.append(t)
                print(f"{t}: skipped ({e})")
                continue
            res[f"{t}_w"] = w
    info = qemu(name, "ggml_ops", ["info"]).strip()
    out = data_dir(name) / ("ggml_mm_odd.npz" if odd else "ggml_mm.npz")
    sve = int(re.search(r"sve_bytes (\d+)", info).group(1))
    np.savez_compressed(out, rows=np.int64(ggml_mm.ROWS), cols=np.int64(cols),
                        ns=np.array(ggml_mm.NS), skipped=np.array(skipped), **res,
                        **provenance(name, "mmodd" if odd else "mm", _system_info(name), sve),
                        ggml_cpu_info=np.array(info))
    print(out.name, "skipped", skipped, flush=True)


def job_actquant(name: str) -> None:
    """tools/llama_ref.py `actquant`: ggml-cpu's from_float for Q8_0, Q8_1,
    Q8_K on `act_inputs()`, row by row."""
    from llama_ref import act_inputs
    x = act_inputs()
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for tname, tid, bb, qk in (("q8_0", 8, 34, 32), ("q8_1", 9, 36, 32), ("q8_k", 15, 292, 256)):
            rows = []
            for row in x:
                xf, of = Path(d) / "x.bin", Path(d) / "q.bin"
                row.astype(np.float32).tofile(xf)
                qemu(name, "ggml_ops", ["quant", tid, row.size, xf, of])
                rows.append(np.fromfile(of, np.uint8).reshape(-1, bb))
            res[tname] = np.stack(rows)
    out = data_dir(name) / "ggml_act_quant.npz"
    info = qemu(name, "ggml_ops", ["info"]).strip()
    sve = int(re.search(r"sve_bytes (\d+)", info).group(1))
    np.savez_compressed(out, x=x, **res, **provenance(name, "actquant", _system_info(name), sve))
    print(out.name, flush=True)


#: the KV-cache block types whose `from_float` is ggml-base's reference
#: quantizer (`strata_ref.cpu.base_quant`), with their ggml type ids
BASE_QUANT_TYPES = (("q4_0", 2), ("q4_1", 3), ("q5_0", 6), ("q5_1", 7), ("iq4_nl", 20))


def base_quant_inputs(per_type: int = 48, seed: int = 0, budget: int = 1 << 23) -> dict:
    """{type name: float32 (blocks, 32)}: for each type of
    `BASE_QUANT_TYPES`, up to `per_type` seeded N(0, 1) blocks whose
    contracted quantization differs from the one rounded twice, searched
    among `budget` blocks (so the data can tell the two apart), then 16
    plain seeded blocks. Q4_0 / Q5_0 give about 4 and 8 such blocks per
    million, IQ4_NL about 70; Q4_1 / Q5_1 none in 8.4 million (their
    `v + 0.5f` is exact except across a power of two: the FMA changes
    nothing there in practice)."""
    from strata_ref.cpu.base_quant import quantize_base
    from strata_ref.cpu.isa import chain
    fused, plain = chain(("arm_neon", "generic")), chain(("x86_64", "generic"))
    rng = np.random.default_rng(seed)
    out = {}
    for tname, _ in BASE_QUANT_TYPES:
        found, n, seen = [], 0, 0
        while n < per_type and seen < budget:
            x = rng.standard_normal((32768, 32)).astype(np.float32)
            diff = (quantize_base(x, tname, fused) != quantize_base(x, tname, plain)).any(axis=1)
            found.append(x[diff])
            n, seen = n + int(diff.sum()), seen + len(x)
        out[tname] = np.concatenate([np.concatenate(found)[:per_type],
                                     rng.standard_normal((16, 32)).astype(np.float32)])
        print(f"  {tname}: {min(n, per_type)} blocks where the FMA changes the bytes "
              f"(of {seen} searched)", flush=True)
    return out


def unary_inputs(n_search: int = 512, n_plain: int = 256, seed: int = 0) -> dict:
    """The inputs of `unary`: for tanh, float32 values where aarch64
    glibc's contracted `tanhf` and the x86 one differ (`cpu.libm`, searched
    in seeded random values of magnitude 2^-12 .. 2^5), then plain ones and
    the branch edges of `tanhf` / `expm1f`; for gelu, every finite F16
    value in (-10, 10) as float32 (the whole of ggml's table in use)."""
    from strata_ref.cpu.libm import tanhf_array
    rng = np.random.default_rng(seed)
    x = (rng.choice([-1.0, 1.0], 1 << 20) * np.exp2(rng.uniform(-12, 5, 1 << 20))).astype(np.float32)
    differ = x[tanhf_array(x, True).view(np.uint32) != tanhf_array(x, False).view(np.uint32)]
    edges = np.array([0.0, -0.0, 1.0, -1.0, 22.0, -22.0, 2.0 ** -55, 0.3465736, 0.34657362, 0.5198604,
                      1.0397208, 1.0397209, 12.0, 21.99, np.inf, -np.inf], np.float32)
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    gelu = np.unique(h[np.isfinite(h) & (np.abs(h) < 10)])
    return {"tanh": np.concatenate([differ[:n_search], x[-n_plain:], edges]), "gelu": gelu}


def job_unary(name: str) -> None:
    """ggml-cpu's `tanh` (libm `tanhf`) and `gelu` (the F16 table) ops of
    the build (`ggml_ops unary`) on `unary_inputs()`."""
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for op, x in unary_inputs().items():
            xf, of = Path(d) / "x.bin", Path(d) / "y.bin"
            x.tofile(xf)
            qemu(name, "ggml_ops", ["unary", op, x.size, xf, of])
            res[f"{op}_x"], res[op] = x, np.fromfile(of, np.float32)
    out = data_dir(name) / "ggml_unary.npz"
    info = qemu(name, "ggml_ops", ["info"]).strip()
    sve = int(re.search(r"sve_bytes (\d+)", info).group(1))
    np.savez_compressed(out, **res, **provenance(name, "unary", _system_info(name), sve))
    print(out.name, {k: v.shape for k, v in res.items()}, flush=True)


def job_basequant(name: str) -> None:
    """ggml-cpu's from_float of the KV-cache block types (ggml-base's
    `quantize_row_<type>_ref`, as this build compiled it) on
    `base_quant_inputs()`, all blocks of a type as one row."""
    x = base_quant_inputs()
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for tname, tid in BASE_QUANT_TYPES:
            xf, of = Path(d) / "x.bin", Path(d) / "q.bin"
            x[tname].astype(np.float32).tofile(xf)
            qemu(name, "ggml_ops", ["quant", tid, x[tname].size, xf, of])
            res[f"{tname}_x"] = x[tname]
            res[tname] = np.fromfile(of, np.uint8).reshape(len(x[tname]), -1)
    out = data_dir(name) / "ggml_base_quant.npz"
    info = qemu(name, "ggml_ops", ["info"]).strip()
    sve = int(re.search(r"sve_bytes (\d+)", info).group(1))
    np.savez_compressed(out, **res, **provenance(name, "basequant", _system_info(name), sve))
    print(out.name, flush=True)


def _system_info(name: str) -> str:
    """llama_print_system_info() of the variant's build (a tiny model run)."""
    from infer_helpers import tiny_model
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tiny.gguf"
        tiny_model("qwen3", path, seed=0)
        return run_llama(name, path, ["ids:1", "eval:0:"])["system_info"]


def jobs_all() -> list:
    from infer_helpers import MOE_LAYERS
    from model_variants import VARIANTS as MV
    return (["actquant", "basequant", "unary", "mm", "mmodd", "tiny", "typed", "iq"] + [f"moe:{a}" for a in MOE_LAYERS]
            + [f"logits:{m}" for m in ("SmolLM2-135M-Instruct", "gemma-3-270m",
                                       "Qwen2.5-Coder-0.5B-Instruct")]
            + [f"logits:{v}" for v in MV] + ["logits:smollm2-rot-q8_0", "kv:SmolLM2-135M-Instruct"]
            + [f"ops:{f}" for f in OPS] + [f"moefa:{s}" for s in MOEFA_SPECS]
            + ["moekv:gemma4", "moekv:gemma4-moe"])


#: the flash-attention runs of deepseek2's MLA cache (`moefa`), as the x86
#: profiles store them: F16 for deepseek2 and deepseek2-v3, every other
#: cache type for deepseek2, and the cached head of 192 (kv_lora_rank 160)
#: over F16, Q8_0, Q4_0
MOEFA_SPECS = (("deepseek2", "deepseek2-v3", "deepseek2-r160", "deepseek2-r160:q8_0", "deepseek2-r160:q4_0")
               + tuple(f"deepseek2:{t}" for t in ("f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")))


def job_file(job: str) -> str:
    """The file a job writes under tests/data/<variant>/."""
    kind, _, arg = job.partition(":")
    if kind == "kv":
        from strata_ref.models import lookup
        return f"llama_kv_{lookup(arg).name}.npz"
    if kind == "ops":
        return arg
    if kind == "moekv":
        return f"llama_kv_moe_{arg}.npz"
    if kind == "moefa":
        stem, _, ct = arg.partition(":")
        return f"llama_ref_moe_{'fa' if ct in ('', 'f16') else 'fa_' + ct}_{stem}.npz"
    if kind == "logits":
        from model_variants import VARIANTS as MV
        from strata_ref.models import lookup
        stem = arg if (arg in MV or arg == "smollm2-rot-q8_0") else lookup(arg).name
        return f"llama_ref_{stem}.npz"
    return {"moe": f"llama_ref_moe_{arg}.npz", "tiny": "llama_ref_tiny.npz",
            "typed": "llama_ref_typed.npz", "iq": "llama_ref_tiny_iq.npz", "mm": "ggml_mm.npz",
            "actquant": "ggml_act_quant.npz", "basequant": "ggml_base_quant.npz", "mmodd": "ggml_mm_odd.npz",
            "unary": "ggml_unary.npz"}[kind]


def run_job(name: str, job: str) -> None:
    kind, _, arg = job.partition(":")
    t0 = time.time()
    if kind == "logits":
        job_logits(name, arg)
    elif kind == "kv":
        job_kv(name, arg)
    elif kind == "ops":
        job_ops(name, arg)
    elif kind == "moe":
        job_moe(name, arg)
    elif kind == "moefa":
        job_moefa(name, arg)
    elif kind == "moekv":
        job_moekv(name, arg)
    else:
        {"tiny": job_tiny, "typed": job_typed, "iq": job_iq, "mm": job_mm,
         "actquant": job_actquant, "basequant": job_basequant, "unary": job_unary,
         "mmodd": lambda n: job_mm(n, odd=True)}[kind](name)
    print(f"  {name} {job}: {time.time() - t0:.0f} s", flush=True)


def cmd_data(a) -> int:
    if missing_programs():
        raise SystemExit("missing programs: run python tools/arm_ref.py check")
    jobs = a.only.split(",") if a.only else jobs_all()
    # job by job, each for every variant: a run cut short leaves every
    # variant with the same files
    for job in jobs:
        for name in a.variants or list(VARIANTS):
            if a.missing and (REPO / "tests" / "data" / name / job_file(job)).is_file():
                continue
            run_job(name, job)
    return 0


# ------------------------------------------------------------- validate ---

#: pseudo-variants running the drivers natively against an x86 peer build
#: (`validate`), and where their files go
NATIVE: dict = {}
NATIVE_OUT: dict = {}
VALIDATE_JOBS = ("tiny", "typed", "iq", "moe:qwen3moe", "moe:qwen3next", "moe:qwen35moe",
                 "moe:gpt-oss", "actquant", "mm", "logits:SmolLM2-135M-Instruct",
                 "logits:smollm2-q4_0", "kv:SmolLM2-135M-Instruct", "ops:llama_ops_smollm2.npz")


def cmd_validate(a) -> int:
    """The drivers against llama-cpp-python itself: compile them natively
    against the x86 peer build of tools/peer_build.py (its shared
    libraries), run the same jobs and compare every computed array with the
    peer's stored data under tests/data/<profile>/ bitwise. Equal files mean
    the drivers make the calls llama-cpp-python's `Llama` makes."""
    sys.path.insert(0, str(REPO / "tools"))
    from peer_build import peer_dir
    from strata_ref.cpu.profiles import PROFILES, host_flags
    prof = a.peer
    missing = sorted(set(PROFILES[prof].cpu_flags) - set(host_flags()))
    if missing:
        raise SystemExit(f"this CPU cannot run the {prof} peer (missing {' '.join(missing)})")
    lib = peer_dir(prof) / "site" / "llama_cpp" / "lib"
    if not (lib / "libllama.so").is_file():
        raise SystemExit(f"no {prof} peer build: run python tools/peer_build.py {prof}")
    name = f"x86-{prof}"
    NATIVE[name] = Variant(name, "", "", "", f"the {prof} peer, natively")
    out = variant_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    src = source_dir()
    for prog, libs in (("llama_logits", ["-lllama", "-lggml", "-lggml-base", "-lggml-cpu"]),
                       ("ggml_ops", ["-lggml", "-lggml-base", "-lggml-cpu"])):
        subprocess.run(nice(["gcc", "-O2", "-I", src / "include", "-I", src / "ggml" / "include",
                             DRIVER_DIR / f"{prog}.c", "-o", out / prog, f"-L{lib}"] + libs
                            + [f"-Wl,-rpath,{lib}"]), check=True)
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        NATIVE_OUT[name] = Path(d)
        for job in (a.only.split(",") if a.only else VALIDATE_JOBS):
            run_job(name, job)
            f = job_file(job)
            ours, theirs = _results(Path(d) / f), _results(REPO / "tests" / "data" / prof / f)
            keys = [k for k in theirs if k != "configs" and (k in ours or not job.startswith("kv"))]
            diff = [k for k in keys if k not in ours or ours[k].tobytes() != theirs[k].tobytes()
                    or ours[k].shape != theirs[k].shape]
            bad += bool(diff)
            print(f"{job}: {len(keys) - len(diff)}/{len(keys)} arrays bitwise equal to "
                  f"tests/data/{prof}/{f}" + (f"; differ: {diff[:5]}" if diff else ""), flush=True)
    return 1 if bad else 0


# -------------------------------------------------------------- classes ---

#: keys that describe how a file was made, not what llama.cpp computed
PROVENANCE = {"llama_cpp_version", "system_info", "profile", "cmake_args", "qemu_cpu", "sve_bytes",
              "repack", "command", "ggml_cpu_info"}
X86 = ("scalar", "avx2", "avx512")


def _results(path: Path) -> dict:
    """The computed arrays of a stored file (provenance keys left out)."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files if k not in PROVENANCE}


def _is_output(key: str, arr: np.ndarray) -> bool:
    """An array llama.cpp / ggml computed (logit rows, mat-mul rows,
    quantized blocks), not an input or a summary."""
    if re.fullmatch(r"x\d*|.*_w|.*_lse|.*_hash|.*ids|.*sha256|rows|cols|ns|n_\w+|prompt|skipped", key):
        return False
    return arr.ndim >= 2


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes()
        for k in a)


def _rows_equal(a: np.ndarray, b: np.ndarray) -> tuple:
    """(rows bitwise equal, rows) of two equally shaped arrays, row = last axis."""
    a2 = np.ascontiguousarray(a).reshape(-1, a.shape[-1]).view(np.uint8)
    b2 = np.ascontiguousarray(b).reshape(-1, b.shape[-1]).view(np.uint8)
    return int((a2 == b2).all(axis=1).sum()), a2.shape[0]


def x86_rows(path: Path, res: dict) -> str:
    """How many rows of an ARM file equal those of each x86 profile's file of
    the same name (llama_ref files: the stored top-k ids and logits)."""
    out = []
    for prof in X86:
        other = REPO / "tests" / "data" / prof / path.name
        if not other.is_file():
            continue
        o = _results(other)
        eq = tot = 0
        for k in res:
            if k in o and res[k].shape == o[k].shape and _is_output(k, res[k]):
                e, t = _rows_equal(res[k], o[k])
                eq, tot = eq + e, tot + t
        if tot:
            out.append(f"{prof} {eq}/{tot}")
    return ", ".join(out)


def cmd_classes(a) -> int:
    """Group the variants by bitwise-equal results, file by file, then over
    all files; print a markdown table."""
    names = [n for n in (a.variants or list(VARIANTS)) if (REPO / "tests" / "data" / n).is_dir()]
    files = sorted({p.name for n in names for p in (REPO / "tests" / "data" / n).glob("*.npz")})
    overall = {n: set(names) for n in names}
    print("| file | classes (bitwise equal results) | rows equal to x86 (first variant) |")
    print("|---|---|---|")
    for f in files:
        have = [n for n in names if (REPO / "tests" / "data" / n / f).is_file()]
        res = {n: _results(REPO / "tests" / "data" / n / f) for n in have}
        groups = []
        for n in have:
            for g in groups:
                if _same(res[g[0]], res[n]):
                    g.append(n)
                    break
            else:
                groups.append([n])
        for n in have:
            overall[n] &= next(set(g) for g in groups if n in g)
        missing = [n for n in names if n not in have]
        text = " / ".join("{" + ", ".join(g) + "}" for g in groups)
        if missing:
            text += f" (no file: {', '.join(missing)})"
        print(f"| {f} | {text} | {x86_rows(REPO / 'tests' / 'data' / have[0] / f, res[have[0]])} |")
    seen, classes = set(), []
    for n in names:
        if n not in seen:
            cls = sorted(overall[n], key=names.index)
            seen |= set(cls)
            classes.append(cls)
    print("\nclasses over every file: " + " / ".join("{" + ", ".join(c) + "}" for c in classes))
    _greedy_table(names, files)
    for f in a.keys or []:
        _key_classes(names, f)
    return 0


def _greedy_table(names: list, files: list) -> None:
    """For each logits file: the first generated token at which a variant's
    greedy continuation leaves the x86 avx2 build's ('=' when it never
    does)."""
    rows = []
    for f in files:
        x86 = REPO / "tests" / "data" / "avx2" / f
        if not f.startswith("llama_ref_") or not x86.is_file():
            continue
        want = np.load(x86)
        if "greedy_ids" not in want.files:
            continue
        want = want["greedy_ids"].tolist()
        cells = []
        for n in names:
            p = REPO / "tests" / "data" / n / f
            if not p.is_file():
                cells.append("")
                continue
            got = np.load(p)["greedy_ids"].tolist()
            cells.append(next((str(i) for i, (u, v) in enumerate(zip(got, want)) if u != v), "="))
        rows.append(f"| {f[len('llama_ref_'):-4]} | " + " | ".join(cells) + " |")
    if rows:
        print("\nfirst generated token that differs from the avx2 build's (0-based; = none):\n")
        print("| model | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
        print("\n".join(rows))


def _key_classes(names: list, fname: str) -> None:
    """Per computed array of one file: the classes of variants, and the
    x86 profiles whose array is bitwise the same."""
    have = [n for n in names if (REPO / "tests" / "data" / n / fname).is_file()]
    res = {n: _results(REPO / "tests" / "data" / n / fname) for n in have}
    x86 = {p: _results(REPO / "tests" / "data" / p / fname) for p in X86
           if (REPO / "tests" / "data" / p / fname).is_file()}
    print(f"\n{fname}, per array:\n\n| array | classes | equal to x86 |\n|---|---|---|")
    for k in sorted(res[have[0]]):
        if not _is_output(k, res[have[0]][k]):
            continue
        groups = []
        for n in have:
            for g in groups:
                if res[g[0]][k].tobytes() == res[n][k].tobytes():
                    g.append(n)
                    break
            else:
                groups.append([n])
        same = ["{" + ",".join(g) + "}=" + "/".join(p for p, o in x86.items()
                                                   if k in o and o[k].tobytes() == res[g[0]][k].tobytes())
                for g in groups]
        print(f"| {k} | " + " / ".join("{" + ", ".join(g) + "}" for g in groups) + " | "
              + ", ".join(x for x in same if not x.endswith("=")) + " |")


# --------------------------------------------------------------- disasm ---

#: float instructions kept in `disasm`'s skeletons (A64 and SVE mnemonics)
FLOAT_OPS = re.compile(r"^(f(mla|mls|mul|add|sub|madd|msub|nmadd|nmsub|addp|addv|adda|neg|div|"
                       r"cvt|cvtz\w*|mlal\w*|dot|mmla|recpe|sqrt)|[su]cvtf|bf(dot|mmla|cvt\w*|mlal\w*))$")


def cpu_objects(name: str) -> Path:
    """The folder of the variant's ggml-cpu object files."""
    v = VARIANTS[name]
    build = cache() / "base" if v.march == BASE_MARCH else cpu_build_dir(name)
    return build / "ggml" / "src" / "CMakeFiles" / "ggml-cpu.dir" / "ggml-cpu"


def float_skeleton(obj: Path, func: str) -> list:
    """The float instructions of one function of an object file, in program
    order ('fmla v2.4s, v19.4s, v18.4s', ...), from aarch64 objdump."""
    r = subprocess.run([f"{TRIPLE}-objdump", "-d", "--no-show-raw-insn", obj], capture_output=True,
                       text=True, check=True)
    out, inside = [], False
    for line in r.stdout.splitlines():
        if line.endswith(">:"):
            inside = line.split("<", 1)[1][:-2] == func
            continue
        if inside:
            parts = line.split("\t")
            if len(parts) >= 2 and FLOAT_OPS.match(parts[1].strip().split(" ")[0]):
                out.append(" ".join(p.strip() for p in parts[1:]).split("//")[0].strip())
    return out


def cmd_disasm(a) -> int:
    """Print the float-instruction skeleton of functions of a variant's
    ggml-cpu objects and of ggml-base's (built once for every variant: the
    reference quantizers, `strata_ref.cpu.base_quant`), showing how GCC
    ordered and fused the arithmetic."""
    base = cache() / "base" / "ggml" / "src" / "CMakeFiles" / "ggml-base.dir"
    dirs = (cpu_objects(a.variant), base)
    for func in a.functions:
        hits = []
        for d in dirs:
            for obj in sorted(d.rglob("*.o")):
                ops = float_skeleton(obj, func)
                if ops:
                    hits.append((d, obj, ops))
        if not hits:
            print(f"{func}: not found (or no float instructions) in {', '.join(map(str, dirs))}")
        for d, obj, ops in hits:
            print(f"{func} ({d.name}/{obj.relative_to(d)}): " + "; ".join(ops))
    return 0


def cmd_list(a) -> int:
    for v in VARIANTS.values():
        print(f"{v.name:16s} -march={v.march:34s} qemu -cpu {v.qemu_cpu:50s} "
              f"ggml {v.ggml_variant or '-':10s} {v.note}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check")
    p.add_argument("--install", action="store_true", help="apt-get install what is missing")
    p = sub.add_parser("build")
    p.add_argument("variants", nargs="*")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--cpu-only", action="store_true",
                   help="only the variants' ggml-cpu libraries (while the base builds elsewhere)")
    p = sub.add_parser("data")
    p.add_argument("variants", nargs="*")
    p.add_argument("--only", help="comma-separated jobs (default: all): actquant, basequant, unary, mm, "
                   "tiny, typed, iq, moe:ARCH, logits:MODEL (registry model, variant name or "
                   "smollm2-rot-q8_0), kv:MODEL, ops:FILE")
    p.add_argument("--missing", action="store_true",
                   help="skip jobs whose file exists (a run cut short goes on)")
    p = sub.add_parser("validate")
    p.add_argument("--peer", default="avx2", help="the x86 peer build to check against")
    p.add_argument("--only", help="comma-separated jobs (default: VALIDATE_JOBS)")
    p = sub.add_parser("classes")
    p.add_argument("variants", nargs="*")
    p.add_argument("--keys", nargs="*", metavar="FILE",
                   help="also the classes of each array of these files (ggml_mm.npz, ...)")
    p = sub.add_parser("disasm")
    p.add_argument("variant")
    p.add_argument("functions", nargs="+", help="symbol names (C++ ones mangled)")
    sub.add_parser("list")
    a = ap.parse_args(argv)
    for v in getattr(a, "variants", None) or []:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r} (known: {', '.join(VARIANTS)})")
    return {"check": cmd_check, "build": cmd_build, "data": cmd_data, "classes": cmd_classes, "disasm": cmd_disasm,
            "validate": cmd_validate,
            "list": cmd_list}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
