"""Large inputs are quantized in parallel slices: same bytes as block by block."""
import numpy as np
import pytest

import strata_ref as sr
from strata_ref.formats import _qdrive


@pytest.mark.parametrize("t", ["Q4_0", "Q8_0", "TQ2_0"])
def test_threaded_equals_serial(t, monkeypatch):
    x = np.random.default_rng(1).standard_normal(64 * 256 * 8).astype(np.float32)
    serial = sr.quantize(x, t)
    monkeypatch.setattr(_qdrive, "_MIN_BLOCKS_PER_THREAD", 16)
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    assert np.array_equal(sr.quantize(x, t), serial)


def test_threaded_reports_first_nonfinite(monkeypatch):
    monkeypatch.setattr(_qdrive, "_MIN_BLOCKS_PER_THREAD", 16)
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    x = np.zeros(32 * 300, np.float32)
    x[32 * 250 + 3] = np.inf
    x[32 * 290] = np.nan
    with pytest.raises(ValueError, match="8003"):
        sr.quantize(x, "Q8_0")
