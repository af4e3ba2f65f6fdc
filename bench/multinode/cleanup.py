"""Remove what a harness left (``python -m bench.multinode.cleanup``, ``make multinode-clean``):
the processes inside its namespaces, its balancer, namespaces, interfaces and temp dirs —
only things named with the harness's prefix.  By default every prefix: the tier's harness
(``rwsmn``), the prefix-locality harness (``rwsloc``, :mod:`.locality`) and the ``ray up``
hosts (``rwsup``, :mod:`.hosts`), whose processes (sshd, Ray, Redis) all live in their
namespaces; a harness's balancer pid file is in its temp dir too."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from . import network, processes
from .topology import PREFIX, ours

HOSTS_PREFIX = "rwsup"  # bench/multinode/hosts.py
LOCALITY_PREFIX = "rwsloc"  # bench/multinode/locality.py

BALANCER_PIDFILE = "haproxy.pid"


def temp_dirs(prefix: str = PREFIX) -> list[Path]:
    return sorted(
        p for p in Path(tempfile.gettempdir()).glob(f"{prefix}-*") if p.is_dir() and ours(p.name, prefix)
    )


def cleanup(prefix: str = PREFIX) -> list[str]:
    """End and remove everything named with ``prefix``; what was removed."""
    removed = []
    dirs = temp_dirs(prefix)
    for d in dirs:
        pidfile = d / BALANCER_PIDFILE
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        if processes.alive(pid, str(d)) and processes.send([pid], signal.SIGKILL):
            removed.append(f"balancer pid {pid}")
    for ns in network.namespaces():
        if ours(ns, prefix):
            n = processes.kill_namespace(ns)
            if n:
                removed.append(f"{n} processes in {ns}")
    removed += network.destroy(prefix)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(f"directory {d}")
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.multinode.cleanup", description=__doc__)
    defaults = [PREFIX, LOCALITY_PREFIX, HOSTS_PREFIX]
    parser.add_argument("--prefix", action="append", help=f"default: {', '.join(defaults)}")
    args = parser.parse_args(argv)
    for prefix in args.prefix or defaults:
        removed = cleanup(prefix)
        print("\n".join(f"removed {r}" for r in removed) or f"nothing named {prefix}-* was left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
