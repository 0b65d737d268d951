"""Prefill/decode disaggregation on the request path: the vLLM ``kv_transfer_params`` hand-off.

The protocol is vLLM's (its NixlConnector P/D proxy, ``toy_proxy_server.py``), so the same gateway
drives real vLLM P/D pools and ``tokenomy up``'s emulated ones:

1. the prefill backend gets the request with ``stream: false``, ``max_tokens: 1`` (and
   ``max_completion_tokens: 1`` when given), no ``stream_options``, and
   ``kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false, ...None}``;
   it computes the prompt's KV, keeps it, and answers with ``kv_transfer_params`` naming where
   the decode side pulls it from (``remote_engine_id``, ``remote_block_ids``, host, port);
2. the decode backend gets the original request plus those ``kv_transfer_params``; it pulls the
   KV and generates. The client sees only the decode backend's answer.

:class:`PdRouter` decides, per request, where the decode runs and whether (and where) a remote
prefill runs first: ``disagg`` always prefills remotely; ``ampd`` asks
:class:`tokenomy.gateway.ampd_live.AmpdLive`. The proxy then sends the decode request as usual.
A prefill backend that cannot be reached is marked down and the next one is tried; when none is
left the decode backend prefills locally (logged), so a P pool outage degrades, never fails.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from tokenomy.core import Request as CoreRequest
from tokenomy.core import Role
from tokenomy.gateway.backends import Backend, BackendPool
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.parse import ParsedRequest
from tokenomy.gateway.routing_config import RoutingConfig
from tokenomy.gateway.upstream import UpstreamConnectError, UpstreamError, UpstreamPool
from tokenomy.policy.router import Router

log = logging.getLogger(__name__)

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

REMOTE_DECODE_PARAMS: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
"""What the prefill request carries (vLLM's proxy sends exactly these keys)."""


@dataclass(frozen=True, slots=True)
class PdRoute:
    """Where one request decodes, and the ``kv_transfer_params`` its decode request carries.

    ``kv_transfer_params`` None: the decode backend prefills locally. ``prefill_instance``: the
    backend that ran the remote prefill (None when local). ``reason`` says why.
    ``prefill_cached_tokens``: the prompt tokens the prefill backend did not compute (its
    ``usage.prompt_tokens_details.cached_tokens``; None when local or not reported). Metering
    takes the cached/recomputed split from here, not from the decode backend, whose count of
    KV it pulled differs by engine (docs/gateway.md, "Metering under P/D").
    """

    decode_instance: str
    kv_transfer_params: dict[str, Any] | None
    prefill_instance: str | None
    reason: str
    prefill_cached_tokens: int | None = None


def core_request(req: ParsedRequest, now: float, history_tokens: int = 0, prompt_tokens: int | None = None
                 ) -> CoreRequest:
    """The policy-side view of a parsed request (one content segment: its conversation prefix);
    ``prompt_tokens``: a better prompt size than the parser's estimate (AMPD's calibrated one)."""
    prompt = max(1, req.prompt_tokens_estimate if prompt_tokens is None else prompt_tokens)
    return CoreRequest(
        request_id=req.request_id, arrival_s=now, prompt_tokens=prompt,
        max_output_tokens=req.max_tokens or 1, session_id=req.session_id,
        history_tokens=min(history_tokens, prompt - 1), content=((req.stream_key, prompt),),
    )


HISTORY_KEY = "tokenomy_history_tokens"
"""Our extension in the prefill request's ``kv_transfer_params`` (AMPD): the prompt-prefix tokens
whose KV the session's decode backend already holds; the emulator's prefill side pulls them instead
of recomputing (``tokenomy.emulator.service.HISTORY_KEY``). Absent when 0."""


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

    def __init__(self, pool: BackendPool, upstream: UpstreamPool) -> None:
        self.pool = pool
        self.upstream = upstream

    async def run(self, req: ParsedRequest, backend: Backend, history_tokens: int = 0,
                  prompt_tokens: int | None = None) -> tuple[dict[str, Any], int | None]:
        """The ``kv_transfer_params`` ``backend`` answered, and the prompt tokens it reported as cached
        (None: not reported). ``history_tokens``: see :data:`HISTORY_KEY`; ``prompt_tokens``: the
        prompt's size if better known than the parser's estimate.

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
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return params, cached if isinstance(cached, int) else None


class PdRouter:
    """Decides the decode backend and runs the remote prefill, for ``disagg`` and ``ampd``."""

    def __init__(self, config: RoutingConfig, pool: BackendPool, upstream: UpstreamPool, router: Router,
                 ampd: Any = None) -> None:
        self.config = config
        self.pool = pool
        self.router = router
        self.hop = PrefillHop(pool, upstream)
        self.ampd = ampd  # an AmpdLive in ampd mode

    def role_candidates(self, role: Role, model: str, exclude: frozenset[str] = frozenset()) -> list[Backend]:
        """Healthy backends of ``role`` serving ``model`` (those past their backoff when none is)."""
        now = time.monotonic()
        return [b for b in self.pool.candidates(model, now, exclude) if b.role is role]

    def choose_decode(self, req: ParsedRequest, route: PdRoute, tried: frozenset[str]) -> Backend:
        """The routed decode backend; after it failed, another decode backend (the router's pick)."""
        if route.decode_instance not in tried:
            b = self.pool.by_id[route.decode_instance]
            if b.healthy or b.retry_at_s <= time.monotonic():
                return b
        cands = self.role_candidates(Role.DECODE, req.model, tried)
        if not cands:
            raise GatewayError(503, f"no healthy decode backend serves {req.model!r}", "server_error",
                               "no_backend", None, {"retry-after": "1"})
        now = time.monotonic()
        return self.pool.by_id[self.router.choose(core_request(req, now), cands, now)]

    async def route(self, req: ParsedRequest) -> PdRoute:
        """Where ``req`` decodes; runs its remote prefill first when one is decided."""
        decodes = self.role_candidates(Role.DECODE, req.model)
        if not decodes:
            raise GatewayError(503, f"no healthy decode backend serves {req.model!r}", "server_error",
                               "no_backend", None, {"retry-after": "1"})
        prefills = self.role_candidates(Role.PREFILL, req.model)
        arrival = time.monotonic()
        if self.ampd is not None:
            decode_id, order, reason, history = await self.ampd.place(req, decodes, prefills)
        else:
            now = time.monotonic()
            decode_id = self.router.choose(core_request(req, now), decodes, now)
            order = sorted(prefills, key=lambda b: (b.num_waiting_tokens, b.in_flight, b.instance_id))
            reason, history = "disagg: every prefill runs remotely", 0
        route: PdRoute | None = None
        try:
            for backend in order:
                try:
                    params, cached = await self.hop.run(req, backend, history,
                                                        None if self.ampd is None else self.ampd.prompt_tokens(req))
                except UpstreamConnectError as exc:
                    self.pool.mark_down(backend, time.monotonic(), str(exc))
                    continue
                route = PdRoute(decode_id, params, backend.instance_id, reason, cached)
                break
        finally:
            if self.ampd is not None:
                self.ampd.prefill_done(req)
        if route is None:
            if order:
                log.warning("request %s: no prefill backend reachable; %s prefills locally", req.request_id, decode_id)
                reason += "; no prefill backend reachable: local"
            route = PdRoute(decode_id, None, None, reason)
        if self.ampd is not None:  # AMPD's decode admission: wait while the decode backend is full
            await self.ampd.admit(req, decode_id, remote=route.kv_transfer_params is not None, arrival_s=arrival)
        return route

    def finished(self, req: ParsedRequest, prompt_tokens: int = 0) -> None:
        """The client's answer is complete (AMPD: the session's tool call starts now);
        ``prompt_tokens``: what the backend counted (0: unknown)."""
        if self.ampd is not None:
            self.ampd.turn_ended(req, prompt_tokens)


def build_pd_router(config: RoutingConfig, pool: BackendPool, upstream: UpstreamPool, router: Router,
                    http: Any) -> PdRouter | None:
    """The P/D router of ``routing.mode`` (None for ``colocated``); ``http`` is an httpx client."""
    if config.mode == "colocated":
        return None
    ampd = None
    if config.mode == "ampd":
        from tokenomy.gateway.ampd_live import AmpdLive

        ampd = AmpdLive.build(config, pool, http)
    return PdRouter(config, pool, upstream, router, ampd)
