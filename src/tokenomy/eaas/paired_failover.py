"""Failover cost as a paired comparison: the same greedy generation with and without a SIGKILL.

Setup: two identical deployments of a tiny ``transformers`` MoE model (``hf_models``), each an EAAS
client whose routed experts are served by its own ``n_servers`` expert servers, every expert on
``replicas`` of them. One *pair* is the same generation on both, in two threads taking turns step by
step (``generation.Turnstile``): on one deployment server ``s0`` gets SIGKILL at the start of step
``kill_after_token + 1``, the other is the control. Step j of both runs within milliseconds of each
other, so the load of a shared machine, which drifts over tens of milliseconds and more, cancels.
Which deployment is killed alternates from pair to pair, and so does which one steps first. After a
kill a fresh ``s0`` process registers there (outside the timed part) for the next pair.

Figures, per pair, over the *window* from the kill to the last token (steps k+1..n). Step j of the
two runs are paired; a shared 2-core machine adds scheduler stalls of tens of milliseconds to random
steps of either run, so the steps after the failover step enter through the median of their paired
differences, a robust estimate of the lasting slowdown:

- ``resent_s = x[k+1] - c[k+1]``: the step in which the client meets the dead server, masks it and
  resends its groups to replicas (x: killed run, c: control);
- ``capacity_s = (n - k - 1) * median_j(x[j] - c[j]) for j in k+2..n``: one server fewer, nothing
  resent any more;
- ``drop = (resent_s + capacity_s) / window_x`` with ``window_x = window_c + resent_s + capacity_s``
  and ``window_c = c[k+1] + (n - k - 1) * median_j c[j]``; ``resent_part`` and ``capacity_part`` are
  the two terms, so ``drop = resent_part + capacity_part``;
- ``noise_before = median_j(x[j] - c[j]) / median_j(c[j])`` over steps 2..k, where both runs are
  alike: the noise floor of the same estimator;
- ``drop_window = 1 - sum(c[k+1..n]) / sum(x[k+1..n])``: the plain ratio of the two windows, stalls
  included, reported beside it.

A step's time counts only while its thread holds the turn. The SIGKILL is sent at the start of
the killed run's step k+1 and the dead process is reaped (``teardown_ms``) before that step's clock
starts: the kernel's teardown of a dying process on the *same* two cores is a cost of running every
server on one machine, not of EAAS (on a cluster it happens on another node). With
``charge_teardown`` the teardown is inside the step and lands in ``resent_part``.

Reported: medians over pairs, p90, min/max, and every pair. ``judged`` is False when the noise
floor (``|noise_before_median|``) exceeds ``max_noise_floor``: then the machine was too busy for the
drop to mean anything, and the report says so instead of passing a verdict.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tokenomy.eaas.balance import naive_placement
from tokenomy.eaas.dispatch import ExpertDispatcher
from tokenomy.eaas.generation import Generation, StepHooks, Turnstile, generate
from tokenomy.eaas.hf import attach_remote_experts, save_expert_checkpoint
from tokenomy.eaas.hf_models import ARCHITECTURES, prompts, tiny_model
from tokenomy.eaas.launcher import ServerProcess, start_servers, stop_all
from tokenomy.eaas.registry import Registry, RoutingTable
from tokenomy.eaas.stats import quantile


@dataclass(frozen=True)
class PairedFailoverConfig:
    arch: str = "deepseek-v3"
    n_servers: int = 4
    replicas: int = 2
    pairs: int = 15
    batch: int = 4
    prompt_tokens: int = 16
    new_tokens: int = 64
    kill_after_token: int = 16
    # Per request. A SIGKILL is seen at once, through the dropped connection; the timeout only
    # catches a hung server. At 0.5 s, a 2-core machine at load 18 masked healthy servers until
    # no replica of an expert was left (ExpertUnavailable).
    timeout_s: float = 5.0
    charge_teardown: bool = False
    max_noise_floor: float = 0.01  # |noise_before_median| above this: the drop is not judged
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.arch!r}; known: {', '.join(ARCHITECTURES)}")
        if not 2 <= self.replicas <= self.n_servers:
            raise ValueError(f"need 2 <= replicas <= n_servers (a kill must leave a replica), got "
                             f"{self.replicas}, {self.n_servers}")
        if self.pairs < 1 or not 2 <= self.kill_after_token < self.new_tokens - 1:
            raise ValueError(f"need pairs >= 1 and 2 <= kill_after_token < new_tokens - 1, got {self.pairs}, "
                             f"{self.kill_after_token}, {self.new_tokens}")


@dataclass(frozen=True)
class Pair:
    drop: float
    drop_window: float
    resent_part: float
    capacity_part: float
    noise_before: float
    window_s_control: float
    window_s_kill: float
    failover_wait_s: float   # the client's own measure of the stall (failure seen -> resent reply in)
    resent_tokens: int
    teardown_ms: float       # SIGKILL until the process is reaped
    killed_deployment: int
    kill_steps_first: bool
    step_ms_control: list[float] = field(default_factory=list)  # the raw figures behind the pair
    step_ms_killed: list[float] = field(default_factory=list)


@dataclass
class PairedFailoverReport:
    pairs: int
    drop_median: float
    drop_p90: float
    drop_min: float
    drop_max: float
    drop_window_median: float
    drop_window_p90: float
    resent_part_median: float
    capacity_part_median: float
    noise_before_median: float
    failover_wait_ms_median: float
    teardown_ms_median: float
    tokens_identical: bool
    max_abs_logit_err: float
    judged: bool
    per_pair: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def pair_figures(control: Generation, killed: Generation, k: int) -> tuple[float, float, float, float, float]:
    """``(drop, drop_window, resent_part, capacity_part, noise_before)`` of one pair (module docstring)."""
    c, x = control.step_s, killed.step_s
    after = range(k + 1, len(c))
    resent_s = x[k] - c[k]
    capacity_s = len(after) * quantile([x[j] - c[j] for j in after], 0.5)
    window_x = c[k] + len(after) * quantile([c[j] for j in after], 0.5) + resent_s + capacity_s
    before = range(1, k)  # step 1 (the prefill) left out: it is not a decode step
    noise = quantile([x[j] - c[j] for j in before], 0.5) / quantile([c[j] for j in before], 0.5)
    drop_window = 1 - sum(c[k:]) / sum(x[k:])
    return (resent_s + capacity_s) / window_x, drop_window, resent_s / window_x, capacity_s / window_x, noise


class _Deployment:
    """Servers, registry and an EAAS client model; ``restart_victim`` brings a killed s0 back."""

    def __init__(self, cfg: PairedFailoverConfig, checkpoint: Path, n_keys: int) -> None:
        self.cfg, self.checkpoint = cfg, checkpoint
        ids = [f"s{i}" for i in range(cfg.n_servers)]
        self.placement = naive_placement(n_keys, ids, cfg.replicas)
        self.servers: list[ServerProcess] = []
        self.servers = start_servers(self.placement, expert_file=checkpoint)
        self.registry = Registry()
        for s in self.servers:
            self.registry.register(s.server_id, s.address, s.expert_ids)
        self.model = tiny_model(cfg.arch, cfg.seed)
        self.dispatcher = ExpertDispatcher(RoutingTable(self.registry), self.model.config.hidden_size,
                                           timeout_s=cfg.timeout_s)
        attach_remote_experts(self.model, self.dispatcher)

    @property
    def victim(self) -> ServerProcess:
        return self.servers[0]

    def restart_victim(self, prompt: torch.Tensor, new_tokens: int) -> None:
        """A fresh s0 for the killed one, registered (new epoch: unmasked) and warmed up by one
        untimed generation, so no pair times a cold process or a connection handshake."""
        self.victim.stop()  # reaps the killed process
        (fresh,) = start_servers({"s0": self.placement["s0"]}, expert_file=self.checkpoint)
        self.servers[0] = fresh
        self.registry.register(fresh.server_id, fresh.address, fresh.expert_ids)
        generate(self.model, prompt, new_tokens)

    def close(self) -> None:
        self.dispatcher.close()
        stop_all(self.servers)


def _lockstep(deps: list[_Deployment], prompt: torch.Tensor, new_tokens: int, first: int,
              actions: dict[int, dict[int, list[Any]]], actions_timed: bool = True) -> list[Generation]:
    """The same generation on every deployment, in threads taking turns step by step (``first``
    steps first); ``actions[d]`` are deployment d's step actions."""
    turns = Turnstile(len(deps))
    results: list[Generation | None] = [None] * len(deps)
    errors: list[BaseException] = []

    def run(d: int) -> None:
        slot = (d - first) % len(deps)
        try:
            hooks = StepHooks(actions.get(d), turns, slot, new_tokens, actions_timed)
            results[d] = generate(deps[d].model, prompt, new_tokens, hooks)
        except BaseException as exc:  # reported in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(d,), name=f"eaas-pair-{d}") for d in range(len(deps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [g for g in results if g is not None]


