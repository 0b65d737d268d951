"""The queues of one instance and the load counters routers read: one owner for all of them.

:class:`RequestQueues` is the only object that changes ``waiting``, ``running``,
``num_decoding``, ``decode_context_tokens`` and ``pending_tokens``, and the only one that changes
the request fields those counters are sums of (``num_computed``, ``num_tokens``,
``preload_credit``, ``decoding``, ``finished``) while a request is queued, with one exception
kept for speed and stated where it happens: a decode step advances its decoding requests by one
token each in the updater's (or decode run's) own loop and then reports the total here
(:meth:`RequestQueues.advance_decodes`). Everybody else reads the attributes and never assigns
them; :meth:`RequestQueues.check` recomputes every counter from the requests (tests call it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from tokenomy.engine.request_state import RequestState


class RequestQueues:
    """Waiting (FCFS with a head for preempted and continued requests) and running (admission order).

    Invariants, outside a step being applied and outside an open decode run (whose requests'
    progress is settled when it closes, while these counters advance as its steps are applied):

    * every unfinished request is in exactly one of ``waiting`` and ``running``; finished ones in neither;
    * a decoding request is running; ``num_decoding`` counts the decoding requests;
    * ``decode_context_tokens`` is the sum of ``num_tokens`` over decoding requests;
    * ``pending_tokens`` is the sum of :attr:`RequestState.pending_tokens` over queued requests.
    """

    __slots__ = ("waiting", "running", "num_decoding", "decode_context_tokens", "pending_tokens")

    def __init__(self) -> None:
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.num_decoding = 0
        self.decode_context_tokens = 0
        self.pending_tokens = 0

    # ---- entering and leaving ---------------------------------------------------------------
    def enqueue(self, req: RequestState, *, continuation: bool = False) -> None:
        """Queue a new request at the tail, or, for a continuation, behind the preempted requests and
        other continuations at the head (see ``Engine.add_request``)."""
        waiting = self.waiting
        if continuation:
            req.continuation = True
            at = 0
            while at < len(waiting) and (waiting[at].continuation or waiting[at].num_preemptions):
                at += 1
            waiting.insert(at, req)
        else:
            waiting.append(req)
        self.pending_tokens += req.pending_tokens

    def admit_head(self) -> RequestState:
        """Move the waiting head to the tail of running (its progress is set by :meth:`set_progress`)."""
        req = self.waiting.popleft()
        self.running.append(req)
        return req

    def finish(self, req: RequestState) -> None:
        """Mark a running request finished and take it out of the counters; it stays in ``running``
        until :meth:`drop_finished` (a step finishes several at once)."""
        if req.decoding:
            self._stop_decoding(req)
        self.pending_tokens -= req.pending_tokens
        req.finished = True

    def drop_finished(self) -> None:
        """Remove the requests :meth:`finish` marked from ``running``, keeping admission order."""
        self.running = [r for r in self.running if not r.finished]

    def abort(self, req: RequestState) -> None:
        """Take a queued or running request out for good."""
        if req in self.running:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self.finish(req)

    def preempt_last(self) -> RequestState:
        """Preempt the most recently admitted running request: its progress resets (everything it
        computed will be recomputed) and it goes to the head of ``waiting``. The caller frees its KV."""
        req = self.running.pop()
        if req.decoding:
            self._stop_decoding(req)
        self.pending_tokens -= req.pending_tokens
        req.recompute_until = max(req.recompute_until, req.num_computed)
        req.num_computed = 0
        req.num_preemptions += 1
        self.pending_tokens += req.pending_tokens
        self.waiting.appendleft(req)
        return req

    # ---- progress ---------------------------------------------------------------------------
    def set_progress(self, req: RequestState, num_computed: int) -> None:
        """At admission: the request's KV covers its first ``num_computed`` tokens (hits and preloaded
        KV); its preload credit is used up."""
        self.pending_tokens -= req.pending_tokens
        req.preload_credit = 0
        req.num_computed = num_computed
        self.pending_tokens += req.pending_tokens

    def compute_chunk(self, req: RequestState, n: int) -> bool:
        """A running, not decoding request computed ``n`` more tokens. When it caught up it samples a
        token (``num_tokens`` grows by one; returns True); when only that token is left to compute
        and the prompt is done (and it will not finish now), it starts decoding."""
        self.pending_tokens -= req.pending_tokens
        end = req.num_computed + n
        req.num_computed = end
        sampled = end == req.num_tokens
        if sampled:
            req.num_tokens = end + 1
        self.pending_tokens += req.pending_tokens
        if req.num_tokens < req.max_num_tokens and req.num_tokens - end == 1 and end >= req.prompt_tokens:
            self.start_decoding(req)
        return sampled

    def start_decoding(self, req: RequestState) -> None:
        """The running request has its prompt computed and exactly one token left: from now on it
        computes one token per step."""
        self.pending_tokens -= req.pending_tokens
        req.decoding = True
        self.num_decoding += 1
        self.decode_context_tokens += req.num_tokens

    def advance_decodes(self, num_tokens: int) -> None:
        """Decoding requests computed and sampled ``num_tokens`` tokens in all, one per request per
        step. The caller advanced their ``num_computed`` and ``num_tokens`` itself (the per-token hot
        loop, see the module docstring), or will when its decode run closes."""
        self.decode_context_tokens += num_tokens

    def _stop_decoding(self, req: RequestState) -> None:
        req.decoding = False
        self.num_decoding -= 1
        self.decode_context_tokens -= req.num_tokens
        self.pending_tokens += req.pending_tokens

    # ---- checking ---------------------------------------------------------------------------
    def check(self, requests: Iterable[RequestState]) -> None:
        """Raise AssertionError naming the first broken invariant; ``requests``: the unfinished ones."""
        queued = list(self.waiting) + self.running
        ids = sorted(r.request_id for r in queued)
        expected = sorted(r.request_id for r in requests)
        if ids != expected:
            raise AssertionError(f"queued requests {ids} != unfinished requests {expected}")
        if any(r.finished for r in queued):
            raise AssertionError("a finished request is still queued")
        if any(r.decoding for r in self.waiting):
            raise AssertionError("a waiting request is marked decoding")
        decoding = [r for r in self.running if r.decoding]
        counters = {
            "num_decoding": (self.num_decoding, len(decoding)),
            "decode_context_tokens": (self.decode_context_tokens, sum(r.num_tokens for r in decoding)),
            "pending_tokens": (self.pending_tokens, sum(r.pending_tokens for r in queued)),
        }
        for name, (kept, actual) in counters.items():
            if kept != actual:
                raise AssertionError(f"{name} is {kept} but the requests sum to {actual}")
