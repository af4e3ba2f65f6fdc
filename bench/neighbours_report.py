"""The neighbours kind's figures (bench/kinds/neighbours.py), pure: the probe's turns per phase
and their ratio to idle, and what the neighbours' own records (the load runner's) say of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .runner import LoadResult, TurnRecord
from .stats import mean, median, spread

SERVER_PHASES = ("parse_validate", "history_load", "render", "classify", "api_overhead")
ERRORS_KEPT = 5


@dataclass
class ProbeTurn:
    started: float  # time.time() when sent (comparable with the runner's records)
    total_ms: float
    model_ms: float | None  # server-reported queue + prefill + decode
    api_overhead_ms: float | None
    backend_ms: float | None = None  # of api_overhead: the model call beyond the model's time (the Serve hop)

    @property
    def ended(self) -> float:
        return self.started + self.total_ms / 1000.0

    @property
    def nonmodel_ms(self) -> float | None:
        return None if self.model_ms is None else self.total_ms - self.model_ms


def quantiles(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """p50, p90, the mean and the largest (a turn that met a stall weighs in the mean and max
    but hardly in the p50: fewer turns fit while the loop stalls), and how many."""
    m = mean(values)
    return {
        **spread(values, ("p50", "p90"), 2),
        "mean": None if m is None else round(m, 2),
        **spread(values, ("max", "n"), 2),
    }


def probe_summary(turns: Sequence[ProbeTurn]) -> dict[str, Any]:
    return {
        "turn_ms": quantiles([t.total_ms for t in turns]),
        "nonmodel_ms": quantiles([t.nonmodel_ms for t in turns if t.nonmodel_ms is not None]),
        "api_overhead_ms": median([t.api_overhead_ms for t in turns]),
    }


def ratios(phases: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Each loaded phase's probe p50 over the idle phase's."""
    idle = phases.get("idle", {}).get("probe", {}).get("turn_ms", {}).get("p50")
    return {
        name: (
            round(p["probe"]["turn_ms"]["p50"] / idle, 2) if idle and p["probe"]["turn_ms"]["p50"] else None
        )
        for name, p in phases.items()
        if name != "idle"
    }


def server_medians(records: Sequence[TurnRecord]) -> dict[str, float | None]:
    """The median of each of :data:`SERVER_PHASES` the server reported for these turns."""
    return {p: median([(r.server or {}).get(p) for r in records]) for p in SERVER_PHASES}


def clients(results: Sequence[LoadResult]) -> dict[str, Any]:
    """The neighbours' client processes, as the runner measured them: their CPU seconds and
    whether any was saturated (then the neighbours sent less than they were told to)."""
    stats = [c for r in results for c in r.clients]
    return {
        "cpu_s": round(sum(c.cpu_s for c in stats), 3),
        "saturated": [c.reason for c in stats if c.saturated],
    }


def failures(results: Sequence[LoadResult]) -> dict[str, Any]:
    """The neighbours' failed turns by type, and a few of their errors."""
    records = [r for res in results for r in res.records if not r.ok]
    errors = [e for res in results for errs in res.errors.values() for e in errs]
    return {
        "failures": dict(Counter(r.error_code or "error" for r in records)),
        "errors": errors[:ERRORS_KEPT],
    }


def http_summary(result: LoadResult, since: float) -> dict[str, Any]:
    """The HTTP clients' requests (those sent from ``since``, when the probe's turns began,
    measured) and the server's phases of them."""
    done = [r for r in result.records if r.ok]
    counted = [r for r in done if r.sent >= since]
    return {
        "requests": len(done),
        "requests_measured": len(counted),
        **failures([result]),
        "input_tokens": median([r.input_tokens for r in done]),
        "ms": quantiles([r.total_ms for r in counted]),
        "server_ms_median": server_medians(counted),
        "clients": clients([result]),
    }


def burst_window(result: LoadResult) -> tuple[float, float]:
    """A burst's go (the release of every first turn) and end (its last answer), time.time()."""
    return result.release_at, max((r.done for r in result.records), default=result.release_at)


def burst_summary(bursts: Sequence[LoadResult]) -> dict[str, Any]:
    """The bursts' resumed first turns: how long a burst took, each turn's wait for
    ``response.created`` and its whole time, the server's phases of them."""
    each = [r for b in bursts for r in b.records if r.ok]
    windows = [burst_window(b) for b in bursts]
    return {
        "bursts": len(bursts),
        "sockets": len(each) // max(1, len(bursts)),
        **failures(bursts),
        "window_ms": quantiles([(end - go) * 1000.0 for go, end in windows]),
        "input_tokens": median([r.input_tokens for r in each]),
        "created_ms": quantiles([r.first_event_ms for r in each]),
        "total_ms": quantiles([r.total_ms for r in each]),
        "server_ms_median": server_medians(each),
        "clients": clients(bursts),
    }
