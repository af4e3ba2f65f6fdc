"""One server per port: the gateway replicas of one application on a node share one listening
socket, and no other process may join them (docs/reliability.md).

The kernel lets any socket of the same user join a ``SO_REUSEPORT`` group and splits new
connections between them, so a second server on the port would silently take a share of
the first one's clients.  Each replica therefore records its membership as a Unix socket
bound in Linux's abstract namespace, ``@responses-ws-port/<port>/<owner>/<pid>/…``
(``owner``: a digest of the application's name and its Ray cluster).  Such a name lives
exactly as long as its socket: a process that crashes leaves nothing stale behind.  The
abstract namespace belongs to the network namespace, as TCP ports do.  Joining checks the
members and binds under a per-port lock (another abstract name), so two servers starting at
once cannot both pass the check.

A replica that joins receives the listening socket itself from a member (its record listens
and passes the descriptor, ``SCM_RIGHTS``) rather than binding a second socket into the
port's ``SO_REUSEPORT`` group: with one socket there is one accept queue, and a replica that
stops (a redeploy's old gateway) closes only its own descriptor.  Closing a listener of a
group resets the connections the kernel queued on it and has not yet handed to ``accept``
(Linux moves them to another listener only with ``net.ipv4.tcp_migrate_req=1``); with one
socket, they stay queued for the replicas that go on.  Only when no member answers does a
replica bind its own socket into the group (``SO_REUSEPORT``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIX = "responses-ws-port"
LOCK_WAIT_S = 10.0
SHARE_TIMEOUT_S = 2.0  # for a member to pass its listening socket


@dataclass(frozen=True, slots=True)
class Member:
    """A process serving the port as a replica of the application ``owner`` (a digest)."""

    owner: str
    pid: int | None  # None: a name not of this module's making (still a member)
    name: str = ""  # the abstract name, without its leading NUL


class PortTaken(Exception):
    """Another process serves the port: another responses-ws server (``responses_ws``) or
    any other program; ``pid`` when this user can see it."""

    def __init__(self, host: str, port: int, pid: int | None, *, responses_ws: bool) -> None:
        self.host, self.port, self.pid, self.responses_ws = host, port, pid, responses_ws
        holder = "another responses-ws server" if responses_ws else "another process"
        who = f"pid {pid}: {command_line(pid)}" if pid is not None else "a process this user cannot see"
        super().__init__(
            f"port {port} is already in use by {holder} ({who}); stop it or choose another port (--port)"
        )


def owner_digest(owner: str) -> str:
    return hashlib.sha256(owner.encode()).hexdigest()[:16]


def members(port: int, proc_net_unix: Path = Path("/proc/net/unix")) -> list[Member]:
    """The processes recorded as serving ``port`` (the bound abstract names, ``@``-prefixed
    in ``/proc/net/unix``)."""
    found = []
    needle = f"@{PREFIX}/{port}/"
    for line in proc_net_unix.read_text(errors="replace").splitlines()[1:]:
        path = line.rsplit(" ", 1)[-1]
        if path.startswith(needle):
            owner, _, rest = path[len(needle) :].partition("/")
            pid = rest.partition("/")[0]
            found.append(Member(owner, int(pid) if pid.isdigit() else None, path[1:]))
    return found


class PortClaim:
    """This process's membership of the port: its record, which passes ``listener`` to the
    replicas that join.  :meth:`close` it before the listener."""

    def __init__(self, record: socket.socket, listener: socket.socket) -> None:
        self._record, self._listener = record, listener
        self._lock = threading.Lock()
        self._closed = False
        self._passing = threading.Thread(target=self._pass_listener, name="port-claim", daemon=True)
        self._passing.start()

    def _pass_listener(self) -> None:
        while True:
            try:
                conn, _ = self._record.accept()
            except OSError:  # closed
                return
            with conn, self._lock:
                if self._closed:
                    return
                if same_user(conn):  # as the kernel's rule for joining the port's group
                    with contextlib.suppress(OSError):
                        socket.send_fds(conn, [b"L"], [self._listener.fileno()])

    def close(self) -> None:
        """Leave the port: no replica gets the listener from here any more (those that have
        it keep it)."""
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._record.shutdown(socket.SHUT_RDWR)  # wakes the accept: its thread ends
        self._passing.join(timeout=1.0)
        self._record.close()


def claim(
    host: str, port: int, owner: str, bind: Callable[[str, int], socket.socket]
) -> tuple[socket.socket, PortClaim]:
    """The listener of ``owner``'s replicas on the port: the socket a member listens on
    (:func:`shared_listener`), else ``bind(host, port)``; unless a process of another
    application, or any other program, serves the port (:class:`PortTaken`)."""
    digest = owner_digest(owner)
    with _port_lock(port):
        check(host, port, owner=digest)
        listener = (
            shared_listener(host, port, [m for m in members(port) if m.owner == digest]) if port else None
        ) or bind(host, port)
        port = listener.getsockname()[1]  # the one the kernel picked for port 0
        record = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            record.bind(f"\0{PREFIX}/{port}/{digest}/{os.getpid()}/{uuid.uuid4().hex[:8]}")
            record.listen(16)
        except BaseException:
            record.close()
            listener.close()
            raise
    return listener, PortClaim(record, listener)


def shared_listener(host: str, port: int, replicas: list[Member]) -> socket.socket | None:
    """The listening socket one of ``replicas`` passes (:class:`PortClaim`), if it listens
    on ``host:port`` (a redeploy may change the host); ``None`` if none does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4][:2]
    for member in replicas:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.settimeout(SHARE_TIMEOUT_S)
        try:
            conn.connect(f"\0{member.name}")
            _, fds, _, _ = socket.recv_fds(conn, 16, 1) if same_user(conn) else (b"", [], 0, None)
        except OSError:  # gone, or leaving
            continue
        finally:
            conn.close()
        if not fds:
            continue
        sock = socket.socket(fileno=fds[0])
        if (
            sock.family == family
            and sock.type == socket.SOCK_STREAM
            and sock.getsockname()[:2] == address
            and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        ):
            # Non-blocking already (a flag of the socket, shared); never set it blocking here.
            sock.setblocking(False)
            return sock
        sock.close()
    return None


