"""Build the native libraries with nvcc: one build function for all of them.

Each library is declared once as a `Library` (its .so name, CUDA sources,
the headers they include, extra compile flags and link arguments):
`DEQUANT` (libstrata_dequant: generic and wide dequant kernels), `GEMM`
(libstrata_gemm: the two cuBLAS routes, links cuBLAS) and `MMVQ`
(libstrata_mmvq: q8_1 mat-vec and MoE experts). `build(lib, arch)` compiles
the sources (in parallel), links the shared library and caches it by a key
over every source and header, the generated headers, the flags and `nvcc
--version`.

The CUDA sources live in the repository's `native/` directory (or, in an
installed wheel, `strata_ref/_native_src/`). The I-quant codebooks are not
copied by hand: `iq_tables_header()` writes them as C arrays from
`strata_ref.formats.iq_tables` (and KVALUES_MXFP4 from `formats.fp4`) into the
build directory; the block structs, type ids and field offsets are the
committed, generated native/strata_blocks.h (tools/gen_block_header.py).

Flags: no `--use_fast_math`; `-ftz=false -prec-div=true -prec-sqrt=true
-fmad=true` spelled out (nvcc's defaults), because FTZ would flush MXFP4's f32
subnormals (../shared/spec/kernels.md §2 "Build flags"). Code is built for the
local GPU's architecture plus its PTX (`-gencode arch=compute_XY,code=[sm_XY,compute_XY]`).

Cache: `$STRATA_REF_CACHE/native/<stem>-<hash>-sm<XY>/<name>.so` (stem: the
library name without `libstrata_`), default `~/.cache/strata-ref`. A build
goes to a temporary directory first and is renamed into place (atomic), so
concurrent builds cannot leave a half-written library.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .._paths import data_dir

log = logging.getLogger(__name__)

__all__ = ["BuildError", "Library", "DEQUANT", "GEMM", "MMVQ", "LIBRARIES", "find_nvcc",
           "source_dir", "iq_tables_header", "nvcc_flags", "build", "compile_objects",
           "cache_root", "cuda_lib_dir", "cdef_text", "TABLES_HEADER"]

TABLES_HEADER = "strata_iq_tables.h"


def cuda_lib_dir(nvcc: str) -> Path:
    """The toolkit's library directory next to `nvcc` (…/bin/nvcc -> …/lib64)."""
    root = Path(nvcc).resolve().parent.parent
    for d in ("lib64", "lib", "targets/x86_64-linux/lib"):
        if (root / d).is_dir():
            return root / d
    return root / "lib64"


def _link_cublas(nvcc: str) -> list[str]:
    # an rpath to the toolkit's lib64, so the library finds libcublas where
    # nvcc found it
    libdir = cuda_lib_dir(nvcc)
    return ["-L", str(libdir), "-lcublas", "-Xlinker", f"-rpath={libdir}"]


@dataclass(frozen=True)
class Library:
    """One native library: `name` (the .so), `sources` (translation units,
    compiled in parallel, then linked), `headers` (what they include from
    native/: part of the cache key), `compile_flags` (after `nvcc_flags`),
    `link` (nvcc -> extra link arguments)."""
    name: str
    sources: tuple[str, ...]
    headers: tuple[str, ...]
    compile_flags: tuple[str, ...] = ()
    link: Callable[[str], list[str]] | None = None

    @property
    def stem(self) -> str:
        return self.name.removeprefix("libstrata_").removesuffix(".so")

    def files(self) -> tuple[str, ...]:
        return self.sources + self.headers


_BLOCKS = ("strata_blocks.h",)
DEQUANT = Library("libstrata_dequant.so",
                  ("api.cu", "dequant_generic.cu", "dequant_wide.cu", "elementwise.cu"),
                  ("strata_dequant.h", "strata_launch.h", "strata_common.cuh", "strata_formats.cuh",
                   "strata_wide.cuh") + _BLOCKS)
GEMM = Library("libstrata_gemm.so", ("gemm.cu",), ("strata_gemm.h",), link=_link_cublas)
# --split-compile: the many kernel instantiations optimize in parallel threads
# (the same code as a serial build)
MMVQ = Library("libstrata_mmvq.so", ("mmvq.cu",),
               ("strata_mmvq.h", "mmvq_dots.cuh", "mmvq_lanes.cuh", "mmvq_setup.h") + _BLOCKS,
               compile_flags=("--split-compile=0",))
LIBRARIES = (DEQUANT, GEMM, MMVQ)

#: nvcc's own defaults, written out: the arithmetic contract depends on them.
_IEEE_FLAGS = ("-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true")


class BuildError(RuntimeError):
    """nvcc is missing or failed; the message says which and shows its output."""