def _run_pair(deps: list[_Deployment], prompt: torch.Tensor, cfg: PairedFailoverConfig,
              i: int) -> tuple[Pair, list[Generation]]:
    """Pair ``i``: deployment ``i % 2`` loses s0 after token k, the other is the control."""
    k = cfg.kill_after_token
    killed, first = i % 2, (i // 2) % 2
    dep = deps[killed]
    stats = dep.dispatcher.stats
    wait0, resent0 = stats.failover_wait_s, stats.resent_tokens
    teardown: list[float] = []

    def kill(v: ServerProcess = dep.victim) -> None:
        t0 = time.perf_counter()
        v.kill(wait=True)
        teardown.append(time.perf_counter() - t0)

    runs = _lockstep(deps, prompt, cfg.new_tokens, first, {killed: {k: [kill]}}, cfg.charge_teardown)
    wait_s, resent = stats.failover_wait_s - wait0, stats.resent_tokens - resent0
    dep.restart_victim(prompt, cfg.new_tokens)
    control, hit = runs[1 - killed], runs[killed]
    if hit.fired != [k]:
        raise RuntimeError(f"the kill fired at steps {hit.fired}, expected [{k}]")
    pair = Pair(*pair_figures(control, hit, k), sum(control.step_s[k:]), sum(hit.step_s[k:]), wait_s, resent,
                1000 * teardown[0], killed, killed == first, [round(1000 * t, 3) for t in control.step_s],
                [round(1000 * t, 3) for t in hit.step_s])
    return pair, runs


def run_paired_failover(cfg: PairedFailoverConfig) -> PairedFailoverReport:
    """Run ``cfg.pairs`` pairs; every server started here is stopped before returning or raising."""
    torch.set_num_threads(1)
    reference_model = tiny_model(cfg.arch, cfg.seed)
    prompt = prompts(reference_model.config.vocab_size, cfg.batch, cfg.prompt_tokens, cfg.seed + 1)
    reference = generate(reference_model, prompt, cfg.new_tokens)
    pairs: list[Pair] = []
    identical, max_err = True, 0.0
    with tempfile.TemporaryDirectory(prefix="eaas-paired-") as tmp:
        checkpoint = Path(tmp) / "experts.safetensors"
        layers = save_expert_checkpoint(reference_model, checkpoint)
        del reference_model  # the clients below hold no routed expert
        deps: list[_Deployment] = []
        try:
            for _ in range(2):
                deps.append(_Deployment(cfg, checkpoint, layers[-1].keys().stop))
            _lockstep(deps, prompt, cfg.new_tokens, 0, {})  # warm-up: connections, allocator
            for i in range(cfg.pairs):
                pair, runs = _run_pair(deps, prompt, cfg, i)
                pairs.append(pair)
                for g in runs:
                    identical = identical and torch.equal(g.tokens, reference.tokens)
                    max_err = max(max_err, float((g.logits - reference.logits).abs().max()))
        finally:
            for dep in deps:
                dep.close()
    drops = [p.drop for p in pairs]
    return PairedFailoverReport(
        pairs=len(pairs), drop_median=quantile(drops, 0.5), drop_p90=quantile(drops, 0.9),
        drop_min=min(drops), drop_max=max(drops),
        drop_window_median=quantile([p.drop_window for p in pairs], 0.5),
        drop_window_p90=quantile([p.drop_window for p in pairs], 0.9),
        resent_part_median=quantile([p.resent_part for p in pairs], 0.5),
        capacity_part_median=quantile([p.capacity_part for p in pairs], 0.5),
        noise_before_median=(noise := quantile([p.noise_before for p in pairs], 0.5)),
        judged=abs(noise) <= cfg.max_noise_floor,
        failover_wait_ms_median=1000 * quantile([p.failover_wait_s for p in pairs], 0.5),
        teardown_ms_median=quantile([p.teardown_ms for p in pairs], 0.5),
        tokens_identical=identical, max_abs_logit_err=max_err,
        per_pair=[asdict(p) for p in pairs], config=asdict(cfg),
    )
