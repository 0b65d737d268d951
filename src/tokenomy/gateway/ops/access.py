"""Who a bearer key is and what it may read: the guard's first step and the usage API's scope."""

from __future__ import annotations

import hmac

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.tenancy import Node
from tokenomy.gateway.stores.tenancy_sql import TenantStore


class KeyAccess:
    """Keys by their HMAC digests in the tenant store; the admin key compared in constant time."""

    def __init__(self, store: TenantStore, admin_key: str | None) -> None:
        self.store = store
        self.admin_key = admin_key

    def key_node(self, api_key: str | None) -> Node:
        """The live key node of ``api_key``; 401 for a missing, unknown or revoked key."""
        if not api_key:
            raise GatewayError(401, "missing API key: send 'Authorization: Bearer tk-...'",
                               type="authentication_error", code="missing_api_key")
        node = self.store.authenticate(api_key)
        if node is None:
            raise GatewayError(401, "invalid or revoked API key", type="authentication_error",
                               code="invalid_api_key")
        return node

    def is_admin(self, api_key: str | None) -> bool:
        if not self.admin_key or not api_key:
            return False
        return hmac.compare_digest(api_key.encode(), self.admin_key.encode())

    def usage_scope(self, api_key: str | None) -> tuple[str, ...]:
        """The tenant path whose subtree ``api_key`` may read: a key reads only its own usage;
        the admin key reads everything (``()``). 401 for a missing, unknown or revoked key."""
        if self.is_admin(api_key):
            return ()
        return self.store.tree.path(self.key_node(api_key).id)

    def visible_key_ids(self, key_id: str) -> set[str]:
        """Key ids whose usage this key may read: its own subtree (a key: itself)."""
        tree = self.store.tree
        return {i for i in tree.subtree(key_id) if tree.get(i).kind.value == "key"}
