"""Private memory and CPU of the server's Ray processes, found by actor class.

USS (psutil's ``memory_full_info().uss``) is the memory a process alone holds: what would
be freed if it exited.  Reading it parses ``/proc/<pid>/smaps`` (a few ms per process), so
callers on an event loop sample from a thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

import psutil

from . import ray_internals

SESSION_ACTOR = "SessionHost"


def actor_pids(class_suffix: str) -> list[int]:
    """Pids of the live actors whose class name ends with ``class_suffix`` (Serve replicas
    are named ``ServeReplica:<app>:<deployment>``)."""
    return [
        a["Pid"]
        for a in ray_internals.live_actors()
        if a.get("ActorClassName", "").endswith(class_suffix) and a.get("Pid")
    ]


def session_host_pids() -> list[int]:
    return actor_pids(SESSION_ACTOR)


def uss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().uss
        except psutil.Error:
            pass
    return total / 2**20


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    return {pid: cpu_s([pid]) for pid in pids}


def sample_uss(groups: dict[str, str]) -> dict[str, dict]:
    """Per group (``name → actor class suffix``): USS (MiB), process count and each
    process's CPU seconds so far."""
    out = {}
    for name, suffix in groups.items():
        pids = actor_pids(suffix)
        out[name] = {"uss_mb": uss_mb(pids), "processes": len(pids), "cpu_s": cpu_by_pid(pids)}
    return out


class CpuMeter:
    """CPU seconds a changing set of processes used between ``first`` and ``last`` sample:
    a process that appears counts from zero (its start-up included), one that disappears
    counts up to its last sample."""

    def __init__(self) -> None:
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._started = False

    def add(self, cpu: dict[int, float]) -> None:
        for pid, seconds in cpu.items():
            self._first.setdefault(pid, seconds if not self._started else 0.0)
            self._last[pid] = seconds
        self._started = True

    def used_s(self) -> float:
        return sum(self._last[p] - self._first[p] for p in self._last)


def flatness(
    values: list[float], *, min_band_mb: float = 8.0, rel_band: float = 0.02
) -> dict[str, float | bool | None]:
    """Is a memory series flat?  The last third's mean against the middle third's (the
    first third is warm-up), and a least-squares slope per sample over the last two thirds.

    "Flat" = the change is within a noise band: the largest of three times the
    sample-to-sample noise (the standard deviation of successive differences / √2, which a
    slow trend does not inflate), ``rel_band`` of the middle third's mean and
    ``min_band_mb`` (USS moves by a few MiB as allocator arenas and GC generations come and go)."""
    import itertools
    import math

    from .stats import line, mean, pstdev

    n = len(values)
    if n < 6:
        return {
            "flat": None,
            "middle_mb": None,
            "last_mb": None,
            "change_mb": None,
            "band_mb": None,
            "slope_mb_per_sample": None,
        }
    middle, last, tail = values[n // 3 : 2 * n // 3], values[2 * n // 3 :], values[n // 3 :]
    m_mean, l_mean = mean(middle) or 0.0, mean(last) or 0.0
    noise = pstdev([b - a for a, b in itertools.pairwise(tail)]) / math.sqrt(2)
    band = max(3 * noise, rel_band * m_mean, min_band_mb)
    slope = (line(range(len(tail)), tail) or (0.0, 0.0))[0]
    return {
        "flat": abs(l_mean - m_mean) <= band,
        "middle_mb": m_mean,
        "last_mb": l_mean,
        "change_mb": l_mean - m_mean,
        "band_mb": band,
        "slope_mb_per_sample": slope,
    }


# ----------------------------------------------------------------------------- roles

# A server process's role, by what its command line (Ray's process title) names: the API
# tier (the gateway and the session hosts), the inference emulator (standing in for
# accelerators, not API cost), and Ray's own processes (raylet, GCS, agents, the Serve
# controller, idle workers: whatever else the embedded Ray started).
ROLES = ("gateway", "session_host", "inference", "ray")
# An idle window (s) holding each process's periodic metrics export once: every Ray process
# exports every 10 s (Ray's ``metrics_report_interval_ms``), the dashboard agent ingesting
# them at once, so a shorter window reads high or low by whether it holds that moment.
IDLE_WINDOW_S = 10.0
_ROLE_MARKS = (("Gateway", "gateway"), (SESSION_ACTOR, "session_host"), ("InferenceDeployment", "inference"))


def role_of(cmdline: str) -> str:
    """``gateway``, ``session_host``, ``inference`` or ``ray`` for a server process's command line."""
    for mark, role in _ROLE_MARKS:
        if mark in cmdline:
            return role
    return "ray"


def server_processes(root: int | None = None, exclude: tuple[int, ...] = ()) -> dict[int, str]:
    """Every process below ``root`` (default: this one, the embedded Ray's driver), pid →
    role; ``exclude`` (e.g. a reference server this process started) left out."""
    out: dict[int, str] = {}
    for child in psutil.Process(root).children(recursive=True):
        if child.pid in exclude:
            continue
        try:
            out[child.pid] = role_of(" ".join(child.cmdline()))
        except psutil.Error:
            continue
    return out


def schedstat_s(pid: int) -> tuple[float, float] | None:
    """Seconds so far of ``pid``'s live threads (threads that ended are not counted): their
    run time, in nanoseconds' precision, and their run-queue wait (runnable, waiting for a
    CPU) — the first two fields of ``/proc/<pid>/task/*/schedstat``, each thread's file read
    once.  ``None`` when the process is gone."""
    run = wait = 0
    task = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task)
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"{task}/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
            run, wait = run + int(fields[0]), wait + int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return run / 1e9, wait / 1e9


