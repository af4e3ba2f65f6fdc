"""The response store contract (docs/protocol.md §4.9, §6), run against SQLite and a real Redis alike.

Every test of the contract is parametrized over both backends through ``open_store``; the
SQLite-only tests pin what the embedded file promises (WAL, many processes writing it), the
``StoreWriter`` tests its two paths in front of either: records (with their line) and usage
ledger lines written through, batched and idempotent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from redis.crc import key_slot

from store import (
    ReadUnavailable,
    ReplicationStatus,
    Store,
    StoreConfig,
    StoredResponse,
    UsageEntry,
    WriteUnavailable,
    open_store,
    replication_status,
)
from store.journal import Journal
from store.redis import RedisStore
from store.sqlite import SQLiteStore
from store.writer import StoreWriter, WriterClosed
from tests.support.waiting import turns, until

ROOT = Path(__file__).resolve().parents[2]
ALICE, BOB = "key_alice", "key_bob"
TRICKY_TEXT = 'héllo 世界 🚀 «quotes» "escaped" \\ back\nslash \u0000 nul \ud800 lone surrogate'


SERVER = pytest.mark.integration  # a backend whose tests start a redis-server or a Redis Cluster


@pytest.fixture(
    params=["sqlite", pytest.param("redis", marks=SERVER), pytest.param("redis-cluster", marks=SERVER)]
)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> StoreConfig:
    """A config for an empty store of each backend (Redis: a fresh key prefix per test; the
    Redis Cluster with its default: each write waits for a replica)."""
    if request.param == "sqlite":
        return StoreConfig(backend="sqlite", data_dir=str(tmp_path / "data"))
    prefix = f"test-{uuid.uuid4().hex}:"
    if request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster").url
        return StoreConfig(backend="redis", redis_url=url, redis_cluster=True, key_prefix=prefix)
    url = request.getfixturevalue("redis_server")
    return StoreConfig(backend="redis", redis_url=url, key_prefix=prefix)


@asynccontextmanager
async def opened(config: StoreConfig) -> AsyncIterator[Store]:
    store = open_store(config)
    try:
        yield store
    finally:
        await store.close()


def record(response_id: str = "resp_1", owner: str = ALICE, text: str = TRICKY_TEXT) -> StoredResponse:
    """A realistic record: a message and a tool call, nested usage, unicode, nulls, floats."""
    message = {
        "id": f"msg_{response_id}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }
    call = {
        "id": f"fc_{response_id}",
        "type": "function_call",
        "call_id": f"call_{response_id}",
        "name": "get_weather",
        "arguments": '{"city": "Zürich", "units": ["c", null]}',
        "status": "completed",
    }
    user = {
        "id": f"msg_in_{response_id}",
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }
    response = {
        "id": response_id,
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": "emu-fast",
        "output": [message, call],
        "previous_response_id": None,
        "temperature": 0.7,
        "top_p": 1.0,
        "parallel_tool_calls": True,
        "store": True,
        "metadata": {"tag": "ünïcødé", "nested": {"deep": [1, 2.5, {"x": None}], "big": 2**53}},
        "usage": {
            "input_tokens": 12,
            "input_tokens_details": {"cached_tokens": 4},
            "output_tokens": 34,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 46,
        },
    }
    return StoredResponse(
        id=response_id,
        owner=owner,
        created_at=1_700_000_000.123456,
        response=response,
        input_items=[user],
        context=[user, message, call],
    )


def usage_entry(response_id: str, owner: str = ALICE, output_tokens: int = 1) -> UsageEntry:
    return UsageEntry(
        response_id=response_id,
        owner=owner,
        model="emu-fast",
        transport="websocket",
        input_tokens=10,
        cached_tokens=2,
        output_tokens=output_tokens,
        created_at=1.5,
    )


# --- the store contract, both backends -------------------------------------------------------


def test_open_store_builds_the_configured_backend(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            assert isinstance(store, SQLiteStore if config.backend == "sqlite" else RedisStore)

    asyncio.run(scenario())


def test_a_record_reads_back_exactly_as_put(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            await store.put(record("resp_1"))
            assert await store.get("resp_1", ALICE) == record("resp_1")

    asyncio.run(scenario())


def test_items_are_found_by_id_for_their_owner_only(config: StoreConfig) -> None:
    """What an ``item_reference`` may name: a stored response's input and output items, as its
    conversation holds them, for the owner only; a later response resending an item does not
    take it over, and a deleted response's items are gone."""

    async def scenario() -> None:
        async with opened(config) as store:
            first = record("resp_1")
            await store.put(first)
            later = record("resp_2")
            resent = {**first.context[1], "status": "incomplete"}  # the same id, resent as input
            await store.put(
                dataclasses.replace(later, input_items=[resent], context=[resent, *later.context])
            )
            wanted = ["msg_resp_1", "fc_resp_1", "msg_in_resp_1", "msg_nope", "msg_resp_1"]
            found = await store.find_items(wanted, ALICE)
            assert found == {
                "msg_resp_1": first.context[1],
                "fc_resp_1": first.context[2],
                "msg_in_resp_1": first.context[0],
            }
            assert await store.find_items(wanted, BOB) == {}
            assert await store.find_items([], ALICE) == {}
            await store.delete("resp_1", ALICE)
            assert await store.find_items(["msg_resp_1"], ALICE) == {}
            assert await store.find_items(["msg_resp_2"], ALICE) == {"msg_resp_2": later.context[1]}

    asyncio.run(scenario())


