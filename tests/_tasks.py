"""Module-level task functions for tests of strata_ref.tasks (worker
processes import them by name)."""
import os

from strata_ref import tasks


def square_reporting(x):
    """x * x, reporting x units of progress in two parts; the worker's pid."""
    tasks.report(x // 2)
    tasks.report(x - x // 2)
    return x * x, os.getpid()


def fail_on_three(x):
    if x == 3:
        raise ValueError("item three is bad")
    return x
