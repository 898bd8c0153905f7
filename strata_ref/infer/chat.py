"""Chat prompts from a GGUF file's `tokenizer.chat_template`.

No Jinja engine is used: the template is recognised by family and a
formatter reproduces what that family's template renders for a list of
messages plus the assistant generation prompt. Families:

- ChatML (`<|im_start|>`: SmolLM2, Qwen2.5, Qwen3): each message is
  `<|im_start|>{role}\\n{content}<|im_end|>\\n`; the prompt ends with
  `<|im_start|>assistant\\n`. When the template writes a literal default
  system message (SmolLM2: "You are a helpful AI assistant named SmolLM,
  trained by Hugging Face"; Qwen2.5: "You are Qwen, created by Alibaba
  Cloud. You are a helpful assistant."), that message is read from the
  template and inserted when the conversation has no system message.
- Gemma (`<start_of_turn>`): `<start_of_turn>user\\n...<end_of_turn>\\n`, the
  assistant role is `model`, a system message is prefixed to the first user
  turn (followed by a blank line); the prompt ends with
  `<start_of_turn>model\\n`.
- Llama 3 (`<|start_header_id|>`): `<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>`.

Any other template raises ChatTemplateError rather than guessing.
The text returned contains special tokens and must be tokenized with
`parse_special=True`; BOS is left to the tokenizer's add_bos rule.
"""
from __future__ import annotations

import re

__all__ = ["ChatTemplateError", "format_chat", "template_family"]


class ChatTemplateError(ValueError):
    """A chat template that is missing or of an unknown family."""


# The newline is a real one (SmolLM2) or the Jinja escape backslash-n (Qwen2.5).
_CHATML_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\n|\\n)([^{}'\"<\\]*)<\|im_end\|>")


def template_family(template: str | None) -> str:
    """'chatml', 'gemma' or 'llama3'; ChatTemplateError otherwise (also for
    a template that is not a string)."""
    if template is not None and not isinstance(template, str):
        from .tokenizer import _what
        raise ChatTemplateError(f"`tokenizer.chat_template` must be a STRING, the file has "
                                f"{_what(template)}; run without --chat")
    if template == "":
        raise ChatTemplateError("`tokenizer.chat_template` is empty; run without --chat "
                                "and give the raw prompt")
    if not template:
        raise ChatTemplateError("the model has no `tokenizer.chat_template`; "
                                "run without --chat and give the raw prompt")
    if "<|im_start|>" in template:
        return "chatml"
    if "<start_of_turn>" in template:
        return "gemma"
    if "<|start_header_id|>" in template:
        return "llama3"
    raise ChatTemplateError("unknown chat template family in `tokenizer.chat_template` "
                            "(known: ChatML, Gemma, Llama 3); run without --chat and format "
                            "the prompt yourself")


def format_chat(template: str | None, messages: list[dict]) -> str:
    """The prompt text for `messages` (dicts with 'role' and 'content'),
    ending with the assistant generation prompt."""
    fam = template_family(template)
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"a chat message needs 'role' and 'content', got {m!r}")
    if fam == "chatml":
        msgs = list(messages)
        if not msgs or msgs[0]["role"] != "system":
            m = _CHATML_DEFAULT_SYSTEM.search(template)
            if m:
                msgs.insert(0, {"role": "system", "content": m.group(1)})
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
        return body + "<|im_start|>assistant\n"
    if fam == "gemma":
        msgs = list(messages)
        prefix = ""
        if msgs and msgs[0]["role"] == "system":
            prefix = msgs[0]["content"] + "\n\n"
            msgs = msgs[1:]
        out = []
        for i, m in enumerate(msgs):
            role = "model" if m["role"] == "assistant" else m["role"]
            content = (prefix if i == 0 else "") + m["content"].strip()
            out.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
        return "".join(out) + "<start_of_turn>model\n"
    body = "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>"
                   for m in messages)
    return body + "<|start_header_id|>assistant<|end_header_id|>\n\n"
