"""The gateway's admission and what it holds per connection (serve/admission.py), with a fake
pool behind the ``Slots`` seam and plain objects for sockets and links."""

from __future__ import annotations

import pytest

from actors.errors import TooManyConnections
from actors.host.handoff import Outcome
from serve.admission import Admission
from serve.pool import Host, Lease


class Pool:
    """The ``Slots`` seam: records what was given back."""

    def __init__(self) -> None:
        self.released: list[Lease] = []
        self.released_http: list[Host] = []

    def release(self, lease: Lease) -> None:
        self.released.append(lease)

    def release_http(self, host: Host) -> None:
        self.released_http.append(host)


class Sock:
    def __init__(self, name: str) -> None:
        self.name = name


def host(name: str = "a") -> Host:
    return Host(name, handle=f"link-{name}", started_at=0.0)


def admission(pool: Pool, *, total: int = 10, per_key: int = 10) -> Admission[Sock, str]:
    return Admission(pool, max_connections=total, max_connections_per_key=per_key, prefix="g")


def handed(adm: Admission[Sock, str], owner: str, *, on: Host, conn_id: str) -> tuple[str, Sock, Lease]:
    """A new WebSocket admitted, given a slot on ``on`` and handed over its link."""
    sock = Sock(conn_id)
    entry = adm.admit(owner, sock)
    entry.lease = Lease(on, conn_id)
    entry.link = on.handle
    return entry.sock_id, sock, entry.lease


def test_the_replica_limit_refuses_with_503_and_an_end_frees_the_count():
    adm = admission(Pool(), total=2)
    first = adm.admit("k1", Sock("1"))
    adm.admit("k2", Sock("2"))
    with pytest.raises(TooManyConnections) as refused:
        adm.admit("k3", Sock("3"))
    assert refused.value.status == 503
    assert adm.open_connections == 2
    adm.ended(first.sock_id, Outcome.CLOSED)
    adm.admit("k3", Sock("3"))
    assert adm.open_connections == 2


def test_the_per_key_limit_refuses_with_429_and_counts_each_key_apart():
    adm = admission(Pool(), per_key=2)
    first = adm.admit("k1", Sock("1"))
    adm.admit("k1", Sock("2"))
    with pytest.raises(TooManyConnections) as refused:
        adm.admit("k1", Sock("3"))
    assert refused.value.status == 429
    assert "(2)" in refused.value.message
    adm.admit("k2", Sock("4"))  # another key is not affected
    adm.ended(first.sock_id, Outcome.PARKED)  # a parked state holds a slot, not a socket
    adm.admit("k1", Sock("5"))


def test_a_refused_admission_counts_nothing():
    adm = admission(Pool(), total=10, per_key=1)
    adm.admit("k1", Sock("1"))
    for _ in range(3):
        with pytest.raises(TooManyConnections):
            adm.admit("k1", Sock("x"))
    assert adm.open_connections == 1


def test_a_failed_handoff_gives_back_its_count_and_its_slot():
    pool, h = Pool(), host()
    adm = admission(pool, per_key=1)
    sock_id, _, lease = handed(adm, "k1", on=h, conn_id="c1")
    adm.failed(sock_id)
    assert pool.released == [lease]
    assert adm.open_connections == 0
    adm.admit("k1", Sock("again"))  # the key's count went back too


def test_a_connection_that_got_no_slot_gives_back_only_its_count():
    pool = Pool()
    adm = admission(pool, per_key=1)
    entry = adm.admit("k1", Sock("1"))  # e.g. the pool raised NoCapacity, or a resume's host is unknown
    adm.failed(entry.sock_id)
    assert pool.released == [] and adm.open_connections == 0
    adm.admit("k1", Sock("2"))


def test_undoing_twice_or_ending_after_a_failure_releases_once():
    pool, h = Pool(), host()
    adm = admission(pool)
    sock_id, _, lease = handed(adm, "k1", on=h, conn_id="c1")
    adm.failed(sock_id)
    adm.failed(sock_id)
    assert adm.ended(sock_id, Outcome.CLOSED) is None
    assert pool.released == [lease]


def test_a_closed_or_refused_end_releases_the_slot_and_returns_the_copy_to_close():
    pool, h = Pool(), host()
    adm = admission(pool)
    a_id, a_sock, a_lease = handed(adm, "k1", on=h, conn_id="c1")
    b_id, b_sock, b_lease = handed(adm, "k1", on=h, conn_id="c2")
    assert adm.ended(a_id, Outcome.CLOSED) is a_sock
    assert adm.ended(b_id, Outcome.REFUSED) is b_sock
    assert pool.released == [a_lease, b_lease]
    assert adm.open_connections == 0


