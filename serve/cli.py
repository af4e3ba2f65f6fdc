"""``responses-ws`` command line: ``serve``, ``demo`` and ``bench``.

``demo`` and ``bench`` are clients of the server: the bench package runs them, and
it is loaded only when one of them is asked for (``responses-ws serve`` never imports it).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from .config import load_app_config

CLIENT_COMMANDS = ("demo", "bench")  # parsed and run by bench.cli


def _serve(args: argparse.Namespace) -> int:
    from .embedded import embedded_server

    overrides = {}
    if args.host is not None:
        overrides["server.host"] = args.host
    if args.port is not None:
        overrides["server.port"] = args.port
    config = load_app_config(args.config, **overrides)
    with embedded_server(config, address=args.address) as url:
        print(f"responses-ws serving on {url}  (WebSocket: {url.replace('http', 'ws', 1)}/v1/responses)",
              flush=True)
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
        stopping.wait()
        print("shutting down", flush=True)
    return 0


def _client_command(argv: list[str]) -> int:
    from bench.cli import main as bench_main  # lazily: the server does not depend on bench

    return bench_main(argv)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="responses-ws", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="start (or join) Ray, deploy, serve until interrupted")
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--config", type=Path, default=None, help="YAML with server/session/inference sections")
    s.add_argument("--address", default=None, help="Ray address to join (default: start an embedded Ray)")
    s.set_defaults(func=_serve)
    # Listed for the overview only: main() hands these command lines to bench.cli unparsed.
    sub.add_parser("demo", help="embedded server + a short agent-loop benchmark, WebSocket vs HTTP "
                                "(responses-ws demo --help)")
    sub.add_parser("bench", help="benchmarks: responses-ws bench [KIND] [options] (responses-ws bench --help)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in CLIENT_COMMANDS:
        return _client_command(argv)
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
