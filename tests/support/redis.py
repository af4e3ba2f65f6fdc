"""Throw-away Redis: one private, non-persistent ``redis-server`` on a free port, or a Redis
Cluster of six (:class:`Cluster`); started and waited on as the lab's harness starts its own
(:mod:`bench.services`)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.services import redis_server_command, wait_redis
from serve.embedded import free_port


def _start_once(binary: str) -> tuple[subprocess.Popen[bytes], int] | None:
    """A server on a free port; ``None`` if it died (e.g. someone took the port)."""
    port = free_port()
    proc = subprocess.Popen(
        redis_server_command(binary, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if wait_redis(proc, port):
        return proc, port
    proc.kill()
    proc.wait()
    return None


def start(binary: str, attempts: int = 3) -> tuple[subprocess.Popen[bytes], str] | None:
    """Start ``binary`` (a redis-server); its process and URL, or ``None`` after ``attempts``
    failed starts.  Stop it with :func:`stop`."""
    for _ in range(attempts):
        started = _start_once(binary)
        if started is not None:
            proc, port = started
            return proc, f"redis://127.0.0.1:{port}/0"
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ a Redis Cluster

CLUSTER_NODE_TIMEOUT_MS = 2000  # how long a primary may be silent before its replica takes over


class Cluster:
    """A throw-away Redis Cluster on 127.0.0.1: three primaries with one replica each (six
    ``redis-server`` processes with ``cluster-enabled yes``, free ports, a temp directory
    each, non-persistent), built with ``redis-cli --cluster create``.  :meth:`kill` SIGKILLs
    one node (a failover), :meth:`restart` brings it back (it rejoins as a replica),
    :meth:`stop` ends every process by its pid and removes the directories."""

    def __init__(self, binary: str, cli: str, primaries: int = 3) -> None:
        self.binary = binary
        self.cli = cli
        self.root = Path(tempfile.mkdtemp(prefix="rws-redis-cluster-"))
        self.ports: list[int] = []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        try:
            for _ in range(2 * primaries):
                port = free_port()
                self.ports.append(port)
                self._spawn(port)
            for port in self.ports:
                self._wait_ping(port)
            subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports)]
                + ["--cluster-replicas", "1", "--cluster-yes"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=60,
            )
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """Every node as a startup node (``store.redis_url`` with ``store.redis_cluster``)."""
        return ",".join(f"redis://127.0.0.1:{p}" for p in self.ports)

    def _spawn(self, port: int) -> None:
        directory = self.root / str(port)
        directory.mkdir(exist_ok=True)
        bus = free_port()
        cluster = [
            "--cluster-port", str(bus),
            "--dir", str(directory),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS),
            "--repl-diskless-sync-delay", "0",  # a replica's first sync at once, not after 5 s
        ]  # fmt: skip
        self.procs[port] = subprocess.Popen(
            redis_server_command(self.binary, port, extra=cluster),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _wait_ping(self, port: int) -> None:
        if not wait_redis(self.procs[port], port):
            raise RuntimeError(f"cluster node on port {port} did not start")

    def _cli(self, port: int, *args: str) -> str:
        return subprocess.run(
            [self.cli, "-p", str(port), *args], check=False, capture_output=True, text=True, timeout=10
        ).stdout

    def role(self, port: int) -> str:
        """``master`` or ``slave`` (``INFO replication``), ``""`` if the node does not answer."""
        for line in self._cli(port, "INFO", "replication").splitlines():
            if line.startswith("role:"):
                return line.split(":", 1)[1].strip()
        return ""

    def primaries(self) -> list[int]:
        return [p for p in self.ports if p in self.procs and self.role(p) == "master"]

    def slots_of(self, port: int) -> set[int]:
        """The hash slots the primary on ``port`` serves (``CLUSTER SLOTS``)."""
        import redis

        with redis.Redis(host="127.0.0.1", port=port) as client:
            ranges = client.execute_command("CLUSTER", "SLOTS")
        out: set[int] = set()
        for start, end, primary, *_replicas in ranges:
            if int(primary[1]) == port:
                out |= set(range(int(start), int(end) + 1))
        return out

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        """Until every node reports ``cluster_state:ok``, three primaries each have a
        replica whose link is up and in sync."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in self._cli(p, "CLUSTER", "INFO") for p in self.procs):
                replicas = [p for p in self.procs if self.role(p) == "slave"]
                synced = all(
                    "master_link_status:up" in (info := self._cli(p, "INFO", "replication"))
                    and "master_sync_in_progress:0" in info
                    for p in replicas
                )
                if len(replicas) * 2 == len(self.ports) and synced:
                    return
            time.sleep(0.1)
        raise RuntimeError("the Redis Cluster did not become healthy")

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (its replica is promoted after the node timeout)."""
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def restart(self, port: int) -> None:
        """Start the killed node again from its ``nodes.conf``: it rejoins as a replica."""
        self._spawn(port)
        self._wait_ping(port)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)
