"""Tokenizers of the emulator: a deterministic built-in one, or a Hugging Face ``tokenizer.json``.

The built-in tokenizer (``tokenomy-ws-v1``) needs no file and no download, and is fast (string
``split`` and dict lookups in C, about 0.1 us per token): text is cut at every space, and each
piece after the first keeps the space before it. ``"Hello, world  x\ny"`` is the four tokens
``"Hello,"``, ``" world"``, ``" "``, ``" x\ny"``; an empty first piece (text starting with a space)
makes no token. A token's id is ``CRC32(utf-8 bytes) mod vocab_size``, the same in every process.
Token counts are therefore whitespace-separated word counts (a real BPE vocabulary gives about 1.3
tokens per English word).

Decoding is defined on the ids the emulator generates, the :data:`WORDS` palette (``" " + word``,
one token each): generated text is made of those pieces, so it re-tokenizes to exactly the
generated ids, and because every generated piece starts with a space,
``encode(prompt + answer) == encode(prompt) + answer_ids`` for any prompt. What follows the answer
in a later prompt only changes the answer's last token if it does not start with a space; that
token's KV is never computed anyway (the last sampled token), so a later turn that repeats prompt +
answer hits the prefix cache for all their computed full blocks.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Protocol

_WORD_TEXT = """lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et
    dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris nisi aliquip ex ea
    commodo consequat duis aute irure in reprehenderit voluptate velit esse cillum fugiat nulla pariatur
    excepteur sint occaecat cupidatat non proident sunt culpa qui officia deserunt mollit anim id est
    laborum the of and to a is that for it as with was on be by this are or from at an not have which
    but all can has more one will were their been also time new some would other into only most
    first any about over may such then them these two our out could when like what so its than
    many used each where just well way very because between those both through after much under
    while might same before three here since great still long against part little own world year
    work made during number people water found state small large point order place case form group
    system value model data token cache block answer result query search table method note"""

WORDS = tuple(_WORD_TEXT.split())
"""The built-in palette of generated words (lorem ipsum, then common English)."""

_MAX_CACHED_PIECES = 1 << 20

DEFAULT_VOCAB_SIZE = 128256
"""Llama-3's vocabulary size; only the id range depends on it."""


class Tokenizer(Protocol):
    """What the emulator needs of a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added)."""
        ...

    def piece(self, token_id: int) -> str:
        """Text of one generated token id (a palette id)."""
        ...

    @property
    def palette(self) -> tuple[int, ...]:
        """Ids the emulator generates from; each decodes (with :meth:`piece`) to ``" " + word``."""
        ...


class _PaletteLookup:
    """``piece``/``palette`` over the ids the emulator generates (``_pieces``, ``_palette``)."""

    _pieces: dict[int, str]
    _palette: tuple[int, ...]

    def piece(self, token_id: int) -> str:
        try:
            return self._pieces[token_id]
        except KeyError:
            raise ValueError(f"token id {token_id} is not one the emulator generates") from None

    @property
    def palette(self) -> tuple[int, ...]:
        return self._palette


class WordTokenizer(_PaletteLookup):
    """The built-in deterministic tokenizer (see the module docstring)."""

    name = "tokenomy-ws-v1"

    def __init__(self, vocab_size: int = DEFAULT_VOCAB_SIZE) -> None:
        if vocab_size < 1024:
            raise ValueError(f"vocab_size must be >= 1024, got {vocab_size}")
        self.vocab_size = vocab_size
        # Piece -> id caches (a pure function, so safe to share): pieces after a space, first pieces.
        self._spaced: dict[str, int] = {}
        self._first: dict[str, int] = {}
        pieces: dict[int, str] = {}
        palette: list[int] = []
        for word in WORDS:
            tid = self._hash_id(" " + word)
            if tid not in pieces:  # skip the rare CRC collision so decoding stays exact
                pieces[tid] = " " + word
                palette.append(tid)
        self._pieces = pieces
        self._palette = tuple(palette)

    def _hash_id(self, piece: str) -> int:
        return zlib.crc32(piece.encode()) % self.vocab_size

    def encode(self, text: str) -> list[int]:
        parts = text.split(" ")
        head = parts[0]
        spaced = self._spaced
        out: list[int | None] = list(map(spaced.get, parts))
        if head:
            tid = self._first.get(head)
            if tid is None:
                if len(self._first) > _MAX_CACHED_PIECES:
                    self._first.clear()
                tid = self._first[head] = self._hash_id(head)
            out[0] = tid
        else:
            del out[0]
            del parts[0]
        if None in out:
            if len(spaced) > _MAX_CACHED_PIECES:
                spaced.clear()
            hash_id = self._hash_id
            for i, tid in enumerate(out):
                if tid is None:
                    piece = parts[i]
                    out[i] = spaced[piece] = hash_id(" " + piece)
        return out  # type: ignore[return-value]  # no None left



class HFTokenizer(_PaletteLookup):
    """A Hugging Face ``tokenizers`` file (``tokenizer.json``); needs the optional ``tokenizers`` package.

    The palette is the :data:`WORDS` whose ``" " + word`` is one token of this vocabulary; the
    constructor checks that a sentence made of them re-tokenizes to the same ids (true of
    byte-level BPE tokenizers such as Llama 3's or GPT-2's) and raises ValueError otherwise.
    """

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ValueError(
                "--tokenizer needs the 'tokenizers' package: pip install tokenizers"
            ) from exc
        if not Path(path).is_file():
            raise ValueError(f"--tokenizer: no such file: {path}")
        try:
            self._tok = _HF.from_file(str(path))
        except Exception as exc:
            raise ValueError(f"--tokenizer: cannot read {path}: {exc}") from exc
        self.name = Path(path).name
        pieces: dict[int, str] = {}
        for word in WORDS:
            ids = self._tok.encode(" " + word, add_special_tokens=False).ids
            if len(ids) == 1 and ids[0] not in pieces:
                pieces[ids[0]] = " " + word
        if len(pieces) < 8:
            raise ValueError(f"--tokenizer {path}: fewer than 8 of the palette words are single tokens")
        self._pieces = pieces
        self._palette = tuple(pieces)
        sample = list(self._palette[:64])
        text = "".join(pieces[i] for i in sample)
        if self.encode("Hello:" + text) != self.encode("Hello:") + sample:
            raise ValueError(
                f"--tokenizer {path}: generated text does not re-tokenize to the same ids; the emulator "
                "needs a tokenizer that keeps ' word' pieces whole (byte-level BPE does)"
            )

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)



def load_tokenizer(path: Path | None) -> Tokenizer:
    """The built-in tokenizer, or the ``tokenizer.json`` at ``path``."""
    return WordTokenizer() if path is None else HFTokenizer(path)
