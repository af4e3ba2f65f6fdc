"""Usage billed exactly once across nodes: a session node SIGKILLed with its disk during a
``store:false`` soak through the balancer, the cluster ledger reconciled with what the clients
saw (the short version of ``responses-ws bench ledger nodes``).  The killed node is started
again, so test_node_loss.py, after it, finds both session nodes up."""

from __future__ import annotations

import asyncio

from bench.kinds.ledger_nodes import Plan, soak, summary
from bench.multinode import Harness


def test_a_session_node_killed_with_its_disk_loses_no_ledger_line_and_doubles_none(harness: Harness):
    result = asyncio.run(soak(harness, Plan(ws=12, http=4, kills=1, warm_s=6.0, tail_s=4.0)))
    print("\n" + summary(result, "auto (commit: the store is Redis)"))
    v = result["reconcile"]
    assert v["mismatches"] == 0, v["examples"]
    assert v["lost_lines"] == v["duplicate_lines"] == 0
    assert v["seen_billed"] > 100 and v["ledger_lines"] >= v["seen_billed"]
    assert result["kills"][0]["processes"] > 0
    assert result["ws_dropped"] > 0, "no client was on the killed node"
    assert not result["journal_dir_exists"], "a ledger line was kept on a node's disk"
