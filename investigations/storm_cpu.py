"""The CPU each server role spends on a crowd's first turns released at once (the storm of
``bench capacity``), per first create: what the storm's p99 is made of on the server side.

    python -m investigations.storm_cpu [--loops 256] [--duration 10] [--no-reference] [--profile DIR] [--out results/storm_cpu.json]

Runs ``responses-ws bench capacity`` (its embedded server) as a child process and samples,
every ``--period`` seconds, the CPU time of every process below it (``/proc/<pid>/stat``,
the whole process, 10 ms ticks, and its part in the kernel), each by its role (:func:`bench.processes.role_of`):
``gateway``, ``session_host``, ``inference``, and ``other`` (Ray's own processes, and the
bench's client processes and reference server, which are below it too).  Then, for each loop
count of the bench's JSON, the CPU of each role over the storm (from the release of the
first turns to the last first turn's answer: the bench's ``storm_end`` and ``storm_s``,
wall-clock times) divided by the first turns.  The bench's own report is printed as it runs.

With ``--profile DIR``, each session host and inference replica is recorded by ``py-spy``
(``record --idle``, ``--rate`` a second, speedscope JSON in ``DIR``) from when it is found to the
bench's end, and each storm's window of the recording is summed up
(:mod:`investigations.storm_profile`: the busiest thread's busy share, its functions'
inclusive and own shares).
"""

from __future__ import annotations

import argparse
import bisect
import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Series = Sequence[tuple[float, float]]  # (wall time, CPU seconds so far), in time order


def cpu_between(series: Series, a: float, b: float) -> float | None:
    """CPU seconds of one process between wall times ``a`` and ``b`` (the samples nearest
    after each); ``None`` unless its samples cover the window."""
    if not series or series[0][0] > a or series[-1][0] < b:
        return None
    times = [t for t, _ in series]

    def at(t: float) -> float:
        return series[min(bisect.bisect_left(times, t), len(series) - 1)][1]

    return at(b) - at(a)


def per_first_create(
    samples: Mapping[int, Series], roles: Mapping[int, str], release: float, end: float, turns: int
) -> dict[str, float]:
    """Each role's CPU ms over ``[release, end]`` per first turn (processes whose samples
    cover the window)."""
    out: dict[str, float] = {}
    for pid, series in samples.items():
        spent = cpu_between(series, release, end)
        if spent is not None:
            out[roles[pid]] = out.get(roles[pid], 0.0) + spent * 1000 / max(1, turns)
    return {role: round(ms, 3) for role, ms in sorted(out.items())}


