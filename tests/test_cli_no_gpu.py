"""`strata-ref parity …`, `strata-ref bench …` and `hash --device cuda` without
a GPU: one line on stderr, `strata-ref: error: TOOL: native path unavailable:
REASON` as every other error of the command, stdout stays empty, the exit
status is 2."""
import sys

import pytest

from strata_ref.cli import main
from strata_ref.native import loader
from strata_ref.native.mmvq import parity as mmvq_parity


@pytest.fixture
def no_native(monkeypatch):
    def unavailable(device=None):
        raise loader.NativeUnavailable("no CUDA driver (test)")
    monkeypatch.setattr(loader, "load", unavailable)            # parity dequant
    monkeypatch.setattr(mmvq_parity, "load_mmvq", unavailable)  # mmvq / experts
    monkeypatch.setitem(sys.modules, "cupy", None)          # gemm: import fails


E = "strata-ref: error: "


@pytest.mark.parametrize("argv, line", [
    (["parity", "dequant", "--quick"], "parity dequant: native path unavailable: no CUDA driver (test)"),
    (["parity", "mmvq", "--quick"], "parity mmvq: native path unavailable: no CUDA driver (test)"),
    (["parity", "experts", "--quick"], "parity experts: native path unavailable: no CUDA driver (test)"),
    (["bench", "mmvq"], "bench mmvq: native path unavailable: no CUDA driver (test)"),
    (["bench", "experts"], "bench experts: native path unavailable: no CUDA driver (test)"),
    (["hash", "--device", "cuda"], "hash --device cuda: native path unavailable: no CUDA driver (test)"),
])
def test_unavailable_line_on_stderr_status_2(no_native, capsys, argv, line):
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.splitlines() == [E + line]


def test_gemm_parity_without_cupy(no_native, capsys):
    assert main(["parity", "gemm", "--quick"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    err = cap.err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        E + "parity gemm: native path unavailable: needs CuPy (cupy-cuda12x / cupy-cuda13x): ")


def test_hash_on_device_says_so_before_fetching_the_model(no_native, monkeypatch, capsys):
    # the default model is not fetched (93 MB) only to learn there is no GPU
    from strata_ref import models

    def no_fetch(name):
        raise AssertionError(f"resolve({name!r}) was called")
    monkeypatch.setattr(models, "resolve", no_fetch)
    assert main(["hash", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.startswith(E + "hash --device cuda: native path unavailable: ")


@pytest.mark.parametrize("argv, tool", [(["parity", "mmvq", "--quick"], "parity mmvq"),
                                        (["bench", "mmvq"], "bench mmvq"),
                                        (["hash", "--device", "cuda"], "hash --device cuda")])
def test_failed_build_is_one_line(monkeypatch, capsys, argv, tool):
    # nvcc's output after the first line of the reason: joined into the one line
    def failed(device=None):
        raise loader.NativeUnavailable("nvcc failed (1): nvcc -c api.cu\n\napi.cu(3): error: "
                                       "bad\n1 error detected\n")
    monkeypatch.setattr(loader, "load", failed)
    monkeypatch.setattr(mmvq_parity, "load_mmvq", failed)
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        E + f"{tool}: native path unavailable: nvcc failed (1): nvcc -c api.cu | api.cu(3): error: "
        "bad | 1 error detected"]


def test_missing_sources_with_a_prebuilt_library_are_unavailable(monkeypatch, capsys, tmp_path):
    # STRATA_MMVQ_LIB skips the build, but the header is still read: without
    # the CUDA sources that was "strata-ref: error: BuildError: ..."
    from strata_ref.native import build
    from strata_ref.native.mmvq import wrapper as mmvq

    def no_sources():
        raise build.BuildError("CUDA sources not found (test)")
    monkeypatch.setattr(mmvq, "driver_compute_capability", lambda device: 90)
    monkeypatch.setattr(mmvq, "_LIB", {})
    monkeypatch.setattr(build, "source_dir", no_sources)
    monkeypatch.setenv("STRATA_MMVQ_LIB", str(tmp_path / "libstrata_mmvq.so"))
    assert main(["bench", "mmvq"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.splitlines() == [
        E + "bench mmvq: native path unavailable: CUDA sources not found (test)"]


def test_gemm_parity_without_native_library(monkeypatch, capsys):
    # CuPy present but the native library not: the other early exit.
    from strata_ref.native.gemm import parity as gemm_parity

    class NoNative:
        def __init__(self):
            raise loader.NativeUnavailable("no CUDA driver (test)")
    monkeypatch.setattr(gemm_parity, "NativeBackend", NoNative)
    assert gemm_parity.run_parity_gemm(quick=True, _cp=object()) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.splitlines() == [E + "parity gemm: native path unavailable: no CUDA driver (test)"]


@pytest.mark.parametrize("value", ["abc", "-1", "1.5"])
@pytest.mark.parametrize("argv, prefix", [
    (["parity", "dequant", "--quick"], E + "parity dequant: native path unavailable: "),
    (["parity", "mmvq", "--quick"], E + "parity mmvq: native path unavailable: "),
    (["hash", "--device", "cuda"], E + "hash --device cuda: native path unavailable: "),
])
def test_bad_device_variable_is_named(monkeypatch, capsys, value, argv, prefix):
    monkeypatch.setenv("STRATA_REF_DEVICE", value)
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.splitlines() == [
        f"{prefix}STRATA_REF_DEVICE={value!r} is not a CUDA device number (0, 1, ...)"]


@pytest.mark.parametrize("argv, line", [
    (["parity", "mmvq", "--full"], "strata-ref: error: --full applies to `parity gemm` only, not `parity mmvq`"),
    (["parity", "dequant", "--full"], "strata-ref: error: --full applies to `parity gemm` only, not `parity dequant`"),
    (["bench", "experts", "--emit-table"],
     "strata-ref: error: --emit-table applies to `bench mmvq` only, not `bench experts`"),
])
def test_flag_of_another_tool_is_refused(no_native, capsys, argv, line):
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [line]


def test_device_that_cannot_be_set_is_unavailable(monkeypatch, capsys, tmp_path):
    # A library that loads but whose cudaSetDevice fails (a stub with the
    # current ABI): the tools print their one "native path unavailable" line.
    import re
    import shutil
    import subprocess
    from strata_ref.native import build
    from strata_ref.native.mmvq import wrapper as mmvq
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    abi = re.search(r"#define SMV_ABI_VERSION (\d+)",
                    (build.source_dir() / "strata_mmvq.h").read_text()).group(1)
    (tmp_path / "stub.c").write_text(
        f"int smv_abi_version(void) {{ return {abi}; }}\n"
        "int smv_set_device(int d) { (void)d; return 6; }\n"
        "int smv_last_cuda_error(void) { return 100; }\n")
    lib = tmp_path / "libstub.so"
    subprocess.run([cc, "-shared", "-fPIC", str(tmp_path / "stub.c"), "-o", str(lib)], check=True)
    monkeypatch.setattr(mmvq, "driver_compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(mmvq, "_LIB", {})
    monkeypatch.setenv("STRATA_MMVQ_LIB", str(lib))
    assert main(["bench", "mmvq"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.splitlines() == [E + "bench mmvq: native path unavailable: cudaSetDevice(0) "
                                    "failed: CUDA error 100"]
