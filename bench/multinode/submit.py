"""Run one Ray job on a harness brought up for it (as root)::

    python -m bench.multinode.submit -- responses-ws bench scaling --cluster auto \\
        --session-nodes 1,2 --loops-per-node 4,8 --duration 20 --live-host 10.213.37.10 --out DIR

brings up the harness with a client node and the job server (the multi-node tier's layout:
a head carrying the accelerator role, two session nodes, a client node), submits the command
after ``--`` with ``ray job submit --address http://10.213.37.10:8265`` from the root namespace,
prints the job's output as it comes, and tears everything down when the job ends (or on
Ctrl-C); its exit status is the job's (0: SUCCEEDED).  Paths the job writes (``--out``) are on
this machine's file system: the nodes share it."""

from __future__ import annotations

import argparse
import sys
import time

from .harness import CLIENT_SPEC, DEFAULT_SPECS, Harness

TIMEOUT_S = 3600.0


def follow(h: Harness, entrypoint: list[str], timeout_s: float) -> int:
    job = h.submit_job(*entrypoint, name="submitted")
    print(f"job {job.submission_id} at {h.job_address}: {' '.join(entrypoint)}", flush=True)
    shown, deadline = 0, time.monotonic() + timeout_s
    try:
        while True:
            text = job.output()
            sys.stdout.write(text[shown:])
            sys.stdout.flush()
            shown = len(text)
            if job.proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                print(f"the job ran past {timeout_s:.0f}s: stopped", file=sys.stderr)
                return 1
            time.sleep(0.5)
        status = job.status()
        print(f"job {job.submission_id}: {status}", flush=True)
        return 0 if status == "SUCCEEDED" else 1
    finally:
        job.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.multinode.submit", description=__doc__)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds before the job is stopped")
    parser.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- the job's command")
    args = parser.parse_args(argv)
    entrypoint = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    if not entrypoint:
        parser.error("the job's command after --")
    t0 = time.monotonic()
    with Harness((*DEFAULT_SPECS, CLIENT_SPEC), job_server=True) as h:
        print(
            f"harness up in {time.monotonic() - t0:.0f}s: "
            + ", ".join(f"{n.name} {n.address}" for n in h.topology.nodes),
            flush=True,
        )
        return follow(h, entrypoint, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
