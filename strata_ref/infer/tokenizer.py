"""Tokenizers built from a GGUF file's `tokenizer.ggml.*` metadata.

Two families, as llama.cpp implements them (ggml-org/llama.cpp
`src/llama-vocab.cpp` and `src/unicode.cpp`, the version vendored by
llama-cpp-python 0.3.36):

- byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the text is split by the
  pre-tokenizer regexes of `tokenizer.ggml.pre`, each piece is mapped to
  GPT-2's printable byte alphabet and merged pair by pair, lowest merge rank
  first (ties: leftmost pair);
- SentencePiece-style (`tokenizer.ggml.model = "llama"`): spaces become
  U+2581, a space is prefixed when `add_space_prefix`, characters are merged
  by highest token score (ties: leftmost), unknown characters fall back to
  `<0xXX>` byte tokens;
- Gemma 4's SentencePiece-style BPE (`tokenizer.ggml.model = "gemma4"`,
  llama.cpp's BPE vocabulary with the `gemma4` pre-tokenizer): spaces
  become U+2581, the text is split into runs of newlines and runs of other
  characters, a run of newlines that is a token is that token, every other
  run is merged pair by pair over its UTF-8 characters (not GPT-2's byte
  alphabet), lowest merge rank first, and a piece left without a token
  falls back to `<0xXX>` byte tokens; BOS is always added (llama.cpp
  overrides `add_bos_token` false for it).

Special tokens (types CONTROL and USER_DEFINED) are cut out of the text
before either algorithm runs; CONTROL tokens only when `parse_special`.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

__all__ = ["Tokenizer", "TokenizerError", "PRE_TOKENIZERS"]


class TokenizerError(ValueError):
    """Tokenizer metadata that is missing, unknown or inconsistent."""


# Token types of `tokenizer.ggml.token_type` (llama.cpp `llama_token_type`).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp's whitespace set (`unicode_set_whitespace` in unicode-data.cpp).
# Python's \s also matches U+001C..U+001F, which llama.cpp does not, so the
# patterns below spell the set out.
_WS = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
_S = f"[{_WS}]"
_NS = f"[^{_WS}]"

# The pre-tokenizer regexes of llama.cpp's `llm_tokenizer_bpe` constructor,
# per pre-tokenizer name. Each list is applied in order: every regex splits
# each piece left by the previous one into matches and the gaps between them.
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = (f"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{{L}}+| ?\\p{{N}}+| ?[^{_WS}\\p{{L}}\\p{{N}}]+"
         f"|{_S}+(?!{_NS})")


def _llama3_like(digits: str, letters: str = "\\p{L}") -> str:
    return (f"{_CONTRACTIONS}|[^\\r\\n\\p{{L}}\\p{{N}}]?[{letters}]+|\\p{{N}}{digits}"
            f"| ?[^{_WS}{letters}\\p{{N}}]+[\\r\\n]*|{_S}*[\\r\\n]+|{_S}+(?!{_NS})|{_S}+")


# llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O regex, the form it runs (upper /
# lower case as "a letter that is not a-z / A-Z", so every non-ASCII letter
# counts as both, as in its collapsed-text matching)
_UPPERISH = "(?:(?=\\p{L})[^a-z])"
_LOWERISH = "(?:(?=\\p{L})[^A-Z])"
_GPT4O = (f"[^\\r\\n\\p{{L}}\\p{{N}}]?{_UPPERISH}*{_LOWERISH}+{_CONTRACTIONS}?"
          f"|[^\\r\\n\\p{{L}}\\p{{N}}]?{_UPPERISH}+{_LOWERISH}*{_CONTRACTIONS}?"
          f"|\\p{{N}}{{1,3}}| ?[^{_WS}\\p{{L}}\\p{{N}}]+[\\r\\n/]*|{_S}*[\\r\\n]+|{_S}+(?!{_NS})|{_S}+")

# deepseek-llm's letter class, as llama-vocab.cpp spells it (literal
# characters and ranges, no \p{..}: matched by code point value)
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
    "\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943")
# llama.cpp's kimi-k2 regex list is this one trigger, which unicode.cpp
# replaces by its own splitter (`_kimi_k2_split` here)
_KIMI_K2 = "\\p{Han}+"

PRE_TOKENIZERS: dict[str, list[str]] = {
    "gpt-2": [_GPT2],
    "mpt": [_GPT2],
    "falcon": ["[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2, "[0-9][0-9][0-9]"],
    "smollm": ["\\p{N}", _GPT2],
    "starcoder": ["\\p{N}", _GPT2],
    "llama-bpe": [_llama3_like("{1,3}")],
    "qwen2": [_llama3_like("")],
    "qwen35": [_llama3_like("", "\\p{L}\\p{M}")],
    "gpt-4o": [_GPT4O],
    # DeepSeek's pre-tokenizers. llama.cpp runs a regex without \p{..}
    # categories through std::wregex on the text in which every non-ASCII
    # whitespace character is replaced by U+000B (`_split` does the same),
    # so the U+3000 of deepseek-llm's punctuation class and the whitespace
    # characters inside the CJK ranges match only as whitespace; `$` is
    # std::regex's end of input (\Z here).
    "deepseek-llm": ["[\r\n]",
                     f"{_S}?[{_DEEPSEEK_LLM_LETTERS}]+",
                     f"{_S}?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                     f"{_S}+\\Z",
                     "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
                     "\\p{N}+"],
    "deepseek-coder": ["[\r\n]",
                       f"{_S}?\\p{{L}}+",
                       f"{_S}?\\p{{P}}+",
                       "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
                       "\\p{N}"],
    "deepseek-v3": ["\\p{N}{1,3}",
                    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
                     "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                     f"| ?[\\p{{P}}\\p{{S}}]+[\r\n]*|{_S}*[\r\n]+|{_S}+(?!{_NS})|{_S}+")],
    # llama.cpp's trigger regex for its own kimi-k2 splitter (`_kimi_k2_split`)
    "kimi-k2": [_KIMI_K2],
}
# Names llama.cpp maps to the same pre-tokenizer type.
_PRE_ALIASES = {"llama3": "llama-bpe", "llama-v3": "llama-bpe", "phi-2": "gpt-2",
                "deepseek-r1-qwen": "qwen2", "refact": "smollm", "command-r": "smollm",
                "codeshell": "smollm", "llama4": "gpt-4o", "kanana2": "gpt-4o", "talkie": "gpt-4o",
                "minimax-m2": "gpt-4o", "hunyuan-dense": "deepseek-v3", "hy_v4": "deepseek-v3",
                "joyai-llm": "deepseek-v3"}
# Pre-tokenizers for which llama.cpp takes a whole piece as one token when the
# vocabulary has it (`ignore_merges`), and which add BOS by default.
_IGNORE_MERGES = {"llama-bpe"}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet):
    printable Latin-1 bytes map to themselves, the other bytes to U+0100 + n
    in byte order."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD))
            + list(range(0xAE, 0x100)))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


_BYTE_TO_CHAR = _bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _regex():
    try:
        import regex
    except ImportError as e:  # pragma: no cover - dependency
        raise TokenizerError("the byte-level BPE tokenizer needs the `regex` "
                             "package (pip install regex)") from e
    return regex


# llama.cpp matches its regexes on a copy of the text in which every
# non-ASCII whitespace character is U+000B (the collapsed text of the \p{..}
# regexes and the wide text of the others alike); the same copy here
_VT = {c: "\x0b" for c in (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                           0x202F, 0x205F, 0x3000)}


def _split(text: str, patterns) -> list[str]:
    """Split `text` by each compiled pattern (or splitter function) in turn,
    keeping matches and gaps (llama.cpp `unicode_regex_split`)."""
    shadow = text.translate(_VT)
    spans = [(0, len(text))]
    for pat in patterns:
        out = []
        for s, e in spans:
            if callable(pat):
                for n in pat(text[s:e]):
                    out.append((s, s + n))
                    s += n
                continue
            pos = s
            for m in pat.finditer(shadow[s:e]):
                a, b = s + m.start(), s + m.end()
                if a > pos:
                    out.append((pos, a))
                if b > a:
                    out.append((a, b))
                pos = b
            if pos < e:
                out.append((pos, e))
        spans = out
    return [text[a:b] for a, b in spans]


def _han(c: str) -> bool:
    """llama.cpp `unicode_cpt_is_han`: the CJK ideograph blocks only."""
    o = ord(c)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2A6DF
            or 0x2A700 <= o <= 0x2EBEF or 0xF900 <= o <= 0xFAFF or 0x2F800 <= o <= 0x2FA1F)


_CLASS_CACHE: dict = {}


def _cls(c: str) -> int:
    r"""1 letter (\p{L}), 2 number (\p{N}), 3 llama.cpp whitespace, 0 other."""
    k = _CLASS_CACHE.get(c)
    if k is None:
        rx = _regex()
        k = (3 if c in _WS_CHARS else 1 if rx.match(r"\p{L}", c) else 2 if rx.match(r"\p{N}", c)
             else 0)
        if len(_CLASS_CACHE) < 100_000:
            _CLASS_CACHE[c] = k
    return k


_WS_CHARS = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
                      + "".join(map(chr, range(0x2000, 0x200B))))


def _kimi_k2_split(text: str) -> list[int]:
    r"""Piece lengths (code points) of llama.cpp's kimi-k2 splitter
    (`unicode_regex_split_custom_kimi_k2`), step for step. It is not the
    HF regex it is named after: a letter run is any \p{L} that is not Han
    (no upper / lower case split, no \p{M}), a combining mark counts as
    punctuation, digits go in threes from the left."""
    n = len(text)
    out = []
    prev = 0

    def cls(i):
        return _cls(text[i]) if i < n else -1      # -1: past the end (no flags)

    def letter(i):
        return i < n and cls(i) == 1 and not _han(text[i])

    def add(end):
        nonlocal prev
        if end > prev:
            out.append(end - prev)
        prev = end

    pos = 0
    while pos < n:
        c = text[pos]
        k = cls(pos)
        if _han(c):                                   # [\p{Han}]+
            while pos < n and _han(text[pos]):
                pos += 1
            add(pos)
            continue
        lead_ok = not (c in "\r\n" or k in (1, 2))
        if (k == 1) or (lead_ok and letter(pos + 1)):  # letters, optional lead, contraction
            if lead_ok:
                pos += 1
            while letter(pos):
                pos += 1
            if pos < n and text[pos] == "'" and pos + 1 < n:
                c1 = text[pos + 1].lower() if text[pos + 1].isascii() else ""
                if c1 in ("s", "t", "m", "d"):
                    pos += 2
                elif pos + 2 < n:
                    c2 = text[pos + 2].lower() if text[pos + 2].isascii() else ""
                    if (c1, c2) in (("r", "e"), ("v", "e"), ("l", "l")):
                        pos += 3
            add(pos)
            continue
        if k == 2:                                    # \p{N}{1,3}
            ini = pos
            while cls(pos) == 2:
                pos += 1
                if pos - ini >= 3:
                    add(pos)
                    ini = pos
            add(pos)
            continue
        k2 = cls(pos + 1) if c == " " else k          # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        if k2 == 0:
            pos += c == " "
            while cls(pos) == 0:
                pos += 1
            while pos < n and text[pos] in "\r\n":
                pos += 1
            add(pos)
            continue
        nws, last_rn = 0, 0
        while cls(pos + nws) == 3:
            if text[pos + nws] in "\r\n":
                last_rn = pos + nws + 1
            nws += 1
        if last_rn > 0:                               # \s*[\r\n]+
            pos = last_rn
        elif nws > 1 and pos + nws < n:               # \s+(?!\S)
            pos += nws - 1
        elif nws > 0:                                 # \s+
            pos += nws
        else:
            pos += 1
        add(pos)
    return out


# ------------------------------------------------------------ metadata types
# What `strata_ref.gguf.read` gives for each GGUF value type: str (STRING),
# bool (BOOL), int (integers), float (FLOAT32/64), a 1-D numpy array (an
# array of numbers or bools), a list of str (an array of strings), a list of
# lists or arrays (an array of arrays).

def _what(v) -> str:
    """The GGUF-level type of a metadata value, for messages."""
    import numpy as np
    if isinstance(v, (bool, np.bool_)):
        return "a BOOL"
    if isinstance(v, str):
        return "a STRING"
    if isinstance(v, (int, np.integer)):
        return "an integer"
    if isinstance(v, (float, np.floating)):
        return "a float"
    if isinstance(v, np.ndarray):
        return f"an array of {v.dtype.name.upper()}"
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, str) for x in v):
            return "an array of STRING"
        if any(isinstance(x, (list, tuple, np.ndarray)) for x in v):
            return "an array of arrays"
        return "an array" if v else "an empty array"
    return type(v).__name__


def _is_hex(s: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in s)


def _need_str(md, key: str) -> str:
    if key not in md:
        raise TokenizerError(f"GGUF metadata has no `{key}`")
    return _opt_str(md, key, None)


def _opt_str(md, key: str, default):
    v = md.get(key, default)
    if not isinstance(v, str):
        raise TokenizerError(f"`{key}` must be a STRING, the file has {_what(v)}")
    return v


def _strings(md, key: str, required: bool) -> list | None:
    """An array of strings as a list of str (None when absent and not required)."""
    if key not in md:
        if required:
            raise TokenizerError(f"GGUF metadata has no `{key}`")
        return None
    v = md[key]
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise TokenizerError(f"`{key}` must be an array of STRING, the file has {_what(v)}")
    return list(v)


def _numbers(md, key: str, n: int, kind: str):
    """An array of `n` numbers of `kind` ("i": integers, "f": floats) as a
    numpy array, None when absent."""
    import numpy as np
    if key not in md:
        return None
    v = md[key]
    a = v if isinstance(v, np.ndarray) else None
    if a is None and isinstance(v, (list, tuple)) and all(
            isinstance(x, (int, float, np.integer, np.floating))
            and not isinstance(x, (bool, np.bool_)) for x in v):
        a = np.asarray(v)           # a list from a caller, not from the reader
    want = "INT32" if kind == "i" else "FLOAT32"
    if a is None or a.ndim != 1 or (a.size and (a.dtype.kind not in ("iu" if kind == "i" else "f"))):
        raise TokenizerError(f"`{key}` must be an array of {want}, the file has {_what(v)}")
    if a.size != n:
        raise TokenizerError(f"`{key}` has {a.size} values, `tokenizer.ggml.tokens` has {n} tokens")
    return a


def _token_types(md, n: int) -> list[int]:
    import numpy as np
    a = _numbers(md, "tokenizer.ggml.token_type", n, "i")
    if a is None:
        return [NORMAL] * n
    bad = np.flatnonzero((a < 0) | (a > BYTE))
    if bad.size:
        i = int(bad[0])
        raise TokenizerError(f"`tokenizer.ggml.token_type`[{i}] = {int(a[i])} is not a token "
                             f"type (0..{BYTE})")
    return [int(t) for t in a]


def _scores(md, n: int) -> list[float] | None:
    import numpy as np
    a = _numbers(md, "tokenizer.ggml.scores", n, "f")
    if a is None:
        return None
    bad = np.flatnonzero(np.isnan(a))
    if bad.size:
        raise TokenizerError(f"`tokenizer.ggml.scores`[{int(bad[0])}] is NaN")
    return [float(s) for s in a]


def _opt_id(md, key: str, n: int) -> int | None:
    import numpy as np
    if key not in md:
        return None
    v = md[key]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TokenizerError(f"`{key}` must be an integer token id, the file has {_what(v)}"
                             + (f" ({v!r})" if isinstance(v, (float, str)) else ""))
    v = int(v)
    if not 0 <= v < n:
        raise TokenizerError(f"`{key}` = {v} is outside the vocabulary (size {n})")
    return v


def _opt_bool(md, key: str, default: bool) -> bool:
    import numpy as np
    v = md.get(key, default)
    if not isinstance(v, (bool, np.bool_)):
        # llama.cpp refuses another type; a STRING "false" is not false
        raise TokenizerError(f"`{key}` must be a BOOL, the file has {_what(v)}"
                             + (f" ({v!r})" if isinstance(v, (int, float, str)) else ""))
    return bool(v)


@dataclass
class Tokenizer:
    """A GGUF vocabulary with llama.cpp's encode and decode.

    Build with `Tokenizer.from_metadata(md)` where `md` maps GGUF keys to
    Python values. `encode(text, add_special=True, parse_special=False)`
    returns a list of int token ids; `decode_bytes(ids)` the UTF-8 bytes.
    """
    model: str
    pre: str
    tokens: list
    types: list
    scores: list | None
    merges: dict
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog_ids: frozenset = frozenset()
    _index: dict = field(default_factory=dict, repr=False)
    _patterns: list = field(default_factory=list, repr=False)
    _specials: list = field(default_factory=list, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    # ----------------------------------------------------------- loading
    @classmethod
    def from_metadata(cls, md) -> "Tokenizer":
        """Read `tokenizer.ggml.*` keys (as `strata_ref.gguf.read` returns
        them: str, int, float, bool, a numpy array of numbers, a list of str).

        Raises TokenizerError naming the key for a missing key, an
        unsupported model or pre-tokenizer, and a value of the wrong type or
        length (llama.cpp's types: model, pre and every token and merge are
        strings; token_type an integer array, scores a float array, both
        one value per token; the ids integers inside the vocabulary; the
        add_* flags bools)."""
        model = _need_str(md, "tokenizer.ggml.model")
        tokens = _strings(md, "tokenizer.ggml.tokens", required=True)
        n = len(tokens)
        if n == 0:
            raise TokenizerError("`tokenizer.ggml.tokens` is empty")
        types = _token_types(md, n)
        scores = _scores(md, n)
        merges, pre = {}, ""
        if model == "gpt2":
            pre = _opt_str(md, "tokenizer.ggml.pre", "default")
            pre = _PRE_ALIASES.get(pre, pre)
            if pre not in PRE_TOKENIZERS:
                raise TokenizerError(
                    f"unsupported pre-tokenizer `tokenizer.ggml.pre` = {pre!r}; "
                    f"supported: {', '.join(sorted({*PRE_TOKENIZERS, *_PRE_ALIASES}))}")
            # llama.cpp lets a kimi-k2 vocabulary go without merges
            for rank, m in enumerate(_strings(md, "tokenizer.ggml.merges",
                                              required=pre != "kimi-k2") or []):
                a, sep, b = m.partition(" ")
                if not sep:
                    raise TokenizerError(f"malformed BPE merge #{rank} of "
                                         f"`tokenizer.ggml.merges`: {m!r} (no space)")
                merges[(a, b)] = rank
            add_bos_default = pre in _IGNORE_MERGES
            add_space_prefix = False
        elif model == "gemma4":
            for rank, m in enumerate(_strings(md, "tokenizer.ggml.merges", required=True)):
                # llama.cpp splits at the first space after the first
                # character and keeps a pair's first rank (`emplace`)
                i = m.find(" ", 1)
                merges.setdefault((m[:i], m[i + 1:]) if i >= 0 else ("", ""), rank)
            pre = "gemma4"
            add_bos_default = True
            add_space_prefix = False
        elif model == "llama":
            if scores is None:
                raise TokenizerError("GGUF metadata has no `tokenizer.ggml.scores` "
                                     "(needed by the SentencePiece tokenizer)")
            add_bos_default = True
            add_space_prefix = True
        else:
            raise TokenizerError(f"unsupported tokenizer model `tokenizer.ggml.model` = "
                                 f"{model!r}; supported: gpt2 (byte-level BPE), llama (SentencePiece), "
                                 f"gemma4 (SentencePiece-style BPE)")

        def opt_id(key):
            return _opt_id(md, key, n)

        bos, eos = opt_id("tokenizer.ggml.bos_token_id"), opt_id("tokenizer.ggml.eos_token_id")
        eog = {i for i in (eos, opt_id("tokenizer.ggml.eot_token_id"),
                           opt_id("tokenizer.ggml.eom_token_id")) if i is not None}
        # llama.cpp also ends generation on these control tokens when present.
        for i, t in enumerate(tokens):
            if types[i] == CONTROL and t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>",
                                             "<end_of_turn>", "<|end|>", "<|eom_id|>",
                                             "<|return|>", "<|call|>", "<eos>", "<turn|>"):
                eog.add(i)
        # gpt-oss's harmony format: with <|return|> and <|call|> ending
        # generation, <|end|> only ends a message (llama.cpp drops it)
        names = {tokens[i] for i in eog}
        if {"<|return|>", "<|call|>", "<|end|>"} <= names:
            eog = {i for i in eog if tokens[i] != "<|end|>"}
        add_bos = _opt_bool(md, "tokenizer.ggml.add_bos_token", add_bos_default)
        if model == "gemma4":
            add_bos = True      # llama.cpp's override for the gemma4 pre-tokenizer
        tok = cls(model=model, pre=pre, tokens=tokens, types=types,
                  scores=scores, merges=merges, bos_id=bos, eos_id=eos,
                  add_bos=add_bos,
                  add_eos=_opt_bool(md, "tokenizer.ggml.add_eos_token", False),
                  add_space_prefix=_opt_bool(md, "tokenizer.ggml.add_space_prefix",
                                             add_space_prefix),
                  eog_ids=frozenset(eog))
        tok._build()
        return tok

    def _build(self) -> None:
        self._index = {t: i for i, t in enumerate(self.tokens)}
        if self.model == "gpt2":
            rx = _regex()
            self._patterns = [_kimi_k2_split if p == _KIMI_K2 else rx.compile(p)
                              for p in PRE_TOKENIZERS[self.pre]]
        elif self.model == "gemma4":
            self._patterns = [_regex().compile("[^\n]+|[\n]+")]
        # llama.cpp tries longer special tokens first.
        sp = [(t, i, self.types[i]) for i, t in enumerate(self.tokens)
              if self.types[i] in (CONTROL, USER_DEFINED, UNKNOWN) and t]
        self._specials = sorted(sp, key=lambda s: -len(s[0]))

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    # ----------------------------------------------------------- encoding
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text` (llama.cpp `llama_tokenize`). With add_special,
        BOS is prepended when the file's add_bos flag says so, and never twice:
        a text already starting with BOS (parsed as special) gets no second.
        That last rule is strata-ref's: `llama_tokenize` keeps both and logs
        a warning (`check_double_bos_eos`), and llama-cpp-python's chat path
        adds none (`add_bos=not added_special`), leaving BOS to the
        template's text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"text is not valid Unicode: a lone surrogate U+{ord(text[e.start]):04X} "
                             f"at character {e.start}") from None
        out: list[int] = []
        fragments = self._partition(text, parse_special) if text else []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise TokenizerError("`tokenizer.ggml.add_bos_token` is true but the file has "
                                     "no `tokenizer.ggml.bos_token_id`")
            out.append(self.bos_id)
        prev_special = True
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if self.model == "gpt2":
                self._encode_bpe(frag, out)
            elif self.model == "gemma4":
                self._encode_gemma4(frag, out)
            else:
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._encode_spm(frag, out)
            prev_special = False
        if add_special and self.add_bos and len(out) >= 2 and out[1] == self.bos_id:
            del out[0]  # never a doubled BOS
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        frags: list = [text]
        for t, i, ty in self._specials:
            if not parse_special and ty != USER_DEFINED:
                continue
            nxt = []
            for f in frags:
                if isinstance(f, int) or t not in f:
                    nxt.append(f)
                    continue
                parts = f.split(t)
                for k, p in enumerate(parts):
                    if k:
                        nxt.append(i)
                    if p:
                        nxt.append(p)
            frags = nxt
        return frags

    def _encode_bpe(self, text: str, out: list[int]) -> None:
        for piece in _split(text, self._patterns):
            word = "".join(_BYTE_TO_CHAR[b] for b in piece.encode("utf-8"))
            ids = self._cache.get(word)
            if ids is None:
                ids = self._bpe_word(word)
                if len(self._cache) < 100_000:
                    self._cache[word] = ids
            out.extend(ids)

    def _encode_gemma4(self, text: str, out: list[int]) -> None:
        idx = self._index
        for word in _split(text.replace(" ", "\u2581"), self._patterns):
            ids = self._cache.get(word)
            if ids is None:
                if not word.strip("\n") and word in idx:
                    ids = [idx[word]]          # a run of newlines that is a token
                else:
                    ids = self._bpe_word(word)
                if len(self._cache) < 100_000:
                    self._cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> list[int]:
        idx = self._index
        if self.pre in _IGNORE_MERGES and word in idx:
            return [idx[word]]
        syms = list(word)
        alive = [True] * len(syms)
        nxt = list(range(1, len(syms))) + [-1]
        prv = list(range(-1, len(syms) - 1))
        heap = []

        def push(left, right):
            if left >= 0 and right >= 0:
                r = self.merges.get((syms[left], syms[right]))
                if r is not None:
                    heapq.heappush(heap, (r, left, right, syms[left] + syms[right]))

        for i in range(len(syms) - 1):
            push(i, i + 1)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            if not (alive[left] and alive[right]) or nxt[left] != right \
                    or syms[left] + syms[right] != text:
                continue
            syms[left] = text
            alive[right] = False
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        ids = []
        for s, a in zip(syms, alive):
            if not a:
                continue
            t = idx.get(s)
            if t is not None:
                ids.append(t)
            elif self.model == "gemma4":      # byte fallback: <0xXX> per UTF-8 byte
                ids.extend(idx[b] for b in (f"<0x{c:02X}>" for c in s.encode("utf-8")) if b in idx)
            else:  # unknown merge result: fall back to one token per byte
                ids.extend(idx[c] for c in s if c in idx)
        return ids

    def _encode_spm(self, text: str, out: list[int]) -> None:
        text = text.replace(" ", "\u2581")
        idx, scores = self._index, self.scores
        syms = list(text)
        alive = [True] * len(syms)
        nxt = list(range(1, len(syms))) + [-1]
        prv = list(range(-1, len(syms) - 1))
        heap = []

        def push(left, right):
            if left >= 0 and right >= 0:
                t = idx.get(syms[left] + syms[right])
                if t is not None:
                    heapq.heappush(heap, (-scores[t], left, right, len(syms[left]) + len(syms[right])))

        for i in range(len(syms) - 1):
            push(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not (alive[left] and alive[right]) or nxt[left] != right \
                    or len(syms[left]) + len(syms[right]) != size:
                continue
            syms[left] += syms[right]
            alive[right] = False
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        for s, a in zip(syms, alive):
            if not a:
                continue
            t = idx.get(s)
            if t is not None:
                out.append(t)
                continue
            for b in s.encode("utf-8"):
                bt = idx.get(f"<0x{b:02X}>")
                if bt is not None:
                    out.append(bt)

    # ----------------------------------------------------------- decoding
    def piece_bytes(self, token_id: int, special: bool = False) -> bytes:
        """The bytes token `token_id` stands for (llama.cpp
        `llama_token_to_piece`): control tokens give b"" unless `special`."""
        if not 0 <= token_id < len(self.tokens):
            raise ValueError(f"token id {token_id} outside the vocabulary (size {len(self.tokens)})")
        t, ty = self.tokens[token_id], self.types[token_id]
        # a token that is not UTF-8 in the file (read with surrogateescape)
        # gives back its own bytes
        if ty in (CONTROL, UNKNOWN, UNUSED):
            return t.encode("utf-8", "surrogateescape") if special else b""
        if ty == USER_DEFINED:
            return t.encode("utf-8", "surrogateescape")
        if self.model == "gpt2":
            return bytes(_CHAR_TO_BYTE.get(c, 0x3F) for c in t)
        if ty == BYTE and len(t) == 6 and t.startswith("<0x") and _is_hex(t[3:5]):
            return bytes([int(t[3:5], 16)])
        return t.replace("\u2581", " ").encode("utf-8", "surrogateescape")

    def decode_bytes(self, ids, special: bool = False) -> bytes:
        """Concatenated `piece_bytes` of `ids`."""
        return b"".join(self.piece_bytes(int(i), special) for i in ids)

    def decode(self, ids, special: bool = False) -> str:
        """`decode_bytes` as text (invalid UTF-8 replaced)."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")
