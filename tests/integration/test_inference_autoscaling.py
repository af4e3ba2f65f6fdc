"""The inference tier scales on its real load (inference/serve_autoscaling.py): calls made only
over the direct channel, which Serve's request metrics never see, still count — each replica
reports its running + waiting sequences, and Serve adds a replica for them, then removes it
once they end."""

from __future__ import annotations

import asyncio
import time

from ray import serve

from inference.channel import ChannelClient
from inference.emulator.deployment import InferenceDeployment, deployment_options
from inference.emulator.profiles import AutoscalingConfig, ScalingConfig, load_inference_config
from inference.types import InferenceRequest
from tests.support.server import stop_app

APP = "rws-inference-autoscale"


def running(app: str) -> int:
    status = serve.status().applications[app].deployments["InferenceDeployment"]
    return status.replica_states.get("RUNNING", 0)


async def wait_for(predicate, timeout_s: float, what: str) -> float:
    """Seconds until ``predicate()`` holds (Serve's controller decides every few tenths)."""
    from tests.support.waiting import until

    start = time.monotonic()
    await until(predicate, timeout_s, what, every_s=0.25)
    return time.monotonic() - start


def test_calls_over_the_direct_channel_scale_the_inference_tier(ray_cluster):
    auto = AutoscalingConfig(
        min_replicas=1,
        max_replicas=2,
        target_sequences=1,
        upscale_delay_s=0,
        downscale_delay_s=0,
        metrics_interval_s=0.5,
        look_back_period_s=1,
    )
    config = load_inference_config().model_copy(
        update={"scaling": ScalingConfig(autoscaling=auto, session_affinity=False)}
    )
    app = InferenceDeployment.options(**deployment_options(config)).bind(config.model_dump())
    handle = serve.run(app, name=APP, route_prefix=None)
    try:
        assert running(APP) == 1
        endpoint = handle.channel.remote().result()

        async def scenario() -> tuple[float, float]:
            client = ChannelClient(endpoint)
            await client.connect()
            calls = [
                client.stream(
                    InferenceRequest(
                        request_id=f"r{i}",
                        model="emu-gpu",  # ~65 tokens/s: a call of 2000 tokens lasts ~30 s
                        prompt_token_ids=list(range(100)),
                        metadata=(("emulator.text_tokens", "2000"),),
                    )
                )
                for i in range(2)
            ]
            readers = [asyncio.create_task(drain(c)) for c in calls]
            try:
                up = await wait_for(lambda: running(APP) == 2, 25, "no second replica for 2 channel calls")
            finally:
                for c in calls:
                    c.close()
                for r in readers:
                    r.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
                client.close()
            down = await wait_for(
                lambda: running(APP) == 1, 60, "the second replica stayed after the calls ended"
            )
            return up, down

        up, down = asyncio.run(scenario())
        print(f"2 channel calls: 1 -> 2 replicas in {up:.1f}s; back to 1 in {down:.1f}s after they ended")
    finally:
        stop_app(APP)  # nothing after this test needs it gone: no wait for its replicas


async def drain(call) -> None:
    async for _ in call:
        pass
