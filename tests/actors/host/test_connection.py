"""The asyncio driver's safety net: a bug a client frame hits becomes ``server_error`` on
that socket, which stays usable."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from actors.backend.canned import CannedCall, CannedClient
from actors.config import SessionConfig
from actors.core.inputs import ClientFrame
from actors.core.session import Session
from actors.core.turn import RENDER_SITE, RenderSite
from actors.host.connection import Connection
from actors.host.connection_lifecycle import State
from actors.host.render_pool import RenderPool
from actors.protocol import TERMINAL_EVENT_TYPES, ServerEvent
from inference.types import Done, InferenceEvent, InferenceRequest, Prefilled, TextDelta
from store import StoreConfig, StoredResponse, UsageEntry, open_store
from store.journal import Journal, replay
from store.journal import read as read_journal
from store.writer import StoreWriter
from tests.support.waiting import until

MODEL = "emu-fast"
HOLD = "test.hold"  # metadata: the model call waits for ``ScriptedInference.release`` mid-answer
CRASH = "test.crash"  # metadata: the model call fails mid-answer


class BuggySession(Session):
    """A session whose frame handler has a bug for one input."""

    def handle(self, event):
        if isinstance(event, ClientFrame) and event.data == "trigger":
            raise KeyError("internal detail /srv/secret.py")
        return super().handle(event)


def test_an_unexpected_exception_becomes_server_error_without_its_text(tmp_path):
    async def main():
        session = BuggySession(SessionConfig(), [MODEL], session_key="s", clock=lambda: 0.0)
        store = StoreWriter(open_store(StoreConfig(data_dir=str(tmp_path))))
        conn = Connection(session, ScriptedInference(), store)
        conn.feed("trigger")
        conn.feed("not json")  # the connection still answers the next frame
        events = [json.loads(e.model_dump_json()) for e in (await anext(conn.events()))]
        await conn.close()
        await store.close()
        return events

    first, second = asyncio.run(main())
    assert first["type"] == "error" and first["status"] == 500
    assert first["error"]["code"] == "server_error" and "secret" not in json.dumps(first)
    assert second["type"] == "error" and second["error"]["code"] == "invalid_json"


# --- read-your-writes: a stored response's record is written before its terminal event goes
# --- out; only that lane waits ----------------------------------------------------------------


class GatedStore:
    """A :class:`store.Store` whose writes (a record with its ledger line, a batch of lines)
    wait for ``gate``; ``fail`` lists ids whose write then raises.  Connections reach it
    through a real :class:`StoreWriter`."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.gate = asyncio.Event()
        self.fail = fail
        self.started: list[str] = []  # ids whose write started, records and lines alike
        self.records: dict[str, StoredResponse] = {}
        self.lines: dict[str, UsageEntry] = {}

    async def _write(self, *response_ids: str) -> None:
        self.started += response_ids
        await self.gate.wait()
        if self.fail.intersection(response_ids):
            raise ConnectionError("store unreachable")

    async def put(self, record: StoredResponse, usage: UsageEntry | None = None) -> None:
        await self._write(record.id)
        self.records[record.id] = record
        if usage is not None:
            self.lines.setdefault(usage.response_id, usage)

    async def add_usage(self, entries) -> None:
        await self._write(*(e.response_id for e in entries))
        for e in entries:
            self.lines.setdefault(e.response_id, e)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        record = self.records.get(response_id)
        return record if record is not None and record.owner == owner else None

    async def delete(self, response_id: str, owner: str) -> bool:
        return self.records.pop(response_id, None) is not None

    async def usage(self, owner: str) -> list[UsageEntry]:
        return [e for e in self.lines.values() if e.owner == owner]

    async def probe(self) -> None:
        pass

    async def close(self) -> None:
        pass


