"""Every deployment YAML in configs/ validates against Ray's own schemas, and the Serve
configs' ``args`` are valid application configs that place what they say they place."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema

from inference.emulator.deployment import deployment_options
from serve.builder import gateway_options
from serve.config import app_config_from_dict

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CLUSTER_YAMLS = sorted(CONFIGS.glob("cluster-*.yaml"))
SERVE_YAMLS = sorted(CONFIGS.glob("serve-*.yaml"))
RAY_SCHEMA = Path(ray.autoscaler.__file__).parent / "ray-schema.json"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_there_are_cluster_and_serve_configs():
    assert {p.name for p in CLUSTER_YAMLS} >= {"cluster-local.yaml", "cluster-aws.yaml"}
    assert {p.name for p in SERVE_YAMLS} >= {"serve-single-node.yaml", "serve-cluster.yaml"}


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=lambda p: p.name)
def test_ray_up_yaml_matches_the_autoscaler_schema(path):
    config = load(path)
    jsonschema.validate(config, json.loads(RAY_SCHEMA.read_text()))  # as written
    validate_config(prepare_config(config))  # as `ray up` fills it out


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=lambda p: p.name)
def test_ray_up_yaml_starts_every_node_with_token_auth_and_throughput_mode(path):
    text = path.read_text()
    assert "RAY_AUTH_MODE=token" in text and "RAY_SERVE_THROUGHPUT_OPTIMIZED=1" in text
    assert '"session": 1' in text or "session: 1" in text
    assert '"accelerator"' in text or "accelerator:" in text


def test_cloud_yaml_has_head_session_and_accelerator_node_types():
    config = load(CONFIGS / "cluster-aws.yaml")
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    assert types["session"]["resources"] == {"session": 1}
    assert types["accelerator"]["resources"]["accelerator"] >= 1


@pytest.mark.parametrize("path", SERVE_YAMLS, ids=lambda p: p.name)
def test_serve_config_matches_serve_deploy_schema(path):
    schema = ServeDeploySchema.model_validate(load(path))
    assert schema.proxy_location == "Disabled"  # the Gateway listens itself
    (app,) = schema.applications
    assert app.import_path == "serve.builder:app_builder"
    config = app_config_from_dict(app.args, environ={})
    assert config.session.inference_app == app.name


def test_cluster_serve_config_places_gateways_on_session_nodes_and_inference_on_accelerators():
    (app,) = load(CONFIGS / "serve-cluster.yaml")["applications"]
    config = app_config_from_dict(app["args"], environ={})
    gw = gateway_options(config.server)
    assert gw["ray_actor_options"] == {"num_cpus": 0, "resources": {"session": 1.0}}
    assert gw["max_replicas_per_node"] == 1
    assert "max_surge_percent" not in gw  # one gateway per node: a replacement has to wait for the old one
    assert "num_replicas" not in gw  # the session tier scales on its connections
    assert gw["autoscaling_config"]["policy"]["policy_kwargs"] == {
        "metric": "responses_ws_connections",
        "target_per_replica": float(config.server.target_connections_per_node),
    }
    inf = deployment_options(config.inference)
    assert inf["ray_actor_options"]["resources"] == {"accelerator": 1.0}
    assert inf["autoscaling_config"]["max_replicas"] >= 2
    assert inf["autoscaling_config"]["policy"]["policy_kwargs"]["metric"] == "responses_ws_sequences"
    assert config.store.backend == "redis"  # state every node can reach


def test_single_node_serve_config_needs_no_custom_resources():
    (app,) = load(CONFIGS / "serve-single-node.yaml")["applications"]
    config = app_config_from_dict(app["args"], environ={})
    assert gateway_options(config.server)["ray_actor_options"] == {"num_cpus": 0}
    assert (
        gateway_options(config.server)["max_surge_percent"] == 100
    )  # a redeploy starts the new gateway first
    assert "resources" not in deployment_options(config.inference)["ray_actor_options"]


def test_gpu_cluster_config_serves_a_real_model_from_its_gpu_nodes():
    (app,) = load(CONFIGS / "serve-cluster-gpu.yaml")["applications"]
    config = app_config_from_dict(app["args"], environ={})
    (backend,) = config.session.backends
    assert backend.kind == "openai" and backend.url.endswith(":8000/v1")
    gpu = load(CONFIGS / "cluster-aws-gpu.yaml")["available_node_types"]["gpu"]
    assert gpu["node_config"]["InstanceType"].startswith("g5")
    started = " ".join(gpu["worker_setup_commands"])
    assert (
        "vllm.entrypoints.openai.api_server" in started
        and f"--served-model-name {backend.served_name}" in started
    )
    assert "--enable-prefix-caching" in started and "--enable-prompt-tokens-details" in started


@pytest.mark.parametrize(
    "path",
    [CONFIGS / "cluster-local.yaml", CONFIGS / "cluster-aws.yaml", CONFIGS / "cluster-aws-gpu.yaml"],
    ids=lambda p: p.name,
)
def test_ray_up_yaml_sends_the_source_only_secures_redis_and_ties_nodes_to_the_head(path):
    """What `ray up` for real needed (tests/multinode/test_ray_up.py runs it): the mount sends
    no virtualenv, cache or data; Redis has a password and the head's address, not 0.0.0.0;
    every node's start command starts the watchdog (ray down stops the head only); a lower
    hard limit of open files is used, not ignored."""
    config = load(path)
    assert config["rsync_filter"] == [".gitignore"]
    assert {"/.git", "/.venv*", "/.mypy_cache", "/data", "/results"} <= set(config["rsync_exclude"])
    head = " ".join(config["head_start_ray_commands"])
    assert "requirepass" in head and "bind $HEAD_IP" in head and "0.0.0.0" not in head.split("ray start")[0]
    assert "--pidfile ~/.responses-ws/redis.pid" in head
    for start in (head, " ".join(config["worker_start_ray_commands"])):
        assert 'ulimit -n "$(ulimit -Hn)"' in start
    assert (
        "serve.node_watchdog" in " ".join(config["worker_start_ray_commands"])
        or path.name != "cluster-local.yaml"
    )
    assert "~/.responses-ws/redis-password" in config["file_mounts"]
    (app,) = load(CONFIGS / "serve-cluster.yaml")["applications"]
    assert app["args"]["store"]["redis_password_file"] == "~/.responses-ws/redis-password"


def test_local_yaml_runs_the_autoscaler_v1_that_launches_every_worker():
    head = " ".join(load(CONFIGS / "cluster-local.yaml")["head_start_ray_commands"])
    assert "RAY_enable_autoscaler_v2=0 ray start --head" in head  # ray #57153
