from __future__ import annotations

import json

import pytest

from tokenomy.core import TokenUsage
from tokenomy.metrics import TokenLedger

from .factories import make_record


def _usage(inp: int = 0, inc: int = 0, hist: int = 0, out: int = 0, hit: int = 0) -> TokenUsage:
    prompt = inp + inc + hist
    return TokenUsage(input_tokens=inp, incremental_prefill_tokens=inc, history_tokens=hist,
                      output_tokens=out, cache_hit_tokens=hit, recomputed_tokens=prompt - hit)


def _ledger() -> TokenLedger:
    ledger = TokenLedger()
    ledger.record_all([
        make_record("a1", tenant="acme", session_id="s1", turn=0, usage=_usage(inp=100, out=10)),
        make_record("a2", tenant="acme", session_id="s1", turn=1, usage=_usage(inc=20, hist=110, out=5, hit=110)),
        make_record("a3", tenant="acme", usage=_usage(inp=7, out=3)),
        make_record("b1", tenant="beta", session_id="s1", usage=_usage(inp=50, out=50)),
    ])
    return ledger


def test_per_tenant_and_per_session_class_totals() -> None:
    ledger = _ledger()
    acme = ledger.tenant("acme")
    assert acme.requests == 3
    assert (acme.usage.input_tokens, acme.usage.incremental_prefill_tokens, acme.usage.output_tokens) == (107, 20, 18)
    assert (acme.usage.cache_hit_tokens, acme.usage.recomputed_tokens) == (110, 127)
    # Same session id in two tenants are two sessions.
    s1 = ledger.session("acme", "s1")
    assert s1.requests == 2 and s1.usage.total_tokens == 245
    assert ledger.session("beta", "s1").usage.total_tokens == 100
    assert ledger.total().requests == 4
    assert ledger.total().usage.total_tokens == 245 + 10 + 100
    ledger.total().usage.check()


def test_unknown_keys_are_zero_and_copies_do_not_leak() -> None:
    ledger = _ledger()
    assert ledger.tenant("nobody").requests == 0
    ledger.tenant("acme").usage.output_tokens += 1000
    assert ledger.tenant("acme").usage.output_tokens == 18


def test_same_request_is_metered_once() -> None:
    ledger = _ledger()
    with pytest.raises(ValueError, match="'a1' is already metered"):
        ledger.record(make_record("a1", tenant="acme"))
    assert ledger.total().requests == 4


def test_report_is_json_with_sessions_under_tenants() -> None:
    report = json.loads(json.dumps(_ledger().to_dict()))
    assert report["total"]["requests"] == 4
    assert report["tenants"]["acme"]["sessions"]["s1"]["history_tokens"] == 110
    assert report["tenants"]["beta"]["prompt_tokens"] == 50
