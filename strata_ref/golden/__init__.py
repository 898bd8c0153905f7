"""The golden files and what they are made of: the synthetic corpus
(`corpus`), the JSON files of corpus and model hashes (`files`), and the
comparison of another engine's dump with the oracle (`dumps`). The
command-line side (`strata-ref golden`, `compare`) is `strata_ref.cli`'s.
"""
from __future__ import annotations

from .corpus import (CORPUS_SEED, CORPUS_TYPES, CORPUS_VERSION, OUT_KINDS, QUANT_TYPES, Case, QuantCase,
                     case_hashes, case_output, corpus_cases, corpus_types, mask_undefined, quant_cases,
                     sane_blocks)
from .dumps import compare_dump
from .files import (FORMAT_VERSION, MODEL_FORMAT_VERSION, check_corpus, check_model_golden,
                    default_golden_dir, make_corpus, make_model_golden, write_golden_json)

__all__ = ["CORPUS_SEED", "CORPUS_VERSION", "FORMAT_VERSION", "MODEL_FORMAT_VERSION", "OUT_KINDS",
           "CORPUS_TYPES", "QUANT_TYPES", "Case", "QuantCase", "corpus_cases", "quant_cases", "corpus_types",
           "case_output", "case_hashes", "make_corpus", "check_corpus", "make_model_golden",
           "check_model_golden", "compare_dump", "default_golden_dir", "sane_blocks", "mask_undefined",
           "write_golden_json"]