def source_dir() -> Path:
    """Directory holding the CUDA sources and strata_dequant.h.

    `STRATA_REF_NATIVE_SRC` overrides; otherwise the repository's native/
    (next to the package) or the copy a wheel ships inside the package
    (`strata_ref._paths.data_dir("native")`).
    Raises BuildError if none holds the sources.
    """
    cands = []
    if os.environ.get("STRATA_REF_NATIVE_SRC"):
        cands.append(Path(os.environ["STRATA_REF_NATIVE_SRC"]))
    absent = ""
    try:
        cands.append(data_dir("native"))
    except FileNotFoundError as e:
        absent = f"; {e}"
    for c in cands:
        if all((c / f).is_file() for lib in LIBRARIES for f in lib.files()):
            return c
    raise BuildError("CUDA sources not found (looked in: "
                     + ", ".join(str(c) for c in cands) + absent + ")")


def find_nvcc() -> str | None:
    """Path of nvcc: $NVCC, then PATH, then $CUDA_HOME/bin, $CUDA_PATH/bin and
    the toolkit's default prefix /usr/local/cuda/bin. None if absent."""
    if os.environ.get("NVCC"):
        return os.environ["NVCC"] if Path(os.environ["NVCC"]).is_file() else None
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            p = Path(os.environ[var]) / "bin" / "nvcc"
            if p.is_file():
                return str(p)
    p = Path("/usr/local/cuda/bin/nvcc")
    return str(p) if p.is_file() else None


def _c_array(ctype: str, name: str, values: np.ndarray, per_line: int, fmt) -> str:
    body = []
    vals = [fmt(int(v)) for v in values.reshape(-1)]
    for i in range(0, len(vals), per_line):
        body.append("    " + ", ".join(vals[i:i + per_line]) + ",")
    return (f"static __device__ const {ctype} {name}[{len(vals)}] = {{\n"
            + "\n".join(body) + "\n};\n")


def iq_tables_header() -> str:
    """C text of strata_iq_tables.h: ggml's codebooks as `__device__` arrays.

    Values come from strata_ref.formats.iq_tables (ggml-common.h, the source
    named there) and formats.fp4.KVALUES_MXFP4; names are `tab_<ggml name>`.
    """
    from ..formats import iq_tables as t
    from ..formats.fp4 import KVALUES_MXFP4

    hx16 = lambda v: f"0x{v:016x}ULL"    # noqa: E731
    hx8 = lambda v: f"0x{v:08x}u"        # noqa: E731
    dec = lambda v: str(v)               # noqa: E731
    parts = [
        "// Generated by strata_ref/native/build.py from strata_ref.formats.iq_tables\n"
        f"// (source: {t.SOURCE}). Do not edit.\n#pragma once\n",
        _c_array("unsigned char", "tab_ksigns_iq2xs", t.KSIGNS_IQ2XS, 16, dec),
        _c_array("unsigned long long", "tab_iq2xxs_grid", t.IQ2XXS_GRID, 4, hx16),
        _c_array("unsigned long long", "tab_iq2xs_grid", t.IQ2XS_GRID, 4, hx16),
        _c_array("unsigned long long", "tab_iq2s_grid", t.IQ2S_GRID, 4, hx16),
        _c_array("unsigned int", "tab_iq3xxs_grid", t.IQ3XXS_GRID, 8, hx8),
        _c_array("unsigned int", "tab_iq3s_grid", t.IQ3S_GRID, 8, hx8),
        _c_array("unsigned int", "tab_iq1s_grid_gpu", t.IQ1S_GRID_GPU, 8, hx8),
        _c_array("signed char", "tab_kvalues_iq4nl", t.KVALUES_IQ4NL, 16, dec),
        _c_array("signed char", "tab_kvalues_mxfp4", np.asarray(KVALUES_MXFP4), 16, dec),
    ]
    return "\n".join(parts)


def _tuning_defines() -> list[str]:
    """`-D` flags from $STRATA_REF_NVCC_DEFINES (space-separated), for
    kernel tuning runs (e.g. "-DSTRATA_WIDE_CPT=2"); part of the cache key.
    Anything that is not a -DNAME or -DNAME=VALUE token is a BuildError."""
    toks = os.environ.get("STRATA_REF_NVCC_DEFINES", "").split()
    for t in toks:
        if not (t.startswith("-D") and t[2:3].isalpha()):
            raise BuildError(f"STRATA_REF_NVCC_DEFINES: {t!r} is not a -DNAME[=VALUE] flag")
    return toks


def nvcc_flags(arch: int) -> list[str]:
    """Compile flags for compute capability `arch` (e.g. 90): SASS + PTX."""
    a = int(arch)
    return ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", *_IEEE_FLAGS, *_tuning_defines(),
            "-gencode", f"arch=compute_{a},code=[sm_{a},compute_{a}]"]


