"""The slowest 1 % of a `bench capacity` run's steady turns, by process: which processes ran
on the machine's cores and which waited for one while each was on the wire.

    python -m investigations.core_attribution run --out-dir /tmp/attr [--interval-ms 4] [-- BENCH ARGS]
    python -m investigations.core_attribution analyze --trace T.npz --capacity C.json [--level 256]

``run`` starts :mod:`investigations.core_sampler` (every process's run time and run-queue
wait, from ``/proc/<pid>/task/*/schedstat``, every ``--interval-ms``, at real-time
priority), runs ``responses-ws bench capacity --loops 256 --no-reference --out
OUT/capacity.json`` (BENCH ARGS replace those) beside it, stops it, and analyses the two:

* each process is put in a group: the run's own (a descendant of the bench process:
  ``session_host``, ``gateway``, ``inference``, ``serve_controller``, ``raylet``,
  ``gcs_server``, ``dashboard`` (its head process and agents), ``log_monitor``, ``monitor``,
  ``ray_worker`` (idle and other Ray workers), ``clients`` (the load runner's processes),
  ``bench`` (the driver itself)), the ``sampler``, and everything else by its title and
  working directory (``other:<title>@<dir>``: another helper's run says so);
* the slow turns (the level's ``steady_tail.turns_at``: sent, client turn ms, non-model
  ms) are merged into bursts (windows that overlap or lie within ``--gap-ms``);
* for each burst and for all of them together: each group's run and wait ms in the window,
  against what it ran and waited at its steady-window rate over the same length, how busy
  the two cores were, and how late the sampler's own wake-ups were.

Writes ``OUT/attribution.json`` (``analyze``: ``--out``) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

CORES = os.cpu_count() or 1

# a run's own process, by its title (first match wins)
GROUPS: tuple[tuple[str, str], ...] = (
    ("SessionHost", "session_host"),
    ("Gateway", "gateway"),
    ("InferenceDeployment", "inference"),
    ("ServeController", "serve_controller"),
    ("ProxyActor", "serve_proxy"),
    ("raylet", "raylet"),
    ("gcs_server", "gcs_server"),
    ("Dashboard", "dashboard"),
    ("dashboard", "dashboard"),
    ("RuntimeEnvAgent", "dashboard"),
    ("agent", "dashboard"),
    ("log_monitor", "log_monitor"),
    ("monitor", "monitor"),
    ("ray::", "ray_worker"),
    ("default_worker", "ray_worker"),
    ("multiprocessing", "clients"),
)


def descendants(meta: dict[str, dict[str, Any]], root: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for pid, m in meta.items():
        kids.setdefault(int(m["ppid"]), []).append(int(pid))
    out: set[int] = set()
    todo = [root]
    while todo:
        p = todo.pop()
        for k in kids.get(p, []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def group_of(pid: int, m: dict[str, Any], own: set[int], bench_pid: int, sampler_pid: int) -> str:
    """The group a process's figures are summed in (the module's docstring)."""
    if pid == sampler_pid:
        return "sampler"
    if pid == bench_pid:
        return "bench"
    if pid in own:
        for mark, group in GROUPS:
            if mark in m["title"]:
                return group
        return "own:" + m["title"]
    where = m.get("cwd", "?")
    where = where.split("/work/wt/")[-1].split("/")[0] if "/work/wt/" in where else where
    return f"other:{m['title']}@{where}"


def at(t: Sequence[float], x: Sequence[Sequence[int]], when: float) -> Sequence[int]:
    """The cumulative counters at ``when`` (the last sample at or before it)."""
    return x[max(0, bisect_right(t, when) - 1)]


def window(trace: dict[str, Any], a: float, b: float) -> tuple[list[float], list[float]]:
    """Run and wait ms of every pid between ``a`` and ``b``."""
    t = trace["t"]

    def delta(key: str) -> list[float]:
        return [
            (float(y) - float(x)) / 1e6
            for x, y in zip(at(t, trace[key], a), at(t, trace[key], b), strict=True)
        ]

    return delta("run_ns"), delta("wait_ns")


def by_group(values: Iterable[float], groups: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for g, v in zip(groups, values, strict=True):
        out[g] = out.get(g, 0.0) + float(v)
    return out


def bursts(turns: list[list[float]], gap_ms: float) -> list[dict[str, Any]]:
    """Slow turns (sent, total ms, non-model ms) merged into windows."""
    out: list[dict[str, Any]] = []
    for sent, total, nonmodel in sorted(turns):
        end = sent + total / 1000
        if out and sent <= out[-1]["end"] + gap_ms / 1000:
            b = out[-1]
            b["end"] = max(b["end"], end)
            b["turns"] += 1
            b["worst_ms"] = max(b["worst_ms"], nonmodel)
        else:
            out.append({"start": sent, "end": end, "turns": 1, "worst_ms": nonmodel})
    return out


def rows(
    run: dict[str, float],
    wait: dict[str, float],
    base_run: dict[str, float],
    base_wait: dict[str, float],
    top: int,
) -> list[dict[str, Any]]:
    keys = sorted(set(run) | set(wait), key=lambda g: -(run.get(g, 0.0) + wait.get(g, 0.0)))
    return [
        {
            "group": g,
            "run_ms": round(run.get(g, 0.0), 2),
            "run_steady_ms": round(base_run.get(g, 0.0), 2),
            "wait_ms": round(wait.get(g, 0.0), 2),
            "wait_steady_ms": round(base_wait.get(g, 0.0), 2),
        }
        for g in keys[:top]
        if run.get(g, 0.0) + wait.get(g, 0.0) >= 0.05
    ]


def analyze(
    trace_path: Path, capacity_path: Path, level_loops: int, gap_ms: float, top: int
) -> dict[str, Any]:
    import numpy as np

    z = np.load(trace_path)
    trace = {k: z[k] for k in ("t", "late_ms", "pids", "run_ns", "wait_ns")}
    meta = json.loads(str(z["meta"]))
    cap = json.loads(capacity_path.read_text())
    level = next(lv for lv in cap["levels"] if lv["loops"] == level_loops)
    bench_pid = int(meta.get("bench_pid", 0))
    own = descendants(meta["processes"], bench_pid) if bench_pid else set()
    groups = [
        group_of(int(p), meta["processes"][str(int(p))], own, bench_pid, int(meta["sampler_pid"]))
        for p in trace["pids"]
    ]
    s0, s1 = level["storm_end"], level["storm_end"] + level["steady_window_s"]
    srun, swait = window(trace, s0, s1)
    steady_run, steady_wait = by_group(srun, groups), by_group(swait, groups)
    span_ms = (s1 - s0) * 1000

    def scaled(d: dict[str, float], ms: float) -> dict[str, float]:
        return {g: v * ms / span_ms for g, v in d.items()}

    ticks = z["cpu_ticks"] if "cpu_ticks" in z.files else None

    def machine(a: float, b: float) -> dict[str, float] | None:
        """The machine's /proc/stat over the window (10 ms ticks: coarse under 100 ms):
        the share of both cores busy (user, nice, system, irq, softirq), stolen by the
        hypervisor, idle (idle + iowait)."""
        if ticks is None:
            return None
        d = [
            float(y) - float(x)
            for x, y in zip(at(trace["t"], ticks, a), at(trace["t"], ticks, b), strict=True)
        ]
        total = sum(d) or 1.0
        busy = d[0] + d[1] + d[2] + d[5] + d[6]
        return {
            "busy": round(busy / total, 3),
            "steal": round(d[7] / total, 3),
            "idle": round((d[3] + d[4]) / total, 3),
        }

    def late_in(a: float, b: float) -> float:
        m = (trace["t"] >= a) & (trace["t"] <= b)
        return round(float(trace["late_ms"][m].max()), 2) if m.any() else 0.0

    out_bursts = []
    all_run: dict[str, float] = {}
    all_wait: dict[str, float] = {}
    total_ms = 0.0
    for b in bursts(level["steady_tail"]["turns_at"], gap_ms):
        ms = (b["end"] - b["start"]) * 1000
        run, wait = window(trace, b["start"], b["end"])
        grun, gwait = by_group(run, groups), by_group(wait, groups)
        for g, v in grun.items():
            all_run[g] = all_run.get(g, 0.0) + v
        for g, v in gwait.items():
            all_wait[g] = all_wait.get(g, 0.0) + v
        total_ms += ms
        out_bursts.append(
            {
                "at_s": round(b["start"] - s0, 3),
                "ms": round(ms, 1),
                "turns": b["turns"],
                "worst_nonmodel_ms": b["worst_ms"],
                "cores_busy": round(sum(grun.values()) / (CORES * ms), 3) if ms > 0 else None,
                "sampler_late_max_ms": late_in(b["start"], b["end"]),
                "machine": machine(b["start"], b["end"]),
                "groups": rows(grun, gwait, scaled(steady_run, ms), scaled(steady_wait, ms), top),
            }
        )
    late = trace["late_ms"]
    trace_s = float(trace["t"][-1] - trace["t"][0]) or 1.0
    cold = {}
    if "late_run_ns" in z.files:  # cold tasks' catch-ups: CPU that could not be placed in time
        lr = by_group((float(v) / 1e6 for v in z["late_run_ns"]), groups)
        cold = {
            g: round(v / trace_s, 2)
            for g, v in sorted(lr.items(), key=lambda kv: -kv[1])
            if v / trace_s >= 0.5
        }
    return {
        "cold_catch_up_ms_per_s": cold,
        "trace": str(trace_path),
        "capacity": str(capacity_path),
        "loops": level_loops,
        "steady_ms": level["steady_ms"],
        "steady_window_s": level["steady_window_s"],
        "cores": CORES,
        "steady_cores_busy": round(sum(steady_run.values()) / (CORES * span_ms), 3),
        "steady_machine": machine(s0, s1),
        "steady_by_group_ms_per_s": {
            g: {
                "run": round(steady_run[g] * 1000 / span_ms, 2),
                "wait": round(steady_wait[g] * 1000 / span_ms, 2),
            }
            for g in sorted(steady_run, key=lambda g: -steady_run[g])
            if steady_run[g] + steady_wait[g] >= 0.5 * span_ms / 1000
        },
        "sampler": {
            "samples": len(late),
            "priority": meta["priority"],
            "interval_ms": meta["interval_ms"],
            "cpu_s": meta["sampler_cpu_s"],
            "wall_s": meta["wall_s"],
            "late_p50_ms": round(float(np.percentile(late, 50)), 3),
            "late_p99_ms": round(float(np.percentile(late, 99)), 3),
            "late_max_ms": round(float(late.max()), 2),
        },
        "slow_turns": {
            "turns": len(level["steady_tail"]["turns_at"]),
            "windows_ms": round(total_ms, 1),
            "cores_busy": round(sum(all_run.values()) / (CORES * total_ms), 3) if total_ms else None,
            "groups": rows(
                all_run, all_wait, scaled(steady_run, total_ms), scaled(steady_wait, total_ms), top
            ),
        },
        "bursts": out_bursts,
    }


def show(result: dict[str, Any]) -> None:
    s = result["sampler"]
    print(
        f"steady non-model {result['steady_ms']}; cores busy over the steady window {result['steady_cores_busy']} "
        f"(/proc/stat: {result['steady_machine']}); "
        f"sampler {s['samples']} samples every {s['interval_ms']} ms ({s['priority']}), CPU {s['cpu_s']} s / "
        f"{s['wall_s']} s, late p50 {s['late_p50_ms']} / p99 {s['late_p99_ms']} / max {s['late_max_ms']} ms"
    )
    print("steady window, ms/s run / wait:", json.dumps(result["steady_by_group_ms_per_s"]))
    print(
        "not placed in time (cold tasks' catch-ups over the trace), ms/s:",
        json.dumps(result["cold_catch_up_ms_per_s"]),
    )

    def table(title: str, groups: list[dict[str, Any]]) -> None:
        print(title)
        print(f"    {'group':<44} {'run ms':>8} {'(steady)':>9} {'wait ms':>8} {'(steady)':>9}")
        for r in groups:
            print(
                f"    {r['group'][:44]:<44} {r['run_ms']:>8} {r['run_steady_ms']:>9} "
                f"{r['wait_ms']:>8} {r['wait_steady_ms']:>9}"
            )

    st = result["slow_turns"]
    table(
        f"all {st['turns']} slow turns' windows together ({st['windows_ms']} ms, cores busy {st['cores_busy']}):",
        st["groups"],
    )
    for b in result["bursts"]:
        table(
            f"burst at {b['at_s']} s: {b['ms']} ms, {b['turns']} turns (worst {b['worst_nonmodel_ms']} ms), "
            f"cores busy {b['cores_busy']} (/proc/stat {b['machine']}), sampler late max {b['sampler_late_max_ms']} ms",
            b["groups"],
        )


def run(out_dir: Path, interval_ms: float, bench_args: list[str]) -> Path:
    """The sampler beside one bench capacity run; returns the trace's path."""
    import numpy as np

    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / "trace.npz"
    sampler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "investigations.core_sampler",
            "--out",
            str(trace),
            "--interval-ms",
            str(interval_ms),
        ]
    )
    exe = Path(sys.executable).with_name("responses-ws")
    args = bench_args or ["--loops", "256", "--no-reference", "--out", str(out_dir / "capacity.json")]
    time.sleep(1.5)  # the sampler's first full scan
    try:
        bench = subprocess.Popen([str(exe), "bench", "capacity", *args])
        (out_dir / "bench.pid").write_text(str(bench.pid))
        bench.wait()
    finally:
        sampler.send_signal(signal.SIGTERM)
        sampler.wait(timeout=60)
    z = dict(np.load(trace))
    meta = json.loads(str(z["meta"]))
    meta["bench_pid"] = bench.pid
    z["meta"] = np.array(json.dumps(meta))
    np.savez(trace, **z)
    return trace


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out-dir", type=Path, required=True)
    r.add_argument("--interval-ms", type=float, default=4.0)
    r.add_argument("bench_args", nargs="*")
    a_ = sub.add_parser("analyze")
    a_.add_argument("--trace", type=Path, required=True)
    a_.add_argument("--capacity", type=Path, required=True)
    a_.add_argument("--out", type=Path)
    for q in (r, a_):
        q.add_argument("--level", type=int, default=256)
        q.add_argument("--gap-ms", type=float, default=50.0)
        q.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    if a.cmd == "run":
        trace = run(a.out_dir, a.interval_ms, a.bench_args)
        capacity = a.out_dir / "capacity.json"
        out = a.out_dir / "attribution.json"
    else:
        trace, capacity, out = a.trace, a.capacity, a.out
    result = analyze(trace, capacity, a.level, a.gap_ms, a.top)
    show(result)
    if out is not None:
        out.write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
