"""Child processes that each run a Ray of their own — ``responses-ws serve`` as an operator
runs it, a ``ray start`` cluster, the multi-node scenario — started together, in the
background, at the first test that needs one (the ``children`` fixture, tests/conftest.py).

A Ray takes ~20 s of CPU to start and stop, a good part of it waiting, so the starts
overlap each other and the tests that run meanwhile.  They are started one at a time, each
as soon as the previous one's Ray is up, never at the same moment: a raylet gives its
agents 15 s to start and otherwise exits ("The current node timed out during startup"),
which several Rays starting at once on a loaded 2-core machine miss.

Each child is the object its start function returns, with ``ray_up()`` (its Ray runs, or
it has exited), ``exited()`` and ``stop()``; the test that uses it stops it when it is done
with it, and the launcher's :meth:`Launcher.close` stops what still runs.

With parallel workers (``make test``: pytest-xdist) another worker starts a Ray of its own
too: every Ray start of the suite, the embedded one's included, holds :func:`ray_start_lock`
(a file lock all the workers share) until that Ray is up."""

from __future__ import annotations

import contextlib
import fcntl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import yaml

from .serve_process import ServeProcess, start_serve
from .server import busy_profiles


class Child(Protocol):
    def ray_up(self) -> bool: ...

    def exited(self) -> bool: ...

    def stop(self) -> object: ...


@contextlib.contextmanager
def ray_start_lock(path: Path) -> Iterator[None]:
    """Held while one Ray of the suite starts: the workers' starts take turns."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Launcher:
    """Starts ``starts`` in their order on a thread of its own, the next once the previous
    child's Ray is up (or after ``up_timeout_s``: its test reports what went wrong), each
    start holding the suite's :func:`ray_start_lock` at ``lock``."""

    def __init__(self, starts: dict[str, Callable[[], Child]], lock: Path, up_timeout_s: float = 120) -> None:
        self._starts = dict(starts)
        self._lock = lock
        self._children: dict[str, Child] = {}
        self._failed: dict[str, BaseException] = {}
        self._started = {name: threading.Event() for name in starts}
        self._closing = threading.Event()
        self._up_timeout_s = up_timeout_s
        self._thread = threading.Thread(target=self._run, name="children", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for name, start in self._starts.items():
            if self._closing.is_set():
                break
            with ray_start_lock(self._lock):
                try:
                    child = self._children[name] = start()
                except Exception as exc:  # noqa: BLE001 - raised again to the test that asks for this child
                    self._failed[name] = exc
                    continue
                finally:
                    self._started[name].set()
                deadline = time.monotonic() + self._up_timeout_s
                while not (child.ray_up() or self._closing.is_set() or time.monotonic() > deadline):
                    time.sleep(0.2)

    def get(self, name: str) -> Child:
        """The child ``name``, once it has been started."""
        self._started[name].wait()
        if name in self._failed:
            raise self._failed[name]
        return self._children[name]

    def running(self, name: str) -> Child:
        """The child ``name``; a new one, started now, if the last one has exited (a test
        stopped it)."""
        child = self.get(name)
        if child.exited():
            child = self._children[name] = self._starts[name]()
        return child

    def close(self) -> None:
        self._closing.set()
        self._thread.join()
        for child in self._children.values():
            try:
                child.stop()
            except AssertionError:  # a serve process that hung, killed: its test has reported
                pass


# ---------------------------------------------------------------- the suite's serve processes


def busy_server(directory: Path, args: list[str], env: dict[str, str] | None = None) -> ServeProcess:
    """``responses-ws serve --config busy.yaml ARGS`` (:func:`busy_profiles`) started in
    ``directory``."""
    (directory / "busy.yaml").write_text(yaml.safe_dump({"inference": {"profiles": busy_profiles()}}))
    return start_serve(["--config", "busy.yaml", *args], cwd=directory, env=env)
