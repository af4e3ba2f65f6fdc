"""Who ran on the machine's cores and who waited for one, every few milliseconds: every
process's run time and run-queue wait, from the scheduler's own counters.

    python -m investigations.core_sampler --out /tmp/trace.npz [--interval-ms 4] [--seconds 300]

Runs until ``--seconds`` pass or it is sent SIGTERM/SIGINT, then writes the trace.  Each
``--full-scan-s`` (1) it reads ``/proc/<pid>/task/<tid>/schedstat`` of every task of every
process on the machine (run ns, run-queue wait ns) and ``/proc/<pid>/stat``; every
``--interval-ms`` between, it re-reads only the tasks that ran since the scan before (kept
open, read with ``pread``): a task that slept a whole second and then wakes is seen at the
next full scan, its run and wait counted there.  Each process's figures are the sums over
its tasks (a task that ended keeps its last reading); what a cold task ran in the second
before a full scan is kept apart, in ``late_run_ns``/``late_wait_ns`` (per pid, over the
whole trace), since it cannot be placed in time.  It runs itself at real-time
priority (``SCHED_FIFO``, where allowed; else ``nice -10``) so that its own wake-ups land
on time, and records how late each one was: a late sample is one the machine kept from it.

The trace (``numpy.savez``): ``t`` (time.time() of each sample), ``late_ms``, ``pids``,
``run_ns`` and ``wait_ns`` (samples × pids, cumulative, as last read), ``cpu_ticks`` (the
machine's ``/proc/stat`` CPU line at each sample: user … steal), and ``meta`` (JSON:
each pid's title, parent, working directory, first seen; the sampler's own CPU).
:mod:`investigations.core_attribution` lines a run's slowest turns up with it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any


def title(pid: int) -> str:
    """``ray::<Actor>`` for a Ray worker, the script's name for a Python process, else the
    executable's (``raylet``, ``gcs_server``); ``?`` for a process gone."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    if not argv[0]:  # a kernel thread
        try:
            return "[" + Path(f"/proc/{pid}/comm").read_text().strip() + "]"
        except OSError:
            return "?"
    first = argv[0].decode(errors="replace")
    if first.startswith("ray::"):
        return first.split()[0].split(".")[0]
    args = [a.decode(errors="replace") for a in argv if a]
    script = next((os.path.basename(a) for a in args[1:] if a.endswith(".py")), None)
    if script is None and "-m" in args[1:-1]:
        script = args[args.index("-m") + 1]
    if script is None and any(a.startswith("from multiprocessing") for a in args):
        script = "multiprocessing-child"
    return script or os.path.basename(first) or "?"


def describe(pid: int) -> dict[str, Any]:
    """A process's title, parent and working directory (whose run it is)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    except (OSError, ValueError):
        ppid, comm = 0, "?"
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = "?"
    return {"title": title(pid), "comm": comm, "ppid": ppid, "cwd": cwd}


RENAMED = ("ray::IDLE", "?")  # titles a process may still change (re-read at each full scan)


def cpu_times(fd: int) -> list[int]:
    """The machine's CPU time so far (``/proc/stat``'s first line, clock ticks): user, nice,
    system, idle, iowait, irq, softirq, steal."""
    return [int(x) for x in os.pread(fd, 256, 0).split(b"\n", 1)[0].split()[1:9]]


def read_schedstat(fd: int) -> tuple[int, int] | None:
    try:
        raw = os.pread(fd, 128, 0)
    except OSError:
        return None
    parts = raw.split()
    if len(parts) < 2:
        return None
    return int(parts[0]), int(parts[1])


class Sampler:
    """The cumulative run and wait of every process, kept per task."""

    def __init__(self) -> None:
        self.fds: dict[tuple[int, int], int] = {}  # (pid, tid) -> open schedstat
        self.last: dict[tuple[int, int], tuple[int, int]] = {}
        self.hot: list[tuple[int, int]] = []
        self.at_scan: dict[tuple[int, int], tuple[int, int]] = {}  # each task's reading at the last full scan
        self.meta: dict[int, dict[str, Any]] = {}
        self.pid_index: dict[int, int] = {}
        self.run: list[int] = []  # cumulative ns per pid, in ``pid_index`` order (timely reads)
        self.wait: list[int] = []
        self.late_run: list[int] = []  # cold tasks' catch-ups at full scans
        self.late_wait: list[int] = []
        self.me = os.getpid()

    def _set(self, key: tuple[int, int], now: tuple[int, int], *, timely: bool) -> None:
        """Keep a task's reading and its process's sums.
        A ``timely`` reading (the task was read at the tick before) goes to ``run``/``wait``;
        a cold task's catch-up at a full scan (it ran at some time in the second before) to
        ``late_run``/``late_wait``; a task's first reading only sets its base."""
        before = self.last.get(key)
        self.last[key] = now
        if before is None or now == before:  # new (its first reading is its base), or idle
            return
        i = self.pid_index[key[0]]
        if timely:
            self.run[i] += now[0] - before[0]
            self.wait[i] += now[1] - before[1]
        else:
            self.late_run[i] += now[0] - before[0]
            self.late_wait[i] += now[1] - before[1]

    def _open(self, key: tuple[int, int]) -> int | None:
        fd = self.fds.get(key)
        if fd is None:
            try:
                fd = os.open(f"/proc/{key[0]}/task/{key[1]}/schedstat", os.O_RDONLY)
            except OSError:
                return None
            self.fds[key] = fd
        return fd

    def full_scan(self) -> None:
        """Every task of every process: new ones opened, the ones that ran since the last
        scan made the hot set, the ones gone closed (their last reading kept)."""
        seen: set[tuple[int, int]] = set()
        hot: list[tuple[int, int]] = []
        was_hot = set(self.hot)
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            m = self.meta.get(pid)
            if m is not None and (m["title"] in RENAMED or m["title"].endswith("_worker.py")):
                m.update(describe(pid))  # a Ray worker that took its actor's title since
            if m is None:
                self.meta[pid] = {**describe(pid), "first_seen": time.time()}
                self.pid_index[pid] = len(self.pid_index)
                self.run.append(0)
                self.wait.append(0)
                self.late_run.append(0)
                self.late_wait.append(0)
            for t in tids:
                key = (pid, int(t))
                fd = self._open(key)
                if fd is None:
                    continue
                now = read_schedstat(fd)
                if now is None:
                    continue
                seen.add(key)
                self._set(key, now, timely=key in was_hot)
                if now != self.at_scan.get(key):  # ran or waited in the second since the last scan
                    hot.append(key)
                self.at_scan[key] = now
        for key in [k for k in self.fds if k not in seen]:
            os.close(self.fds.pop(key))
            self.at_scan.pop(key, None)
        self.hot = hot

    def tick(self) -> None:
        for key in self.hot:
            fd = self.fds.get(key)
            if fd is None:
                continue
            now = read_schedstat(fd)
            if now is not None:
                self._set(key, now, timely=True)


