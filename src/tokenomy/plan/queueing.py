"""Latency of a pool of identical instances at a given load, from the perf model and queueing.

Every workload sample is priced by :class:`~tokenomy.perf.PerfModel`. A pool is ``servers``
instances of one shape behind one load-aware router (the simulator's ``least_loaded`` and
``prefix_aware`` send a request to the instance with the least queued work), each receiving
``rate_per_s`` on average. The queueing layer is:

* **Prefill** (and the prefill side of a mixed instance): the pool is one M/G/c queue, FCFS,
  with ``c = servers`` (:mod:`tokenomy.plan.mgc`): Allen-Cunneen's mean wait
  ``E[W] = C(c, a) E[S] / (c - a) * (1 + Cs^2) / 2``, ``a = c * rate * E[S]``, Erlang C for the
  probability of waiting, ``Cs^2`` the squared coefficient of variation of the service time
  over the workload's samples (long prompts make it large). The wait of a request that waits
  is exponential with mean ``E[W] / C``. TTFT P95 is the 95th percentile of
  ``W + S + transfer`` over the samples (W drawn from that law with fixed random numbers, so
  the answer is deterministic): the percentile of the sum, not the sum of percentiles. With
  ``c = 1`` this is M/G/1 (Pollaczek-Khinchine). Batching several queued prompts into one
  step makes a real prefill instance a little faster than this one-prompt-per-server view at
  high load; the calibration factor absorbs it.
* **Decode**: Little's law for the running batch, ``B = lambda E[output - 1] T(B)`` with
  ``T`` the perf model's decode step at the batch's output-weighted mean context, solved by
  fixed-point iteration; the batch fluctuates like an M/G/inf population, so its P95 is
  ``B + 1.645 sqrt(B)``. TPOT P95 is ``T`` at that batch. The running KV at the mean batch
  must stay under ``RHO_MAX`` of the capacity (above it requests queue for KV without bound;
  at the P95 batch they wait briefly for admission, which the calibration factor absorbs),
  and the P95 batch within ``decode_max_num_seqs``.
* **Mixed** (chunked prefill): a step carries the decode batch and prefill chunks, so the
  step stretches to ``T_dec(B) / (1 - rho_prefill)``; a prompt's service is its prefill time
  plus one decode step per chunk, queued M/G/c over the pool as for prefill.

Loads above ``RHO_MAX`` are refused (P95 grows without bound as ``rho -> 1``).

Given the SLO, a prediction also carries the *attainment* of each bound: the share of requests
whose TTFT meets it (over the same samples of ``W + S + transfer`` the P95 is read from) and
the share of decode time the batch stays small enough for TPOT to meet it (the batch's normal
law above: ``Phi((b* + 1/2 - B) / sqrt(B))`` with ``b*`` the largest batch whose step is within
the bound). The planner judges feasibility by their product, as the simulator judges a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tokenomy.core import SLO
from tokenomy.core.step import StepShape
from tokenomy.perf import PerfModel
from tokenomy.plan.mgc import allen_cunneen
from tokenomy.plan.stats import WorkloadStats

RHO_MAX = 0.95
"""Highest utilisation the planner accepts for a queue (a labelled default: headroom)."""

Z_95 = 1.645


@dataclass(frozen=True)
class Prediction:
    """One instance's predicted P95s at a load (None where the role has no such latency).

    ``utilization`` is the busy fraction of the instance's binding resource (compute for
    prefill; the larger of KV and batch slots for decode); ``kv_utilization`` is the running
    KV at the P95 batch over the KV capacity. ``feasible`` is False when the load cannot be
    carried at all, with ``reason`` in words.
    """

    ttft_p95_s: float | None
    tpot_p95_s: float | None
    utilization: float
    kv_utilization: float
    batch: float
    feasible: bool
    reason: str = ""
    ttft_attainment: float = 1.0  # share of requests within the TTFT bound (1.0: no TTFT here, or no SLO given)
    tpot_attainment: float = 1.0  # share within the TPOT bound (1.0: no TPOT here, or no SLO given)

    @property
    def attainment(self) -> float:
        """Share of requests within both bounds (the two taken as independent)."""
        return self.ttft_attainment * self.tpot_attainment


def _infeasible(reason: str, utilization: float = math.inf, kv: float = 0.0) -> Prediction:
    return Prediction(None, None, utilization, kv, 0.0, False, reason)


def prefill_seconds(perf: PerfModel, new_tokens: int, cached_tokens: int, budget_tokens: int) -> float:
    """Time to prefill ``new_tokens`` after ``cached_tokens`` of prefix, in chunks of ``budget_tokens``."""
    total, done = 0.0, 0
    while done < new_tokens:
        chunk = min(budget_tokens, new_tokens - done)
        total += perf.prefill_time_s(chunk, cached_tokens + done)
        done += chunk
    return total


class InstanceModel:
    """Prices one instance shape (``perf``) for one workload; see the module docstring.

    ``role`` is ``"prefill"``, ``"decode"`` or ``"mixed"``. ``kv_capacity_tokens`` raises the
    perf model's ``ValueError`` when the weights do not fit.
    """

    def __init__(self, role: str, perf: PerfModel, stats: WorkloadStats, *, max_num_batched_tokens: int,
                 max_num_seqs: int, gpu_memory_utilization: float) -> None:
        if role not in ("prefill", "decode", "mixed"):
            raise ValueError(f"role must be prefill, decode or mixed, got {role!r}")
        self.role, self.perf, self.stats = role, perf, stats
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.kv_capacity_tokens = perf.kv_capacity_tokens(gpu_memory_utilization)
        prompt, out = stats.prompt_tokens, stats.output_tokens
        rng = np.random.default_rng(0)
        self._u, self._v = rng.random(len(prompt)), rng.random(len(prompt))
        cached = stats.cached_disagg_tokens if role == "prefill" else stats.cached_mixed_tokens
        if role != "decode":
            hit = [prefill_seconds(perf, int(p - c), int(c), self.budget) for p, c in zip(prompt, cached, strict=True)]
            miss = [prefill_seconds(perf, int(p), 0, self.budget) for p in prompt]
            self._s_hit, self._s_miss = np.asarray(hit), np.asarray(miss)
            self._chunks = np.ceil(np.maximum(prompt - cached, 1) / self.budget)
            self._parked_kv = stats.parked_kv_tokens
        if role == "prefill":
            self._transfer = np.asarray([perf.kv_transfer_time_s(int(p)) for p in prompt])
        steps = np.maximum(out - 1, 0).astype(float)
        self._steps_mean = float(steps.mean())
        # Output-weighted mean context of a running sequence (long answers are in the batch longer).
        self._ctx = float((steps * (prompt + out / 2)).sum() / max(steps.sum(), 1.0))
        self.tpot_factor = 1.0
        self.ttft_factor = 1.0

    # --- building blocks ---------------------------------------------------------------
    def decode_step_s(self, batch: float) -> float:
        b = max(1, round(batch))
        return self.perf.step_time_s(StepShape(decode_seqs=b, decode_context_tokens=round(b * self._ctx)))

    def _service(self, hit: float) -> np.ndarray:
        return hit * self._s_hit + (1.0 - hit) * self._s_miss

    def _pool_latency(self, rate: float, servers: int, service: np.ndarray, extra: np.ndarray | float) -> np.ndarray | None:
        """Samples of ``W + S + extra`` in an M/G/c pool of ``servers``, each offered ``rate`` (None: saturated)."""
        mean_s = float(service.mean())
        rho = rate * mean_s
        if rho >= RHO_MAX:
            return None
        wait = np.zeros_like(service)
        if rho > 0:
            scv = float(service.var()) / mean_s**2
            law = allen_cunneen(servers, servers * rate, mean_s, scv)
            if law.p_wait > 0:
                wait = np.where(self._u < law.p_wait, -np.log(1.0 - self._v) * law.mean_wait_s / law.p_wait, 0.0)
        return wait + service + extra

    def _ttft(self, latency: np.ndarray, slo: SLO | None) -> tuple[float, float]:
        """(P95, attainment of the TTFT bound) of TTFT samples, with the calibration factor."""
        scaled = latency * self.ttft_factor
        att = float(np.count_nonzero(scaled <= slo.ttft_s)) / len(scaled) if slo is not None else 1.0
        return float(np.percentile(latency, 95)) * self.ttft_factor, att

    def _tpot_attainment(self, batch: float, stretch: float, slo: SLO | None) -> float:
        """Share of decode steps within the TPOT bound, the batch normal with mean and variance ``batch``."""
        if slo is None:
            return 1.0

        def ok(b: int) -> bool:
            return self.decode_step_s(b) * stretch * self.tpot_factor <= slo.tpot_s

        if not ok(1):
            return 0.0
        lo, hi = 1, max(1, self.max_num_seqs)
        if ok(hi):
            lo = hi
        while hi - lo > 1:  # the step grows with the batch: the largest batch within the bound
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        if batch <= 0:
            return 1.0
        return 0.5 * (1.0 + math.erf((lo + 0.5 - batch) / math.sqrt(2.0 * batch)))

    def _batch(self, rate: float, stretch: float = 1.0) -> tuple[float, str]:
        """Mean running batch solving ``B = rate E[steps] T(B) stretch``, and ``""`` or why it
        has no solution: the batch outgrows the KV (checked first: it overflows before the
        slot limit when contexts are long) or ``max_num_seqs``."""
        t = self.decode_step_s(1) * stretch
        for _ in range(200):
            b = rate * self._steps_mean * t
            if b * self._ctx > self.kv_capacity_tokens:
                return b, "kv"
            if b > self.max_num_seqs:
                return b, "seqs"
            t_new = self.decode_step_s(b) * stretch
            if abs(t_new - t) < 1e-9:
                break
            t = t_new
        return rate * self._steps_mean * t, ""

    def hit_fraction(self, pool_instances: int) -> float:
        """Share of cached prefixes still cached, when ``pool_instances`` hold the parked sessions' KV."""
        if self.role == "decode" or self._parked_kv <= 0:
            return 1.0
        return min(1.0, pool_instances * self.kv_capacity_tokens / self._parked_kv)

    # --- the prediction ------------------------------------------------------------------
    def predict(self, rate_per_s: float, hit: float = 1.0, servers: int = 1, slo: SLO | None = None) -> Prediction:
        """P95s of each of ``servers`` instances behind one router, each receiving ``rate_per_s``
        requests per second on average (the pool: Poisson at ``servers * rate_per_s``), and with
        ``slo`` the attainment of its bounds."""
        if servers < 1:
            raise ValueError(f"servers must be >= 1, got {servers}")
        if self.role == "prefill":
            service = self._service(hit)
            latency = self._pool_latency(rate_per_s, servers, service, self._transfer)
            util = rate_per_s * float(service.mean())
            if latency is None:
                return _infeasible(f"prefill compute saturated ({util:.0%} busy)", util)
            p95, att = self._ttft(latency, slo)
            return Prediction(p95, None, util, 0.0, 0.0, True, ttft_attainment=att)
        if self.role == "decode":
            return self._predict_decode(rate_per_s, 1.0, slo)
        service = self._service(hit)
        rho_p = rate_per_s * float(service.mean())
        if rho_p >= RHO_MAX:
            return _infeasible(f"prefill share saturated ({rho_p:.0%} busy)", rho_p)
        dec = self._predict_decode(rate_per_s, 1.0 / (1.0 - rho_p), slo)
        if not dec.feasible:
            return dec
        stretched = service + self._chunks * self.decode_step_s(dec.batch)
        latency = self._pool_latency(rate_per_s, servers, stretched, 0.0)
        if latency is None:
            return _infeasible("prefill queue saturated by decode steps", rate_per_s * float(stretched.mean()))
        util = max(rate_per_s * float(stretched.mean()), dec.utilization)
        ttft, att = self._ttft(latency, slo)
        return Prediction(ttft, dec.tpot_p95_s, util, dec.kv_utilization, dec.batch, True,
                          ttft_attainment=att, tpot_attainment=dec.tpot_attainment)

    def _predict_decode(self, rate: float, stretch: float, slo: SLO | None = None) -> Prediction:
        batch, over = self._batch(rate, stretch)
        if over == "kv":
            return _infeasible("decode KV overflows (the running batch outgrows it)", math.inf, math.inf)
        if over:
            return _infeasible(f"decode batch above max_num_seqs={self.max_num_seqs}")
        hi = batch + Z_95 * math.sqrt(batch)
        kv = hi * self._ctx / self.kv_capacity_tokens
        kv_mean = batch * self._ctx / self.kv_capacity_tokens
        if kv_mean > RHO_MAX:
            return _infeasible(f"decode KV overflows ({kv_mean:.0%} of capacity at the mean batch)", kv, kv)
        if hi > self.max_num_seqs:
            return _infeasible(f"decode batch above max_num_seqs={self.max_num_seqs}", hi / self.max_num_seqs, kv)
        tpot = self.decode_step_s(hi) * stretch * self.tpot_factor
        return Prediction(None, tpot, max(kv, hi / self.max_num_seqs), kv, batch, True,
                          tpot_attainment=self._tpot_attainment(batch, stretch, slo))

    def zero_load(self, slo: SLO | None = None) -> Prediction:
        """P95s with no queueing and a batch of one: the physical minimum of this shape (with
        ``slo``, the attainment of its bounds there)."""
        tpot_att = 1.0 if slo is None else float(self.decode_step_s(1) <= slo.tpot_s)
        if self.role == "decode":
            return Prediction(None, self.decode_step_s(1), 0.0, 0.0, 1.0, True, tpot_attainment=tpot_att)
        extra = self._transfer if self.role == "prefill" else 0.0
        alone = self._s_hit + extra
        ttft = float(np.percentile(alone, 95))
        ttft_att = 1.0 if slo is None else float(np.count_nonzero(alone <= slo.ttft_s)) / len(alone)
        tpot = self.decode_step_s(1) if self.role == "mixed" else None
        return Prediction(ttft, tpot, 0.0, 0.0, 1.0, True, ttft_attainment=ttft_att,
                          tpot_attainment=tpot_att if self.role == "mixed" else 1.0)

    def fastest_ttft_s(self) -> float:
        """The shortest TTFT of any sample alone (no queueing): below it no request meets a bound."""
        extra = self._transfer if self.role == "prefill" else 0.0
        return float(np.min(self._s_hit + extra))