def run_and_wait_s(pid: int) -> tuple[float, float] | None:
    """``pid``'s CPU seconds so far, from its live threads' ``schedstat`` (nanoseconds'
    precision, where ``cpu_s`` counts the kernel's 10 ms ticks; ``cpu_s`` where it reads 0),
    and its run-queue wait so far (runnable, waiting for a CPU), each thread's file read
    once; ``None`` when the process is gone."""
    stat = schedstat_s(pid)
    if stat is None:
        return None
    return (stat[0] or cpu_s([pid]), stat[1])


def cpu_precise_s(pid: int) -> float:
    """CPU seconds so far of ``pid``'s live threads (:func:`run_and_wait_s`); ``cpu_s`` when
    it is gone."""
    stat = run_and_wait_s(pid)
    return stat[0] if stat else cpu_s([pid])


def titles(procs: dict[int, str]) -> dict[int, str]:
    """Each process's short title: a Ray worker's ``ray::Name`` (without the method it
    runs), else its executable's or script's name (``raylet``, ``gcs_server``, ``monitor.py``)."""
    out = {}
    for pid in procs:
        try:
            cmd = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if not cmd:
            continue
        if cmd[0].startswith("ray::"):
            out[pid] = cmd[0].split(".")[0].split(" ")[0]
        else:
            script = next((os.path.basename(a) for a in cmd[1:] if a.endswith(".py")), None)
            out[pid] = script or os.path.basename(cmd[0])
    return out


