"""KV retention across agent tool calls: pin a finished request's blocks until released.

A pinned block keeps a reference, so it is neither free nor evictable; its key stays in the
prefix cache, so the session's next turn hits it. Releasing drops the reference: the blocks
become free-cached and LRU eviction may take them.
"""

from __future__ import annotations

from tokenomy.engine.block_ids import BlockIds
from tokenomy.engine.kv_manager import KVManager
from tokenomy.engine.request_state import RequestState


class Retention:
    """Pinned blocks by request id, plus the blocks of requests finished by the latest step."""

    __slots__ = ("_kv", "_pinned", "_recent", "num_blocks")

    def __init__(self, kv: KVManager) -> None:
        self._kv = kv
        self._pinned: dict[str, BlockIds] = {}
        # Blocks freed by the latest step's finishes. No allocation happens between steps, so they
        # still hold the request's KV and can be pinned again by a late ``retain``.
        self._recent: dict[str, BlockIds] = {}
        self.num_blocks = 0

    def holds(self, request_id: str) -> bool:
        return request_id in self._pinned

    def on_finish(self, req: RequestState) -> None:
        """Hand over a finished request's blocks: pinned if it asked for retention, else freed."""
        if req.retain:
            self._pinned[req.request_id] = req.blocks
            self.num_blocks += len(req.blocks)
            req.blocks = BlockIds()
        else:
            self._recent[req.request_id] = self._kv.free(req)

    def forget_recent(self) -> None:
        """Called at the start of each step: from now on freed blocks may be reallocated."""
        if self._recent:
            self._recent.clear()

    def retain_finished(self, request_id: str) -> None:
        if request_id in self._pinned:
            return
        blocks = self._recent.pop(request_id, None)
        if blocks is None:
            raise ValueError(
                f"cannot retain {request_id!r}: it is not queued or running here and did not finish "
                "in the latest step"
            )
        self._kv.pin(blocks)
        self._pinned[request_id] = blocks
        self.num_blocks += len(blocks)

    def release(self, request_id: str) -> None:
        blocks = self._pinned.pop(request_id, None)
        if blocks is None:
            raise ValueError(f"cannot release {request_id!r}: it holds no retained KV here")
        self._kv.unpin(blocks)
        self.num_blocks -= len(blocks)
