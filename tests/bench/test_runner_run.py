"""The load runner's run-until-stopped (bench/runner/drive.py ``LoadRun``): the window ends when
the driver says, at the latest at the spec's deadline, and the workers end either way."""

from __future__ import annotations

from typing import Any

import pytest

from bench.runner import ClientStats, LoadRun, LoadSpec
from bench.runner.drive import RELEASE_DELAY_S

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
    assert result.window == (1001.0, 1010.0) and closed == [False]
    # with arrivals every loop connected at its release: the workers' count
    assert result.connected == 2 and result.connects == [(1001.0, 5.0), (1001.5, 7.0)]
    assert result.summary()["failures"] == {"connect:http_503": 1}
    assert run.stop() is result and closed == [False]  # once


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
