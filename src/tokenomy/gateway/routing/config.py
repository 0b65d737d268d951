"""The ``routing`` section of the gateway config: colocated, disaggregated or AMPD request paths.

```yaml
routing:
  mode: ampd              # colocated (default) | disagg | ampd
  slo: {ttft_s: 2.0, tpot_s: 0.1}
  perf: {model: llama-3.1-8b, gpu: h100, tp: 1}   # the cost model AMPD prices its options with
backends:
  - {id: prefill-0, url: "http://127.0.0.1:8100", role: prefill}
  - {id: decode-0, url: "http://127.0.0.1:8101", role: decode}
```

* ``colocated``: one backend runs the whole request, chosen by ``router`` (the gateway as before).
* ``disagg`` (DistServe-style): every request is prefilled on a ``prefill`` backend with
  ``kv_transfer_params: {"do_remote_decode": true}`` and ``max_tokens: 1``, then decoded on a
  ``decode`` backend (chosen by ``router``) with the ``kv_transfer_params`` the prefill answered,
  as vLLM's P/D proxy does with NixlConnector.
* ``ampd``: a session is bound to a decode backend; each turn's (incremental) prefill runs on the
  bound decode backend (local, one request) or on a prefill backend (remote, the disagg hand-off),
  as AMPD's ``AdaptivePlacement`` decides; see :mod:`tokenomy.gateway.routing.ampd_live`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SloConfig(_Strict):
    """The SLO placement decides against (modelled seconds, as the engines report them)."""

    ttft_s: float = Field(default=2.0, gt=0)
    tpot_s: float = Field(default=0.1, gt=0)


class PerfConfig(_Strict):
    """The catalog model and GPU of the engines behind the gateway (AMPD's cost model)."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = Field(default=1, ge=1)


class AmpdLiveConfig(_Strict):
    """AMPD's knobs live; defaults are the simulator's (docs/ampd.md).

    ``local_budget_tokens``: prefill tokens a decode backend's step carries beside its decodes;
    ``prefill_budget_tokens``: tokens per prefill step (prices queued prompt tokens, and is what
    the gateway's prefill queue releases to a prefill backend at a time);
    ``reorder``: look-ahead reordering of the gateway's prefill queue (with its deferral cap);
    ``retention_hints``: tell engines to keep a session's KV across its tool call
    (``POST /v1/tokenomy/retain``; engines without it answer 404, which is ignored);
    ``admission``: hold turns for a memory-full decode backend and release them in TTFT-slack
    order (``SlackAdmission``, the simulator's default).
    """

    local_budget_tokens: int = Field(default=2048, ge=1)
    prefill_budget_tokens: int = Field(default=8192, ge=1)
    itl_bound_factor: float = Field(default=1.0, gt=0)
    reorder: bool = True
    retention_hints: bool = True
    tool_latency_prior_s: float = Field(default=5.0, ge=0)
    admission: bool = True


class RoutingConfig(_Strict):
    mode: Literal["colocated", "disagg", "ampd"] = "colocated"
    slo: SloConfig = SloConfig()
    perf: PerfConfig = PerfConfig()
    ampd: AmpdLiveConfig = AmpdLiveConfig()
    prefill_timeout_s: float = Field(default=120.0, gt=0)
