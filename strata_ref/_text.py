"""Text that reaches a terminal: names and values from a file are escaped.

A GGUF key, tensor name or string value can hold any character, newlines
and terminal escape sequences included; printed raw, one can forge a row of
a table or move the cursor. `printable` escapes what a terminal would act on.
"""
from __future__ import annotations

__all__ = ["printable", "count"]


def _escape(c: str) -> str:
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:       # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{o - 0xDC00:02x}"
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def printable(s: str, backslash: bool = True) -> str:
    """`s` with every character that is not printable (str.isprintable:
    control characters, line and paragraph separators, format characters
    such as bidirectional overrides, lone surrogates) written as a Python
    escape (`\\n` as `\\x0a`, U+202E as `\\u202e`; a byte kept by
    surrogateescape as `\\xNN`). backslash: also double every backslash, so
    that the escaped text tells a real newline from the two characters
    backslash and n (leave it off for text that already holds repr() output).
    Returns a str on one line; plain text comes back unchanged."""
    s = str(s)
    if s.isprintable() and (not backslash or "\\" not in s):
        return s
    return "".join("\\\\" if c == "\\" and backslash else
                   (c if c.isprintable() else _escape(c)) for c in s)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """"1 tensor", "2 tensors", "0 tensors": n and the noun in the number
    n asks for (`plural`: when it is not noun + "s")."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
