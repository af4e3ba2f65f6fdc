"""``responses-ws serve`` in a child process, as an operator runs it: its own working
directory and environment, its terminal output captured to a file, stopped with Ctrl-C
(SIGINT) and, should it hang, killed with its process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from serve.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]


def get_json(url: str, timeout_s: float = 30) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


# The processes a Ray node starts before its raylet has registered (its agents); any other
# ``ray::`` process is a worker, which the raylet starts only once it is up.
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


class ServeProcess:
    def __init__(
        self, proc: subprocess.Popen, url: str, log: Path, args: list[str], env: dict[str, str]
    ) -> None:
        self.proc = proc
        self.url = url
        self.log = log
        self.cwd = log.parent
        self.args = args  # after --port
        self.env = env  # what was set in its environment besides this process's

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def ray_up(self) -> bool:
        """Its Ray has started (a worker runs below it), or it has exited: either way its
        Ray no longer competes with another Ray's start (tests/support/children.py)."""
        if self.exited():
            return True
        try:
            below = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return True
        for proc in below:
            try:
                name = proc.cmdline()[:1]
            except psutil.Error:
                continue
            if name and name[0].startswith("ray::") and not name[0].startswith(RAY_AGENTS):
                return True
        return False

    def wait_ready(self, timeout_s: float = 180) -> None:
        """Until it says it serves (Ctrl-C then stops it in order) and ``/readyz`` is 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"responses-ws serve exited with {self.proc.returncode}:\n{self.output()[-4000:]}"
                )
            try:
                if "responses-ws serving on" in self.output() and get_json(f"{self.url}/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"not ready after {timeout_s:.0f}s:\n{self.output()[-4000:]}")

    def wait_for_line(self, needle: str, timeout_s: float = 30) -> str:
        """The first line of output containing ``needle`` (Ray forwards workers' lines with a
        delay)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.output().splitlines():
                if needle in line:
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} never reached the terminal:\n{self.output()[-4000:]}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 120) -> int:
        """Ctrl-C, then wait for the exit; a process that hangs is killed with its group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired as exc:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise AssertionError(
                    f"responses-ws serve did not stop in {timeout_s:.0f}s:\n{self.output()[-4000:]}"
                ) from exc
        return self.proc.returncode


def start_serve(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, port: int | None = None
) -> ServeProcess:
    """``responses-ws serve --port <port, or a free one> ARGS`` started in ``cwd`` (this
    checkout on its PYTHONPATH, no RAY_ADDRESS: it starts a Ray of its own unless ARGS say
    ``--address``); the caller stops it (:meth:`ServeProcess.stop`)."""
    port = port or free_port()
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [environ.get("PYTHONPATH")])])
    environ.update(env or {})
    log = cwd / f"serve-{port}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "serve.cli", "serve", "--port", str(port), *args],
            cwd=cwd,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ServeProcess(proc, f"http://127.0.0.1:{port}", log, list(args), dict(env or {}))


@contextmanager
def serve_process(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, port: int | None = None
) -> Iterator[ServeProcess]:
    """:func:`start_serve`, stopped on the way out if it still runs."""
    process = start_serve(args, cwd, env, port)
    try:
        yield process
    finally:
        stop_quietly(process)


def stop_quietly(process: ServeProcess) -> None:
    """Stop it if it still runs (a fixture's end: a hang is killed, not reported)."""
    if not process.exited():
        try:
            process.stop()
        except AssertionError:
            pass
