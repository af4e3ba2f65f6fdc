"""A head and one worker node (``ray.cluster_utils.Cluster``), an actor on the worker, and
serve/ray_drain.py's calls before and after a real drain of the worker; prints one JSON
line.  Run by tests/cluster/test_ray_drain.py in a process of its own (a Ray cluster cannot
share a process with the suite's embedded Ray)."""

from __future__ import annotations

import json
import sys
import time

import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from serve import ray_drain


@ray.remote(num_cpus=0)
class OnWorker:
    """Keeps the worker busy (Ray stops an idle node at once when drained) and asks the
    wrapper from there, as a gateway replica does."""

    def seen(self) -> dict:
        here = ray_drain.current_node_id()
        drain = ray_drain.node_drain(here)
        return {
            "node_id": here,
            "deadline": None if drain is None else drain.deadline,
            "draining": drain is not None,
            "replica_stopping": ray_drain.serve_replica_stopping(),
        }


def main(deadline_s: float) -> dict:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        worker = cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        actor = OnWorker.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(worker.node_id, soft=False)
        ).remote()
        before = ray.get(actor.seen.remote())
        draining_before = sorted(ray_drain.draining_nodes())
        try:
            ray_drain.drain_node(worker.node_id, deadline_s=None, reason="idle_termination")
            rejected = None
        except ray_drain.DrainRejected as exc:
            rejected = str(exc)
        requested_at = time.time()
        ray_drain.drain_node(worker.node_id, deadline_s=deadline_s, message="tests/cluster/test_ray_drain.py")
        seen_by_driver = ray_drain.draining_nodes()
        after = ray.get(actor.seen.remote())
        return {
            "worker": worker.node_id,
            "head": cluster.head_node.node_id,
            "before": before,
            "draining_before": draining_before,
            "idle_termination_rejected": rejected,
            "requested_deadline": requested_at + deadline_s,
            "draining_after": {k: v.deadline for k, v in seen_by_driver.items()},
            "after": after,
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    print(json.dumps(main(float(sys.argv[1]))), flush=True)
