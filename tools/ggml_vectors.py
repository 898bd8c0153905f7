#!/usr/bin/env python3
"""ggml cross-vectors: ggml's own C results on the golden corpus, as hashes.

    python tools/ggml_vectors.py --build     # fetch the sdist, build ggml-base (portable)
    python tools/ggml_vectors.py             # write golden/ggml/dequant.json, quantize.json

The C library is ggml-base from the llama-cpp-python 0.3.36 source
distribution (vendor/llama.cpp/ggml, ggml 0.25.3), built without native CPU
flags and without FMA contraction (docs/ggml-vectors.md has the commands
and the measured build time). Any other ggml-base can be named with
STRATA_REF_GGML_LIB; the files record which one was used.

dequant.json: per corpus case of strata_ref.golden (same names, same seeded
bytes) the FNV-1a 64 of ggml's `to_float` output for the case's rows
(rows x cols float32, row-major, NaNs canonical 0x7FFFFFFF), and of the
input bytes. quantize.json: per quantizer type and seeded float input
(golden.quant_cases) the FNV-1a 64 of ggml's quantizer output bytes, using
`quantize_row_*_ref` (from_float_ref; Q8_K: quantize_row_q8_K_ref) and, for
IQ1_M, which has none, ggml_quantize_chunk without an importance matrix.
Every quantizer call runs in a forked child: C's float->int casts of NaN
are undefined behaviour, and some finite inputs trip a GGML_ASSERT in the
I-quant grid searches; an abort is recorded as "crash:<signal>", not fatal.

The tests (tests/test_ggml_vectors.py) compare the oracle with these files,
so CI needs no C compiler.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GGML_NO_BACKTRACE", "1")     # an abort must not attach gdb
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import ggml_c  # noqa: E402
from strata_ref import golden  # noqa: E402
from strata_ref.hashing import fnv1a64, hash_array  # noqa: E402
from strata_ref.types import GGMLType  # noqa: E402

PKG = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
GGML_SUBDIR = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/ggml"
CMAKE_FLAGS = [
    "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_NATIVE=OFF", "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF",
    "-DGGML_OPENMP=OFF", "-DCMAKE_C_FLAGS=-ffp-contract=off",
    "-DCMAKE_CXX_FLAGS=-ffp-contract=off",
]
OUT_DIR = ROOT / "golden" / "ggml"


# ---------------------------------------------------------------- build

def _run(cmd: list[str], log: Path) -> None:
    print("+", " ".join(cmd), flush=True)
    with open(log, "ab") as f:
        r = subprocess.run(["nice", *cmd], stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"command failed ({r.returncode}); see {log}")


def build(cache: Path = ggml_c.CACHE_DIR, jobs: int = 2) -> Path:
    """Download the pinned sdist (if absent), extract ggml, build ggml-base.
    Returns the library path. Prints the time taken per step."""
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "build.log"
    log.write_text("")
    sdist = cache / "sdist" / SDIST
    t0 = time.time()
    if not sdist.is_file():
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              f"{PKG}=={VERSION}", "-d", str(sdist.parent)], log)
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        sys.exit(f"{sdist}: sha256 {digest} is not the pinned {SDIST_SHA256}")
    t1 = time.time()
    src = cache / GGML_SUBDIR
    if not src.is_dir():
        with tarfile.open(sdist) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith(GGML_SUBDIR + "/")]
            tf.extractall(cache, members=members, filter="data")
    # The sdist omits ggml/ggml.pc.in, which ggml's CMakeLists configures
    # unconditionally; an empty template is enough (no pkg-config file is used).
    (src / "ggml.pc.in").touch()
    build_dir = cache / "build"
    shutil.rmtree(build_dir, ignore_errors=True)
    t2 = time.time()
    _run(["cmake", "-S", str(src), "-B", str(build_dir), *CMAKE_FLAGS], log)
    _run(["cmake", "--build", str(build_dir), "--target", "ggml-base", "-j", str(jobs)], log)
    t3 = time.time()
    lib = build_dir / "src" / "libggml-base.so"
    print(f"download {t1 - t0:.1f} s, extract {t2 - t1:.1f} s, configure+build {t3 - t2:.1f} s")
    print(f"built {lib}")
    return lib


# ---------------------------------------------------------------- vectors

def _compiler() -> str:
    try:
        return subprocess.run(["cc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return "unknown"


def _head(g: ggml_c.GGML, what: str) -> dict:
    return {"format": "strata-ref ggml vectors", "format_version": 1, "subject": what,
            "corpus_seed": golden.CORPUS_SEED, "corpus_version": golden.CORPUS_VERSION,
            "ggml_source": f"{PKG} {VERSION} sdist ({SDIST_SHA256[:16]}…), {GGML_SUBDIR.split('/', 1)[1]}",
            "library": g.path.name, "compiler": _compiler(),
            "build": "ggml-base; " + " ".join(CMAKE_FLAGS[2:]),
            "hash": "FNV-1a 64, hex"}


def dequant_vectors(g: ggml_c.GGML) -> tuple[list[dict], list[str]]:
    items, skipped = [], set()
    for c in golden.corpus_cases():
        t = int(c.type)
        if not g.has_to_float(t):
            skipped.add(c.type.name)
            continue
        data = c.data()
        y = g.to_float(t, c.slice_bytes()).reshape(c.rows, c.cols)
        items.append({"name": c.name, "type": c.type.name, "input": f"{fnv1a64(data):016x}",
                      "f32": f"{hash_array(y):016x}"})
    return items, sorted(skipped)


def _quantize_isolated(g: ggml_c.GGML, t: int, x: np.ndarray, timeout: int = 20) -> str:
    """Hash of ggml's quantizer output computed in a forked child, or
    'crash:<signal>' / 'timeout'."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # child
        os.close(r)
        signal.alarm(timeout)
        try:
            out, n_masked = golden.mask_undefined(t, g.quantize(t, x), x)
            h = f"{fnv1a64(out):016x}" + (f" masked:{n_masked}" if n_masked else "")
        except Exception as e:  # noqa: BLE001 - report, never hang the parent
            h = f"error:{type(e).__name__}"
        os.write(w, h.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "timeout" if os.WTERMSIG(status) == signal.SIGALRM else f"crash:{os.WTERMSIG(status)}"
    return out


def quantize_vectors(g: ggml_c.GGML) -> list[dict]:
    items = []
    for t in golden.QUANT_TYPES:
        if not g.quantizes(int(t)):
            raise SystemExit(f"{g.path}: ggml does not quantize {t.name} without an imatrix")
        g.init_quantizer(int(t))        # once, in the parent: the children inherit it
        for q in golden.quant_cases():
            # Every call runs in a child: some inputs trip a GGML_ASSERT in the
            # I-quant searches (e.g. IQ3_XXS "grid_index >= 0"), which aborts.
            x = q.inputs()
            h, _, masked = _quantize_isolated(g, int(t), x).partition(" masked:")
            it = {"type": t.name, "case": q.name, "rows": q.rows, "cols": q.cols,
                  "input": f"{fnv1a64(x.view(np.uint8).reshape(-1)):016x}", "bytes": h}
            if masked:
                it["masked_blocks"] = int(masked)     # see golden.mask_undefined
            if q.nonfinite:
                it["nonfinite"] = True
            items.append(it)
    return items


def write_vectors(g: ggml_c.GGML, out_dir: Path = OUT_DIR) -> None:
    t0 = time.time()
    items, skipped = dequant_vectors(g)
    head = _head(g, "to_float on the golden corpus (f32, NaN canonical)")
    head["no_c_to_float"] = skipped
    golden.write_golden_json(out_dir / "dequant.json", head, "cases", items, {"n_cases": len(items)})
    t1 = time.time()
    print(f"dequant.json: {len(items)} cases ({t1 - t0:.1f} s); no C to_float: {', '.join(skipped)}")
    qitems = quantize_vectors(g)
    head = _head(g, "reference quantizers (from_float_ref; IQ1_M: ggml_quantize_chunk, no imatrix)")
    golden.write_golden_json(out_dir / "quantize.json", head, "cases", qitems, {"n_cases": len(qitems)})
    odd = [f"{i['type']}/{i['case']}={i['bytes']}" for i in qitems if len(i["bytes"]) != 16]
    print(f"quantize.json: {len(qitems)} cases ({time.time() - t1:.1f} s)"
          + (f"; not hashes: {', '.join(odd)}" if odd else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="store_true", help="build ggml-base first")
    ap.add_argument("--lib", default=None, help="ggml-base shared library to use")
    ap.add_argument("--out", default=str(OUT_DIR), help="output directory (default golden/ggml)")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    lib = build(jobs=a.jobs) if a.build else a.lib
    g = ggml_c.load(lib)
    if g is None:
        print("no ggml library found: run with --build, or set " + ggml_c.ENV_LIB, file=sys.stderr)
        return 2
    print(f"using {g.path}")
    write_vectors(g, Path(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
