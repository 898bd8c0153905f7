"""What every command shares: the one error line, argument checks that
several commands make, JSON output, the `--plot` directory check, the notes
printed once per model cache."""
from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import sys

from .._text import printable

#: the KV cache types of `--cache-type-k` / `--cache-type-v` (llama.cpp's)
KV_TYPES = "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"


class Help(argparse.HelpFormatter):
    """Shows an option's default after its help, unless there is no default
    (None, a flag) or the help already says it."""

    def _get_help_string(self, action):
        h = action.help or ""
        if (not action.option_strings or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or "default" in h):
            return h
        return h + " (default: %(default)s)"


def err(msg: str) -> int:
    # one line, whatever the message holds (a name taken from a file)
    print(f"strata-ref: error: {printable(msg, backslash=False)}", file=sys.stderr)
    return 2


class _StderrNotes(logging.Handler):
    """Shows the library's INFO notes (model fetch progress, native builds;
    logger "strata_ref") as `strata-ref: MESSAGE` lines on the stderr of the
    moment, the message escaped for a terminal."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"strata-ref: {printable(record.getMessage(), backslash=False)}", file=sys.stderr)


def show_library_notes() -> None:
    """Route the library's notes to stderr for the command line (once per
    process); the library itself only logs them."""
    lib = logging.getLogger("strata_ref")
    if not any(isinstance(h, _StderrNotes) for h in lib.handlers):
        lib.addHandler(_StderrNotes())
    lib.setLevel(logging.INFO)


def error_line(e: BaseException) -> str:
    """The message of an error caught at the top, as the line after
    `strata-ref: error: `. The library's errors (ValueError, RuntimeError,
    ImportError and their kinds: GGUFError, ModelError ...) are sentences
    that name what went wrong: their message alone. An OSError: its path(s)
    and reason ("out.npz: is a directory"; a symbolic link loop or a link to
    nothing said so), no class name or errno. Any other error (TypeError,
    MemoryError, ArithmeticError: not expected) keeps its class name, so
    that a bug still shows as one."""
    msg = str(e)
    if isinstance(e, OSError) and e.strerror:
        names = [os.fsdecode(n) for n in (e.filename, e.filename2) if n is not None]
        from .._paths import unreachable
        why = unreachable(names[0]) if names and e.errno in (errno.ELOOP, errno.ENOENT) else None
        reason = why or e.strerror[:1].lower() + e.strerror[1:]
        return f"{' -> '.join(names)}: {reason}" if names else reason
    if isinstance(e, (ValueError, RuntimeError, ImportError, OSError)) and msg:
        return msg
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def decimal(text: str) -> int:
    """argparse type of an integer option: an optional sign and ASCII
    digits, nothing else (Python's int() would also take "2_56", " 7 "
    and other scripts' digits)."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise argparse.ArgumentTypeError(f"'{printable(text[:40])}' is not a decimal integer")
    return int(text)


def real(text: str) -> float:
    """argparse type of a number option: decimal notation (an optional
    sign, ASCII digits with an optional point, an optional exponent),
    nothing else (Python's float() would also take "1_0" as 10, " 0.5 ",
    other scripts' digits, "inf" and "nan")."""
    if not re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", text):
        raise argparse.ArgumentTypeError(f"'{printable(text[:40])}' is not a decimal number")
    return float(text)


def empty_item_problem(text: str | None, flag: str) -> str | None:
    """Why a comma-separated list has an empty item ("a,,b", "a,"), as one
    line, or None."""
    if text is not None and any(not p.strip() for p in text.split(",")):
        return f"{flag} '{printable(text[:80])}' has an empty item; give comma-separated names"
    return None


def split_list(s: str | None) -> list[str] | None:
    if not s:
        return None
    return [p.strip() for p in s.split(",") if p.strip()]


def list_problem(text: str | None, flag: str, names_nothing: str) -> str | None:
    """Why the comma-separated list `text` of option `flag` cannot be
    taken, as one line, or None (text None: not given): `names_nothing`
    for a list of no item ("", ",,"), the line of `empty_item_problem` for
    one with an empty item among others ("a,,b", "a,")."""
    if text is None:
        return None
    if not split_list(text):
        return names_nothing
    return empty_item_problem(text, flag)


def below_minimum(flag: str, value, minimum: int, why: str) -> str | None:
    """None, or the line for an integer option below the least value the
    command takes, with the reason for that least value:
    "--ctx 0 is below the minimum of 2 (one prompt token and one generated)".
    value None: not given."""
    if value is None or value >= minimum:
        return None
    return f"{flag} {value} is below the minimum of {minimum} ({why})"


def cpu_problem(name) -> str | None:
    """Why `--cpu NAME` (None: $STRATA_REF_CPU, else native) names no CPU
    profile, as one line, or None; checked before any model is read."""
    from ..cpu import select
    try:
        select(name)
    except ValueError as e:
        return str(e)
    return None


def fa_threads_bound_problem(fa_threads) -> str | None:
    """None, or why `--fa-threads N` is outside 1 .. ggml's GGML_MAX_N_THREADS."""
    from ..infer.kv_cache import MAX_THREADS
    if fa_threads is not None and not 1 <= fa_threads <= MAX_THREADS:
        return (f"--fa-threads must be in 1 .. {MAX_THREADS} (ggml's GGML_MAX_N_THREADS), "
                f"got {fa_threads}")
    return None


def fa_threads_problem(fa_threads, flash_attn, cache_type_v, cpu) -> str | None:
    """Why `--fa-threads N` does not apply, as one line, or None: N below 1,
    or flash attention off (`--flash-attn off`, or the default of the
    profile `cpu` for the V cache type `cache_type_v`), since N only sets
    flash attention's split. Run after `cpu_problem` and the cache types'
    checks."""
    if fa_threads is None:
        return None
    bad = fa_threads_bound_problem(fa_threads)
    if bad:
        return bad
    from ..cpu import select
    from ..infer.kv_cache import resolve_flash_attn
    prof = select(cpu)
    try:
        if resolve_flash_attn(prof.default_flash_attn if flash_attn is None else flash_attn,
                              cache_type_v or "f16"):
            return None
    except ValueError:
        return None             # a bad --flash-attn or cache type: its own check names it
    why = ("--flash-attn is off" if flash_attn is not None
           else f"flash attention is off by default on the {prof.name} profile")
    return (f"--fa-threads {fa_threads} needs flash attention on, but {why}: add --flash-attn on "
            f"or leave --fa-threads out (it sets flash attention's split only)")


def utf8_problem(text: str, what: str = "the prompt") -> str | None:
    """None, or the message for a command-line text that is not UTF-8 (bytes
    the locale could not decode arrive as lone surrogates), naming the first
    bad byte and its character position."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = os.fsencode(text[e.start:e.end])
        return (f"{what} is not valid UTF-8 text (byte {raw[:1].hex()} at character "
                f"{e.start}); pass UTF-8")
    return None


def sampling_problem(temperature: float, top_k: int, top_p: float) -> str | None:
    """Why `--temperature`, `--top-k` or `--top-p` cannot sample, as one
    line naming the option, or None (`generate` and `kl` take the same)."""
    import math
    if not math.isfinite(temperature) or temperature < 0:
        return f"--temperature must be a finite number >= 0 (0: greedy), got {temperature}"
    if not 0.0 < top_p <= 1.0:
        return f"--top-p must be in (0, 1], got {top_p}"
    if top_k < 0:
        return f"--top-k must be >= 0 (0: off), got {top_k}"
    return None


def seed_problem(seed) -> str | None:
    """A seed is llama.cpp's uint32_t (`llama_sampler_init_dist`); the
    rotation's is written as a UINT32 key."""
    if not 0 <= seed < 1 << 32:
        return f"--seed must be from 0 to {(1 << 32) - 1}, got {seed}"
    return None


def token_ids(text: str) -> list | None:
    """Comma-separated token ids, None when the text is not such a list."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def finite(x):
    """x with every non-finite float (a standard error of one position)
    as None, so that --json output is strict JSON (null, never NaN)."""
    import math
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def json_out(doc) -> None:
    json.dump(finite(doc), sys.stdout, allow_nan=False)
    print()


def plot_problem(plot_dir) -> str | None:
    """Why the charts of `--plot DIR` could not be written, as one line, or
    None; checked before the measurement runs, not after it: matplotlib
    must be there (ImportError, a one-line error), DIR must be a directory
    this process can write, or one it can create. Directories made for the
    check are removed again (the charts make them)."""
    if plot_dir is None:
        return None
    if not plot_dir.strip():
        # an unset shell variable: say so rather than draw no chart
        return "--plot is empty; give a directory for the charts (or leave --plot out)"
    from ..quality.charts import _plt
    _plt()
    import tempfile
    d = os.path.abspath(plot_dir)
    if os.path.exists(d) and not os.path.isdir(d):
        return f"--plot {plot_dir}: not a directory (a file of that name exists)"
    missing = []
    while not os.path.isdir(d):
        if os.path.lexists(d):
            return f"--plot {plot_dir}: {d} is not a directory"
        missing.append(d)
        d = os.path.dirname(d)
    made = []
    try:
        for m in reversed(missing):
            try:
                os.mkdir(m)
            except OSError as e:
                return f"--plot {plot_dir}: cannot create {m}: {e.strerror[:1].lower() + e.strerror[1:]}"
            made.append(m)
        probe = missing[0] if missing else os.path.abspath(plot_dir)
        try:
            with tempfile.TemporaryFile(dir=probe):
                pass
        except OSError as e:
            return f"--plot {plot_dir}: cannot write into it: {e.strerror[:1].lower() + e.strerror[1:]}"
    finally:
        for m in reversed(made):
            os.rmdir(m)
    return None


def write_charts(plot_dir, *charts) -> int:
    """Call each chart writer (no arguments) after the results are
    printed: 0, or 2 after one error line when one fails (the results
    stand)."""
    for chart in charts:
        try:
            chart()
        except Exception as e:
            return err(f"--plot {plot_dir}: the chart was not written: {error_line(e)} "
                        f"(the results are above)")
    return 0


def native_note(cpu) -> None:
    """After the results of a run in the native profile (`--cpu` None: as
    $STRATA_REF_CPU, else native): the note on what native means on this
    CPU, once per model cache (as `generate` prints it)."""
    from .. import cpu as _cpu
    from .._env import env_value
    name = cpu if cpu is not None else env_value(_cpu.ENV) or "native"
    if name.strip().lower() == "native":
        note_once(_cpu.native_note(), None)


#: the notes printed in this process
_NOTED: set = set()


def note_once(note: str, err) -> None:
    """Print `strata-ref: note: NOTE` on `err` (default sys.stderr) the first
    time NOTE comes up: once per model cache (a marker file under
    `cache_dir()/notes/`, named by the note's sha256, so that a changed
    note is shown again), and once per process where the cache cannot be
    written."""
    if not note or note in _NOTED:
        return
    _NOTED.add(note)
    import hashlib

    from ..models import cache_dir
    mark = cache_dir() / "notes" / hashlib.sha256(note.encode()).hexdigest()[:16]
    try:
        if mark.is_file():
            return
    except OSError:
        pass
    print(f"strata-ref: note: {note}", file=err or sys.stderr)
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(note + "\n")
    except OSError:
        pass


# ------------------------------------------------------------------ output files
def _magic(path, n: int = 8) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _zip_names(path) -> list | None:
    import zipfile
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (zipfile.BadZipFile, OSError):
        return None


#: kind of output file -> (its name in messages, a test that an existing
#: file is one: such a file may be replaced, any other is refused).
#: A raw dump has no header to know it by: only an empty file is replaced.
OUT_KINDS = {
    "npz": ("a .npz archive", lambda p: _magic(p, 4) == b"PK\x03\x04"),
    "npy": ("a .npy file", lambda p: _magic(p, 6) == b"\x93NUMPY"),
    "gguf": ("a GGUF file", lambda p: _magic(p, 4) == b"GGUF"),
    "trace": ("a trace container", lambda p: "format.npy" in (_zip_names(p) or ())),
    "tokens": ("a token file of `kl --tokens-out`",
               lambda p: (lambda n: n is not None and all(
                   m.split(":")[0].removesuffix(".npy") in ("tokens", "n_prompt", "n_ctx", "prompt")
                   for m in n))(_zip_names(p))),
    "raw": ("an empty file (a raw dump has no header to recognise)", lambda p: False),
}


def out_problem(path, flag: str, kind: str, example: str, inputs=(), force_flag: str | None = None,
                forced: bool = False, prefix: str = "") -> str | None:
    """Why the output file `path` must not be written, as one line, or
    None; checked before the work, by every command that writes a file.
    flag: the option or argument that names it ("--out", "OUT"; prefix:
    what comes before, "rotate: "); kind: a key of OUT_KINDS; example: a
    file name for a directory given; inputs: the paths the command reads
    (an output that is one of them, by any name or link, is refused);
    force_flag: the option that allows replacing a file of another kind
    (None: there is none), forced: whether it was given.

    Refused: an empty name; a directory; an entry that exists and is not
    a regular file (a device, FIFO, socket, symbolic link loop or link to
    nothing: a rename over it would replace the node); an input; an
    existing non-empty file of another kind; a directory that does not
    exist or cannot be written into (probed with a temporary file)."""
    import stat
    import tempfile
    from .._paths import unreachable
    p = os.fspath(path)
    what = f"{prefix}{flag} {p}"
    if not p.strip():
        return f"{what}: an empty name; give the file to write"
    if os.path.isdir(p):
        return f"{what}: a directory; give a file name, such as {os.path.join(p, example)}"
    if os.path.lexists(p):
        try:
            st = os.stat(p)
        except OSError:
            return f"{what}: {unreachable(p) or 'cannot be reached'}"
        if not stat.S_ISREG(st.st_mode):
            return f"{what}: exists and is not a regular file (a device, pipe or socket); give a file name"
        for i in inputs:
            try:
                if i is not None and os.path.samefile(p, i):
                    return f"{what}: must not be the input file {i}; give another name"
            except OSError:
                pass
        name, is_kind = OUT_KINDS[kind]
        if st.st_size and not forced and not is_kind(p):
            return (f"{what}: the file exists and is not {name}; give another {flag}, or "
                    + (f"{force_flag} to replace it" if force_flag else "remove it"))
    parent = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(parent):
        return f"{what}: {parent} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        return f"{what}: cannot write into {parent}: {e.strerror[:1].lower() + e.strerror[1:]}"
    return None


def patterns_problem(text, what: str = "--tensors") -> str | None:
    """Why comma-separated fnmatch patterns cannot select anything, as one
    line, or None (text None: no filter): a list of no pattern (",,"), an
    empty item ("a*,,b*"), a pattern with an unclosed `[` (fnmatch would
    take it literally)."""
    bad = list_problem(text, what, f"{what} {text!r} names no pattern; give comma-separated names or "
                                   f"fnmatch globs")
    if bad or text is None:
        return bad
    for p in split_list(text):
        if "[" in p and "]" not in p[p.index("[") + 1:]:
            return f"{what}: pattern {p!r} has an unclosed '['; write [[] for a literal ["
    return None
