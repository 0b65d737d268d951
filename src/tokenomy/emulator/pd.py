"""P/D disaggregation on the emulator's side: the ``kv_transfer_params`` a request carries (the keys
of vLLM's NIXL connector plus Tokenomy's history extension), the parameters a prefill answer hands
to the decode side, and the decode side's notice to the prefill instance that it pulled the KV."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import TYPE_CHECKING, Any

from tokenomy.emulator.config import EmulatorConfig
from tokenomy.emulator.protocol import APIError

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

KV_RELEASE_PATH = "/tokenomy/kv_release"
"""Where a decode instance tells the prefill instance that it pulled a request's KV."""

HISTORY_KEY = "tokenomy_history_tokens"
"""Extension in a prefill request's ``kv_transfer_params``: the first N prompt tokens' KV sits on the
session's decode instance; the prefill instance pulls what its own prefix cache lacks (modelled
transfer time) instead of recomputing it, as AMPD's remote incremental prefill does. Engines
without the extension ignore the key and recompute (docs/ampd-live.md)."""


def pd_params(params: dict[str, Any] | None, peers: tuple[str, ...] = ()) -> tuple[bool, dict[str, Any] | None]:
    """``(remote_decode, remote_prefill)`` of a request's ``kv_transfer_params``: whether it is the
    prefill half of a P/D pair, or the prefill side's parameters a decode half pulls its KV with."""
    if not params:
        return False, None
    if params.get("do_remote_decode") and params.get("do_remote_prefill"):
        raise APIError(400, "kv_transfer_params: do_remote_decode and do_remote_prefill are exclusive",
                       param="kv_transfer_params")
    if params.get("do_remote_prefill"):
        missing = [k for k in ("remote_request_id", "remote_host", "remote_port") if params.get(k) in (None, "")]
        if missing:
            raise APIError(400, f"kv_transfer_params.do_remote_prefill needs {', '.join(missing)}",
                           param="kv_transfer_params")
        host, port = params["remote_host"], params["remote_port"]
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise APIError(400, "kv_transfer_params.remote_port must be a port number", param="kv_transfer_params")
        if not allowed_peer(host, peers):
            raise APIError(403, f"kv_transfer_params.remote_host {host!r} is not loopback nor an allowed "
                           "KV peer (tokenomy emulate --kv-peer HOST)", param="kv_transfer_params",
                           type_="PermissionDeniedError")
        return False, params
    return bool(params.get("do_remote_decode")), None


def history_tokens(params: dict[str, Any] | None) -> int:
    """The :data:`HISTORY_KEY` of a prefill request's ``kv_transfer_params`` (0 when absent)."""
    value = (params or {}).get(HISTORY_KEY, 0)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise APIError(400, f"kv_transfer_params.{HISTORY_KEY} must be an integer >= 0, got {value!r}",
                       param="kv_transfer_params")
    return value


def allowed_peer(host: Any, peers: tuple[str, ...]) -> bool:
    """Whether a decode instance may POST its KV release to ``host``: a loopback address, or one
    of the configured ``peers`` (exact host names or addresses)."""
    if not isinstance(host, str) or not host:
        return False
    if host in peers or host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified  # 0.0.0.0 / :: reach this host too


def remote_cached_tokens(remote_prefill: dict[str, Any] | None) -> int | None:
    """The prefill side's cache hits a decode half's parameters report (``None`` when absent): vLLM's
    NIXL decode side reports those as the request's cached tokens, not the KV it pulled."""
    value = (remote_prefill or {}).get("remote_prefill_cached_tokens")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def prefill_answer_params(config: EmulatorConfig, request_id: str, prompt_tokens: int, cached_tokens: int,
                          block_size: int) -> dict[str, Any]:
    """The ``kv_transfer_params`` a prefill answer carries: where the decode side pulls its KV from."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(range(-(-prompt_tokens // block_size))),
        "remote_engine_id": config.instance_id,
        "remote_request_id": request_id,
        "remote_host": config.host,
        "remote_port": config.port,
        "tp_size": config.tp,
        "remote_num_tokens": prompt_tokens,
        "remote_prefill_cached_tokens": cached_tokens,
    }


class ReleaseNotifier:
    """Tells prefill instances that their KV was pulled (decode side; one HTTP client, made on first use)."""

    def __init__(self) -> None:
        self._http: httpx.AsyncClient | None = None

    def notify(self, remote_prefill: dict[str, Any]) -> None:
        """POST the release in the background; a failure is logged (the prefill side frees on its timeout)."""
        import httpx  # only PD decode instances need a client (and importing it is slow)

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=5.0)
        url = f"http://{remote_prefill['remote_host']}:{remote_prefill['remote_port']}{KV_RELEASE_PATH}"
        payload = {"remote_request_id": remote_prefill["remote_request_id"]}
        client = self._http

        async def send() -> None:
            try:
                await client.post(url, json=payload)
            except httpx.HTTPError as exc:  # the prefill side frees on its timeout instead
                log.warning("KV release notification to %s failed: %s", url, exc)

        asyncio.get_running_loop().create_task(send())

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
