"""Kernel selection for native dequant (strata_ref.native.dequant.policy), on the CPU.

Every rule of ../shared/spec/kernels.md §4/§12 at compute capabilities 6.0,
6.1, 7.0, 7.5, 8.6 and 9.0: Q8_0 wide whenever its guard holds; wide
Q4_K/Q5_K/Q6_K/IQ4_XS by default on 6.1 only; STRATA_DEQUANT_WIDE=0/1 forces
them off/on; an invalid value warns once and keeps the default; guards send a
call to the generic kernel; unserveable calls select no kernel.
"""
import warnings

import pytest

from strata_ref.native.dequant import policy as dispatch
from strata_ref.native.dequant.policy import select
from strata_ref.types import GGMLType as T

CCS = (60, 61, 70, 75, 86, 90)
K_WIDE = (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)
A = 1 << 20           # an address aligned to everything


def sel(cc, t, rows=4, cols=512, ld=None, bp=A, op=A, dt="f16", env=None):
    return select(cc, t, rows, cols, cols if ld is None else ld, bp, op, dt, env or {})


@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_q8_0_wide_whenever_guard_holds(cc, dt):
    for env in ({}, {"STRATA_DEQUANT_WIDE": "0"}, {"STRATA_DEQUANT_WIDE": "1"}):
        assert sel(cc, T.Q8_0, dt=dt, env=env).kernel == "wide"
    assert sel(cc, T.Q8_0, ld=512 + 64, dt=dt).kernel == "generic"     # ld != cols
    assert sel(cc, T.Q8_0, bp=A + 1, dt=dt).kernel == "generic"        # blocks odd
    assert sel(cc, T.Q8_0, bp=A + 2, dt=dt).kernel == "wide"           # 2-byte aligned is enough
    assert sel(cc, T.Q8_0, op=A + 8, dt=dt).kernel == "generic"        # out not 16-aligned


@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("t", K_WIDE)
def test_k_wide_default_only_on_61(cc, t):
    s = sel(cc, t)
    assert s.kernel == ("wide" if cc == 61 else "generic"), s
    assert s.warning is None


@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("t", K_WIDE)
def test_env_forces_wide_off_and_on(cc, t):
    assert sel(cc, t, env={"STRATA_DEQUANT_WIDE": "0"}).kernel == "generic"
    assert sel(cc, t, env={"STRATA_DEQUANT_WIDE": "1"}).kernel == "wide"
    # padded ld is fine for these kernels (ld % 8 == 0)
    assert sel(cc, t, ld=512 + 64, env={"STRATA_DEQUANT_WIDE": "1"}).kernel == "wide"


@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("t", K_WIDE)
def test_k_wide_guards_fall_back_to_generic(cc, t):
    on = {"STRATA_DEQUANT_WIDE": "1"}
    align = dispatch.WIDE_BLOCKS_ALIGN[t]
    assert sel(cc, t, ld=512 + 4, env=on).kernel == "generic"          # ld % 8 != 0
    assert sel(cc, t, op=A + 4, env=on).kernel == "generic"            # out misaligned
    assert sel(cc, t, bp=A + 1, env=on).kernel == "generic"            # blocks odd
    assert sel(cc, t, bp=A + align, env=on).kernel == "wide"
    if align > 2:
        assert sel(cc, t, bp=A + 2, env=on).kernel == "generic"


def test_block_alignment_table():
    # Q4_K/Q5_K/IQ4_XS read qs with 8-byte loads; Q6_K (210-byte blocks) and
    # Q8_0 (34-byte blocks) only with u16 loads.
    assert dispatch.WIDE_BLOCKS_ALIGN == {T.Q8_0: 2, T.Q4_K: 8, T.Q5_K: 8, T.Q6_K: 2, T.IQ4_XS: 8}


@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("value", ["yes", "2", "true", " 1", "on", "01"])
def test_invalid_env_warns_and_keeps_default(cc, value):
    for t in K_WIDE:
        s = sel(cc, t, env={"STRATA_DEQUANT_WIDE": value})
        assert s.kernel == ("wide" if cc == 61 else "generic")
        assert s.warning is not None and repr(value) in s.warning
    assert sel(cc, T.Q8_0, env={"STRATA_DEQUANT_WIDE": value}).kernel == "wide"


