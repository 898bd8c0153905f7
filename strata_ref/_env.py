"""Environment variables: strata-ref's own, and those of libraries it imports,
checked before those libraries read them.

One rule for every variable: set to an empty value (or only blanks) it
counts as unset (`env_value`); any other value that is not valid is an
error naming the variable, or a warning naming it (STRATA_REF_DEBUG,
`debug_setting`; the GPU tuning variables).

numba reads NUMBA_NUM_THREADS when it is first imported and raises from deep
inside its threading set-up for a value below 1 (and ignores a value that is
not an integer, an empty one included, with a warning). `numba_env_problem`
says what is wrong in one line naming the variable, so that the command line
can refuse it (exit 2) and the library raise a clear ImportError before
numba loads; `drop_blank_numba_env` removes empty NUMBA_* variables first,
so that numba, too, takes them as unset.
"""
from __future__ import annotations

import os
import re

__all__ = ["env_value", "drop_blank_numba_env", "numba_env_problem", "check_numba_env", "switch",
           "switch_problem", "SWITCHES", "debug_setting"]


def env_value(name: str, environ=None) -> str | None:
    """The value of `name` in `environ` (default os.environ), or None when it
    is unset, empty or only blanks (the rule of every variable strata-ref
    reads: an empty value is unset)."""
    env = os.environ if environ is None else environ
    v = env.get(name)
    return v if v is not None and v.strip() else None


def drop_blank_numba_env() -> None:
    """Remove every NUMBA_* variable whose value is empty or only blanks from
    os.environ, so that numba (when it is first imported) takes it as unset
    instead of warning that it cannot parse it, or taking "" as a value
    (NUMBA_THREADING_LAYER). Does nothing for numba once it is imported."""
    for k in [k for k, v in os.environ.items() if k.startswith("NUMBA_") and not v.strip()]:
        del os.environ[k]


#: strata-ref's own on/off switches of the CPU kernels (`cpu.simd`), read
#: once at import: "1" turns one on; unset, "" or "0" leave it off
SWITCHES = ("STRATA_REF_PORTABLE_LANES", "STRATA_REF_NO_VNNI", "STRATA_REF_NO_F16C",
            "STRATA_REF_QUIET_COMPILE", "STRATA_REF_NO_AVX512")


def switch_problem(environ=None) -> str | None:
    """The first of SWITCHES in `environ` (default os.environ) whose value is
    not unset, "", "0" or "1", as one line naming it, or None."""
    for name in SWITCHES:
        v = env_value(name, environ)
        if v is not None and v.strip() not in ("0", "1"):
            return f"{name}={v!r} is not a switch value: give 1 (on) or 0 (off), or unset it"
    return None


def switch(name: str) -> bool:
    """True when the switch `name` (one of SWITCHES) is "1" in os.environ;
    ValueError naming it for any value but unset, "", "0" or "1"."""
    if name not in SWITCHES:
        raise ValueError(f"unknown switch {name!r}")
    problem = switch_problem({name: os.environ[name]} if name in os.environ else {})
    if problem:
        raise ValueError(problem)
    return (env_value(name) or "").strip() == "1"


def debug_setting(environ=None) -> tuple[bool, str | None]:
    """(on, warning) for STRATA_REF_DEBUG in `environ` (default os.environ):
    "1" turns tracebacks on; unset, empty or "0" leaves them off; any other
    value leaves them off too, with `warning` the line that says so."""
    v = env_value("STRATA_REF_DEBUG", environ)
    if v is None or v.strip() == "0":
        return False, None
    if v.strip() == "1":
        return True, None
    return False, (f"STRATA_REF_DEBUG={v!r} is ignored: give 1 to show the traceback of an "
                   "error, or unset it")


#: the most threads NUMBA_NUM_THREADS may ask for
MAX_THREADS = 1024


def numba_env_problem(environ=None) -> str | None:
    """The problem with NUMBA_NUM_THREADS in `environ` (default os.environ),
    or None when it is unset, empty (as unset: `drop_blank_numba_env`) or a
    whole number from 1 to MAX_THREADS."""
    v = env_value("NUMBA_NUM_THREADS", environ)
    if v is None:
        return None
    # digits only: int() (and so numba) would also read "2_0" as 20 and " 2"
    n = int(v) if re.fullmatch(r"[0-9]+", v) else None
    if n is None or n < 1:
        return (f"NUMBA_NUM_THREADS={v!r} is not a number of threads: give a whole "
                f"number >= 1, or unset it for one thread per CPU")
    if n > MAX_THREADS:
        # numba's OpenMP pool crashes (SIGSEGV, no message) for some such
        # counts (seen: 100000); none of them is a sensible setting
        return (f"NUMBA_NUM_THREADS={v!r} is more threads than strata-ref runs: give a "
                f"whole number from 1 to {MAX_THREADS}, or unset it for one thread per CPU")
    return None


def numba_config_problem() -> str | None:
    """The first NUMBA_* variable numba cannot parse, as one line, or None.

    numba reads its variables when it is first imported and, for a value it
    cannot parse, prints a RuntimeWarning with a traceback and goes on with
    its default. This imports numba (only when some NUMBA_* variable is set,
    and after `numba_env_problem` found nothing) with those warnings caught,
    and names the variable instead. Call it before anything imports numba:
    numba warns only once per process."""
    import re
    import sys
    import warnings
    if "numba" in sys.modules or not any(k.startswith("NUMBA_") for k in os.environ):
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import numba  # noqa: F401
    for w in caught:
        m = re.match(r"Environment variable '(\w+)' is defined but its associated value "
                     r"'(.*)' could not be parsed", str(w.message))
        if m:
            return f"{m.group(1)}={m.group(2)!r} is not a value numba can read; fix or unset it"
    return None


def check_numba_env() -> None:
    """Raise ImportError (naming the variable and its value) when
    NUMBA_NUM_THREADS would make numba fail or be ignored, or a switch of
    SWITCHES has a value that is not one. Empty NUMBA_* variables are
    removed first (`drop_blank_numba_env`)."""
    drop_blank_numba_env()
    problem = numba_env_problem() or switch_problem()
    if problem:
        raise ImportError(problem)


def zero_one(name: str, value: str | None, default: str) -> tuple[bool | None, str | None]:
    """(setting, warning) of an opt-in switch variable `name` whose value is
    `value`: unset or blank -> (None, None); "0" -> (False, None); "1" ->
    (True, None); anything else -> (None, a warning that names the value
    and says the default, `default`, is used). Used by the native kernels'
    selection policies (STRATA_DEQUANT_WIDE, STRATA_DENSE_F32)."""
    if value is None or not value.strip():
        return None, None
    if value in ("0", "1"):
        return value == "1", None
    return None, f"{name}={value!r} is not 0 or 1; using the default ({default})"
