"""The runner in client processes of this machine (the single-machine kinds).

Each process (``multiprocessing``'s spawn) runs a :class:`~bench.runner.worker.LoadWorker` in
its own event loop and answers the driver's calls over a pipe.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from typing import Any

from .drive import LoadRun, drive, shares
from .model import LoadResult, LoadSpec, TurnRecord

JOIN_TIMEOUT_S = 30.0


def _process_main(spec: LoadSpec, loops: list[int], conn: Any) -> None:
    from .worker import LoadWorker

    async def main() -> None:
        worker = LoadWorker(spec, loops)
        while True:
            method, args = await asyncio.to_thread(conn.recv)
            try:
                answer = await getattr(worker, method)(*args)
            except Exception as exc:  # noqa: BLE001 - handed to the driver, which raises it
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
                return
            conn.send(("ok", answer))
            if method == "finish":
                return

    asyncio.run(main())


class ProcessFleet:
    def __init__(self, spec: LoadSpec, processes: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Any] = []
        self.procs: list[Any] = []
        for share in shares(spec.loops, processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_process_main, args=(spec, share, child), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)

    def call(self, method: str, *args: Any) -> list[Any]:
        for p in self.pipes:
            p.send((method, args))
        answers = [p.recv() for p in self.pipes]
        failed = [a[1] for a in answers if a[0] == "error"]
        if failed:
            raise RuntimeError(f"a client process failed in {method}: {failed[0]}")
        return [a[1] for a in answers]

    def close(self, now: bool = False) -> None:
        """Wait for the processes to end (each at most :data:`JOIN_TIMEOUT_S`); ``now``:
        end them at once (the run failed or was interrupted)."""
        for proc in self.procs:
            proc.join(0 if now else JOIN_TIMEOUT_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(JOIN_TIMEOUT_S)


def run_local(
    spec: LoadSpec, processes: int = 1, *, on_records: Callable[[list[TurnRecord]], None] | None = None
) -> LoadResult:
    """Run ``spec`` in ``processes`` client processes of this machine (loops dealt
    round-robin); the records and each process's own figures."""
    fleet = ProcessFleet(spec, processes)
    try:
        result = drive(fleet, spec, on_records=on_records)
    except BaseException:
        fleet.close(now=True)
        raise
    fleet.close()
    return result


def start_local(spec: LoadSpec, processes: int = 1) -> LoadRun:
    """Start ``spec`` in ``processes`` client processes of this machine and return at once:
    the run goes on until :meth:`LoadRun.stop` (at the latest until the spec's window ends)."""
    fleet = ProcessFleet(spec, processes)
    return LoadRun(fleet, spec, lambda now: fleet.close(now=now))