@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("value", ["", "  "])
def test_empty_env_is_unset(cc, value):
    # empty counts as unset, as for every strata-ref variable: no warning
    for t in K_WIDE + (T.Q8_0,):
        assert sel(cc, t, env={"STRATA_DEQUANT_WIDE": value}) == sel(cc, t, env={})


def test_invalid_env_warning_printed_once():
    s = sel(90, T.Q4_K, env={"STRATA_DEQUANT_WIDE": "maybe-once"})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(5):
            dispatch.warn_once(s)
            dispatch.warn_once(sel(61, T.Q6_K, env={"STRATA_DEQUANT_WIDE": "maybe-once"}))
    assert len(w) == 1 and "maybe-once" in str(w[0].message)
    assert issubclass(w[0].category, RuntimeWarning)


@pytest.mark.parametrize("cc", CCS)
def test_types_without_wide_kernel_take_generic(cc):
    on = {"STRATA_DEQUANT_WIDE": "1"}
    for t in sorted(dispatch.GENERIC_TYPES - set(dispatch.WIDE_BLOCKS_ALIGN)):
        cols = 1024
        s = sel(cc, t, cols=cols, env=on)
        assert s.kernel == "generic", (t, s)


@pytest.mark.parametrize("cc", CCS)
def test_unserveable_calls_select_nothing(cc):
    assert sel(cc, T.Q4_K, cols=100).kernel is None          # cols % 256
    assert sel(cc, T.Q4_0, cols=48).kernel is None           # cols % 32
    assert sel(cc, T.Q4_K, rows=0).kernel is None
    assert sel(cc, T.Q4_K, cols=512, ld=256).kernel is None  # ld < cols
    assert sel(cc, T.Q8_0, bp=0).kernel is None              # null pointer
    assert sel(cc, T.Q8_0, op=0).kernel is None
    assert sel(cc, T.I32).kernel is None                     # plain integers: no kernel
    assert sel(cc, 4).kernel is None                         # removed type id
    assert sel(cc, 99).kernel is None                        # unknown id
    assert sel(cc, T.F16, cols=37).kernel == "generic"       # QK = 1: any cols


def test_argument_errors():
    with pytest.raises(ValueError, match="out_dtype"):
        select(90, T.Q8_0, 1, 32, 32, A, A, "f64", {})
    with pytest.raises(TypeError, match="rows"):
        select(90, T.Q8_0, 1.5, 32, 32, A, A, "f16", {})
    with pytest.raises(TypeError, match="cc"):
        select(True, T.Q8_0, 1, 32, 32, A, A, "f16", {})


def test_env_parse():
    assert dispatch.parse_wide_env(None) == (None, None)
    assert dispatch.parse_wide_env("0") == (False, None)
    assert dispatch.parse_wide_env("1") == (True, None)
    over, warn = dispatch.parse_wide_env("yes")
    assert over is None and "STRATA_DEQUANT_WIDE" in warn


def test_generic_types_match_the_cuda_source():
    # The X-macro list of native/strata_blocks.h (generated) is the kernels' own list.
    import re

    from strata_ref.native.build import source_dir
    text = (source_dir() / "strata_blocks.h").read_text()
    macro = text.split("#define STRATA_GENERIC_TYPES(X)", 1)[1].split("\n\n", 1)[0]
    ids = {int(i) for i in re.findall(r"X\((\d+),", macro)}
    assert ids == {int(t) for t in dispatch.GENERIC_TYPES}
    wide = (source_dir() / "dequant_wide.cu").read_text()
    body = wide.split("int wide_blocks_align(int type)", 1)[1].split("}", 2)[0]
    found = {getattr(T, n): int(a) for n, a in re.findall(r"case T_(\w+): return (\d+);", body)}
    assert found == dispatch.WIDE_BLOCKS_ALIGN
