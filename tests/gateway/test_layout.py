"""`gateway/` stays laid out by concern: no import cycle, no file over 400 lines, no importlib."""

from __future__ import annotations

from pathlib import Path

import tokenomy.gateway
from helpers.imports import find_cycle, import_graph, long_files

GATEWAY = Path(tokenomy.gateway.__file__).resolve().parent
SUBPACKAGES = ("http", "routing", "ops", "metering", "stores", "console")
MAX_LINES = 400


def test_the_gateway_has_no_import_cycle() -> None:
    graph = import_graph(tokenomy.gateway)
    assert {f"tokenomy.gateway.{p}.proxy" if p == "http" else f"tokenomy.gateway.{p}" for p in SUBPACKAGES} <= set(graph)
    assert len(graph) >= 40
    assert find_cycle(graph) is None


def test_no_gateway_file_is_over_400_lines() -> None:
    assert long_files(tokenomy.gateway, MAX_LINES) == {}


def test_the_gateway_is_laid_out_by_concern_and_imports_modules_directly() -> None:
    top = sorted(p.name for p in GATEWAY.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__"))
    assert top == sorted(["__init__.py", "__main__.py", "config.py", "errors.py", *SUBPACKAGES])
    uses = [str(p.relative_to(GATEWAY)) for p in GATEWAY.rglob("*.py") if "importlib" in p.read_text()]
    assert uses == []
