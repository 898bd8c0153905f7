"""GEMM route policy (kernels.md §12) and the argument checks of the native
GEMM wrappers, on the CPU: no GPU is touched (every refusal here happens
before the library is loaded)."""
import warnings

import numpy as np
import pytest

from strata_ref.native.gemm import wrapper as NG
from strata_ref.native import build
from strata_ref.native.gemm import policy as GP

ENV = GP.ENV_DENSE_F32
PASCAL = (60, 61, 62)
OTHERS = (50, 52, 70, 75, 80, 86, 89, 90, 100, 120)


@pytest.mark.parametrize("cc", PASCAL + OTHERS)
def test_default_is_the_fp16_route_on_every_card(cc):
    for env in (None, {}, {ENV: "0"}):
        sel = GP.select_route(cc, env)
        assert (sel.route, sel.notice) == ("f16", None)


@pytest.mark.parametrize("cc", PASCAL)
def test_opt_in_sends_6x_to_the_fp32_route(cc):
    sel = GP.select_route(cc, {ENV: "1"})
    assert sel.route == "f32" and sel.notice is None
    assert str(cc) in sel.reason


@pytest.mark.parametrize("cc", OTHERS)
def test_opt_in_is_ignored_with_a_note_elsewhere(cc):
    sel = GP.select_route(cc, {ENV: "1"})
    assert sel.route == "f16"
    assert sel.notice.startswith("note:") and f"{cc // 10}.{cc % 10}" in sel.notice


@pytest.mark.parametrize("value", ["yes", "true", "2", " 1", "1 ", "on", "01"])
@pytest.mark.parametrize("cc", (61, 90))
def test_invalid_values_warn_and_keep_the_default(value, cc):
    sel = GP.select_route(cc, {ENV: value})
    assert sel.route == "f16"
    assert repr(value) in sel.notice and "not 0 or 1" in sel.notice


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("cc", (61, 90))
def test_empty_value_is_unset(value, cc):
    # empty counts as unset, as for every strata-ref variable: no notice
    assert GP.select_route(cc, {ENV: value}) == GP.select_route(cc, {})


@pytest.mark.parametrize("cc", PASCAL + OTHERS)
@pytest.mark.parametrize("route", ["f16", "f32"])
def test_explicit_route_wins_on_any_card_and_any_env(cc, route):
    for env in (None, {ENV: "1"}, {ENV: "0"}, {ENV: "bogus"}):
        sel = GP.select_route(cc, env, route)
        assert (sel.route, sel.notice) == (route, None)
    assert GP.select_route(cc, {ENV: "1"}, "auto") == GP.select_route(cc, {ENV: "1"})


def test_bad_route_and_cc_are_errors():
    with pytest.raises(ValueError, match="route must be one of"):
        GP.select_route(61, None, "bf16")
    with pytest.raises(TypeError, match="cc must be an integer"):
        GP.select_route(6.1, None)
    with pytest.raises(TypeError, match="cc must be an integer"):
        GP.select_route(True, None)


def test_parse_env():
    assert GP.parse_dense_f32_env(None) == (None, None)
    assert GP.parse_dense_f32_env("0") == (False, None)
    assert GP.parse_dense_f32_env("1") == (True, None)
    on, warn = GP.parse_dense_f32_env("y")
    assert on is None and ENV in warn


def test_notice_is_emitted_once_per_text():
    sel = GP.select_route(90, {ENV: "never-seen-value-7"})
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        GP.notice_once(sel)
        GP.notice_once(sel)
        GP.notice_once(GP.select_route(90, None))        # no notice: nothing emitted
    assert [str(w.message) for w in rec] == [sel.notice]


class _Fake:
    """A stand-in device array: only __cuda_array_interface__ (never dereferenced)."""

    def __init__(self, shape, typestr, ptr=0x10000, strides=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, False), "version": 3,
                                         "strides": strides}


