"""OpenAI chat stream chunks -> Responses stream events, in the order the openai SDK's
``responses.stream()`` accumulator (``ResponseStreamState``) expects, numbered by
``sequence_number`` from 0.

``response.created`` and ``response.in_progress`` (the response with no output), then one output
item at a time, each ``response.output_item.added`` ... ``response.output_item.done``:

* reasoning: ``content_part.added`` (``reasoning_text``), ``reasoning_text.delta``...,
  ``reasoning_text.done``, ``content_part.done``;
* message: ``content_part.added`` (``output_text``), ``output_text.delta``...,
  ``output_text.done``, ``content_part.done``;
* function call: ``function_call_arguments.delta``..., ``function_call_arguments.done``;

then ``response.completed`` with the whole response (the items as streamed, same ids, and usage).
A response cut by ``max_output_tokens`` is also announced by ``response.completed``, with status
``incomplete``, as vLLM 0.32 does: the SDK's ``get_final_response()`` reads only
``response.completed``. An answer with no output at all streams one empty message item, as the
whole answer has one.
"""

from __future__ import annotations

import time
from typing import Any

from tokenomy.protocols.common import JSON, Usage, id_tail, reasoning_of, sub
from tokenomy.protocols.response_objects import (
    function_call_item,
    item_id,
    message_item,
    output_text,
    reasoning_item,
    response_object,
)

Event = tuple[str, JSON]


class ChatToResponsesStream:
    """Feed chat chunks (parsed ``data:`` objects) in order; :meth:`finish` after ``[DONE]``."""

    def __init__(self, request: JSON, input_tokens_estimate: int = 0, response_id: str | None = None,
                 created_at: int | None = None) -> None:
        self.request = request
        self.input_tokens_estimate = max(0, input_tokens_estimate)
        self.response_id = response_id
        self.created_at = created_at
        self.started = False
        self.finished = False
        self.sequence_number = 0  # the next event's number (an error event that ends the stream takes it)
        self._base = ""
        self._model = str(request.get("model") or "")
        self._output: list[JSON] = []  # items done
        self._kind: str | None = None  # the open item's type: reasoning, message, function_call
        self._item: JSON = {}
        self._text: list[str] = []
        self._tool_index: int | None = None
        self._usage: Usage | None = None
        self._finish: Any = None
        self._deltas = 0

    def feed(self, chunk: JSON) -> list[Event]:
        """Events for one chat chunk (possibly none)."""
        if self.finished or not isinstance(chunk, dict):
            return []
        events: list[Event] = []
        usage = Usage.of(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        if not self.started:
            self._start(chunk, events)
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = sub(choice, "delta")
        reasoning = reasoning_of(delta)
        if reasoning:
            self._switch("reasoning", events)
            self._text.append(reasoning)
            self._emit(events, "response.reasoning_text.delta", content_index=0, delta=reasoning)
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._switch("message", events)
            self._text.append(text)
            self._emit(events, "response.output_text.delta", content_index=0, delta=text, logprobs=[])
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                self._tool_delta(call, events)
        if reasoning or text or calls:
            self._deltas += 1
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        return events

    def finish(self) -> list[Event]:
        """The closing events (after the last chunk); nothing once finished."""
        if self.finished:
            return []
        events: list[Event] = []
        if not self.started:
            self._start({}, events)
        self._close(events)
        if not self._output:
            self._switch("message", events)
            self._close(events)
        usage = self._usage or Usage(prompt=self.input_tokens_estimate, completion=self._deltas)
        response = response_object(self.request, str(self.response_id), int(self.created_at or 0), self._model,
                                   list(self._output), usage, self._finish)
        self._add(events, "response.completed", response=response)
        self.finished = True
        return events

    # ---- items -----------------------------------------------------------------------------
    def _add(self, events: list[Event], event_type: str, **fields: Any) -> None:
        events.append((event_type, {"type": event_type, "sequence_number": self.sequence_number, **fields}))
        self.sequence_number += 1

    def _emit(self, events: list[Event], event_type: str, **fields: Any) -> None:
        """An event of the open item."""
        self._add(events, event_type, item_id=self._item["id"], output_index=len(self._output), **fields)

    def _start(self, chunk: JSON, events: list[Event]) -> None:
        self.started = True
        self._base = id_tail(chunk.get("id"))
        if self.response_id is None:
            self.response_id = f"resp_{self._base}"
        if self.created_at is None:
            created = chunk.get("created")
            self.created_at = created if isinstance(created, int) else int(time.time())
        if not self._model and isinstance(chunk.get("model"), str):
            self._model = chunk["model"]
        response = response_object(self.request, self.response_id, self.created_at, self._model, [], None, None)
        self._add(events, "response.created", response=response)
        self._add(events, "response.in_progress", response=response)

    def _switch(self, kind: str, events: list[Event], call: JSON | None = None) -> None:
        if self._kind == kind and call is None:
            return
        self._close(events)
        index = len(self._output)
        if kind == "reasoning":
            self._item = reasoning_item(item_id("rs", self._base, index), "", "in_progress")
        elif kind == "message":
            self._item = message_item(item_id("msg", self._base, index), "", "in_progress")
        else:
            assert call is not None
            self._item = function_call_item(item_id("fc", self._base, index), call["id"], call["name"], "",
                                            "in_progress")
        self._kind, self._text = kind, []
        self._add(events, "response.output_item.added", output_index=index, item=dict(self._item))
        if kind == "reasoning":
            self._emit(events, "response.content_part.added", content_index=0,
                       part={"type": "reasoning_text", "text": ""})
        elif kind == "message":
            self._emit(events, "response.content_part.added", content_index=0, part=output_text(""))

    def _close(self, events: list[Event]) -> None:
        if self._kind is None:
            return
        text = "".join(self._text)
        it = self._item
        if self._kind == "reasoning":
            self._emit(events, "response.reasoning_text.done", content_index=0, text=text)
            self._emit(events, "response.content_part.done", content_index=0,
                       part={"type": "reasoning_text", "text": text})
            done = reasoning_item(it["id"], text)
        elif self._kind == "message":
            self._emit(events, "response.output_text.done", content_index=0, text=text, logprobs=[])
            self._emit(events, "response.content_part.done", content_index=0, part=output_text(text))
            done = message_item(it["id"], text)
        else:
            self._emit(events, "response.function_call_arguments.done", arguments=text, name=it["name"])
            done = function_call_item(it["id"], it["call_id"], it["name"], text)
        self._add(events, "response.output_item.done", output_index=len(self._output), item=done)
        self._output.append(done)
        self._kind, self._item, self._text, self._tool_index = None, {}, [], None

    def _tool_delta(self, call: JSON, events: list[Event]) -> None:
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        fn = sub(call, "function")
        if self._kind != "function_call" or index != self._tool_index:
            call_id = str(call.get("id") or f"call_{self._base}_{index}")
            name = fn.get("name") if isinstance(fn.get("name"), str) else ""
            self._switch("function_call", events, {"id": call_id, "name": name})
            self._tool_index = index
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            self._text.append(args)
            self._emit(events, "response.function_call_arguments.delta", delta=args)
