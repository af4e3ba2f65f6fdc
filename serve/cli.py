"""``responses-ws`` command line: ``serve``, ``demo`` and ``bench``."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from pathlib import Path

from .config import load_app_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(args: argparse.Namespace) -> int:
    from .builder import start, stop

    overrides = {}
    if args.host is not None:
        overrides["server.host"] = args.host
    if args.port is not None:
        overrides["server.port"] = args.port
    config = load_app_config(args.config, **overrides)
    url = start(config, address=args.address)
    print(f"responses-ws serving on {url}  (WebSocket: {url.replace('http', 'ws', 1)}/v1/responses)",
          flush=True)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    stopping.wait()
    print("shutting down", flush=True)
    stop()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(turns=args.turns, model=args.model)


def _bench(args: argparse.Namespace) -> int:
    from bench.run import run

    payload = run(args)
    return 1 if any(s["failed_rollouts"] for s in payload["summary"].values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="responses-ws", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="start (or join) Ray, deploy, serve until interrupted")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--config", type=Path, default=None, help="YAML with server/session/inference sections")
    p.add_argument("--address", default=None, help="Ray address to join (default: start an embedded Ray)")
    p.set_defaults(func=_serve)
    d = sub.add_parser("demo", help="embedded server + an agent loop over a WebSocket with the openai SDK")
    d.add_argument("--turns", type=int, default=8)
    d.add_argument("--model", default="emu-fast")
    d.set_defaults(func=_demo)
    b = sub.add_parser("bench", help="agent loops over ws / http-chained / http-full, side by side")
    from bench.run import add_arguments

    add_arguments(b)
    b.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[2:] if argv is None else argv[1:])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
