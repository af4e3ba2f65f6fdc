"""The documented edits (docs/deploy.md, "From zero to a serving cluster") applied to copies of
the shipped configs, and nothing else (pure): the cluster YAML's addresses, SSH user and key
and local secret files; the Serve config's Redis address; the HAProxy config's listen
address, servers and runtime socket.  tests/multinode/test_ray_up.py uses them, so the test
runs the configs as a user would."""

from __future__ import annotations

import re
from typing import Any

SHIPPED_SESSION_IPS = "10.0.0.11 10.0.0.12"  # configs/cluster-local.yaml's SESSION_IPS
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
) -> dict[str, Any]:
    """configs/cluster-local.yaml (loaded) with the hosts' addresses, the SSH login and the
    local secret files."""
    out = dict(config)
    out["provider"] = dict(config["provider"], head_ip=head, worker_ips=list(workers))
    out["auth"] = dict(config["auth"], ssh_user=user, ssh_private_key=key)
    mounts = dict(config["file_mounts"])
    if TOKEN_MOUNT not in mounts or PASSWORD_MOUNT not in mounts:
        raise EditError(f"file_mounts has no {TOKEN_MOUNT} or {PASSWORD_MOUNT}: {sorted(mounts)}")
    mounts[TOKEN_MOUNT], mounts[PASSWORD_MOUNT] = token_file, password_file
    out["file_mounts"] = mounts
    starts = list(config["worker_start_ray_commands"])
    hits = [i for i, c in enumerate(starts) if f'SESSION_IPS="{SHIPPED_SESSION_IPS}"' in c]
    if len(hits) != 1:
        raise EditError("worker_start_ray_commands: no single SESSION_IPS line to edit")
    starts[hits[0]] = starts[hits[0]].replace(SHIPPED_SESSION_IPS, " ".join(session_ips))
    out["worker_start_ray_commands"] = starts
    return out


def serve_config(config: dict[str, Any], *, head: str) -> dict[str, Any]:
    """configs/serve-cluster.yaml (loaded) with ``store.redis_url`` on the head's address."""
    out = dict(config)
    apps = []
    for app in config["applications"]:
        store = dict(app["args"]["store"])
        store["redis_url"] = re.sub(r"^redis://[^:/@]+:", f"redis://{head}:", store["redis_url"])
        apps.append(dict(app, args=dict(app["args"], store=store)))
    out["applications"] = apps
    return out


def haproxy_config(text: str, *, bind: str, servers: dict[str, str], stats_socket: str) -> str:
    """configs/haproxy-sessions.cfg with its ``bind`` address, ``server`` lines and runtime
    socket replaced."""
    lines, out, placed = text.splitlines(), [], False
    for line in lines:
        word = line.split()[:1]
        if word == ["bind"]:
            port = line.rsplit(":", 1)[1]
            out.append(f"    bind {bind}:{port}")
        elif word == ["server"]:
            if not placed:
                out += [f"    server {name} {addr}:8765 check" for name, addr in servers.items()]
                placed = True
        elif word == ["stats"] and "socket" in line:
            out.append(re.sub(r"socket \S+", f"socket {stats_socket}", line))
        else:
            out.append(line)
    if not placed:
        raise EditError("no server line")
    return "\n".join(out) + "\n"
