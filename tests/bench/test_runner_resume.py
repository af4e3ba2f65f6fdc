"""The runner's ``resume`` workload: one session a loop, its turns on an open connection and
its resumes (the connection aborted, a new one opened with the upgrade's resume token), each
turn recorded with its time to the first event and a resume's handshake."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from bench.runner import LoadSpec, Resume
from bench.runner.channels import Connections, Reply, WsChannel
from bench.runner.connecting import ConnectLog
from bench.runner.loop import Pace
from bench.runner.resume import ResumeLoop

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
        0, "http://unused", resume, Pace(1), sink, lambda h: Session(log, conns, h, fail_at), ConnectLog()
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