def check(host: str, port: int, *, owner: str | None = None) -> None:
    """:class:`PortTaken` unless ``port`` is free on ``host`` or served only by replicas of
    ``owner`` (a digest; ``None``: of no application, e.g. before a Ray is started)."""
    if port == 0:
        return
    current = members(port)
    foreign = [m for m in current if m.owner != owner]
    if foreign:
        raise PortTaken(host, port, foreign[0].pid, responses_ws=True)
    if current:
        return  # our own application's replicas: join them
    # Nobody of ours: is any other program listening?  A bind without SO_REUSEPORT fails
    # while any socket listens on the port, even one that set SO_REUSEPORT.
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise PortTaken(host, port, listener_pid(port), responses_ws=False) from None
    finally:
        probe.close()


def same_user(conn: socket.socket) -> bool:
    """Is the process at the other end of ``conn`` (a Unix socket) this process's user?
    Abstract names have no permissions: anyone on the machine may connect to a record."""
    _, uid, _ = struct.unpack(
        "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    )
    return uid == os.getuid()


@contextlib.contextmanager
def _port_lock(port: int) -> Iterator[None]:
    """Held while one process checks and joins the port; freed by the kernel if it dies."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    deadline = time.monotonic() + LOCK_WAIT_S
    try:
        while True:
            try:
                lock.bind(f"\0{PREFIX}-lock/{port}")
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        yield
    finally:
        lock.close()


def listener_pid(port: int) -> int | None:
    """The pid of a process listening on TCP ``port``, if this user can see one."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(proc.name)
    return None


def command_line(pid: int) -> str:
    """What ``ps`` would show for ``pid`` (Ray names its workers, e.g.
    ``ray::ServeReplica:responses-ws:Gateway``); ``?`` if it is gone."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()[:120]
        )
    except OSError:
        return "?"
