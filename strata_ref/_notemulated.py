"""`NotEmulated`: the NotImplementedError of a computation whose llama.cpp
code strata-ref does not emulate yet, with a short phrase of what and
where besides its one-line message (`strata-ref which` lists such a
candidate as "not run (WHAT not emulated WHERE)")."""
from __future__ import annotations

__all__ = ["NotEmulated", "cache_phrase", "names_in_order", "types_on_profiles"]


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


def names_in_order(names) -> str:
    """Cache type names ("q8_0", ...) as one list in llama.cpp's order of
    `--cache-type-k` (kv_cache.CACHE_TYPES; names it lacks last, sorted)."""
    from .infer.kv_cache import CACHE_TYPES
    order = list(CACHE_TYPES)
    return ", ".join(sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n)))


def types_on_profiles(table) -> str:
    """{profile: set of cache type names} in words, the profiles with the
    same types named together: "f32, f16, bf16, q8_0 on scalar, avx2; f16
    on v0.4.0-x64, v0.4.0-sse42" (a refusal names what would run without
    listing every profile's types one by one)."""
    groups: dict[frozenset, list[str]] = {}
    for profile, types in table.items():
        groups.setdefault(frozenset(types), []).append(profile)
    return "; ".join(f"{names_in_order(t)} on {', '.join(ps)}" for t, ps in groups.items())
