"""A multi-node Ray cluster simulated on one machine, and deploying a Serve config onto it.

Node roles are custom resources, as on a real cluster (configs/cluster-*.yaml):
``head`` (Serve controller), ``session`` (a Gateway and its connections' actors) and
``accelerator`` (inference replicas).  Every node is a separate raylet with its own worker
processes (``ray.cluster_utils.Cluster``), all on this machine's cores; the processes of
one run are stopped by :meth:`SimulatedCluster.shutdown`, never by a machine-wide
``ray stop``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from serve.embedded import apply_ray_env

from . import ray_internals

# The Serve config of a cluster with session nodes (one gateway each) and accelerator nodes.
SERVE_CLUSTER_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "serve-cluster.yaml"


class SimulatedCluster:
    def __init__(
        self,
        *,
        session_nodes: int = 2,
        accelerator_nodes: int = 1,
        accelerators_per_node: int = 2,
        object_store_mb: int = 80,
        session_node_cpus: int = 1,
    ) -> None:
        apply_ray_env()  # inherited by every raylet and worker started below
        import ray
        from ray.cluster_utils import Cluster

        mb = 1024 * 1024
        # Cluster() records its head in /tmp/ray/ray_current_cluster (and never removes it),
        # which makes every address-less ray.init() on this machine — other test sessions,
        # embedded servers — join this cluster.  We connect by explicit address instead.
        with ray_internals.no_address_file():
            self.cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": 1,
                    "resources": {"head": 1},
                    "object_store_memory": object_store_mb * mb,
                    "include_dashboard": False,
                },
            )
        for _ in range(session_nodes):
            self.cluster.add_node(
                num_cpus=session_node_cpus, resources={"session": 1}, object_store_memory=object_store_mb * mb
            )
        for _ in range(accelerator_nodes):
            self.cluster.add_node(
                num_cpus=1,
                resources={"accelerator": accelerators_per_node},
                object_store_memory=object_store_mb * mb,
            )
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, log_to_driver=False)

    def node_roles(self) -> dict[str, str]:
        """Node id → ``head`` / ``session`` / ``accelerator``."""
        import ray

        roles = {}
        for n in ray.nodes():
            res = n.get("Resources", {})
            roles[n["NodeID"]] = next((r for r in ("session", "accelerator", "head") if r in res), "other")
        return roles

    def placement(self) -> dict[str, dict[str, int]]:
        """Live actors per class name → {role: count}, from the GCS (no dashboard needed)."""
        roles = self.node_roles()
        out: dict[str, Counter] = {}
        for info in ray_internals.live_actors():
            name = info.get("ActorClassName", "?").rsplit(".", 1)[-1]
            node = (info.get("Address") or {}).get("NodeID")
            out.setdefault(name, Counter())[roles.get(node or "", "other")] += 1
        return {k: dict(v) for k, v in out.items()}

    def shutdown(self) -> None:
        import ray

        try:
            from ray import serve

            serve.shutdown()
        finally:
            ray.shutdown()
            self.cluster.shutdown()


def deploy_serve_config(
    path: Path, edit: Callable[[dict[str, Any]], None] | None = None, timeout_s: float = 120.0
) -> dict[str, Any]:
    """What ``serve run <config.yaml>`` does (``serve deploy`` needs the dashboard): start
    Serve with the file's options and deploy its applications; returns the (edited) config.
    ``edit`` may adjust each application's ``args`` (ports, Redis URL) in place."""
    import time

    from ray import serve
    from ray.serve.schema import ApplicationStatus, ServeDeploySchema

    raw = yaml.safe_load(Path(path).read_text())
    for app in raw["applications"]:
        if edit is not None:
            edit(app.setdefault("args", {}))
    config = ServeDeploySchema.model_validate(raw)
    ray_internals.serve_start_and_deploy(config)
    deadline = time.monotonic() + timeout_s
    names = [a.name for a in config.applications]
    while True:
        apps = serve.status().applications
        states = {n: apps[n].status if n in apps else None for n in names}
        if all(s == ApplicationStatus.RUNNING for s in states.values()):
            return raw
        if any(s == ApplicationStatus.DEPLOY_FAILED for s in states.values()):
            raise RuntimeError(f"deploy failed: { {n: apps[n].message for n in names if n in apps} }")
        if time.monotonic() > deadline:
            raise TimeoutError(f"applications not running after {timeout_s:.0f}s: {states}")
        time.sleep(0.5)
