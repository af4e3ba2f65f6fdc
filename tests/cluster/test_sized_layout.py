"""The shipped cluster configs reach 10 session nodes and 4 accelerator nodes (and client
nodes for a scaling experiment's load), and a 10-session-node layout rendered from exactly
the documented edits (docs/deploy.md, "The edits, and only these"; bench/multinode/edits.py)
validates against Ray's cluster schema, Serve's deploy schema, the project's config models
and HAProxy's own configuration check."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema

from bench.multinode.edits import cluster_yaml, haproxy_config, serve_config, session_tier_bounds
from inference.emulator.deployment import deployment_options
from serve import local_node_type
from serve.builder import gateway_options
from serve.config import app_config_from_dict
from tests.support.tls import make_ca, server_certificate

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RAY_SCHEMA = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
SESSIONS, ACCELERATORS, CLIENTS = 10, 4, 2
HEAD = "10.1.0.10"
SESSION_IPS = [f"10.1.0.{11 + i}" for i in range(SESSIONS)]
ACCELERATOR_IPS = [f"10.1.0.{31 + i}" for i in range(ACCELERATORS)]
CLIENT_IPS = [f"10.1.0.{41 + i}" for i in range(CLIENTS)]


def load(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name).read_text())


def shipped_server() -> dict:
    (app,) = load("serve-cluster.yaml")["applications"]
    return app["args"]["server"]


def ray_schema_valid(config: dict) -> dict:
    """``config`` as written against ray-schema.json, then as ``ray up`` fills it out."""
    jsonschema.validate(config, RAY_SCHEMA)
    prepared = prepare_config(config)
    validate_config(prepared)
    return prepared


def test_the_cloud_yaml_reaches_ten_session_and_four_accelerator_nodes_at_once():
    config = load("cluster-aws.yaml")
    types = config["available_node_types"]
    assert types["session"]["max_workers"] >= SESSIONS
    assert types["accelerator"]["max_workers"] >= ACCELERATORS
    assert types["client"] == {**types["client"], "min_workers": 0, "resources": {"client": 1}}
    workers = sum(t["max_workers"] for name, t in types.items() if name != config["head_node_type"])
    assert workers <= config["max_workers"], "every node type can reach its max_workers together"
    prepared = ray_schema_valid(config)
    assert prepared["available_node_types"]["session"]["max_workers"] >= SESSIONS


def local_session_hosts(config: dict) -> tuple[int, int]:
    """The local YAML's session hosts among its always-up ones, and all of them."""
    (start,) = [c for c in config["worker_start_ray_commands"] if "SESSION_IPS=" in c]
    sessions = start.split('SESSION_IPS="', 1)[1].split('"', 1)[0].split()
    (head,) = [c for c in config["head_start_ray_commands"] if "ALWAYS_UP=" in c]
    always_up = int(head.split("ALWAYS_UP=", 1)[1].split()[0])
    first = config["provider"]["worker_ips"][:always_up]
    return sum(ip in sessions for ip in first), len(sessions)


def test_the_session_tier_bounds_match_the_session_nodes_of_both_yamls():
    bounds = session_tier_bounds(shipped_server())
    session = load("cluster-aws.yaml")["available_node_types"]["session"]
    local = local_session_hosts(load("cluster-local.yaml"))
    if "gateway_autoscaling" in shipped_server():
        assert bounds == (session["min_workers"], session["max_workers"]) == local
    else:  # a fixed count: as many session nodes as gateways, within the node type's bounds
        assert session["min_workers"] <= bounds[0] == bounds[1] <= session["max_workers"]
    assert local[1] >= SESSIONS


def test_the_inference_tier_fits_the_accelerator_nodes():
    (app,) = load("serve-cluster.yaml")["applications"]
    config = app_config_from_dict(app["args"], environ={})
    options = deployment_options(config.inference)
    accelerator = load("cluster-aws.yaml")["available_node_types"]["accelerator"]
    capacity = accelerator["max_workers"] * accelerator["resources"]["accelerator"]
    assert (
        options["autoscaling_config"]["max_replicas"] * config.inference.scaling.accelerator_per_replica
        <= capacity
    )


def roles(command: str, ips: list[str]) -> dict[str, str]:
    """The resources the worker start command gives each address: its role selection run by
    bash, with `ip route get` answering that address."""
    selection = "SESSION_IPS=" + command.split("SESSION_IPS=", 1)[1].split("ray start", 1)[0]
    script = selection.rstrip().removesuffix("&&") + ' && echo "$RES"'
    out = {}
    for ip in ips:
        fake_ip = f'ip() {{ echo "10.1.0.10 via 10.1.0.1 dev eth0 src {ip} uid 0"; }}; RAY_HEAD_IP={HEAD}; '
        done = subprocess.run(["bash", "-c", fake_ip + script], capture_output=True, text=True, check=True)
        out[ip] = done.stdout.strip()
    return out


