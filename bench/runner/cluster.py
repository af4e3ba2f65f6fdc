"""The runner on a Ray cluster: load actors on the nodes that carry the ``client`` resource.

Each actor (``num_cpus=0``, a sliver of the ``client`` resource, pinned to its node) runs a
:class:`~bench.runner.worker.LoadWorker` in its own process's event loop; by default one
actor per CPU of each client node, dealt across the nodes in turn.  The driver (this
process, connected to the cluster) pulls the records in batches; the actors are ended at the
end of the run, also when it fails or is interrupted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .drive import drive, shares
from .model import LoadResult, LoadSpec, TurnRecord

RESOURCE = "client"
ACTOR_SHARE = 0.001  # of the ``client`` resource, per actor
CALL_TIMEOUT_S = 900.0


class NoClientNodes(RuntimeError):
    """The cluster has no alive node with the client resource."""


def no_client_nodes_message(resource: str = RESOURCE) -> str:
    return (
        f"no alive Ray node has the `{resource}` resource to run the load actors on: add a client "
        f"node type (`available_node_types.client` with `resources: {{{resource}: 1}}`, min_workers 0) "
        f"to configs/cluster-local.yaml or configs/cluster-aws.yaml and start one, or start a node "
        f"with `ray start --address HEAD --resources '{{\"{resource}\": 1}}'`"
    )


def client_nodes(nodes: list[dict[str, Any]], resource: str = RESOURCE) -> list[dict[str, Any]]:
    """The alive nodes of ``nodes`` (``ray.nodes()``) that carry ``resource``."""
    return [n for n in nodes if n.get("Alive") and (n.get("Resources") or {}).get(resource, 0) > 0]


def placement(nodes: list[dict[str, Any]], actors: int | None) -> list[str]:
    """The node id of each actor: by default one per CPU of each node (at least one a node),
    dealt across the nodes in turn (node A, node B, A, B, ...)."""
    slots = [max(1, int((n.get("Resources") or {}).get("CPU", 1))) for n in nodes]
    order: list[str] = []
    for round_ in range(max(slots, default=0)):
        order += [n["NodeID"] for n, k in zip(nodes, slots) if round_ < k]
    if actors is None:
        return order
    return [nodes[i % len(nodes)]["NodeID"] for i in range(actors)] if actors > len(order) else order[:actors]


class LoadActor:
    """A load actor: a :class:`LoadWorker` answering the driver's calls."""

    def __init__(self, spec: LoadSpec, loops: list[int]) -> None:
        import ray

        from .worker import LoadWorker

        node_id = ray.get_runtime_context().get_node_id()
        self.worker = LoadWorker(spec, loops, node_id, ray.util.get_node_ip_address())

    async def call(self, method: str, *args: Any) -> Any:
        return await getattr(self.worker, method)(*args)


class ActorFleet:
    def __init__(
        self,
        spec: LoadSpec,
        actors: int | None,
        resource: str,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = client_nodes(ray.nodes(), resource)
        if not nodes:
            raise NoClientNodes(no_client_nodes_message(resource))
        where = placement(nodes, actors)
        parts = shares(spec.loops, len(where))
        remote = ray.remote(LoadActor)
        self.actors: list[Any] = [
            remote.options(
                num_cpus=0,
                resources={resource: ACTOR_SHARE},
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                runtime_env=runtime_env,
            ).remote(spec, share)
            for node_id, share in zip(where, parts)
        ]

    def call(self, method: str, *args: Any) -> list[Any]:
        import ray

        return list(ray.get([a.call.remote(method, *args) for a in self.actors], timeout=CALL_TIMEOUT_S))

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)


def run_on_cluster(
    spec: LoadSpec,
    actors: int | None = None,
    resource: str = RESOURCE,
    *,
    runtime_env: dict[str, Any] | None = None,
    on_records: Callable[[list[TurnRecord]], None] | None = None,
) -> LoadResult:
    """Run ``spec`` in load actors on the cluster's client nodes (this process must be
    connected to the cluster: ``ray.init``).  Raises :class:`NoClientNodes` when no node
    carries ``resource``."""
    fleet = ActorFleet(spec, actors, resource, runtime_env)
    try:
        return drive(fleet, spec, on_records=on_records)
    finally:
        fleet.close()