@pytest.mark.parametrize("outcome", [Outcome.PARKED, Outcome.MOVED])
def test_an_end_that_keeps_the_state_parks_its_slot_until_the_host_says_gone(outcome):
    pool, h = Pool(), host()
    adm = admission(pool)
    sock_id, sock, lease = handed(adm, "k1", on=h, conn_id="c1")
    assert adm.ended(sock_id, outcome) is sock  # the socket is done with: closed, counted off
    assert adm.open_connections == 0
    assert pool.released == []
    adm.gone("c1")
    assert pool.released == [lease]
    adm.gone("c1")  # a second notice frees nothing more
    assert pool.released == [lease]


def test_a_resumed_socket_holds_no_slot_so_its_end_releases_none():
    pool, h = Pool(), host()
    adm = admission(pool)
    entry = adm.admit("k1", Sock("r"))
    entry.link = h.handle  # a resume: the state's slot is the parked one
    adm.ended(entry.sock_id, Outcome.PARKED)
    adm.ended(entry.sock_id, Outcome.CLOSED)
    assert pool.released == []


def test_gone_for_an_unknown_state_does_nothing():
    pool = Pool()
    admission(pool).gone("nobody")
    assert pool.released == []


def test_http_connections_hold_the_hosts_http_count_until_their_end_or_failure():
    pool, a, b = Pool(), host("a"), host("b")
    adm = admission(pool, total=1)
    first, second = adm.http_opened(a), adm.http_opened(b)
    assert first != second and first.startswith("g-h")
    adm.admit("k1", Sock("ws"))  # HTTP connections are not WebSockets: no limit, no count
    assert adm.open_connections == 1
    assert adm.ended(first, Outcome.CLOSED) is None
    adm.failed(second)
    adm.ended(first, Outcome.CLOSED)
    assert pool.released_http == [a, b]
    assert pool.released == []


def test_socket_ids_are_unique_across_kinds():
    adm = admission(Pool())
    ids = {adm.admit("k", Sock(str(i))).sock_id for i in range(3)} | {
        adm.http_opened(host()) for _ in range(3)
    }
    assert len(ids) == 6


def test_a_host_death_closes_only_its_sockets_and_forgets_only_its_parked_states_and_http():
    pool, dead, alive = Pool(), host("dead"), host("alive")
    adm = admission(pool, per_key=3)
    _, d_sock, d_lease = handed(adm, "k1", on=dead, conn_id="d1")
    parked_id, _, _ = handed(adm, "k1", on=dead, conn_id="d2")
    a_id, a_sock, a_lease = handed(adm, "k1", on=alive, conn_id="a1")
    kept_id, _, kept_lease = handed(adm, "k2", on=alive, conn_id="a2")
    adm.ended(parked_id, Outcome.PARKED)
    adm.ended(kept_id, Outcome.PARKED)
    dead_http, alive_http = adm.http_opened(dead), adm.http_opened(alive)
    pending = adm.admit("k1", Sock("no link yet"))  # still waiting for a slot: not the host's

    assert adm.host_died(dead.handle, dead) == [d_sock]  # to close with 1011
    assert pool.released == [d_lease]  # its live socket ended; its parked state is forgotten
    assert adm.open_connections == 2
    adm.gone("d2")  # the host cannot say so any more; nothing to release if it did
    adm.ended(dead_http, Outcome.CLOSED)
    assert pool.released == [d_lease] and pool.released_http == []

    adm.gone("a2")
    adm.ended(alive_http, Outcome.CLOSED)
    assert pool.released == [d_lease, kept_lease] and pool.released_http == [alive]
    assert adm.ended(a_id, Outcome.CLOSED) is a_sock
    assert pool.released == [d_lease, kept_lease, a_lease]
    adm.failed(pending.sock_id)
    assert adm.open_connections == 0
    adm.admit("k1", Sock("x"))  # k1's count came back: 3 allowed again
    adm.admit("k1", Sock("y"))
    adm.admit("k1", Sock("z"))


def test_the_death_of_another_gateways_host_closes_the_sockets_resumed_on_it():
    pool, ours = Pool(), host("ours")
    adm = admission(pool)
    entry = adm.admit("k1", Sock("resumed"))
    entry.link = "foreign-link"
    mine_id, _, _ = handed(adm, "k1", on=ours, conn_id="c1")
    adm.ended(mine_id, Outcome.PARKED)
    assert adm.host_died("foreign-link", None) == [entry.sock]
    assert pool.released == []  # a resumed socket holds no slot here; our parked state stays
    adm.gone("c1")
    assert len(pool.released) == 1
