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
    # a near miss is named
    with pytest.raises(ValueError, match=r"^--cpu 'v0.4.0-nativ' is not a CPU profile \(did you mean "
                                         r"v0.4.0-native\? profiles: scalar, "):
        cpu.select("v0.4.0-nativ")


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


# ---- the library ggml's loader takes from a prebuilt (ALL_VARIANTS) folder

SKX = HASWELL | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"}
ARM_M1 = {"fp", "asimd", "asimddp", "fphp", "asimdhp"}


def test_loader_scores_are_ggml_cpu_feats():
    from strata_ref.cpu import loader
    # ggml-cpu/arch/x86/cpu-feats.cpp on a CPU with every feature (the sums
    # docs/prebuilt.md lists), and 0 where one compiled-in feature is missing
    assert {v: loader.score(v) for v in loader.X86_VARIANTS} == {
        "x64": 1, "sse42": 5, "sandybridge": 21, "ivybridge": 23, "piledriver": 24, "haswell": 64,
        "skylakex": 192, "cannonlake": 448, "cascadelake": 1216, "icelake": 1472, "cooperlake": 1728,
        "zen4": 1984, "alderlake": 128, "sapphirerapids": 4032}
    assert loader.score("haswell", HASWELL - {"bmi2"}) == 0 and loader.score("x64", set()) == 1
    # AMX_TILE scores nothing and is not checked; AVX512 needs all five flags
    assert loader.score("sapphirerapids", ZEN4 | {"amx_int8"}) == 4032
    assert loader.score("skylakex", SKX - {"avx512dq"}) == 0
    # arch/arm/cpu-feats.cpp: FP16 vector arithmetic needs FPHP and ASIMDHP
    assert loader.score("armv8.2_2", ARM_M1) == 1 + 2 + 4
    assert loader.score("armv8.2_2", ARM_M1 - {"fphp"}) == 0
    assert loader.score("armv9.2_2") == 1 + 2 + 4 + 8 + 16 + 32 + 64
    with pytest.raises(ValueError, match="'zen5' is not a ggml CPU variant"):
        loader.score("zen5")


@pytest.mark.parametrize("flags, arch, variant, profile", [
    (ZEN4 | {"amx_tile", "amx_int8"}, "x86_64", "sapphirerapids", "v0.4.0-sapphirerapids"),
    (ZEN4, "x86_64", "zen4", "v0.4.0-zen4"),                       # Zen 4, Zen 5
    (SKX | {"avx512vbmi", "avx512_vnni"}, "x86_64", "icelake", "v0.4.0-skylakex"),
    (SKX | {"avx512_vnni"}, "x86_64", "cascadelake", "v0.4.0-skylakex"),
    (SKX, "x86_64", "skylakex", "v0.4.0-skylakex"),
    (HASWELL | {"avx_vnni"}, "x86_64", "alderlake", "v0.4.0-haswell"),
    (HASWELL, "x86_64", "haswell", "v0.4.0-haswell"),              # Zen 1-3 too
    ({"sse4_2", "avx", "f16c", "fma"}, "x86_64", "piledriver", "v0.4.0-piledriver"),
    ({"sse4_2", "avx"}, "x86_64", "sandybridge", "v0.4.0-sandybridge"),
    ({"sse4_2"}, "x86_64", "sse42", "v0.4.0-sse42"),
    (set(), "x86_64", "x64", "v0.4.0-x64"),
])
def test_v0_4_0_native_is_the_loaders_pick(flags, arch, variant, profile):
    from strata_ref.cpu import loader
    from strata_ref.cpu.profiles import V0_4_0
    assert loader.pick(flags, arch) == variant
    assert loader.loader_profile(V0_4_0, flags, arch) is PROFILES[profile]


def test_v0_4_0_native_selects_this_cpus_pick(monkeypatch):
    from strata_ref.cpu import loader
    monkeypatch.setattr(loader, "host_arch", lambda: "x86_64")
    monkeypatch.setattr(loader, "host_flags", lambda: frozenset(ZEN4))
    assert cpu.select("v0.4.0-native") is PROFILES["v0.4.0-zen4"]
    assert cpu.select(" V0.4.0-Native ") is PROFILES["v0.4.0-zen4"]
    monkeypatch.setenv(cpu.ENV, "v0.4.0-native")
    assert cpu.select(None) is PROFILES["v0.4.0-zen4"]
    # on arm64 no v0.4.0 profile reproduces what its loader takes
    monkeypatch.setattr(loader, "host_arch", lambda: "aarch64")
    monkeypatch.setattr(loader, "host_flags", lambda: frozenset(ARM_M1))
    with pytest.raises(ValueError, match=r"^STRATA_REF_CPU='v0.4.0-native': ggml's loader would take "
                                         r"the armv8.2_2 library of llama.cpp v0.4.0.*no profile"):
        cpu.select(None)


def test_the_shipped_loader_picks_as_ours():
    """The shipped libggml of node-llama-cpp 3.21.1 chose these libraries on
    the CPU recorded in the file (`python tools/prebuilt_ref.py loader`):
    from the shipped folder, then from folders without the best 1 .. 13,
    every ordering of scores that CPU can show. `loader.pick` must agree."""
    import json
    from pathlib import Path
    from strata_ref.cpu import loader
    d = json.loads((Path(__file__).parent / "data" / "v0.4.0-loader.json").read_text())
    assert len(d["cases"]) == len(loader.X86_VARIANTS)
    picked = []
    for c in d["cases"]:
        among = None if c["libraries"] == "all" else c["libraries"]
        assert loader.pick(d["cpu_flags"], "x86_64", among) == c["picked"], c
        picked.append(c["picked"])
    assert sorted(picked) == sorted(loader.X86_VARIANTS)     # each library won once
    with pytest.raises(ValueError, match="no library of skylakex runs"):
        loader.pick(HASWELL, "x86_64", ["skylakex"])


@pytest.mark.parametrize("flags, native, loader_variant, note", [
    ({"fp", "asimd"}, "armv8.0", "armv8.0_1", ""),                          # Pi 4
    ({"fp", "asimd", "asimddp"}, "armv8.2-dotprod", "armv8.2_1", ""),
    (ARM_M1, "armv8.2-fp16", "armv8.2_2", ""),                               # Pi 5, Graviton 2
    # Apple M2 under Linux: i8mm without SVE; the prebuilt loader's i8mm
    # variants all need SVE, so it takes armv8.2_2 there
    (ARM_M1 | {"i8mm"}, "armv8.6-i8mm", "armv8.2_2", ""),
    (ARM_M1 | {"i8mm", "sve"}, "armv8.6-i8mm", "armv8.6_1", "SVE"),         # Graviton 3
    (ARM_M1 | {"i8mm", "sve", "sve2"}, "armv8.6-i8mm", "armv8.6_2", "SVE/SVE2"),   # Graviton 4
])
def test_native_on_arm64(flags, native, loader_variant, note):
    from strata_ref.cpu import loader
    assert cpu.native(flags, "aarch64").name == native
    assert loader.pick(flags, "aarch64") == loader_variant
    n = cpu.native_note(flags, "aarch64")
    if note:
        assert n == (f"native = {native}: bit for bit llama.cpp's {native} build, not its native build "
                     f"({note} here: no profile reproduces it)")
    else:
        assert n == ""

