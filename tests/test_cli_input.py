"""The command line on careless and hostile input (issue 16): names from a
file are escaped when printed, the environment is checked before use, help
texts say what each argument is. No model is needed: files are made here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from strata_ref.cli import build_parser, main
from strata_ref.gguf import GGUFValueType as V, write_gguf
from strata_ref.hashing import hash_array
from strata_ref.types import GGMLType as T

FORGED = "x\nforged.weight  F32  32  0123456789abcdef"


@pytest.fixture
def forged(tmp_path):
    p = tmp_path / "forged.gguf"
    write_gguf(p, {"evil.\x1b[2Jkey\r": "v\x1b]0;title\x07", "plain": (V.UINT32, 7)},
               [(FORGED, T.F32, (32,), np.ones(32, np.float32)),
                ("back\\slash", T.F32, (32,), np.zeros(32, np.float32))])
    return p


def test_hash_table_escapes_tensor_names(forged, capsys):
    assert main(["hash", str(forged), "--out", "f32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # header, two tensors, chained: the forged newline adds no row
    assert len(lines) == 4
    h = f"{hash_array(np.ones(32, np.float32)):016x}"
    assert lines[1].split() == ["x\\x0aforged.weight", "F32", "32", "0123456789abcdef", "F32", "32", h]
    assert lines[2].split()[0] == "back\\\\slash"
    assert main(["hash", str(forged), "--out", "f32", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in doc["tensors"]] == [FORGED, "back\\slash"]


def test_info_escapes_keys_and_values(forged, capsys):
    assert main(["info", str(forged)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert "  evil.\\x1b[2Jkey\\x0d = 'v\\x1b]0;title\\x07'" in out.splitlines()
    assert "  plain = 7" in out.splitlines()


def test_info_escapes_string_values_as_names_are(tmp_path, capsys):
    # a newline as \x0a (not repr's \n) and bytes that are not UTF-8 as
    # \xNN (not \udcff), in plain values and in arrays
    p = tmp_path / "v.gguf"
    write_gguf(p, {"general.name": "ab\nQQ", "list": (V.ARRAY, ["x\ny", "QQ"], V.STRING)}, [])
    raw = p.read_bytes()
    p.write_bytes(raw.replace(b"QQ", b"\xff\xfe"))
    assert main(["info", str(p)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  general.name = 'ab\\x0a\\xff\\xfe'" in lines
    assert "  list = ['x\\x0ay', '\\xff\\xfe']" in lines


def test_info_cuts_a_huge_key(tmp_path, capsys):
    p = tmp_path / "k.gguf"
    write_gguf(p, {"k" * 100_000: (V.UINT8, 1)}, [])
    assert main(["info", str(p)]) == 0
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("  k")][0]
    assert line == "  " + "k" * 150 + "…" + "k" * 20 + " = 1"


def test_error_lines_stay_one_line(tmp_path, capsys):
    p = tmp_path / "e.gguf"
    write_gguf(p, {}, [("w", T.F32, (4,), np.zeros(4, np.float32))])
    assert main(["compare", str(p), "no\nsuch\x1b[1m", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err
    assert err.startswith("strata-ref: error: no tensor 'no\\nsuch\\x1b[1m'")


def test_hash_types_take_ids_and_names(forged, tmp_path, capsys):
    p = tmp_path / "q.gguf"
    write_gguf(p, {}, [("a", T.F32, (32,), np.ones(32, np.float32)),
                       ("b", T.Q8_0, (32,), np.zeros(34, np.uint8))])
    assert main(["hash", str(p), "--types", "8", "--json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)["tensors"]] == ["b"]
    assert main(["hash", str(p), "--types", "0,Q8_0", "--json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)["tensors"]] == ["a", "b"]
    assert main(["hash", str(p), "--types", "99"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: unknown ggml type id 99 (ggml ids are 0..42)"]
    assert main(["hash", str(p), "--types", ","]) == 2
    assert capsys.readouterr().err.splitlines() == ["strata-ref: error: --types ',' names no type"]
    assert main(["hash", str(p), "--types", ""]) == 2
    assert capsys.readouterr().err.splitlines() == ["strata-ref: error: --types '' names no type"]


@pytest.mark.parametrize("action", ["make", "check"])
def test_golden_empty_dir_is_refused(action, capsys):
    # `--dir "$D"` with D unset must not mean the repository's golden/
    assert main(["golden", action, "--dir", ""]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: --dir is empty; give a directory (or leave --dir out for the "
        "repository's golden/)"]


@pytest.mark.parametrize("name", ["", "  "])
def test_empty_model_name(name, capsys):
    assert main(["hash", name]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: the model name is empty: give a registry name "
        "(SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct, gemma-3-270m) or a path to a .gguf file"]


def test_cache_variable_pointing_at_a_file_is_named(tmp_path, monkeypatch, capsys):
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    for cache in (f, f / "sub"):
        monkeypatch.setenv("STRATA_REF_CACHE", str(cache))
        assert main(["models", "fetch", "smollm2"]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"strata-ref: error: the model cache {cache} (from $STRATA_REF_CACHE) is not "
            f"a writable directory: {cache}/models: a file, not a directory, is in the way; set "
            "STRATA_REF_CACHE to a directory you can write"]


def test_cache_that_cannot_be_created_is_named(monkeypatch, capsys):
    # /proc refuses new directories even to root
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    monkeypatch.setenv("STRATA_REF_CACHE", "/proc/strata-ref-nope")
    assert main(["models", "fetch", "smollm2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "the model cache /proc/strata-ref-nope (from $STRATA_REF_CACHE) is not " \
        "a writable directory" in err[0]


@pytest.mark.parametrize("value", ["0", "-1", "two", "2_0", " 2"])
def test_bad_numba_threads_is_one_line_exit_2(tmp_path, value):
    p = tmp_path / "w.gguf"
    write_gguf(p, {}, [("w", T.F32, (4,), np.zeros(4, np.float32))])
    env = {**os.environ, "NUMBA_NUM_THREADS": value}
    r = subprocess.run([sys.executable, "-m", "strata_ref.cli", "hash", str(p)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == [
        f"strata-ref: error: NUMBA_NUM_THREADS={value!r} is not a number of threads: give a "
        "whole number >= 1, or unset it for one thread per CPU"]


def test_numba_variable_numba_cannot_parse_is_one_line(tmp_path):
    # numba prints a RuntimeWarning with a traceback for it, and goes on
    p = tmp_path / "w.gguf"
    write_gguf(p, {}, [("w", T.F32, (4,), np.zeros(4, np.float32))])
    env = {**os.environ, "NUMBA_DISABLE_JIT": "abc"}
    r = subprocess.run([sys.executable, "-m", "strata_ref.cli", "hash", str(p)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == [
        "strata-ref: error: NUMBA_DISABLE_JIT='abc' is not a value numba can read; fix or unset it"]


def _hash_with_env(tmp_path, name, value) -> list[str]:
    # `strata-ref hash` of a tiny file in a child process with one variable
    # set; it must exit 2 with nothing on stdout: returns stderr's lines
    p = tmp_path / "w.gguf"
    write_gguf(p, {}, [("w", T.F32, (4,), np.zeros(4, np.float32))])
    r = subprocess.run([sys.executable, "-m", "strata_ref.cli", "hash", str(p)],
                       env={**os.environ, name: value}, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (2, "")
    return r.stderr.splitlines()


def test_huge_numba_threads_is_one_line_exit_2(tmp_path):
    # numba's OpenMP pool segfaulted on 100000 threads
    assert _hash_with_env(tmp_path, "NUMBA_NUM_THREADS", "100000") == [
        "strata-ref: error: NUMBA_NUM_THREADS='100000' is more threads than strata-ref runs: "
        "give a whole number from 1 to 1024, or unset it for one thread per CPU"]


@pytest.mark.parametrize("name", ["STRATA_REF_NO_VNNI", "STRATA_REF_NO_F16C", "STRATA_REF_PORTABLE_LANES"])
def test_bad_kernel_switch_is_one_line_exit_2(tmp_path, name):
    # a switch read at import and compiled into the kernels: "yes" must not
    # silently mean "off"
    assert _hash_with_env(tmp_path, name, "yes") == [
        f"strata-ref: error: {name}='yes' is not a switch value: give 1 (on) or 0 (off), or unset it"]


@pytest.mark.parametrize("env", [{"NUMBA_NUM_THREADS": ""}, {"NUMBA_NUM_THREADS": "  "},
                                 {"NUMBA_THREADING_LAYER": ""}, {"STRATA_REF_NO_VNNI": ""}])
def test_empty_variable_is_unset(tmp_path, env):
    # one rule: `NUMBA_NUM_THREADS=` was refused ("not a value numba can
    # read") where `STRATA_REF_NO_VNNI=` counted as unset
    p = tmp_path / "w.gguf"
    write_gguf(p, {}, [("w", T.F32, (4,), np.zeros(4, np.float32))])
    r = subprocess.run([sys.executable, "-m", "strata_ref.cli", "hash", str(p), "--out", "f32"],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines()[1].split()[:3] == ["w", "F32", "4"]


def test_empty_variables_read_in_process(monkeypatch):
    from strata_ref import cpu
    from strata_ref._env import env_value, numba_env_problem
    from strata_ref.native import loader
    from strata_ref.native.dequant import policy as dispatch
    from strata_ref.native.gemm import policy as gemm
    from strata_ref.native.mmvq import policy as mmvq_dispatch
    for v in ("", "  "):
        assert env_value("X", {"X": v}) is None and numba_env_problem({"NUMBA_NUM_THREADS": v}) is None
        monkeypatch.setenv("STRATA_REF_DEVICE", v)
        assert loader.env_device() == 0
        monkeypatch.setenv("STRATA_REF_CPU", v)
        assert cpu.select(None) is cpu.native()
        assert dispatch.parse_wide_env(v) == (None, None)
        assert gemm.parse_dense_f32_env(v) == (None, None)
        empty = {k: v for k in ("STRATA_SM61_TABLE", "STRATA_SM70_TABLE", "STRATA_MMVQ_IL",
                                "STRATA_EXP_MODE", "STRATA_MMVQ_IL_ROWS")}
        assert mmvq_dispatch.select_mmvq(61, empty) == mmvq_dispatch.select_mmvq(61, {})
    assert env_value("X", {"X": " 1 "}) == " 1 " and env_value("X", {}) is None
    # a value that is not empty is still checked
    monkeypatch.setenv("STRATA_REF_DEVICE", "x")
    with pytest.raises(loader.NativeUnavailable, match="STRATA_REF_DEVICE='x' is not a CUDA device"):
        loader.env_device()
    assert dispatch.parse_wide_env("x")[1] is not None


def test_kernel_switch_values():
    from strata_ref._env import switch_problem
    for v in ("", "0", "1", " 1 "):
        assert switch_problem({"STRATA_REF_NO_VNNI": v}) is None
    assert switch_problem({}) is None
    assert "STRATA_REF_NO_F16C='2'" in switch_problem({"STRATA_REF_NO_F16C": "2"})


_NO_PROFILE = ("is not a CPU profile (profiles: scalar, avx2, avx512, v0.4.0-x64, v0.4.0-sse42, "
               "v0.4.0-sandybridge, v0.4.0-ivybridge, v0.4.0-piledriver, v0.4.0-haswell, "
               "v0.4.0-skylakex, v0.4.0-zen4, v0.4.0-sapphirerapids, armv8.0, armv8.2-dotprod, armv8.2-fp16, "
               "armv8.6-i8mm; aliases: v0.4.0-alderlake, v0.4.0-cannonlake, "
               "v0.4.0-cascadelake, "
               "v0.4.0-icelake, v0.4.0-cooperlake; or native, v0.4.0-native)")


@pytest.mark.parametrize("argv", [["generate", "Hi"], ["kl", "a.gguf", "b.gguf"],
                                  ["layers", "a.gguf"], ["experts", "a.gguf", "--layer", "0", "--prompt", "Hi"],
                                  ["rotate", "{w}", "{out}", "--measure"]])
def test_unknown_cpu_profile_is_one_line_without_a_class_name(tmp_path, monkeypatch, capsys, argv):
    # was "strata-ref: error: ValueError: --cpu = 'sse4' ..."; named before
    # any model is read
    p = tmp_path / "w.gguf"
    write_gguf(p, {}, [("w", T.F32, (4,), np.zeros(4, np.float32))])
    argv = [a.format(w=p, out=tmp_path / "r.gguf") for a in argv]
    monkeypatch.delenv("STRATA_REF_CPU", raising=False)
    assert main(argv + ["--cpu", "sse4"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [f"strata-ref: error: --cpu 'sse4' {_NO_PROFILE}"]
    monkeypatch.setenv("STRATA_REF_CPU", "sse4")
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"strata-ref: error: STRATA_REF_CPU='sse4' {_NO_PROFILE}"]


def _help(*argv) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*argv, "--help"])
    assert e.value.code == 0


def test_help_texts(capsys):
    _help()
    top = capsys.readouterr().out
    assert "The bitwise reference for GGML/GGUF quantized weights" in top
    assert "thin shell" not in top and "STRATA_REF_CACHE" in top
    _help("generate")
    gen = capsys.readouterr().out
    assert gen.startswith("usage: strata-ref generate [-h] [--max-tokens N]")
    assert "[MODEL] PROMPT [[MODEL] PROMPT ...]" not in gen and "[MODEL] PROMPT\n" in gen
    for opt, default in [("--max-tokens N", "32"), ("--temperature T", "0.0"), ("--top-k K", "0"),
                         ("--top-p P", "1.0"), ("--seed S", "0")]:
        block = gen.split("\n  " + opt, 1)[1].split("\n  --", 1)[0]
        assert f"(default: {default})" in " ".join(block.split()), opt
    assert "at most 4096" in gen
    _help("compare")
    cmp_ = " ".join(capsys.readouterr().out.split())
    for text in ["MODEL GGUF file", "TENSOR tensor name", "DUMP raw little-endian file",
                 "--dtype {f32,f16,bf16} value type of the dump (default: f32)",
                 "--row0 R first tensor row the dump holds (default: 0)",
                 "--rows N rows the dump holds (default: every row from R to the end)",
                 "--ld L values from one dump row to the next", "--hash HEX"]:
        assert text in cmp_, text


def test_unexpected_error_is_one_line_and_called_a_bug(monkeypatch, capsys):
    from strata_ref.cli import inspect as cli

    def boom(a):
        raise KeyError("tensors")
    monkeypatch.setattr(cli, "cmd_info", boom)
    monkeypatch.delenv("STRATA_REF_DEBUG", raising=False)
    assert main(["info", "x.gguf"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: internal error KeyError: 'tensors' (a bug in strata-ref; "
        "STRATA_REF_DEBUG=1 shows the traceback)"]
    monkeypatch.setenv("STRATA_REF_DEBUG", "1")
    assert main(["info", "x.gguf"]) == 2          # the traceback added, the exit status kept
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "KeyError: 'tensors'" in err
    assert err.splitlines()[-1].startswith("strata-ref: error: internal error KeyError")


@pytest.mark.parametrize("value, traceback, warned", [
    ("1", True, False), (" 1 ", True, False), ("0", False, False), ("", False, False),
    ("yes", False, True), ("2", False, True), ("true", False, True)])
def test_debug_variable_takes_1_and_warns_on_others(monkeypatch, capsys, value, traceback, warned):
    # README: "STRATA_REF_DEBUG=1 shows the traceback"; any value but "0"
    # did, "yes" included
    from strata_ref.cli import inspect as cli

    def boom(a):
        raise KeyError("tensors")
    monkeypatch.setattr(cli, "cmd_info", boom)
    monkeypatch.setenv("STRATA_REF_DEBUG", value)
    if traceback:
        assert main(["info", "x.gguf"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("Traceback") and "strata-ref: warning" not in err
        return
    assert main(["info", "x.gguf"]) == 2
    warning = [f"strata-ref: warning: STRATA_REF_DEBUG={value!r} is ignored: give 1 to show the "
               "traceback of an error, or unset it"]
    assert capsys.readouterr().err.splitlines() == warning * warned + [
        "strata-ref: error: internal error KeyError: 'tensors' (a bug in strata-ref; "
        "STRATA_REF_DEBUG=1 shows the traceback)"]


def test_debug_warning_without_an_error(tmp_path, monkeypatch, capsys):
    p = tmp_path / "w.gguf"
    write_gguf(p, {}, [("w", T.F32, (4,), np.zeros(4, np.float32))])
    monkeypatch.setenv("STRATA_REF_DEBUG", "on")
    assert main(["info", str(p)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: warning: STRATA_REF_DEBUG='on' is ignored: give 1 to show the traceback of "
        "an error, or unset it"]


@pytest.mark.parametrize("arg", ["gemma3", "SmolLM2-135M-Instruct", "./my-model.GGUF"])
def test_generate_with_a_model_and_no_prompt_is_refused(arg, capsys):
    # `generate gemma3` ran the default model with "gemma3" as its prompt
    assert main(["generate", arg]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"strata-ref: error: '{arg}' names a model but no PROMPT follows") and \
        err.count("\n") == 1


def test_generate_with_a_model_directory_and_no_prompt_is_refused(tmp_path, capsys):
    # trial finding: `generate DIR` (a folder holding a model) ran the
    # default model with the directory's path as its prompt
    d = tmp_path / "one"
    d.mkdir()
    assert main(["generate", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"strata-ref: error: '{d}' names a model but no PROMPT follows") and \
        err.count("\n") == 1


def test_a_closed_stdout_is_refused(forged):
    # started with stdout closed (`strata-ref info F >&-`): Python has no
    # sys.stdout, so everything printed was dropped and the status was 0
    r = subprocess.run(["sh", "-c", 'exec "$0" -m strata_ref.cli info "$1" >&-', sys.executable,
                        str(forged)], stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr == (
        "strata-ref: error: standard output is closed (started with `>&-`?)\n")


def test_a_closed_pipe_is_not_success(forged, tmp_path):
    # `strata-ref ... | head`: the reader leaves before the command is
    # done; the status says so (141, as a shell reports SIGPIPE), not 0
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "strata_ref.cli", "info", str(forged)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert p.returncode == 141, err
    assert b"Traceback" not in err and b"Exception ignored" not in err, err


@pytest.mark.parametrize("argv", [
    ["generate", "--ctx", "2_56", "hi"],            # int() would read 256
    ["generate", "--max-tokens", " 7", "hi"],       # and 7
    ["generate", "--seed", "\u0663", "hi"],         # an Arabic-Indic 3
    ["kl", "m", "--ctx", "1e3"],
    ["which", "x.npz", "m", "--ctx", "0x100"],
])
def test_integer_options_take_decimal_digits_only(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is not a decimal integer" in err and "Traceback" not in err


@pytest.mark.parametrize("argv,shown", [
    (["generate", "--temperature", "1_0", "hi"], "'1_0'"),             # float() reads 10.0
    (["generate", "--top-p", " 0.5", "hi"], "' 0.5'"),
    (["generate", "--top-p", "nan", "hi"], "'nan'"),
    (["kl", "m", "--temperature", "inf"], "'inf'"),
    (["kl", "m", "--top-p", "\u0660.\u0665"], "'\u0660.\u0665'"),    # Arabic-Indic 0.5
    (["generate", "--temperature", "0.7\x1b", "hi"], "'0.7\\x1b'"),    # escaped once
])
def test_number_options_take_decimal_notation_only(argv, shown, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"{shown} is not a decimal number"), err


def test_number_options_take_what_decimal_notation_writes():
    from strata_ref.cli.common import real
    assert [real(t) for t in ("0", "0.7", ".5", "1.", "-0.0", "+2", "1e-3", "2.5E+1")] == \
        [0.0, 0.7, 0.5, 1.0, -0.0, 2.0, 0.001, 25.0]


def test_which_refuses_an_empty_profile_in_its_list(capsys):
    # before any file is read: "avx2,,avx512" and "avx2," are typing slips
    for cpu in ("avx2,,avx512", "avx2,"):
        assert main(["which", "missing.npz", "missing.gguf", "--cpu", cpu]) == 2
        assert capsys.readouterr().err.strip() == (
            f"strata-ref: error: --cpu {cpu!r} has an empty item; give comma-separated names")


@pytest.mark.parametrize("argv, flag, value", [
    (["hash", "absent.gguf", "--out"], "--out", "f32,,f16"),
    (["hash", "absent.gguf", "--out"], "--out", "f32,"),
    (["hash", "absent.gguf", "--types"], "--types", "Q4_0,,Q8_0"),
    (["hash", "absent.gguf", "--tensors"], "--tensors", "a*,,b*"),
    (["trace", "absent.gguf", "--tokens", "1,2", "--out", "t.npz", "--tensors"], "--tensors", ",a*"),
])
def test_an_empty_item_in_a_list_is_refused_before_the_file_is_read(argv, flag, value, capsys):
    # "f32,,f16" hashed f32 and f16 as if the slip were not there
    assert main(argv + [value]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [
        f"strata-ref: error: {flag} {value!r} has an empty item; give comma-separated names"]


@pytest.mark.parametrize("flag, msg", [
    ("--out", "--out: unknown or no dtype (',,'); choose from f32,f16,bf16"),
    ("--types", "--types ',,' names no type"),
    ("--tensors", "--tensors ',,' names no pattern; give comma-separated names or fnmatch globs"),
])
def test_a_list_naming_nothing_keeps_its_own_line(flag, msg, capsys):
    assert main(["hash", "absent.gguf", flag, ",,"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"strata-ref: error: {msg}"]


def test_hash_types_the_file_lacks_are_an_error_naming_what_it_holds(tmp_path, capsys):
    # an empty chain with exit 0 (and a note) where --tensors nomatch* was an error
    p = tmp_path / "q.gguf"
    write_gguf(p, {}, [("a", T.F32, (32,), np.ones(32, np.float32)),
                       ("b", T.Q8_0, (32,), np.zeros(34, np.uint8)),
                       ("c", T.F32, (32,), np.zeros(32, np.float32))])
    assert main(["hash", str(p), "--types", "q4_k,2"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [
        "strata-ref: error: --types Q4_0,Q4_K matches no tensor of q.gguf, which holds F32, Q8_0"]
    # one type of the list that the file lacks, as one pattern matching nothing
    assert main(["hash", str(p), "--types", "Q8_0,Q4_K"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: --types Q4_K matches no tensor of q.gguf, which holds F32, Q8_0"]
    # each selects a tensor, the two together none
    assert main(["hash", str(p), "--types", "Q8_0", "--tensors", "a,c"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "strata-ref: error: --types Q8_0 and --tensors 'a,c' together match no tensor of q.gguf"]
    assert main(["hash", str(p), "--types", "Q8_0", "--tensors", "a,b", "--out", "f32", "--json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)["tensors"]] == ["b"]


@pytest.mark.parametrize("argv, least, why", [
    (["generate", "absent.gguf", "Hi"], 2, "one prompt token and one generated"),
    (["kl", "absent.gguf", "b.gguf"], 1, "one token"),
    (["trace", "absent.gguf", "--tokens", "1,2", "--out", "t.npz"], 1, "one token"),
    (["which", "absent.npz", "absent.gguf", "--cpu", "avx2"], 1, "one token"),
])
@pytest.mark.parametrize("ctx", ["0", "-3"])
def test_a_ctx_below_the_commands_minimum_is_worded_alike(argv, least, why, ctx, capsys):
    # generate said "is outside 2 .. the model's training context", the
    # others "is not a context length (an int >= 1)"
    assert main(argv + ["--ctx", ctx]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [
        f"strata-ref: error: --ctx {ctx} is below the minimum of {least} ({why})"]


def test_which_says_when_two_items_give_one_profile(tmp_path, monkeypatch, capsys):
    # `--cpu avx512,native` dropped native without a word where native is avx512
    import strata_ref.which as which_mod
    from strata_ref.cpu import select

    class Candidate:
        matches, not_emulated = True, None

        def json(self):
            return {"matches": True}
    tried = []

    def which(e, model, profiles, *args, **kw):
        tried.append(list(profiles))
        return [Candidate()] * len(profiles)
    monkeypatch.setattr(which_mod, "which", which)
    monkeypatch.setattr(which_mod, "report_text", lambda e, cands, n_ctx: "the report")
    logits = tmp_path / "l.npz"
    np.savez(logits, tokens=np.array([1, 2, 3]), logits=np.zeros((3, 8), np.float32))
    native = select("native").name
    for cpu, note in [(f"{native},native", f"--cpu native is {native} on this machine: tried once"),
                      (f"native,{native}", f"--cpu native is {native} on this machine: tried once"),
                      ("avx2,AVX2", "--cpu names avx2 and AVX2: tried once"),
                      ("avx2,avx2", "--cpu names avx2 twice: tried once"),
                      ("v0.4.0-haswell,v0.4.0-alderlake", "--cpu v0.4.0-alderlake is v0.4.0-haswell: tried once"),
                      # the third item repeats the second, not native
                      (f"native,{native},{native.upper()}", [f"--cpu native is {native} on this machine: tried once",
                                                             f"--cpu names {native} and {native.upper()}: tried once"])]:
        notes = [note] if isinstance(note, str) else note
        for extra in ([], ["--json"]):
            assert main(["which", str(logits), "m.gguf", "--cpu", cpu, "--flash-attn", "off"] + extra) == 0
            cap = capsys.readouterr()
            assert cap.err.splitlines() == [f"strata-ref: note: {n}" for n in notes]
            assert (json.loads(cap.out)["matches"] == [{"matches": True}] if extra
                    else cap.out == "the report\n")
            assert tried.pop() == [select(cpu.split(",")[0]).name]
    # distinct profiles: no note
    assert main(["which", str(logits), "m.gguf", "--cpu", "avx2,scalar", "--json"]) == 0
    assert capsys.readouterr().err == "" and tried.pop() == ["avx2", "scalar"]
