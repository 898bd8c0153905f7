"""`strata_ref.cpu.libm`: glibc 2.36's `tanhf` / `expm1f` as the x86-64 and
the aarch64 builds of llama.cpp call them.

Checked against hand-derived values of the branches, against the host's
own `tanhf` where the host runs glibc 2.36 (the x86 builds' C library;
another glibc computes another `tanhf`: 2.41 made it correctly rounded),
and against ggml's `tanh` and `gelu` ops of each arm64 build run under
qemu (`tests/data/<arm profile>/ggml_unary.npz`, `tools/arm_ref.py data
PROFILE --only unary`), which include values where the contracted
`expm1f` of aarch64 glibc gives other bits than the x86 one.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

from infer_helpers import arm_profile_files
from strata_ref.cpu import PROFILES, ops
from strata_ref.cpu.libm import expm1f, tanhf, tanhf_array
from strata_ref.numerics import f32_to_f16_bits

F32 = np.float32


def _bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("fused", [False, True])
def test_branches_by_hand(fused):
    # |x| >= 22: 1 - 1e-30 rounds to 1; inf: 1/x + 1; zero keeps its sign
    assert tanhf(F32(22.0), fused) == F32(1.0) and tanhf(F32(-30.0), fused) == F32(-1.0)
    assert tanhf(F32(np.inf), fused) == F32(1.0) and tanhf(F32(-np.inf), fused) == F32(-1.0)
    assert _bits(tanhf(F32(-0.0), fused)) == _bits(F32(-0.0))
    assert np.isnan(tanhf(F32(np.nan), fused))
    # |x| < 2^-55: x * (1 + x), which is x
    tiny = F32(2.0 ** -60)
    assert tanhf(tiny, fused) == tiny
    # expm1f: below -27 ln 2 it is -1; below 2^-25 it returns x; above
    # 88.72 overflow; tanh(1) from expm1f(2): 1 - 2 / (e^2 + 1)
    assert expm1f(F32(-20.0), fused) == F32(-1.0)
    assert expm1f(F32(2.0 ** -26), fused) == F32(2.0 ** -26)
    assert expm1f(F32(89.0), fused) == F32(np.inf)
    # the C libraries' own bits (x86-64 glibc 2.36 natively, aarch64 glibc
    # 2.36 under qemu-aarch64-static): tanh(1), tanh(0.5) alike in both;
    # tanh(0x3df8f521) one ulp apart (the contracted expm1f)
    assert _bits(tanhf(F32(1.0), fused)) == 0x3F42F7D6
    assert _bits(tanhf(F32(0.5), fused)) == 0x3EEC9A9F
    x = np.array([0x3DF8F521], np.uint32).view(np.float32)[0]
    assert _bits(tanhf(x, fused)) == (0x3DF7BD0A if fused else 0x3DF7BD0B)
    # odd: tanh(-x) is -tanh(x) bit for bit (the code works on |x|)
    x = (np.random.default_rng(3).standard_normal(20_000) * 3).astype(np.float32)
    assert (_bits(tanhf_array(-x, fused)) == _bits(-tanhf_array(x, fused))).all()


def _host_glibc() -> str:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        return libc.gnu_get_libc_version().decode()
    except (OSError, AttributeError):
        return "none"


@pytest.mark.skipif(_host_glibc() != "2.36", reason="the x86 builds' glibc 2.36 is not the host's C library")
def test_unfused_is_the_x86_glibc_tanhf():
    # every float32 of several binades where the branches change (|x| in
    # [2^-10, 32)) and random values elsewhere, against the host's tanhf
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.tanhf.restype = ctypes.c_float
    libm.tanhf.argtypes = [ctypes.c_float]
    rng = np.random.default_rng(9)
    x = np.concatenate([np.arange(0x3A800000, 0x42000000, 97, dtype=np.uint32).view(np.float32),
                        rng.standard_normal(20_000).astype(np.float32) * 8])
    x = np.concatenate([x, -x])
    host = np.fromiter((libm.tanhf(float(v)) for v in x), np.float32, x.size)
    got = tanhf_array(x, False)
    assert (_bits(got) == _bits(host)).all()
    # and the contracted form differs somewhere among them (it is another
    # function, not a relabelling)
    assert (_bits(tanhf_array(x, True)) != _bits(host)).any()


def _unary_cases():
    return [p for p in arm_profile_files("ggml_unary.npz")]


def test_every_arm_profile_has_unary_data():
    assert len(_unary_cases()) == 4


@pytest.mark.parametrize("profile, path", _unary_cases())
def test_tanh_and_gelu_are_the_arm_builds_bits(profile, path):
    ref = np.load(path)
    prof = PROFILES[profile]
    assert prof.isa.resolve("LIBM_FMA")
    got = tanhf_array(ref["tanh_x"], prof.isa.resolve("LIBM_FMA"))
    assert (_bits(got) == _bits(ref["tanh"])).all()
    # the searched values are ones where x86's tanhf gives other bits
    assert (_bits(tanhf_array(ref["tanh_x"], False)) != _bits(ref["tanh"])).sum() >= 256
    # ggml_gelu: the F16 table at fp16(x), x every finite F16 in (-10, 10)
    tab = ops.gelu_table(prof)[f32_to_f16_bits(ref["gelu_x"])]
    assert (_bits(tab) == _bits(ref["gelu"])).all()


def test_arguments_are_checked_and_shapes_kept():
    prof = PROFILES["armv8.0"]
    # 0-d and n-d shapes come back as they went in
    assert tanhf_array(np.float32(0.5), False).shape == ()
    assert ops.softcap(np.float32(3.0), 30.0, prof).shape == ()
    assert ops.softcap(np.zeros((2, 3), np.float32), 30.0, "armv8.0").shape == (2, 3)
    with pytest.raises(TypeError, match="fused must be a bool"):
        tanhf_array([0.5], "no")
    with pytest.raises(TypeError, match="profile must be a CPU profile or its name"):
        ops.softcap(np.ones(3, np.float32), 30.0, None)
    with pytest.raises(ValueError, match="finite and non-zero"):
        ops.softcap(np.ones(3, np.float32), 0.0, prof)
    # the GELU table handed out is the caller's own: changing it changes
    # no later table
    g = ops.gelu_table("armv8.0")
    keep = g.copy()
    g[:] = 0
    assert (_bits(ops.gelu_table(prof)) == _bits(keep)).all()
