"""A node's tie to its head (``python -m serve.node_watchdog``, started by the cluster YAMLs'
start commands next to ``ray start``): it watches the head's GCS port and, once that has
not accepted a connection for ``--grace-s`` seconds, stops this host's Ray (``ray stop
--force``) and the processes named in ``--pidfile`` files (the head's Redis), then exits.

Why: ``ray down`` with Ray's ``local`` provider stops Ray on the head only; it marks the
workers terminated in a local state file without contacting them (ray #17022), so their Ray
would run on.  With this, ``ray down`` (or a head that is gone for good) ends every node's Ray
and the head's Redis within ``grace_s`` plus a few seconds.  A head that comes back within
the grace (``ray up`` restarting it) changes nothing.

The decision is :func:`decide` (pure, an injected clock); the loop around it only probes,
sleeps and acts.  It must work while Ray is gone.
"""

from __future__ import annotations

import argparse
import enum
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_GRACE_S = 15.0
DEFAULT_INTERVAL_S = 2.0
CONNECT_TIMEOUT_S = 2.0


class Verdict(enum.Enum):
    WATCH = "watch"  # the head answers, or has not been gone long enough
    STOP = "stop"  # gone for the whole grace: stop this host's Ray and owned processes


@dataclass(frozen=True, slots=True)
class Seen:
    """What the watchdog knows: when the head last answered (``None``: never yet) and when
    watching started."""

    started_at: float
    last_answer_at: float | None = None


def decide(seen: Seen, now: float, grace_s: float) -> Verdict:
    """STOP once the head has not answered for ``grace_s``, counted from its last answer (or
    from the start, when it never answered: a node whose head never came up stops too)."""
    since = seen.last_answer_at if seen.last_answer_at is not None else seen.started_at
    return Verdict.STOP if now - since >= grace_s else Verdict.WATCH


def answers(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether ``host:port`` accepts a TCP connection (the GCS listens while the head runs)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie, exited and not yet reaped by
    its parent, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def stop_owned(pidfiles: Sequence[Path], term_wait_s: float = 10.0) -> list[int]:
    """SIGTERM the pid in each file (SIGKILL after ``term_wait_s``); the pids signalled."""
    pids = []
    for f in pidfiles:
        try:
            pids.append(int(f.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    signalled = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            signalled.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + term_wait_s
    for pid in signalled:
        while time.monotonic() < deadline:
            if not running(pid):
                break
            time.sleep(0.2)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return signalled


def watch(
    probe: Callable[[], bool],
    act: Callable[[], None],
    *,
    grace_s: float,
    interval_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Probe every ``interval_s`` until :func:`decide` says STOP, then ``act`` once."""
    seen = Seen(started_at=clock())
    while True:
        if probe():
            seen = Seen(seen.started_at, clock())
        if decide(seen, clock(), grace_s) is Verdict.STOP:
            act()
            return
        sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve.node_watchdog", description=__doc__)
    parser.add_argument("--gcs", required=True, help="the head's GCS, HOST:PORT")
    parser.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S)
    parser.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--stop-ray", action="store_true", help="run `ray stop --force` on this host")
    parser.add_argument("--pidfile", type=Path, action="append", default=[], help="a process this node owns")
    parser.add_argument("--own-pidfile", type=Path, help="write this watchdog's pid here")
    args = parser.parse_args(argv)
    if args.own_pidfile is not None:
        args.own_pidfile.write_text(f"{os.getpid()}\n")
    host, _, port = args.gcs.rpartition(":")
    ray = Path(sys.executable).parent / "ray"

    def act() -> None:
        print(f"{time.strftime('%H:%M:%S')} head {args.gcs} gone for {args.grace_s:g}s: stopping", flush=True)
        if args.stop_ray:
            subprocess.run([str(ray), "stop", "--force"], check=False, timeout=120)
        print(f"stopped pids {stop_owned(args.pidfile)}", flush=True)

    watch(lambda: answers(host, int(port)), act, grace_s=args.grace_s, interval_s=args.interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
