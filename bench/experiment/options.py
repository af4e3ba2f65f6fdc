"""The experiment's command-line options (``responses-ws bench scaling --cluster ...``): the
flags of its contract (docs/scaling.md, "Run a scaling experiment on your cluster") and
their typed form."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from .plan import Sweep, parse_counts

TRANSPORTS = ("ws", "http-full", "http-chained")
WORKLOADS = ("capacity", "codex")
DEFAULT_DURATION_S = 20.0
DEFAULT_REPEATS = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options only the cluster experiment has (``--duration``, ``--repeats``,
    ``--loops-per-node``, ``--seed`` and ``--out`` are shared with ``--real-nodes``)."""
    g = p.add_argument_group("on your cluster (--cluster ADDRESS|auto; docs/scaling.md)")
    g.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run the experiment on this Ray cluster (`auto`: inside a Ray job or on the head)",
    )
    g.add_argument(
        "--session-nodes", default=None, help="session nodes in service per step, rising (default 1..N)"
    )
    g.add_argument("--warmup", type=float, default=5.0, help="seconds of load before each measured window")
    g.add_argument(
        "--transports", default="ws", help=f"comma-separated, interleaved: {', '.join(TRANSPORTS)}"
    )
    g.add_argument("--workload", default="capacity", choices=WORKLOADS, help="the load runner's workload")
    g.add_argument("--store", action="store_true", help="turns with store:true (default store:false)")
    g.add_argument("--api-key", default=None, help="the key the load sends (server.api_keys)")
    g.add_argument("--url", default=None, help="the server as you reach it: one of the session nodes")
    g.add_argument(
        "--url-is-balancer", action="store_true", help="--url is a balancer in front of the session nodes"
    )
    g.add_argument("--live-host", default="127.0.0.1", help="where the driver serves the live page")
    g.add_argument("--live-port", type=int, default=0, help="its port (0: a free one)")


@dataclass(frozen=True, slots=True)
class Options:
    address: str
    session_nodes: tuple[int, ...] | None  # None: 1..N, N the deployment's session nodes
    sweep: Sweep  # with session_nodes filled in once N is known
    workload: str
    store: bool
    api_key: str | None
    seed: int
    url: str | None
    url_is_balancer: bool
    out: Path
    live_host: str
    live_port: int
    command: str


def from_args(args: argparse.Namespace) -> Options:
    """The options of ``args``; ValueError naming a bad flag."""
    transports = tuple(t.strip() for t in args.transports.split(",") if t.strip())
    bad = [t for t in transports if t not in TRANSPORTS]
    if not transports or bad or len(set(transports)) != len(transports):
        raise ValueError(
            f"--transports: distinct names among {', '.join(TRANSPORTS)} (got {args.transports!r})"
        )
    loops = parse_counts(str(args.loops_per_node or 8), "--loops-per-node")
    counts = parse_counts(args.session_nodes, "--session-nodes") if args.session_nodes else None
    duration = DEFAULT_DURATION_S if args.duration is None else float(args.duration)
    repeats = DEFAULT_REPEATS if args.repeats is None else int(args.repeats)
    if duration <= 0 or args.warmup < 0 or repeats < 1:
        raise ValueError("--duration above 0, --warmup 0 or more, --repeats 1 or more")
    if args.url_is_balancer and not args.url:
        raise ValueError("--url-is-balancer needs --url")
    return Options(
        address=args.cluster,
        session_nodes=counts,
        sweep=Sweep(counts or (), loops, transports, repeats, duration, float(args.warmup)),
        workload=args.workload,
        store=bool(args.store),
        api_key=args.api_key,
        seed=int(args.seed),
        url=args.url,
        url_is_balancer=bool(args.url_is_balancer),
        out=Path(args.out),
        live_host=args.live_host,
        live_port=int(args.live_port),
        command=getattr(args, "command", "responses-ws bench scaling"),
    )