class ScriptedInference(CannedClient):
    """Answers "Hi there"; a request with ``HOLD`` metadata pauses after its first delta,
    one with ``CRASH`` fails there."""

    def __init__(self) -> None:
        super().__init__([MODEL], self._answer)
        self.release = asyncio.Event()

    async def _answer(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        yield [Prefilled(len(request.prompt_token_ids), 0, 0.0, 0.0), TextDelta("Hi", 1)]
        if (HOLD, "1") in request.metadata:
            await self.release.wait()
        if (CRASH, "1") in request.metadata:
            raise ConnectionError("replica died")
        yield [TextDelta(" there", 1), Done("stop", 2, 1.0)]


class Client:
    """Drains ``conn.events()`` in the background, as a socket's send loop does; records what
    the store holds, and the ledger journal, at the moment each terminal event reaches the client."""

    def __init__(self, conn: Connection, store: GatedStore, journal: Journal | None = None) -> None:
        self.events: list[dict] = []
        self.stored_when_sent: dict[str, bool] = {}
        self.billed_when_sent: dict[str, UsageEntry | None] = {}  # committed to the store
        self.journaled_when_sent: dict[str, UsageEntry | None] = {}  # in the journal on disk
        self.ended = False
        self._store = store
        self._journal = journal
        self._task = asyncio.get_running_loop().create_task(self._drain(conn))

    async def _drain(self, conn: Connection) -> None:
        async for batch in conn.events():
            for event in batch:
                self._receive(event if isinstance(event, str) else conn.outgoing(event))
        self.ended = True

    def _receive(self, event: ServerEvent | str) -> None:
        data = json.loads(event if isinstance(event, str) else event.model_dump_json())
        if data["type"] in TERMINAL_EVENT_TYPES:
            rid = data["response"]["id"]
            self.stored_when_sent[rid] = rid in self._store.records
            self.billed_when_sent[rid] = self._store.lines.get(rid)
            on_disk = read_journal(self._journal.path) if self._journal is not None else []
            self.journaled_when_sent[rid] = next((e for e in on_disk if e.response_id == rid), None)
        self.events.append(data)

    def types(self, lane: str | None = None) -> list[str]:
        return [e["type"] for e in self.events if e.get("stream_id") == lane]

    async def until(self, condition: Callable[[], bool]) -> None:
        await until(condition, 10, f"the condition of line {condition.__code__.co_firstlineno}")


def create(**body) -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "input": "hello", **body})


def run(
    scenario: Callable[[Connection, GatedStore, ScriptedInference, Client], object],
    store: GatedStore | None = None,
    observed: list | None = None,
    commit_lines: bool = False,
) -> None:
    """``scenario`` on a connection whose writer journals its ``store:false`` lines, or with
    ``commit_lines`` commits them before their terminal event (``store.ledger: commit``)."""

    async def main(journal_dir: str) -> None:
        gated = store or GatedStore()
        inference = ScriptedInference()
        session = Session(SessionConfig(), [MODEL], session_key="s", clock=lambda: 0.0)
        journal = None if commit_lines else Journal(journal_dir, "host")
        writer = StoreWriter(gated, journal=journal, commit_lines=commit_lines)
        conn = Connection(
            session, inference, writer, observe=None if observed is None else lambda t, r: observed.append(r)
        )
        client = Client(conn, gated, journal)
        try:
            await scenario(conn, gated, inference, client)
        finally:
            await conn.close()
            gated.gate.set()
            await writer.close()

    with tempfile.TemporaryDirectory() as journal_dir:
        asyncio.run(main(journal_dir))


def test_the_terminal_event_waits_for_the_record_while_other_lanes_flow():
    async def scenario(conn, store, inference, client):
        conn.feed(create(stream_id="a"))
        conn.feed(create(stream_id="b", metadata={HOLD: "1"}))
        await client.until(lambda: len(store.started) == 1)  # lane a finished, its put runs
        inference.release.set()  # lane b goes on meanwhile
        await client.until(lambda: len(store.started) == 2)
        assert "response.output_text.done" in client.types("b"), "lane b's events were not held"
        assert client.types("a")[-1] == "response.output_item.done", "a's terminal waits for its put"
        store.gate.set()
        await client.until(lambda: len(client.stored_when_sent) == 2)
        assert client.types("a")[-1] == client.types("b")[-1] == "response.completed"
        assert all(client.stored_when_sent.values()), "each record was stored before its terminal event"
        assert all(client.billed_when_sent.values()), "and its ledger line with it"

    run(scenario)


def test_the_next_response_of_the_lane_waits_behind_the_held_terminal():
    async def scenario(conn, store, inference, client):
        conn.feed(create())
        conn.feed(create())  # queued on the same lane
        await client.until(lambda: len(store.started) == 2)  # the second even ran meanwhile
        assert client.types().count("response.created") == 1
        store.gate.set()
        await client.until(lambda: len(client.stored_when_sent) == 2)
        types = client.types()
        first_end = types.index("response.completed")
        assert types.index("response.created", 1) == first_end + 1
        assert [e["sequence_number"] for e in client.events[first_end + 1 :]] == list(
            range(len(types) - first_end - 1)
        )

    run(scenario)