def raise_priority() -> str:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return "SCHED_FIFO 10"
    except (OSError, AttributeError):
        try:
            os.nice(-10)
            return "nice -10"
        except OSError:
            return "default"


def record(out: Path, interval_s: float, seconds: float, full_scan_s: float) -> dict[str, Any]:
    import numpy as np

    priority = raise_priority()
    stop = [False]

    def halt(*_: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, halt)
    signal.signal(signal.SIGINT, halt)
    s = Sampler()
    s.full_scan()  # every task's base
    times: list[float] = []
    late: list[float] = []
    runs: list[list[int]] = []
    waits: list[list[int]] = []
    machine: list[list[int]] = []
    stat_fd = os.open("/proc/stat", os.O_RDONLY)
    cpu0 = time.process_time()
    start = time.monotonic()
    next_scan = start
    due = start
    while not stop[0] and time.monotonic() - start < seconds:
        now = time.monotonic()
        late.append((now - due) * 1000)
        if now >= next_scan:
            s.full_scan()
            next_scan = now + full_scan_s
        else:
            s.tick()
        times.append(time.time())
        runs.append(s.run.copy())
        waits.append(s.wait.copy())
        machine.append(cpu_times(stat_fd))
        due += interval_s
        if due < time.monotonic():  # fell behind: the next one is due an interval from now
            due = time.monotonic() + interval_s
        time.sleep(max(0.0, due - time.monotonic()))
    own_cpu_s = time.process_time() - cpu0
    late_run = np.array(s.late_run, dtype=np.int64)
    late_wait = np.array(s.late_wait, dtype=np.int64)
    for pid, seen in s.meta.items():  # the titles the processes ended with
        if os.path.exists(f"/proc/{pid}"):
            last = describe(pid)
            if last["title"] != "?":
                seen.update(last)
    width = len(s.pid_index)
    run_ns = np.zeros((len(runs), width), dtype=np.int64)
    wait_ns = np.zeros((len(runs), width), dtype=np.int64)
    for i, (r, w) in enumerate(zip(runs, waits, strict=True)):
        run_ns[i, : len(r)] = r
        wait_ns[i, : len(w)] = w
    pids = sorted(s.pid_index, key=s.pid_index.__getitem__)
    meta = {
        "priority": priority,
        "interval_ms": interval_s * 1000,
        "full_scan_s": full_scan_s,
        "sampler_pid": s.me,
        "sampler_cpu_s": round(own_cpu_s, 3),
        "wall_s": round(time.monotonic() - start, 3),
        "processes": {str(p): s.meta[p] for p in pids},
    }
    np.savez(
        out,
        t=np.array(times),
        late_ms=np.array(late),
        pids=np.array(pids, dtype=np.int64),
        run_ns=run_ns,
        wait_ns=wait_ns,
        cpu_ticks=np.array(machine, dtype=np.int64),
        late_run_ns=late_run,
        late_wait_ns=late_wait,
        meta=np.array(json.dumps(meta)),
    )
    return meta


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--interval-ms", type=float, default=4.0)
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--full-scan-s", type=float, default=1.0)
    a = p.parse_args()
    import numpy as np

    meta = record(a.out, a.interval_ms / 1000, a.seconds, a.full_scan_s)
    late = np.load(a.out)["late_ms"]
    print(
        f"wrote {a.out}: {len(late)} samples, {len(meta['processes'])} processes, "
        f"the sampler's CPU {meta['sampler_cpu_s']} s over {meta['wall_s']} s ({meta['priority']}), "
        f"lateness p50 {np.percentile(late, 50):.2f} / p99 {np.percentile(late, 99):.2f} / max {late.max():.1f} ms"
    )


if __name__ == "__main__":
    main()
