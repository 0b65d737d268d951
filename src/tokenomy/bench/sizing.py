"""Prompt sizing in the target's own tokens: which filler words are one token there, and how many
tokens the server adds to every prompt (BOS) and, for chat, per message (the chat template).

The bench fills a workload's new-input positions with filler words, one word per workload token
(:mod:`tokenomy.bench.text`). That holds only for words the target's tokenizer keeps whole, so
:func:`measure_sizing` asks the target's tokenizer which of :data:`~tokenomy.bench.text.WORDS`
are one token, checks that a sentence of them counts one token per word, and measures the
template's overhead by differences (``[user]`` vs ``[user, assistant]`` vs ``[user, assistant,
user]`` ...). The prompt builder then takes those overhead tokens out of the filler, so the
target counts the workload's size. Two tokenizers: the target's ``POST /tokenize`` (vLLM's
protocol, also served by our emulator) or a local ``tokenizer.json`` (completions only: a file
carries no chat template).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import httpx
import numpy as np

from tokenomy.bench.client import Opener
from tokenomy.bench.text import MIN_WORDS, WORDS, PromptSizing


class TokenCounter(Protocol):
    """A target's tokenizer as sizing sees it."""

    name: str

    def count(self, text: str) -> int:
        """Tokens of ``text`` sent as a completions prompt (special tokens the server adds included)."""
        ...

    def count_chat(self, messages: list[dict[str, str]]) -> int | None:
        """Tokens of ``messages`` rendered by the chat template with the generation prompt; None when
        this tokenizer cannot render the template."""
        ...


class RemoteTokenizer:
    """The target's ``POST /tokenize`` (vLLM's protocol: ``{"prompt"}`` or ``{"messages"}`` in,
    ``{"count", "tokens", "max_model_len"}`` out)."""

    def __init__(self, target: str, *, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=target, headers=headers, timeout=timeout_s, transport=transport)
        self._model = model
        self.name = self.url = f"{target}/tokenize"

    def _post(self, body: dict[str, Any]) -> int:
        if self._model:
            body = {"model": self._model, **body}
        resp = self._client.post("/tokenize", json=body)
        if resp.status_code != 200:
            raise ValueError(f"{self.name} answered {resp.status_code}: {resp.text[:200]}")
        count = resp.json().get("count")
        if not isinstance(count, int):
            raise ValueError(f"{self.name} answered without an integer 'count'")
        return count

    def count(self, text: str) -> int:
        return self._post({"prompt": text})

    def count_chat(self, messages: list[dict[str, str]]) -> int | None:
        return self._post({"messages": messages})

    def close(self) -> None:
        self._client.close()


def probe_remote(target: str, *, model: str | None = None, api_key: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> RemoteTokenizer | None:
    """A :class:`RemoteTokenizer` when ``target`` serves ``POST /tokenize``, else None."""
    tok = RemoteTokenizer(target, model=model, api_key=api_key, timeout_s=10.0, transport=transport)
    try:
        tok.count(" the")
    except (httpx.HTTPError, ValueError):
        tok.close()
        return None
    return tok


class FileTokenizer:
    """A local Hugging Face ``tokenizer.json`` (needs the ``tokenizers`` package). It adds the
    special tokens its post-processor adds (e.g. Llama 3's BOS); it has no chat template."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError("--tokenizer FILE needs the 'tokenizers' package: pip install tokenizers") from None
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise ValueError(f"--tokenizer: no such file: {p}")
        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as exc:
            raise ValueError(f"--tokenizer {p}: cannot read it as a tokenizer.json ({exc})") from None
        self.name = self.path = str(p)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def count_plain(self, text: str) -> int:
        """Tokens of ``text`` inside a prompt (no special tokens added)."""
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_chat(self, messages: list[dict[str, str]]) -> int | None:
        return None


def measure_sizing(tok: TokenCounter, api: str, *, seed: int = 0) -> PromptSizing:
    """Single-token filler words and template overheads of ``tok`` for ``api`` (``"chat"`` or
    ``"completions"``). Raises ValueError when fewer than :data:`MIN_WORDS` words are one token
    or when a sentence of them does not count one token per word (a tokenizer that merges across
    spaces cannot be sized this way)."""
    base = tok.count("")
    words = tuple(w for w in WORDS if tok.count(" " + w) - base == 1)
    if len(words) < MIN_WORDS:
        raise ValueError(f"{tok.name}: only {len(words)} of the bench's {len(WORDS)} filler words are one token; "
                         f"prompt sizing needs {MIN_WORDS}")
    rng = np.random.default_rng(seed)
    sentence = "".join(" " + words[i] for i in rng.integers(0, len(words), size=256))
    got = tok.count(sentence) - base
    if got != 256:
        raise ValueError(f"{tok.name}: a sentence of 256 single-token words counts {got} tokens; the tokenizer "
                         "merges across words, so the bench cannot size prompts word by word")
    where = {"tokenize_url": getattr(tok, "url", None), "tokenizer_path": getattr(tok, "path", None)}
    if api != "chat":
        return PromptSizing(words, base, {}, source=f"{tok.name} ({len(words)} filler words)", **where)
    w = " " + words[0]

    def chat(*roles: str) -> int:
        n = tok.count_chat([{"role": r, "content": w} for r in roles])
        if n is None:
            raise LookupError
        return n

    try:
        user = chat("user")
        user_asst = chat("user", "assistant")
        per_role = {"assistant": user_asst - user - 1, "user": chat("user", "assistant", "user") - user_asst - 1,
                    "system": chat("system", "user") - user - 1}
    except LookupError:
        # No template: the filler is sized, the template's tokens are not (the report shows the gap).
        return PromptSizing(words, base, {}, source=f"{tok.name} ({len(words)} filler words; chat template unknown)",
                            **where)
    fixed = user - 1 - per_role["user"]
    if fixed < 0 or min(per_role.values()) < 0:
        raise ValueError(f"{tok.name}: the chat template's overheads do not add up per message ({per_role}, fixed "
                         f"{fixed}); the bench cannot size chat prompts for it")
    return PromptSizing(words, fixed, per_role, source=f"{tok.name} ({len(words)} filler words, chat template)",
                        **where)


class AnswerCounter:
    """Counts an answer's text in the target's tokens while the bench runs, with the tokenizer a
    :class:`PromptSizing` was measured with: the target's ``/tokenize`` through the bench's own
    connection pool, or the local file. ``count`` returns None when the target cannot say."""

    def __init__(self, sizing: PromptSizing, model: str) -> None:
        self._url = sizing.tokenize_url
        self._model = model
        self._file = FileTokenizer(sizing.tokenizer_path) if sizing.tokenizer_path and not self._url else None

    @property
    def active(self) -> bool:
        return self._url is not None or self._file is not None

    async def count(self, opener: Opener, text: str, headers: dict[str, str]) -> int | None:
        if self._file is not None:
            return self._file.count_plain(text)
        if self._url is None:
            return None
        try:
            async with opener(self._url, {"model": self._model, "prompt": text, "add_special_tokens": False},
                              headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    return None
            count = json.loads(raw).get("count")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None  # a failed count costs sizing precision, never the run
        return count if isinstance(count, int) else None
