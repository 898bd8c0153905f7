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
would use on this CPU (`native`).

Modules: `profiles` (the declarations), `isa` (the instruction sets),
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
from .profiles import ALIASES, PROFILES, Profile, host_flags

__all__ = ["select", "native", "native_note", "Profile", "PROFILES", "ALIASES", "ENV"]

#: the environment variable naming the default profile
ENV = "STRATA_REF_CPU"


def native(flags=None) -> Profile:
    """The profile of llama.cpp's native build (`-DGGML_NATIVE=ON`,
    `-march=native`) on a CPU with these /proc/cpuinfo flags (default: this
    CPU's): the widest profile whose flags the CPU has all of (avx512, then
    avx2), else scalar. `native_note` says where a native build would still
    differ."""
    flags = host_flags() if flags is None else frozenset(flags)
    for name in ("avx512", "avx2"):
        if PROFILES[name].runs_on(flags):
            return PROFILES[name]
    return PROFILES["scalar"]


def native_note(flags=None) -> str:
    """'' when `native(flags)` is what a native llama.cpp build computes on
    that CPU, else one short line saying which build the results are bit
    for bit and why the native build is not: AMX (a native build multiplies
    Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K and IQ4_XS weights in ggml's AMX
    buffer, `ggml-cpu/amx/`), AVX-512 without the rest of the avx512
    profile's set, AVX without AVX2: code paths no profile reproduces."""
    flags = host_flags() if flags is None else frozenset(flags)
    p = native(flags)
    if p.name == "avx512" and {"amx_int8", "amx_tile"} <= flags:
        why = "AMX"
    elif p.name == "avx2" and "avx512f" in flags:
        why = "AVX-512 without " + " ".join(sorted(set(PROFILES["avx512"].cpu_flags) - flags))
    elif p.name == "scalar" and "avx" in flags:
        why = "AVX without the rest of the avx2 profile's flags"
    else:
        return ""
    if why == "AMX":
        return (f"native = {p.name}: bit for bit llama.cpp's {p.name} build, not its native build "
                f"(AMX here: no 0.3.36 profile has it; prebuilt v0.4.0's: --cpu v0.4.0-sapphirerapids)")
    return (f"native = {p.name}: bit for bit llama.cpp's {p.name} build, not its native build "
            f"({why} here: no profile reproduces it)")


def select(name=None) -> Profile:
    """The profile called `name` (a key of `PROFILES`, e.g. "scalar",
    "avx2", "avx512", "v0.4.0-haswell", an alias of `ALIASES`, e.g.
    "v0.4.0-alderlake", which gives the profile computing its bits, or
    "native"; a Profile passes through). None: `$STRATA_REF_CPU`, else
    (unset or empty) "native".
    Raises ValueError naming the value (and the variable, when it came from
    the environment) for any other name: "--cpu 'sse4' is not a CPU
    profile (known: ...)", "STRATA_REF_CPU='sse4' is not ..."."""
    if isinstance(name, Profile):
        return name
    source = "--cpu "
    if name is None:
        name = env_value(ENV) or "native"
        source = f"{ENV}="
    key = str(name).strip().lower()
    if key == "native":
        return native()
    key = ALIASES.get(key, key)
    if key not in PROFILES:
        raise ValueError(f"{source}{name!r} is not a CPU profile "
                         f"(known: {', '.join(list(PROFILES) + list(ALIASES))}, native)")
    return PROFILES[key]
