"""Which CPU library ggml's backend loader takes from a prebuilt llama.cpp,
and which profile computes that library's bits.

Prebuilt llama.cpp (release binaries, node-llama-cpp, other bundles) is
built with `GGML_CPU_ALL_VARIANTS=ON GGML_BACKEND_DL=ON`: one
`libggml-cpu-<variant>.so` per variant of `ggml_add_cpu_backend_variant`
(ggml/src/CMakeLists.txt). At start-up the loader (ggml-backend-reg.cpp,
`ggml_backend_load_best`) asks each library's `ggml_backend_score` and
keeps the highest nonzero score. The score (ggml-cpu/arch/x86/cpu-feats.cpp
`ggml_backend_cpu_x86_score`, arch/arm/cpu-feats.cpp
`ggml_backend_cpu_aarch64_score`) starts at 1 and, for each option the
library was compiled with, is 0 when the CPU lacks the feature, else gains
that option's bit. The variant lists and the bits are the same in the
llama.cpp of llama-cpp-python 0.3.36 and in v0.4.0.

`pick(flags, arch)` is that choice for a CPU with these /proc/cpuinfo flags;
`loader_profile(version)` the profile reproducing it (`--cpu
v0.4.0-native`).
"""
from __future__ import annotations

import platform

from .profiles import ALIASES, OPTION_CPU_FLAGS, PROFILES, Profile, host_flags

__all__ = ["X86_VARIANTS", "ARM64_VARIANTS", "SCORE_BITS", "host_arch", "variants", "score", "pick",
           "profile_of", "loader_profile"]

_AVX2 = ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2")
_ZEN4 = _AVX2 + ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16")

#: the x86 `ggml_add_cpu_backend_variant` lines (Linux, GCC), in their order:
#: variant -> the GGML_<option>s it is compiled with
X86_VARIANTS = {
    "x64": (),
    "sse42": ("SSE42",),
    "sandybridge": ("SSE42", "AVX"),
    "ivybridge": ("SSE42", "AVX", "F16C"),
    "piledriver": ("SSE42", "AVX", "F16C", "FMA"),
    "haswell": _AVX2,
    "skylakex": _AVX2 + ("AVX512",),
    "cannonlake": _AVX2 + ("AVX512", "AVX512_VBMI"),
    "cascadelake": _AVX2 + ("AVX512", "AVX512_VNNI"),
    "icelake": _AVX2 + ("AVX512", "AVX512_VBMI", "AVX512_VNNI"),
    "cooperlake": _AVX2 + ("AVX512", "AVX512_VNNI", "AVX512_BF16"),
    "zen4": _ZEN4,
    "alderlake": _AVX2 + ("AVX_VNNI",),
    "sapphirerapids": _ZEN4 + ("AMX_TILE", "AMX_INT8"),
}

#: the arm64 lines of a Linux build, in their order (the CMake option
#: FP16_VECTOR_ARITHMETIC is FP16_VA here, as llama.cpp's system info names it)
ARM64_VARIANTS = {
    "armv8.0_1": (),
    "armv8.2_1": ("DOTPROD",),
    "armv8.2_2": ("DOTPROD", "FP16_VA"),
    "armv8.2_3": ("DOTPROD", "FP16_VA", "SVE"),
    "armv8.6_1": ("DOTPROD", "FP16_VA", "SVE", "MATMUL_INT8"),
    "armv8.6_2": ("DOTPROD", "FP16_VA", "SVE", "MATMUL_INT8", "SVE2"),
    "armv9.2_1": ("DOTPROD", "FP16_VA", "SVE", "MATMUL_INT8", "SME"),
    "armv9.2_2": ("DOTPROD", "FP16_VA", "SVE", "MATMUL_INT8", "SVE2", "SME"),
}

