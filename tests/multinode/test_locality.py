"""Prefix locality across inference replicas, on real nodes (docs/scaling.md, "Prefix locality
across inference replicas"): a harness of its own (``bench.multinode.locality``: four
replicas on two accelerator nodes at most, two session nodes), 16 sessions of their own
prompts, a resume of each on the other session node, Serve's autoscaling taking the replicas
from four to two and back to four while the sessions keep turning.

Bounds, not times: the pins spread as rendezvous hashing of 16 routes does (at least three
replicas, none with more than 10: each fails about once in a thousand runs); a resumed
session stays on its replica and finds its whole prefix; a scale-down moves only the
sessions of the removed replicas (k/n of them on average, at most 13 of 16); a scale-up moves none;
``cached_tokens`` on every turn is what the replica that served it can hold (0 on a replica
that never served the conversation, at least the previous prompt on the same replica) and
recovers after a move.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from bench.multinode import locality
from bench.multinode.locality_figures import Turn, check_cached

PLAN = locality.Plan()


@pytest.fixture(scope="module")
def result() -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.fail("the multi-node tier needs root (network namespaces, a bridge)", pytrace=False)
    for binary in ("haproxy", "redis-server"):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is not installed: `make haproxy redis`", pytrace=False)
    with locality.harness(PLAN) as h:
        out = asyncio.run(locality.experiment(h, PLAN))
    print("\n" + locality.report(out))
    yield out


def test_the_replicas_run_on_both_accelerator_nodes_and_the_sessions_are_pinned_evenly(result):
    full = result["replicas"]["full"]
    assert len(full) == PLAN.max_replicas
    assert {p["node"] for p in full} == {result["nodes"]["head"], result["nodes"]["accelerator1"]}
    counts = list(result["pins"]["per_replica"].values())
    assert sum(counts) == PLAN.sessions
    assert sum(c > 0 for c in counts) >= PLAN.max_replicas - 1 and max(counts) <= 10, result["pins"]


def test_a_session_resumed_on_the_other_node_keeps_its_replica_and_finds_its_prefix(result):
    resumed = result["resumed_on_other_node"]
    assert resumed["same_replica"] == resumed["sessions"] == PLAN.sessions
    assert resumed["found_whole_prefix"] == PLAN.sessions, resumed
    moved_node = [
        s["nodes"][locality.RESUMED_TURN] != s["nodes"][locality.RESUMED_TURN - 1]
        for s in result["sessions"].values()
    ]
    assert all(moved_node)


def test_a_scale_down_moves_only_the_removed_replicas_sessions(result):
    down = next(c for c in result["changes"] if c["name"] == "scale-down")
    assert (len(down["replicas_before"]), len(down["replicas_after"])) == (
        PLAN.max_replicas,
        PLAN.min_replicas,
    )
    assert down["unforced"] == [] and down["moved"] == down["forced"], down
    k, n = PLAN.max_replicas - PLAN.min_replicas, PLAN.max_replicas
    assert down["minimum_share"] == k / n
    # hashing's spread: k/n of them on average; more than 13 of 16 on two of four about once in 500 runs
    assert len(down["forced"]) <= 13, down


def test_a_scale_up_moves_no_session(result):
    up = next(c for c in result["changes"] if c["name"] == "scale-up")
    assert (len(up["replicas_before"]), len(up["replicas_after"])) == (PLAN.min_replicas, PLAN.max_replicas)
    assert up["moved"] == [] and up["minimum_share"] == 0.0, up


def test_cached_tokens_are_what_the_serving_replica_holds_and_recover_after_a_move(result):
    assert result["errors"] == [] and result["pressure"]["errors"] == []
    assert result["cached_tokens"]["wrong"] == []
    down = next(c for c in result["changes"] if c["name"] == "scale-down")
    for session in down["moved"]:
        turns = [Turn(**t) for t in result["sessions"][session]["turns"]]
        checks = check_cached(turns)
        last_move = max(i for i, c in enumerate(checks) if c.kind == "moved")
        assert checks[last_move].cached == 0
        after = checks[last_move + 1 :]
        assert after and after[0].kind == "kept" and after[0].ok, (session, checks[last_move:])
