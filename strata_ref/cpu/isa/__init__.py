"""Instruction-set modules: what each instruction set decides in ggml-cpu's
arithmetic, one module per instruction set, with ggml's fallback rule.

ggml-cpu writes its portable C code once (`quants.c`'s `*_generic`
functions, `vec.cpp` over the macros of `simd-mappings.h`, `ops.cpp`) and,
per instruction set, the functions that set overrides (`arch/x86/quants.c`,
`arch/x86/repack.cpp`, the `__AVX2__` / `__AVX512F__` / `__SSE2__` branches
of `vec.h`); `arch-fallback.h` maps every function an instruction set lacks
to the generic one. Here each instruction set is one module of this
package defining the same names:

| module | ggml build it follows |
|---|---|
| `generic` | no SIMD macro at all: the portable C code |
| `x86_64` | the x86-64 baseline (SSE2; ggml's `x64` variant) |
| `x86_sse42` | SSE4.2, 4-lane SSE vectors, no AVX (`sse42`, v0.4.0) |
| `x86_avx` | AVX + F16C + FMA without AVX2 (`piledriver`, v0.4.0) |
| `x86_avx_nofma` | AVX + F16C without FMA (`ivybridge`, v0.4.0) |
| `x86_avx_nof16c` | AVX without F16C or FMA (`sandybridge`, v0.4.0) |
| `x86_avx2` | AVX2 + FMA + F16C (`haswell`) |
| `x86_avx512` | AVX-512 F/CD/VL/DQ/BW + VBMI + VNNI + BF16 (`zen4`) |
| `v0_4_0` | llama.cpp v0.4.0 (node-llama-cpp 3.21.1) over the variant's modules |
| `v0_4_0_avx2` | v0.4.0 on its builds with AVX2: the IQ panel gemm |
| `x86_amx` | + AMX_TILE, AMX_INT8: ggml's AMX buffer (`sapphirerapids`) |
| `arm_neon` | arm64 NEON + FMA, no dotprod (`armv8.0_1`) |
| `arm_dotprod` | arm64 NEON + FMA + DOTPROD (`armv8.2_1`) |
| `arm_fp16` | arm64 NEON + FMA + DOTPROD + FP16 vector arithmetic (`armv8.2_2`) |

An `Isa` is a chain of these modules, most specific first and `generic`
last (the avx512 build runs `x86_avx512`, then `x86_avx2` for what
AVX-512 leaves to the AVX2 code, then `x86_64`, then `generic`); a name
resolves to the first module of the chain that defines it (`resolve`), a
per-type table entry to the first module whose table has the type
(`lookup`). Adding an instruction set is adding a module and naming it in
a chain (`docs/extending.md`).

In numba kernels an Isa is an argument of its own type (`IsaType`, one per
chain): `isa.NAME` (a constant of `CONSTANTS`) and `isa.NAME(...)` (a
function of `FUNCTIONS`) resolve at compile time, so a kernel compiled for
one chain holds that chain's code and no branch on the others. Compiled
kernels are keyed by the chain's name.

The names every chain resolves (`generic` defines them all):

* constants: `FMA` (the build contracts C's `a * b + c` into one FMA:
  GCC does on builds with FMA instructions), `BASE_FMA` (ggml-base, built
  without the variant's flags, is contracted too: arm64, whose baseline
  has FMA; its reference quantizers, `base_quant`, `Q8_K_FMA`), `F32_EPR` / `F32_STEP` and
  `F16_EPR` / `F16_STEP` (`GGML_F32_EPR`, `GGML_F32_STEP`, ...: float
  lanes per vector and per step of the 4-accumulator loops of `vec.cpp`;
  0 where the build has no `GGML_SIMD`), `EXPF_LANES` (lanes of the
  `ggml_v_expf` vectors in `ggml_vec_soft_max_f32`, `ggml_vec_silu_f32`,
  `ggml_vec_swiglu_f32`; 1: the scalar libm `expf` throughout), `TINYBLAS`
  (float lanes of llamafile's tinyBLAS, 0: no llamafile path),
  `TINYBLAS_F16` (llamafile takes F16 weights where it has a tinyBLAS:
  not on x86 without F16C),
  `TINYBLAS_BF16` (elements per step of tinyBLAS on BF16 weights, 0: none),
  `F32_TAIL_FMA` (where GCC's vectorized tail of `ggml_vec_dot_f32` turns
  into contracted FMAs: the last `n % F32_TAIL_FMA` elements),
  `FA_S_FMA` (whether, on an FMA build, the compiler contracts flash
  attention's one-chunk `S = S*ms + vs`: GCC 12 does, GCC 11 does not),
  `TINYBLAS_F32_MIN_ROWS` (the fewest activation rows llamafile takes F32
  weights with: 2, 4 on ARM NEON), `TINYBLAS_F16_F32B` (llamafile takes F16
  weights only with F32 activations as they are, never with activations
  converted to F16: ARM NEON without FP16 vector arithmetic), `ROPE_FMA`
  (how GCC contracted `rotate_pairs` of the RoPE: 0 not, 1 as on x86, 2
  as on arm64; `ops.rope`), `Q8_K_FMA` (the build's
  `quantize_row_q8_K_ref` contracts `nearest_int(iscale * x)`'s
  `iscale * x + 1.5 * 2^23` into one FMA, so q is the exact product
  rounded half to even: arm64, whose FMA baseline reaches ggml-base;
  `act_quant.q8_k_fields`), `F16_VA` (Arm's FP16 vector arithmetic: the
  F16 macros and llamafile's F16 tinyBLAS compute in binary16,
  `cpu.fp16_va`), `TINYBLAS_F16_MIN_ROWS` (the fewest activation rows
  llamafile takes F16 weights with: 2, 8 with FP16 arithmetic),
  `LIBM_FMA` (the C library the build links is contracted: aarch64
  glibc's `expm1f` under `tanhf`, `cpu.libm`).
* functions (numba): `madd(a, b, c)`; `expf_v(x)`, `silu_v(x)` (one lane
  of `ggml_v_expf` / `ggml_v_silu`) and `expf8(v)`, `silu8(v)` (the same on
  an `F32x8`); `lane_sum(w, c0)` (the lane sum of one `EXPF_LANES` vector
  at w[c0]); `reduce_f32(acc)` (`GGML_F32_VEC_REDUCE` of the `F32_STEP`
  accumulator lanes in acc), `reduce_f32_cols(acc, d, dst)` (the same for
  8 columns of acc (F32_STEP, m) at once); `hsum(acc)` / `hsum_cols(acc,
  d, dst)` (the lane sum of one `TINYBLAS` vector: tinyBLAS's `hsum`);
  `vec_dot_f16`, `vec_dot_f32`, `vec_dot_bf16` (`vec.cpp`), `tinyblas_dot`
  and `tinyblas_bf16` (llamafile's tinyBLAS), each `(a, ao, b, bo, n,
  acc)`: the dot of a[ao:ao+n] and b[bo:bo+n] (float32 arrays, or for the
  F16 dots fp16 bits: `vec.operand`), acc a float32 scratch of 64 lanes;
  `quantize_rows_q8(x, q, d, s, with_sum)` (the Q8_0 / Q8_1 activation
  quantizer, `quantize_row_q8_0` / `_q8_1`).
* Python tables: `VEC_DOT` ({type: kernel variant} of each type's
  `vec_dot`, per-type fallback), `TILED` ({type: kernel variant} of the
  batched path that takes a type from 8 activation rows: ggml's tiled
  mat-mul, `tiled/`, or v0.4.0's IQ panel gemm, `iqp.cpp`), `REPACK` ({type: layout} of ggml's CPU_REPACK buffer,
  `ggml_repack_get_optimal_repack_type`), `TINYBLAS_Q0` (the quantized
  types llamafile's `tinyBLAS_Q0` takes), `AMX` ({type: row-length
  multiple} of ggml's AMX buffer, `x86_amx`; empty without AMX).
"""
from __future__ import annotations

