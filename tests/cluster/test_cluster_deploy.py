"""configs/serve-cluster.yaml deployed onto a simulated multi-node cluster (head, two
"session" nodes, one "accelerator" node), with WebSocket agent loops through it.

The cluster runs in a child process (tests/support/cluster_scenario.py): a Ray cluster
cannot share a process with the suite's session-scoped embedded Ray.  The process starts
with the suite's other children that run a Ray of their own (the ``cluster_scenario``
fixture, tests/support/children.py); its process group is killed if it overruns, so no
raylet outlives the test."""

from __future__ import annotations


def test_cluster_serve_config_runs_websocket_agent_loops_on_a_multi_node_cluster(cluster_scenario):
    result = cluster_scenario.result()
    assert result["roles"] == ["accelerator", "head", "session", "session"]
    for r in result["rollouts"]:
        assert r["error"] is None
        assert r["turns"] == 4 and r["calls"] == 3 and r["last_output"] > 0  # 3 tool rounds, then text
    placement = result["placement"]
    assert placement["ServeController"] == {"head": 1}
    assert placement["ServeReplica:responses-ws:Gateway"] == {"session": 2}  # one per session node
    assert set(placement["ServeReplica:responses-ws:InferenceDeployment"]) == {"accelerator"}
    assert set(placement["SessionHost"]) == {"session"}  # next to their gateway
