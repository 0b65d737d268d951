"""Hot-expert replication and placement: turn per-expert load statistics into a server placement.

Expert popularity follows a power law, so with one copy per expert the hottest expert's server bounds
throughput. The plan gives extra replicas to the experts with the most load per replica, then places
the replicas (each carrying load/replicas, the round-robin split of ``RoutingTable``) largest first on
the least-loaded server with a free slot (LPT scheduling), never two copies on one server.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

Placement = dict[str, tuple[int, ...]]  # server id -> hosted expert ids


def naive_placement(n_experts: int, server_ids: Sequence[str], replicas: int = 1) -> Placement:
    """Expert e on servers e, e+1, ..., e+replicas-1 (mod n): static, load-blind."""
    n = len(server_ids)
    if not 1 <= replicas <= n:
        raise ValueError(f"replicas must be in 1..{n} (number of servers), got {replicas}")
    hosted: dict[str, list[int]] = {sid: [] for sid in server_ids}
    for e in range(n_experts):
        for j in range(replicas):
            hosted[server_ids[(e + j) % n]].append(e)
    return {sid: tuple(sorted(ids)) for sid, ids in hosted.items()}


def replica_counts(expert_load: Mapping[int, float], total_slots: int, max_replicas: int,
                   min_replicas: int = 1) -> dict[int, int]:
    """Spend ``total_slots`` on replicas: each extra one goes to the expert with most load per replica."""
    counts = {e: min_replicas for e in expert_load}
    spare = total_slots - min_replicas * len(counts)
    if spare < 0:
        raise ValueError(f"{total_slots} slots cannot hold {len(counts)} experts x {min_replicas} replicas")
    heap = [(-load / min_replicas, e) for e, load in expert_load.items()]
    heapq.heapify(heap)
    while spare and heap:
        _, e = heapq.heappop(heap)
        if counts[e] >= max_replicas:
            continue
        counts[e] += 1
        spare -= 1
        heapq.heappush(heap, (-expert_load[e] / counts[e], e))
    return counts


def plan_placement(expert_load: Mapping[int, float], server_ids: Sequence[str], slots_per_server: int,
                   min_replicas: int = 1) -> Placement:
    """Replicate hot experts and place replicas so per-server load is as even as LPT makes it."""
    if slots_per_server < 1 or not server_ids:
        raise ValueError("need at least one server with at least one expert slot")
    counts = replica_counts(expert_load, slots_per_server * len(server_ids), len(server_ids), min_replicas)
    shards = sorted(((expert_load[e] / r, e) for e, r in counts.items() for _ in range(r)), reverse=True)
    load = dict.fromkeys(server_ids, 0.0)
    hosted: dict[str, set[int]] = {sid: set() for sid in server_ids}
    for shard_load, e in shards:
        eligible = [s for s in server_ids if len(hosted[s]) < slots_per_server and e not in hosted[s]]
        if not eligible:  # only possible when the slots run out unevenly; the expert keeps fewer copies
            continue
        target = min(eligible, key=lambda s: (load[s], len(hosted[s])))
        hosted[target].add(e)
        load[target] += shard_load
    return {sid: tuple(sorted(ids)) for sid, ids in hosted.items()}


def server_loads(placement: Placement, expert_load: Mapping[int, float]) -> dict[str, float]:
    """Expected load per server when each expert's load splits evenly over its replicas."""
    replicas: dict[int, int] = {}
    for ids in placement.values():
        for e in ids:
            replicas[e] = replicas.get(e, 0) + 1
    missing = sorted(e for e, load in expert_load.items() if load > 0 and e not in replicas)
    if missing:
        raise ValueError(f"placement hosts no copy of experts {missing}")
    return {sid: sum(expert_load.get(e, 0.0) / replicas[e] for e in ids) for sid, ids in placement.items()}


def max_over_mean(loads: Mapping[str, float]) -> float:
    """Imbalance: 1.0 is perfect; the hottest server runs at this multiple of the average."""
    values = list(loads.values())
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0
