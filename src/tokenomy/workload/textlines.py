"""Read a text trace line by line with errors that name the file and line.

Every trace reader goes through :func:`numbered_lines`, so a binary file, a file in another
encoding or a line of deeply nested JSON gives ``ValueError("path:line: ...")`` instead of a
codec error or a RecursionError without the file's name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def numbered_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each non-blank line of a UTF-8 file."""
    lineno = 0
    try:
        with Path(path).open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):  # noqa: B007  (lineno read in the handler)
                if line.strip():
                    yield lineno, line
    except UnicodeDecodeError:
        raise ValueError(f"{path}:{lineno + 1}: not UTF-8 text (a binary file?)") from None


def parse_json_object(line: str, where: str) -> dict[str, Any]:
    """One JSON object; ValueError naming ``where`` for bad JSON, nesting too deep or a non-object."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row
