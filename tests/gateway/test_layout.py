"""`gateway/` stays laid out by concern: no import cycle, no file over 400 lines, no importlib."""

from __future__ import annotations

import ast
from pathlib import Path

import tokenomy.gateway

GATEWAY = Path(tokenomy.gateway.__file__).resolve().parent
SUBPACKAGES = ("http", "routing", "ops", "metering", "stores", "console")
MAX_LINES = 400


def _module(path: Path) -> str:
    parts = path.relative_to(GATEWAY.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the gateway modules it imports, counting every import: at module level, inside
    functions and under ``TYPE_CHECKING`` alike (a lazy import hides a cycle, it does not break it)."""
    files = {_module(p): p for p in GATEWAY.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:  # `from pkg import module` imports the module
                    deps.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_gateway_has_no_import_cycle() -> None:
    graph = _graph()
    assert {f"tokenomy.gateway.{p}.proxy" if p == "http" else f"tokenomy.gateway.{p}" for p in SUBPACKAGES} <= set(graph)
    assert len(graph) >= 40
    assert _cycle(graph) is None


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_gateway_file_is_over_400_lines() -> None:
    long = {str(p.relative_to(GATEWAY)): n for p in GATEWAY.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_gateway_is_laid_out_by_concern_and_imports_modules_directly() -> None:
    top = sorted(p.name for p in GATEWAY.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__"))
    assert top == sorted(["__init__.py", "__main__.py", "config.py", "errors.py", *SUBPACKAGES])
    uses = [str(p.relative_to(GATEWAY)) for p in GATEWAY.rglob("*.py") if "importlib" in p.read_text()]
    assert uses == []
