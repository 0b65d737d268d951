"""Waiting in a pool of ``c`` identical servers fed by one load-balancing router: M/G/c.

The simulator's routers (``least_loaded``, ``prefix_aware``) send a request to the instance
with the least queued work, so a pool of ``c`` instances behaves close to one queue served by
``c`` servers (M/G/c), not like ``c`` independent queues each fed ``1/c`` of the load: no
instance idles while another has a backlog. The approximation used is Allen-Cunneen:

* ``P(wait) = C(c, a)``, Erlang's C formula for offered load ``a = lambda E[S]`` (Erlangs);
* ``E[W] = C(c, a) / (c mu - lambda) * (Ca^2 + Cs^2) / 2`` with ``mu = 1 / E[S]``,
  ``Ca^2`` the squared coefficient of variation of inter-arrival times (1: Poisson) and
  ``Cs^2`` that of the service time;
* the wait of a request that waits is exponential with mean ``E[W] / P(wait)`` (exact for
  M/M/c; the standard tail approximation otherwise), so
  ``P(W > t) = P(wait) exp(-t P(wait) / E[W])``.

For ``c = 1`` this is exactly the M/G/1 mean wait of Pollaczek-Khinchine
(``lambda E[S^2] / 2(1 - rho)``) with ``P(wait) = rho``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def erlang_c(servers: int, offered_erlangs: float) -> float:
    """Probability that an arrival waits in M/M/c with ``servers`` servers and offered load
    ``offered_erlangs`` = lambda / mu. Requires ``0 <= offered_erlangs < servers``.

    Computed through Erlang B's recursion ``B_k = a B_(k-1) / (k + a B_(k-1))``, which stays
    finite for hundreds of servers (no factorials), then ``C = B / (1 - rho (1 - B))``.
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if not 0.0 <= offered_erlangs < servers:
        raise ValueError(f"offered load must be in [0, servers={servers}), got {offered_erlangs}")
    if offered_erlangs == 0.0:
        return 0.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered_erlangs * b / (k + offered_erlangs * b)
    rho = offered_erlangs / servers
    return b / (1.0 - rho * (1.0 - b))


@dataclass(frozen=True)
class PoolWait:
    """The waiting-time law of one pool: ``P(wait)`` and the mean wait over all requests (s)."""

    p_wait: float
    mean_wait_s: float

    def tail(self, t_s: float) -> float:
        """``P(W > t_s)`` under the exponential-tail approximation (module docstring)."""
        if self.p_wait <= 0.0 or self.mean_wait_s <= 0.0:
            return 0.0
        return self.p_wait * math.exp(-t_s * self.p_wait / self.mean_wait_s)

    def quantile_s(self, q: float) -> float:
        """The ``q`` quantile (0 < q < 1) of the wait: 0 when ``P(wait) <= 1 - q``."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {q}")
        if self.p_wait <= 1.0 - q:
            return 0.0
        return self.mean_wait_s / self.p_wait * math.log(self.p_wait / (1.0 - q))


def allen_cunneen(servers: int, rate_per_s: float, mean_service_s: float, scv_service: float,
                  scv_arrival: float = 1.0) -> PoolWait:
    """Allen-Cunneen M/G/c wait of a pool of ``servers`` fed ``rate_per_s`` in total.

    ``scv_*`` are squared coefficients of variation (variance over squared mean). Requires
    utilisation ``rate_per_s * mean_service_s / servers < 1`` (ValueError otherwise).
    """
    a = rate_per_s * mean_service_s
    p_wait = erlang_c(servers, a)
    if p_wait == 0.0:
        return PoolWait(0.0, 0.0)
    mean_wait = p_wait * mean_service_s / (servers - a) * (scv_arrival + scv_service) / 2.0
    return PoolWait(p_wait, mean_wait)
