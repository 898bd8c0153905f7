"""The CPU profiles: one per llama.cpp CPU build whose float order strata-ref
reproduces, each declared once, as data.

A profile is (llama.cpp version, CPU variant): the ggml x86 build options
that define the variant (the `GGML_*` CMake options of
`ggml/src/ggml-cpu/CMakeLists.txt`), the CPU flags (as `/proc/cpuinfo`
spells them) a CPU needs to execute that build, and the instruction-set
chain (`strata_ref.cpu.isa`) whose modules hold everything the build's
instruction sets decide: lane widths and reductions, `ggml_v_expf`, FMA
contraction, the activation quantizers, each weight type's `vec_dot`, the
tiled, repacked and tinyBLAS paths. Every profile's arithmetic is emulated
in numba, so every profile runs on any CPU; only making its reference data
needs a CPU with its flags.

The three profiles are three of ggml's own CPU variants
(`ggml_add_cpu_backend_variant` in `ggml/src/CMakeLists.txt`) of the
llama.cpp vendored by llama-cpp-python 0.3.36:

| profile | ggml variant | build options ON (all other x86 options OFF) | instruction sets |
|---|---|---|---|
| `scalar` | `x64` | none: x86-64 baseline (SSE2, no FMA) | x86_64, generic |
| `avx2` | `haswell` | SSE42 AVX F16C FMA AVX2 BMI2 | x86_avx2, x86_64, generic |
| `avx512` | `zen4` | those, AVX512 (F, CD, VL, DQ, BW), AVX512_VBMI, AVX512_VNNI, AVX512_BF16 | x86_avx512, x86_avx2, x86_64, generic |

The build options every profile leaves at ggml's default: GGML_LLAMAFILE
(llamafile's sgemm: used where the instruction set has a tinyBLAS) and
GGML_CPU_REPACK (the repacked layouts the instruction set picks) ON,
OpenMP ON.

The arm64 profiles are ggml's ARM variants of the same llama.cpp,
cross-compiled by Debian's GCC 12.2 with `GGML_CPU_ARM_ARCH` (passed to
GCC as `-march`; ggml picks its ARM kernels from the compiler's feature
macros) and checked under qemu-aarch64 (docs/arm64.md, `tools/arm_ref.py`):

| profile | ggml variant | `-march` | instruction sets |
|---|---|---|---|
| `armv8.0` | `armv8.0_1` | `armv8-a` | arm_neon, generic |
| `armv8.2-dotprod` | `armv8.2_1` | `armv8.2-a+dotprod` | arm_dotprod, arm_neon, generic |
| `armv8.2-fp16` | `armv8.2_2` | `armv8.2-a+dotprod+fp16` | arm_fp16, arm_dotprod, arm_neon, generic |
| `armv8.6-i8mm` | none (`apple_m2_m3` + FP16) | `armv8.6-a+dotprod+fp16+i8mm` | arm_i8mm, arm_fp16, arm_dotprod, arm_neon, generic |

`armv8.6-i8mm` reproduces llama.cpp run with 2 threads: its two-row
`vec_dot`s are taken per chunk of ggml's thread split (`cpu.mmla`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .isa import Isa, chain

__all__ = ["Profile", "PROFILES", "ARM64_PROFILES", "SOURCE_BUILD_PROFILES", "ALIASES", "LLAMA_CPP", "LLAMA_CPP_ARM64", "V0_4_0",
           "DEFAULT_FLASH_ATTN", "X86_OPTIONS", "OPTION_CPU_FLAGS", "host_flags"]

#: the llama.cpp whose arithmetic the profiles without a version prefix
#: reproduce
LLAMA_CPP = "llama.cpp vendored by llama-cpp-python 0.3.36"
#: llama.cpp release v0.4.0 as node-llama-cpp 3.21.1 ships it (prebuilt by
#: GCC 11.4 with GGML_CPU_ALL_VARIANTS; docs/prebuilt.md)
V0_4_0 = "llama.cpp v0.4.0, prebuilt by node-llama-cpp 3.21.1"
#: the same llama.cpp as LLAMA_CPP, cross-compiled for arm64 (Debian GCC
#: 12.2, static; docs/arm64.md)
LLAMA_CPP_ARM64 = "llama.cpp vendored by llama-cpp-python 0.3.36, arm64 (GCC 12.2 cross build)"

#: flash attention as each llama.cpp's usual front end leaves it when not
#: asked (docs/prebuilt.md "Defaults of v0.4.0"): llama-cpp-python 0.3.36's
#: `Llama(flash_attn=False)`: off (None here: off, but on for a quantized V
#: cache, which needs it); v0.4.0's `llama_context_default_params` and
#: node-llama-cpp: `LLAMA_FLASH_ATTN_TYPE_AUTO`, which llama.cpp resolves to
#: on when every layer is on the CPU
DEFAULT_FLASH_ATTN = {LLAMA_CPP: None, LLAMA_CPP_ARM64: None, V0_4_0: "auto"}

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
    # arm64 (/proc/cpuinfo "Features"; ggml-cpu/arch/arm/cpu-feats.cpp reads
    # the same bits from getauxval: FP16_VA needs both FPHP and ASIMDHP)
    "DOTPROD": ("asimddp",), "FP16_VA": ("fphp", "asimdhp"), "MATMUL_INT8": ("i8mm",),
    "SVE": ("sve",), "SVE2": ("sve2",), "SME": ("sme",),
}


@dataclass(frozen=True)
class Profile:
    """One llama.cpp CPU build: `variant` (ggml's ALL_VARIANTS name) of
    `version`, built with the x86 `options` ON, computing with the
    instruction-set chain `isa`. The properties below read what the chain
    decides, for reports and tests; the kernels ask the chain itself."""
    name: str
    variant: str
    version: str
    options: tuple
    summary: str
    isa: Isa
    #: the `GGML_CPU_ARM_ARCH` (GCC's `-march`) of an arm64 build, "" for x86
    march: str = ""

    @property
    def cpu_flags(self) -> tuple:
        """The /proc/cpuinfo flags a CPU needs to execute this build."""
        return tuple(f for o in self.options for f in OPTION_CPU_FLAGS[o])

    def cmake_args(self) -> list:
        """The CMake arguments that build llama.cpp for this profile."""
        if self.march:
            return ["-DGGML_NATIVE=OFF", f"-DGGML_CPU_ARM_ARCH={self.march}"]
        on = set(self.options)
        return ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{o}={'ON' if o in on else 'OFF'}"
                                        for o in X86_OPTIONS]

    def runs_on(self, flags) -> bool:
        """Whether a CPU with these /proc/cpuinfo flags executes the build."""
        return set(self.cpu_flags) <= set(flags)

    @property
    def default_flash_attn(self):
        """The flash-attention setting of this build's llama.cpp when not
        asked (`DEFAULT_FLASH_ATTN`): None (off; on for a quantized V cache)
        or "auto" (on, on the CPU)."""
        return DEFAULT_FLASH_ATTN[self.version]

    @property
    def simd_lanes(self) -> int:
        """Float lanes of ggml's `GGML_F32_VEC` (0: the build has no
        `GGML_SIMD`, its vector loops are plain C)."""
        return int(self.isa.resolve("F32_EPR"))

    @property
    def fma(self) -> bool:
        """Whether GCC contracts `a * b + c` in ggml's C code (FMA builds)."""
        return bool(self.isa.resolve("FMA"))

    @property
    def tinyblas(self) -> int:
        """Float lanes of llamafile's tinyBLAS (0: no llamafile path)."""
        return int(self.isa.resolve("TINYBLAS"))

    @property
    def tiled(self) -> bool:
        """Whether the build has ggml's tiled K-quant / I-quant mat-mul
        (`tiled/`; not v0.4.0's IQ panel gemm)."""
        return "tiled" in self.isa.resolve("TILED").values()

    @property
    def repack(self) -> frozenset:
        """The names of the weight types CPU_REPACK rearranges."""
        return frozenset(t.name for t in self.isa.resolve("REPACK"))

    def __str__(self) -> str:
        return self.name


