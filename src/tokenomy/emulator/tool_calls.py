"""The emulator's tool calls: deterministic, so that agent tests can run tool loops.

When a request has tools and its tool choice forces a call (chat ``required`` or a named function;
Anthropic ``any`` / ``tool``; Responses ``required`` / a function), the answer is one call:

* the tool: the named one, or for ``required`` one drawn by the same PRNG as the text
  (:func:`tokenomy.emulator.generation.plan_output`): seeded with the request's ``seed``, else the
  prompt's hash, so the same prompt calls the same tool with the same arguments;
* the arguments: a JSON object built from the tool's JSON schema (:func:`arguments_for`), written
  as ``json.dumps`` writes it (what vLLM writes, and what an Anthropic client's ``input``
  re-serialises to, so the call re-renders to the same prompt text in the next turn);
* the output tokens: the arguments' tokens; ``max_tokens`` below that cuts the arguments (the
  call is then incomplete JSON, finish ``length``), as a real model's would be cut.

``tool_choice: auto`` never calls a tool (the emulated "model" answers in text).
"""

from __future__ import annotations

import json
import random
from typing import Any

from tokenomy.emulator.generation import OutputPlan, prompt_seed
from tokenomy.emulator.protocol import FunctionDef
from tokenomy.emulator.tokenizer import WORDS, Tokenizer

MAX_DEPTH = 6
"""Nested objects and arrays deeper than this are left empty (a recursive schema terminates)."""


def arguments_for(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value that satisfies the common JSON-schema keywords of ``schema``: ``const``, ``enum``,
    ``default``, ``type`` (the first non-null of a list), ``anyOf``/``oneOf`` (the first), object
    ``properties`` (the ``required`` ones) and array ``items`` (``minItems``, at least one),
    numbers within ``minimum``/``maximum``, strings of at least ``minLength`` characters."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][rng.randrange(len(schema["enum"]))]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return arguments_for(schema[key][0], rng, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        if depth >= MAX_DEPTH:
            return {}
        return {name: arguments_for(props.get(name, {}), rng, depth + 1) for name in required if isinstance(name, str)}
    if kind == "array":
        if depth >= MAX_DEPTH:
            return []
        count = max(1, int(schema.get("minItems") or 0))
        return [arguments_for(schema.get("items", {}), rng, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", 0)
        high = schema.get("maximum", max(low, 0) + 100)
        value = rng.randint(int(low), max(int(low), int(high)))
        return value if kind == "integer" else float(value)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    words = [WORDS[rng.randrange(len(WORDS))] for _ in range(2)]
    text = "-".join(words)
    min_length = int(schema.get("minLength") or 0)
    return text + "x" * max(0, min_length - len(text))


def plan_tool_call(tokenizer: Tokenizer, prompt_ids: list[int], tools: list[FunctionDef], *,
                   max_tokens: int, seed: int | None) -> OutputPlan:
    """The answer that calls one of ``tools`` (see the module docstring). ``max_tokens >= 1``."""
    rng = random.Random(prompt_seed(prompt_ids) if seed is None else seed)
    tool = tools[rng.randrange(len(tools))] if len(tools) > 1 else tools[0]
    arguments = json.dumps(arguments_for(tool.parameters or {"type": "object"}, rng), ensure_ascii=False)
    ids = tokenizer.encode(arguments) or [tokenizer.palette[0]]
    pieces = _split(arguments, len(ids))
    reason = "stop"
    if len(ids) > max_tokens:
        ids, pieces, reason = ids[:max_tokens], pieces[:max_tokens], "length"
    return OutputPlan(ids, pieces, reason, tool_call=tool.name)


def _split(text: str, n: int) -> list[str]:
    """``text`` in ``n`` contiguous pieces: at spaces when that gives ``n`` (the built-in
    tokenizer's cuts), else in nearly equal lengths."""
    words = text.split(" ")
    cut = [words[0]] + [" " + w for w in words[1:]]
    if not cut[0]:
        cut = cut[1:]
    if len(cut) == n:
        return cut
    size, extra = divmod(len(text), n)
    out, at = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(text[at:at + step])
        at += step
    return out
