"""OpenAI chat stream chunks -> Anthropic Messages stream events, in the order the anthropic SDK's
``MessageStream`` accumulates them.

One ``message_start`` (before anything else, with ``usage.input_tokens`` from the first chunk's
``usage`` when the backend sends usage in every chunk, else the caller's estimate), then per
content block ``content_block_start`` / ``content_block_delta``... / ``content_block_stop`` with
indexes 0, 1, 2..., one block open at a time, then ``message_delta`` (stop reason, usage) and
``message_stop``. Blocks: ``thinking`` (from ``reasoning`` / ``reasoning_content`` deltas, closed
with a ``signature_delta``), ``text``, ``tool_use``. A tool call's arguments are held until its
block closes and sent as one ``input_json_delta``: a valid JSON object as received, anything else
as ``{}`` (as :func:`tokenomy.protocols.messages.chat_to_messages` does), so the SDK's partial-JSON
parser never meets garbage and the streamed and whole answers agree.

Known failures of other gateways that this order rules out (tests/protocols): a delta or stop
for a block that was never started ("Content block not found", after which Claude Code falls back
to a non-streamed request); a ``tool_use`` whose input arrives empty when text precedes it; the
first text delta lost at a thinking -> text switch (or the first chunk's content skipped); a
second ``message_start``; ``message_start.usage`` all zeros.
"""

from __future__ import annotations

from typing import Any

from tokenomy.protocols.common import JSON, Usage, dumps, id_tail, parse_object, reasoning_of, short_hash, sub

Event = tuple[str, JSON]


def stop_reason(finish_reason: Any, matched: Any, tool_used: bool,
                tool_complete: bool | None = None) -> tuple[str, str | None]:
    """Anthropic ``(stop_reason, stop_sequence)`` of a chat finish, as vLLM maps it: ``length`` is
    ``max_tokens``; complete tool calls are ``tool_use``; a matched stop string (vLLM's choice
    ``stop_reason``, a string) is ``stop_sequence``; ``content_filter`` is ``refusal``."""
    complete = tool_used if tool_complete is None else tool_complete
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "content_filter":
        return "refusal", None
    if complete:
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


class ChatToMessagesStream:
    """Feed chat chunks (parsed ``data:`` objects) in order; :meth:`finish` after ``[DONE]``."""

    def __init__(self, model: str, input_tokens_estimate: int = 0, message_id: str | None = None) -> None:
        self.model = model
        self.input_tokens_estimate = max(0, input_tokens_estimate)
        self.message_id = message_id
        self.started = False
        self.finished = False
        self._blocks = 0  # blocks started so far; the open one (if any) is _blocks - 1
        self._kind: str | None = None  # the open block's type
        self._thinking: list[str] = []
        self._tool_index: int | None = None  # chat index of the open tool call
        self._tool_args: list[str] = []
        self._closed_tools: set[int] = set()
        self._tool_used = False
        self._tools_complete = True
        self._usage: Usage | None = None
        self._finish: Any = None
        self._matched: Any = None
        self._deltas = 0  # content deltas seen: output tokens when the backend sends no usage

    # ---- input -----------------------------------------------------------------------------
    def feed(self, chunk: JSON) -> list[Event]:
        """Events for one chat chunk (possibly none)."""
        if self.finished or not isinstance(chunk, dict):
            return []
        events: list[Event] = []
        usage = Usage.of(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        if not self.started:
            events.append(self._message_start(chunk))
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = sub(choice, "delta")
        thinking = reasoning_of(delta)
        if thinking:
            self._switch("thinking", events)
            self._thinking.append(thinking)
            events.append(self._delta({"type": "thinking_delta", "thinking": thinking}))
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._switch("text", events)
            events.append(self._delta({"type": "text_delta", "text": text}))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                self._tool_delta(call, events)
        if thinking or text or calls:
            self._deltas += 1
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
            self._matched = choice.get("stop_reason")
        return events

    def finish(self) -> list[Event]:
        """The closing events (after the last chunk); nothing once finished."""
        if self.finished:
            return []
        events: list[Event] = []
        if not self.started:
            events.append(self._message_start({}))
        self._close(events)
        if self._blocks == 0:  # an empty answer is one empty text block, as the whole answer has
            self._switch("text", events)
            self._close(events)
        reason, sequence = stop_reason(self._finish, self._matched, self._tool_used,
                                       self._tool_used and self._tools_complete)
        usage: JSON = self._usage.anthropic() if self._usage is not None else {"output_tokens": self._deltas}
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                         "usage": usage}))
        events.append(("message_stop", {"type": "message_stop"}))
        self.finished = True
        return events

    # ---- blocks ----------------------------------------------------------------------------
    def _message_start(self, chunk: JSON) -> Event:
        self.started = True
        if self.message_id is None:
            self.message_id = f"msg_{id_tail(chunk.get('id'))}"
        if self._usage is not None and self._usage.prompt > 0:
            usage = self._usage.anthropic()
            usage["output_tokens"] = 0
        else:
            usage = {"input_tokens": self.input_tokens_estimate, "cache_creation_input_tokens": 0,
                     "cache_read_input_tokens": 0, "output_tokens": 0}
        return ("message_start", {"type": "message_start", "message": {
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage}})

    def _switch(self, kind: str, events: list[Event], block: JSON | None = None) -> None:
        """Make a ``kind`` block the open one (a new tool call always opens a new block)."""
        if self._kind == kind and block is None:
            return
        self._close(events)
        start = block or ({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                          else {"type": "text", "text": ""})
        events.append(("content_block_start",
                       {"type": "content_block_start", "index": self._blocks, "content_block": start}))
        self._blocks += 1
        self._kind = kind

    def _delta(self, delta: JSON) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": self._blocks - 1, "delta": delta})

    def _close(self, events: list[Event]) -> None:
        if self._kind is None:
            return
        if self._kind == "thinking":
            signature = short_hash(str(self.message_id).removeprefix("msg_"), "".join(self._thinking))
            events.append(self._delta({"type": "signature_delta", "signature": signature}))
            self._thinking = []
        elif self._kind == "tool_use":
            args = "".join(self._tool_args)
            parsed = parse_object(args)
            self._tools_complete = self._tools_complete and parsed is not None
            partial = args if parsed is not None and args.strip() else dumps(parsed or {})
            events.append(self._delta({"type": "input_json_delta", "partial_json": partial}))
            if self._tool_index is not None:
                self._closed_tools.add(self._tool_index)
            self._tool_index, self._tool_args = None, []
        events.append(("content_block_stop", {"type": "content_block_stop", "index": self._blocks - 1}))
        self._kind = None

    def _tool_delta(self, call: JSON, events: list[Event]) -> None:
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        fn = sub(call, "function")
        if self._kind != "tool_use" or index != self._tool_index:
            if index in self._closed_tools:
                return  # arguments of a call whose block is closed: too late to send
            call_id = call.get("id") or f"toolu_{short_hash(str(self.message_id), str(index))}"
            name = fn.get("name") if isinstance(fn.get("name"), str) else ""
            self._switch("tool_use", events,
                         {"type": "tool_use", "id": str(call_id), "name": name, "input": {}})
            self._tool_index = index
            self._tool_used = True
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            self._tool_args.append(args)
