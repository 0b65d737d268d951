"""The gateway's OpenAPI 3 description (served at ``/openapi.json``; schemathesis tests against it).

Only the fields the gateway itself reads are described; everything else an OpenAI request may
carry passes through to the backend.
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
    return {
        "openapi": "3.0.3",
        "info": {"title": "tokenomy gateway", "version": "0.1.0"},
        "paths": {
            "/v1/chat/completions": _post("Chat completion, proxied and metered", chat),
            "/v1/completions": _post("Text completion, proxied and metered", completions),
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