#: the bit each compiled-in option adds to the score (AMX_TILE adds nothing
#: and is not checked; AVX512 needs F, CD, VL, DQ and BW)
SCORE_BITS = {"FMA": 1, "F16C": 2, "SSE42": 4, "BMI2": 8, "AVX": 16, "AVX2": 32, "AVX_VNNI": 64,
              "AVX512": 128, "AVX512_VBMI": 256, "AVX512_BF16": 512, "AVX512_VNNI": 1024,
              "AMX_TILE": 0, "AMX_INT8": 2048,
              "DOTPROD": 2, "FP16_VA": 4, "SVE": 8, "MATMUL_INT8": 16, "SVE2": 32, "SME": 64}


def host_arch() -> str:
    """"aarch64" on an arm64 machine, else "x86_64"."""
    return "aarch64" if platform.machine().lower() in ("aarch64", "arm64") else "x86_64"


def variants(arch: str = "x86_64") -> dict:
    """The variant table of `arch` ("x86_64" or "aarch64"); ValueError
    naming any other."""
    tables = {"x86_64": X86_VARIANTS, "aarch64": ARM64_VARIANTS}
    if arch not in tables:
        raise ValueError(f"no ALL_VARIANTS list for architecture {arch!r} (known: x86_64, aarch64)")
    return tables[arch]


def _table(variant: str) -> dict:
    for table in (X86_VARIANTS, ARM64_VARIANTS):
        if variant in table:
            return table
    raise ValueError(f"{variant!r} is not a ggml CPU variant "
                     f"(known: {', '.join(list(X86_VARIANTS) + list(ARM64_VARIANTS))})")


def score(variant: str, flags=None) -> int:
    """`ggml_backend_score` of `variant`'s library on a CPU with these
    /proc/cpuinfo flags (None: a CPU with every feature the variant needs),
    0 where the CPU lacks one. ValueError for an unknown variant."""
    options = _table(variant)[variant]
    s = 1
    for o in options:
        if flags is not None and SCORE_BITS[o] and not set(OPTION_CPU_FLAGS[o]) <= set(flags):
            return 0
        s += SCORE_BITS[o]
    return s


def pick(flags=None, arch=None, among=None) -> str:
    """The variant the loader takes on a CPU with these flags (default: this
    CPU's) of architecture `arch` (default: this machine's), from a folder
    holding the libraries of the variants `among` (default: all of the
    architecture's): the highest score (no two variants score the same
    where both run). ValueError when none of `among` runs on that CPU
    (the loader then finds no CPU backend) or one is not a variant of
    `arch`."""
    flags = host_flags() if flags is None else frozenset(flags)
    table = variants(arch or host_arch())
    among = list(table) if among is None else list(among)
    unknown = [v for v in among if v not in table]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a {arch or host_arch()} variant (known: {', '.join(table)})")
    best = max(among, key=lambda v: score(v, flags), default=None)
    if best is None or score(best, flags) == 0:
        raise ValueError(f"no library of {', '.join(among) or '(none)'} runs on this CPU")
    return best


def profile_of(version: str, variant: str) -> Profile | None:
    """The profile computing the bits of `version`'s `variant` library (an
    alias resolved), or None where no profile reproduces it."""
    for p in PROFILES.values():
        if p.version == version and p.variant == variant:
            return p
    for alias, target in ALIASES.items():
        if PROFILES[target].version == version and alias.endswith("-" + variant):
            return PROFILES[target]
    return None


def loader_profile(version: str, flags=None, arch=None) -> Profile:
    """The profile of the library `version`'s prebuilt loader takes on this
    CPU (`pick`). ValueError naming the variant where no profile of that
    version reproduces it (every arm64 variant of v0.4.0, the SVE / SME
    ones of 0.3.36)."""
    variant = pick(flags, arch)
    p = profile_of(version, variant)
    if p is None:
        raise ValueError(f"ggml's loader would take the {variant} library of {version} on this CPU; "
                         f"no profile reproduces it")
    return p
