"""A transformers MoE model generates the same tokens with its routed experts on expert servers, through
a SIGKILL mid-generation and through scaling (a server added, one drained and removed).

Per architecture: s1 hosts the even keys, s2 the odd keys, and s0 one replica of expert 0 of every
MoE layer, so one expert per layer lives on two servers. These three run for all tests of an
architecture; a server a test kills or removes is its own. Events fire between decode
steps (``StepHooks``); every generation is compared with the monolith's own ``generate``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
import transformers  # noqa: F401 - part of the eaas extra: a missing one must fail here, not skip

from tokenomy.eaas.dispatch import ExpertDispatcher
from tokenomy.eaas.generation import Generation, StepHooks, generate
from tokenomy.eaas.hf import ExpertLayer, attach_remote_experts, save_expert_checkpoint
from tokenomy.eaas.hf_models import ARCHITECTURES, prompts, tiny_model
from tokenomy.eaas.launcher import ServerProcess, start_servers, stop_all
from tokenomy.eaas.registry import Registry, RoutingTable, ServerState

from .conftest import Fleet

pytestmark = pytest.mark.integration
NEW_TOKENS = 12


@dataclass
class Setup:
    arch: str
    checkpoint: Path
    layers: list[ExpertLayer]
    prompt: torch.Tensor
    reference: Generation
    base: list[ServerProcess]  # s0 (replicas), s1 (even keys), s2 (odd keys): shared, never stopped by a test

    @property
    def replicated(self) -> list[int]:
        return [ly.key_offset for ly in self.layers]  # expert 0 of every MoE layer

    def client(self, servers: list[ServerProcess]) -> tuple[Any, Registry, ExpertDispatcher]:
        model = tiny_model(self.arch, seed=0)
        reg = Registry()
        for s in servers:
            reg.register(s.server_id, s.address, s.expert_ids)
        dispatcher = ExpertDispatcher(RoutingTable(reg), model.config.hidden_size, timeout_s=2.0)
        attach_remote_experts(model, dispatcher)
        return model, reg, dispatcher


@pytest.fixture(scope="module", params=ARCHITECTURES)
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    arch = request.param
    model = tiny_model(arch, seed=0)
    prompt = prompts(model.config.vocab_size, batch=2, length=6, seed=1)
    reference = generate(model, prompt, NEW_TOKENS)  # the monolith: every expert in this process
    path = tmp_path_factory.mktemp(arch) / "experts.safetensors"
    layers = save_expert_checkpoint(model, path)
    n_keys = layers[-1].keys().stop
    replicated = [ly.key_offset for ly in layers]
    base = start_servers({"s0": replicated, "s1": range(0, n_keys, 2), "s2": range(1, n_keys, 2)},
                         expert_file=path)
    try:
        yield Setup(arch, path, layers, prompt, reference, base)
    finally:
        stop_all(base)


def _assert_same_generation(got: Generation, ref: Generation) -> None:
    assert torch.equal(got.tokens, ref.tokens)
    # Same expert rows, same combine order: bit-identical in our runs; 1e-5 allows another GEMM kernel.
    torch.testing.assert_close(got.logits, ref.logits, atol=1e-5, rtol=0)


def test_generation_over_three_expert_servers_equals_the_monolith(setup: Setup) -> None:
    model, reg, d = setup.client(setup.base)
    try:
        _assert_same_generation(generate(model, setup.prompt, NEW_TOKENS), setup.reference)
    finally:
        d.close()
    assert all(reg.server_tokens[s] > 0 for s in ("s0", "s1", "s2")), dict(reg.server_tokens)
    assert d.stats.failovers == 0


def test_a_server_sigkilled_mid_generation_is_masked_and_the_tokens_do_not_change(setup: Setup,
                                                                                  fleet: Fleet) -> None:
    (victim,) = fleet({"v0": setup.replicated}, expert_file=setup.checkpoint)
    model, reg, d = setup.client([victim, *setup.base[1:]])  # v0 stands in for s0
    served: list[int] = []

    def kill() -> None:
        served.append(reg.server_tokens["v0"])
        victim.kill()

    try:
        got = generate(model, setup.prompt, NEW_TOKENS, StepHooks({3: [kill]}))
    finally:
        d.close()
    assert got.fired == [3] and served[0] > 0 and not victim.alive()
    _assert_same_generation(got, setup.reference)
    assert d.stats.failovers >= 1 and d.stats.resent_tokens > 0
    assert [s.state for s in reg.servers() if s.server_id == "v0"] == [ServerState.FAILED]


def test_a_server_added_and_one_drained_and_removed_mid_generation_keep_the_tokens(setup: Setup,
                                                                                    fleet: Fleet) -> None:
    (old,) = fleet({"r0": setup.replicated}, expert_file=setup.checkpoint)
    new = setup.base[0]  # s0 runs, but this client's registry does not know it yet
    model, reg, d = setup.client([old, *setup.base[1:]])
    at_drain: list[int] = []

    def scale_out_and_drain() -> None:  # s0 joins and takes over r0's experts: their traffic moves to it
        reg.register(new.server_id, new.address, new.expert_ids)
        reg.drain("r0")
        at_drain.append(reg.server_tokens["r0"])

    def remove() -> None:
        reg.deregister("r0")
        old.stop()

    try:
        got = generate(model, setup.prompt, NEW_TOKENS, StepHooks({3: [scale_out_and_drain], 6: [remove]}))
    finally:
        d.close()
    assert got.fired == [3, 6] and not old.alive()
    _assert_same_generation(got, setup.reference)
    assert at_drain[0] > 0 and reg.server_tokens["r0"] == at_drain[0]  # nothing new reached the drained one
    assert reg.server_tokens["s0"] > 0
    assert d.stats.failovers == 0  # a drain is not a failure
    assert [e for e, _ in reg.events] == ["register"] * 4 + ["drain", "deregister"]
