"""What source files import, read from their syntax trees (the isolation and layout tests' checks)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType


def imported_names(path: Path) -> set[str]:
    """Every module ``path`` imports: ``import a.b`` gives ``a.b``, ``from a.b import c`` gives ``a.b``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def package_files(package: ModuleType) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``package`` and its subpackages."""
    assert package.__file__ is not None
    top = Path(package.__file__).resolve().parent
    files: dict[str, Path] = {}
    for path in sorted(top.rglob("*.py")):
        parts = (package.__name__, *path.relative_to(top).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(package: ModuleType) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, counting every import: at module level, inside
    functions, under ``TYPE_CHECKING`` and through ``importlib.import_module`` alike (a lazy import
    hides a cycle, it does not break it)."""
    files = package_files(package)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
                module = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    module = ".".join([*base[:len(base) - node.level + 1], *([module] if module else [])])
                for a in node.names:  # `from pkg import module` imports the module
                    deps.add(f"{module}.{a.name}" if f"{module}.{a.name}" in files else module)
            elif (target := _import_module_target(node)) is not None:
                name_, exact = target
                deps.update(m for m in files if m == name_ or (not exact and m.startswith(name_)))
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def _import_module_target(node: ast.AST) -> tuple[str, bool] | None:
    """``(name, exact)`` of an ``importlib.import_module(...)`` call: a literal name is exact; an
    f-string such as ``f"pkg.{name}"`` stands for every module its literal head starts."""
    if not (isinstance(node, ast.Call) and node.args and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            or (isinstance(node.func, ast.Name) and node.func.id == "import_module"))):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value, True
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(head := arg.values[0], ast.Constant):
        return str(head.value), False
    return None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or ``None`` when it has none."""
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


def long_files(package: ModuleType, max_lines: int) -> dict[str, int]:
    """Module -> its line count, for the modules of ``package`` longer than ``max_lines``."""
    return {name: n for name, path in package_files(package).items()
            if (n := len(path.read_text().splitlines())) > max_lines}