_AVX2 = ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2")
_SCALAR = chain(("x86_64", "generic"))
_AVX2_CHAIN = ("x86_avx2", "x86_64", "generic")
_AVX512_CHAIN = ("x86_avx512",) + _AVX2_CHAIN
_ZEN4 = _AVX2 + ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16")

PROFILES = {p.name: p for p in (
    Profile("scalar", "x64", LLAMA_CPP, (), "ggml's generic C code, no SIMD build flag", _SCALAR),
    Profile("avx2", "haswell", LLAMA_CPP, _AVX2, "AVX2 + FMA + F16C, no AVX-512", chain(_AVX2_CHAIN)),
    Profile("avx512", "zen4", LLAMA_CPP, _ZEN4, "AVX-512 F/CD/VL/DQ/BW + VBMI + VNNI + BF16",
            chain(_AVX512_CHAIN)),
    # v0.4.0's x64 library computes what 0.3.36's scalar build does (no FMA
    # to contract, no tiled mat-mul there): the same chain
    Profile("v0.4.0-x64", "x64", V0_4_0, (), "v0.4.0's generic C code (= scalar)", _SCALAR),
    Profile("v0.4.0-sse42", "sse42", V0_4_0, ("SSE42",), "v0.4.0, SSE4.2 (4-lane SSE), no AVX",
            chain(("v0_4_0", "x86_sse42", "x86_64", "generic"))),
    Profile("v0.4.0-sandybridge", "sandybridge", V0_4_0, ("SSE42", "AVX"),
            "v0.4.0, AVX, no F16C, no FMA, no AVX2",
            chain(("v0_4_0", "x86_avx_nof16c", "x86_avx_nofma", "x86_avx") + _AVX2_CHAIN)),
    Profile("v0.4.0-ivybridge", "ivybridge", V0_4_0, ("SSE42", "AVX", "F16C"),
            "v0.4.0, AVX + F16C, no FMA, no AVX2",
            chain(("v0_4_0", "x86_avx_nofma", "x86_avx") + _AVX2_CHAIN)),
    Profile("v0.4.0-piledriver", "piledriver", V0_4_0, ("SSE42", "AVX", "F16C", "FMA"),
            "v0.4.0, AVX + FMA + F16C, no AVX2", chain(("v0_4_0", "x86_avx") + _AVX2_CHAIN)),
    Profile("v0.4.0-haswell", "haswell", V0_4_0, _AVX2, "v0.4.0, AVX2 + FMA + F16C",
            chain(("v0_4_0_avx2", "v0_4_0") + _AVX2_CHAIN)),
    Profile("v0.4.0-skylakex", "skylakex", V0_4_0, _AVX2 + ("AVX512",), "v0.4.0, AVX-512 without BF16",
            chain(("v0_4_0_avx2", "v0_4_0", "x86_avx512f") + _AVX512_CHAIN)),
    Profile("v0.4.0-zen4", "zen4", V0_4_0, _ZEN4, "v0.4.0, AVX-512 + VBMI + VNNI + BF16",
            chain(("v0_4_0_avx2", "v0_4_0") + _AVX512_CHAIN)),
    # zen4 plus ggml's AMX buffer (ggml-cpu/amx/), tried before CPU_REPACK
    Profile("v0.4.0-sapphirerapids", "sapphirerapids", V0_4_0, _ZEN4 + ("AMX_TILE", "AMX_INT8"),
            "v0.4.0, zen4's set + AMX (Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS/F16 weights in its AMX buffer)",
            chain(("x86_amx", "v0_4_0_avx2", "v0_4_0") + _AVX512_CHAIN)),
    Profile("armv8.0", "armv8.0_1", LLAMA_CPP_ARM64, (), "arm64 NEON + FMA, no dotprod (Raspberry Pi 4 class)",
            chain(("arm_neon", "generic")), march="armv8-a"),
    Profile("armv8.2-dotprod", "armv8.2_1", LLAMA_CPP_ARM64, ("DOTPROD",),
            "arm64 NEON + FMA + DOTPROD, no FP16 vector arithmetic",
            chain(("arm_dotprod", "arm_neon", "generic")), march="armv8.2-a+dotprod"),
    Profile("armv8.2-fp16", "armv8.2_2", LLAMA_CPP_ARM64, ("DOTPROD", "FP16_VA"),
            "arm64 NEON + FMA + DOTPROD + FP16 vector arithmetic (Pi 5, Graviton 2, Apple M under Linux)",
            chain(("arm_fp16", "arm_dotprod", "arm_neon", "generic")), march="armv8.2-a+dotprod+fp16"),
    Profile("armv8.6-i8mm", "armv8.6-i8mm", LLAMA_CPP_ARM64, ("DOTPROD", "FP16_VA", "MATMUL_INT8"),
            "arm64 NEON + FMA + DOTPROD + FP16 + i8mm, no SVE (Apple M2+ class), llama.cpp on 2 threads",
            chain(("arm_i8mm", "arm_fp16", "arm_dotprod", "arm_neon", "generic")),
            march="armv8.6-a+dotprod+fp16+i8mm"),
)}