def test_a_store_failure_is_response_failed_with_server_error_and_not_continued_from(caplog):
    async def scenario(conn, store, inference, client):
        conn.feed(create(stream_id="a"))
        await client.until(lambda: len(store.started) == 1)
        store.fail = frozenset(store.started)
        store.gate.set()
        await client.until(lambda: len(client.stored_when_sent) == 1)
        failed = client.events[-1]
        assert failed["type"] == "response.failed" and failed["stream_id"] == "a"
        assert failed["response"]["status"] == "failed"
        assert failed["response"]["error"] == {
            "code": "server_error",
            "message": "The server had an error while processing your request.",
        }
        assert failed["response"]["output"][0]["content"][0]["text"] == "Hi there"
        assert failed["sequence_number"] == client.events[-2]["sequence_number"] + 1
        conn.feed(create(stream_id="a", previous_response_id=failed["response"]["id"]))
        await client.until(lambda: client.events[-1]["type"] == "error")
        assert client.events[-1]["error"]["code"] == "previous_response_not_found"

    with caplog.at_level(logging.WARNING, logger="actors.host.terminal_writes"):
        run(scenario)
    assert any("could not be written" in r.getMessage() for r in caplog.records)


def test_committed_lines_a_store_false_terminal_event_waits_for_its_commit_while_other_lanes_flow():
    """``store.ledger: commit``: a ``store:false`` response's line is in the store (not in a
    file) when its terminal event reaches the client; only its lane waits."""

    async def scenario(conn, store, inference, client):
        conn.feed(create(store=False, stream_id="a"))
        conn.feed(create(store=False, stream_id="b", metadata={HOLD: "1"}))
        await client.until(lambda: len(store.started) == 1)  # lane a finished, its commit runs
        inference.release.set()
        await client.until(lambda: "response.output_text.done" in client.types("b"))
        assert client.types("a")[-1] == "response.output_item.done", "a's terminal waits for its line"
        store.gate.set()
        await client.until(lambda: len(client.billed_when_sent) == 2)
        assert client.types("a")[-1] == client.types("b")[-1] == "response.completed"
        assert all(client.billed_when_sent.values()), "each line was committed before its terminal event"
        assert store.records == {}, "store:false: no record"

    observed: list = []
    run(scenario, observed=observed, commit_lines=True)
    assert len([r for r in observed if "ledger_write" in r]) == 2


def test_committed_lines_a_line_that_cannot_be_committed_fails_the_response_unbilled(caplog):
    async def scenario(conn, store, inference, client):
        conn.feed(create(store=False, stream_id="a"))
        await client.until(lambda: len(store.started) == 1)
        store.fail = frozenset(store.started)
        store.gate.set()
        await client.until(lambda: len(client.billed_when_sent) == 1)
        failed = client.events[-1]
        assert failed["type"] == "response.failed" and failed["response"]["usage"] is None
        assert failed["response"]["error"]["code"] == "server_error"
        assert store.lines == {}
        conn.feed(create(store=False, stream_id="a"))  # the socket goes on
        await client.until(lambda: len(client.billed_when_sent) == 2)
        assert client.events[-1]["type"] == "response.completed"
        assert len(store.lines) == 1

    with caplog.at_level(logging.WARNING, logger="actors.host.terminal_writes"):
        run(scenario, commit_lines=True)
    assert any("could not be committed" in r.getMessage() for r in caplog.records)


def in_flight_peak(events: list[dict]) -> int:
    """The most responses between their ``response.created`` and their terminal event, in the
    order the client received the events."""
    running: set[str] = set()
    peak = 0
    for event in events:
        if event["type"] == "response.created":
            running.add(event["response"]["id"])
            peak = max(peak, len(running))
        elif event["type"] in TERMINAL_EVENT_TYPES:
            running.discard(event["response"]["id"])
    return peak


def test_a_response_whose_terminal_event_waits_for_its_record_still_counts_against_the_lane_limit():
    async def scenario(conn, store, inference, client):
        for i in range(17):
            conn.feed(create(stream_id=f"lane{i}"))
        await client.until(lambda: len(store.started) >= 16)  # 16 answered, their terminals held
        store.gate.set()
        await client.until(lambda: len(client.stored_when_sent) == 17)
        assert len(store.started) == 17
        assert in_flight_peak(client.events) == 16

    run(scenario)


def test_ending_the_connection_waits_for_held_terminal_events():
    async def scenario(conn, store, inference, client):
        conn.feed(create())
        await client.until(lambda: len(store.started) == 1)
        conn.drain()  # idle once the response finished: the connection ends...
        assert not client.ended
        store.gate.set()
        await client.until(lambda: client.ended)  # ...after its terminal event
        assert client.types()[-1] == "response.completed"

    run(scenario)


