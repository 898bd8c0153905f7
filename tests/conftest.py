"""Settings for the whole test suite.

STRATA_REF_QUIET_COMPILE=1: the first-run compile notes of the command line
(`strata_ref._compile_notes`) depend on which kernels earlier tests compiled
into numba's cache, so tests that check a command's stderr would pass or
fail with the test order. Set here so that the CLI subprocesses inherit it;
tests/test_compile_notes.py checks the notes with it unset.
"""
import os

os.environ.setdefault("STRATA_REF_QUIET_COMPILE", "1")
