"""Environment variables read by libraries strata-ref imports, checked before
those libraries read them.

numba reads NUMBA_NUM_THREADS when it is first imported and raises from deep
inside its threading set-up for a value below 1 (and ignores a value that is
not an integer, with a warning). `numba_env_problem` says what is wrong in
one line naming the variable, so that the command line can refuse it
(exit 2) and the library raise a clear ImportError before numba loads.
"""
from __future__ import annotations

import os

__all__ = ["numba_env_problem", "check_numba_env"]


def numba_env_problem(environ=None) -> str | None:
    """The problem with NUMBA_NUM_THREADS in `environ` (default os.environ),
    or None when it is unset, empty (numba treats both as unset) or a whole
    number >= 1."""
    env = os.environ if environ is None else environ
    v = env.get("NUMBA_NUM_THREADS")
    if v is None or not v.strip():
        return None
    try:
        n = int(v)
    except ValueError:
        n = None
    if n is None or n < 1:
        return (f"NUMBA_NUM_THREADS={v!r} is not a number of threads: give a whole "
                f"number >= 1, or unset it for one thread per CPU")
    return None


def check_numba_env() -> None:
    """Raise ImportError (naming the variable and its value) when
    NUMBA_NUM_THREADS would make numba fail or be ignored."""
    problem = numba_env_problem()
    if problem:
        raise ImportError(problem)
