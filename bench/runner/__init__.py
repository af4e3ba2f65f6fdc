"""The lab's load runner: the Codex-like loops, from client processes of this machine
(:func:`run_local`) or from Ray actors on the cluster's client nodes (:func:`run_on_cluster`),
each measuring itself; a step whose clients were saturated is invalid.

    from bench.runner import LoadSpec, run_local, run_on_cluster
    result = run_local(LoadSpec(targets=("http://127.0.0.1:8000",), loops=16, duration_s=20))
    result.summary()  # turns/s, p50/p99 non-model time and TTFT, failures, valid or not

    with start_local(spec) as run:  # until told to stop (at the latest at the spec's deadline)
        ...  # measure something else meanwhile; run.running(), run.opened(), run.held_turns(1)
        result = run.stop()
"""

from .cluster import NoClientNodes, run_on_cluster
from .drive import LoadRun
from .local import run_local, start_local
from .model import (
    CPU_LIMIT,
    LAG_P99_LIMIT_MS,
    ClientStats,
    ConnectionRecord,
    LoadResult,
    LoadSpec,
    TurnRecord,
    saturation,
)
from .workloads import Chains, Resume

__all__ = [
    "CPU_LIMIT",
    "LAG_P99_LIMIT_MS",
    "Chains",
    "ClientStats",
    "ConnectionRecord",
    "LoadResult",
    "LoadRun",
    "LoadSpec",
    "NoClientNodes",
    "Resume",
    "TurnRecord",
    "run_local",
    "run_on_cluster",
    "saturation",
    "start_local",
]
