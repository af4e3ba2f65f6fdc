"""One server per port (serve/port_claim.py), with real sockets and processes: replicas of
one application share the port, anyone else is refused with the holder's pid, and a claim
dies with its process (nothing stale after a crash)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from serve.embedded import free_port
from serve.front import bind_socket
from serve.port_claim import PortTaken, check, claim, members, owner_digest

HOLD = textwrap.dedent("""
    import sys, time
    from serve.front import bind_socket
    from serve.port_claim import claim
    listener, _ = claim("127.0.0.1", int(sys.argv[1]), sys.argv[2], bind_socket)
    print("claimed", flush=True)
    time.sleep(600)  # a process holding the port until the test ends it: the thing under test
""")


def hold_in_child(port: int, owner: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(port), owner], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "claimed"
    return proc


def test_replicas_of_one_application_share_the_port_and_another_is_refused_with_the_pid():
    port = free_port()
    first = hold_in_child(port, "responses-ws@10.0.0.1:6379")
    try:
        listener, mine = claim(
            "127.0.0.1", port, "responses-ws@10.0.0.1:6379", bind_socket
        )  # a second replica
        assert {m.pid for m in members(port)} == {first.pid, os.getpid()}
        with pytest.raises(PortTaken) as refused:
            claim("127.0.0.1", port, "responses-ws@127.0.0.1:41000", bind_socket)  # another Ray's server
        assert refused.value.pid in {first.pid, os.getpid()}
        assert refused.value.responses_ws
        assert (
            f"port {port} is already in use by another responses-ws server (pid {refused.value.pid}"
            in str(refused.value)
        )
        with pytest.raises(PortTaken):
            check("127.0.0.1", port)  # before a Ray is started: every member is foreign
        check("127.0.0.1", port, owner=owner_digest("responses-ws@10.0.0.1:6379"))  # its own: fine
        mine.close()
        listener.close()
    finally:
        first.kill()
        first.wait()


def test_a_replica_that_leaves_resets_none_of_the_connections_the_kernel_queued_on_the_port():
    """Replicas share one listening socket (passed on, not bound twice): when one leaves —
    a redeploy's old gateway, here killed — the connections queued on the port stay queued
    for the replica that goes on.  Before, each replica bound its own socket into the port's
    SO_REUSEPORT group, the kernel spread new connections over their queues, and the
    leaving one's close reset its share (about half of these) unanswered."""
    port = free_port()
    first = hold_in_child(port, "responses-ws@10.0.0.1:6379")
    listener, mine = claim("127.0.0.1", port, "responses-ws@10.0.0.1:6379", bind_socket)
    try:
        clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
        for client in clients:  # accepted by nobody yet: queued in the kernel
            client.sendall(b"ping")
        first.kill()
        first.wait()
        while True:  # what is queued on the port now (the descriptor is non-blocking)
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                break
            with conn:
                conn.settimeout(5)
                assert conn.recv(4) == b"ping"
                conn.sendall(b"pong")
        answers = []
        for client in clients:
            with client:
                try:
                    answers.append(client.recv(4))
                except OSError as exc:
                    answers.append(repr(exc).encode())
        assert answers == [b"pong"] * 20
    finally:
        first.kill()
        first.wait()
        mine.close()
        listener.close()


ASK_AS_OTHER_USER = textwrap.dedent("""
    import socket, sys
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.settimeout(5)
    conn.connect("\\0" + sys.argv[1])
    _, fds, _, _ = socket.recv_fds(conn, 16, 1)
    print(len(fds))
""")


@pytest.mark.skipif(
    os.getuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="needs root to run as nobody"
)
def test_another_user_cannot_take_the_listener_from_a_claim():
    """Abstract names have no permissions; a claim passes its listener only to its own
    user's processes (the kernel's rule for joining a SO_REUSEPORT group)."""
    listener, mine = claim("127.0.0.1", 0, "responses-ws@10.0.0.1:6379", bind_socket)
    try:
        [record] = members(listener.getsockname()[1])
        asked = subprocess.run(
            ["/usr/bin/python3", "-c", ASK_AS_OTHER_USER, record.name],
            user=65534,
            capture_output=True,
            text=True,
            timeout=30,
            cwd="/",
            check=True,
        )
        assert asked.stdout.strip() == "0", asked
    finally:
        mine.close()
        listener.close()


def test_a_crashed_holder_leaves_nothing_behind():
    port = free_port()
    holder = hold_in_child(port, "responses-ws@10.0.0.1:6379")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert members(port) == []
    listener, mine = claim("127.0.0.1", port, "other@10.0.0.2:6379", bind_socket)
    assert [m.owner for m in members(port)] == [owner_digest("other@10.0.0.2:6379")]
    mine.close()
    listener.close()
    assert members(port) == []


def test_a_port_another_program_listens_on_is_refused_with_its_pid():
    other = socket.socket()  # no SO_REUSEPORT, no claim: any other server
    other.bind(("127.0.0.1", 0))
    other.listen()
    port = other.getsockname()[1]
    try:
        with pytest.raises(PortTaken) as refused:
            claim("127.0.0.1", port, "responses-ws@10.0.0.1:6379", bind_socket)
        assert not refused.value.responses_ws
        assert refused.value.pid == os.getpid()
        assert f"port {port} is already in use by another process (pid " in str(refused.value)
    finally:
        other.close()


def test_a_reuseport_listener_without_a_claim_is_refused_too():
    """The kernel would let it share the port; the probe finds it all the same."""
    other = bind_socket("127.0.0.1", 0)
    port = other.getsockname()[1]
    try:
        with pytest.raises(PortTaken):
            claim("127.0.0.1", port, "responses-ws@10.0.0.1:6379", bind_socket)
    finally:
        other.close()
