"""KV-cache manager: which blocks a request holds, prefix lookups, and block keys.

The scheduler sees KV state only through this class (like vLLM's ``KVCacheManager``): it asks
for hits, for room to grow, and hands requests back when they stop; the pool stays hidden.
"""

from __future__ import annotations

import numpy as np

from tokenomy.core import Segment
from tokenomy.engine.block_ids import NO_BLOCKS, BlockIds, BlockVector
from tokenomy.engine.block_keys import ROOT_KEY, KeyChainCache, unique_key
from tokenomy.engine.block_pool import BlockPool
from tokenomy.engine.prefix_lookup import PrefixLookup
from tokenomy.engine.request_state import RequestState

BlockedAdmission = tuple[int, tuple[int, int, int] | None, int, bool]
"""When admission failed: (free blocks, key of the first missing block (:meth:`KVManager.block_ref`) or
None, chunk, over budget)."""


class KVManager:
    """Paged KV with prefix caching over full blocks; ``chains`` memoises content key chains."""

    __slots__ = ("pool", "block_size", "caching", "chains", "_lookup")

    def __init__(
        self, num_blocks: int, block_size: int, enable_caching: bool, chains: KeyChainCache | None = None
    ) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.caching = enable_caching
        self.chains = chains if chains is not None else KeyChainCache()
        self._lookup = PrefixLookup(self.pool)

    # ---- keys -------------------------------------------------------------------------------
    def block_key(self, req: RequestState, index: int) -> int:
        """Key of the request's block ``index`` (content-derived where content covers it)."""
        chain = req.chain
        covered = chain.num_full_blocks if chain is not None else 0
        if index < covered:
            assert chain is not None
            if index >= chain.num_keys:
                chain.ensure(index + 1)
            return chain.key(index)
        own = req.own_keys
        while covered + len(own) <= index:
            j = covered + len(own)
            if own:
                parent = own[-1]
            elif j > 0:
                assert chain is not None
                chain.ensure(j)
                parent = chain.key(j - 1)
            else:
                parent = ROOT_KEY
            own.append(unique_key(parent, req.uid))
        return own[index - covered]

    def block_ref(self, req: RequestState, index: int) -> tuple[int, int, int]:
        """Key of the request's block ``index`` as the pool indexes it: ``(run base, offset, run length)``."""
        chain = req.chain
        if chain is not None and index < chain.num_full_blocks:
            if index >= chain.num_keys:
                chain.ensure(index + 1)
            return chain.ref(index)
        return self.block_key(req, index), 0, 1

    # ---- lookups ----------------------------------------------------------------------------
    def find_hits(self, req: RequestState) -> BlockVector:
        """Cached blocks of the request's longest cached prefix, leaving at least one token to compute.

        Read-only: no reference is taken and the LRU order is unchanged.
        """
        if not self.caching:
            return NO_BLOCKS
        pool = self.pool
        max_blocks = (req.num_tokens - 1) // self.block_size
        chain = req.chain
        covered = 0
        hits = NO_BLOCKS
        if chain is not None:
            covered = min(max_blocks, chain.num_full_blocks)
            hits = pool.slots.chain_block_ids(chain, self._lookup.run(chain, covered))
            if len(hits) < covered:
                return hits
        own: list[int] = []
        for i in range(covered, max_blocks):
            block = pool.slots.block_of(self.block_key(req, i))
            if block is None:
                break
            own.append(block)
        return np.concatenate((hits, np.array(own, dtype=np.int64))) if own else hits

    def cached_prefix_tokens(self, content: tuple[Segment, ...], prompt_tokens: int) -> int:
        """Prompt tokens of a request with this content that would hit now (read-only)."""
        if not self.caching or not content or prompt_tokens < 1:
            return 0
        chain = self.chains.get(content, self.block_size)
        max_blocks = min((prompt_tokens - 1) // self.block_size, chain.num_full_blocks)
        return self._lookup.run(chain, max_blocks) * self.block_size

    def cached_prefix_free_blocks(self, content: tuple[Segment, ...], prompt_tokens: int) -> int:
        """Of the blocks :meth:`cached_prefix_tokens` counts, those in the free pool (reference count
        0): admitting the request takes them off it, as :meth:`admit` counts them (read-only)."""
        hit = self.cached_prefix_tokens(content, prompt_tokens) // self.block_size
        if hit == 0:
            return 0
        chain = self.chains.get(content, self.block_size)
        return self.pool.num_evictable(self.pool.slots.chain_block_ids(chain, hit))

    # ---- failed admissions ------------------------------------------------------------------
    def blocked_state(
        self, req: RequestState, num_hits: int, n: int, *, over_budget: bool
    ) -> BlockedAdmission:
        """Remember why the waiting head did not fit (its ``n``-token chunk), to skip hopeless retries."""
        max_blocks = (req.num_tokens - 1) // self.block_size if self.caching else 0
        next_key = self.block_ref(req, num_hits) if num_hits < max_blocks else None
        return (self.pool.num_free, next_key, n, over_budget)

    def still_blocked(self, blocked: BlockedAdmission, budget: int) -> bool:
        """True when the admission that failed in ``blocked`` must fail again now.

        Its cached prefix can only grow if the key of its first missing block appeared; its chunk
        only shrinks if the budget is now below the chunk that failed. For a chunk that did not fit
        the free pool: what it costs the pool (new blocks plus cached-free hits) minus the free
        blocks only drops if blocks were freed (evictions, and other requests taking its cached
        blocks, never make it fit). For a whole prompt over the budget (no chunking): only a larger
        budget or a longer cached prefix helps.
        """
        free_then, next_key, n_then, over_budget = blocked
        if next_key is not None and self.pool.slots.block_of(next_key[0], next_key[1]) is not None:
            return False
        if over_budget:
            return budget < n_then
        return budget >= n_then and self.pool.num_free <= free_then

    # ---- allocation -------------------------------------------------------------------------
    def admit(self, req: RequestState, hits: BlockVector, num_tokens_with_kv: int) -> bool:
        """Give a waiting request its hit blocks plus room for ``num_tokens_with_kv`` tokens.

        False (and no change) when the free pool cannot cover it.
        """
        need_new = -(-num_tokens_with_kv // self.block_size) - len(hits)
        new = self.pool.take(hits, need_new)
        if new is None:
            return False
        req.blocks = BlockIds(hits, new) if need_new > 0 else BlockIds(hits)
        req.num_keyed_blocks = len(hits)
        return True

    def grow(self, req: RequestState, num_tokens_with_kv: int) -> bool:
        """Make the request's blocks hold ``num_tokens_with_kv`` tokens; False when the pool is short."""
        need = -(-num_tokens_with_kv // self.block_size) - len(req.blocks)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        if need == 1:
            req.blocks.append(self.pool.allocate_one())
        else:
            req.blocks.extend(self.pool.allocate_ids(need, view=True))
        return True

    def commit_full_blocks(self, req: RequestState) -> None:
        """Register the blocks that filled since the last call under their keys."""
        full = req.num_computed // self.block_size
        i = req.num_keyed_blocks
        if full <= i or not self.caching:
            return
        chain = req.chain
        if full == i + 1:  # one block filled (a decode step): the common case
            base, offset, count = self.block_ref(req, i)  # (unpacked: a compiled star call goes through Python)
            self.pool.register_one(req.blocks[i], base, offset, count)
            req.num_keyed_blocks = full
            return
        if chain is not None and i < chain.num_full_blocks:
            upto = min(full, chain.num_full_blocks)
            if chain.num_keys < upto:
                chain.ensure(upto)
            self.pool.register_chain(req.blocks.ids()[i:upto], chain, i)
            i = upto
        if i < full:
            self.pool.register(req.blocks.ids()[i:full].tolist(), [self.block_key(req, j) for j in range(i, full)])
        req.num_keyed_blocks = full

    def free(self, req: RequestState) -> BlockIds:
        """Drop the request's references (blocks stay cached); returns the blocks it held."""
        blocks = req.blocks
        self.pool.release(blocks.ids())
        req.blocks = BlockIds()
        req.num_keyed_blocks = 0
        return blocks

    def pin(self, blocks: BlockIds) -> None:
        """Take one more reference on blocks (retention)."""
        self.pool.touch(blocks.ids())

    def unpin(self, blocks: BlockIds) -> None:
        self.pool.release(blocks.ids())
