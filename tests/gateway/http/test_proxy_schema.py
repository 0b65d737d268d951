"""Schemathesis over the gateway's OpenAPI spec (a bounded run): no request it makes gets a 5xx.

Generated bodies include invalid ones (wrong types, missing fields, out-of-range numbers): each
must get a 2xx or an error JSON with a 4xx status (OpenAI's, or Anthropic's on ``/v1/messages``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from helpers.agent_upstream import AgentUpstream
from helpers.gateway_core_support import MODEL, serve
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.http.openapi import spec
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration

schema = schemathesis.openapi.from_dict(spec((MODEL,)))
schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
                                database="none")


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("schema")
    upstream = AgentUpstream()  # chat, completions, Messages and Responses
    with serve(upstream.app()) as up_url:
        # generous health timeout: on a loaded CI machine a 1 s probe of the fake upstream can
        # time out, and a backend taken out answers 503 (correct, but not what this test checks)
        cfg = config_from_dict({"backends": [{"id": "b1", "url": up_url}],
                                "health": {"timeout_s": 30.0},
                                "ledger": {"url": f"sqlite:///{tmp}/ledger.db"}})
        ledger = SqlLedger(cfg.ledger.url)
        try:
            with serve(build_app(cfg, guard=AllowAllGuard(), ledger=ledger)) as url:
                yield url
        finally:
            ledger.close()


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_5xx_and_errors_are_openai_json(case: schemathesis.Case, gateway_url: str) -> None:
    response = case.call(base_url=gateway_url, timeout=10)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        err = response.json()["error"]
        assert isinstance(err["message"], str) and isinstance(err["type"], str)
