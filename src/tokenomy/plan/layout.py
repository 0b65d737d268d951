"""Place a plan's instances on nodes (for the per-node report).

Every TP degree the planner uses divides the node size (1, 2, 4, 8 on 8-GPU nodes), so
first-fit in decreasing TP never strands GPUs: any set of instances whose GPUs fit the
inventory of a type fits its nodes, which is why the MILP only constrains GPUs per type.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenomy.plan.options import Option


@dataclass
class Node:
    """One node of ``gpus`` GPUs of type ``gpu`` and the instances placed on it."""

    name: str
    gpu: str
    gpus: int
    instances: list[Option] = field(default_factory=list)

    @property
    def used(self) -> int:
        return sum(o.candidate.tp for o in self.instances)


def place(chosen: tuple[Option, ...], inventory: dict[str, int], gpus_per_node: int) -> list[Node]:
    """Nodes holding one entry per instance (an option repeated ``count`` times), first-fit by TP."""
    nodes: list[Node] = []
    for gpu, total in sorted(inventory.items()):
        mine = [Node(f"{gpu.lower()}-{i}", gpu, min(gpus_per_node, total - i * gpus_per_node))
                for i in range(-(-total // gpus_per_node))]
        wanted = sorted((o for o in chosen if o.candidate.gpu == gpu), key=lambda o: -o.candidate.tp)
        for opt in wanted:
            for _ in range(opt.count):
                node = next((n for n in mine if n.gpus - n.used >= opt.candidate.tp), None)
                if node is None:
                    raise ValueError(f"cannot place {opt.candidate.key} on {gpu} nodes of {gpus_per_node} GPUs")
                node.instances.append(opt)
        nodes += mine
    return nodes