def test_a_ten_session_node_layout_from_the_documented_edits(tmp_path):
    shipped = load("cluster-local.yaml")
    # the always-up hosts first: one session host, the accelerators, the clients
    workers = SESSION_IPS[:1] + ACCELERATOR_IPS + CLIENT_IPS + SESSION_IPS[1:]
    always_up = 1 + ACCELERATORS + CLIENTS
    cluster = cluster_yaml(
        shipped,
        head=HEAD,
        workers=workers,
        session_ips=SESSION_IPS,
        client_ips=CLIENT_IPS,
        always_up=always_up,
        user="ops",
        key="~/.ssh/ops",
        token_file="~/secrets/ray-token",
        password_file="~/secrets/redis-password",
    )
    assert {k for k in shipped if shipped[k] != cluster[k]} == {
        "provider",
        "auth",
        "file_mounts",
        "worker_start_ray_commands",
        "head_start_ray_commands",
    }
    assert local_session_hosts(cluster) == (1, SESSIONS)
    prepared = ray_schema_valid(cluster)  # what `ray up` writes to the head
    assert prepared["max_workers"] == len(workers) == SESSIONS + ACCELERATORS + CLIENTS
    # the head's start command edits it for its autoscaler: a session host per launch
    bootstrap = tmp_path / "ray_bootstrap_config.yaml"
    bootstrap.write_text(json.dumps(prepared))
    assert local_node_type.main([str(bootstrap), "--always-up", str(always_up)]) == 0
    elastic = yaml.safe_load(bootstrap.read_text())
    validate_config(elastic)
    assert prepare_config(elastic) == elastic  # the autoscaler takes it as it is
    assert elastic["available_node_types"][local_node_type.NODE_TYPE] == {
        "node_config": {},
        "resources": {"session": 1},
        "min_workers": always_up,
        "max_workers": len(workers),
    }
    (start,) = [c for c in cluster["worker_start_ray_commands"] if "SESSION_IPS=" in c]
    given = roles(start, workers)
    assert [given[ip] for ip in SESSION_IPS] == ['{"session": 1}'] * SESSIONS
    assert [given[ip] for ip in ACCELERATOR_IPS] == ['{"accelerator": 2}'] * ACCELERATORS
    assert [given[ip] for ip in CLIENT_IPS] == ['{"client": 1}'] * CLIENTS

    serve = serve_config(
        load("serve-cluster.yaml"), head=HEAD, gateways=(2, SESSIONS), inference_max_replicas=2 * ACCELERATORS
    )
    (app,) = ServeDeploySchema.model_validate(serve).applications
    config = app_config_from_dict(app.args, environ={})
    assert config.store.redis_url == f"redis://{HEAD}:6390/0"
    autoscaled = "gateway_autoscaling" in app.args["server"]
    assert session_tier_bounds(app.args["server"]) == (2 if autoscaled else SESSIONS, SESSIONS)
    assert gateway_options(config.server)["ray_actor_options"]["resources"] == {"session": 1.0}
    assert deployment_options(config.inference)["autoscaling_config"]["max_replicas"] == 2 * ACCELERATORS


@pytest.mark.parametrize(
    ("name", "nodes"),
    [
        ("haproxy-sessions.cfg", "servers"),
        ("haproxy-sessions-tls.cfg", "slots"),  # the balancer sync fills them
        ("haproxy-sessions-tls.cfg", "servers"),  # a fixed set of nodes instead
    ],
)
def test_the_balancer_of_ten_session_nodes_passes_haproxys_check(name, nodes, tmp_path):
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is missing: make haproxy", pytrace=False)
    shipped = (CONFIGS / name).read_text()
    tls = "ssl crt" in shipped
    certificate = None
    if tls:
        ca = make_ca()
        certificate = tmp_path / "balancer.pem"
        certificate.write_bytes(server_certificate(ca, ["10.1.0.1"]).pem_with_key)
    servers = {f"session{i + 1}": ip for i, ip in enumerate(SESSION_IPS)}
    text = haproxy_config(
        shipped,
        bind="10.1.0.1",
        stats_socket=str(tmp_path / "haproxy.sock"),
        servers=servers if nodes == "servers" else None,
        slots=16 if nodes == "slots" else None,
        certificate=str(certificate) if certificate else None,
    )
    assert "10.0.0." not in text
    if nodes == "servers":
        lines = [line.split() for line in text.splitlines()]
        assert [w[0] for w in lines if w[:1] in (["server"], ["server-template"])] == ["server"] * SESSIONS
    else:
        (template,) = [
            line.split() for line in text.splitlines() if line.strip().startswith("server-template")
        ]
        assert template[2] == "1-16" and "check" in template
        (shipped_template,) = [
            line.split() for line in shipped.splitlines() if line.strip().startswith("server-")
        ]
        shipped_slots = int(shipped_template[2].split("-")[1])
        assert shipped_slots >= load("cluster-aws.yaml")["available_node_types"]["session"]["max_workers"]
    assert ("ssl crt " + str(certificate) in text) == tls
    (tmp_path / name).write_text(text)
    check = subprocess.run(
        [haproxy, "-c", "-f", str(tmp_path / name)], check=False, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    edited = ("bind", "server", "stats socket")

    def kept(config: str) -> list[str]:
        return [line for line in config.splitlines() if not line.strip().startswith(edited)]

    assert kept(text) == kept(shipped), "the edits change the bind, server and socket lines only"
