"""Fuzz every trace and session reader: random bytes and mutated valid files give either sessions
or one ValueError line naming the file, never another exception (a traceback) or a hang.

Bounded: a few hundred small examples per reader, well under a minute in all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenomy.workload import load_workload, read_azure, read_mooncake, read_sessions

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

SESSION_LINES = [
    {"session_id": "a", "turn": 0, "arrival_s": 0.5, "input_tokens": 600, "output_tokens": 20,
     "prefix_hashes": [1, 2], "hash_block_tokens": 512},
    {"session_id": "a", "turn": 1, "think_time_s": 2.0, "input_tokens": 900, "output_tokens": 10,
     "history_tokens": 620},
    {"session_id": "b", "turn": 0, "arrival_s": 1.0, "input_tokens": 30, "output_tokens": 5,
     "content": [[7, 35]], "tenant": "t", "priority": 1},
]
MOONCAKE_LINES = [
    {"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]},
    {"timestamp": 3000, "input_length": 1100, "output_length": 9, "hash_ids": [1, 2, 3]},
]
AZURE_TEXT = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
              "2023-11-16 18:15:50.9951690,396,109\n")

Reader = Callable[[Path], object]
READERS: dict[str, tuple[str, Reader]] = {
    "sessions": (".jsonl", read_sessions),
    "mooncake": (".jsonl", read_mooncake),
    "mooncake-sessions": (".jsonl", lambda p: read_mooncake(p, sessionize=True)),
    "azure": (".csv", read_azure),
    "detected": (".jsonl", lambda p: load_workload(str(p))),
}


def _check(reader: Reader, path: Path) -> None:
    try:
        reader(path)
    except ValueError as exc:
        msg = str(exc)
        assert "\n" not in msg, msg
        assert str(path) in msg, msg


def _valid_text(name: str) -> str:
    if name == "azure":
        return AZURE_TEXT
    rows = MOONCAKE_LINES if name.startswith("mooncake") else SESSION_LINES
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("name", list(READERS))
def test_random_bytes(name: str, tmp_path: Path) -> None:
    suffix, reader = READERS[name]
    path = tmp_path / f"f{suffix}"

    @FUZZ
    @given(st.binary(max_size=400))
    def run(data: bytes) -> None:
        path.write_bytes(data)
        _check(reader, path)

    run()


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
    st.lists(st.integers(min_value=-3, max_value=2**40), max_size=4),
    st.just([[1, 2]]), st.just([[[[[]]]]]),
)


@pytest.mark.parametrize("name", [n for n in READERS if n != "azure"])
def test_mutated_json_fields(name: str, tmp_path: Path) -> None:
    suffix, reader = READERS[name]
    path = tmp_path / f"f{suffix}"
    rows = MOONCAKE_LINES if name.startswith("mooncake") else SESSION_LINES

    @FUZZ
    @given(st.integers(0, len(rows) - 1), st.sampled_from(sorted({k for r in rows for k in r})), _VALUES,
           st.booleans())
    def run(line: int, key: str, value: object, drop: bool) -> None:
        mutated = [dict(r) for r in rows]
        if drop:
            mutated[line].pop(key, None)
        else:
            mutated[line][key] = value
        text = "".join(json.dumps(r, allow_nan=True) + "\n" for r in mutated)
        path.write_text(text, encoding="utf-8")
        _check(reader, path)

    run()


@pytest.mark.parametrize("name", list(READERS))
def test_mutated_text(name: str, tmp_path: Path) -> None:
    """Valid files with a span of characters replaced, deleted or duplicated."""
    suffix, reader = READERS[name]
    path = tmp_path / f"f{suffix}"
    text = _valid_text(name)

    @FUZZ
    @given(st.integers(0, len(text)), st.integers(0, 12), st.text(max_size=8), st.booleans())
    def run(at: int, width: int, insert: str, twice: bool) -> None:
        mutated = text[:at] + insert + text[at + width:]
        if twice:
            mutated += mutated
        path.write_text(mutated, encoding="utf-8")
        _check(reader, path)

    run()


def test_valid_inputs_still_read(tmp_path: Path) -> None:
    """The seeds the fuzzer mutates are themselves valid (so mutations start from real files)."""
    for name, (suffix, reader) in READERS.items():
        path = tmp_path / f"{name}{suffix}"
        path.write_text(_valid_text(name), encoding="utf-8")
        result = reader(path)
        assert isinstance(result, list) and result and all(math.isfinite(s.start_s) for s in result)
