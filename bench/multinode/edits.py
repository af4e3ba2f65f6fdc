"""The documented edits (docs/deploy.md, "The edits, and only these") applied to copies of
the shipped configs, and nothing else (pure): the cluster YAML's addresses, roles by address,
SSH user and key and local secret files; the Serve config's Redis address, the session tier's
bounds and the inference tier's largest replica count; the HAProxy configs' listen address,
certificate, servers and runtime socket.  tests/multinode/test_ray_up.py uses them, so the
test runs the configs as a user would; tests/cluster/test_sized_layout.py renders a
10-session-node layout with them."""

from __future__ import annotations

import re
from typing import Any

# configs/cluster-local.yaml's SESSION_IPS, CLIENT_IPS (no client host) and ALWAYS_UP
SHIPPED_SESSION_IPS = " ".join(f"10.0.0.{i}" for i in range(11, 21))
SHIPPED_CLIENT_IPS = ""
SHIPPED_ALWAYS_UP = "5"
TOKEN_MOUNT = "~/.responses-ws/ray-token"
PASSWORD_MOUNT = "~/.responses-ws/redis-password"


class EditError(ValueError):
    pass


def cluster_yaml(
    config: dict[str, Any],
    *,
    head: str,
    workers: list[str],
    session_ips: list[str],
    user: str,
    key: str,
    token_file: str,
    password_file: str,
    client_ips: list[str] | None = None,
    always_up: int | None = None,
) -> dict[str, Any]:
    """configs/cluster-local.yaml (loaded) with the hosts' addresses, the roles by address
    (``session_ips``, ``client_ips``; every other worker is an accelerator), how many of
    ``workers`` (the first) are kept up (default: all), the SSH login and the local secret
    files."""
    up = len(workers) if always_up is None else always_up
    if not 0 <= up <= len(workers):
        raise EditError(f"always_up {up}: {len(workers)} workers")
    out = dict(config)
    out["provider"] = dict(config["provider"], head_ip=head, worker_ips=list(workers))
    out["auth"] = dict(config["auth"], ssh_user=user, ssh_private_key=key)
    mounts = dict(config["file_mounts"])
    if TOKEN_MOUNT not in mounts or PASSWORD_MOUNT not in mounts:
        raise EditError(f"file_mounts has no {TOKEN_MOUNT} or {PASSWORD_MOUNT}: {sorted(mounts)}")
    mounts[TOKEN_MOUNT], mounts[PASSWORD_MOUNT] = token_file, password_file
    out["file_mounts"] = mounts
    starts = list(config["worker_start_ray_commands"])
    for name, shipped, ips in (
        ("SESSION_IPS", SHIPPED_SESSION_IPS, session_ips),
        ("CLIENT_IPS", SHIPPED_CLIENT_IPS, client_ips or []),
    ):
        assignment = f'{name}="{shipped}"'
        hits = [i for i, c in enumerate(starts) if assignment in c]
        if len(hits) != 1:
            raise EditError(f"worker_start_ray_commands: no single {name} line to edit")
        starts[hits[0]] = starts[hits[0]].replace(assignment, f'{name}="{" ".join(ips)}"')
    out["worker_start_ray_commands"] = starts
    heads = list(config["head_start_ray_commands"])
    assignment = f"ALWAYS_UP={SHIPPED_ALWAYS_UP} "
    hits = [i for i, c in enumerate(heads) if assignment in c]
    if len(hits) != 1:
        raise EditError("head_start_ray_commands: no single ALWAYS_UP line to edit")
    heads[hits[0]] = heads[hits[0]].replace(assignment, f"ALWAYS_UP={up} ")
    out["head_start_ray_commands"] = heads
    return out


