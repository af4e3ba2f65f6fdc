"""Which process a slow WebSocket connect waits on: ``bench admission``'s ``http_load`` probes
(20 fresh connects at 10 a second, then 20 more while 4 HTTP clients send ~68k-token
requests), optionally right after a burst of connections that each take turns and close,
with every server thread's run time and wait for a core (``/proc/<pid>/task/<tid>/schedstat``)
read every 50 ms.

    python -m investigations.admission_connect [--burst 1000] [--burst-turns 5] [--out FILE]

Starts an embedded server (a development node).  Prints each probe's connects (when each
began, seconds from the start, and how long it took), and for the span of the connects over
100 ms the processes and threads that ran and waited for a core most in it.  ``--burst 0``
leaves the burst out.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

Snapshot = dict[int, dict[str, tuple[str, int, int]]]  # pid → tid → (thread name, run ns, wait ns)


def snapshot(pids: list[int]) -> Snapshot:
    out: Snapshot = {}
    for pid in pids:
        threads = {}
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    run, wait = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
                    threads[tid] = (
                        Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip(),
                        int(run),
                        int(wait),
                    )
                except OSError:  # a thread that ended
                    continue
        except OSError:  # a process that ended
            continue
        out[pid] = threads
    return out


def busiest(
    samples: list[tuple[float, Snapshot]], names: dict[int, str], a: float, b: float
) -> dict[str, Any]:
    """Run and wait ms per process and per thread between the samples nearest after ``a`` and ``b``."""
    times = [t for t, _ in samples]
    first = samples[min(bisect.bisect_left(times, a), len(samples) - 1)][1]
    last = samples[min(bisect.bisect_left(times, b), len(samples) - 1)][1]
    procs: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    threads: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for pid, now in last.items():
        before = first.get(pid, {})
        for tid, (comm, run, wait) in now.items():
            run0, wait0 = before[tid][1:] if tid in before else (run, wait)
            name = names.get(pid, str(pid))
            for key, table in ((name, procs), (f"{name} / {comm}", threads)):
                table[key][0] += (run - run0) / 1e6
                table[key][1] += (wait - wait0) / 1e6

    def top(table: dict[str, list[float]]) -> list[tuple[str, float, float]]:
        return [
            (k, round(r, 1), round(w, 1)) for k, (r, w) in sorted(table.items(), key=lambda kv: -kv[1][0])[:6]
        ]

    return {"processes": top(procs), "threads": top(threads)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--burst", type=int, default=1000, help="connections opened at once before the probes (0: none)"
    )
    p.add_argument(
        "--burst-turns", type=int, default=5, help="turns each burst connection takes before it closes"
    )
    p.add_argument("--out", help="write the connects and the spans' figures as JSON")
    args = p.parse_args()

    from bench import workload as wl
    from bench.kinds import admission as adm
    from bench.processes import server_processes
    from bench.runner import LoadSpec, start_local
    from serve.embedded import embedded_server, local_config

    adm.raise_open_files()
    samples: list[tuple[float, Snapshot]] = []
    names: dict[int, str] = {}
    stop = threading.Event()

    def sample() -> None:
        pids: list[int] = []
        while not stop.is_set():
            if len(samples) % 20 == 0:  # hosts start while it runs
                pids = list(server_processes())
                for pid in pids:
                    if pid not in names:
                        try:
                            names[pid] = Path(f"/proc/{pid}/cmdline").read_text().split("\0")[0][:40]
                        except OSError:
                            continue
            samples.append((time.time(), snapshot(pids)))
            time.sleep(0.05)

    def probe(url: str) -> list[tuple[float, float]]:
        spec = adm.arrivals(url, 20, rate=1 / adm.PROBE_GAP_S, open_timeout=10.0, hold=False)
        with start_local(spec) as run:
            adm.arrived(run)
            return sorted(run.stop().connects)

    out: dict[str, Any] = {}
    with embedded_server(local_config()) as url:
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.time()
        if args.burst:
            with start_local(adm.arrivals(url, args.burst, rate=None, open_timeout=10.0)) as run:
                adm.arrived(run)
                adm.turns_on_held(run, args.burst_turns)
                run.stop()
            out["burst_closed_s"] = round(time.time() - start, 2)
        out["idle"] = probe(url)
        big = wl.Workload(
            tool_rounds=0, system_tokens=0, tool_def_tokens=0, task_tokens=1, text_tokens=8,
            tool_output_tokens=1, resume_tokens=68000,
        )  # fmt: skip
        spec = LoadSpec(
            targets=(url,), loops=4, transport="http-full", custom_workload=big, duration_s=adm.DEADLINE_S,
            warmup_s=0.0,
        )  # fmt: skip
        with start_local(spec) as load:
            time.sleep(max(0.0, load.release_at - time.time()) + 2.0)
            out["under_http_load"] = probe(url)
            load.stop()
        stop.set()
        sampler.join()
    for phase in ("idle", "under_http_load"):
        connects = out[phase]
        print(phase, [(round(t - start, 2), round(ms)) for t, ms in connects])
        slow = [(t, ms) for t, ms in connects if ms > 100]
        if slow:
            a, b = min(t for t, _ in slow), max(t + ms / 1000 for t, ms in slow)
            figures = busiest(samples, names, a, b)
            out[f"{phase}_slow_span"] = {
                "from_s": round(a - start, 2),
                "to_s": round(b - start, 2),
                **figures,
            }
            print(f"  connects over 100 ms, {a - start:.2f}-{b - start:.2f} s: run / wait-for-a-core ms")
            for name, run_ms, wait_ms in figures["processes"] + figures["threads"]:
                print(f"    {name[:60]:60} {run_ms:8.1f} {wait_ms:8.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
