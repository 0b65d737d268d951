"""The emulator's chat template (documented in docs/emulator.md).

Each message renders as ``<|role|>\\n{content} <|end|>\\n``; the generation prompt is
``<|assistant|>\\n``. An earlier answer therefore re-renders as the generation prompt, the answer
text, then `` <|end|>``: with the built-in tokenizer (which cuts at spaces) turn 1's prompt +
answer is a token prefix of turn 2's prompt, its last token included. ``{content}`` is
:meth:`ChatMessage.text`: the text parts (an image part as ``<|image|>``), then an assistant's
tool-call arguments (the text the emulator generated for the call, so a tool call re-renders too).
"""

from __future__ import annotations

from tokenomy.emulator.protocol import ChatMessage

GENERATION_PROMPT = "<|assistant|>\n"


def render(messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
    parts = [f"<|{m.role}|>\n{m.text()} <|end|>\n" for m in messages]
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)
