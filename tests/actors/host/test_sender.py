"""The deflate policy a WebSocket's upgrade negotiates with (actors.host.sender)."""

from __future__ import annotations

import socket

from actors.config import SessionConfig
from actors.host.sender import accepts_deflate, deflate_extensions


def test_auto_refuses_deflate_from_the_loopback_and_always_or_never_decide_alone():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            assert accepts_deflate("auto", server) is False, "a loopback peer: sent as they are"
            assert accepts_deflate("always", server) is True
            assert accepts_deflate("never", server) is False
            assert deflate_extensions(SessionConfig(deflate="auto"), server) == []
            [factory] = deflate_extensions(SessionConfig(deflate="always"), server)
            assert factory.name == "permessage-deflate"
    a, b = socket.socketpair()  # not an IP socket: no peer address to judge by
    with a, b:
        assert accepts_deflate("auto", a) is True
