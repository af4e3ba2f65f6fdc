"""What the harness runs as a Ray driver inside the head's namespace (a driver must run on a
node of the cluster): ``nodes`` prints the nodes as JSON; ``deploy CONFIG.json`` does what
``serve deploy`` does with a Serve config file, through Serve's public API (no dashboard
needed), and waits until its applications run; ``replicas`` prints each deployment's
replicas by state; ``settle DEPLOYMENT N`` waits until a deployment runs exactly ``N``
replicas (none starting or stopping) and prints each one's id and node address."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any


def nodes(address: str) -> list[dict[str, Any]]:
    import ray

    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        return [
            {
                "node_id": n["NodeID"],
                "address": n["NodeManagerAddress"],
                "alive": n["Alive"],
                "resources": n.get("Resources", {}),
            }
            for n in ray.nodes()
        ]
    finally:
        ray.shutdown()


def replicas(address: str) -> dict[str, dict[str, int]]:
    """Deployment (``app/deployment``) → replica state → how many replicas are in it."""
    import ray
    from ray import serve

    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        return {
            f"{app_name}/{name}": {str(k).rsplit(".", 1)[-1]: v for k, v in dep.replica_states.items()}
            for app_name, app in serve.status().applications.items()
            for name, dep in app.deployments.items()
        }
    finally:
        ray.shutdown()


def settle(address: str, deployment: str, replicas: int, timeout_s: float) -> list[dict[str, str]]:
    """Wait until ``deployment`` (``app/deployment``) has exactly ``replicas`` replicas, all
    running, and no other actor of it alive (a stopping replica's process is gone too); each
    replica's id (Serve's unique id, the router's and the engine's name for it) and the
    address of its node."""
    import ray
    from ray import serve

    from ..ray_internals import live_actors

    app_name, _, name = deployment.partition("/")
    prefix = f"SERVE_REPLICA::{app_name}#{name}#"
    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            app = serve.status().applications.get(app_name)
            states = (
                {str(k).rsplit(".", 1)[-1]: v for k, v in app.deployments[name].replica_states.items() if v}
                if app is not None and name in app.deployments
                else {}
            )
            actors = [a for a in live_actors() if (a.get("Name") or "").startswith(prefix)]
            if states == {"RUNNING": replicas} and len(actors) == replicas:
                return [
                    {
                        "replica": a["Name"][len(prefix) :],
                        "node": a["Address"]["IPAddress"],
                    }
                    for a in actors
                ]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{deployment}: {states}, {len(actors)} actors after {timeout_s:.0f}s")
            time.sleep(0.5)
    finally:
        ray.shutdown()


def builder(import_path: str) -> Any:
    module, _, attr = import_path.partition(":")
    if not attr:
        module, _, attr = import_path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def deploy(address: str, config: dict[str, Any], timeout_s: float) -> dict[str, str]:
    """Start Serve with the config's options, run each application (not blocking), wait
    until all run; application name → status."""
    import ray
    from ray import serve

    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        serve.start(
            proxy_location=config.get("proxy_location", "EveryNode"), http_options=config.get("http_options")
        )
        names = []
        for app in config["applications"]:
            target = builder(app["import_path"])(app.get("args", {}))
            serve.run(
                target,
                name=app["name"],
                route_prefix=app.get("route_prefix"),
                logging_config=app.get("logging_config"),
                blocking=False,  # returns once the application's ingress runs
            )
            names.append(app["name"])
        deadline = time.monotonic() + timeout_s
        while True:
            apps = serve.status().applications
            states = {n: str(apps[n].status) if n in apps else "MISSING" for n in names}
            if all(s.endswith("RUNNING") for s in states.values()):
                return states
            failed = {
                n: apps[n].message for n in names if n in apps and str(apps[n].status).endswith("FAILED")
            }
            if failed:
                raise RuntimeError(f"deploy failed: {failed}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"applications not running after {timeout_s:.0f}s: {states}")
            time.sleep(0.5)
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.multinode.driver")
    parser.add_argument("--address", required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("nodes")
    sub.add_parser("replicas")
    st = sub.add_parser("settle")
    st.add_argument("deployment", help="app/deployment")
    st.add_argument("replicas", type=int)
    st.add_argument("--timeout", type=float, default=120.0)
    dep = sub.add_parser("deploy")
    dep.add_argument("config", type=Path)
    dep.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args(argv)
    if args.command == "nodes":
        out: Any = nodes(args.address)
    elif args.command == "replicas":
        out = replicas(args.address)
    elif args.command == "settle":
        out = settle(args.address, args.deployment, args.replicas, args.timeout)
    else:
        out = deploy(args.address, json.loads(args.config.read_text()), args.timeout)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