def _cpu_s(pid: int) -> tuple[float, float] | None:
    """``pid``'s CPU seconds so far, all and in the kernel (utime + stime, stime)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / 100, int(fields[12]) / 100  # USER_HZ ticks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loops", default="256")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--no-reference", action="store_true")
    p.add_argument("--period", type=float, default=0.02, help="seconds between CPU samples")
    p.add_argument("--profile", type=Path, default=None, help="py-spy recordings here (speedscope)")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples a second")
    p.add_argument(
        "--margin", type=float, default=0.25, help="seconds added to each side of a profile's window"
    )
    p.add_argument("--out", type=Path, default=Path("results/storm_cpu.json"))


PROFILED = ("session_host", "inference")


class Recorder:
    """A ``py-spy record`` of one process, from its start to :meth:`stop` (wall times)."""

    def __init__(self, pid: int, role: str, out: Path, rate: int) -> None:
        spy = Path(sys.executable).parent / "py-spy"
        self.role, self.path, self.rate = role, out / f"{role}-{pid}.json", rate
        cmd = [str(spy), "record", "--idle", "-r", str(rate), "-f", "speedscope"]
        self.started = time.time()
        self.proc = subprocess.Popen([*cmd, "-o", str(self.path), "-p", str(pid)], stdout=subprocess.DEVNULL)
        self.stopped = 0.0

    def stop(self) -> None:
        self.stopped = time.time()
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run(args: argparse.Namespace) -> int:
    from bench import results
    from bench.processes import server_processes

    bench_json = args.out.with_suffix(".bench.json")
    cmd = [str(Path(sys.executable).parent / "responses-ws"), "bench", "capacity", "--loops", args.loops]
    cmd += ["--duration", str(args.duration), "--out", str(bench_json)]
    cmd += ["--no-reference"] if args.no_reference else []
    child = subprocess.Popen(cmd)
    samples: dict[int, list[tuple[float, float]]] = {}
    kernel: dict[int, list[tuple[float, float]]] = {}  # the same processes' CPU in the kernel
    roles: dict[int, str] = {}
    scanned = 0.0
    recorders: dict[int, Recorder] = {}
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    while child.poll() is None:
        now = time.time()
        if now - scanned >= 1.0:  # new processes (Ray's workers start their actors late)
            scanned = now
            for pid, role in server_processes(child.pid).items():
                role = "other" if role == "ray" else role
                if roles.get(pid, "other") == "other":  # a worker is named after its actor once it runs it
                    roles[pid] = role
                if args.profile is not None and role in PROFILED and pid not in recorders:
                    recorders[pid] = Recorder(pid, role, args.profile, args.rate)
        for pid in list(roles):
            read = _cpu_s(pid)
            if read is not None:
                samples.setdefault(pid, []).append((now, read[0]))
                kernel.setdefault(pid, []).append((now, read[1]))
        time.sleep(args.period)
    for rec in recorders.values():
        rec.stop()
    if child.returncode != 0:
        print(f"bench capacity exited {child.returncode}", file=sys.stderr)
        return child.returncode
    levels: list[dict[str, Any]] = []
    for level in json.loads(bench_json.read_text())["levels"]:
        first = level["first_turns_ms"]
        release = level["storm_end"] - first["storm_s"]
        cpu = per_first_create(samples, roles, release, level["storm_end"], first["turns"])
        in_kernel = per_first_create(kernel, roles, release, level["storm_end"], first["turns"])
        ref = (level.get("reference") or {}).get("first_turns_ms") or {}
        profiles = {
            f"{rec.role}-{pid}": profile_of(rec, release, level["storm_end"])
            for pid, rec in recorders.items()
        }
        levels.append(
            {
                "loops": level["loops"],
                "storm_p99_ms": first["p99"],
                "reference_storm_p99_ms": ref.get("p99"),
                "storm_s": first["storm_s"],
                "cpu_ms_per_first_create": cpu,
                "of_which_kernel_ms": in_kernel,
                "profiles": profiles,
            }
        )
        print(
            f"{level['loops']} loops: storm p99 {first['p99']} ms (reference {ref.get('p99')}) in "
            f"{first['storm_s']} s; CPU ms per first create by role over the storm: {cpu}, of which "
            f"in the kernel: {in_kernel}"
        )
        for name, prof in profiles.items():
            print(
                f"  {name}: {prof.get('busy')} busy of {prof.get('samples')} samples ({prof.get('thread')})"
            )
            for label, pct in list(prof.get("inclusive", {}).items())[:25]:
                print(f"    {pct:5.1f}% {label}")
    recordings = {
        f"{rec.role}-{pid}": {
            "path": str(rec.path),
            "started": rec.started,
            "stopped": rec.stopped,
            "rate": rec.rate,
        }
        for pid, rec in recorders.items()
    }
    payload = {
        "command": " ".join(cmd),
        "roles_seen": sorted(set(roles.values())),
        "levels": levels,
        "recordings": recordings,
    }
    print(f"wrote {results.write(args.out, payload, args.run)}")
    return 0


def profile_of(rec: Recorder, a: float, b: float) -> dict[str, Any]:
    """The storm window ``[a, b]`` of ``rec``'s recording, summed up (empty if it has none)."""
    from investigations.storm_profile import summary

    try:
        speedscope = json.loads(rec.path.read_text())
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
    kept = max((len(p["samples"]) for p in speedscope["profiles"]), default=0)
    rate = kept / (rec.stopped - rec.started) if rec.stopped > rec.started else float(rec.rate)
    return {"rate_kept": round(rate, 1), **summary(speedscope, rec.stopped, rate, a, b)}


if __name__ == "__main__":
    from investigations import main

    raise SystemExit(main("investigations.storm_cpu"))
