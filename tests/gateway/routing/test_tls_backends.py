"""https backends through the gateway: a local TLS server with a certificate the test makes
(trustme), verified against a configured CA, with a client certificate when the backend asks."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from helpers.gateway_core_support import MODEL, FakeUpstream, serve, wait_for
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca = trustme.CA()
        self.ca_pem = root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        server = self.ca.issue_cert("127.0.0.1")
        self.server_pem, self.server_key = root / "server.pem", root / "server.key"
        server.cert_chain_pems[0].write_to_path(str(self.server_pem))
        server.private_key_pem.write_to_path(str(self.server_key))
        client = self.ca.issue_cert("gateway.client")
        self.client_pem = root / "client.pem"
        client.private_key_and_cert_chain_pem.write_to_path(str(self.client_pem))


@pytest.fixture(scope="module")
def tls_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pki, str, FakeUpstream]]:
    """One https upstream for the module; it requires a client certificate from the test's CA."""
    pki = Pki(tmp_path_factory.mktemp("pki"))
    upstream = FakeUpstream()
    with serve(upstream.app(), ssl_certfile=str(pki.server_pem), ssl_keyfile=str(pki.server_key),
               ssl_ca_certs=str(pki.ca_pem), ssl_cert_reqs=ssl.CERT_REQUIRED) as url:
        yield pki, url, upstream


def _gateway(tmp_path: Path, url: str, tls: dict[str, Any] | None, client: str = "fast") -> Any:
    backend: dict[str, Any] = {"id": "secure", "url": url}
    if tls is not None:
        backend["tls"] = tls
    return config_from_dict({"backends": [backend], "server": {"upstream_client": client},
                             "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"}})


def _chat(url: str, **kw: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello over tls"}], "max_tokens": 3, **kw}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=20)


@pytest.mark.parametrize("client", ["fast", "aiohttp"])
def test_an_https_backend_with_its_ca_and_a_client_certificate_serves_and_streams(
        tls_backend: tuple[Pki, str, FakeUpstream], tmp_path: Path, client: str) -> None:
    pki, url, upstream = tls_backend
    cfg = _gateway(tmp_path, url, {"ca_bundle": str(pki.ca_pem), "client_cert": str(pki.client_pem)}, client)
    ledger = SqlLedger(cfg.ledger.url)
    try:
        app = build_app(cfg, guard=AllowAllGuard(), ledger=ledger)
        with serve(app) as gw:
            r = _chat(gw)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "w0 w1 w2"
            s = _chat(gw, stream=True)
            assert s.status_code == 200 and " w2" in s.text and s.text.rstrip().endswith("data: [DONE]")
            backend = app.state.pool.backends[0]
            wait_for(lambda: backend.kv_usage == 0.25)  # a scrape went through: the health check trusts the CA
            assert backend.healthy and backend.failures == 0
        assert [e.output_tokens for e in ledger.query(_filter())] == [3, 3]
    finally:
        ledger.close()


def _filter() -> Any:
    from tokenomy.gateway.metering.ledger import UsageFilter

    return UsageFilter()


@pytest.mark.parametrize("client", ["fast", "aiohttp"])
def test_a_certificate_that_does_not_verify_is_a_clear_502(
        tls_backend: tuple[Pki, str, FakeUpstream], tmp_path: Path, client: str) -> None:
    """Verification is on by default: the test CA is not in the system's trust store."""
    pki, url, upstream = tls_backend
    served = len(upstream.usages)
    cfg = _gateway(tmp_path, url, {"client_cert": str(pki.client_pem)}, client)
    ledger = SqlLedger(cfg.ledger.url)
    try:
        with serve(build_app(cfg, guard=AllowAllGuard(), ledger=ledger)) as gw:
            r = _chat(gw)
        err = r.json()["error"]
        assert (r.status_code, err["type"], err["code"]) == (502, "server_error", "upstream_tls_error")
        assert "certificate verify failed" in err["message"]
        assert len(upstream.usages) == served  # nothing reached the backend
    finally:
        ledger.close()


def test_tls_settings_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tls is set but the url is not https"):
        _gateway(tmp_path, "http://127.0.0.1:9", {"verify": False})
    cfg = _gateway(tmp_path, "https://127.0.0.1:9", {"ca_bundle": str(tmp_path / "missing.pem")})
    with pytest.raises(ValueError, match=r"backends\[secure\]\.tls"):
        build_app(cfg, guard=AllowAllGuard())