import importlib

from numba import types
from numba.extending import (NativeValue, box, models, overload_attribute, overload_method,
                             register_model, typeof_impl, unbox)

__all__ = ["Isa", "IsaType", "chain", "CONSTANTS", "FUNCTIONS", "TABLES"]

CONSTANTS = ("FMA", "BASE_FMA", "F32_EPR", "F32_STEP", "F16_EPR", "F16_STEP", "EXPF_LANES", "TINYBLAS", "TINYBLAS_F16",
             "TINYBLAS_BF16", "F32_TAIL_FMA", "FA_S_FMA", "TINYBLAS_F32_MIN_ROWS", "TINYBLAS_F16_F32B",
             "ROPE_FMA", "Q8_K_FMA", "F16_VA", "TINYBLAS_F16_MIN_ROWS", "LIBM_FMA")
FUNCTIONS = {  # name: number of arguments
    "madd": 3, "expf_v": 1, "silu_v": 1, "expf8": 1, "silu8": 1, "lane_sum": 2,
    "reduce_f32": 1, "reduce_f32_cols": 3, "hsum": 1, "hsum_cols": 3,
    "vec_dot_f16": 6, "vec_dot_f32": 6, "vec_dot_bf16": 6, "tinyblas_dot": 6, "tinyblas_bf16": 6,
    "quantize_rows_q8": 5,
}
TABLES = ("VEC_DOT", "TILED", "REPACK", "TINYBLAS_Q0", "AMX")

