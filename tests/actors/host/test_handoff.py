"""The gateway–host link: messages with descriptors, in order, never lost under load."""

from __future__ import annotations

import asyncio
import socket

from actors.host.handoff import Ended, Handoff, Link, Outcome, SocketKind, StateGone
from tests.support.waiting import until


def test_many_concurrent_handoffs_all_arrive_with_their_descriptors_while_the_peer_is_slow():
    """The peer's queue holds ~10 messages: 300 senders at once must wait their turn, not
    lose a wake-up (one writer callback per descriptor in the event loop)."""

    async def main() -> None:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gateway, host = Link(a), Link(b)
        clients = [socket.socketpair() for _ in range(300)]
        senders = [
            asyncio.create_task(gateway.send(Handoff(f"s{i}", conn_id=f"c{i}"), mine.fileno()))
            for i, (mine, _) in enumerate(clients)
        ]
        # The host is busy: the queue fills, the senders after it wait.
        await until(lambda: senders[0].done(), 5, "the first handoff to be queued")
        assert not all(s.done() for s in senders), "the link's queue holds them all: nobody waits"
        got = []
        async with asyncio.timeout(10):
            async for message, sock in host.messages():
                assert isinstance(message, Handoff) and sock is not None
                sock.close()
                got.append(message.sock_id)
                if len(got) == len(clients):
                    break
            await asyncio.gather(*senders)
        assert sorted(got) == sorted(f"s{i}" for i in range(300))
        for mine, theirs in clients:
            mine.close()
            theirs.close()
        gateway.close()
        host.close()

    asyncio.run(main())


def test_notices_arrive_in_order_and_the_end_of_a_link_ends_its_messages():
    async def main() -> None:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gateway, host = Link(a), Link(b)
        for i in range(50):
            host.notify(Ended(f"s{i}", "closed"))
        host.notify(StateGone("c1"))
        got = []
        async with asyncio.timeout(10):
            async for message, _ in gateway.messages():
                got.append(message)
                if len(got) == 51:
                    host.close()  # the host process dies: the gateway's reader ends
            assert got == [*(Ended(f"s{i}", "closed") for i in range(50)), StateGone("c1")]
        gateway.close()

    asyncio.run(main())


def test_states_cross_the_link_as_enums_and_an_unknown_one_is_a_malformed_message():
    async def main() -> list:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gateway, host = Link(a), Link(b)
        mine, theirs = socket.socketpair()
        await gateway.send(Handoff("s1", SocketKind.HTTP), mine.fileno())
        for outcome in Outcome:
            host.notify(Ended("s1", outcome))
        b.send(b'{"msg": "ended", "sock_id": "s2", "outcome": "vanished"}')
        host.notify(StateGone("c1"))
        got = []
        async with asyncio.timeout(10):
            async for message, sock in host.messages():
                got.append(message)
                sock.close()
                break
            async for message, _ in gateway.messages():
                got.append(message)
                if isinstance(message, StateGone):
                    break
        for s in (mine, theirs):
            s.close()
        gateway.close()
        host.close()
        return got

    handoff, *ended, gone = asyncio.run(main())
    assert handoff.kind is SocketKind.HTTP
    assert [e.outcome for e in ended] == list(Outcome), "the unknown outcome was dropped"
    assert all(type(e.outcome) is Outcome for e in ended) and gone == StateGone("c1")
    assert [o for o in Outcome if o.keeps_slot] == [Outcome.PARKED, Outcome.MOVED]
