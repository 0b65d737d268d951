"""Splitting a transformers MoE model: which modules go remote, the expert checkpoint, the hooks."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
import transformers  # noqa: F401 - part of the eaas extra: a missing one must fail here, not skip

from tokenomy.eaas.checkpoint import load_experts, read_info, save_experts
from tokenomy.eaas.dispatch import ExpertDispatcher
from tokenomy.eaas.generation import StepHooks, Turnstile
from tokenomy.eaas.hf import RemoteExperts, attach_remote_experts, find_expert_layers, save_expert_checkpoint
from tokenomy.eaas.hf_models import ARCHITECTURES, tiny_config, tiny_model
from tokenomy.eaas.moe import ExpertWeights
from tokenomy.eaas.registry import Registry, RoutingTable

# MoE layers per architecture: DeepSeek-V3's first layer is dense (first_k_dense_replace=1).
MOE_LAYERS = {"deepseek-v3": [1, 2], "qwen3-moe": [0, 1, 2], "mixtral": [0, 1, 2]}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_moe_layer_is_found_with_consecutive_keys(arch: str) -> None:
    layers = find_expert_layers(tiny_model(arch))
    assert [ly.name for ly in layers] == [f"model.layers.{i}.mlp.experts" for i in MOE_LAYERS[arch]]
    assert [ly.key_offset for ly in layers] == [8 * i for i in range(len(layers))]
    assert all(ly.n_experts == 8 for ly in layers)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_checkpointed_expert_computes_what_the_model_computes(arch: str, tmp_path: Path) -> None:
    model = tiny_model(arch, seed=4)
    layers = save_expert_checkpoint(model, tmp_path / "experts.safetensors")
    last = layers[-1]
    key = last.key_offset + 5
    hidden, experts = load_experts(tmp_path / "experts.safetensors", [key])
    assert (hidden, list(experts)) == (model.config.hidden_size, [key])
    x = torch.randn(7, hidden, generator=torch.Generator().manual_seed(0))
    module = model.get_submodule(last.name)
    index, weights = torch.full((7, 1), 5), torch.ones(7, 1)
    with torch.no_grad():  # the model's own experts module, only expert 5 chosen with weight 1
        expected = module(x, index, weights)
    torch.testing.assert_close(experts[key](x), expected, atol=0, rtol=0)


def test_attach_replaces_only_the_routed_experts_and_keeps_gate_and_shared_expert() -> None:
    model = tiny_model("deepseek-v3")
    gate_before = model.model.layers[1].mlp.gate.weight.clone()
    d = ExpertDispatcher(RoutingTable(Registry()), hidden=model.config.hidden_size)
    layers = attach_remote_experts(model, d)
    for ly in layers:
        assert isinstance(model.get_submodule(ly.name), RemoteExperts)
    mlp = model.model.layers[1].mlp
    assert torch.equal(mlp.gate.weight, gate_before) and mlp.shared_experts.gate_proj.weight.numel() > 0
    assert not any("experts.gate_up_proj" in n for n, _ in model.named_parameters())
    with pytest.raises(ValueError, match="already remote"):
        attach_remote_experts(model, d)
    d.close()


def test_a_model_without_routed_experts_or_with_another_layout_is_refused() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    dense = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    with pytest.raises(ValueError, match="no routed-experts module"):
        find_expert_layers(dense)
    model = tiny_model("mixtral")
    model.model.layers[0].mlp.experts.has_bias = True
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts: experts with has_bias=True"):
        find_expert_layers(model)


def test_unknown_architecture_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: deepseek-v3, qwen3-moe, mixtral"):
        tiny_config("llama-moe")


def test_checkpoint_reads_only_what_it_holds_and_says_what_is_wrong(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    experts = {k: ExpertWeights(torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g),
                                torch.randn(6, 4, generator=g)) for k in (3, 4, 9)}
    path = tmp_path / "e.safetensors"
    save_experts(path, experts, {"layer.a": 0, "layer.b": 8})
    info = read_info(path)
    assert (info.hidden, info.keys, info.layers) == (6, (3, 4, 9), {"layer.a": 0, "layer.b": 8})
    hidden, part = load_experts(path, [9])
    assert hidden == 6 and list(part) == [9] and torch.equal(part[9].w_down, experts[9].w_down)
    with pytest.raises(ValueError, match=r"no expert keys \[5\]"):
        load_experts(path, [4, 5])
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not an expert checkpoint"):
        read_info(tmp_path / "other.safetensors")
    with pytest.raises(FileNotFoundError):
        read_info(tmp_path / "absent.safetensors")


def test_step_hooks_fire_at_the_start_of_the_step_after_the_named_token_and_time_every_step() -> None:
    seen: list[int] = []
    hooks = StepHooks({2: [lambda: seen.append(len(hooks.step_s))]})
    for _ in range(5):  # the prompt, then tokens 1..4
        hooks.put(torch.zeros(1, 1))
    assert seen == [2] and hooks.fired == [2] and len(hooks.step_s) == 4
    with pytest.raises(ValueError, match="1-based"):
        StepHooks({0: []})
    with pytest.raises(ValueError, match="new_tokens"):
        StepHooks(turnstile=Turnstile())


def test_lock_step_generations_take_turns_step_by_step() -> None:
    turns = Turnstile(2, timeout_s=10.0)
    order: list[tuple[int, int]] = []

    def run(slot: int) -> None:
        hooks = StepHooks({n: [lambda n=n: order.append((slot, n))] for n in (1, 2)}, turns, slot, new_tokens=3)
        for _ in range(4):  # what generate does: the prompt, then tokens 1..3
            hooks.put(torch.zeros(1, 1))

    threads = [threading.Thread(target=run, args=(slot,)) for slot in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads)
    assert order == [(0, 1), (1, 1), (0, 2), (1, 2)]


def test_a_turn_that_never_comes_times_out() -> None:
    with pytest.raises(TimeoutError, match="slot 1"):
        Turnstile(2, timeout_s=0.05).wait(1)
