"""Run in its own process for test_cluster_deploy.py (a Ray cluster cannot share a process
with the suite's session-scoped embedded Ray): simulated cluster → configs/serve-cluster.yaml
→ WebSocket agent loops through it → one JSON line on stdout.  :class:`ScenarioProcess`
runs it (``python -m tests.support.cluster_scenario PORT REDIS_URL``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.cluster import SimulatedCluster, deploy_serve_config
from bench.rollouts import run_bench
from bench.workload import Workload
from serve.embedded import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "serve-cluster.yaml"
NODES_UP = "NODES UP"  # printed once every node of the cluster has started


def main(port: int, redis_url: str) -> dict:
    cluster = SimulatedCluster(session_nodes=2, accelerator_nodes=1, accelerators_per_node=2)
    print(NODES_UP, flush=True)
    try:

        def edit(args: dict) -> None:
            args["server"]["port"] = port
            args["server"]["gateway_replicas"] = (
                2  # fixed, one per simulated session node (placement, not scaling)
            )
            args["store"]["redis_url"] = redis_url
            args["store"]["redis_password_file"] = None  # the suite's redis-server has none
            args["session"]["warm_actors"] = 2  # keep the machine's memory for the test
            args["inference"]["scaling"]["autoscaling"]["max_replicas"] = 2

        deploy_serve_config(CONFIG, edit)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, timeout_s=60)
        w = Workload(
            tool_rounds=3,
            system_tokens=800,
            tool_def_tokens=400,
            tool_output_tokens=200,
            text_tokens=20,
            tool_time_ms=5,
        )

        records = asyncio.run(
            run_bench(url, w, ["ws"], rollouts=4, concurrency=4, warmup=False, api_key="sk-bench")
        )
        return {
            "rollouts": [
                {
                    "error": r.error,
                    "turns": len(r.turns),
                    "calls": sum(t.calls for t in r.turns),
                    "last_output": r.turns[-1].output_tokens if r.turns else 0,
                }
                for r in records
            ],
            "placement": cluster.placement(),
            "roles": sorted(cluster.node_roles().values()),
        }
    finally:
        cluster.shutdown()


class ScenarioProcess:
    """The scenario in a child process and process group of its own, its output in files
    under ``directory``; :meth:`result` waits for its end, and kills the group (no raylet
    outlives it) if it overruns."""

    def __init__(self, redis_url: str, directory: Path, timeout_s: float = 240) -> None:
        self.out, self.err = directory / "scenario.out", directory / "scenario.err"
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.cluster_scenario", str(free_port()), redis_url],
                cwd=ROOT,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def ray_up(self) -> bool:
        """Every node has started, or it has exited (tests/support/children.py)."""
        return self.exited() or NODES_UP in self.out.read_text()

    def result(self) -> dict:
        """Its JSON result; AssertionError if it failed or overran its time."""
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(
                f"cluster scenario overran {self.timeout_s:.0f}s:\n{self.err.read_text()[-3000:]}"
            ) from None
        lines = [line for line in self.out.read_text().splitlines() if line.startswith("RESULT ")]
        assert self.proc.returncode == 0 and lines, (
            f"scenario failed ({self.proc.returncode}):\n{self.err.read_text()[-3000:]}"
        )
        return json.loads(lines[-1][len("RESULT ") :])

    def stop(self) -> None:
        if not self.exited():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(int(sys.argv[1]), sys.argv[2])), flush=True)