def by_role(
    stats: dict[int, tuple[float, float]], procs: dict[int, str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Each role's processes' CPU seconds and run-queue wait (``stats``: pid → both, as
    :func:`run_and_wait_s`); a label that is not a role (e.g. a node's name) is summed the
    same way."""
    groups = [*ROLES, *procs.values()]
    cpu, wait = dict.fromkeys(groups, 0.0), dict.fromkeys(groups, 0.0)
    for pid, (run_s, wait_s) in stats.items():
        cpu[procs[pid]] += run_s
        wait[procs[pid]] += wait_s
    return cpu, wait


def schedstat_by_role(procs: dict[int, str]) -> tuple[dict[str, float], dict[str, float]]:
    """Each role's processes' CPU seconds so far and run-queue wait so far
    (:func:`run_and_wait_s`); a process gone counts nothing (its group is there, at 0)."""
    return by_role({pid: stat for pid in procs if (stat := run_and_wait_s(pid))}, procs)


def cpu_by_role(procs: dict[int, str]) -> dict[str, float]:
    """CPU seconds so far of each role's processes (:func:`schedstat_by_role`)."""
    return schedstat_by_role(procs)[0]


def role_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """``after - before`` per role, in ms."""
    return {role: (after.get(role, 0.0) - before.get(role, 0.0)) * 1000 for role in after}


def role_changes(procs: dict[int, str]) -> dict[int, str]:
    """The processes of ``procs`` whose role their command line names now differs from
    theirs (an idle Ray worker that became a session host), with the new one."""
    out = {}
    for pid, role in procs.items():
        try:
            now = role_of(" ".join(psutil.Process(pid).cmdline()))
        except psutil.Error:
            continue
        if now != role:
            out[pid] = now
    return out


def started_below(known: Iterable[int], fresh: Iterable[int]) -> dict[int, str]:
    """Of the processes ``fresh``, those started below one of ``known`` (a worker the raylet
    started), pid → role."""
    known = set(known)
    out = {}
    for pid in fresh:
        try:
            proc = psutil.Process(pid)
            if any(parent.pid in known for parent in proc.parents()):
                out[pid] = role_of(" ".join(proc.cmdline()))
        except psutil.Error:
            continue
    return out


def live_pids() -> set[int]:
    return {int(name) for name in os.listdir("/proc") if name.isdigit()}


WAIT = "wait:"  # a sample's key prefix for a group's run-queue wait (s)


class CpuSampler:
    """CPU seconds so far of each group of processes (``procs``: pid → group, a role or any
    label), sampled every ``period_s`` in a thread of the driver while a run goes on, once
    more when it stops; with ``waits`` also each group's run-queue wait so far (keys
    ``wait:<group>``).  ``samples``: (time.time(), seconds so far by key).

    ``follow`` (``procs`` are a server's processes by role): a process started below them
    during the run (a session host the gateway's pool starts) is counted from the sample
    that first sees it, and each process is counted under the role its command line names
    when the run stops (an idle Ray worker that became a session host counts as one
    throughout).  ``read`` (pid → CPU and run-queue wait seconds so far, ``None`` once gone)
    and ``clock`` are the sampler's seams.

        with CpuSampler({pid: "host", ...}, 0.05) as sampler:
            ...  # the load
        sampler.cores(t0, t1)  # {"host": 0.42, ...}
    """

    def __init__(
        self,
        procs: dict[int, str],
        period_s: float,
        *,
        waits: bool = False,
        follow: bool = False,
        read: Callable[[int], tuple[float, float] | None] = run_and_wait_s,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.procs = dict(procs)
        self.period_s = period_s
        self.waits = waits
        self._follow = follow
        self._read, self._clock = read, clock
        self._seen = live_pids() if follow else set()
        self._raw: list[tuple[float, dict[int, tuple[float, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        """One pass over the processes' threads (this thread runs beside the load it measures)."""
        if self._follow:
            pids = live_pids()
            if fresh := pids - self._seen:
                self.procs.update(started_below(self.procs, fresh))
            self._seen = pids
        now, read = self._clock(), self._read
        self._raw.append((now, {pid: stat for pid in list(self.procs) if (stat := read(pid))}))

    @property
    def samples(self) -> list[tuple[float, dict[str, float]]]:
        raw = list(self._raw)  # then the processes they name (the sampler's thread adds to both)
        out, procs = [], self.procs.copy()
        for t, stats in raw:
            cpu, wait = by_role(stats, procs)
            if self.waits:
                cpu.update({f"{WAIT}{role}": s for role, s in wait.items()})
            out.append((t, cpu))
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period_s)
        self.sample()

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._follow:
            self.procs.update(role_changes(self.procs))

    def cores(self, t0: float, t1: float) -> dict[str, float]:
        """Each group's cores (CPU seconds / wall seconds) between the first sample at or
        after ``t0`` and the last at or before ``t1`` (0 with fewer than two samples)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        groups = sorted(set(self.procs.values()))
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return dict.fromkeys(groups, 0.0)
        (a, ca), (b, cb) = inside[0], inside[-1]
        return {g: (cb.get(g, 0.0) - ca.get(g, 0.0)) / (b - a) for g in groups}


def settle(
    procs: dict[int, str], idle_ms_per_s: float, *, window_s: float = 1.0, timeout_s: float = 15.0
) -> float:
    """Wait until the server's processes are back at their idle CPU rate (a ``window_s``
    window within 25 % or 10 ms/s of ``idle_ms_per_s``, all processes), at most ``timeout_s``;
    the last window's rate (ms of CPU a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        t0, before = time.perf_counter(), sum(cpu_precise_s(pid) for pid in procs)
        time.sleep(window_s)
        rate = (sum(cpu_precise_s(pid) for pid in procs) - before) * 1000 / (time.perf_counter() - t0)
        if rate <= max(idle_ms_per_s * 1.25, idle_ms_per_s + 10) or time.monotonic() > deadline:
            return rate
