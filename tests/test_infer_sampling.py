"""Sampling filters and chat formatting, by hand."""
from __future__ import annotations

import numpy as np
import pytest

from strata_ref.infer.chat import ChatTemplateError, format_chat, template_family
from strata_ref.infer.sampling import Sampler, greedy


def test_greedy_first_maximum():
    assert greedy(np.array([1.0, 3.0, 3.0, -1.0])) == 1
    assert Sampler(temperature=0.0)(np.array([0.0, 5.0, 1.0])) == 1


def test_top_k_one_is_greedy_and_seed_reproduces():
    logits = np.random.default_rng(0).standard_normal(1000)
    assert all(Sampler(1.0, top_k=1, seed=s)(logits) == int(np.argmax(logits)) for s in range(5))
    a = [Sampler(0.8, top_k=50, top_p=0.9, seed=7)(logits) for _ in range(3)]
    s1, s2 = Sampler(0.8, 50, 0.9, seed=7), Sampler(0.8, 50, 0.9, seed=7)
    assert [s1(logits) for _ in range(20)] == [s2(logits) for _ in range(20)]
    assert len(set(a)) == 1


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # probabilities 0.5, 0.3, 0.2 (untempered): top_p 0.6 keeps the first two only
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    s = Sampler(1.0, top_k=0, top_p=0.6, seed=1)
    draws = {s(logits) for _ in range(400)}
    assert draws == {0, 1}
    s = Sampler(1.0, top_k=0, top_p=0.5, seed=1)
    assert {s(logits) for _ in range(50)} == {0}


def test_top_k_restricts_support():
    logits = np.array([0.0, 0.1, 0.2, 0.3, 5.0, 4.9])
    s = Sampler(5.0, top_k=2, top_p=1.0, seed=3)
    assert {s(logits) for _ in range(300)} == {4, 5}


def test_bad_parameters():
    with pytest.raises(ValueError, match="temperature"):
        Sampler(-1.0)
    with pytest.raises(ValueError, match="top_p"):
        Sampler(1.0, top_p=0.0)


SMOL_T = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
          "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_chatml_with_default_system_from_the_template():
    got = format_chat(SMOL_T, [{"role": "user", "content": "Hi"}])
    assert got == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    # an explicit system message replaces the default
    got = format_chat(SMOL_T, [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])
    assert got == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    # Qwen2.5 writes the newline as a Jinja escape
    qwen_like = "{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}"
    assert format_chat(qwen_like, [{"role": "user", "content": "x"}]).startswith(
        "<|im_start|>system\nYou are Qwen.<|im_end|>\n")


def test_other_families_and_unknown_template():
    g = format_chat("<start_of_turn>", [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])
    assert g == "<start_of_turn>user\nS\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert template_family("... <|start_header_id|> ...") == "llama3"
    with pytest.raises(ChatTemplateError, match="unknown chat template"):
        format_chat("{{ messages }}", [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="no `tokenizer.chat_template`"):
        format_chat(None, [])
