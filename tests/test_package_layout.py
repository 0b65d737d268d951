"""The whole ``tokenomy`` package: no import cycle (a lazy or ``TYPE_CHECKING`` import hides a cycle,
it does not break it, so those count) and no source file over 400 lines."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import tokenomy
from helpers.imports import find_cycle, import_graph, long_files

MAX_LINES = 400


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(tokenomy)
    assert len(graph) >= 200
    assert "tokenomy.perf.hf_config" in graph["tokenomy.perf.models"]  # the walk sees imports
    assert "tokenomy.cli.sim_cmd" in graph["tokenomy.cli.main"]  # and importlib's, by their prefix
    assert find_cycle(graph) is None


def test_no_source_file_is_over_400_lines() -> None:
    assert long_files(tokenomy, MAX_LINES) == {}


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_counts_lazy_relative_type_checking_and_importlib_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f() -> None:\n    from pkg.sub import b\n")
    (pkg / "c.py").write_text("import importlib\n\nfor n in 'ab':\n    importlib.import_module(f'pkg.sub.{n}')\n"
                             "importlib.import_module('pkg.a')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .. import a\n")
    package = ModuleType("pkg")
    package.__file__ = str(pkg / "__init__.py")
    graph = import_graph(package)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub.b"}, "pkg.c": {"pkg.sub.b", "pkg.a"}, "pkg.sub": set(),
                     "pkg.sub.b": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
