"""Tiny ``transformers`` MoE models with random weights, built locally from a config (no download).

Each has the routing of its family and shapes small enough for a 2-core CPU:

- ``deepseek-v3``: DeepseekV3ForCausalLM: MLA attention, a dense first layer, sigmoid scores with the
  load-balancing bias ``e_score_correction_bias`` (random here, zero in a fresh model), top-2 of 8
  experts limited to 2 of 4 groups, normalised and scaled by ``routed_scaling_factor`` 2.5, one
  shared expert.
- ``qwen3-moe``: Qwen3MoeForCausalLM: softmax top-2 of 8, renormalised, no shared expert.
- ``mixtral``: MixtralForCausalLM: softmax top-2 of 8, no shared expert.

``initializer_range`` is raised from the 0.02 of the real models to 0.2: with 0.02 a random tiny
model's top-2 logits lie within 1e-4 of each other, so greedy decoding would be a test of float noise.
"""

from __future__ import annotations

from typing import Any

import torch

ARCHITECTURES = ("deepseek-v3", "qwen3-moe", "mixtral")
INIT_STD = 0.2
_COMMON: dict[str, Any] = dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                               num_key_value_heads=2, max_position_embeddings=256, initializer_range=INIT_STD,
                               num_experts_per_tok=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                               tie_word_embeddings=False)


def tiny_config(arch: str) -> Any:
    """The ``transformers`` config of the named tiny architecture (see the module docstring)."""
    import transformers as tf

    if arch == "deepseek-v3":
        return tf.DeepseekV3Config(**_COMMON | dict(num_key_value_heads=4), intermediate_size=128,
                                   moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1,
                                   n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                                   first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
    if arch == "qwen3-moe":
        return tf.Qwen3MoeConfig(**_COMMON, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                                 norm_topk_prob=True)
    if arch == "mixtral":
        return tf.MixtralConfig(**_COMMON, intermediate_size=32, num_local_experts=8)
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")


def tiny_model(arch: str, seed: int = 0) -> Any:
    """A float32 model of ``tiny_config(arch)`` in eval mode, its random weights drawn from ``seed``
    (the global RNG is left as it was)."""
    import transformers as tf

    cfg = tiny_config(arch)
    cls = {"deepseek-v3": tf.DeepseekV3ForCausalLM, "qwen3-moe": tf.Qwen3MoeForCausalLM,
           "mixtral": tf.MixtralForCausalLM}[arch]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(cfg).eval()
        for m in model.modules():
            bias = getattr(m, "e_score_correction_bias", None)
            if isinstance(bias, torch.Tensor):  # DeepSeek's router bias: exercise it (zeros in a fresh model)
                bias.copy_(torch.rand_like(bias) * 0.1)
    return model


def prompts(vocab_size: int, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """``[batch, length]`` token ids drawn from ``seed``, avoiding the special ids 0..2."""
    return torch.randint(3, vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))