def test_the_connection_state_moves_one_way_and_says_who_ended_it():
    async def scenario(conn, store, inference, client):
        assert conn.state is State.OPEN and not conn.server_ended
        conn.feed(create(metadata={HOLD: "1"}))
        await client.until(lambda: "response.output_text.delta" in client.types())
        conn.drain()
        assert conn.state is State.DRAINING
        conn.feed(create(stream_id="late"))  # refused while draining
        await client.until(lambda: "error" in client.types("late"))
        assert client.events[-1]["error"]["code"] == "server_shutting_down"
        inference.release.set()
        store.gate.set()
        await client.until(lambda: client.ended)  # idle: the server ends it, "service restart"
        assert conn.state is State.DRAIN_ENDING and conn.server_ended
        assert (conn.close_code, conn.close_reason) == (1012, "service restart")
        conn.feed(create())  # answered before the close frame, not started
        conn.drain()
        assert conn.state is State.DRAIN_ENDING
        await conn.close()
        assert conn.state is State.CLOSED and conn.server_ended
        assert client.types().count("response.created") == 1

    run(scenario)


def test_a_connection_the_client_closed_was_not_ended_by_the_server():
    async def scenario(conn, store, inference, client):
        conn.feed(create(metadata={HOLD: "1"}))
        await client.until(lambda: "response.output_text.delta" in client.types())
        await conn.close()
        assert conn.state is State.CLOSED and not conn.server_ended and conn.close_code is None
        await conn.close()  # twice is fine

    run(scenario)


def test_store_write_time_is_observed():
    observed: list[dict[str, float]] = []

    async def scenario(conn, store, inference, client):
        store.gate.set()
        conn.feed(create())
        await client.until(lambda: len(client.stored_when_sent) == 1)

    run(scenario, observed=observed)
    assert [set(r) for r in observed if "store_write" in r] == [{"store_write"}]


# --- usage exactly once: a terminal event with usage leaves once its ledger line is committed -----


def test_a_response_not_stored_is_sent_once_its_line_is_journaled_and_committed_behind():
    async def scenario(conn, store, inference, client):
        conn.feed(create(store=False))
        await client.until(lambda: "response.completed" in client.types())  # the commit is still gated
        [(rid, line)] = client.journaled_when_sent.items()
        assert store.records == {} and rid not in store.lines and line is not None and line.response_id == rid
        done = client.events[-1]["response"]["usage"]
        assert (
            (line.input_tokens, line.output_tokens)
            == (done["input_tokens"], done["output_tokens"])
            == (line.input_tokens, 2)
        )
        store.gate.set()
        await client.until(lambda: rid in store.lines)
        assert store.lines[rid] == line

    run(scenario)


def test_a_response_failed_after_inference_started_reports_and_bills_what_it_used():
    async def scenario(conn, store, inference, client):
        store.gate.set()
        conn.feed(create(store=False, metadata={CRASH: "1"}))
        await client.until(lambda: "response.failed" in client.types())
        failed = client.events[-1]["response"]
        assert failed["error"]["code"] == "server_error"
        assert failed["usage"]["output_tokens"] == 1 and failed["usage"]["input_tokens"] > 0
        line = client.journaled_when_sent[failed["id"]]
        assert line is not None and (line.input_tokens, line.output_tokens) == (
            failed["usage"]["input_tokens"],
            1,
        )

    run(scenario)


async def writable(store: StoreWriter, yes: bool) -> None:
    """Make the real SQLite store refuse every write, or take them again (a full or
    read-only disk refuses them the same way)."""
    await store.store._call(lambda c: c.execute(f"PRAGMA query_only = {int(not yes)}"))  # type: ignore[attr-defined]


def test_a_store_outage_fails_stored_responses_unbilled_and_journals_the_others(tmp_path, caplog):
    """A real SQLite store that refuses writes: a stored response is ``response.failed``
    without usage and never billed; a ``store:false`` one completes, its line kept in the
    journal, which the next process's writer commits (store/journal.py) — exactly once."""
    config = StoreConfig(data_dir=str(tmp_path))

    async def main() -> tuple[list[dict], list[UsageEntry], list[UsageEntry]]:
        store = StoreWriter(open_store(config), journal=Journal(config.journal_dir, "host"))
        await writable(store, False)
        session = Session(SessionConfig(), [MODEL], session_key="s", owner="k", clock=lambda: 0.0)
        conn = Connection(session, ScriptedInference(), store)
        received: list[dict] = []
        conn.feed(create(store=True, stream_id="a"))
        conn.feed(create(store=False, stream_id="b"))
        async for batch in conn.events():
            received += [json.loads(e.model_dump_json()) for e in batch]
            if {e["type"] for e in received} >= {"response.failed", "response.completed"}:
                break
        await conn.close()
        await store.flush()  # the line's commit failed: it stays in the journal
        await writable(store, True)
        during = await store.usage("k")
        await store.close()
        later = open_store(config)
        await replay(config.journal_dir, later)  # as the next host's writer does when it opens
        await replay(config.journal_dir, later)
        billed = await later.usage("k")
        await later.close()
        return received, during, billed

    with caplog.at_level(logging.ERROR, logger="store.writer"):
        received, during, billed = asyncio.run(main())
    terminal = {
        e["response"]["store"]: e for e in received if e["type"] in ("response.failed", "response.completed")
    }
    assert terminal[True]["type"] == "response.failed" and terminal[True]["response"]["usage"] is None
    assert terminal[True]["response"]["error"]["code"] == "server_error"
    assert terminal[False]["type"] == "response.completed"
    assert during == []
    assert [e.response_id for e in billed] == [terminal[False]["response"]["id"]]
    assert billed[0].output_tokens == terminal[False]["response"]["usage"]["output_tokens"]


