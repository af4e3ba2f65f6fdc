"""Where the CPU of a new connection goes, step by step, with the server's own code in this
process (no Ray, no network): the gateway's parse of the peeked head, the descriptor's
handover over a link, the host's WebSocket handshake, a session's set-up.

    python -m investigations.admission_steps [--connections 2000]

Prints µs of CPU per connection for each step as JSON (docs/scaling.md, "Where the CPU of a
new connection goes").  It measures the product's internals in-process, so it lives here,
beside the product, and not in the lab (``responses-ws bench admission`` measures admission
from a client).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def steps(n: int = 2000) -> dict[str, float]:
    """CPU per connection of each admission step, in this process with the server's own code
    (no Ray, no network): where the CPU of a new connection goes, step by step."""
    import base64
    import os
    import socket as socketlib

    from websockets.http11 import Request
    from websockets.server import ServerProtocol

    from actors.config import SessionConfig
    from actors.core.session import Session
    from actors.host.handoff import Handoff, Link, SocketKind
    from serve.auth import KeyRing
    from serve.front import is_responses_upgrade, request_headers, wants_append_mode

    def head(i: int) -> bytes:
        key = base64.b64encode(os.urandom(16)).decode()
        return (
            f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer sk-test-{i % 7}\r\nUser-Agent: OpenAI/Python 3.57.0\r\n\r\n"
        ).encode()

    heads = [head(i) for i in range(n)]
    keys = KeyRing(())

    def per_conn(fn) -> float:  # CPU µs per connection
        t0 = time.process_time()
        for h in heads:
            fn(h)
        return (time.process_time() - t0) * 1e6 / n

    out: dict[str, float] = {}
    out["gateway_parse_head_us"] = per_conn(
        lambda h: (
            is_responses_upgrade(h),
            wants_append_mode(h, request_headers(h)),
            keys.owner(request_headers(h)),
        )
    )

    async def handoffs() -> float:
        a, b = socketlib.socketpair(socketlib.AF_UNIX, socketlib.SOCK_SEQPACKET)
        gateway, host = Link(a), Link(b)
        pairs = [socketlib.socketpair() for _ in range(64)]
        t0 = time.process_time()
        received = 0
        for i in range(n):
            await gateway.send(
                Handoff(f"s{i}", SocketKind.WEBSOCKET, f"c{i}", "owner"), pairs[i % 64][0].fileno()
            )
            async for _, sock in host.messages():
                assert sock is not None  # each message carries its socket
                sock.close()
                received += 1
                break
        took = (time.process_time() - t0) * 1e6 / n
        for x, y in pairs:
            x.close()
            y.close()
        gateway.close()
        host.close()
        return took

    out["handoff_send_and_receive_us"] = asyncio.run(handoffs())

    def handshake(h: bytes) -> None:
        protocol = ServerProtocol()
        protocol.receive_data(h)
        request = protocol.events_received()[0]
        assert isinstance(request, Request)
        protocol.send_response(protocol.accept(request))
        protocol.data_to_send()

    out["host_websocket_handshake_us"] = per_conn(handshake)
    config = SessionConfig()
    out["host_session_setup_us"] = per_conn(
        lambda h: Session(config, ["emu-fast"], session_key="c", owner="o", clock=time.time)
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=2000, help="connections per step")
    args = parser.parse_args()
    print(json.dumps(steps(args.connections), indent=1))


if __name__ == "__main__":
    main()
