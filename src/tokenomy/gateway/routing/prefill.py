"""The remote prefill hop of P/D disaggregation: vLLM's ``kv_transfer_params`` hand-off.

The protocol is vLLM's (its NixlConnector P/D proxy, ``toy_proxy_server.py``), so the same gateway
drives real vLLM P/D pools and ``tokenomy up``'s emulated ones:

1. the prefill backend gets the request with ``stream: false``, ``max_tokens: 1`` (and
   ``max_completion_tokens: 1`` when given), no ``stream_options``, and
   ``kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false, ...None}``;
   it computes the prompt's KV, keeps it, and answers with ``kv_transfer_params`` naming where
   the decode side pulls it from (``remote_engine_id``, ``remote_block_ids``, host, port);
2. the decode backend gets the original request plus those ``kv_transfer_params``; it pulls the
   KV and generates. The client sees only the decode backend's answer.

Both P/D routings (``disagg`` in :mod:`tokenomy.gateway.routing.pd`, ``ampd`` in
:mod:`tokenomy.gateway.routing.ampd_live`) run step 1 through :class:`PrefillHop`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.parse import ParsedRequest
from tokenomy.gateway.routing.backends import Backend, BackendPool
from tokenomy.gateway.routing.upstream import Upstream, UpstreamConnectError, UpstreamError

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

REMOTE_DECODE_PARAMS: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
"""What the prefill request carries (vLLM's proxy sends exactly these keys)."""


HISTORY_KEY = "tokenomy_history_tokens"
"""Our extension in the prefill request's ``kv_transfer_params`` (AMPD): the prompt-prefix tokens
whose KV the session's decode backend already holds; the emulator's prefill side pulls them instead
of recomputing (``tokenomy.emulator.pd.HISTORY_KEY``). Absent when 0."""


def prefill_body(body: dict[str, Any], history_tokens: int = 0) -> dict[str, Any]:
    """The prefill-side copy of a request body (step 1 of the module docstring)."""
    out = dict(body)
    out["kv_transfer_params"] = dict(REMOTE_DECODE_PARAMS)
    if history_tokens > 0:
        out["kv_transfer_params"][HISTORY_KEY] = history_tokens
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    return out


class PrefillHop:
    """Runs step 1 on one prefill backend, with the gateway's accounting of that backend."""

    def __init__(self, pool: BackendPool, upstream: Upstream) -> None:
        self.pool = pool
        self.upstream = upstream

    async def run(self, req: ParsedRequest, backend: Backend, history_tokens: int = 0,
                  prompt_tokens: int | None = None) -> dict[str, Any]:
        """The ``kv_transfer_params`` ``backend`` answered (``history_tokens``: see :data:`HISTORY_KEY`;
        ``prompt_tokens``: the prompt's size if better known than the parser's estimate).

        Raises UpstreamConnectError (safe to try another backend), GatewayError (the backend
        refused the request, or answered without ``kv_transfer_params``).
        """
        rid = f"{req.request_id}:prefill"
        headers = {"content-type": "application/json", "x-request-id": rid}
        if backend.config.api_key:
            headers["authorization"] = f"Bearer {backend.config.api_key}"
        payload = json.dumps(prefill_body(req.body, history_tokens), separators=(",", ":")).encode()
        prompt = req.prompt_tokens_estimate if prompt_tokens is None else prompt_tokens
        backend.dispatched(rid, max(1, prompt - history_tokens))  # what it computes
        context = 0
        try:
            resp = await self.upstream.request("POST", backend.url + PATHS[req.endpoint], payload, headers)
            try:
                content = await resp.read()
            finally:
                await resp.aclose()
        except UpstreamConnectError:
            backend.finished(rid, None, 0)
            raise
        except UpstreamError as exc:
            backend.finished(rid, None, 0)
            raise GatewayError(502, f"prefill backend {backend.instance_id}: {exc}", "server_error",
                               "upstream_error") from None
        try:
            data = json.loads(content) if content else None
        except ValueError:
            data = None
        if resp.status_code != 200:
            backend.finished(rid, None, 0)
            err = data.get("error") if isinstance(data, dict) else None
            msg = err.get("message") if isinstance(err, dict) else None
            status = resp.status_code if resp.status_code < 500 else 502
            raise GatewayError(status, msg or f"prefill backend {backend.instance_id} answered {resp.status_code}",
                               "invalid_request_error" if status < 500 else "server_error", "prefill_failed")
        params = data.get("kv_transfer_params") if isinstance(data, dict) else None
        usage = data.get("usage") if isinstance(data, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            context = usage["prompt_tokens"]
        backend.finished(rid, req.stream_key, context)
        if not isinstance(params, dict) or not params.get("do_remote_prefill"):
            raise GatewayError(502, f"prefill backend {backend.instance_id} answered without kv_transfer_params "
                               "(is it a P/D engine with a KV connector?)", "server_error", "prefill_failed")
        return params

    async def first_reachable(self, req: ParsedRequest, order: list[Backend], history_tokens: int = 0,
                              prompt_tokens: int | None = None) -> tuple[Backend, dict[str, Any]] | None:
        """Step 1 on the first backend of ``order`` that can be reached (those that cannot are
        marked down), with the ``kv_transfer_params`` it answered; None when none could."""
        for backend in order:
            try:
                return backend, await self.run(req, backend, history_tokens, prompt_tokens)
            except UpstreamConnectError as exc:
                self.pool.mark_down(backend, time.monotonic(), str(exc))
        return None