def cache_root() -> Path:
    base = os.environ.get("STRATA_REF_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "strata-ref"


def _nvcc_version(nvcc: str) -> str:
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"cannot run {nvcc}: {e}") from None


def _key(lib: Library, src: Path, tables: str, arch: int, nvcc_version: str) -> str:
    h = hashlib.sha256(lib.name.encode() + b"\0")
    for f in sorted(lib.files()):
        h.update(f.encode() + b"\0" + (src / f).read_bytes() + b"\0")
    h.update(tables.encode())
    h.update(" ".join(nvcc_flags(arch) + list(lib.compile_flags)).encode())
    h.update(nvcc_version.encode())
    return h.hexdigest()[:20]


def _run(cmd: list[str], cwd: Path) -> None:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"nvcc failed ({p.returncode}): {' '.join(cmd)}\n"
                         f"{p.stdout}\n{p.stderr}")


def _nvcc_or_raise() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found (set NVCC or CUDA_HOME, or put it on PATH); "
                         "the NumPy path keeps working without it")
    return nvcc


def _sources(lib: Library) -> Path:
    src = source_dir()
    missing = [f for f in lib.files() if not (src / f).is_file()]
    if missing:
        raise BuildError(f"{', '.join(missing)} missing in {src}")
    return src


def compile_objects(lib: Library, arch: int, workdir: Path, nvcc: str | None = None, *,
                    include: Path | None = None, jobs: int | None = None) -> list[Path]:
    """Compile every translation unit of `lib` for compute capability `arch`
    into workdir (objects only, with the generated IQ-table header written
    there); used by `build` and by the CPU tests that check that the sources
    compile. `include`: a directory searched first (the CPU test puts a
    declarations-only cublas_v2.h there when the toolkit lacks cuBLAS).
    Raises BuildError when nvcc is missing or fails."""
    nvcc = nvcc or _nvcc_or_raise()
    src = _sources(lib)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / TABLES_HEADER).write_text(iq_tables_header())
    inc = ["-I", str(include)] if include else []
    objs = [workdir / (Path(s).stem + ".o") for s in lib.sources]
    cmds = [[nvcc, *nvcc_flags(arch), *lib.compile_flags, *inc, "-I", str(workdir), "-I", str(src),
             "-c", str(src / s), "-o", str(o)] for s, o in zip(lib.sources, objs)]
    with ThreadPoolExecutor(max_workers=jobs or min(len(cmds), os.cpu_count() or 1)) as ex:
        for f in [ex.submit(_run, c, workdir) for c in cmds]:
            f.result()
    return objs


def build(lib: Library, arch: int, *, force: bool = False) -> Path:
    """Path of `lib` (DEQUANT, GEMM or MMVQ) for compute capability `arch`
    (major·10 + minor), built with nvcc unless a cached copy with the same
    key exists: the objects are compiled in a temporary directory beside
    the cache entry, linked, and the result renamed into place (a build
    that loses a race to a concurrent one keeps the winner's). Raises
    BuildError when nvcc is missing or fails (for GEMM, also when the
    toolkit has no cuBLAS). A build (not a cache hit) is announced on the
    `logging` logger "strata_ref.native.build" at INFO."""
    nvcc = _nvcc_or_raise()
    src = _sources(lib)
    tables = iq_tables_header()
    key = _key(lib, src, tables, arch, _nvcc_version(nvcc))
    dest = cache_root() / "native" / f"{lib.stem}-{key}-sm{int(arch)}"
    path = dest / lib.name
    if path.is_file() and not force:
        return path
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".build-{lib.stem}-") as tmp:
        work = Path(tmp)
        log.info("building %s for sm_%s with %s", lib.name, arch, nvcc)
        objs = compile_objects(lib, arch, work, nvcc)
        out = work / "out"
        out.mkdir()
        _run([nvcc, *nvcc_flags(arch), "-shared", "-o", str(out / lib.name), *map(str, objs),
              *(lib.link(nvcc) if lib.link else [])], work)
        shutil.copy2(work / TABLES_HEADER, out / TABLES_HEADER)
        if force and dest.exists():
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(out, dest)   # atomic; fails if another build won the race
        except OSError:
            if not path.is_file():
                raise BuildError(f"cannot place the build at {dest}") from None
    return path


def cdef_text(header: str) -> str:
    """The plain-C declarations between the `/* cdef-begin */` and
    `/* cdef-end */` markers of native/`header` (the ABI, stated once, in the
    header). Raises BuildError when the header or its markers are missing."""
    path = source_dir() / header
    try:
        text = path.read_text()
    except OSError as e:
        raise BuildError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return text.split("/* cdef-begin */", 1)[1].split("/* cdef-end */", 1)[0]
    except IndexError:
        raise BuildError(f"{header} lacks its cdef markers") from None
