"""From a completion request's body to a :class:`Job`: the prompt's token ids, checked against the
instance's model and context window as vLLM checks them, the planned answer and the P/D parameters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenomy.emulator.chat import render
from tokenomy.emulator.config import EmulatorConfig
from tokenomy.emulator.generation import OutputPlan, plan_output
from tokenomy.emulator.pd import history_tokens, pd_params
from tokenomy.emulator.protocol import APIError, ChatCompletionRequest, CompletionRequest
from tokenomy.emulator.tokenizer import Tokenizer
from tokenomy.emulator.tool_calls import plan_tool_call


@dataclass(slots=True)
class Job:
    """A validated request, ready to run: prompt ids, the planned answer, PD parameters."""

    request_id: str
    prompt_ids: list[int]
    plan: OutputPlan
    remote_decode: bool = False
    remote_prefill: dict[str, Any] | None = None
    cached_tokens: int = 0
    created_cache_tokens: int = 0  # prompt tokens this request wrote to the prefix cache (vLLM's created_cache_tokens)
    transfer_s: float = 0.0
    kv_transfer_params: dict[str, Any] | None = field(default=None)
    client_request_id: str = ""  # the x-request-id the client sent
    retain_ttl_s: float | None = None  # a retention hint applied to this job
    history_tokens: int = 0  # prefill side: prompt-prefix KV to pull from the decode instance (pd.HISTORY_KEY)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


def plan_job(body: CompletionRequest | ChatCompletionRequest, new_id: Callable[[], str], *,
             config: EmulatorConfig, tokenizer: Tokenizer, model_name: str, window: int) -> Job:
    """Validate ``body`` against an instance serving ``model_name`` with a context ``window`` and plan
    the answer, under an id from ``new_id`` (called once the request is valid); raises :class:`APIError`."""
    if body.model is not None and body.model != model_name:
        raise APIError(404, f"The model `{body.model}` does not exist.", param="model", type_="NotFoundError")
    if isinstance(body, ChatCompletionRequest):
        prompt_ids = tokenizer.encode(render(body.messages, body.add_generation_prompt))
    elif isinstance(body.prompt, str):
        prompt_ids = tokenizer.encode(body.prompt)
    else:
        prompt_ids = list(body.prompt)  # type: ignore[arg-type]
    n_prompt = len(prompt_ids)
    if n_prompt == 0:
        raise APIError(400, "The prompt is empty after tokenization.", param="prompt")
    # vLLM 0.32's rules (tests/realvllm/test_conformance.py): a prompt that leaves no room for one
    # output token is refused, max_tokens above the window is refused, and a max_tokens that only
    # overflows together with the prompt is cut to what fits.
    if n_prompt >= window:
        raise APIError(400, f"This model's maximum context length is {window} tokens. However, your prompt "
                            f"contains at least {n_prompt} input tokens, which exceeds this limit even without "
                            "any output tokens. Please reduce the length of the input prompt.",
                       param="input_tokens")
    if body.max_tokens is not None and body.max_tokens > window:
        raise APIError(400, f"max_tokens={body.max_tokens} cannot be greater than max_model_len={window}. "
                            "Please request fewer output tokens.", param="max_tokens")
    max_tokens = window - n_prompt if body.max_tokens is None else min(body.max_tokens, window - n_prompt)
    remote_decode, remote_prefill = pd_params(body.kv_transfer_params, config.kv_peers)
    history = history_tokens(body.kv_transfer_params) if remote_decode else 0
    if remote_decode:
        max_tokens = 1  # the prefill side samples one token (the proxy sends max_tokens=1 anyway)
    forced = body.forced_tools() if isinstance(body, ChatCompletionRequest) and not remote_decode else []
    if forced:
        plan = plan_tool_call(tokenizer, prompt_ids, forced, max_tokens=max_tokens, seed=body.seed)
    else:
        plan = plan_output(
            tokenizer, prompt_ids, max_tokens=max_tokens, min_tokens=min(body.min_tokens, max_tokens),
            ignore_eos=body.ignore_eos, eos_mean_tokens=config.eos_mean_tokens, seed=body.seed,
            stop=body.stop_strings(), include_stop_str_in_output=body.include_stop_str_in_output,
        )
    if not plan.token_ids:  # a stop string inside the first token: vLLM still computes one token
        plan = OutputPlan(plan_output(tokenizer, prompt_ids, max_tokens=1, ignore_eos=True,
                                      seed=body.seed).token_ids, [""], "stop", plan.matched_stop)
    job = Job(new_id(), prompt_ids, plan, remote_decode, remote_prefill)
    job.history_tokens = min(history, n_prompt - 1)
    return job
