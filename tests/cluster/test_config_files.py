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

from inference.deployment import deployment_options
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
    inf = deployment_options(config.inference)
    assert inf["ray_actor_options"]["resources"] == {"accelerator": 1.0}
    assert inf["autoscaling_config"]["max_replicas"] >= 2
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
