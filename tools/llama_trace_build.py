"""Build tools/llama_trace.c (the C driver of the trace container,
docs/trace.md) against one llama.cpp build.

    python tools/llama_trace_build.py --profile P [--out FILE]
        the llama.cpp peer built for CPU profile P (tools/peer_build.py):
        its libraries in <cache>/peer/P/site/llama_cpp/lib
    python tools/llama_trace_build.py --lib DIR [--include SRC] --out FILE
        another build: DIR holds libllama*.so, libggml*.so and
        libggml-base.so (a prebuilt package's folder)

The headers are those of llama.cpp vendored by llama-cpp-python 0.3.36
(its source archive, <cache>/sdist, extracted once into
<cache>/llama-trace-headers), unless --include names a llama.cpp source
tree (include/ and ggml/include/ inside) of the build's own version. The
driver checks at run time that the library lays out `struct ggml_tensor`
as the headers do. The executable finds the libraries through its rpath
(DIR). Prints the path of the executable; exit 2 with one line when the
compiler, the headers or the libraries are missing.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SOURCE = REPO / "tools" / "llama_trace.c"
SDIST = "llama_cpp_python-0.3.36.tar.gz"


def headers() -> Path:
    """The include folders of the 0.3.36 sdist, extracted into the cache
    (`<cache>/llama-trace-headers/{include,ggml/include}`)."""
    from strata_ref.models import cache_dir
    out = cache_dir() / "llama-trace-headers"
    if (out / "include" / "llama.h").is_file() and (out / "ggml" / "include" / "ggml.h").is_file():
        return out
    sd = cache_dir() / "sdist" / SDIST
    if not sd.is_file():
        raise SystemExit(f"llama_trace_build: error: no {SDIST} in {sd.parent} "
                         f"(python tools/peer_build.py fetches it)")
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sd) as tf:
        for m in tf.getmembers():
            parts = m.name.split("/vendor/llama.cpp/", 1)
            if len(parts) == 2 and m.isfile() and parts[1].startswith(("include/", "ggml/include/")):
                dest = tmp / parts[1]
                dest.parent.mkdir(parents=True, exist_ok=True)
                with tf.extractfile(m) as src:
                    dest.write_bytes(src.read())
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def libraries(lib: Path) -> list[Path]:
    """libllama, libggml and libggml-base of a build's library folder."""
    def one(patterns, what):
        for p in patterns:
            hits = sorted(x for x in glob.glob(str(lib / p)) if not os.path.islink(x) or os.path.exists(x))
            if hits:
                return Path(hits[0])
        raise SystemExit(f"llama_trace_build: error: no {what} in {lib}")
    return [one(["libllama.so", "libllama.v*.so", "libllama.so.*"], "libllama"),
            one(["libggml.so", "libggml.v*.so", "libggml.so.*"], "libggml"),
            one(["libggml-base.so", "libggml-base.so.*"], "libggml-base")]


def build(lib: Path, out: Path, include: Path | None = None) -> Path:
    """Compile the driver against the libraries in `lib`; returns `out`."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("llama_trace_build: error: no C compiler (cc, gcc or $CC)")
    inc = include or headers()
    libs = libraries(lib)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [cc, "-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-o", str(out), str(SOURCE),
           "-I", str(inc / "include"), "-I", str(inc / "ggml" / "include"),
           *map(str, libs), f"-Wl,-rpath,{lib.resolve()}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"llama_trace_build: error: {' '.join(cmd)} failed:\n{r.stderr.strip()}")
    return out


def peer_lib(profile: str) -> Path:
    from peer_build import peer_dir
    lib = peer_dir(profile) / "site" / "llama_cpp" / "lib"
    if not (lib / "libllama.so").exists():
        raise SystemExit(f"llama_trace_build: error: no {profile} peer build: "
                         f"python tools/peer_build.py {profile}")
    return lib


def main(argv=None) -> int:
    sys.path.insert(0, str(REPO / "tools"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="the peer build of this CPU profile")
    ap.add_argument("--lib", help="or a build's library folder")
    ap.add_argument("--include", help="a llama.cpp source tree whose headers to use")
    ap.add_argument("--out", help="the executable (default: <cache>/llama_trace/<profile>/llama_trace)")
    a = ap.parse_args(argv)
    if bool(a.profile) == bool(a.lib):
        ap.error("give --profile P or --lib DIR (one of them)")
    if a.lib and not a.out:
        ap.error("--lib needs --out FILE")
    from strata_ref.models import cache_dir
    lib = peer_lib(a.profile) if a.profile else Path(a.lib)
    out = Path(a.out) if a.out else cache_dir() / "llama_trace" / a.profile / "llama_trace"
    print(build(lib, out, Path(a.include) if a.include else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
