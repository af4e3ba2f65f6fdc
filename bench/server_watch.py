"""What a kind watches of an embedded server's processes while a phase of its runs: the CPU
seconds each used (:class:`ServerCpu`) and ``py-spy`` recordings of them (:class:`PySpy`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from serve.embedded import APP_NAME

from .processes import actor_pids, cpu_s, session_host_pids


class ServerCpu:
    """CPU seconds of the server's processes (session hosts one by one, the gateway, the
    inference replica) and of this process (``probe_client``), between two samples; only this
    process's when the server is not this process's (``--url``)."""

    def __init__(self, embedded: bool) -> None:
        self.embedded = embedded

    def sample(self) -> dict[str, float]:
        out = {"probe_client": cpu_s([os.getpid()])}
        if self.embedded:
            out |= {f"host:{pid}": cpu_s([pid]) for pid in session_host_pids()}
            out["gateway"] = cpu_s(actor_pids(f"ServeReplica:{APP_NAME}:Gateway"))
            out["inference"] = cpu_s(actor_pids(f"ServeReplica:{APP_NAME}:InferenceDeployment"))
        return out

    @staticmethod
    def used(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, Any]:
        """Per process: CPU seconds between the samples and that as % of one core."""
        return {
            k: {
                "cpu_s": round(v - before.get(k, 0.0), 3),
                "core_pct": round(100 * (v - before.get(k, 0.0)) / wall_s, 1),
            }
            for k, v in after.items()
            if wall_s > 0
        }


class PySpy:
    """``py-spy record`` of every session host and the inference replica while a phase runs
    (``--py-spy DIR``)."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.procs: list[subprocess.Popen[bytes]] = []
        beside = Path(sys.executable).with_name("py-spy")  # in this environment, if not on PATH
        self.exe = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
        if out is not None and self.exe is None:
            raise SystemExit("--py-spy needs py-spy (pip install py-spy)")

    def start(self, label: str) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        targets = [(f"host{pid}", pid) for pid in session_host_pids()]
        targets += [
            (f"inference{pid}", pid) for pid in actor_pids(f"ServeReplica:{APP_NAME}:InferenceDeployment")
        ]
        for name, pid in targets:
            self.procs.append(
                subprocess.Popen(
                    [
                        str(self.exe),
                        "record",
                        "--pid",
                        str(pid),
                        "--rate",
                        "200",
                        "--threads",
                        "--nonblocking",
                        "--format",
                        "raw",
                        "--output",
                        str(self.out / f"{label}-{name}.txt"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
