"""`NotEmulated`: the NotImplementedError of a computation whose llama.cpp
code strata-ref does not emulate yet, with a short phrase of what and
where besides its one-line message (`strata-ref which` lists such a
candidate as "not run (WHAT not emulated WHERE)")."""
from __future__ import annotations

__all__ = ["NotEmulated", "cache_phrase"]


class NotEmulated(NotImplementedError):
    """message: the whole sentence (what, where, what to do instead);
    what: a short noun phrase ("flash attention", "a q8_0 K cache", "the
    Q4_K mat-mul (blk.0.attn_q.weight)"); where: "on this profile", "for
    gemma4", ..."""

    def __init__(self, message: str, what: str, where: str):
        super().__init__(message)
        self.what = what
        self.where = where


def cache_phrase(type_k, type_v, flash_attn: bool) -> str:
    """The words for what of a KV cache is not F16 without flash attention
    ("flash attention and a q8_0 K cache"), type_k / type_v GGMLTypes; ""
    for the F16 cache without flash attention."""
    from .types import GGMLType
    what = [f"{'an' if t.name[0] in 'FI' else 'a'} {t.name.lower()} {kv} cache"
            for t, kv in ((type_k, "K"), (type_v, "V")) if t != GGMLType.F16]
    if flash_attn:
        what.insert(0, "flash attention")
    return " and ".join(what)