# --- a large input is tokenised on a worker thread while the host has other work in flight ----


class CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(1)
        self.jobs = 0

    def submit(self, fn, /, *args, **kwargs):
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


BIG = "a long line of a tool's output\n" * 10  # over render_offload_chars=100


def render_scenario(pool: CountingPool, scenario) -> None:
    async def main() -> None:
        session = Session(
            SessionConfig(render_offload_chars=100), [MODEL], session_key="s", clock=lambda: 0.0
        )
        store = GatedStore()
        store.gate.set()
        writer = StoreWriter(store)
        inference = ScriptedInference()
        conn = Connection(session, inference, writer, renderer=RenderPool(pool))
        try:
            await scenario(conn, inference, Client(conn, store))
        finally:
            await conn.close()
            await writer.close()

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()


def completed(client: Client, lane: str | None = None) -> list[dict]:
    return [
        e["response"]
        for e in client.events
        if e["type"] == "response.completed" and e.get("stream_id") == lane
    ]


def test_a_lone_large_input_is_tokenised_inline_and_one_beside_a_running_response_on_a_thread():
    pool = CountingPool()

    async def scenario(conn, inference, client):
        conn.feed(create(input=BIG, store=False, metadata={"responses_ws.timings": "1"}))
        await client.until(lambda: completed(client))
        assert json.loads(completed(client)[0]["metadata"]["responses_ws.timings"])["render"] > 0
        assert pool.jobs == 0, "nothing else ran: no hop to a thread"
        conn.feed(create(stream_id="a", store=False, metadata={HOLD: "1"}))  # a model call in flight
        await client.until(lambda: "response.output_text.delta" in client.types("a"))
        conn.feed(create(stream_id="b", input=BIG, store=False))
        await client.until(lambda: completed(client, "b"))
        assert pool.jobs == 1 and not completed(client, "a"), "b was tokenised on the thread while a ran"
        inference.release.set()
        await client.until(lambda: completed(client, "a"))

    render_scenario(pool, scenario)


def test_a_render_runs_inline_while_the_process_has_nothing_else_in_flight():
    async def main() -> list[RenderSite]:
        renderer = RenderPool()  # its threads are made on first use: none here
        sites = [renderer.site]
        gate = asyncio.Event()

        async def model_call() -> None:
            await gate.wait()

        task = renderer.track(asyncio.get_running_loop().create_task(model_call()))
        sites.append(renderer.site)
        gate.set()
        await task
        return [*sites, renderer.site]

    assert asyncio.run(main()) == [RenderSite.INLINE, RenderSite.WORKER, RenderSite.INLINE]
    assert set(RENDER_SITE.values()) == set(RenderSite)


def test_a_render_that_fails_is_server_error_and_the_socket_stays_usable(monkeypatch, caplog):
    def broken(items):
        raise KeyError("internal detail /srv/secret.py")

    monkeypatch.setattr("actors.host.render_pool.render_marked", broken)

    async def scenario(conn, inference, client):
        conn.feed(create(input=BIG, store=False))  # inline
        conn.feed(create(stream_id="a", store=False, metadata={HOLD: "1"}))
        await client.until(lambda: "response.output_text.delta" in client.types("a"))
        conn.feed(create(stream_id="b", input=BIG, store=False))  # on the thread
        await client.until(lambda: "error" in client.types("b"))
        conn.feed(create(stream_id="b", input="short", store=False))
        await client.until(lambda: completed(client, "b"))
        errors = [e for e in client.events if e["type"] == "error"]
        assert [e.get("stream_id") for e in errors] == [None, "b"]
        assert all(e["error"]["code"] == "server_error" for e in errors)
        assert "secret" not in json.dumps(client.events)

    with caplog.at_level(logging.ERROR, logger="actors.host.render_pool"):
        render_scenario(CountingPool(), scenario)
    assert caplog.text.count("rendering an input failed") == 2


