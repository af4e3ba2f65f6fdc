"""The runner's ``resume`` workload: one session a loop, its turns on an open connection and
its resumes (the connection aborted, a new one opened with the upgrade's resume token), each
turn recorded with its time to the first event and a resume's handshake."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any

import pytest

from bench.runner import LoadSpec, Resume
from bench.runner.channels import Connections, Reply, WsChannel
from bench.runner.connecting import ConnectLog
from bench.runner.loop import Pace
from bench.runner.resume import ResumeLoop
from bench.runner.worker import LoadWorker

pytestmark = pytest.mark.unit


def completed(rid: str) -> str:
    usage = {"input_tokens": 100, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 64}}
    return json.dumps(
        {"type": "response.completed", "response": {"id": rid, "usage": usage}}, separators=(",", ":")
    )


class Session(WsChannel):
    """A connection to a scripted session: each create answered completed (or with
    ``fail_at``'s create failed); the upgrade's answer carries the token."""

    def __init__(
        self, log: list, connections: Connections, headers: dict[str, str] | None, fail_at: int
    ) -> None:
        super().__init__("http://unused", None, connections=connections, headers=headers)
        self.log, self.fail_at = log, fail_at

    async def open(self) -> None:
        assert self.connections is not None
        self.log.append(("open", self.headers))
        self.record = self.connections.opened(0, 40000 + len(self.connections.records))
        self.open_ms = 2.0 + len(self.connections.records)

    def upgrade_header(self, name: str) -> str | None:
        return "tok-1" if name == "x-token" else None

    def abort(self) -> None:
        self.log.append(("abort",))
        self._ended(None)

    async def send(self, body: str) -> Reply:
        sent = json.loads(body)
        self.log.append(("create", sent["input"], sent.get("previous_response_id")))
        n = sum(1 for e in self.log if e[0] == "create")
        raw = completed(f"r{n}")
        if n == self.fail_at:
            raw = json.dumps({"type": "error", "error": {"code": "session_expired"}})
        return Reply(raw, time.time(), 0.004, 0.003, first_s=0.001)

    async def close(self) -> None:
        self._ended(None)


def run_session(resume: Resume, fail_at: int = 0) -> tuple[ResumeLoop, list]:
    log: list = []
    conns, sink = Connections(), []  # type: ignore[var-annotated]
    loop = ResumeLoop(
        0, "http://unused", resume, Pace(1), sink, lambda t, h: Session(log, conns, h, fail_at), ConnectLog()
    )
    try:
        asyncio.run(loop.run(time.time()))
    except RuntimeError as exc:
        loop.errors.append(str(exc))
    return loop, log


def test_a_session_resumes_with_its_token_and_its_chain_goes_on():
    resume = Resume(
        resumes=2, steady=1, first_input="begin {loop}", header="x-token", pause_s=0.0, text_tokens=5
    )
    loop, log = run_session(resume)
    assert log == [
        ("open", None), ("create", "begin 0", None), ("create", "step 1: go on", "r1"),
        ("abort",), ("open", {"x-token": "tok-1"}), ("create", "step 2: go on", "r2"),
        ("create", "step 3: go on", "r3"),
        ("abort",), ("open", {"x-token": "tok-1"}), ("create", "step 4: go on", "r4"),
        ("create", "step 5: go on", "r5"),
    ]  # fmt: skip
    assert [(r.kind, r.connection, r.response_id) for r in loop.sink] == [
        ("first", 0, "r1"), ("steady", 0, "r2"), ("resume", 1, "r3"), ("steady", 1, "r4"),
        ("resume", 2, "r5"), ("steady", 2, "r6"),
    ]  # fmt: skip
    resumed = [r for r in loop.sink if r.kind == "resume"]
    assert [(r.connect_ms, r.first_event_ms) for r in resumed] == [
        (4.0, 1.0),
        (5.0, 1.0),
    ]  # the reconnects' own
    assert all(r.connect_ms is None for r in loop.sink if r.kind != "resume")
    assert all(r.cached_tokens == 64 and r.input_tokens == 100 for r in loop.sink) and loop.errors == []


def test_a_turn_that_fails_ends_its_session_as_an_error():
    loop, _ = run_session(Resume(resumes=3, steady=1, header="x-token", pause_s=0.0), fail_at=3)
    assert loop.errors and "session_expired" in loop.errors[0]
    assert [r.ok for r in loop.sink] == [True, True, False]


def test_the_resume_workload_is_a_websocket_ones():
    with pytest.raises(ValueError, match="transport 'ws' only"):
        LoadSpec(targets=("http://a",), loops=1, workload="resume", transport="http-full")


class Node(Session):
    """A scripted session on the node its target URL names (the connection's server)."""

    def __init__(self, target: str, loop: int, *args: Any) -> None:
        super().__init__(*args)
        self.target, self.loop = target, loop

    async def open(self) -> None:
        assert self.connections is not None
        self.record = self.connections.opened(self.loop, 40000 + len(self.connections.records), self.target)
        self.record.server = {"ws://lb": "s1", "ws://s1": "s1", "ws://s2": "s2"}.get(self.target)
        self.log.append(("at", self.target))


def node(loop: int, log: list, conns: Connections, target: str, headers: dict[str, str] | None) -> Node:
    return Node(target, loop, log, conns, headers, 0)


def stepped(n: int, inspect: Any = None) -> tuple[list[ResumeLoop], list]:
    log: list = []
    conns, sink = Connections(), []  # type: ignore[var-annotated]
    resume = Resume(
        first_input="s{loop} begin",
        next_input="s{loop} step {turn}",
        header="x-token",
        pause_s=0.0,
        seeded=True,
        steps=True,
        inspect=inspect,
    )
    pace = Pace(n)
    loops = [
        ResumeLoop(i, "ws://lb", resume, pace, sink, functools.partial(node, i, log, conns), ConnectLog())
        for i in range(n)
    ]
    return loops, log


def test_a_stepped_session_only_opens_then_takes_the_drivers_steps():
    async def main() -> tuple[list[ResumeLoop], list]:
        loops, log = stepped(2, inspect=lambda token, rid: f"replica-of-{rid}@{token}")
        await asyncio.gather(*(lp.run(time.time()) for lp in loops))
        assert [e for e in log if e[0] == "create"] == []  # no turn taken by itself
        for _ in range(2):
            await asyncio.gather(*(lp.step(lp.next_turn) for lp in loops))
        # the one on an unknown server resumes at None's target
        loops[1].ws.record.server = None  # type: ignore[union-attr]
        targets = {"s1": "ws://s2", "s2": "ws://s1", None: "ws://s1"}
        assert await asyncio.gather(*(lp.resume_by_server(targets) for lp in loops)) == [True, True]
        return loops, log

    loops, log = asyncio.run(main())
    assert [e[1] for e in log if e[0] == "at"] == ["ws://lb", "ws://lb", "ws://s2", "ws://s1"]
    sink = loops[0].sink
    assert [(r.loop, r.kind, r.connection) for r in sorted(sink, key=lambda r: (r.loop, r.sent))] == [
        (0, "first", 0), (0, "steady", 0), (0, "resume", 1),
        (1, "first", 0), (1, "steady", 0), (1, "resume", 1),
    ]  # fmt: skip
    assert all(r.note == f"replica-of-{r.response_id}@tok-1" for r in sink)
    assert [(lp.completed, lp.failed) for lp in loops] == [(3, False), (3, False)]
    body = json.loads(loops[1].body(2, "r9"))
    assert body["input"] == "s1 step 2" and body["metadata"] == {"emulator.seed": "1"}


def test_a_stepped_session_turns_until_halted_and_a_failed_inspect_fails_its_turn():
    def inspect(token: str, rid: str) -> str:
        if rid == "r4":
            raise TimeoutError(f"{rid} not in the store")
        return "replica-1"

    async def main() -> list[ResumeLoop]:
        loops, _ = stepped(1, inspect=inspect)
        lp = loops[0]
        await lp.run(time.time())
        lp.go(0.0)
        for _ in range(200):  # bounded: the fourth turn's inspect fails and ends the turns
            if lp.failed:
                break
            await asyncio.sleep(0.01)
        await lp.halt()
        assert await lp.step(lp.next_turn) is False  # a failed session takes no more steps
        return loops

    (lp,) = asyncio.run(main())
    assert [(r.ok, r.error_code, r.note) for r in lp.sink] == [
        (True, None, "replica-1"), (True, None, "replica-1"), (True, None, "replica-1"),
        (False, "inspect", None),
    ]  # fmt: skip
    assert lp.completed == 3 and "r4 not in the store" in lp.errors[0]


def test_go_turns_until_halted():
    async def main() -> ResumeLoop:
        (lp,), _ = stepped(1)
        await lp.run(time.time())
        lp.go(0.0)
        for _ in range(200):
            if lp.completed >= 3:
                break
            await asyncio.sleep(0.01)
        await lp.halt()
        return lp

    lp = asyncio.run(main())
    done = lp.completed
    assert done >= 3 and not lp.failed and len(lp.sink) == done  # nothing in flight after the halt


def test_a_worker_steps_its_sessions_all_at_once_and_records_where_each_connection_went():
    resume = Resume(header="x-token", pause_s=0.0, steps=True)
    spec = LoadSpec(targets=("ws://lb",), loops=3, workload="resume", resume=resume, warmup_s=0.0)
    worker = LoadWorker(spec, [0, 1, 2])
    log: list = []
    worker._session_ws = lambda loop, target, headers: Node(  # type: ignore[method-assign]
        target, loop, log, worker.connections, headers, 0
    )

    async def main() -> tuple[dict[int, tuple[int, bool]], dict[str, Any]]:
        await worker.connect()
        await worker.start(time.time())
        await worker.set_end(time.time() + 60)
        assert await worker.session_turns(2) == 3
        assert await worker.session_resume({"s1": "ws://s2", None: "ws://s1"}) == 3
        await worker.session_go(0.0)
        for _ in range(200):  # bounded
            if all(n >= 5 for n, _ in (await worker.session_progress()).values()):
                break
            await asyncio.sleep(0.01)
        await worker.session_halt()
        progress = await worker.session_progress()
        await worker.set_end(time.time())
        return progress, await worker.finish((0.0, time.time()))

    progress, out = asyncio.run(main())
    assert set(progress) == {0, 1, 2} and all(n >= 5 and not failed for n, failed in progress.values())
    assert len(out["records"]) == sum(n for n, _ in progress.values()) and out["errors"] == {}
    where = sorted((c.loop, c.index, c.target, c.server) for c in out["connections"])
    assert where == [
        (k, i, url, node) for k in range(3) for i, url, node in ((0, "ws://lb", "s1"), (1, "ws://s2", "s2"))
    ]
