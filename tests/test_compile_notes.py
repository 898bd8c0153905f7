"""The first-run compile notes (`strata_ref._compile_notes`): said when numba
really compiles, silent on a cache hit or with STRATA_REF_QUIET_COMPILE=1."""
import logging

import numpy as np
import pytest

from strata_ref import _compile_notes as notes
from strata_ref.cli import main


def _fresh():
    from numba import njit

    @njit(cache=False)
    def strata_ref_probe_fn(x):
        return x * 2 + 1
    return strata_ref_probe_fn


def test_a_compile_is_noted_once_with_its_name_and_summed(monkeypatch, caplog):
    monkeypatch.delenv("STRATA_REF_QUIET_COMPILE", raising=False)
    notes.install()
    caplog.set_level(logging.INFO, logger="strata_ref.compile")
    f, g = _fresh(), _fresh()
    assert f(np.int64(3)) == 7          # compiles: the note names the function
    assert g(np.float64(1.5)) == 4.0    # a second compile: no second note
    assert f(np.int64(4)) == 9          # the same signature again: no compile
    lines = [r.getMessage() for r in caplog.records if r.name == "strata_ref.compile"]
    assert len(lines) == 1 and "strata_ref_probe_fn" in lines[0] and "cached on disk" in lines[0]
    n, s = notes.stats()
    assert n == 2 and s > 0
    notes.log_summary()
    last = caplog.records[-1].getMessage()
    assert last.startswith("compiled 2 functions in ") and last.endswith("from numba's cache")


def test_quiet_switch_silences_the_notes(monkeypatch, caplog):
    monkeypatch.delenv("STRATA_REF_QUIET_COMPILE", raising=False)
    notes.install()
    monkeypatch.setenv("STRATA_REF_QUIET_COMPILE", "1")
    caplog.set_level(logging.INFO, logger="strata_ref.compile")
    notes.reset()
    assert _fresh()(np.int64(1)) == 3
    assert notes.stats() == (0, 0.0)
    notes.log_summary()
    assert not [r for r in caplog.records if r.name == "strata_ref.compile"]


def test_a_bad_quiet_value_is_refused_by_name(monkeypatch, capsys):
    monkeypatch.setenv("STRATA_REF_QUIET_COMPILE", "yes")
    assert main(["info", "x.gguf"]) == 2
    assert "STRATA_REF_QUIET_COMPILE='yes' is not a switch value" in capsys.readouterr().err
