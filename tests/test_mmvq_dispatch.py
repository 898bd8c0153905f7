"""Mat-vec table / expert-mode selection (kernels.md §9, §12), on the CPU."""
import warnings

import pytest

from strata_ref.native.mmvq import policy as D
from strata_ref.native.mmvq import tables as TB
from strata_ref.types import GGMLType as T


def test_row_classes():
    assert [TB.row_class(n) for n in (1, 2047, 2048, 4095, 4096, 8191, 8192, 12287, 12288,
                                      248320)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_check_tables_facts():
    # mmvq_il_parity check_tables: the sm_70 cell (Q6_K, 2 columns, n_out 2560) is 1;
    # unknown type / ncols give 0; every value is legal; sm_61 is all zeros.
    assert TB.lookup(TB.SM70, T.Q6_K, 2, 2560) == 1
    assert TB.lookup(TB.SHARED, T.Q8_0, 2, 4096) == 0
    assert TB.lookup(TB.SHARED, T.Q4_K, 5, 4096) == 0
    assert TB.lookup(TB.SHARED, T.Q4_K, 1, 4096) == 0
    assert TB.lookup(TB.SHARED, T.IQ4_XS, 3, 12288) == 4
    assert TB.lookup(TB.SHARED, T.Q5_K, 3, 2048) == 4
    for tab in (TB.SHARED, TB.SM70, TB.SM61, TB.H200_MEASURED):
        assert set(tab) == set(TB.IL_TYPES)
        for rows in tab.values():
            assert len(rows) == 3 and all(len(r) == 5 and set(r) <= set(TB.LEGAL_ROWS) for r in rows)
    assert all(v == 0 for rows in TB.SM61.values() for r in rows for v in r)


@pytest.mark.parametrize("cc,name,mode", [(61, "sm_61", 8), (70, None, 0), (75, None, 0),
                                          (80, "shared", 0), (86, "shared", 0),
                                          (90, "shared", 0), (120, "shared", 0), (60, None, 0)])
def test_defaults(cc, name, mode):
    s = D.select_mmvq(cc, {})
    assert (s.table_name, s.exp_mode, s.messages) == (name, mode, ())


def test_sm61_switch_turns_table_and_mode_off():
    s = D.select_mmvq(61, {"STRATA_SM61_TABLE": "0"})
    assert s.table_name is None and s.exp_mode == 0
    assert s.rows_per_warp(T.Q4_K, 3, 4096) == 0


def test_sm70_opt_in():
    s = D.select_mmvq(70, {"STRATA_SM70_TABLE": "1"})
    assert s.table_name == "sm_70" and s.exp_mode == 8
    assert s.rows_per_warp(T.Q4_K, 2, 9000) == 4


def test_il_off_everywhere_and_overrides():
    assert D.select_mmvq(90, {"STRATA_MMVQ_IL": "0"}).rows_per_warp(T.IQ4_XS, 3, 13000) == 0
    s = D.select_mmvq(90, {"STRATA_MMVQ_IL_ROWS": "Q8_0:2:1,1,1,1,1; 14:2:4,4,4,4,4;"
                                                  "q4_k:3:1,2,3,4,0;IQ4_XS:1:2,2,2,2,2"})
    assert s.rows_per_warp(T.Q6_K, 2, 100) == 4               # by id
    assert s.rows_per_warp(T.Q6_K, 3, 5000) == 1              # other row kept
    assert s.rows_per_warp(T.Q4_K, 3, 5000) == 1              # bad entry (3) ignored
    assert s.rows_per_warp(T.IQ4_XS, 1, 100) == 2             # 1-column override
    assert len(s.messages) == 2                               # Q8_0 and the 3


def test_exp_mode_explicit_and_invalid():
    assert D.select_mmvq(90, {"STRATA_EXP_MODE": "8"}).exp_mode == 8
    assert D.select_mmvq(61, {"STRATA_EXP_MODE": "0"}).exp_mode == 0
    for bad in ("3", "yes", "9"):
        s = D.select_mmvq(61, {"STRATA_EXP_MODE": bad})
        assert s.exp_mode == 8 and len(s.messages) == 1
    # empty counts as unset, as for every strata-ref variable: no message
    for empty in ("", " "):
        assert D.select_mmvq(61, {"STRATA_EXP_MODE": empty, "STRATA_SM61_TABLE": empty,
                                  "STRATA_MMVQ_IL": empty}) == D.select_mmvq(61, {})


def test_invalid_flags_warn_once_and_use_default():
    s = D.select_mmvq(61, {"STRATA_SM61_TABLE": "yes", "STRATA_MMVQ_IL": "2"})
    assert s.table_name == "sm_61" and s.exp_mode == 8 and len(s.messages) == 2
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        D.warn_once(s)
        D.warn_once(s)
    assert len(rec) == 2 and all(issubclass(r.category, RuntimeWarning) for r in rec)
