"""The gateway's OpenAPI 3 description (served at ``/openapi.json``; schemathesis tests against it).

Only the fields the gateway itself reads are described; everything else an OpenAI or Anthropic
request may carry passes through to the backend. Errors on ``/v1/messages`` are Anthropic's shape
(``{"type": "error", "error": {...}}``), which also has an ``error`` object with ``message`` and ``type``.
"""

from __future__ import annotations

from typing import Any

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}

_COMMON = {
    "model": {"type": "string", "minLength": 1},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "user": {"type": "string", "maxLength": 64},
}

_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant"]}, "content": {"type": "string"}},
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {
        str(s): {"description": "OpenAI error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for s in statuses
    }


def _post(summary: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [
                {"name": "x-session-id", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 64}},
            ],
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {
                "200": {"description": "completion (JSON, or an SSE stream when stream is true)"},
                **_errors(400, 401, 402, 403, 404, 413, 429, 502, 503),
            },
        }
    }


def spec(models: tuple[str, ...]) -> dict[str, Any]:
    chat = {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {**_COMMON, "model": {"type": "string", "enum": list(models)},
                       "messages": {"type": "array", "minItems": 1, "maxItems": 4, "items": _MESSAGE}},
    }
    completions = {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {**_COMMON, "model": {"type": "string", "enum": list(models)},
                       "prompt": {"type": "string", "minLength": 1, "maxLength": 2000}},
    }
    names = {"type": "string", "enum": list(models)}
    turn = {"type": "object", "required": ["role", "content"],
            "properties": {"role": {"type": "string", "enum": ["user", "assistant"]}, "content": {"type": "string"}}}
    turns = {"type": "array", "minItems": 1, "maxItems": 4, "items": turn}
    messages = {
        "type": "object",
        "required": ["model", "messages", "max_tokens"],
        "properties": {"model": names, "messages": turns, "max_tokens": _COMMON["max_tokens"],
                       "system": {"type": "string", "maxLength": 2000}, "stream": {"type": "boolean"},
                       "metadata": {"type": "object", "properties": {"user_id": {"type": "string", "maxLength": 200}}},
                       "thinking": {"type": "object", "properties": {"type": {"type": "string"},
                                                                     "budget_tokens": {"type": "integer"}}}},
    }
    count_tokens = {"type": "object", "required": ["model", "messages"],
                    "properties": {"model": names, "messages": turns, "system": {"type": "string", "maxLength": 2000}}}
    responses = {
        "type": "object",
        "required": ["model", "input"],
        "properties": {"model": names, "input": {"type": "string", "minLength": 1, "maxLength": 2000},
                       "max_output_tokens": _COMMON["max_tokens"], "stream": {"type": "boolean"},
                       "store": {"type": "boolean"}, "instructions": {"type": "string", "maxLength": 2000},
                       "previous_response_id": {"type": "string", "maxLength": 64},
                       "prompt_cache_key": {"type": "string", "maxLength": 64}},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "tokenomy gateway", "version": "0.1.0"},
        "paths": {
            "/v1/chat/completions": _post("Chat completion, proxied and metered", chat),
            "/v1/completions": _post("Text completion, proxied and metered", completions),
            "/v1/messages": _post("Anthropic Messages, proxied (or translated) and metered", messages),
            "/v1/messages/count_tokens": _post("Anthropic token count (not metered)", count_tokens),
            "/v1/responses": _post("OpenAI Responses, proxied (or translated) and metered", responses),
            "/v1/models": {"get": {"summary": "Models served", "responses": {"200": {"description": "model list"}}}},
            "/health": {"get": {"summary": "Gateway health", "responses": {"200": {"description": "ok"},
                                                                            "503": {"description": "no backend"}}}},
            "/v1/usage": {
                "get": {
                    "summary": "Usage events of the caller's subtree",
                    "parameters": [
                        {"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
                        for n in ("tenant", "key", "model", "session", "since", "until", "format", "limit")
                    ],
                    "responses": {"200": {"description": "events (JSON or CSV)"}, **_errors(400, 401, 403)},
                }
            },
        },
        "components": {"schemas": {"Error": _ERROR}},
    }
