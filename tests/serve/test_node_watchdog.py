"""serve/node_watchdog.py: a node stops its Ray (and what it owns) once the head's GCS has
been gone for the grace, not before, and not while the head comes back within it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from serve.node_watchdog import Seen, Verdict, answers, decide, running, stop_owned, watch
from tests.support.waiting import wait_until


def test_decide_counts_the_grace_from_the_last_answer_or_the_start():
    assert decide(Seen(started_at=0.0), 14.9, grace_s=15) is Verdict.WATCH
    assert decide(Seen(started_at=0.0), 15.0, grace_s=15) is Verdict.STOP  # never answered
    assert decide(Seen(0.0, last_answer_at=100.0), 110.0, grace_s=15) is Verdict.WATCH
    assert decide(Seen(0.0, last_answer_at=100.0), 115.0, grace_s=15) is Verdict.STOP


def run(answers_at: list[bool], grace_s: float = 5.0) -> tuple[bool, float]:
    """The loop on a fake clock (1 s a probe): whether it acted, and when."""
    now = [0.0]
    acted: list[float] = []
    replies = iter(answers_at)
    watch(
        lambda: next(replies, False),
        lambda: acted.append(now[0]),
        grace_s=grace_s,
        interval_s=1.0,
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    return bool(acted), acted[0]


def test_a_head_back_within_the_grace_changes_nothing_one_gone_for_it_stops_the_node():
    # up 3 s, gone 3 s (< grace 5), up 2 s, then gone for good: acts 5 s after the last answer
    acted, at = run([True] * 3 + [False] * 3 + [True] * 2)
    assert acted and at == 7.0 + 5.0


def test_answers_is_a_tcp_connect():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert answers("127.0.0.1", port)
    assert not answers("127.0.0.1", port, timeout_s=0.5)


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]  # a process to stop: its sleep is its life


def test_stop_owned_ends_the_pid_in_each_file(tmp_path: Path):
    proc = subprocess.Popen(SLEEPER)
    try:
        (tmp_path / "redis.pid").write_text(f"{proc.pid}\n")
        (tmp_path / "junk.pid").write_text("not a pid")
        assert stop_owned([tmp_path / "redis.pid", tmp_path / "junk.pid", tmp_path / "missing.pid"]) == [
            proc.pid
        ]
        assert proc.wait(timeout=5) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_command_acts_once_the_port_is_gone(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
    sleeper = subprocess.Popen(SLEEPER)
    (tmp_path / "owned.pid").write_text(str(sleeper.pid))
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "serve.node_watchdog",
                f"--gcs=127.0.0.1:{port}",
                "--grace-s=1",
                "--interval-s=0.2",
                f"--pidfile={tmp_path / 'owned.pid'}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert f"stopped pids [{sleeper.pid}]" in out.stdout
        assert sleeper.wait(timeout=5) == -signal.SIGTERM
        # After the grace (its count, on an injected clock: the decide tests above).
        assert f"head 127.0.0.1:{port} gone for 1s: stopping" in out.stdout
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_a_zombie_counts_as_stopped_and_a_live_process_as_running():
    proc = subprocess.Popen(SLEEPER)
    try:
        assert running(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        wait_until(lambda: not running(proc.pid), 10, "the killed process to stop")  # not reaped: a zombie
        assert proc.poll() == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
