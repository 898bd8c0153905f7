"""Prompt sets for the quality measurements: a default set written for
strata-ref, and user files of text lines or JSON lines.

The default set mixes what quantization errors show up in: short factual
completions (a near-tie decides them), continuing prose, code, arithmetic,
lists, translation, dialogue, and instructions for the chat-tuned models.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DEFAULT_PROMPTS", "load_prompts", "PromptError"]

DEFAULT_PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "The three primary colors are",
    "In 1969, the first humans to walk on the Moon were",
    "The largest planet in our solar system is",
    "Photosynthesis is the process by which plants",
    "A good way to start the morning is",
    "Once upon a time, in a small village by the sea, there lived",
    "The old lighthouse keeper climbed the stairs and saw",
    "She opened the letter slowly, afraid of what it might say.",
    "The recipe for a simple tomato soup begins with",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import numpy as np\n\n# compute the mean of each row of a matrix\n",
    "SELECT name, COUNT(*) FROM orders",
    "for (int i = 0; i < n; i++) {",
    "2 + 2 = 4, 3 + 5 = 8, 7 + 6 =",
    "The square root of 144 is",
    "If a train travels 60 miles in one hour, in three hours it travels",
    "Here is a list of fruits: apple, banana,",
    "Monday, Tuesday, Wednesday,",
    "Translate to French: Good morning, how are you? ->",
    "The German word for 'house' is",
    "Q: What is the boiling point of water in Fahrenheit?\nA:",
    "Q: Who wrote Romeo and Juliet?\nA:",
    "User: Can you recommend a book about space?\nAssistant:",
    "Write a haiku about autumn leaves.",
    "Explain in one sentence why the sky is blue.",
    "Give three tips for learning a new language.",
    "Summarize the plot of Cinderella in two sentences.",
    "The main difference between a virus and a bacterium is",
    "Dear hiring manager, I am writing to apply for",
    "The stock market fell sharply today after",
    "To install the package, run the following command:",
    "The mitochondria is often called",
    "A triangle with sides 3, 4 and 5 is",
    "Breaking news: scientists have discovered",
)


class PromptError(ValueError):
    """A prompt file that cannot be read as prompts (names the line)."""


#: the largest prompt file `load_prompts` reads (64 MiB)
MAX_PROMPT_FILE = 64 << 20


def load_prompts(path) -> list:
    """Prompts from a file: JSON lines (each an object with a string
    "prompt", or a JSON string) when the first non-empty line starts with
    `{` or `"`, else one prompt per non-empty text line (with `\\n`
    standing for a newline). Returns a list of str. Raises PromptError
    naming the line for a malformed JSON line, a missing or non-string
    prompt, a file with no prompt or one that is not UTF-8 text; OSError
    when it cannot be read. A text file whose first prompt starts with `{`
    or `"` is read as JSON lines, so write such prompts as JSON lines.
    Only a regular file of at most MAX_PROMPT_FILE bytes is read (PromptError
    otherwise): `/dev/zero` was read until memory ran out."""
    p = Path(path)
    import os
    import stat
    st = os.stat(p)
    if not stat.S_ISREG(st.st_mode):
        raise PromptError(f"{p}: not a regular file")
    if st.st_size > MAX_PROMPT_FILE:
        raise PromptError(f"{p}: {st.st_size} bytes, more than a prompt file may hold "
                          f"({MAX_PROMPT_FILE} bytes)")
    try:
        text = p.read_text(encoding="utf-8-sig")     # a UTF-8 byte-order mark is not prompt text
    except UnicodeDecodeError as e:
        raise PromptError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    if not lines:
        raise PromptError(f"{p}: no prompt in the file")
    as_json = lines[0][1].lstrip()[:1] in ("{", '"')
    out = []
    for no, ln in lines:
        if not as_json:
            out.append(ln.replace("\\n", "\n"))
            continue
        try:
            v = json.loads(ln)
        except json.JSONDecodeError as e:
            raise PromptError(f"{p}:{no}: not a JSON line ({e.msg})") from None
        if isinstance(v, dict):
            v = v.get("prompt")
        if not isinstance(v, str) or not v:
            raise PromptError(f"{p}:{no}: a JSON line needs a non-empty string \"prompt\"")
        out.append(v)
    return out