def serve_config(
    config: dict[str, Any],
    *,
    head: str,
    gateways: tuple[int, int] | None = None,
    inference_max_replicas: int | None = None,
) -> dict[str, Any]:
    """configs/serve-cluster.yaml (loaded) with ``store.redis_url`` on the head's address and,
    where given, the session tier's (min, max) gateway replicas (the session node type's
    min_workers and max_workers) and the inference tier's ``max_replicas``."""
    out = dict(config)
    apps = []
    for app in config["applications"]:
        args = dict(app["args"])
        store = dict(args["store"])
        store["redis_url"] = re.sub(r"^redis://[^:/@]+:", f"redis://{head}:", store["redis_url"])
        args["store"] = store
        if gateways is not None:
            args["server"] = gateway_bounds(args["server"], *gateways)
        if inference_max_replicas is not None:
            inference = dict(args["inference"])
            scaling = dict(inference["scaling"])
            scaling["autoscaling"] = dict(scaling["autoscaling"], max_replicas=inference_max_replicas)
            args["inference"] = dict(inference, scaling=scaling)
        apps.append(dict(app, args=args))
    out["applications"] = apps
    return out


def gateway_bounds(server: dict[str, Any], low: int, high: int) -> dict[str, Any]:
    """The server section with its gateway replicas between ``low`` and ``high``: the bounds
    of its gateway autoscaling where it has one, else its fixed count (``high``)."""
    if low > high:
        raise EditError(f"gateway bounds {low} > {high}")
    if "gateway_autoscaling" in server:
        bounds = dict(server["gateway_autoscaling"], min_replicas=low, max_replicas=high)
        return dict(server, gateway_autoscaling=bounds)
    return dict(server, gateway_replicas=high)


def session_tier_bounds(server: dict[str, Any]) -> tuple[int, int]:
    """The (min, max) gateway replicas a Serve config's server section allows."""
    if "gateway_autoscaling" in server:
        bounds = server["gateway_autoscaling"]
        return int(bounds["min_replicas"]), int(bounds["max_replicas"])
    return int(server["gateway_replicas"]), int(server["gateway_replicas"])


def haproxy_config(
    text: str,
    *,
    bind: str,
    stats_socket: str,
    servers: dict[str, str] | None = None,
    slots: int | None = None,
    certificate: str | None = None,
    port: int | None = None,
) -> str:
    """configs/haproxy-sessions.cfg (or -tls.cfg) with its ``bind`` address (and port, where
    given), runtime socket and (TLS) certificate file replaced, and its session nodes: a
    fixed list (``servers``, ``name → address``, port 8765 unless the address has one) in
    place of its ``server``/``server-template`` lines, or ``slots`` for its
    ``server-template`` (the addresses the balancer sync fills)."""
    if servers is not None and slots is not None:
        raise EditError("servers (a fixed list) or slots (for the sync), not both")
    out, placed, templated = [], False, False
    for line in text.splitlines():
        word = line.split()[:1]
        if word == ["bind"]:
            address, *options = line.split()[1:]
            shipped_port = address.rsplit(":", 1)[1]
            if "crt" in options:
                if certificate is None:
                    raise EditError("the bind line terminates TLS: give the certificate file")
                options[options.index("crt") + 1] = certificate
            elif certificate is not None:
                raise EditError("the bind line has no certificate to replace")
            out.append(" ".join([f"    bind {bind}:{port or shipped_port}", *options]))
        elif word in (["server"], ["server-template"]) and servers is not None:
            if not placed:
                out += [
                    f"    server {name} {addr if ':' in addr else addr + ':8765'} check"
                    for name, addr in servers.items()
                ]
                placed = True
        elif word == ["server-template"] and slots is not None:
            out.append(re.sub(r" 1-\d+ ", f" 1-{slots} ", line))
            templated = True
        elif word == ["stats"] and "socket" in line:
            out.append(re.sub(r"socket \S+", f"socket {stats_socket}", line))
        else:
            out.append(line)
    if servers is not None and not placed:
        raise EditError("no server line")
    if slots is not None and not templated:
        raise EditError("no server-template line")
    return "\n".join(out) + "\n"
