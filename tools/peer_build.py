"""Build the llama.cpp peer (llama-cpp-python 0.3.36 from its source archive)
for one CPU profile, and keep the wheel.

    python tools/peer_build.py PROFILE [--jobs N] [--force]
    python tools/peer_build.py --list

PROFILE is a `strata_ref.cpu.profiles` name (scalar, avx2, avx512): the build
gets `-DGGML_NATIVE=OFF` and every ggml x86 option set explicitly (the
profile's options ON, the others OFF). `native` builds with `-DGGML_NATIVE=ON`
(the compiler's -march=native), to check which profile this CPU's native
build equals.

The wheel goes to `<cache>/peer/<profile>/` and is unpacked beside it
(`<cache>/peer/<profile>/site`), so another tool runs against this build with
`PYTHONPATH=<cache>/peer/<profile>/site` (`tools/peer_ref.py --profile`
does that itself). The sdist is fetched from PyPI into `<cache>/sdist` once.
A build takes about 12 to 15 minutes on 2 cores; an existing wheel is reused
unless --force. The mtmd (LLaVA) library is not built (`-DLLAVA_BUILD=OFF`):
it plays no part in text inference.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from strata_ref.cpu.profiles import PROFILES  # noqa: E402
from strata_ref.models import cache_dir  # noqa: E402

PEER = "llama-cpp-python==0.3.36"
SDIST = "llama_cpp_python-0.3.36.tar.gz"


def peer_dir(profile: str) -> Path:
    """Where the wheel and its unpacked `site` folder of one profile live."""
    return cache_dir() / "peer" / profile


def cmake_args(profile: str) -> list[str]:
    if profile == "native":
        return ["-DGGML_NATIVE=ON"]
    return PROFILES[profile].cmake_args()


def fetch_sdist() -> Path:
    dest = cache_dir() / "sdist"
    path = dest / SDIST
    if not path.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", PEER, "-d", str(dest)], check=True)
    return path


def build(profile: str, jobs: int, force: bool) -> Path:
    out = peer_dir(profile)
    wheels = sorted(out.glob("llama_cpp_python-*.whl"))
    if wheels and not force:
        print(f"{profile}: reusing {wheels[-1]}")
        _say_missing_deps()
        return wheels[-1]
    sdist = fetch_sdist()
    out.mkdir(parents=True, exist_ok=True)
    for w in wheels:
        w.unlink()
    args = cmake_args(profile) + ["-DLLAVA_BUILD=OFF"]
    env = dict(os.environ, CMAKE_ARGS=" ".join(args), CMAKE_BUILD_PARALLEL_LEVEL=str(jobs))
    print(f"{profile}: CMAKE_ARGS={env['CMAKE_ARGS']}", flush=True)
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(sdist)],
                   check=True, env=env)
    wheel = sorted(out.glob("llama_cpp_python-*.whl"))[-1]
    (out / "cmake_args.txt").write_text(" ".join(args) + "\n")
    site = out / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    print(f"{profile}: built {wheel.name} in {time.time() - t0:.0f} s; "
          f"PYTHONPATH={site}")
    _say_missing_deps()
    return wheel


def _say_missing_deps() -> None:
    # The wheel is unpacked without its dependencies (--no-deps): name the
    # ones this interpreter lacks, which `import llama_cpp` needs.
    import importlib.util
    missing = [m for m in ("typing_extensions", "diskcache", "jinja2")
               if importlib.util.find_spec(m) is None]
    if missing:
        print(f"note: llama_cpp imports {', '.join(missing)}, missing here: "
              f"pip install -e '.[peer]' (or pip install {' '.join(missing)})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", nargs="?", help="scalar, avx2, avx512 or native")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compile jobs")
    ap.add_argument("--force", action="store_true", help="rebuild even if a wheel is cached")
    ap.add_argument("--list", action="store_true", help="print each profile's CMake arguments")
    a = ap.parse_args(argv)
    if a.list or not a.profile:
        for name in list(PROFILES) + ["native"]:
            print(f"{name}: {' '.join(cmake_args(name))}")
        return 0
    if a.profile not in PROFILES and a.profile != "native":
        ap.error(f"unknown profile {a.profile!r} (known: {', '.join(PROFILES)}, native)")
    build(a.profile, a.jobs, a.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
