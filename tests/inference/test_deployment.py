"""deployment: the Serve wrapper, exercised as a plain class (no cluster).  The import and
``.bind()`` rules for every package are in tests/test_layout.py."""

from __future__ import annotations

import asyncio

from inference import chat_format as cf
from inference.profiles import load_inference_config
from inference.types import Done, InferenceRequest, Prefilled

def test_replica_class_streams_lists_models_and_reports_stats():
    from inference.deployment import InferenceDeployment

    cfg = load_inference_config()
    replica = InferenceDeployment.func_or_class(cfg.model_dump())  # dict config, as YAML args
    req = InferenceRequest("r", "emu-fast", cf.render_message("user", "hi"), session_key="s")

    async def main():
        chunks = [chunk async for chunk in replica.generate(req)]
        return chunks, await replica.models(), await replica.stats()

    chunks, models, stats = asyncio.run(main())
    assert isinstance(chunks[0][0], Prefilled) and isinstance(chunks[-1][-1], Done)
    assert [m["id"] for m in models] == ["emu-fast", "emu-gpu"]
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in models)
    assert stats["completed"] == 1 and stats["replica"] is None


def test_deployment_options_fixed_replicas_cpu_free_and_session_affinity():
    from inference.deployment import InferenceDeployment, SessionAffinityRouter, deployment_options

    cfg = load_inference_config().model_copy(update={"replicas": 3})
    opts = deployment_options(cfg)
    assert opts["num_replicas"] == 3 and "autoscaling_config" not in opts
    assert opts["ray_actor_options"] == {"num_cpus": 0}
    assert "request_router_config" not in opts  # the class default: session affinity
    router = InferenceDeployment._deployment_config.request_router_config
    assert router.get_request_router_class() is SessionAffinityRouter
    InferenceDeployment.options(**opts)  # Serve accepts them


def test_deployment_options_autoscaling_and_accelerator_placement():
    from inference.deployment import InferenceDeployment, deployment_options
    from inference.profiles import AutoscalingConfig, ScalingConfig

    cfg = load_inference_config().model_copy(update={"scaling": ScalingConfig(
        autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=8),
        accelerator_resource="accelerator", accelerator_per_replica=1, session_affinity=False)})
    opts = deployment_options(cfg)
    assert "num_replicas" not in opts
    assert opts["autoscaling_config"]["max_replicas"] == 4
    assert opts["autoscaling_config"]["target_ongoing_requests"] == 8
    assert opts["ray_actor_options"] == {"num_cpus": 0, "resources": {"accelerator": 1}}
    assert "PowerOfTwo" in opts["request_router_config"].request_router_class
    InferenceDeployment.options(**opts)
