"""The one error every registry raises for a name it does not know."""

from __future__ import annotations


class UnknownNameError(ValueError, KeyError):
    """An unknown or duplicate name in a registry (deployments, models, GPUs, policies, ...).

    A ValueError with a one-line message naming the known choices, as every named choice in
    Tokenomy raises; also a KeyError so callers written for a dict lookup keep working.
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
