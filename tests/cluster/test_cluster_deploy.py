"""configs/serve-cluster.yaml deployed onto a simulated multi-node cluster (head, two
"session" nodes, one "accelerator" node), with WebSocket agent loops through it.

The cluster runs in a child process (tests/support/cluster_scenario.py): a Ray cluster
cannot share a process with the suite's session-scoped embedded Ray.  Its process group is
killed if it overruns, so no raylet outlives the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from serve.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 150


def run_scenario(redis_url: str) -> dict:
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.cluster_scenario", str(free_port()), redis_url],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"cluster scenario overran {TIMEOUT_S}s:\n{err[-3000:]}") from None
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"scenario failed ({proc.returncode}):\n{err[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_cluster_serve_config_runs_websocket_agent_loops_on_a_multi_node_cluster(redis_server):
    result = run_scenario(redis_server)
    assert result["roles"] == ["accelerator", "head", "session", "session"]
    for r in result["rollouts"]:
        assert r["error"] is None
        assert r["turns"] == 4 and r["calls"] == 3 and r["last_output"] > 0  # 3 tool rounds, then text
    placement = result["placement"]
    assert placement["ServeController"] == {"head": 1}
    assert placement["ServeReplica:responses-ws:Gateway"] == {"session": 2}          # one per session node
    assert set(placement["ServeReplica:responses-ws:InferenceDeployment"]) == {"accelerator"}
    assert set(placement["SessionHost"]) == {"session"}                              # next to their gateway
