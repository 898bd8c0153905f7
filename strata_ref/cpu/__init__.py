"""ggml-cpu's arithmetic, one profile per llama.cpp CPU build, shaped as
ggml-cpu is.

A *profile* (`profiles`) is what one llama.cpp CPU build computes: (the
llama.cpp version, the CPU variant), the build options, and the chain of
instruction-set modules (`isa`: `generic`, `x86_64`, `x86_avx2`,
`x86_avx512`) that hold what its instruction sets decide: lane widths and
reductions, `ggml_v_expf`, FMA contraction, the activation quantizers, which
`vec_dot`, tiled, repacked and tinyBLAS kernels run. Every module here takes
the profile (or its chain) as data and emulates that build in numba, so any
profile runs on any CPU; the model graphs (`strata_ref.infer`) never ask
which one runs.

`select(name)` is the one place that chooses: a profile name, or None for
`$STRATA_REF_CPU`, else "native", the profile that llama.cpp's native build
would use on this CPU (`native`); "v0.4.0-native" is the library prebuilt
v0.4.0's loader takes here (`loader`).

Modules: `profiles` (the declarations), `loader` (ggml's pick among the
libraries of a prebuilt build), `isa` (the instruction sets),
`traits` (per weight type: its activation type and kernel family; ggml's
mat-mul dispatch), `fp` (float primitives: FMA, lane reduction trees),
`vec` (the operands of the float dots), `simd` / `lanes` (vector values and
exact integer lanes), `act_quant` (Q8_0 / Q8_1 / Q8_K activations),
`matmul` (`QMatrix`), the kernel families `matvec` (over `legacy_dots`,
`kquant_dots`), `kquant_unpacked`, `dots_iquants`, `dots_small`,
`dots_float`; `amx` (ggml-cpu's AMX mat-mul, the weights of its buffer
on the sapphirerapids build); `ops` (soft_max, SwiGLU, RoPE, norms), `f16_attention`,
`attention`, `flash_attn`, `hadamard`, `moe` (expert selection,
`mul_mat_id`, the expert sum), `ssm` (the Gated DeltaNet operations).
docs/extending.md says which to touch
to add an instruction set, a CPU build or a weight type.
"""
from __future__ import annotations

from .._env import env_value
from .loader import host_arch, loader_profile
from .profiles import ALIASES, PROFILES, V0_4_0, Profile, host_flags

__all__ = ["select", "native", "native_note", "Profile", "PROFILES", "ALIASES", "NATIVE_NAMES", "ENV"]

#: the environment variable naming the default profile
ENV = "STRATA_REF_CPU"


#: the profiles a native build (`-DGGML_NATIVE=ON`) of llama-cpp-python
#: 0.3.36's llama.cpp can be, widest first, per architecture
_NATIVE = {"x86_64": ("avx512", "avx2", "scalar"),
           "aarch64": ("armv8.6-i8mm", "armv8.2-fp16", "armv8.2-dotprod", "armv8.0")}

#: the names `select` resolves on this CPU: `native` (a native build of
#: llama-cpp-python 0.3.36's llama.cpp) and `v0.4.0-native` (what prebuilt
#: v0.4.0's loader takes, `loader.pick`)
NATIVE_NAMES = ("native", "v0.4.0-native")


def native(flags=None, arch=None) -> Profile:
    """The profile of llama.cpp's native build (`-DGGML_NATIVE=ON`:
    `-march=native` on x86, `-mcpu=native` on arm64) on a CPU with these
    /proc/cpuinfo flags (default: this CPU's) of architecture `arch`
    ("x86_64" or "aarch64"; default: this machine's): the widest profile
    whose flags the CPU has all of (x86: avx512, avx2, else scalar; arm64:
    armv8.6-i8mm, armv8.2-fp16, armv8.2-dotprod, else armv8.0).
    `native_note` says where a native build would still differ."""
    flags = host_flags() if flags is None else frozenset(flags)
    names = _NATIVE[arch or host_arch()]
    return next(PROFILES[n] for n in names if PROFILES[n].runs_on(flags) or n == names[-1])


def native_note(flags=None, arch=None) -> str:
    """'' when `native(flags, arch)` is what a native llama.cpp build
    computes on that CPU, else one short line saying which build the
    results are bit for bit and why the native build is not: AMX (a native
    build multiplies Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K and IQ4_XS weights in
    ggml's AMX buffer, `ggml-cpu/amx/`), AVX-512 without the rest of the
    avx512 profile's set, AVX without AVX2, SVE / SME on arm64 (GCC's
    `-mcpu=native` turns on ggml's SVE code): code paths no profile
    reproduces."""
    flags = host_flags() if flags is None else frozenset(flags)
    p = native(flags, arch)
    if p.name == "avx512" and {"amx_int8", "amx_tile"} <= flags:
        return (f"native = {p.name}: bit for bit llama.cpp's {p.name} build, not its native build "
                f"(AMX here: no 0.3.36 profile has it; prebuilt v0.4.0's: --cpu v0.4.0-native)")
    if p.name == "avx2" and "avx512f" in flags:
        why = "AVX-512 without " + " ".join(sorted(set(PROFILES["avx512"].cpu_flags) - flags))
    elif p.name == "scalar" and "avx" in flags:
        why = "AVX without the rest of the avx2 profile's flags"
    elif p.march and flags & {"sve", "sve2", "sme"}:
        why = "/".join(f.upper() for f in ("sve", "sve2", "sme") if f in flags)
    else:
        return ""
    return (f"native = {p.name}: bit for bit llama.cpp's {p.name} build, not its native build "
            f"({why} here: no profile reproduces it)")


def select(name=None) -> Profile:
    """The profile called `name` (a key of `PROFILES`, e.g. "scalar",
    "avx2", "avx512", "v0.4.0-haswell", an alias of `ALIASES`, e.g.
    "v0.4.0-alderlake", which gives the profile computing its bits, or
    "native" (`native`), or "v0.4.0-native" (the profile of the library
    prebuilt v0.4.0's loader takes on this CPU, `loader.loader_profile`);
    a Profile passes through). None: `$STRATA_REF_CPU`, else (unset or
    empty) "native".
    Raises ValueError naming the value (and the variable, when it came from
    the environment) for any other name: "--cpu 'sse4' is not a CPU
    profile (profiles: ...; aliases: ...; or native, v0.4.0-native)", with
    "did you mean X?" first for a near miss; "STRATA_REF_CPU='sse4' is not
    ..."; and for "v0.4.0-native" where no profile reproduces the library
    the loader would take (an arm64 CPU)."""
    if isinstance(name, Profile):
        return name
    source = "--cpu "
    if name is None:
        name = env_value(ENV) or "native"
        source = f"{ENV}="
    key = str(name).strip().lower()
    if key == "native":
        return native()
    if key == "v0.4.0-native":
        try:
            return loader_profile(V0_4_0)
        except ValueError as e:
            raise ValueError(f"{source}{name!r}: {e}") from None
    key = ALIASES.get(key, key)
    if key not in PROFILES:
        import difflib
        close = difflib.get_close_matches(key, list(PROFILES) + list(ALIASES) + list(NATIVE_NAMES), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ValueError(f"{source}{name!r} is not a CPU profile ({hint}profiles: {', '.join(PROFILES)}; "
                         f"aliases: {', '.join(ALIASES)}; or {', '.join(NATIVE_NAMES)})")
    return PROFILES[key]
