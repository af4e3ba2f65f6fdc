"""The load runner's run-until-stopped (bench/runner/drive.py ``LoadRun``): the window ends when
the driver says, at the latest at the spec's deadline, and the workers end either way."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from bench import workload as wl
from bench.runner import ClientStats, LoadRun, LoadSpec
from bench.runner.channels import Channel, Reply
from bench.runner.drive import RELEASE_DELAY_S
from bench.runner.worker import LoadWorker

BARE = wl.Workload(
    tool_rounds=0, system_tokens=0, tool_def_tokens=0, task_tokens=1, text_tokens=8, tool_output_tokens=1
)

pytestmark = pytest.mark.unit


class Fleet:
    """Workers answering as LoadWorker does; the clock is the test's."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.now = 1000.0
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail_on = fail_on

    def clock(self) -> float:
        return self.now

    def call(self, method: str, *args: Any) -> list[Any]:
        self.calls.append((method, args))
        if method == self.fail_on:
            raise RuntimeError(f"a client process failed in {method}")
        stats = ClientStats(None, None, 1, 0.1, 1.0, 0.1, 1.0, 1.0, False, None, loops=2, connected=2)
        answers: dict[str, Any] = {
            "connect": 0,
            "start": None,
            "set_end": None,
            "running": 1,
            "opened": 2,
            "held_turns": 2,
            "session_turns": 2,
            "session_resume": 1,
            "session_go": None,
            "session_halt": None,
            "session_progress": {0: (3, False), 1: (2, True)},
            "finish": {
                "records": [],
                "errors": {},
                "stats": stats,
                "stalls": [],
                "lag_ms": [],
                "connect_failures": {"connect:http_503": 1},
                "connects": [(1001.0, 5.0), (1001.5, 7.0)],
            },
        }
        return [answers[method]]


def spec(**kw: Any) -> LoadSpec:
    return LoadSpec(targets=("http://a",), loops=2, duration_s=60.0, warmup_s=0.0, arrivals=True, **kw)


def test_a_run_goes_on_until_stopped_and_its_window_ends_then():
    fleet = Fleet()
    closed: list[bool] = []
    run = LoadRun(fleet, spec(ramp_s=1.0, rollouts_per_loop=0), closed.append, clock=fleet.clock)
    assert run.deadline == 1000.0 + RELEASE_DELAY_S + 60.0
    assert (run.running(), run.opened(), run.held_turns(1)) == (1, 2, 2)
    fleet.now = 1010.0
    result = run.stop()
    assert ("set_end", (1010.0,)) in fleet.calls and fleet.calls[-1] == ("finish", ((1001.0, 1010.0),))
    assert result.window == (1001.0, 1010.0) and closed == [False] and run.deadline == 1061.0
    # with arrivals every loop connected at its release: the workers' count
    assert result.connected == 2 and result.connects == [(1001.0, 5.0), (1001.5, 7.0)]
    assert result.summary()["failures"] == {"connect:http_503": 1}
    assert run.stop() is result and closed == [False]  # once


def test_a_stepped_run_steps_every_worker_and_adds_their_answers():
    fleet = Fleet()
    run = LoadRun(fleet, spec(), lambda now: None, clock=fleet.clock)
    assert (run.turns(2), run.resume({"s1": "ws://s2", None: "ws://s1"})) == (2, 1)
    run.go(0.5)
    run.halt()
    assert run.progress() == {0: (3, False), 1: (2, True)}
    assert [c for c in fleet.calls if c[0].startswith("session_")] == [
        ("session_turns", (2,)),
        ("session_resume", ({"s1": "ws://s2", None: "ws://s1"},)),
        ("session_go", (0.5,)),
        ("session_halt", ()),
        ("session_progress", ()),
    ]


def test_stopped_after_its_deadline_the_window_is_the_deadlines():
    fleet = Fleet()
    run = LoadRun(fleet, spec(), lambda now: None, clock=fleet.clock)
    fleet.now = 2000.0
    assert run.stop().window == (1001.0, 1061.0)
    assert [c for c in fleet.calls if c[0] == "set_end"] == [("set_end", (1061.0,))]  # not moved later


