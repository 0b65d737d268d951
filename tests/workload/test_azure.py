"""Azure LLM CSV reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenomy.workload import read_azure

from .shared_data import AZURE_CONV, require

CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
"""


def test_single_turn_sessions_without_sharing(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(CSV)
    sessions = read_azure(path)
    assert [s.session_id for s in sessions] == ["azure-0", "azure-1", "azure-2"]
    assert [s.start_s for s in sessions] == pytest.approx([0.0, 4.314579, 4.541877])
    assert [(s.turns[0].prompt_tokens, s.turns[0].output_tokens) for s in sessions] == [
        (374, 44),
        (396, 109),
        (879, 55),
    ]
    keys = [k for s in sessions for k, _ in s.turns[0].content]
    assert len(set(keys)) == 3  # nothing shared
    assert read_azure(path, time_scale=2.0, limit=2)[-1].start_s == pytest.approx(8.629158)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b,c\n", "expected header"),
        (CSV + "2023-11-16 18:15:52.0,0,5\n", "azure.csv:5: ContextTokens"),
        (CSV + "yesterday,5,5\n", "azure.csv:5"),
        (CSV + "2023-11-16 18:15:52.0,5\n", "azure.csv:5: expected 3 columns"),
    ],
)
def test_bad_rows_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_azure(path)


def test_real_azure_conv_trace() -> None:
    sessions = read_azure(require(AZURE_CONV))
    assert len(sessions) == 19366
    assert 3400 < sessions[-1].start_s < 3600  # 58 minutes
