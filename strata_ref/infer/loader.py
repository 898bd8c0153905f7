"""Loading a GGUF file into the `Model` of its architecture: the row of
`archs.ARCHS` names the graph (`ArchSpec.graph`, "module.Class"), whose
module is imported here, on first use.

This module sits above the graphs in the package's import graph: the
graphs import `model`, `layers` and `archs`, never this module
(tests/test_infer_imports.py).
"""
from __future__ import annotations

import importlib

from .. import cpu
from .archs import ARCHS
from .model import Model, architecture

__all__ = ["load", "model_class"]


def model_class(arch: str) -> type:
    """The Model subclass that runs architecture `arch` (ModelLoadError for
    one the spec table has no row for)."""
    architecture({"general.architecture": arch})
    module, name = ARCHS[arch].graph.split(".")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def load(path, profile=None, **cache_options) -> Model:
    """Load a GGUF model file (via `strata_ref.gguf.read`) to run in the CPU
    profile `profile` (a name or `strata_ref.cpu.Profile`; None:
    `strata_ref.cpu.select()`); `cache_options` (type_k, type_v,
    flash_attn, rotate, fa_threads: `KVCache`) become the model's
    `cache_options`. Raises ModelLoadError for what the engine cannot run
    (an architecture without a row in `archs.ARCHS`, a missing or unused
    tensor, a bad hyperparameter), GGUFError for a malformed file,
    ValueError for an unknown profile or a cache option KVCache refuses
    for this model (checked on a one-cell cache)."""
    from .. import gguf
    from .._threads import configure
    prof = cpu.select(profile)
    configure()
    gf = gguf.read(path)
    cls = model_class(architecture(gf.metadata))
    m = cls(gf, path=str(path), profile=prof)
    if cache_options:
        m.cache_options = dict(cache_options)
        m.new_cache(1)
    return m
