"""What the request path estimates a prompt to be before the backend counts it: the budget hold
is priced on it, so everything the backend renders into the prompt must be in it."""

from __future__ import annotations

from typing import Any

import pytest

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.chat_adapter import CHAT
from tokenomy.gateway.http.parse import MEDIA_PART_TOKENS_ESTIMATE, parse_request
from tokenomy.gateway.routing.aliases import Aliases

MODELS = Aliases([], ["m"]).resolve


class _Req:
    headers: dict[str, str] = {}
    receive: Any = None


def _parse(**body: Any) -> Any:
    return parse_request(_Req(), {"model": "m", **body}, CHAT, MODELS)


def test_tool_schemas_and_media_parts_are_in_the_prompt_estimate() -> None:
    msgs = [{"role": "user", "content": "what is the weather in Paris?"}]
    plain = _parse(messages=msgs).prompt_tokens_estimate
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city. " * 20,
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    with_tools = _parse(messages=msgs, tools=[tool] * 5).prompt_tokens_estimate
    assert with_tools - plain >= 5 * 100  # five ~400-character schemas
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100}}
    with_images = _parse(messages=[{"role": "user", "content": [{"type": "text", "text": msgs[0]["content"]},
                                                                 image, image]}]).prompt_tokens_estimate
    assert with_images == plain + 2 * MEDIA_PART_TOKENS_ESTIMATE
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {f"f{i}": {} for i in range(50)}}}}
    assert _parse(messages=msgs, response_format=schema).prompt_tokens_estimate > plain + 50


@pytest.mark.parametrize(("fields", "choices"), [({}, 1), ({"n": 3}, 3), ({"n": 2, "best_of": 5}, 5)])
def test_choices_count_n_and_best_of(fields: dict[str, Any], choices: int) -> None:
    assert _parse(messages=[{"role": "user", "content": "hi"}], **fields).choices == choices


@pytest.mark.parametrize(("fields", "param"), [({"n": 0}, "n"), ({"n": 129}, "n"), ({"n": 4, "best_of": 2}, "best_of"),
                                               ({"n": "2"}, "n")])
def test_bad_choice_counts_are_400(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as err:
        _parse(messages=[{"role": "user", "content": "hi"}], **fields)
    assert (err.value.status, err.value.param) == (400, param)