# --- the server's figures: from the create's first bytes to its terminal event's encoding --


def test_a_terminal_events_figures_count_its_wait_to_be_encoded_and_a_stored_one_keeps_its_records():
    async def main() -> dict[str, tuple[float, float, dict]]:
        now = [100.0]
        session = Session(SessionConfig(), [MODEL], session_key="s", clock=lambda: 0.0, perf=lambda: now[0])
        gated = GatedStore()
        gated.gate.set()
        writer = StoreWriter(gated)
        observed: list[dict] = []
        conn = Connection(session, ScriptedInference(), writer, observe=lambda t, r: observed.append(r))
        out = {}
        try:
            for store in (False, True):
                # the create's first bytes reached the host 3 ms before the library handed it over
                conn.feed(
                    create(store=store, metadata={"responses_ws.timings": "1"}), received=now[0] - 0.003
                )
                events = conn.events()
                terminal = None
                while terminal is None:
                    terminal = next((e for e in await anext(events) if e.type == "response.completed"), None)
                early = json.loads(terminal.response.metadata["responses_ws.timings"])["api_overhead"]
                now[0] += 0.005  # the event waited 5 ms for the sender
                sent = json.loads(conn.outgoing(terminal).model_dump_json())["response"]
                late = json.loads(sent["metadata"]["responses_ws.timings"])
                await until(lambda: any("api_overhead" in ms for ms in observed), 5, "the host's record")
                [recorded] = [ms for ms in observed if "api_overhead" in ms]
                observed.clear()
                assert recorded["api_overhead"] == early, "the host records them as it finished"
                record = gated.records.get(sent["id"])
                out[f"store={store}"] = early, late["api_overhead"], sent, record
        finally:
            await conn.close()
            await writer.close()
        return out

    got = asyncio.run(main())
    early, late, _, _ = got["store=False"]
    assert early == 2.0, "the 3 ms before the frame was read count (less the model's 1 ms)"
    assert late == round(early + 5.0, 3), "and so does the terminal event's wait for the sender"
    early, late, sent, record = got["store=True"]
    assert late == early, "a stored response's figures are what its record holds"
    assert record.response["metadata"] == sent["metadata"]


def test_only_a_response_whose_client_asked_for_its_figures_leaves_them_for_the_sender():
    """The figures stage (actors.host.figures) has work only for a response whose client asked
    for the figures: otherwise its terminal event is encoded and written as it is, with no
    restamp and no splice, whether or not the host records them."""

    async def pending_after_a_turn(metadata: dict[str, str], observe: bool) -> bool:
        session = Session(SessionConfig(), [MODEL], session_key="s", clock=lambda: 0.0)
        gated = GatedStore()
        gated.gate.set()
        writer = StoreWriter(gated)
        conn = Connection(
            session, ScriptedInference(), writer, observe=(lambda t, r: None) if observe else None
        )
        try:
            conn.feed(create(store=False, metadata=metadata))
            events = conn.events()
            while not any(e.type == "response.completed" for e in await asyncio.wait_for(anext(events), 10)):
                pass
            return conn.figures.pending
        finally:
            await conn.close()
            await writer.close()

    asked = {"responses_ws.timings": "1"}
    assert asyncio.run(pending_after_a_turn({}, observe=False)) is False
    assert asyncio.run(pending_after_a_turn(asked, observe=False)) is True
    assert asyncio.run(pending_after_a_turn({}, observe=True)) is False
    assert asyncio.run(pending_after_a_turn(asked, observe=True)) is True


def test_a_terminal_frame_with_figures_goes_in_fragments_whose_figures_count_writing_the_first():
    from actors.protocol import EventEncoder, encode

    async def main() -> tuple[float, dict, str, str, dict]:
        now = [100.0]
        session = Session(SessionConfig(), [MODEL], session_key="s", clock=lambda: 0.0, perf=lambda: now[0])
        gated = GatedStore()
        gated.gate.set()
        writer = StoreWriter(gated)
        conn = Connection(session, ScriptedInference(), writer)
        try:
            conn.feed(
                create(store=False, instructions="Be brief. " * 500, metadata={"responses_ws.timings": "1"}),
                received=now[0] - 0.003,
            )
            events = conn.events()
            terminal = None
            while terminal is None:
                terminal = next((e for e in await anext(events) if e.type == "response.completed"), None)
            early = json.loads(terminal.response.metadata["responses_ws.timings"])["api_overhead"]
            report = conn.figures.take(terminal)
            assert report is not None and conn.figures.take(terminal) is None  # handed out once
            pieces, rest = conn.figures.split(terminal, report, EventEncoder().pieces, "f" * 32)
            assert rest is not None
            now[0] += 0.004  # encoding, compressing and writing the head took 4 ms
            tail = rest()
            head = "".join(pieces)
            return early, json.loads(head + tail), head, tail, json.loads(encode(terminal))
        finally:
            await conn.close()
            await writer.close()

    early, sent, head, tail, whole = asyncio.run(main())
    assert "Be brief." in head and '"output"' in head and len(tail) < 400, "the bulk goes first"
    figures = json.loads(sent["response"]["metadata"]["responses_ws.timings"])
    assert figures["api_overhead"] == round(early + 4.0, 3)
    assert sent == whole, "the fragments make the very event that was encoded"


