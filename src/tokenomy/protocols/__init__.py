"""Wire shapes of the agent protocols and their translation to and from OpenAI chat completions.

A backend that serves only ``/v1/chat/completions`` can answer Anthropic Messages
(:mod:`tokenomy.protocols.messages`) and OpenAI Responses (:mod:`tokenomy.protocols.responses`)
requests: the request is translated to a chat request, the chat answer (whole, or chunk by chunk
with the ``*Stream`` classes) back to the protocol's answer; :mod:`tokenomy.protocols.sse` frames
events and errors. The translations follow what vLLM 0.32 does internally for the same endpoints,
so a request gives the same chat messages (and prompt, and prefix-cache hits) whether vLLM or a
gateway in front of a chat backend translates it; where we chose otherwise, the function says so.

A gateway in front of a chat backend, for ``POST /v1/messages``::

    chat = messages_to_chat(body)            # ProtocolError -> 400 anthropic_error_body(...)
    # not streamed: forward chat, then
    answer = chat_to_messages(chat_answer, model=body["model"])
    # streamed (chat asks for usage in every chunk):
    stream = ChatToMessagesStream(body["model"], input_tokens_estimate=n)
    for chunk in backend_chunks:             # parsed ``data:`` objects, up to ``[DONE]``
        send(format_events(stream.feed(chunk)))
    send(format_events(stream.finish()))     # or anthropic_error_event(...) if the backend broke off

and the same with ``responses_to_chat`` / ``chat_to_responses`` / ``ChatToResponsesStream`` (whose
``sequence_number`` an error event takes: ``responses_error_event``) for ``POST /v1/responses``.

Pure functions on plain ``dict`` bodies (the JSON as parsed): no I/O, no clock reads beyond a
``created`` timestamp a caller may pass, nothing from the gateway or the emulator. Bad input raises
:class:`ProtocolError` (a ``ValueError`` with the offending ``param``), never another exception.
"""

from tokenomy.protocols.common import ProtocolError

__all__ = ["ProtocolError"]