@pytest.mark.parametrize("fail_on", ["start", "finish"])
def test_a_run_that_fails_ends_its_workers_at_once(fail_on):
    fleet = Fleet(fail_on=fail_on)
    closed: list[bool] = []
    with pytest.raises(RuntimeError, match=fail_on):
        LoadRun(fleet, spec(), closed.append, clock=fleet.clock).stop()
    assert closed == [True]


def test_leaving_the_block_early_ends_the_workers_at_once():
    fleet = Fleet()
    closed: list[bool] = []
    with pytest.raises(KeyboardInterrupt), LoadRun(fleet, spec(), closed.append, clock=fleet.clock):
        raise KeyboardInterrupt
    assert closed == [True]


def test_a_spec_refuses_negative_rollouts_and_no_attempt():
    with pytest.raises(ValueError, match="rollouts_per_loop"):
        spec(rollouts_per_loop=-1)
    with pytest.raises(ValueError, match="connect_attempts"):
        spec(connect_attempts=0)


COMPLETED = '{"type":"response.completed","response":{"id":"resp_1","output":[],"usage":{"output_tokens":1}}}'


class Socket(Channel):
    """A connection that opens (or is refused with 503 ``refusals`` times) and answers every
    create at once, completed with no tool call."""

    def __init__(self, refusals: int = 0) -> None:
        self.refusals = refusals
        self.up = False
        self.sent: list[str] = []

    async def open(self) -> None:
        if self.refusals:
            self.refusals -= 1
            exc = Exception("server rejected WebSocket connection: HTTP 503")
            exc.response = SimpleNamespace(status_code=503, headers={"Retry-After": "0"})  # type: ignore[attr-defined]
            raise exc
        self.up = True

    @property
    def is_open(self) -> bool:
        return self.up

    async def send(self, body: str) -> Reply:
        self.sent.append(body)
        return Reply(COMPLETED, time.time(), 0.001, 0.0005)

    async def close(self) -> None:
        self.up = False


def run_worker(spec: LoadSpec, sockets: list[Socket]) -> tuple[dict[str, Any], list[int]]:
    """A worker's calls in the driver's order on ``sockets`` (one a loop); what ``opened``
    answered after every loop arrived and after the held turns."""
    worker = LoadWorker(spec, list(range(spec.loops)))
    made = iter(sockets)
    worker._channel = lambda target, loop: next(made)  # type: ignore[method-assign]

    async def main() -> tuple[dict[str, Any], list[int]]:
        await worker.connect()
        await worker.start(time.time())
        await worker.set_end(time.time() + 60)
        while await worker.running():
            await asyncio.sleep(0.01)
        seen = [await worker.opened()]
        seen.append(await worker.held_turns(2))
        seen.append(await worker.opened())
        await worker.set_end(time.time())
        return await worker.finish((0.0, time.time())), seen

    return asyncio.run(main())


def test_arriving_connections_send_their_creates_and_are_held_for_more_turns():
    spec = LoadSpec(
        targets=("http://a",), loops=3, custom_workload=BARE, arrivals=True, ramp_s=0.03, rollouts_per_loop=1
    )
    sockets = [Socket(), Socket(refusals=1), Socket()]
    out, seen = run_worker(spec, sockets)
    assert seen == [3, 6, 3]  # all held; 2 turns on each; still held
    kinds = sorted(r.kind for r in out["records"])
    assert kinds == ["first"] * 3 + ["held"] * 6 and all(r.ok for r in out["records"])
    assert len(out["connects"]) == 3 and out["connect_failures"] == {"connect:http_503": 1}  # retried
    assert out["stats"].connected == 3 and not any(s.up for s in sockets)  # finish closed them
    first = json.loads(sockets[0].sent[0])
    assert "instructions" not in first and "tools" not in first  # a bare create


def test_connect_only_arrivals_closed_at_once_and_a_refusal_not_retried_when_told():
    spec = LoadSpec(
        targets=("http://a",), loops=2, custom_workload=BARE, arrivals=True, rollouts_per_loop=0,
        hold=False, connect_attempts=1,
    )  # fmt: skip
    out, seen = run_worker(spec, [Socket(), Socket(refusals=1)])
    assert seen == [0, 0, 0] and out["records"] == []  # opened and closed, no turn sent
    assert len(out["connects"]) == 1 and out["connect_failures"] == {"connect:http_503": 1}
    assert out["stats"].connected == 1 and out["errors"] == {
        1: ["connect: Exception: server rejected WebSocket connection: HTTP 503"]
    }
