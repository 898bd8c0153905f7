"""Native build pieces that need no GPU: the C header as cffi reads it, the
generated I-quant table header, nvcc compiling every CUDA source (when nvcc is
installed), and the message when no GPU is present."""
import logging
import re
import subprocess

import numpy as np
import pytest

from strata_ref.formats import iq_tables
from strata_ref.formats.fp4 import KVALUES_MXFP4
from strata_ref.native import build, loader


def test_header_cdef_parses_and_constants():
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef(loader.cdef_text())
    lib = ffi.dlopen(None)   # constants need no library symbols
    assert (lib.STRATA_OUT_F32, lib.STRATA_OUT_F16, lib.STRATA_OUT_BF16) == (0, 1, 2)
    assert (lib.STRATA_KERNEL_GENERIC, lib.STRATA_KERNEL_WIDE) == (0, 1)
    assert lib.STRATA_E_GUARD == 4 and lib.STRATA_E_CUDA == 6
    for fn in ("strata_dequant", "strata_f32_to_bf16", "strata_f32_to_f16", "strata_malloc"):
        assert fn in loader.cdef_text()


def _parse_array(text: str, name: str) -> list[int]:
    m = re.search(rf"{name}\[(\d+)\] = \{{(.*?)\}};", text, re.S)
    assert m, name
    vals = [int(v.rstrip("uUlL"), 0) for v in m.group(2).replace("\n", " ").split(",") if v.strip()]
    assert len(vals) == int(m.group(1))
    return vals


def test_generated_tables_equal_the_numpy_tables():
    text = build.iq_tables_header()
    pairs = {"tab_ksigns_iq2xs": iq_tables.KSIGNS_IQ2XS, "tab_iq2xxs_grid": iq_tables.IQ2XXS_GRID,
             "tab_iq2xs_grid": iq_tables.IQ2XS_GRID, "tab_iq2s_grid": iq_tables.IQ2S_GRID,
             "tab_iq3xxs_grid": iq_tables.IQ3XXS_GRID, "tab_iq3s_grid": iq_tables.IQ3S_GRID,
             "tab_iq1s_grid_gpu": iq_tables.IQ1S_GRID_GPU,
             "tab_kvalues_iq4nl": iq_tables.KVALUES_IQ4NL, "tab_kvalues_mxfp4": KVALUES_MXFP4}
    for name, arr in pairs.items():
        assert _parse_array(text, name) == [int(v) for v in np.asarray(arr)], name


def _nvcc_archs(nvcc: str) -> list[int]:
    out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True).stdout
    have = {int(a) for a in re.findall(r"compute_(\d+)", out)}
    # 6.1 and 7.0 are the portability targets (CUDA 12); CUDA 13 starts at 7.5.
    return [a for a in (61, 70) if a in have] or [min(have)]


def test_nvcc_compiles_every_source(tmp_path):
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    for arch in _nvcc_archs(nvcc):
        objs = build.compile_objects(build.DEQUANT, arch, tmp_path / f"sm{arch}", nvcc)
        assert all(o.stat().st_size > 0 for o in objs)


@pytest.mark.slow
def test_nvcc_compiles_the_mat_vec_library(tmp_path):
    # minutes on 2 cores (every kernel instantiation of mmvq.cu)
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    arch = _nvcc_archs(nvcc)[-1]
    objs = build.compile_objects(build.MMVQ, arch, tmp_path / f"sm{arch}", nvcc)
    assert all(o.stat().st_size > 0 for o in objs)


def test_flags_keep_ieee_arithmetic():
    flags = build.nvcc_flags(61)
    assert "--use_fast_math" not in flags and "-use_fast_math" not in flags
    assert "-ftz=false" in flags and "-prec-div=true" in flags
    assert "arch=compute_61,code=[sm_61,compute_61]" in flags


def test_without_gpu_the_reason_is_clear():
    import strata_ref.native as native
    try:
        loader.driver_compute_capability()
    except loader.NativeUnavailable:
        reason = native.unavailable_reason()
        assert reason and ("driver" in reason or "device" in reason or "cffi" in reason)
        assert native.available() is False
    else:
        pytest.skip("a CUDA GPU is present")
    # the NumPy path is unaffected
    from strata_ref import dequant_f32
    raw = np.zeros(34, np.uint8)
    raw[1] = 0x3C                     # d = 1.0
    raw[2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    assert dequant_f32("Q8_0", raw, 1, 32).tolist() == [list(range(32))]


def test_source_dir_holds_the_sources():
    d = build.source_dir()
    for lib in build.LIBRARIES:
        for f in lib.files():
            assert (d / f).is_file(), (lib.name, f)


def test_every_library_is_built_by_the_one_function(monkeypatch, tmp_path, capsys, caplog):
    # build() with a stand-in nvcc that writes its -o file: each library is
    # compiled (one object per source) and linked into the cache under its
    # own key, then found there without running nvcc again
    calls = []

    def fake_run(cmd, cwd):
        calls.append(cmd)
        out = cmd[cmd.index("-o") + 1]
        open(out, "wb").write(b"x")
    monkeypatch.setattr(build, "_run", fake_run)
    monkeypatch.setattr(build, "_nvcc_or_raise", lambda: "nvcc")
    monkeypatch.setattr(build, "_nvcc_version", lambda nvcc: "release 0.0")
    monkeypatch.setenv("STRATA_REF_CACHE", str(tmp_path))
    caplog.set_level("INFO", logger="strata_ref.native.build")
    # a command run earlier in this process shows the notes on stderr; the library alone does not
    monkeypatch.setattr(logging.getLogger("strata_ref"), "handlers", [])
    paths = set()
    for lib in build.LIBRARIES:
        n = len(calls)
        path = build.build(lib, 90)
        assert path.name == lib.name and path.is_file()
        assert path.parent.parent == tmp_path / "native" and path.parent.name.startswith(lib.stem + "-")
        assert len(calls) - n == len(lib.sources) + 1          # objects, then the link
        link = calls[-1]
        assert "-shared" in link and all(c in link for c in (lib.link("nvcc") if lib.link else []))
        assert build.build(lib, 90) == path and len(calls) - n == len(lib.sources) + 1   # cached
        paths.add(path)
    assert len(paths) == len(build.LIBRARIES)
    # each build (not the cache hits) is announced on the logger, not printed
    assert capsys.readouterr() == ("", "")
    assert [r.getMessage() for r in caplog.records if r.name == "strata_ref.native.build"] == [
        f"building {lib.name} for sm_90 with nvcc" for lib in build.LIBRARIES]


def test_open_library_names_what_failed(monkeypatch, tmp_path):
    # the one build-cdef-dlopen step of every native loader: a failed build,
    # a file dlopen refuses and a missing header each raise NativeUnavailable
    # naming the cause; a prebuilt path skips the build
    pytest.importorskip("cffi")

    def no_nvcc(lib, cc):
        raise build.BuildError("nvcc not found (test)")
    monkeypatch.setattr(build, "build", no_nvcc)
    with pytest.raises(loader.NativeUnavailable, match=r"^nvcc not found \(test\)$"):
        loader.open_library(build.MMVQ, 90, "strata_mmvq.h")
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(loader.NativeUnavailable, match=f"^cannot load {re.escape(str(junk))}: "):
        loader.open_library(build.MMVQ, 90, "strata_mmvq.h", junk)
    with pytest.raises(loader.NativeUnavailable, match="no_such_header.h"):
        loader.open_library(build.MMVQ, 90, "no_such_header.h", junk)
