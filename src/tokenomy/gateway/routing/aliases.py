"""Model names agents send, mapped to the models the backends serve (``aliases`` in gateway.yaml).

Agents ask for their vendor's names (a main model and a small, fast one for background calls). An
alias maps a requested name, exact or a glob (``fnmatch``: ``*``, ``?``, ``[...]``), to a served
model, for every tenant or only for the tenants it names (node ids on the key's path). Resolution:
a served model's own name wins; then the aliases in the order written, tenant-scoped ones before
global ones; an unknown name is a 404 ``model_not_found`` in the client's protocol.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from tokenomy.gateway.errors import GatewayError


class ModelAlias(BaseModel):
    """``match`` (a name or glob) -> ``model`` (a served model), for ``tenants`` when given."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    match: str = Field(min_length=1, max_length=256)
    model: str = Field(min_length=1)
    tenants: tuple[str, ...] = ()


class Aliases:
    """The alias table over the served models (see the module docstring)."""

    def __init__(self, aliases: Sequence[ModelAlias], served: Sequence[str]) -> None:
        self.served = frozenset(served)
        for a in aliases:
            if a.model not in self.served:
                raise ValueError(f"aliases: {a.match!r} maps to {a.model!r}, which no backend serves "
                                 f"(served: {', '.join(sorted(self.served))})")
        ordered = [a for a in aliases if a.tenants] + [a for a in aliases if not a.tenants]
        self._table = [(re.compile(fnmatch.translate(a.match)), a) for a in ordered]
        self.aliases = tuple(aliases)
        self.tenant_scoped = any(a.tenants for a in aliases)

    def resolve(self, name: str, tenant_path: Sequence[str] = ()) -> str:
        """The served model for the requested ``name``; 404 ``model_not_found`` when none."""
        if name in self.served:
            return name
        for pattern, alias in self._table:
            if alias.tenants and not set(alias.tenants) & set(tenant_path):
                continue
            if pattern.fullmatch(name):
                return alias.model
        raise GatewayError(404, f"the model {name!r} does not exist", "invalid_request_error", "model_not_found",
                           "model")

    def listed(self) -> list[tuple[str, str]]:
        """(alias, served model) of the exact (non-glob) global aliases, for ``/v1/models``."""
        return [(a.match, a.model) for a in self.aliases
                if not a.tenants and not any(c in a.match for c in "*?[")]