#: the arm64 profiles (0.3.36's ARM builds), in the table's order
ARM64_PROFILES = tuple(n for n, p in PROFILES.items() if p.version == LLAMA_CPP_ARM64)
#: the profiles of llama-cpp-python 0.3.36's llama.cpp built here from
#: source (tools/peer_build.py, tools/arm_ref.py): the x86 builds, then the
#: arm64 ones, in the table's order
SOURCE_BUILD_PROFILES = tuple(n for n, p in PROFILES.items() if p.version in (LLAMA_CPP, LLAMA_CPP_ARM64))

#: ggml variants whose library gives the bits of another one's for every
#: stored model (docs/prebuilt.md "Alias classes": the options they add only
#: change how exact integer sums are formed): name -> the profile computing
#: them
ALIASES = {"v0.4.0-alderlake": "v0.4.0-haswell", "v0.4.0-cannonlake": "v0.4.0-skylakex",
           "v0.4.0-cascadelake": "v0.4.0-skylakex", "v0.4.0-icelake": "v0.4.0-skylakex",
           "v0.4.0-cooperlake": "v0.4.0-zen4"}


def host_flags() -> frozenset:
    """This CPU's flags as /proc/cpuinfo spells them: its "flags" line on
    x86, "Features" on arm64 (empty where there is no /proc/cpuinfo: not
    Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