def _dense(**kw):
    args = dict(w_f16=_Fake((8 * 64,), "<f2"), n=8, k=64, x=_Fake((3, 64), "<f4"),
                y=_Fake((3, 8), "<f4"), route="f16")
    args.update(kw)
    return NG.gemm_dense_device(**args)


@pytest.mark.parametrize("kw, err, match", [
    ({"route": "bf16"}, ValueError, "route must be one of"),
    ({"beta": 2}, ValueError, "beta must be 0 or 1"),
    ({"x": _Fake((3, 64), "<f8")}, TypeError, "x must be float32 or float16"),
    ({"x": np.zeros((3, 64), np.float32)}, TypeError, "__cuda_array_interface__"),
    ({"y": _Fake((3, 8), "<f2")}, TypeError, "y must be float32"),
    ({"x": _Fake((3, 32), "<f4")}, ValueError, r"shape \(T, K=64\)"),
    ({"x": _Fake((192,), "<f4")}, ValueError, r"shape \(T, K=64\)"),
    ({"x": _Fake((192,), "<f4"), "t": 4}, ValueError, "need 256"),
    ({"y": _Fake((3, 8), "<f4"), "ldy": 7}, ValueError, "ldy=7 is smaller than N=8"),
    ({"y": _Fake((20,), "<f4")}, ValueError, "need 24"),
    ({"y": _Fake((3, 10), "<f4"), "ldy": 12}, ValueError, "need 32"),
    ({"w_f16": _Fake((100,), "<f2")}, ValueError, "N·K=512"),
    ({"n": 0}, ValueError, "N and K must be positive"),
    ({"x": _Fake((3, 64), "<f4", strides=(4, 12))}, ValueError, "C-contiguous"),
])
def test_dense_argument_errors(kw, err, match):
    with pytest.raises(err, match=match):
        _dense(**kw)


