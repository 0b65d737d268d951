"""The simulator's compiled core (mypyc, ``tokenomy._native``): installed builds run it, the Python
sources stay the reference and give the same results, and an edit is never shadowed by a stale build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tokenomy
import tokenomy.engine.engine
import tokenomy.sim.loop
from helpers.identical_sim import differences
from tokenomy import _native

TESTS = Path(__file__).resolve().parents[1]
STORED = json.loads((TESTS / "sim" / "fixtures" / "identical_summaries.json").read_text())
# one case per deployment kind (the identical-results test runs every case on the compiled core)
PURE_CASES = ("colocated_chat", "disagg_gaia", "ampd_gaia_1_7", "hetero_ampd_itl_bound_toolbench")


def test_an_installed_tree_runs_the_compiled_core() -> None:
    if tokenomy.NATIVE == "pure":
        pytest.skip(f"{_native.PURE_ENV}=1: this run tests the Python sources")
    assert tokenomy.NATIVE == "native", "a compiled module is older than its source: run `make native`"
    missing = [p for p in _native.COMPILED if _native._compiled_file(Path(tokenomy.__file__).parents[1] / p) is None]
    assert not missing, f"not compiled (did the mypyc build fail? `make native` shows why): {missing}"
    assert _native.is_compiled(tokenomy.engine.engine) and _native.is_compiled(tokenomy.sim.loop)


def test_the_python_sources_simulate_what_the_stored_results_say(tmp_path: Path) -> None:
    out = tmp_path / "pure.json"
    env = dict(os.environ, TOKENOMY_PURE="1", PYTHONPATH=str(TESTS))
    probe = "import tokenomy, tokenomy.engine.engine as e; print(tokenomy.NATIVE, e.__file__)"
    mode = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert mode.stdout.split()[0] == "pure" and mode.stdout.split()[1].endswith("engine.py")
    subprocess.run([sys.executable, str(TESTS / "helpers" / "identical_sim.py"), "--write", str(out),
                    "--cases", ",".join(PURE_CASES)], env=env, check=True, capture_output=True, timeout=600)
    got = json.loads(out.read_text())
    for name in PURE_CASES:
        diffs = differences(STORED[name], got[name])
        assert not diffs, f"{name} (Python sources) differs in {len(diffs)} place(s): " + "; ".join(diffs[:10])


def _tree(tmp_path: Path) -> Path:
    """A source tree with every compiled module's source and a "built" extension beside it."""
    suffix = _native.importlib.machinery.EXTENSION_SUFFIXES[0]
    for path in _native.COMPILED:
        source = tmp_path / path
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text("")
        os.utime(source, (1_000, 1_000))
        source.with_suffix(suffix).write_bytes(b"")
        os.utime(source.with_suffix(suffix), (2_000, 2_000))
    return tmp_path


def test_a_build_older_than_its_source_is_found_stale(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    assert _native.stale_sources(src) == []
    edited = src / _native.COMPILED[3]
    os.utime(edited, (3_000, 3_000))
    assert _native.stale_sources(src) == [_native.COMPILED[3]]
    for path in _native.COMPILED:  # a tree without a build is not stale: it simply runs its sources
        (src / path).with_suffix(_native.importlib.machinery.EXTENSION_SUFFIXES[0]).unlink()
    assert _native.stale_sources(src) == []


def test_a_stale_build_runs_the_sources_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _tree(tmp_path)
    os.utime(src / _native.COMPILED[0], (3_000, 3_000))
    monkeypatch.delenv(_native.PURE_ENV, raising=False)
    # the finder goes away with the test (and one a TOKENOMY_PURE=1 run put there is set aside)
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, _native._SourceFinder)])
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    with pytest.warns(RuntimeWarning, match="older than their source"):
        assert _native.select(src) == "stale"
    finder = sys.meta_path[0]
    spec = finder.find_spec("tokenomy.engine.engine")  # type: ignore[call-arg]
    assert spec is not None and spec.origin == str(src / "tokenomy" / "engine" / "engine.py")
    package = finder.find_spec("tokenomy.engine")  # type: ignore[call-arg]
    assert package is not None and package.submodule_search_locations == [str(src / "tokenomy" / "engine")]
    assert finder.find_spec("tokenomy.gateway.app") is None  # type: ignore[call-arg]  # never compiled
