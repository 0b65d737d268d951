"""The simulator's compiled core: which modules ``setup.py`` compiles with mypyc, and the switch
back to their Python sources.

The hot path of every simulation (the engine model, the event loop, the simulated instance, the
performance model, the router) is plain typed Python, compiled at install time by `mypyc
<https://mypyc.readthedocs.io>`_ (part of mypy, which already checks this code; it compiles mypy
and black). The compiled modules behave like their sources, only faster, and the sources stay the
reference: ``TOKENOMY_PURE=1`` runs them instead (tests compare the two), and so does any process
that finds a compiled module older than its source (an edit since the last ``make install``), with a
warning, so an edit is never shadowed by a stale build.

This module imports nothing from tokenomy; ``setup.py`` reads :data:`COMPILED` from it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

COMPILED: tuple[str, ...] = (
    "tokenomy/engine/__init__.py",
    "tokenomy/engine/block_ids.py",
    "tokenomy/engine/block_keys.py",
    "tokenomy/engine/block_pool.py",
    "tokenomy/engine/decode_run.py",
    "tokenomy/engine/engine.py",
    "tokenomy/engine/kv_manager.py",
    "tokenomy/engine/prefix_lookup.py",
    "tokenomy/engine/queues.py",
    "tokenomy/engine/request_state.py",
    "tokenomy/engine/results.py",
    "tokenomy/engine/retention.py",
    "tokenomy/engine/run_slots.py",
    "tokenomy/engine/scheduler.py",
    "tokenomy/engine/tpot_bank.py",
    "tokenomy/engine/trace.py",
    "tokenomy/engine/tracer.py",
    "tokenomy/engine/update.py",
    "tokenomy/perf/model.py",
    "tokenomy/policy/ampd/admission.py",
    "tokenomy/policy/ampd/local_chunk.py",
    "tokenomy/policy/router.py",
    "tokenomy/sim/loop.py",
    "tokenomy/sim/instance.py",
)
"""Source paths relative to ``src``, compiled as one group (``setup.py``). Not ``engine/config.py``:
a compiled dataclass rejects a wrongly typed field with a TypeError before its own checks give the
user a ValueError naming it."""

PURE_ENV = "TOKENOMY_PURE"
_SRC = Path(__file__).resolve().parents[1]


def module_name(path: str) -> str:
    """``tokenomy/engine/__init__.py`` -> ``tokenomy.engine``."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _compiled_file(source: Path) -> Path | None:
    """The extension module built beside ``source`` (for a package, beside its ``__init__.py``)."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def stale_sources(src: Path = _SRC) -> list[str]:
    """Compiled modules whose source changed after they were built (``[]`` when none are built)."""
    stale = []
    for path in COMPILED:
        source = src / path
        built = _compiled_file(source)
        if built is not None and source.stat().st_mtime > built.stat().st_mtime:
            stale.append(path)
    return stale


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a compiled extension."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


class _SourceFinder:
    """A meta-path finder that loads the compiled modules from their ``.py`` sources."""

    def __init__(self, src: Path) -> None:
        self._sources = {module_name(p): src / p for p in COMPILED}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self._sources.get(fullname)
        if source is None:
            return None
        locations = [str(source.parent)] if source.name == "__init__.py" else None
        return importlib.util.spec_from_file_location(fullname, source, submodule_search_locations=locations)


def select(src: Path = _SRC) -> str:
    """Run the Python sources of the compiled modules when asked to (``TOKENOMY_PURE=1``) or when a
    build is stale; returns ``"pure"``, ``"stale"`` or ``"native"`` (``"native"`` also when nothing
    is built: the import system then finds the sources anyway)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        reason = "pure"
    else:
        stale = stale_sources(src)
        if not stale:
            return "native"
        reason = "stale"
        warnings.warn(
            f"tokenomy: {len(stale)} compiled module(s) are older than their source (e.g. {stale[0]}); "
            "running the Python sources. Rebuild with `make native`.",
            RuntimeWarning,
            stacklevel=2,
        )
    if not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder(src))
    return reason


if __name__ == "__main__":  # the Makefile's list of compiled sources
    print(" ".join(COMPILED))
