"""``tokenomy emulate`` flags: bad values are one line naming the flag, exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenomy.cli import main as cli_main


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ("emulate_cmd",))  # the real parser, without the others
    return cli_main.main


@pytest.mark.parametrize(("args", "needle"), [
    (["--model", "gpt-17"], "gpt-17"),
    (["--gpu", "abacus"], "abacus"),
    (["--port", "70000"], "--port"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--time-scale", "0"], "--time-scale"),
    (["--tokenizer", "/nonexistent/tokenizer.json"], "--tokenizer"),
    (["--trace-events", "/nonexistent/dir/events.jsonl"], "--trace-events"),
])
def test_bad_flags_exit_2_with_one_line(run, capsys: pytest.CaptureFixture[str], args: list[str],  # type: ignore[no-untyped-def]
                                        needle: str, tmp_path: Path) -> None:
    assert run(["emulate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and err.startswith("tokenomy emulate: error:")
