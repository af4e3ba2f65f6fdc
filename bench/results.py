"""The one results writer: every kind's JSON file holds its own numbers beside a ``run``
block saying what ran where — the command line, when, for how long, the project's version
and the machine (cores, memory, platform, Python, Ray, the load average when it started).

:mod:`bench.commands` starts the :class:`Run` before the kind runs (``args.run``); the kind
hands its payload to :func:`write`.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

KEY = "run"  # the block's key in every results file
PROJECT = "responses-ws"


def version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (read from its metadata, not imported)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """The machine as a benchmark's numbers depend on it (the load average is the
    :class:`Run`'s: it is taken when the run starts)."""
    import psutil

    return {
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ray": version("ray"),
    }


@dataclass(frozen=True)
class Run:
    """One command's run: what it was, when it started and the machine then."""

    command: str
    started_at: float  # Unix time
    load_average: tuple[float, float, float]
    machine: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, command: str) -> Run:
        return cls(command, time.time(), os.getloadavg(), machine())

    def record(self, now: float | None = None) -> dict[str, Any]:
        """The ``run`` block, ``now`` (default: the time of the call) ending its duration."""
        end = time.time() if now is None else now
        return {
            "command": self.command,
            "started_at": datetime.fromtimestamp(self.started_at, UTC).isoformat(timespec="seconds"),
            "duration_s": round(end - self.started_at, 3),
            "version": version(PROJECT),
            "machine": {**self.machine, "load_average_at_start": [round(x, 2) for x in self.load_average]},
        }


def write(path: Path, payload: Mapping[str, Any], run: Run) -> Path:
    """Write ``payload`` (the kind's own keys, unchanged) and the ``run`` block to ``path``
    as JSON; returns ``path``."""
    if KEY in payload:
        raise ValueError(f"a results payload may not have its own {KEY!r} key")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({KEY: run.record(), **payload}, indent=1, default=str) + "\n")
    return path