class EndingTogether(CannedClient):
    """Every call streams its first token, waits for ``release``, then its last token and
    ``Done`` as two chunks ready at once (as a replica under load sends them)."""

    def __init__(self) -> None:
        super().__init__([MODEL], self._answer)
        self.release = asyncio.Event()
        self.first_sent = 0

    async def _answer(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        yield [Prefilled(len(request.prompt_token_ids), 0, 0.0, 0.0), TextDelta("first", 1)]
        self.first_sent += 1
        await self.release.wait()
        yield [TextDelta(f" last of {request.request_id}", 1)]
        yield [Done("stop", 2, 1.0)]


def test_streams_ending_together_send_every_last_token_before_any_terminal_event():
    """A response whose output ends while others of the process stream yields before its
    end work, so their last tokens due now are not queued behind its terminal event."""

    async def main() -> list[tuple[int, str]]:
        store = GatedStore()
        store.gate.set()
        writer = StoreWriter(store)
        inference, pool, sent = EndingTogether(), RenderPool(), []
        conns = [
            Connection(
                Session(SessionConfig(), [MODEL], session_key=f"s{i}", clock=lambda: 0.0),
                inference,
                writer,
                renderer=pool,
            )
            for i in range(3)
        ]

        async def drain(i: int, conn: Connection) -> None:
            async for batch in conn.events():
                sent.extend((i, e.type) for e in batch if not isinstance(e, str))

        drains = [asyncio.get_running_loop().create_task(drain(i, c)) for i, c in enumerate(conns)]
        for conn in conns:
            conn.feed(create(store=False))
        await until(lambda: inference.first_sent == len(conns), 10, "every call's first chunk")
        inference.release.set()
        await until(lambda: sum(t == "response.completed" for _, t in sent) == len(conns), 10, "every answer")
        for conn in conns:
            await conn.close()
        await asyncio.gather(*drains, return_exceptions=True)
        await writer.close()
        return sent

    sent = asyncio.run(main())
    deltas = [k for k, (_, t) in enumerate(sent) if t == "response.output_text.delta"]
    terminals = [k for k, (_, t) in enumerate(sent) if t == "response.completed"]
    assert len(deltas) == 6 and len(terminals) == 3
    assert max(deltas) < min(terminals), sent


def one_token(request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
    """ "Hi" in one chunk, ``Done`` in the next (a loop iteration apart)."""

    async def chunks() -> AsyncIterator[list[InferenceEvent]]:
        yield [Prefilled(len(request.prompt_token_ids), 0, 0.0, 0.0), TextDelta("Hi", 1)]
        await asyncio.sleep(0)
        yield [Done("stop", 1, 1.0)]

    return chunks()


class StartsAtOnce(CannedClient):
    """A backend whose call starts when ``stream`` is called, as a direct channel's does (its
    request is written before ``stream`` returns); records what was started and closed."""

    def __init__(self) -> None:
        super().__init__([MODEL], one_token)


def test_a_call_starts_as_its_create_is_fed_and_one_whose_task_never_ran_is_closed():
    """The model call leaves while the create's frame is handled, not a loop iteration later
    when its task first runs; if that task is cancelled before it ran (the client went
    away at once), the started call is closed all the same."""

    async def main() -> tuple[list[str], list[str], list[str], list[str]]:
        store = GatedStore()
        store.gate.set()
        writer = StoreWriter(store)
        inference = StartsAtOnce()
        conn = Connection(
            Session(SessionConfig(), [MODEL], session_key="s", clock=lambda: 0.0), inference, writer
        )
        conn.feed(create(store=False))
        started_in_feed = list(inference.started)  # nothing awaited since the frame
        types: list[str] = []
        while "response.completed" not in types:
            types += [e.type for e in await anext(conn.events()) if not isinstance(e, str)]
        for _ in range(10):
            await asyncio.sleep(0)
        answered = list(inference.closed)  # closed by the task that read it to the end

        gone = Connection(
            Session(SessionConfig(), [MODEL], session_key="t", clock=lambda: 0.0), inference, writer
        )
        gone.feed(create(store=False))
        await gone.close()  # before the call's task ever ran
        for _ in range(10):
            await asyncio.sleep(0)
        await conn.close()
        await writer.close()
        return started_in_feed, answered, inference.started, inference.closed

    started_in_feed, answered, started, closed = asyncio.run(main())
    assert len(started_in_feed) == 1 and answered == started_in_feed
    assert len(started) == 2 and closed == started


class NotesCalls(StartsAtOnce):
    """Notes in ``reads`` when a call starts."""

    def __init__(self, reads: list[str]) -> None:
        super().__init__()
        self.reads = reads

    def stream(self, request: InferenceRequest) -> CannedCall:
        self.reads.append("call")
        return super().stream(request)


def test_a_call_is_started_before_its_response_and_first_events_are_built():
    """The connection starts a turn's call, then reads the effects' events: the response
    object (whose ``created_at`` reads the session's clock) is built after the request left."""

    async def main() -> tuple[list[str], list[str]]:
        store = GatedStore()
        store.gate.set()
        writer = StoreWriter(store)
        reads: list[str] = []
        inference = NotesCalls(reads)
        session = Session(
            SessionConfig(), [MODEL], session_key="s", clock=lambda: reads.append("clock") or 0.0
        )
        conn = Connection(session, inference, writer)
        conn.feed(create(store=False))
        types: list[str] = []
        while "response.completed" not in types:
            types += [e.type for e in await anext(conn.events()) if not isinstance(e, str)]
        await conn.close()
        await writer.close()
        return reads, types

    reads, types = asyncio.run(main())
    assert reads[:2] == ["call", "clock"], reads
    assert types[:2] == ["response.created", "response.in_progress"]


def test_a_create_read_after_the_drain_ended_the_connection_is_answered_before_the_close():
    async def scenario(conn, store, inference, client):
        conn.drain()  # idle: it ends at once, its close frame not yet written
        assert conn.state is State.DRAIN_ENDING
        conn.feed(create(stream_id="late"))  # the client sent it before it saw the close
        late = [json.loads(e.model_dump_json()) for e in conn.take_late_answers()]
        assert [(e["type"], e["error"]["code"], e.get("stream_id")) for e in late] == [
            ("error", "server_shutting_down", "late")
        ]
        assert conn.take_late_answers() == []  # taken once
        await client.until(lambda: client.ended)
        assert "response.created" not in client.types("late")

    run(scenario)


def test_a_paced_drain_hands_the_idle_connection_over_once_instead_of_ending_it():
    async def scenario(conn, store, inference, client):
        ready: list[Connection] = []
        conn.feed(create(metadata={HOLD: "1"}))
        await client.until(lambda: "response.output_text.delta" in client.types())
        conn.drain(ready.append)
        assert not conn.drained and ready == []
        inference.release.set()
        store.gate.set()
        await client.until(lambda: "response.completed" in client.types())
        assert ready == [conn] and conn.drained
        assert conn.state is State.DRAINING  # open until its batch comes
        conn.feed(create(stream_id="late"))
        await client.until(lambda: "error" in client.types("late"))
        conn.end(1012, "service restart")
        await client.until(lambda: client.ended)
        assert ready == [conn]

    run(scenario)


def test_a_connection_hands_another_sessions_eviction_to_that_session(tmp_path):
    """Two connections of one host share a cache budget that holds one conversation: the
    second's finished turn evicts the first's lane, and its connection hands the first
    session that eviction (the budget itself changes no lane)."""
    from actors.core.cache_budget import CacheBudget

    async def main() -> tuple[object, object]:
        host = CacheBudget(max_tokens=60)
        store = StoreWriter(open_store(StoreConfig(data_dir=str(tmp_path))))
        sessions = [
            Session(SessionConfig(), [MODEL], session_key=k, clock=lambda: 0.0, cache=host)
            for k in ("a", "b")
        ]
        conns = [Connection(s, ScriptedInference(), store) for s in sessions]
        clients = [Client(c, GatedStore()) for c in conns]
        for conn, client, words in zip(
            conns, clients, ("some words " * 15, "other words " * 15), strict=True
        ):
            conn.feed(create(input=words, store=False))
            await client.until(lambda client=client: "response.completed" in client.types())
        first, second = (s.cached(None) for s in sessions)
        for conn in conns:
            await conn.close()
        await store.close()
        return first, second

    first, second = asyncio.run(main())
    assert first is None and second is not None
