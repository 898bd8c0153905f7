"""Build and load libstrata_gemm (native/gemm.cu), next to libstrata_dequant.

The GEMM library is separate from the dequant library because it links
cuBLAS; it reaches the dequant kernels at run time through the address of
`strata_dequant`, taken from the dequant library that `loader.load` opened
(no link-time dependency between the two). Compiler discovery, flags and
the cache root are the dequant build's (`build.find_nvcc`, `build.nvcc_flags`,
`build.cache_root`); the cache key covers gemm.cu, strata_gemm.h, the flags
and `nvcc --version`.

Cache: `$STRATA_REF_CACHE/native/gemm-<hash>-sm<XY>/libstrata_gemm.so`.
The library is linked with `-lcublas` and an rpath to the toolkit's lib64,
so it finds libcublas where nvcc found it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from . import build as _build
from .loader import Native, NativeUnavailable, env_device, load

__all__ = ["LIB_NAME", "SOURCE", "HEADER", "GemmNative", "cdef_text", "cuda_lib_dir",
           "compile_object", "build_gemm", "load_gemm"]

LIB_NAME = "libstrata_gemm.so"
SOURCE = "gemm.cu"
HEADER = "strata_gemm.h"


def _source_dir() -> Path:
    src = _build.source_dir()
    if not (src / SOURCE).is_file() or not (src / HEADER).is_file():
        raise _build.BuildError(f"{SOURCE} / {HEADER} not found in {src}")
    return src


def cdef_text() -> str:
    """The plain-C declarations between the cdef markers of strata_gemm.h."""
    text = (_source_dir() / HEADER).read_text()
    try:
        return text.split("/* cdef-begin */", 1)[1].split("/* cdef-end */", 1)[0]
    except IndexError:
        raise NativeUnavailable(f"{HEADER} lacks its cdef markers") from None


def cuda_lib_dir(nvcc: str) -> Path:
    """The toolkit's library directory next to `nvcc` (…/bin/nvcc -> …/lib64)."""
    root = Path(nvcc).resolve().parent.parent
    for d in ("lib64", "lib", "targets/x86_64-linux/lib"):
        if (root / d).is_dir():
            return root / d
    return root / "lib64"


def _nvcc_or_raise() -> str:
    nvcc = _build.find_nvcc()
    if nvcc is None:
        raise _build.BuildError("nvcc not found (set NVCC or CUDA_HOME, or put it on PATH)")
    return nvcc


def _run(cmd: list[str], cwd: Path) -> None:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise _build.BuildError(f"nvcc failed ({p.returncode}): {' '.join(cmd)}\n"
                                f"{p.stdout}\n{p.stderr}")


def compile_object(arch: int, workdir: Path, nvcc: str | None = None,
                   include: Path | None = None) -> Path:
    """Compile gemm.cu for compute capability `arch` into workdir/gemm.o.
    `include`: an extra include directory searched first (the CPU test puts
    a declarations-only cublas_v2.h there when the toolkit lacks cuBLAS)."""
    nvcc = nvcc or _nvcc_or_raise()
    src = _source_dir()
    workdir.mkdir(parents=True, exist_ok=True)
    obj = workdir / "gemm.o"
    inc = ["-I", str(include)] if include else []
    _run([nvcc, *_build.nvcc_flags(arch), *inc, "-I", str(src), "-c", str(src / SOURCE),
          "-o", str(obj)], workdir)
    return obj


def _key(src: Path, arch: int, nvcc: str) -> str:
    h = hashlib.sha256()
    for f in (SOURCE, HEADER):
        h.update(f.encode() + b"\0" + (src / f).read_bytes() + b"\0")
    h.update(" ".join(_build.nvcc_flags(arch)).encode())
    try:
        ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise _build.BuildError(f"cannot run {nvcc}: {e}") from None
    h.update(ver.encode())
    return h.hexdigest()[:20]


def build_gemm(arch: int, *, force: bool = False, verbose: bool = False) -> Path:
    """Path of libstrata_gemm.so for compute capability `arch`, built with
    nvcc unless cached. Raises build.BuildError when nvcc is missing or fails
    (for example when the toolkit has no cuBLAS)."""
    nvcc = _nvcc_or_raise()
    src = _source_dir()
    dest = _build.cache_root() / "native" / f"gemm-{_key(src, arch, nvcc)}-sm{int(arch)}"
    lib = dest / LIB_NAME
    if lib.is_file() and not force:
        return lib
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".build-gemm-") as tmp:
        work = Path(tmp)
        if verbose:
            print(f"strata-ref: building {LIB_NAME} for sm_{arch} with {nvcc}")
        obj = compile_object(arch, work, nvcc)
        out = work / "out"
        out.mkdir()
        libdir = cuda_lib_dir(nvcc)
        _run([nvcc, *_build.nvcc_flags(arch), "-shared", "-o", str(out / LIB_NAME), str(obj),
              "-L", str(libdir), "-lcublas", "-Xlinker", f"-rpath={libdir}"], work)
        if force and dest.exists():
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(out, dest)
        except OSError:
            if not lib.is_file():
                raise _build.BuildError(f"cannot place the build at {dest}") from None
    return lib


@dataclass(frozen=True)
class GemmNative:
    """A loaded GEMM library with its per-device context: `ffi`, `lib`, `ctx`
    (the strata_gemm_ctx pointer, created once and kept for the process),
    `dequant` (the dequant library's Native), `cc`, `path`."""
    ffi: object
    lib: object
    ctx: object
    dequant: Native
    cc: int
    path: str


_LOCK = threading.Lock()
_CACHE: dict[int, GemmNative] = {}


def load_gemm(device: int | None = None) -> GemmNative:
    """The GEMM library and context for CUDA device `device` (default
    $STRATA_REF_DEVICE or 0), building the library on first use. The context
    (cuBLAS handle, 32 MiB workspace) lives until the process ends. Raises
    NativeUnavailable with the reason (no GPU, cffi, nvcc or cuBLAS)."""
    if device is None:
        device = env_device()
    dq = load(device)
    with _LOCK:
        if device in _CACHE:
            return _CACHE[device]
        try:
            path = build_gemm(dq.cc)
        except _build.BuildError as e:
            raise NativeUnavailable(str(e)) from None
        import cffi
        ffi = cffi.FFI()
        ffi.cdef(cdef_text())
        try:
            lib = ffi.dlopen(str(path))
        except OSError as e:
            raise NativeUnavailable(f"cannot load {path}: {e}") from None
        dequant_addr = int(dq.ffi.cast("uintptr_t", dq.lib.strata_dequant))
        pctx = ffi.new("strata_gemm_ctx **")
        st = lib.strata_gemm_create(device, ffi.cast("void *", dequant_addr), pctx)
        if st != 0:
            err = lib.strata_gemm_last_error()
            text = ffi.string(lib.strata_gemm_error_string(st, err)).decode()
            raise NativeUnavailable(f"strata_gemm_create failed: status {st}, {err} ({text})")
        g = GemmNative(ffi, lib, pctx[0], dq, dq.cc, str(path))
        _CACHE[device] = g
        return g
