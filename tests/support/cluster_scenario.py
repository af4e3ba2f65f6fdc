"""Run in its own process by test_cluster_deploy.py (a Ray cluster cannot share a process
with the suite's session-scoped embedded Ray): simulated cluster → configs/serve-cluster.yaml
→ WebSocket agent loops through it → one JSON line on stdout."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from bench.cluster import SimulatedCluster, deploy_serve_config
from bench.rollouts import run_rollout
from bench.workload import Workload
from serve.embedded import wait_ready

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "serve-cluster.yaml"


def main(port: int, redis_url: str) -> dict:
    cluster = SimulatedCluster(session_nodes=2, accelerator_nodes=1, accelerators_per_node=2)
    try:
        def edit(args: dict) -> None:
            args["server"]["port"] = port
            args["store"]["redis_url"] = redis_url
            args["session"]["warm_actors"] = 2   # keep the machine's memory for the test
            args["inference"]["scaling"]["autoscaling"]["max_replicas"] = 2

        deploy_serve_config(CONFIG, edit)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, timeout_s=60)
        w = Workload(tool_rounds=3, system_tokens=800, tool_def_tokens=400, tool_output_tokens=200,
                     text_tokens=20, tool_time_ms=5)

        async def loops():
            return await asyncio.gather(*(run_rollout("ws", url, w, r) for r in range(4)))

        records = asyncio.run(loops())
        return {
            "rollouts": [{"error": r.error, "turns": len(r.turns),
                          "calls": sum(t.calls for t in r.turns),
                          "last_output": r.turns[-1].output_tokens if r.turns else 0} for r in records],
            "placement": cluster.placement(),
            "roles": sorted(cluster.node_roles().values()),
        }
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(int(sys.argv[1]), sys.argv[2])), flush=True)
