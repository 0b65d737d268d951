"""A Guard that admits everything and charges one anonymous key: tests and a bare local setup.

It keeps the contract's bookkeeping (each admission is settled or released exactly once) so
tests can assert the request path calls it correctly.
"""

from __future__ import annotations

from tokenomy.gateway.ops.guard import Admission, AdmitRequest, SettledUsage


class AllowAllGuard:
    def __init__(self, key_id: str = "anonymous", tenant_path: tuple[str, ...] = ("default", "default", "anonymous")):
        self.key_id = key_id
        self.tenant_path = tenant_path
        self.open: dict[str, Admission] = {}
        self.settled: dict[str, SettledUsage] = {}
        self.released: dict[str, str] = {}
        self.double_finishes: list[str] = []

    async def admit(self, request: AdmitRequest) -> Admission:
        adm = Admission(request.request_id, self.key_id, self.tenant_path, request.model)
        self.open[request.request_id] = adm
        return adm

    def on_tokens(self, admission: Admission, new_output_tokens: int) -> bool:
        return True

    def _finish(self, admission: Admission) -> bool:
        if self.open.pop(admission.request_id, None) is None:
            self.double_finishes.append(admission.request_id)
            return False
        return True

    async def settle(self, admission: Admission, usage: SettledUsage) -> None:
        if self._finish(admission):
            self.settled[admission.request_id] = usage

    async def release(self, admission: Admission, reason: str) -> None:
        if self._finish(admission):
            self.released[admission.request_id] = reason

    async def usage_scope(self, api_key: str | None) -> tuple[str, ...]:
        return ()  # everything
