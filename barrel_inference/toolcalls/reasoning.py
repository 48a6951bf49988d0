"""Reasoning markers: the pairs that open and close a model's thinking, and their detection."""

from __future__ import annotations

# (start, end), detected in a chat template in this order
THINKING_MARKERS: list[tuple[str, str]] = [("<thinking>", "</thinking>"), ("<think>", "</think>")]


def detect_thinking(template: str | None) -> dict:
    """The manifest's loader keys {'thinking_start', 'thinking_end'}; None when the template shows none."""
    if template:
        for start, end in THINKING_MARKERS:
            if start in template:
                return {"thinking_start": start, "thinking_end": end}
    return {"thinking_start": None, "thinking_end": None}


def starts_in_thinking(prompt_text: str, start: str | None) -> bool:
    """A generation prompt that ends by opening the thinking span (Qwen 3, DeepSeek R1 templates)."""
    return bool(start) and prompt_text.rstrip().endswith(start)
