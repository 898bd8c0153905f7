"""`strata-ref` command line: each subcommand is a thin shell over the
library, one module per family of commands:

| module | commands |
|---|---|
| `hashing` | hash |
| `inspect` | info, models, compare, dequant |
| `golden` | golden |
| `inference` | generate |
| `quality` | kl, layers, rotate |
| `experts` | experts, matmul |
| `trace` | trace, diff, which |
| `native` | parity, bench |

`common` holds what they share. Every error is one line on stderr and exit
status 2 (argparse's usage errors add the usage above it); names and
values taken from a file are escaped before they are printed
(`_text.printable`). Long jobs draw a tqdm bar on stderr when it is a
terminal; Ctrl-C stops any command with status 130 (`main`).
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap

from .. import __version__
from ..infer.archs import SUPPORTED_ARCHS
from . import experts, golden, hashing, inference, inspect, native, quality, trace
from .common import err, error_line

__all__ = ["main", "build_parser"]

DESCRIPTION = "\n".join(textwrap.wrap(
    "The bitwise reference for GGML/GGUF quantized weights: hash every tensor's dequantized output "
    "(FNV-1a 64), compare another engine's output dump with the oracle bit for bit, check the golden "
    f"files, and run GGUF models ({', '.join(SUPPORTED_ARCHS)}) on the CPU as llama.cpp does, and "
    "measure what a quantization costs.", 74))

EPILOG = """\
A MODEL is a registry name (see `strata-ref models list`), a path to a
.gguf file (any shard of a gguf-split set opens the whole set) or a
directory holding one model. Models are cached in $STRATA_REF_CACHE, else
$XDG_CACHE_HOME/strata-ref, else ~/.cache/strata-ref. Errors are one line
(exit 2); STRATA_REF_DEBUG=1 shows the traceback. Ctrl-C exits with 130."""

#: the subcommands in the order `strata-ref --help` lists them
COMMANDS = (hashing.add_hash, inspect.add_info, inspect.add_models, golden.add_golden, inspect.add_compare,
            inference.add_generate, quality.add_kl, quality.add_layers, experts.add_experts, quality.add_rotate,
            trace.add_trace, trace.add_diff, trace.add_which, inspect.add_dequant, experts.add_matmul,
            native.add_parity, native.add_bench)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata-ref", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"strata-ref {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    for add in COMMANDS:
        add(sub)
    return p


#: Seconds the main thread has, after Ctrl-C, to stop the job cleanly.
INTERRUPT_GRACE_S = 1.0

# Set by the SIGINT handler that `_keep_interrupts` installs.
_sigint_seen = False


def _exit_130_now() -> None:
    """End the process with status 130 at once. Raw writes only: the main
    thread may hold the locks of the Python streams (a bar being drawn);
    a line end after a half-drawn bar."""
    try:
        os.write(2, b"\n")
    finally:
        os._exit(130)


def _keep_interrupts() -> None:
    """Make every Ctrl-C stop the command, at once, with status 130.

    Three ways an interrupt could be late, lost or turned into an error:

    - A KeyboardInterrupt raised while Python code runs as a callback of C
      code (llvmlite calls several whenever numba compiles or caches a
      function) cannot leave the callback: CPython drops it ("Exception
      ignored ...") and the C code goes on without what the callback was to
      do. Here numba then failed with RuntimeError "no compiled object yet
      for <Library ...>" (exit 2), and in 2 of 200 tries LLVM crashed
      (SIGSEGV). The unraisable hook below therefore ends the process
      (status 130) from inside the callback, before control returns to
      that C code.
    - An error raised after Ctrl-C is taken as its consequence: `main`
      exits 130 for it (`_sigint_seen`), not 2.
    - Python runs its SIGINT handler only between bytecodes, so a long call
      into C (an LLVM compile) delays it: the signal also wakes a thread
      (`signal.set_wakeup_fd`), which ends the process with status 130 if
      it is still running INTERRUPT_GRACE_S seconds later. (That thread
      needs the GIL: a compiled kernel that holds it still delays the exit
      until it returns; strata-ref's kernels run in short calls.)

    Other unraisable errors go to the previous hook. Does nothing when
    SIGINT was ignored when the process started (a background job of a
    shell without job control)."""
    import signal
    import threading
    import time
    if (signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            or threading.current_thread() is not threading.main_thread()):
        return
    previous = sys.unraisablehook

    def on_sigint(signum, frame):
        global _sigint_seen
        _sigint_seen = True
        signal.default_int_handler(signum, frame)

    def hook(u):
        if isinstance(u.exc_value, KeyboardInterrupt):
            _exit_130_now()
        previous(u)

    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def deadline():
        while signal.SIGINT not in os.read(r, 64):
            pass
        time.sleep(INTERRUPT_GRACE_S)
        _exit_130_now()

    threading.Thread(target=deadline, name="strata-ref-interrupt-deadline", daemon=True).start()
    sys.unraisablehook = hook
    signal.signal(signal.SIGINT, on_sigint)


def _escape_unencodable() -> None:
    """Write what stdout / stderr cannot encode (PYTHONIOENCODING=ascii, a
    C locale) as backslash escapes (`caf\\xe9`, `\\u0120`) instead of
    dying with UnicodeEncodeError in the middle of the output. A stream
    that already has an error handler other than strict keeps it."""
    import io
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def _stop_interrupted() -> int:
    """The way out after Ctrl-C: status 130, and a second Ctrl-C must not
    interrupt it."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return 130


def main(argv=None) -> int:
    """The `strata-ref` command: returns the exit status. With argv None
    (the console script, `python -m strata_ref.cli`) the process is the
    command, and Ctrl-C handling is set up for it (`_keep_interrupts`);
    a caller passing argv keeps its own."""
    if argv is None:
        _keep_interrupts()
    try:
        return _run(argv)
    except KeyboardInterrupt:
        # Ctrl-C during _run's setup (numba's import, the parser), outside
        # its own try around the command
        return _stop_interrupted()


def _run(argv) -> int:
    """main's body: parse, check the environment, run the command."""
    if sys.stdout is None:
        # started with stdout closed (`>&-`): what the command prints would be
        # lost and its exit status would say it was seen
        if sys.stderr is not None:
            print("strata-ref: error: standard output is closed (started with `>&-`?)",
                  file=sys.stderr)
        return 2
    _escape_unencodable()
    parser = build_parser()
    # argparse stops filling a positional list at the first option, so
    # `generate MODEL --chat PROMPT` leaves PROMPT over: take it back here.
    args, extra = parser.parse_known_args(argv)
    if extra:
        # after `--` everything is positional (`generate MODEL -- "-5 ..."`)
        dashes = extra[0] == "--"
        rest = extra[1:] if dashes else extra
        if args.cmd == "generate" and (dashes or not any(e.startswith("-") for e in rest)):
            args.args += rest
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "generate" and len(args.args) > 2:
        return err("generate takes [MODEL] PROMPT (quote the prompt)")
    from .._env import (debug_setting, drop_blank_numba_env, numba_config_problem,
                       numba_env_problem, switch_problem)
    debug, debug_warning = debug_setting()
    if debug_warning:
        print(f"strata-ref: warning: {debug_warning}", file=sys.stderr)
    drop_blank_numba_env()      # an empty variable is unset, for numba too
    bad_env = numba_env_problem() or switch_problem() or numba_config_problem()  # before anything imports numba
    if bad_env:
        return err(bad_env)
    from .._threads import configure
    configure()                 # numba's threading layer, before any kernel runs
    from .common import show_library_notes
    show_library_notes()        # fetch progress, native builds: logged by the library
    from .. import _compile_notes
    _compile_notes.install()    # a first run's compile wait is said, not silent
    import warnings
    from numba.core.errors import NumbaIRAssumptionWarning
    # numba's own note on its IR (a closure's variable scope) while it
    # compiles: about numba's internals, not the user's run, and it asks
    # the reader to report it to numba
    warnings.filterwarnings("ignore", category=NumbaIRAssumptionWarning)
    try:
        rc = int(args.func(args) or 0)
        _compile_notes.log_summary()
        return rc
    except KeyboardInterrupt:
        return _stop_interrupted()
    except BrokenPipeError:
        # the reader left (`| head`): the command did not finish, so its
        # verdict is unknown; 141 as a shell reports a process ended by
        # SIGPIPE, never 0 (a `diff A B | head` under pipefail must not
        # pass). stdout goes to /dev/null so that Python's flush at exit
        # does not print a second error.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except (ValueError, TypeError, RuntimeError, OSError, ImportError,
            MemoryError, ArithmeticError) as e:
        if _sigint_seen:
            return _stop_interrupted()
        # Library errors (GGUFError, ModelError, UnsupportedTypeError...) name
        # what went wrong; show that line, not a traceback (`error_line`:
        # TypeError, MemoryError and ArithmeticError are not expected and
        # keep their class name; STRATA_REF_DEBUG=1 adds the traceback,
        # the exit status stays 2).
        if debug:
            import traceback
            traceback.print_exc()
        return err(error_line(e))
    except Exception as e:
        if _sigint_seen:
            return _stop_interrupted()
        # Nothing else is expected: a bug. Still one line, saying so.
        if debug:
            import traceback
            traceback.print_exc()
        return err(f"internal error {type(e).__name__}: {e} (a bug in strata-ref; "
                    f"STRATA_REF_DEBUG=1 shows the traceback)")


if __name__ == "__main__":
    sys.exit(main())
