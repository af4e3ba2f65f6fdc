"""The CPU each server role spends on a crowd's first turns released at once (the storm of
``bench capacity``), per first create: what the storm's p99 is made of on the server side.

    python -m investigations.storm_cpu [--loops 256] [--duration 10] [--no-reference] [--out results/storm_cpu.json]

Runs ``responses-ws bench capacity`` (its embedded server) as a child process and samples,
every ``--period`` seconds, the CPU time of every process below it (``/proc/<pid>/stat``,
the whole process, 10 ms ticks), each by its role (:func:`bench.processes.role_of`):
``gateway``, ``session_host``, ``inference``, and ``other`` (Ray's own processes, and the
bench's client processes and reference server, which are below it too).  Then, for each loop
count of the bench's JSON, the CPU of each role over the storm (from the release of the
first turns to the last first turn's answer: the bench's ``storm_end`` and ``storm_s``,
wall-clock times) divided by the first turns.  The bench's own report is printed as it runs.
"""

from __future__ import annotations

import argparse
import bisect
import json
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


def _cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, USER_HZ ticks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loops", default="256")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--no-reference", action="store_true")
    p.add_argument("--period", type=float, default=0.02, help="seconds between CPU samples")
    p.add_argument("--out", type=Path, default=Path("results/storm_cpu.json"))


def run(args: argparse.Namespace) -> int:
    from bench import results
    from bench.processes import server_processes

    bench_json = args.out.with_suffix(".bench.json")
    cmd = [str(Path(sys.executable).parent / "responses-ws"), "bench", "capacity", "--loops", args.loops]
    cmd += ["--duration", str(args.duration), "--out", str(bench_json)]
    cmd += ["--no-reference"] if args.no_reference else []
    child = subprocess.Popen(cmd)
    samples: dict[int, list[tuple[float, float]]] = {}
    roles: dict[int, str] = {}
    scanned = 0.0
    while child.poll() is None:
        now = time.time()
        if now - scanned >= 1.0:  # new processes (Ray's workers start their actors late)
            scanned = now
            for pid, role in server_processes(child.pid).items():
                role = "other" if role == "ray" else role
                if roles.get(pid, "other") == "other":  # a worker is named after its actor once it runs it
                    roles[pid] = role
        for pid in list(roles):
            cpu = _cpu_s(pid)
            if cpu is not None:
                samples.setdefault(pid, []).append((now, cpu))
        time.sleep(args.period)
    if child.returncode != 0:
        print(f"bench capacity exited {child.returncode}", file=sys.stderr)
        return child.returncode
    levels: list[dict[str, Any]] = []
    for level in json.loads(bench_json.read_text())["levels"]:
        first = level["first_turns_ms"]
        release = level["storm_end"] - first["storm_s"]
        cpu = per_first_create(samples, roles, release, level["storm_end"], first["turns"])
        ref = (level.get("reference") or {}).get("first_turns_ms") or {}
        levels.append(
            {
                "loops": level["loops"],
                "storm_p99_ms": first["p99"],
                "reference_storm_p99_ms": ref.get("p99"),
                "storm_s": first["storm_s"],
                "cpu_ms_per_first_create": cpu,
            }
        )
        print(
            f"{level['loops']} loops: storm p99 {first['p99']} ms (reference {ref.get('p99')}) in "
            f"{first['storm_s']} s; CPU ms per first create by role over the storm: {cpu}"
        )
    payload = {"command": " ".join(cmd), "roles_seen": sorted(set(roles.values())), "levels": levels}
    print(f"wrote {results.write(args.out, payload, args.run)}")
    return 0


if __name__ == "__main__":
    from investigations import main

    raise SystemExit(main("investigations.storm_cpu"))
