"""Request models and errors of the OpenAI-compatible API, validated as vLLM validates them.

Unknown fields are accepted and ignored, as vLLM does (it logs them); fields with the wrong type
or out of range are rejected with status 400 and an OpenAI-style error body
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class APIError(Exception):
    """An error answered as ``{"error": {...}}`` with ``status``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, type_: str | None = None,
                 validation: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        # A body that failed validation before any handler ran: vLLM answers these in OpenAI's
        # shape on every route, its Anthropic route included.
        self.validation = validation
        self.type = type_ or {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
                              503: "ServiceUnavailableError"}.get(status, "BadRequestError")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


def validation_error(exc: ValidationError) -> APIError:
    """The first pydantic error as a 400, naming the offending field."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
    msg = err.get("msg", "invalid request")
    return APIError(400, f"{loc}: {msg}" if loc else msg, param=loc or None, validation=True)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    """Sampling and serving fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    n: int | None = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    kv_transfer_params: dict[str, Any] | None = None
    user: str | None = None
    logprobs: bool | int | None = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: bool | int | None) -> bool | int | None:
        if v is not None and v is not False:
            raise ValueError("logprobs are not supported by the emulator")
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("the emulator supports n=1 only")
        return v

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"max_tokens must be at least 1, got {v}.")
        return v

    @field_validator("min_tokens")
    @classmethod
    def _min_tokens(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {v}.")
        return v

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float | None) -> float | None:
        if v is not None and v < 0:
            raise ValueError(f"temperature must be non-negative, got {v}.")
        return v

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {v}.")
        return v

    @model_validator(mode="after")
    def _cross(self) -> _Common:
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}."
            )
        return self

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk (vLLM: ``continuous_usage_stats`` together with ``include_usage``)."""
        return bool(self.stream_options and self.stream_options.include_usage
                    and self.stream_options.continuous_usage_stats)


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is a string, a list of token ids, or a list of one of those."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported by the emulator")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and v and isinstance(v[0], str | list):
            if len(v) != 1:
                raise ValueError("the emulator serves one prompt per request (got a batch)")
            v = v[0]
        if isinstance(v, str | list) and len(v) == 0:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and any(t < 0 for t in v):
            raise ValueError("token ids must be non-negative")
        return v


class ContentPart(BaseModel):
    """A content part: text (``text`` / ``input_text``) or an image (``image_url``, rendered as a
    placeholder: the emulator has no vision encoder)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text", "input_text", "image_url"]
    text: str | None = None
    image_url: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _fields(self) -> ContentPart:
        if self.type == "image_url":
            if not isinstance((self.image_url or {}).get("url"), str):
                raise ValueError("an image_url part needs image_url.url")
        elif self.text is None:
            raise ValueError("a text part needs text")
        return self


IMAGE_PLACEHOLDER = "<|image|>"


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """What the template renders: the content, then an assistant's tool-call arguments (the
        text the emulator generated for them, so a tool call re-renders as it was generated)."""
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            text = "".join(IMAGE_PLACEHOLDER if p.type == "image_url" else p.text or "" for p in self.content)
        return text + "".join(c.function.arguments for c in self.tool_calls or ())


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: dict[str, str]


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _completion_tokens(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            if self.max_completion_tokens < 1:
                raise ValueError(f"max_completion_tokens must be at least 1, got {self.max_completion_tokens}.")
            if self.max_tokens is None:
                self.max_tokens = self.max_completion_tokens
        return self

    @model_validator(mode="after")
    def _tools(self) -> ChatCompletionRequest:
        # vLLM's rules (vllm/entrypoints/openai/chat_completion/protocol.py, check_tool_usage)
        if self.tool_choice is None and self.tools:
            self.tool_choice = "auto"
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.get("name")
            if name not in {t.function.name for t in self.tools or ()}:
                raise ValueError("The tool specified in `tool_choice` does not match any of the specified `tools`")
        return self

    def forced_tools(self) -> list[FunctionDef]:
        """The tools one of which the answer must call: all for ``required``, the named one, or none."""
        tools = [t.function for t in self.tools or ()]
        if self.tool_choice == "required":
            return tools
        if isinstance(self.tool_choice, NamedToolChoice):
            return [t for t in tools if t.name == self.tool_choice.function.get("name")][:1]
        return []

    @property
    def named_tool_choice(self) -> bool:
        return isinstance(self.tool_choice, NamedToolChoice)
