"""Running a tool against the llama.cpp peer built for one CPU profile.

A tool that needs llama-cpp-python (llama_ref.py, llama_dump.py, ggml_mm.py)
takes `--profile P`: `ensure_profile` then runs the same command again with
the build of tools/peer_build.py for P first on PYTHONPATH (refusing when
this CPU cannot execute that build), and `data_dir()` / `provenance()` give
where the reference data goes (tests/data/P/) and what every stored file
records about the peer that made it.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
#: set in the re-executed process: the profile it runs for
ENV = "STRATA_REF_PEER_PROFILE"


def ensure_profile(script: str) -> None:
    """If the command line names `--profile P` and this process is not
    already the re-executed one, exec `script` again under P's peer build
    (same arguments). Exits with a message for an unknown profile, a CPU
    that cannot execute it, or a missing build."""
    if "--profile" not in sys.argv or ENV in os.environ:
        return
    i = sys.argv.index("--profile")
    if i + 1 >= len(sys.argv):
        raise SystemExit("--profile needs a profile name")
    profile = sys.argv[i + 1]
    sys.path.insert(0, str(REPO))
    from strata_ref.cpu.profiles import PROFILES, host_flags
    sys.path.insert(0, str(REPO / "tools"))
    from peer_build import peer_dir
    if profile not in PROFILES:
        raise SystemExit(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    missing = sorted(set(PROFILES[profile].cpu_flags) - set(host_flags()))
    if missing:
        raise SystemExit(f"this CPU cannot execute the {profile} build (missing {' '.join(missing)})")
    site = peer_dir(profile) / "site"
    if not (site / "llama_cpp").is_dir():
        raise SystemExit(f"no {profile} peer build: run python tools/peer_build.py {profile}")
    paths = [str(site), str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = dict(os.environ, **{ENV: profile, "PYTHONPATH": os.pathsep.join(paths)})
    os.execve(sys.executable, [sys.executable, script] + sys.argv[1:], env)


def profile() -> str:
    """The profile this process runs for ('' outside `ensure_profile`)."""
    return os.environ.get(ENV, "")


def data_dir() -> Path:
    """tests/data/<profile>/ (created), or tests/data/ without a profile."""
    p = profile()
    d = REPO / "tests" / "data" / p if p else REPO / "tests" / "data"
    d.mkdir(parents=True, exist_ok=True)
    return d


def provenance(tool: str) -> dict:
    """The keys every stored file carries: the command that made it, the
    llama-cpp-python version, the build's `llama_print_system_info()` and
    the profile."""
    import llama_cpp
    return dict(llama_cpp_version=np.array(llama_cpp.__version__),
                system_info=np.array(llama_cpp.llama_print_system_info().decode()),
                profile=np.array(profile()),
                command=np.array(f"python {tool} " + " ".join(map(shlex.quote, sys.argv[1:]))))