def test_a_missing_id_reads_as_none_and_deletes_as_false(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            assert await store.get("resp_missing", ALICE) is None
            assert await store.delete("resp_missing", ALICE) is False

    asyncio.run(scenario())


def test_another_owner_sees_a_record_as_missing(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            await store.put(record("resp_1", owner=ALICE))
            assert await store.get("resp_1", BOB) is None

    asyncio.run(scenario())


def test_another_owner_cannot_delete_a_record(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            await store.put(record("resp_1", owner=ALICE))
            assert await store.delete("resp_1", BOB) is False
            assert await store.get("resp_1", ALICE) == record("resp_1", owner=ALICE)

    asyncio.run(scenario())


def test_a_deleted_record_is_gone(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            await store.put(record("resp_1"))
            assert await store.delete("resp_1", ALICE) is True
            assert await store.get("resp_1", ALICE) is None
            assert await store.delete("resp_1", ALICE) is False

    asyncio.run(scenario())


def test_putting_an_id_again_replaces_the_record(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            await store.put(record("resp_1", text="first"))
            await store.put(record("resp_1", text="second"))
            assert await store.get("resp_1", ALICE) == record("resp_1", text="second")

    asyncio.run(scenario())


def test_records_and_usage_outlive_the_store_instance(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            await store.put(record("resp_1"))
            await store.add_usage([usage_entry("resp_1")])
        async with opened(config) as reopened:
            assert await reopened.get("resp_1", ALICE) == record("resp_1")
            assert await reopened.usage(ALICE) == [usage_entry("resp_1")]

    asyncio.run(scenario())


def test_the_usage_ledger_is_per_owner_oldest_first(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            for i in range(5):
                await store.add_usage([usage_entry(f"resp_a{i}", ALICE, output_tokens=i)])
                await store.add_usage([usage_entry(f"resp_b{i}", BOB, output_tokens=100 + i)])
            assert await store.usage(ALICE) == [usage_entry(f"resp_a{i}", ALICE, i) for i in range(5)]
            assert await store.usage(BOB) == [usage_entry(f"resp_b{i}", BOB, 100 + i) for i in range(5)]
            assert await store.usage("key_nobody") == []

    asyncio.run(scenario())


def test_a_ledger_line_is_written_once_per_response_however_often_it_is_added(config: StoreConfig) -> None:
    """A retry, a flush on shutdown or a batch that repeats a line cannot bill twice."""

    async def scenario() -> None:
        async with opened(config) as store:
            await store.add_usage([usage_entry("resp_1")])
            await store.add_usage([usage_entry("resp_1")])
            await store.add_usage(
                [usage_entry("resp_2"), usage_entry("resp_1", output_tokens=9), usage_entry("resp_2")]
            )
            await store.put(record("resp_2"), usage_entry("resp_2", output_tokens=9))
            assert await store.usage(ALICE) == [usage_entry("resp_1"), usage_entry("resp_2")]

    asyncio.run(scenario())


def test_a_record_is_put_with_its_ledger_line_and_a_re_put_adds_none(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            await store.put(record("resp_1"), usage_entry("resp_1"))
            await store.put(record("resp_1", text="again"), usage_entry("resp_1"))
            await store.put(record("resp_2"))
        async with opened(config) as reopened:
            assert await reopened.get("resp_1", ALICE) == record("resp_1", text="again")
            assert await reopened.usage(ALICE) == [usage_entry("resp_1")]

    asyncio.run(scenario())


def test_two_store_instances_writing_at_once_lose_nothing(config: StoreConfig) -> None:
    """Two instances (for SQLite: two connections, each on its own thread) on one backing."""
    n = 200

    async def write(store: Store, first: int) -> None:
        await asyncio.gather(*(store.put(record(f"resp_{i}", text=f"r{i}")) for i in range(first, n, 2)))
        await asyncio.gather(*(store.add_usage([usage_entry(f"resp_{i}")]) for i in range(first, n, 2)))

    async def scenario() -> None:
        async with opened(config) as one, opened(config) as two:
            await asyncio.gather(write(one, 0), write(two, 1))
            for i in range(n):
                assert await one.get(f"resp_{i}", ALICE) == record(f"resp_{i}", text=f"r{i}")
            assert sorted(e.response_id for e in await two.usage(ALICE)) == sorted(
                f"resp_{i}" for i in range(n)
            )

    asyncio.run(scenario())


# --- SQLite: the embedded file ----------------------------------------------------------------

WRITER_PROCESS = """
import asyncio, sys
from store import StoredResponse, UsageEntry
from store.sqlite import SQLiteStore

async def main(data_dir, worker, n):
    store = SQLiteStore(data_dir)
    for i in range(n):
        rid = f"resp_{worker}_{i}"
        await store.put(StoredResponse(rid, "key_alice", float(i), {"id": rid}, [], []))
        await store.add_usage([UsageEntry(rid, "key_alice", "m", "http", 1, 0, 1, float(i))])
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def test_sqlite_lives_in_one_wal_file_in_a_created_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "not" / "yet" / "there"

    async def scenario() -> None:
        store = SQLiteStore(data_dir)
        await store.put(record("resp_1"))
        await store.close()

    asyncio.run(scenario())
    with sqlite3.connect(data_dir / "responses.sqlite3") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT id, owner FROM responses").fetchall() == [("resp_1", ALICE)]


def test_sqlite_writes_a_record_and_its_line_in_one_transaction(tmp_path: Path) -> None:
    """A line that cannot be inserted takes its record with it: none without the other."""

    async def scenario() -> None:
        store = SQLiteStore(tmp_path)
        broken = UsageEntry("resp_1", ALICE, None, "websocket", 1, 0, 1, 1.5)  # type: ignore[arg-type]  # NOT NULL
        with pytest.raises(sqlite3.IntegrityError):
            await store.put(record("resp_1"), broken)
        assert await store.get("resp_1", ALICE) is None and await store.usage(ALICE) == []
        await store.put(record("resp_1"), usage_entry("resp_1"))  # the connection is usable
        assert await store.usage(ALICE) == [usage_entry("resp_1")]
        await store.close()

    asyncio.run(scenario())


def test_sqlite_writers_in_separate_processes_lose_nothing(tmp_path: Path) -> None:
    """The deployment's shape: one process per connection actor, plus the gateway."""
    workers, n = 3, 200
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER_PROCESS, str(tmp_path), str(w), str(n)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
        )
        for w in range(workers)
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr.decode()

    async def scenario() -> None:
        store = SQLiteStore(tmp_path)
        for w in range(workers):
            for i in range(n):
                assert await store.get(f"resp_{w}_{i}", ALICE) is not None
        ledger = await store.usage(ALICE)
        await store.close()
        assert len(ledger) == workers * n
        for w in range(workers):  # each process's own lines stay in its order
            mine = [e.response_id for e in ledger if e.response_id.startswith(f"resp_{w}_")]
            assert mine == [f"resp_{w}_{i}" for i in range(n)]

    asyncio.run(scenario())


def test_a_writable_store_passes_the_readiness_probe_again_and_again(config: StoreConfig) -> None:
    async def scenario() -> None:
        async with opened(config) as store:
            await store.probe()
            await store.probe()  # overwrites its one record
            assert await store.get("health", ALICE) is None  # not a response

    asyncio.run(scenario())


def test_the_probe_of_a_read_only_sqlite_database_fails(tmp_path: Path) -> None:
    """As a read-only data directory would (file permissions do not stop root, so the test
    makes the connection read-only instead)."""

    async def scenario() -> None:
        store = SQLiteStore(tmp_path)
        await store.probe()
        await store._call(lambda c: c.execute("PRAGMA query_only = 1"))
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await store.probe()
        await store.close()

    asyncio.run(scenario())


def test_a_closed_sqlite_store_refuses_calls(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SQLiteStore(tmp_path)
        await store.close()
        await store.close()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):
            await store.get("resp_1", ALICE)

    asyncio.run(scenario())


# --- StoreWriter: records written through, the ledger written behind ---------------------------


class Interposed:
    """A real store whose ``put`` first runs ``before_put`` (to hold a write back, or fail it);
    ``calls`` names the store's methods called so far, in order."""

    def __init__(self, inner: Store, before_put: Callable[[StoredResponse], Awaitable[None]]) -> None:
        self.inner = inner
        self.before_put = before_put
        self.calls: list[str] = []

    async def put(self, record: StoredResponse, usage: UsageEntry | None = None) -> None:
        self.calls.append("put")
        await self.before_put(record)
        await self.inner.put(record, usage)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def called(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return called


def held_back(inner: Store) -> tuple[Interposed, asyncio.Event]:
    """The store, and the gate every put waits for (``calls`` has ``"put"`` once one waits)."""
    gate = asyncio.Event()

    async def wait_for_gate(_: StoredResponse) -> None:
        await gate.wait()

    return Interposed(inner, wait_for_gate), gate


def test_a_put_is_in_the_store_when_it_returns(config: StoreConfig) -> None:
    async def scenario() -> None:
        store, gate = held_back(open_store(config))
        writer = StoreWriter(store)
        putting = asyncio.create_task(writer.put(record("resp_1")))
        await until(lambda: "put" in store.calls, 5, "the put at the store's gate")
        await turns()
        assert not putting.done(), "the caller waits for the write"
        gate.set()
        await putting
        async with opened(config) as other_process:  # another store instance sees it at once
            assert await other_process.get("resp_1", ALICE) == record("resp_1")
        await writer.close()

    asyncio.run(scenario())


def test_a_failed_put_is_logged_and_raised_to_the_caller(
    config: StoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    async def fail_resp_bad(rec: StoredResponse) -> None:
        if rec.id == "resp_bad":
            raise ConnectionError("store unreachable")

    failures: list[None] = []

    async def scenario() -> None:
        writer = StoreWriter(
            Interposed(open_store(config), fail_resp_bad), on_failure=lambda: failures.append(None)
        )
        with pytest.raises(ConnectionError):
            await writer.put(record("resp_bad"))
        await writer.put(record("resp_good"))
        assert await writer.get("resp_bad", ALICE) is None
        assert await writer.get("resp_good", ALICE) == record("resp_good")
        await writer.close()

    with caplog.at_level(logging.ERROR, logger="store.writer"):
        asyncio.run(scenario())
    [failure] = caplog.records
    assert "put resp_bad" in failure.getMessage()
    assert failure.exc_info is not None and failure.exc_info[0] is ConnectionError
    assert len(failures) == 1  # the failure metric's hook, once per failed write


def test_a_put_outlives_its_cancelled_caller_and_reads_and_deletes_wait_for_it(config: StoreConfig) -> None:
    async def scenario() -> None:
        store, gate = held_back(open_store(config))
        writer = StoreWriter(store)
        putting = asyncio.create_task(writer.put(record("resp_1")))
        await until(lambda: "put" in store.calls, 5, "the put at the store's gate")
        putting.cancel()  # e.g. the client went away: the record is still written
        reading = asyncio.create_task(writer.get("resp_1", ALICE))
        deleting = asyncio.create_task(writer.delete("resp_1", ALICE))
        await turns()
        assert store.calls == ["put"], "else the put would bring the record back"
        assert not reading.done() and not deleting.done()
        gate.set()
        assert await reading == record("resp_1")
        assert await deleting is True
        assert await writer.get("resp_1", ALICE) is None
        await writer.close()

    asyncio.run(scenario())


def test_puts_of_one_id_land_in_call_order(config: StoreConfig) -> None:
    async def scenario() -> None:
        store, gate = held_back(open_store(config))
        writer = StoreWriter(store)
        first = asyncio.create_task(writer.put(record("resp_1", text="first")))
        second = asyncio.create_task(writer.put(record("resp_1", text="second")))
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(first, second)
        assert await writer.get("resp_1", ALICE) == record("resp_1", text="second")
        await writer.close()

    asyncio.run(scenario())


class Counted(Interposed):
    """A real store that records each ``add_usage`` call's response ids; its commits wait
    for ``gate``, and ``lose_answer`` lists ids whose first commit lands but then raises
    (an answer lost on the way back)."""

    def __init__(self, inner: Store, lose_answer: frozenset[str] = frozenset()) -> None:
        super().__init__(inner, lambda _: asyncio.sleep(0))
        self.gate = asyncio.Event()
        self.gate.set()
        self.commits: list[list[str]] = []
        self.lose_answer = set(lose_answer)

    async def add_usage(self, entries) -> None:
        self.commits.append([e.response_id for e in entries])
        await self.gate.wait()
        await self.inner.add_usage(entries)
        lost = self.lose_answer & {e.response_id for e in entries}
        if lost:
            self.lose_answer -= lost
            raise ConnectionError("connection reset after the write")


def test_a_billed_line_is_committed_when_bill_returns_and_lines_waiting_at_once_share_a_commit(
    config: StoreConfig,
) -> None:
    async def scenario() -> None:
        store = Counted(open_store(config))
        store.gate.clear()
        writer = StoreWriter(store)
        first = asyncio.create_task(writer.bill(usage_entry("resp_1", output_tokens=1)))
        await until(lambda: store.commits, 5, "the first commit at the store's gate")
        await turns()
        assert store.commits == [["resp_1"]] and not first.done(), "the caller waits for the commit"
        rest = [asyncio.create_task(writer.bill(usage_entry(f"resp_{i}", output_tokens=i))) for i in (2, 3)]
        await turns()
        assert writer.pending == 3 and store.commits == [["resp_1"]], "the others wait for the first"
        store.gate.set()
        await asyncio.gather(first, *rest)
        assert store.commits == [["resp_1"], ["resp_2", "resp_3"]], "one commit for the lines that waited"
        async with opened(config) as other_process:
            first_line, *batch = await other_process.usage(ALICE)
        assert first_line == usage_entry("resp_1", output_tokens=1)
        # one batch's lines are in commit order; on a cluster its slots commit concurrently
        assert sorted(batch, key=lambda e: e.response_id) == [
            usage_entry(f"resp_{i}", output_tokens=i) for i in (2, 3)
        ]
        assert writer.pending == 0
        await writer.close()

    asyncio.run(scenario())


def test_journaled_lines_linger_to_share_a_commit_and_an_awaited_line_or_a_flush_cuts_it_short(
    config: StoreConfig, tmp_path
) -> None:
    """Lines journaled one turn after another wait (up to the linger) for each other's commit;
    a line whose terminal event waits on its commit takes the lingering ones with it at once,
    and a flush commits what waits without lingering."""

    async def scenario() -> None:
        store = Counted(open_store(config))
        writer = StoreWriter(store, journal=Journal(tmp_path / "j", "host"), linger_s=30.0)
        writer.bill_behind(usage_entry("resp_1", output_tokens=1))
        await turns()
        writer.bill_behind(usage_entry("resp_2", output_tokens=2))
        await turns()
        assert store.commits == [], "lingering (the lines are journaled)"
        await asyncio.wait_for(writer.bill(usage_entry("resp_3", output_tokens=3)), 5)
        assert store.commits == [["resp_1", "resp_2", "resp_3"]]
        writer.bill_behind(usage_entry("resp_4", output_tokens=4))
        await asyncio.wait_for(writer.flush(), 5)
        assert store.commits[-1] == ["resp_4"]
        await writer.close()

    asyncio.run(scenario())


def test_many_flushes_at_once_each_return_once_every_line_before_them_is_committed(
    config: StoreConfig,
) -> None:
    """Sockets closing together each flush the host's writer: every flush returns only once
    every line submitted before it is committed, in one commit of them all."""

    async def scenario() -> None:
        store = Counted(open_store(config))
        writer = StoreWriter(store)
        store.gate.clear()
        writer.bill_behind(usage_entry("resp_1", output_tokens=1))
        await until(lambda: store.commits, 5, "the first line's commit at the store's gate")
        for i in (2, 3):
            writer.bill_behind(usage_entry(f"resp_{i}", output_tokens=i))
        flushes = [asyncio.create_task(writer.flush()) for _ in range(50)]
        await turns()
        assert not any(f.done() for f in flushes), "the lines are not committed yet"
        store.gate.set()
        await asyncio.wait_for(asyncio.gather(*flushes), 5)
        assert writer.pending == 0
        assert store.commits == [["resp_1"], ["resp_2", "resp_3"]]
        assert sorted(e.response_id for e in await writer.usage(ALICE)) == ["resp_1", "resp_2", "resp_3"]
        await writer.close()

    asyncio.run(scenario())


def test_a_retried_write_whose_first_answer_was_lost_bills_once(config: StoreConfig) -> None:
    """The commit landed but its answer did not: the retry changes nothing, the caller succeeds."""

    async def scenario() -> None:
        store = Counted(open_store(config), lose_answer=frozenset({"resp_1"}))
        writer = StoreWriter(store)
        await writer.bill(usage_entry("resp_1"))
        await writer.bill(usage_entry("resp_1"))  # billed again (e.g. a flush on shutdown)
        assert store.commits == [["resp_1"], ["resp_1"], ["resp_1"]]
        assert await writer.usage(ALICE) == [usage_entry("resp_1")]
        await writer.close()

    asyncio.run(scenario())


def test_closing_the_writer_loses_no_write(config: StoreConfig) -> None:
    n = 500

    async def scenario() -> None:
        store, gate = held_back(open_store(config))
        writer = StoreWriter(store)
        puts = [
            asyncio.create_task(writer.put(record(f"resp_{i}", text=f"r{i}"), usage_entry(f"resp_{i}")))
            for i in range(n)
        ]
        bills = [asyncio.create_task(writer.bill(usage_entry(f"resp_x{i}"))) for i in range(n)]
        await asyncio.sleep(0)
        for task in puts + bills:
            task.cancel()  # the callers gave up; the writes did not
        gate.set()
        await writer.close()
        async with opened(config) as reopened:
            for i in range(n):
                assert await reopened.get(f"resp_{i}", ALICE) == record(f"resp_{i}", text=f"r{i}")
            billed = sorted(e.response_id for e in await reopened.usage(ALICE))
            assert billed == sorted([f"resp_{i}" for i in range(n)] + [f"resp_x{i}" for i in range(n)])

    asyncio.run(scenario())


def test_a_line_that_cannot_be_committed_is_logged_and_raised_and_later_lines_land(
    config: StoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    class FailingLedger(Interposed):
        async def add_usage(self, entries) -> None:
            if any(e.response_id == "resp_bad" for e in entries):
                raise ConnectionError("store unreachable")
            await self.inner.add_usage(entries)

    failures: list[None] = []

    async def scenario() -> None:
        writer = StoreWriter(
            FailingLedger(open_store(config), lambda _: asyncio.sleep(0)),
            on_failure=lambda: failures.append(None),
        )
        with pytest.raises(ConnectionError):
            await writer.bill(usage_entry("resp_bad"))
        await writer.bill(usage_entry("resp_good"))
        assert await writer.usage(ALICE) == [usage_entry("resp_good")]
        await writer.close()

    with caplog.at_level(logging.ERROR, logger="store.writer"):
        asyncio.run(scenario())
    [failure] = caplog.records
    assert "usage of resp_bad" in failure.getMessage()
    assert failure.exc_info is not None and failure.exc_info[0] is ConnectionError
    assert len(failures) == 1


def test_the_writer_refuses_writes_after_close(config: StoreConfig) -> None:
    async def scenario() -> None:
        writer = StoreWriter(open_store(config))
        await writer.close()
        await writer.close()  # idempotent
        with pytest.raises(WriterClosed):
            await writer.bill(usage_entry("resp_1"))
        with pytest.raises(WriterClosed):
            await writer.put(record("resp_1"))

    asyncio.run(scenario())


# --- Redis: waiting for replicas ------------------------------------------------------------


class Observed:
    """A :class:`store.ReplicationObserver` that keeps what it is told."""

    def __init__(self) -> None:
        self.changes: list[ReplicationStatus] = []
        self.degraded_writes = 0

    def changed(self, status: ReplicationStatus) -> None:
        self.changes.append(status)

    def degraded_write(self) -> None:
        self.degraded_writes += 1


def test_a_server_without_the_replicas_wanted_takes_writes_unreplicated_and_says_so(
    redis_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``store.wait_replicas: 1`` on a server without replicas, the default policy
    (``available``): every write is taken at once (no ``WAIT`` for a replica it does not
    have), counted as degraded, and the shard's state is logged once."""
    config = StoreConfig(
        backend="redis",
        redis_url=redis_server,
        key_prefix=f"test-{uuid.uuid4().hex}:",
        wait_replicas=1,
        wait_timeout_ms=5000,
    )
    observed = Observed()

    async def scenario() -> None:
        store = open_store(config, observer=observed)
        try:
            await store.put(record("resp_1"), usage_entry("resp_1"))
            await store.add_usage([usage_entry("resp_2")])
            await store.put(record("resp_3"), usage_entry("resp_3"))
            assert await store.get("resp_1", ALICE) == record("resp_1")
            assert [e.response_id for e in await store.usage(ALICE)] == ["resp_1", "resp_2", "resp_3"]
            assert isinstance(store, RedisStore)
            assert store.replication_status().as_dict()["shards"] == [
                {"primary": "", "replicas": 0, "wanted": 1, "reachable": True, "degraded": True}
            ]
        finally:
            await store.close()
        assert (await replication_status(config)).degraded

    with caplog.at_level(logging.WARNING, logger="store.replication"):
        asyncio.run(scenario())
    assert observed.degraded_writes == 3
    [change] = observed.changes
    assert change.degraded
    [line] = [r.getMessage() for r in caplog.records]  # once, not once per write
    assert "has 0 of 1 replicas online" in line and "available" in line


def test_the_strict_policy_refuses_a_write_to_a_shard_short_of_replicas_before_writing(
    redis_server: str,
) -> None:
    """``store.wait_replicas_policy: strict`` (what Redis's ``min-replicas-to-write`` does):
    the write is refused with the retryable :class:`store.WriteUnavailable` and nothing of
    it is written; the writer retries it for ``write_retry_s``, then raises it."""
    config = StoreConfig(
        backend="redis",
        redis_url=redis_server,
        key_prefix=f"test-{uuid.uuid4().hex}:",
        wait_replicas=1,
        wait_replicas_policy="strict",
    )

    async def scenario() -> None:
        async with opened(config) as store:
            with pytest.raises(WriteUnavailable, match=r"0 of 1 replicas.*strict"):
                await store.put(record("resp_1"), usage_entry("resp_1"))
            with pytest.raises(WriteUnavailable):
                await store.add_usage([usage_entry("resp_2")])
            assert await store.get("resp_1", ALICE) is None
            assert await store.usage(ALICE) == []
        writer = StoreWriter(open_store(config), retry_s=0.3)
        with pytest.raises(WriteUnavailable):
            await writer.put(record("resp_3"), usage_entry("resp_3"))
        with pytest.raises(WriteUnavailable):
            await writer.bill(usage_entry("resp_4"))
        assert await writer.usage(ALICE) == []
        await writer.close()

    asyncio.run(scenario())


def test_a_store_that_cannot_answer_raises_retryable_unavailable_errors_not_not_found() -> None:
    """A Redis store nobody listens at: every read raises :class:`store.ReadUnavailable` and a
    delete :class:`store.WriteUnavailable` (retryable, answered 503 ``store_unavailable`` over
    HTTP), never ``None``/``False`` (not found) or the client's own exception."""
    with socket.socket() as unused:  # bound, never listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        config = StoreConfig(backend="redis", redis_url=f"redis://127.0.0.1:{unused.getsockname()[1]}/0")

        async def scenario() -> None:
            async with opened(config) as store:
                with pytest.raises(ReadUnavailable, match="cannot answer the read now"):
                    await store.get("resp_1", ALICE)
                with pytest.raises(ReadUnavailable):
                    await store.find_items(["msg_1"], ALICE)
                with pytest.raises(ReadUnavailable):
                    await store.usage(ALICE)
                with pytest.raises(WriteUnavailable):
                    await store.delete("resp_1", ALICE)

        asyncio.run(scenario())


def test_the_replicas_waited_for_default_to_one_on_a_cluster_and_none_on_one_server() -> None:
    assert StoreConfig(backend="redis").replicas_to_wait == 0
    assert StoreConfig(backend="redis", redis_cluster=True).replicas_to_wait == 1
    assert StoreConfig(backend="redis", redis_cluster=True, wait_replicas=2).replicas_to_wait == 2
    with pytest.raises(ValueError, match="hash tags"):
        StoreConfig(key_prefix="rws{x}:")


def test_a_cluster_keeps_an_owners_ledger_in_shards_merged_oldest_first(redis_cluster) -> None:
    """The ledger of one owner spread over its ``ledger_shards`` lists (hash slots), read back
    as one ledger in commit order; a record sits in its line's slot."""
    config = StoreConfig(
        backend="redis",
        redis_url=redis_cluster.url,
        redis_cluster=True,
        key_prefix=f"test-{uuid.uuid4().hex}:",
    )

    async def scenario() -> None:
        async with opened(config) as store:
            assert isinstance(store, RedisStore)
            for i in range(40):
                await store.add_usage([usage_entry(f"resp_{i}", output_tokens=i)])
            assert await store.usage(ALICE) == [usage_entry(f"resp_{i}", output_tokens=i) for i in range(40)]
            used = {store.layout.ledger(ALICE, f"resp_{i}")[0] for i in range(40)}
            assert len(used) > 8, "the lines are spread over the shards"
            slots = {key_slot(k.encode()) for k in used}
            assert len(slots) == len(used)
            assert key_slot(store.layout.record("resp_1", ALICE).encode()) == key_slot(
                store.layout.ledger(ALICE, "resp_1")[0].encode()
            )

    asyncio.run(scenario())
