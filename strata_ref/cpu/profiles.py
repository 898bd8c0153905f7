"""The CPU profiles: one per llama.cpp CPU build whose float order strata-ref
reproduces, each declared once, as data.

A profile names the ggml x86 build options that define it (the `GGML_*`
CMake options of `ggml/src/ggml-cpu/CMakeLists.txt`, llama.cpp vendored by
llama-cpp-python 0.3.36), the CPU flags (as `/proc/cpuinfo` spells them) a
CPU needs to execute that build, and what the build's choice of code paths
is, as fields the kernels read. Every profile's arithmetic is emulated in
numba, so every profile runs on any CPU; only making its reference data
needs a CPU with its flags.

The three profiles are three of ggml's own CPU variants
(`ggml_add_cpu_backend_variant` in `ggml/src/CMakeLists.txt`):

| profile | ggml variant | build options ON (all other x86 options OFF) |
|---|---|---|
| `scalar` | `x64` | none: ggml's generic C code (x86-64 baseline: SSE2, no FMA) |
| `avx2` | `haswell` | SSE42 AVX F16C FMA AVX2 BMI2 |
| `avx512` | `zen4` | those, AVX512 (F, CD, VL, DQ, BW), AVX512_VBMI, AVX512_VNNI, AVX512_BF16 |

What differs between them (ggml-cpu source, same version):

* `arch` selects the SIMD width of ggml's vector code (`simd-mappings.h`,
  `vec.h`, `vec.cpp`): 16 float lanes on AVX-512, 8 on AVX2, and on the
  baseline build the SSE2 versions of `ggml_v_expf` / `ggml_v_silu` (4
  lanes, no FMA) while every other vector loop is plain C.
* `fma`: GCC contracts `a * b + c` in ggml's C code into an FMA only when
  the build may use FMA instructions.
* `act_quant`: the AVX builds quantize activations to Q8_0 / Q8_1 with
  `127 / amax` and round half to even (`arch/x86/quants.c`), the baseline
  build with ggml's reference quantizers (`1 / d`, `roundf`).
* `vec_dot`: the weight types' one-row dot products, the `__AVX2__` code of
  `arch/x86/quants.c` (the AVX-512 build takes the same code) or the
  generic C code of `quants.c`.
* `tinyblas`: llamafile's `tinyBLAS` lane count for float mat-muls (0: the
  build has no llamafile path: it needs AVX).
* `tiled`: ggml's tiled K-quant / I-quant mat-mul (`tiled/`), AVX2 and up.
* `repack`: the weight types ggml-cpu's CPU_REPACK buffer rearranges
  (`ggml_repack_get_optimal_repack_type`: Q4_0, Q4_K, IQ4_NL, MXFP4 when the
  build has AVX2, Q2_K only with AVX-512).
* `bf16`: the BF16 dot (`ggml_vec_dot_bf16`, tinyBLAS): AVX512-BF16's
  `vdpbf16ps`, or float32 FMA lanes.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Profile", "PROFILES", "ARCH_SSE2", "ARCH_AVX2", "ARCH_AVX512", "X86_OPTIONS",
           "OPTION_CPU_FLAGS", "host_flags"]

#: `Profile.arch` values, read by the numba kernels
ARCH_SSE2, ARCH_AVX2, ARCH_AVX512 = 0, 1, 2

# every x86 instruction-set option of ggml-cpu's CMakeLists (GGML_NATIVE=OFF)
X86_OPTIONS = ("SSE42", "AVX", "AVX_VNNI", "AVX2", "BMI2", "FMA", "F16C", "AVX512",
               "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_TILE", "AMX_INT8",
               "AMX_BF16")

# the /proc/cpuinfo flags each option's instructions need
OPTION_CPU_FLAGS = {
    "SSE42": ("sse4_2",), "AVX": ("avx",), "AVX_VNNI": ("avx_vnni",), "AVX2": ("avx2",),
    "BMI2": ("bmi2",), "FMA": ("fma",), "F16C": ("f16c",),
    "AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "AVX512_VBMI": ("avx512vbmi",), "AVX512_VNNI": ("avx512_vnni",),
    "AVX512_BF16": ("avx512_bf16",), "AMX_TILE": ("amx_tile",), "AMX_INT8": ("amx_int8",),
    "AMX_BF16": ("amx_bf16",),
}


@dataclass(frozen=True)
class Profile:
    """One llama.cpp CPU build (module docstring for the fields' meaning)."""
    name: str
    variant: str
    options: tuple
    summary: str
    arch: int
    fma: bool
    act_quant: str           # "avx" or "ref"
    vec_dot: str             # "avx2" or "generic"
    tinyblas: int            # float lanes of llamafile's tinyBLAS, 0 = no llamafile path
    tiled: bool
    repack: frozenset        # ggml type names
    bf16: str                # "avx512bf16", "avx2" or "generic"

    @property
    def cpu_flags(self) -> tuple:
        """The /proc/cpuinfo flags a CPU needs to execute this build."""
        return tuple(f for o in self.options for f in OPTION_CPU_FLAGS[o])

    def cmake_args(self) -> list:
        """The CMake arguments that build llama.cpp for this profile."""
        on = set(self.options)
        return ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{o}={'ON' if o in on else 'OFF'}"
                                        for o in X86_OPTIONS]

    def runs_on(self, flags) -> bool:
        """Whether a CPU with these /proc/cpuinfo flags executes the build."""
        return set(self.cpu_flags) <= set(flags)

    @property
    def simd_lanes(self) -> int:
        """Float lanes of ggml's `GGML_F32_VEC` (0: the build has no
        `GGML_SIMD`, its vector loops are plain C)."""
        return {ARCH_SSE2: 0, ARCH_AVX2: 8, ARCH_AVX512: 16}[self.arch]

    def __str__(self) -> str:
        return self.name


_AVX2 = ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2")
_REPACK_AVX2 = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})

PROFILES = {p.name: p for p in (
    Profile("scalar", "x64", (), "ggml's generic C code, no SIMD build flag",
            arch=ARCH_SSE2, fma=False, act_quant="ref", vec_dot="generic", tinyblas=0,
            tiled=False, repack=frozenset(), bf16="generic"),
    Profile("avx2", "haswell", _AVX2, "AVX2 + FMA + F16C, no AVX-512",
            arch=ARCH_AVX2, fma=True, act_quant="avx", vec_dot="avx2", tinyblas=8,
            tiled=True, repack=_REPACK_AVX2, bf16="avx2"),
    Profile("avx512", "zen4", _AVX2 + ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"),
            "AVX-512 F/CD/VL/DQ/BW + VBMI + VNNI + BF16",
            arch=ARCH_AVX512, fma=True, act_quant="avx", vec_dot="avx2", tinyblas=16,
            tiled=True, repack=_REPACK_AVX2 | {"Q2_K"}, bf16="avx512bf16"),
)}


def host_flags() -> frozenset:
    """This CPU's flags as /proc/cpuinfo spells them (empty where there is no
    /proc/cpuinfo: not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
