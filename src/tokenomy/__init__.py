"""Tokenomy: token-driven control plane for LLM inference."""

from tokenomy import _native

__version__ = "0.1.0"

NATIVE = _native.select()
"""``"native"`` (the simulator's core runs compiled where it was built), ``"pure"`` (``TOKENOMY_PURE=1``)
or ``"stale"`` (a compiled module is older than its source): see :mod:`tokenomy._native`."""
