"""A measured window's figures from a node sampler's cumulative, timestamped samples (pure).

Counters (CPU seconds of a process or thread, prefix-cache blocks) count from the first
sample inside the window to the last one inside it; a counter that first shows up inside
the window (a process started during it) counts from zero, one that disappears counts up
to its last sample.  Gauges (sequences in the batches) are averaged over the samples inside."""

from __future__ import annotations

from collections.abc import Sequence

from ..stats import mean

Sample = tuple[float, dict[str, float]]
GAUGES = ("metrics/running", "metrics/replicas", "metrics/sockets")


def inside(samples: Sequence[Sample], t0: float, t1: float) -> list[Sample]:
    return [s for s in samples if t0 <= s[0] <= t1]


def deltas(samples: Sequence[Sample]) -> dict[str, float]:
    """Each counter's growth over ``samples`` (in time order)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for i, (_, values) in enumerate(samples):
        for key, v in values.items():
            if key in GAUGES:
                continue
            if key not in first:
                first[key] = v if i == 0 else 0.0
            last[key] = v
    return {k: max(0.0, last[k] - first[k]) for k in last}


def span_s(samples: Sequence[Sample]) -> float:
    return samples[-1][0] - samples[0][0] if len(samples) >= 2 else 0.0


def cpu_ms_by_role(d: dict[str, float], scale: float = 1.0) -> dict[str, float]:
    """``cpu/<role>/<pid>`` deltas summed by role, in ms (times ``scale``)."""
    out: dict[str, float] = {}
    for key, v in d.items():
        if key.startswith("cpu/"):
            role = key.split("/")[1]
            out[role] = out.get(role, 0.0) + v * 1000.0 * scale
    return out


def busiest_thread_ms_per_s(d: dict[str, float], span: float) -> dict[str, float]:
    """Per threaded part (``thread/<label>/<tid>``): its busiest thread's CPU, ms per second."""
    out: dict[str, float] = {}
    if span <= 0:
        return out
    for key, v in d.items():
        if key.startswith("thread/"):
            label = key.split("/")[1]
            out[label] = max(out.get(label, 0.0), v * 1000.0 / span)
    return out


def gauge_mean(samples: Sequence[Sample], key: str) -> float | None:
    return mean(s[1][key] for s in samples if key in s[1])


def running_per_replica(samples: Sequence[Sample]) -> float | None:
    """Mean sequences in a replica's batch over the samples (None: no metrics seen)."""
    running, replicas = gauge_mean(samples, "metrics/running"), gauge_mean(samples, "metrics/replicas")
    if running is None or not replicas:
        return None
    return running / replicas


def prefix_blocks(d: dict[str, float]) -> tuple[float, float] | None:
    if "metrics/hit" not in d and "metrics/miss" not in d:
        return None
    return d.get("metrics/hit", 0.0), d.get("metrics/miss", 0.0)


def scaled(samples: Sequence[Sample], t0: float, t1: float) -> tuple[dict[str, float], float]:
    """The counters' growth inside [t0, t1], scaled up to the whole window when the samples
    inside span less of it (a sampler's first or last tick falls inside the window), and
    the factor used (1.0: they span it; 0.0: fewer than two samples inside)."""
    ins = inside(samples, t0, t1)
    span = span_s(ins)
    if span <= 0:
        return {}, 0.0
    factor = (t1 - t0) / span
    return {k: v * factor for k, v in deltas(ins).items()}, factor
