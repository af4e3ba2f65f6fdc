"""What an idle server's processes do each second: CPU and wake-ups per process and thread.

    python -m investigations.idle_processes [--settle-s 15] [--window-s 20] [--out results/idle.json]

Starts an embedded server (a development node, as ``responses-ws serve`` does), waits
``--settle-s`` for start-up work to end, then reads, for every process it started (the
descendants of this one: the GCS, the raylet, Ray's agents and monitors, Serve's controller,
the gateway, the session host, the inference replica) and each of their threads, the run time
(``/proc/<pid>/task/<tid>/schedstat``) and the context switches (``/proc/<pid>/task/<tid>/status``:
each voluntary one is a wake-up after a sleep) at the start and the end of ``--window-s``.
Prints CPU ms per second and switches per second by process, its busiest threads beneath
(thread names as the kernel knows them), and the total; ``--out`` writes them as JSON
(threads of at least 0.05 ms/s or 0.5 switches/s).
This process's own threads are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from serve.embedded import embedded_server, local_config


@dataclass(frozen=True, slots=True)
class ThreadSample:
    run_ns: int
    switches: int
    name: str


@dataclass(slots=True)
class ProcessFigures:
    name: str
    cpu_ms_per_s: float = 0.0
    switches_per_s: float = 0.0
    threads: list[tuple[str, float, float]] = field(default_factory=list)


def _parents() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            kids[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry))
    return kids


def descendants(root: int) -> list[int]:
    """``root``'s descendants (not ``root``)."""
    kids = _parents()
    out: list[int] = []
    todo = list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def process_name(pid: int) -> str:
    """``ray::<Actor>`` for a Ray worker, the script's name for a Python process, else the binary's."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    first = argv[0].decode(errors="replace")
    if first.startswith("ray::"):
        return first.split()[0]
    script = next((a.decode() for a in argv if a.endswith(b".py")), None)
    return os.path.basename(script or first)


def sample(pids: list[int]) -> dict[tuple[int, int], ThreadSample]:
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                run_ns = int(Path(f"{base}/schedstat").read_text().split()[0])
                name = Path(f"{base}/comm").read_text().strip()
                status = Path(f"{base}/status").read_text().splitlines()
            except OSError:
                continue
            switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
            out[(pid, int(tid))] = ThreadSample(run_ns, switches, name)
    return out


def figures(
    names: dict[int, str],
    before: dict[tuple[int, int], ThreadSample],
    after: dict[tuple[int, int], ThreadSample],
    seconds: float,
) -> list[ProcessFigures]:
    """Per process, busiest first: CPU ms and switches per second, and its threads' (threads
    that started or ended within the window are left out)."""
    by_pid: dict[int, ProcessFigures] = {}
    for key, end in after.items():
        start = before.get(key)
        if start is None:
            continue
        cpu = (end.run_ns - start.run_ns) / 1e6 / seconds
        switches = (end.switches - start.switches) / seconds
        proc = by_pid.setdefault(key[0], ProcessFigures(names.get(key[0], "?")))
        proc.cpu_ms_per_s += cpu
        proc.switches_per_s += switches
        proc.threads.append((end.name, round(cpu, 2), round(switches, 1)))
    for proc in by_pid.values():
        proc.threads.sort(key=lambda t: -t[1])
    return sorted(by_pid.values(), key=lambda p: -p.cpu_ms_per_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settle-s", type=float, default=15.0)
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with embedded_server(local_config()):
        time.sleep(args.settle_s)  # start-up work (imports, first metrics exports) ends
        pids = descendants(os.getpid())
        names = {pid: process_name(pid) for pid in pids}
        load_before = os.getloadavg()
        before, t0 = sample(pids), time.monotonic()
        time.sleep(args.window_s)
        after, seconds = sample(pids), time.monotonic() - t0
        result = figures(names, before, after, seconds)
    total = sum(p.cpu_ms_per_s for p in result)
    for proc in result:
        print(f"{proc.name:48s} {proc.cpu_ms_per_s:6.2f} ms/s {proc.switches_per_s:7.1f} switches/s")
        for name, cpu, switches in proc.threads[:6]:
            if cpu >= 0.05 or switches >= 0.5:
                print(f"    {name:44s} {cpu:6.2f} ms/s {switches:7.1f} switches/s")
    print(
        f"every process: {total:.1f} ms/s over {seconds:.1f} s; load average {load_before[0]:.2f} at the start"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "command": "python -m investigations.idle_processes "
            f"--settle-s {args.settle_s:g} --window-s {args.window_s:g}",
            "window_s": round(seconds, 2),
            "load_average": load_before,
            "total_cpu_ms_per_s": round(total, 2),
            "processes": [
                {
                    "name": p.name,
                    "cpu_ms_per_s": round(p.cpu_ms_per_s, 2),
                    "switches_per_s": round(p.switches_per_s, 1),
                    "threads": [t for t in p.threads if t[1] >= 0.05 or t[2] >= 0.5],
                }
                for p in result
            ],
        }
        args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