def _q8_0_blocks(n, k):
    return _Fake((n * k // 32 * 34,), "|u1")


@pytest.mark.parametrize("kw, err, match", [
    ({"scratch_elems": 63}, ValueError, "holds no row of K=64"),
    ({"k": 48, "x": _Fake((3, 48), "<f4")}, ValueError, "not a multiple of the Q8_0 block size"),
    ({"wtype": "Q9_9"}, ValueError, "W"),
    ({"w_blocks": _Fake((100,), "|u1")}, ValueError, "need 272"),
    ({"w_blocks": _Fake((272,), "<f2")}, TypeError, "uint8"),
])
def test_quant_argument_errors(kw, err, match):
    args = dict(wtype="Q8_0", w_blocks=_q8_0_blocks(4, 64), n=4, k=64,
                x=_Fake((3, 64), "<f4"), y=_Fake((3, 4), "<f4"))
    args.update(kw)
    with pytest.raises(err, match=match):
        NG.gemm_device(**args)


def test_header_cdef_is_plain_c_and_declares_the_abi():
    text = build.cdef_text("strata_gemm.h")
    assert "#" not in text
    for name in ("strata_gemm_create", "strata_gemm_destroy", "strata_gemm_dense",
                 "strata_gemm_quant", "strata_gemm_cublas_version", "strata_gemm_last_error",
                 "strata_gemm_workspace_bytes"):
        assert name + "(" in text
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef(text)                       # parses as the loader will parse it
    assert ffi.sizeof("long long") == 8


def test_route_codes_match_the_header():
    text = build.cdef_text("strata_gemm.h")
    assert "STRATA_GEMM_F16 = 0" in text and "STRATA_GEMM_F32 = 1" in text
    assert NG._ROUTE_CODE == {"f16": 0, "f32": 1}
    assert "STRATA_GEMM_X_F32 = 0" in text and "STRATA_GEMM_X_F16 = 1" in text
    assert NG._X_CODE == {"f4": 0, "f2": 1}


_CUBLAS_DECLS = """// declarations only, for a compile check where the toolkit lacks cuBLAS
#pragma once
#include <cuda_runtime.h>
#include <library_types.h>
typedef struct cublasContext *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
extern "C" {
cublasStatus_t cublasCreate(cublasHandle_t *);
cublasStatus_t cublasDestroy(cublasHandle_t);
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t);
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t);
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t);
cublasStatus_t cublasGetVersion(cublasHandle_t, int *);
const char *cublasGetStatusString(cublasStatus_t);
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
    const void *, const void *, cudaDataType, int, const void *, cudaDataType, int,
    const void *, void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
    const float *, const float *, int, const float *, int, const float *, float *, int);
}
"""


def test_gemm_source_compiles(tmp_path):
    """nvcc compiles gemm.cu for sm_90; where the toolkit has no cuBLAS
    headers, against a declarations-only cublas_v2.h (the real link happens
    on the GPU machine)."""
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    inc = None
    if not (build.cuda_lib_dir(nvcc).parent / "include" / "cublas_v2.h").is_file():
        inc = tmp_path / "inc"
        inc.mkdir()
        (inc / "cublas_v2.h").write_text(_CUBLAS_DECLS)
    obj, = build.compile_objects(build.GEMM, 90, tmp_path / "o", nvcc, include=inc)
    assert obj.stat().st_size > 0


# -- the Python -> C plumbing against a stand-in library ---------------------
# Each entry point of strata_gemm.h becomes a cffi callback with the exact
# signature of the header's cdef block, so a call with the wrong number or
# kind of arguments fails here as it would against the real library.

class _StandInLib:
    def __init__(self, ffi, text, status=0):
        import re
        self.calls, self.status = [], status
        self._keep = []
        impl = {
            "strata_gemm_dense": self._record("dense"),
            "strata_gemm_quant": self._record("quant"),
            "strata_gemm_last_error": lambda: 42,
            "strata_gemm_error_string": self._string,
            "strata_gemm_cublas_version": self._version,
        }
        for name, fn in impl.items():
            m = re.search(r"\b(int|const char \*|long long)\s*" + name + r"\((.*?)\);", text, re.S)
            sig = m.group(1) + "(" + " ".join(m.group(2).split()) + ")"
            cb = ffi.callback(sig, fn)
            self._keep.append(cb)
            setattr(self, name, cb)
        self.ffi = ffi

    def _record(self, what):
        def fn(*args):
            self.calls.append((what, args))
            return self.status
        return fn

    def _string(self, status, err):
        s = self.ffi.new("char[]", f"detail {status}/{err}".encode())
        self._keep.append(s)
        return s

    def _version(self, ctx, v):
        v[0] = 130100
        return 0


@pytest.fixture
def standin(monkeypatch):
    cffi = pytest.importorskip("cffi")
    import types
    ffi = cffi.FFI()
    text = build.cdef_text("strata_gemm.h")
    ffi.cdef(text)
    lib = _StandInLib(ffi, text)
    state = types.SimpleNamespace(cc=90, lib=lib, ffi=ffi)
    dq = types.SimpleNamespace(lib=types.SimpleNamespace(strata_synchronize=lambda: 0))

    def fake_load(device=None):
        return NG.GemmNative(ffi, lib, ffi.cast("strata_gemm_ctx *", 0x5000), dq,
                                     state.cc, "stand-in")
    monkeypatch.setattr(NG, "load_gemm", fake_load)
    return state


def _ptr(ffi, p):
    return int(ffi.cast("uintptr_t", p))


def test_dense_passes_pointers_shapes_and_codes(standin):
    ffi = standin.ffi
    w = _Fake((8 * 64,), "<f2", ptr=0x1000)
    x = _Fake((3, 64), "<f2", ptr=0x2000)
    y = _Fake((3, 10), "<f4", ptr=0x3000)
    stream = type("S", (), {"ptr": 0x77})()
    NG.gemm_dense_device(w, 8, 64, x, y, route="f32", beta=1, stream=stream)
    (what, a), = standin.lib.calls
    assert what == "dense"
    assert _ptr(ffi, a[0]) == 0x5000 and a[1] == 1                      # ctx, route f32
    assert [_ptr(ffi, a[2]), a[3], a[4]] == [0x1000, 8, 64]               # W, N, K
    assert [_ptr(ffi, a[5]), a[6], a[7]] == [0x2000, 1, 3]                # X, f16, T
    assert [_ptr(ffi, a[8]), a[9], a[10], _ptr(ffi, a[11])] == [0x3000, 10, 1, 0x77]


@pytest.mark.parametrize("cc, env, route, code", [
    (61, {}, None, 0), (61, {"STRATA_DENSE_F32": "1"}, None, 1),
    (90, {"STRATA_DENSE_F32": "1"}, None, 0), (90, {}, "f32", 1), (61, {"STRATA_DENSE_F32": "1"}, "f16", 0)])
def test_quant_route_kernel_and_slices(standin, monkeypatch, cc, env, route, code):
    ffi = standin.ffi
    standin.cc = cc
    monkeypatch.delenv("STRATA_DENSE_F32", raising=False)
    for key, v in env.items():
        monkeypatch.setenv(key, v)
    n, k = 10, 64
    w = _Fake((n * 2 * 34,), "|u1", ptr=0x10000)
    x = _Fake((5, k), "<f4", ptr=0x20000)
    y = _Fake((5, n), "<f4", ptr=0x30000)
    scratch = _Fake((4 * k,), "<f2", ptr=0x40000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = NG.gemm_device("Q8_0", w, n, k, x, y, scratch=scratch, route=route)
    assert (run.route, run.kernel, run.rows_per_slice, run.slices) == (
        ("f32" if code else "f16"), "wide", 4, 3)
    (what, a), = standin.lib.calls
    assert what == "quant" and a[1] == code and a[2] == 8                # route, GGML Q8_0 id
    assert [_ptr(ffi, a[3]), a[4], a[5], _ptr(ffi, a[6]), a[7], a[8]] == [0x10000, n, k, 0x20000, 0, 5]
    assert [_ptr(ffi, a[9]), a[10], a[11], _ptr(ffi, a[12]), a[13], a[14]] == [
        0x30000, n, 0, 0x40000, 4 * k, 1]


def test_quant_kernel_falls_back_to_generic_when_the_wide_guard_fails(standin):
    n, k = 10, 64
    args = dict(wtype="Q8_0", w_blocks=_Fake((n * 2 * 34,), "|u1", ptr=0x10000), n=n, k=k,
                x=_Fake((5, k), "<f4"), y=_Fake((5, n), "<f4"))
    run = NG.gemm_device(**args, scratch=_Fake((n * k,), "<f2", ptr=0x40008))
    assert run.kernel == "generic" and standin.lib.calls[-1][1][14] == 0
    run = NG.gemm_device(**args, scratch=_Fake((n * k,), "<f2", ptr=0x40000), kernel="generic")
    assert run.kernel == "generic" and (run.rows_per_slice, run.slices) == (10, 1)


@pytest.mark.parametrize("status, match", [(7, "cuBLAS error .*detail 7/42"),
                                           (6, "CUDA error"), (8, "refused a slice")])
def test_failures_raise_native_error(standin, status, match):
    from strata_ref.native.dequant.wrapper import NativeError
    standin.lib.status = status
    n, k = 4, 64
    with pytest.raises(NativeError, match=match):
        NG.gemm_device("Q8_0", _Fake((n * 2 * 34,), "|u1"), n, k, _Fake((2, k), "<f4"),
                       _Fake((2, n), "<f4"), scratch=_Fake((n * k,), "<f2"))


def test_cublas_version_through_the_abi(standin):
    assert NG.cublas_version() == 130100
