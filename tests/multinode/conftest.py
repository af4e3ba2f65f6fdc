"""The multi-node tier (``make test-multinode``): one harness for the whole tier
(bench/multinode: a head carrying the accelerator role and running Ray's job server, two
session nodes and a client node (the ``client`` resource: load actors), each in a network
namespace of its own, Redis on the head, HAProxy in front), started once and torn down at the
end, also when a test fails.  Needs root and haproxy (``make haproxy``).  The app runs with
resume on (``session.resume_grace_s``) and two inference replicas.  The modules run in name
order, after the three below; test_ledger.py kills a session node and starts it again (both are
up after it); test_node_loss.py kills one session node, starts it again and drains the other;
test_real_clients.py starts that one again and drains it under Codex CLI and the openai SDK;
test_resume.py restarts what is down, then drains and kills nodes again: it comes last.
test_ray_up.py, which brings up hosts of its own with `ray up` and needs no harness, runs first;
test_locality.py, with a harness of its own (two accelerator nodes), second;
test_scaling_experiment.py, a job that takes session nodes out of service and puts them back,
third (the first on the tier's harness, every node up)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.multinode import Harness
from bench.multinode.harness import CLIENT_SPEC, DEFAULT_SPECS
from tests.support.waiting import wait_until

INFERENCE_REPLICAS = 2  # the head carries ``accelerator: 2``: both run there
RESUME_GRACE_S = 30.0  # resume on any node (the Redis store on the head): test_resume.py
# Tool calls the scripted model makes before it answers: a Codex task (test_real_clients.py)
# long enough to be mid-task when its node is drained (80 rounds took Codex 5 s on the
# harness).  Raw clients send no tools.
CODEX_TOOL_ROUNDS = int(os.environ.get("RWS_MULTINODE_CODEX_ROUNDS", "400"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_ray_up.py first, then test_locality.py: their clusters run before the tier's
    harness starts (two clusters at once would not fit a small machine), and their teardowns
    are their own; then test_scaling_experiment.py, while every node of the tier's is up.
    (A conftest's hook sees every item of the session: the other tiers' stay as they are.)"""
    first = ("test_ray_up.py", "test_locality.py", "test_scaling_experiment.py")
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        return (
            first.index(item.path.name)
            if item.path.parent == here and item.path.name in first
            else len(first)
        )

    items.sort(key=rank)


def wait_up(harness: Harness, timeout_s: float = 30.0) -> None:
    """Wait until the balancer sees every session node ``UP``."""
    wait_until(
        lambda: all(v.startswith("UP") for v in harness.server_states().values()),
        timeout_s,
        "every session node UP in the balancer",
        every_s=0.3,
    )


def tier_args(args: dict) -> None:
    """Two inference replicas, resume on, the scripted model's tool rounds."""
    args.setdefault("session", {})["resume_grace_s"] = RESUME_GRACE_S
    args.setdefault("inference", {}).setdefault("policy", {})["tool_rounds"] = CODEX_TOOL_ROUNDS
    scaling = args.setdefault("inference", {}).setdefault("scaling", {})
    scaling["autoscaling"] = dict(
        scaling.get("autoscaling") or {}, min_replicas=INFERENCE_REPLICAS, max_replicas=INFERENCE_REPLICAS
    )


@pytest.fixture(scope="session")
def harness() -> Iterator[Harness]:
    if os.geteuid() != 0:
        pytest.fail("the multi-node tier needs root (network namespaces, a bridge)", pytrace=False)
    for binary in ("haproxy", "redis-server"):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is not installed: `make haproxy redis`", pytrace=False)
    t0 = time.monotonic()
    with Harness((*DEFAULT_SPECS, CLIENT_SPEC), edit_args=tier_args, job_server=True) as h:
        print(
            f"\nmulti-node harness up in {time.monotonic() - t0:.1f}s: balancer {h.url}, nodes "
            + ", ".join(f"{n.name}={n.address}" for n in h.topology.nodes)
        )
        yield h
