"""The documented edits of tests/multinode/test_ray_up.py on the shipped configs (pure)."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.multinode.edits import cluster_yaml, haproxy_config, serve_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_cluster_yaml_edits_change_addresses_login_and_secret_files_only():
    shipped = yaml.safe_load((CONFIGS / "cluster-local.yaml").read_text())
    edited = cluster_yaml(
        shipped,
        head="10.1.1.10",
        workers=["10.1.1.11", "10.1.1.12", "10.1.1.13"],
        session_ips=["10.1.1.11", "10.1.1.12"],
        user="root",
        key="/k",
        token_file="/t",
        password_file="/p",
    )
    assert edited["provider"] == {
        "type": "local",
        "head_ip": "10.1.1.10",
        "worker_ips": ["10.1.1.11", "10.1.1.12", "10.1.1.13"],
    }
    assert edited["auth"] == {"ssh_user": "root", "ssh_private_key": "/k"}
    assert 'SESSION_IPS="10.1.1.11 10.1.1.12"' in " ".join(edited["worker_start_ray_commands"])
    assert "ALWAYS_UP=3 &&" in " ".join(edited["head_start_ray_commands"])  # every worker, by default
    changed = {k for k in shipped if shipped[k] != edited[k]}
    assert changed == {
        "provider",
        "auth",
        "file_mounts",
        "worker_start_ray_commands",
        "head_start_ray_commands",
    }
    assert edited["file_mounts"]["~/responses-ws"] == "."


def test_the_serve_and_haproxy_edits():
    shipped = yaml.safe_load((CONFIGS / "serve-cluster.yaml").read_text())
    (app,) = serve_config(shipped, head="10.1.1.10")["applications"]
    assert app["args"]["store"]["redis_url"] == "redis://10.1.1.10:6390/0"
    cfg = haproxy_config(
        (CONFIGS / "haproxy-sessions.cfg").read_text(),
        bind="10.1.1.1",
        stats_socket="/tmp/x.sock",
    )
    assert "    bind 10.1.1.1:8765" in cfg and "server-template s 1-16 0.0.0.0:8765 check disabled" in cfg
    assert "10.0.0." not in cfg
    assert "stats socket /tmp/x.sock mode 600" in cfg
