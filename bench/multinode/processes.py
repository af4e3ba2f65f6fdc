"""The harness's processes: each started in a session of its own (its own process group),
inside a node's namespace or, for the balancer, in the root namespace; ended by pid.  Every
process inside a harness's namespace was started by the harness (the namespaces are its
own), so a node's processes are exactly the namespace's (:func:`network.namespace_pids`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from .network import in_namespace, namespace_pids


def launch(
    cmd: list[str], log: Path, env: Mapping[str, str], namespace: str | None = None
) -> subprocess.Popen:
    """Start ``cmd`` (inside ``namespace`` if given) in a new session, output to ``log``."""
    full = in_namespace(namespace, *cmd) if namespace else cmd
    with open(log, "ab") as out:
        return subprocess.Popen(
            full,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def send(pids: Iterable[int], sig: signal.Signals) -> int:
    """``sig`` to each pid still there; how many got it."""
    n = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            n += 1
        except ProcessLookupError:
            pass
    return n


def kill_namespace(namespace: str, timeout_s: float = 15.0) -> int:
    """SIGKILL every process inside ``namespace`` until none is left (new ones may appear
    while a parent dies); how many were killed.  Raises if some outlive ``timeout_s``."""
    killed, deadline = 0, time.monotonic() + timeout_s
    while pids := namespace_pids(namespace):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes in {namespace} outlived SIGKILL: {pids}")
        killed += send(pids, signal.SIGKILL)
        time.sleep(0.1)
    return killed


def reap(procs: Iterable[subprocess.Popen], timeout_s: float = 5.0) -> None:
    """Collect the exit status of processes already killed (no zombies left)."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=2)


def stop(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def alive(pid: int, needle: str) -> bool:
    """Whether ``pid`` runs and its command line holds ``needle`` (a pid file's pid may
    have been reused by another process since)."""
    try:
        return needle.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