_CHAINS: dict = {}


class Isa:
    """A chain of instruction-set modules (names of this package's modules,
    most specific first, ending in "generic"). Equal chains are one object
    (`chain`)."""

    def __init__(self, names: tuple):
        if not names or names[-1] != "generic":
            raise ValueError(f"an instruction-set chain ends in 'generic', got {names}")
        self.names = tuple(names)
        self.name = names[0]
        self.modules = tuple(importlib.import_module(f"{__name__}.{n}") for n in names)

    def resolve(self, attr: str):
        """The first module's definition of `attr` (ggml's arch-fallback
        rule); AttributeError naming the chain when no module has it."""
        for m in self.modules:
            if attr in vars(m):
                return vars(m)[attr]
        raise AttributeError(f"no instruction set of {'/'.join(self.names)} defines {attr}")

    def lookup(self, table: str, key, default=None):
        """The entry for `key` of the first module whose `table` has it
        (per-type fallback, as for each `vec_dot`), else `default`."""
        for m in self.modules:
            t = vars(m).get(table)
            if t is not None and key in t:
                return t[key] if isinstance(t, dict) else True
        return default

    @property
    def key(self) -> str:
        """The chain's names joined by '-': part of compiled kernels' cache
        names."""
        return "-".join(self.names)

    def __reduce__(self):
        return (chain, (self.names,))

    def __repr__(self) -> str:
        return f"Isa({'/'.join(self.names)})"


def chain(names) -> Isa:
    """The one `Isa` of these module names."""
    names = tuple(names)
    isa = _CHAINS.get(names)
    if isa is None:
        isa = _CHAINS[names] = Isa(names)
    return isa


class IsaType(types.Type):
    """The numba type of one chain; its value carries no data."""

    def __init__(self, names: tuple):
        self.names = tuple(names)
        super().__init__(name=f"Isa[{'/'.join(names)}]")

    @property
    def isa(self) -> Isa:
        return chain(self.names)


@typeof_impl.register(Isa)
def _typeof_isa(val, c):
    return IsaType(val.names)


register_model(IsaType)(models.OpaqueModel)


@unbox(IsaType)
def _unbox_isa(typ, obj, c):
    return NativeValue(c.context.get_constant_null(types.voidptr))


@box(IsaType)
def _box_isa(typ, val, c):
    return c.pyapi.unserialize(c.pyapi.serialize_object(typ.isa))


def _register_constant(name: str) -> None:
    @overload_attribute(IsaType, name, inline="always")
    def _ov(isa):
        value = isa.isa.resolve(name)
        return lambda isa: value


# numba wants the typing function and the implementation of an overload
# to take the same named arguments: one pair per arity
def _typing(name: str, n: int):
    def impl_of(isa):
        return _IMPLS[n](isa.isa.resolve(name))
    if n == 1:
        return lambda isa, a: impl_of(isa)
    if n == 2:
        return lambda isa, a, b: impl_of(isa)
    if n == 3:
        return lambda isa, a, b, c: impl_of(isa)
    if n == 5:
        return lambda isa, a, b, c, d, e: impl_of(isa)
    if n == 6:
        return lambda isa, a, b, c, d, e, f: impl_of(isa)
    raise NotImplementedError(n)


_IMPLS = {
    1: lambda fn: (lambda isa, a: fn(a)),
    2: lambda fn: (lambda isa, a, b: fn(a, b)),
    3: lambda fn: (lambda isa, a, b, c: fn(a, b, c)),
    5: lambda fn: (lambda isa, a, b, c, d, e: fn(a, b, c, d, e)),
    6: lambda fn: (lambda isa, a, b, c, d, e, f: fn(a, b, c, d, e, f)),
}


def _register_function(name: str, n: int) -> None:
    overload_method(IsaType, name, inline="always")(_typing(name, n))


for _c in CONSTANTS:
    _register_constant(_c)
for _f, _n in FUNCTIONS.items():
    _register_function(_f, _n)
