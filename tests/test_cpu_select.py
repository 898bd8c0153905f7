"""Choosing the CPU profile: names, $STRATA_REF_CPU, the native choice from
CPU flags, and the profiles' build declarations."""
from __future__ import annotations

import pytest

from strata_ref import cpu
from strata_ref.cpu.profiles import PROFILES, X86_OPTIONS

HASWELL = {"sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"}
ZEN4 = HASWELL | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi",
                  "avx512_vnni", "avx512_bf16"}


def test_names_and_environment(monkeypatch):
    monkeypatch.delenv(cpu.ENV, raising=False)
    for name in ("scalar", "avx2", "avx512"):
        assert cpu.select(name) is PROFILES[name]
        assert cpu.select(name.upper()) is PROFILES[name]
        assert cpu.select(PROFILES[name]) is PROFILES[name]
    assert cpu.select(None) is cpu.native()
    monkeypatch.setenv(cpu.ENV, "scalar")
    assert cpu.select(None) is PROFILES["scalar"]
    assert cpu.select("avx2") is PROFILES["avx2"]          # an argument beats the variable
    monkeypatch.setenv(cpu.ENV, "neon")
    with pytest.raises(ValueError, match=r"^STRATA_REF_CPU='neon' is not a CPU profile"):
        cpu.select(None)
    with pytest.raises(ValueError, match="^--cpu 'avx3' is not a CPU profile"):
        cpu.select("avx3")


def test_native_follows_the_cpu_flags():
    assert cpu.native(ZEN4).name == "avx512"
    assert cpu.native(HASWELL).name == "avx2"
    assert cpu.native(HASWELL - {"fma"}).name == "scalar"
    assert cpu.native(set()).name == "scalar"
    # Skylake-X: AVX-512 F..BW without VNNI / VBMI / BF16 is not the avx512 build
    skx = HASWELL | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"}
    assert cpu.native(skx).name == "avx2"
    assert "AVX-512" in cpu.native_note(skx)
    assert cpu.native_note(ZEN4) == "" and cpu.native_note(HASWELL) == ""
    assert "AMX" in cpu.native_note(ZEN4 | {"amx_tile", "amx_int8"})
    assert "AVX" in cpu.native_note({"sse4_2", "avx"})


def test_profiles_declare_the_builds():
    s, a2, a5 = PROFILES["scalar"], PROFILES["avx2"], PROFILES["avx512"]
    # every x86 option is set explicitly, ON exactly for the profile's options
    # (an arm64 build names its -march: tests/test_cpu_arm.py)
    for p in PROFILES.values():
        if p.march:
            assert p.cmake_args() == ["-DGGML_NATIVE=OFF", f"-DGGML_CPU_ARM_ARCH={p.march}"]
            continue
        args = p.cmake_args()
        assert args[0] == "-DGGML_NATIVE=OFF" and len(args) == 1 + len(X86_OPTIONS)
        assert {a.split("=")[0][len("-DGGML_"):] for a in args[1:] if a.endswith("=ON")} == set(p.options)
    assert s.cpu_flags == () and s.runs_on(set())
    assert set(a2.cpu_flags) == HASWELL and set(a5.cpu_flags) == ZEN4
    assert a5.runs_on(ZEN4) and not a5.runs_on(HASWELL) and a2.runs_on(ZEN4)
    # the code paths that differ (ggml-cpu: simd-mappings.h, quants.c, repack.cpp)
    assert (s.simd_lanes, a2.simd_lanes, a5.simd_lanes) == (0, 8, 16)
    assert (s.fma, a2.fma, a5.fma) == (False, True, True)
    assert s.repack == frozenset() and "Q2_K" in a5.repack and "Q2_K" not in a2.repack
    assert not s.tiled and a2.tiled and a5.tiled and s.tinyblas == 0
    # the activation quantizers: the reference ones on the baseline build,
    # arch/x86/quants.c's on the AVX builds
    from strata_ref.cpu import act_quant
    assert s.isa.resolve("quantize_rows_q8") is act_quant.quantize_rows_q8_ref
    assert a2.isa.resolve("quantize_rows_q8") is a5.isa.resolve("quantize_rows_q8") \
        is act_quant.quantize_rows_q8_x86
