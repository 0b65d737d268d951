"""`engine` stays clock-agnostic: it imports nothing from sim/gateway/emulator/bench and reads no clock."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tokenomy.engine
from helpers.imports import imported_names

FORBIDDEN_PACKAGES = ("tokenomy.sim", "tokenomy.gateway", "tokenomy.emulator", "tokenomy.bench")
FORBIDDEN_STDLIB = ("time", "datetime", "random", "os", "socket", "subprocess")
ENGINE_DIR = Path(tokenomy.engine.__file__).resolve().parent

IMPORT_ALL = """
import importlib, pkgutil, sys
import tokenomy.engine as pkg
for m in pkgutil.walk_packages(pkg.__path__, "tokenomy.engine."):
    importlib.import_module(m.name)
print("\\n".join(sorted(sys.modules)))
"""


def test_importing_every_engine_module_loads_nothing_from_sim() -> None:
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.split()
    assert "tokenomy.engine.decode_run" in loaded  # the walk did import the package
    leaked = [m for m in loaded if m.startswith(FORBIDDEN_PACKAGES)]
    assert leaked == []


def test_no_engine_source_imports_sim_or_reads_the_clock() -> None:
    sources = sorted(ENGINE_DIR.rglob("*.py"))
    assert len(sources) >= 12
    bad = {
        str(p.relative_to(ENGINE_DIR)): sorted(
            n
            for n in imported_names(p)
            if n.startswith(FORBIDDEN_PACKAGES) or n.split(".")[0] in FORBIDDEN_STDLIB
        )
        for p in sources
    }
    assert {k: v for k, v in bad.items() if v} == {}


def _mutable_globals(source: str) -> list[str]:
    """Module-level names that are neither constants, type aliases (both capitalised) nor the logger."""
    names = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            name = target.id if isinstance(target, ast.Name) else ast.unparse(target)
            if not (name.startswith("__") or name == "logger" or name.lstrip("_")[:1].isupper()):
                names.append(name)
    return names


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("_memo: OrderedDict[int, int] = OrderedDict()\n_last = (None, 0)", ["_memo", "_last"]),
        ("ROOT_KEY = 0\n_IntArray = int\nlogger = logging.getLogger(__name__)\n__all__ = []", []),
    ],
)
def test_the_mutable_state_check_tells_caches_from_constants(source: str, flagged: list[str]) -> None:
    assert _mutable_globals(source) == flagged


def test_no_engine_module_keeps_process_wide_mutable_state() -> None:
    """Nothing a second engine in the same process (a threaded server) would share by accident."""
    offenders = {p.name: _mutable_globals(p.read_text()) for p in sorted(ENGINE_DIR.rglob("*.py"))}
    assert {k: v for k, v in offenders.items() if v} == {}
