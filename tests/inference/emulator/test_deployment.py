"""deployment: the Serve wrapper, exercised as a plain class (no cluster).  The import and
``.bind()`` rules for every package are in tests/test_layout.py."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import replace
from types import SimpleNamespace

from inference import chat_format as cf
from inference.emulator.profiles import load_inference_config
from inference.types import Done, InferenceRequest, Prefilled


def test_replica_class_streams_lists_models_and_reports_stats():
    from inference.emulator.deployment import InferenceDeployment

    cfg = load_inference_config()
    replica = InferenceDeployment.func_or_class(cfg.model_dump())  # dict config, as YAML args
    req = InferenceRequest("r", "emu-fast", cf.render_message("user", "hi"), session_key="s")

    async def main():
        chunks = [chunk async for chunk in replica.generate(req)]
        return chunks, await replica.models(), await replica.stats()

    chunks, models, stats = asyncio.run(main())
    assert isinstance(chunks[0][0], Prefilled) and isinstance(chunks[-1][-1], Done)
    assert [m["id"] for m in models] == ["emu-fast", "emu-gpu", "emu-cache"]
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in models)
    assert stats["completed"] == 1 and stats["replica"] is None


def test_deployment_options_fixed_replicas_cpu_free_and_session_affinity():
    from inference.emulator.deployment import (
        CHANNEL_DRAIN_S,
        InferenceDeployment,
        SessionAffinityRouter,
        deployment_options,
    )

    cfg = load_inference_config().model_copy(update={"replicas": 3})
    opts = deployment_options(cfg)
    assert opts["num_replicas"] == 3 and "autoscaling_config" not in opts
    assert opts["ray_actor_options"] == {"num_cpus": 0}
    assert opts["graceful_shutdown_timeout_s"] > CHANNEL_DRAIN_S  # the channel's calls finish before the kill
    router = opts["request_router_config"]
    assert router.get_request_router_class() is SessionAffinityRouter
    assert router.request_router_kwargs == cfg.routing.model_dump()
    assert router.request_router_kwargs["prefix_requests_per_min"] == 15  # the documented default
    default = InferenceDeployment._deployment_config.request_router_config
    assert default.get_request_router_class() is SessionAffinityRouter
    InferenceDeployment.options(**opts)  # Serve accepts them


def test_deployment_options_autoscaling_and_accelerator_placement():
    from inference.emulator.deployment import InferenceDeployment, deployment_options
    from inference.emulator.profiles import AutoscalingConfig, ScalingConfig

    cfg = load_inference_config().model_copy(
        update={
            "scaling": ScalingConfig(
                autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=8),
                accelerator_resource="accelerator",
                accelerator_per_replica=1,
                session_affinity=False,
            )
        }
    )
    opts = deployment_options(cfg)
    assert "num_replicas" not in opts
    assert opts["autoscaling_config"]["max_replicas"] == 4
    assert opts["autoscaling_config"]["target_ongoing_requests"] == 8
    assert opts["ray_actor_options"] == {"num_cpus": 0, "resources": {"accelerator": 1}}
    assert "PowerOfTwo" in opts["request_router_config"].request_router_class
    assert "policy" not in opts["autoscaling_config"]  # Serve's own policy on its requests
    InferenceDeployment.options(**opts)


def test_deployment_options_autoscale_on_the_replicas_sequences():
    from inference.emulator.deployment import InferenceDeployment, deployment_options
    from inference.emulator.profiles import AutoscalingConfig, ScalingConfig

    auto = AutoscalingConfig(min_replicas=1, max_replicas=4, target_sequences=32, metrics_interval_s=1)
    cfg = load_inference_config().model_copy(update={"scaling": ScalingConfig(autoscaling=auto)})
    opts = deployment_options(cfg)
    assert "target_ongoing_requests" not in opts["autoscaling_config"]
    assert opts["autoscaling_config"]["metrics_interval_s"] == 1
    assert opts["autoscaling_config"]["policy"] == {
        "policy_function": "inference.serve_autoscaling:LoadPolicy",
        "policy_kwargs": {"metric": "responses_ws_sequences", "target_per_replica": 32.0},
    }
    InferenceDeployment.options(**opts)  # Serve accepts it


# --- the Serve request router, driven with stand-ins for Serve's replica and request ----


def _router(**routing):
    from inference.emulator.deployment import SessionAffinityRouter

    router = object.__new__(SessionAffinityRouter)  # no Serve machinery needed for the decision
    router.initialize_state(**routing)
    return router


def _replicas(*ids):
    return [SimpleNamespace(replica_id=SimpleNamespace(unique_id=i)) for i in ids]


class _Pending(SimpleNamespace):
    """Stands for Serve's ``PendingRequest`` (a dataclass: weak-referenceable, unhashable)."""


def _pending(request, session=""):
    return _Pending(args=[request], kwargs={}, metadata=SimpleNamespace(session_id=session))


def _choose(router, replicas, pending):
    ranks = asyncio.run(router.choose_replicas(replicas, pending))
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


PROMPT = tuple(cf.render_instructions("You are a coding agent. " * 80) + cf.render_message("user", "go"))


def _req(rid="r", scope="key:a", prompt_cache_key=None):
    return InferenceRequest(rid, "emu-fast", PROMPT, cache_scope=scope, prompt_cache_key=prompt_cache_key)


def test_the_router_sends_a_stateless_request_to_its_prefix_route_with_fallbacks():
    from inference.routing import prefix_key, ranked

    router, replicas = _router(), _replicas("x", "y", "z")
    order = ranked(prefix_key(PROMPT, "key:a", None), ["x", "y", "z"])
    assert _choose(router, replicas, _pending(_req())) == [order[:1], order[1:]]


def test_a_request_counts_once_however_often_serve_asks():
    router, replicas = _router(prefix_requests_per_min=2), _replicas("x", "y")
    pending = _pending(_req())
    first = _choose(router, replicas, pending)
    for _ in range(5):  # Serve's retries of the same request (e.g. its replica was full)
        assert _choose(router, replicas, pending) == first
    assert _choose(router, replicas, _pending(_req("r2")))[0] == first[0][:1]  # the 2nd of 2 per minute
    assert _choose(router, replicas, _pending(_req("r3")))[0] != first[0][:1]  # the 3rd spills


def test_a_new_socket_is_pinned_where_its_keys_http_requests_go_and_stays():
    router, replicas = _router(), _replicas("x", "y", "z")
    http = _choose(router, replicas, _pending(_req()))[0]
    assert _choose(router, replicas, _pending(_req("w1"), session="conn-1")) == [http]
    other = InferenceRequest(
        "w2", "emu-fast", tuple(cf.render_message("user", "elsewhere")) * 50, cache_scope="key:a"
    )
    assert _choose(router, replicas, _pending(other, session="conn-1")) == [http]  # pinned for life
    # another key's socket with the same prompt has its own route (and its own cache scope)
    routes = {
        tuple(_choose(router, replicas, _pending(_req(f"k{i}", scope=f"key:{i}"), session=f"c{i}"))[0])
        for i in range(30)
    }
    assert len(routes) > 1


def test_a_requests_decision_is_dropped_with_the_request():
    router, replicas = _router(), _replicas("x", "y")
    pending = _pending(_req())
    _choose(router, replicas, pending)
    assert len(router._decided._routes) == 1
    del pending  # Serve dropped the request: its decision goes with it
    gc.collect()
    assert not router._decided._routes


def test_a_session_hosts_first_call_pick_and_the_router_share_one_state():
    """The router publishes its state at Serve's replica updates; the session host's pick
    (``Routes.first_call``) pins a key where the router would, and the router, asked later
    for that key, answers the pin; a second router of the app in the process shares it."""
    from inference.routing import routes_of

    router, replicas = _router(), _replicas("x", "y", "z")
    router._publish("test-app-shared", ["x", "y", "z"])
    routes = routes_of("test-app-shared")
    assert routes is not None and routes.live == ("x", "y", "z")
    picked = routes.first_call(replace(_req("h1"), session_key="conn-9"))
    assert _choose(router, replicas, _pending(_req("h2"), session="conn-9")) == [[picked]]
    other = _router()
    other._publish("test-app-shared", ["x", "y"])
    assert routes.live == ("x", "y")  # one state a process: the newer view of the replicas
    if picked in ("x", "y"):
        assert _choose(other, _replicas("x", "y"), _pending(_req("h3"), session="conn-9")) == [[picked]]


def test_a_new_key_is_pinned_to_its_conversations_replica_while_it_lives():
    """A connection resumed in another process (a new session key for this router) names the
    replica that served its conversation (its first turn was spilled there by another
    router): it is pinned there, not where this router's prefix route goes; a hint naming a
    replica gone takes the route."""
    from dataclasses import replace

    router, replicas = _router(), _replicas("x", "y")
    route = _choose(router, replicas, _pending(_req("r0"), session="c0"))[0][0]
    other = "y" if route == "x" else "x"
    hinted = replace(_req("r1"), replica_hint=other)
    assert _choose(router, replicas, _pending(hinted, session="c1")) == [[other]]
    assert _choose(router, replicas, _pending(_req("r2"), session="c1")) == [[other]]  # pinned
    gone = replace(_req("r3"), replica_hint="z")
    assert _choose(router, replicas, _pending(gone, session="c2")) == [[route]]


def test_a_call_over_the_channel_streams_from_the_engine_and_starts_the_metrics_report():
    from inference.channel import ChannelClient
    from inference.emulator.deployment import InferenceDeployment

    replica = InferenceDeployment.func_or_class(load_inference_config())
    req = InferenceRequest("r", "emu-fast", cf.render_message("user", "hi"), session_key="s")

    async def main():
        client = ChannelClient(await replica.channel())
        await client.connect()
        try:
            chunks = [chunk async for chunk in client.stream(req)]
        finally:
            client.close()
        return chunks, await replica.stats(), replica._rate_task

    chunks, stats, reporting = asyncio.run(main())
    assert isinstance(chunks[0][0], Prefilled) and isinstance(chunks[-1][-1], Done)
    assert stats["channel_calls"] == 1 and stats["completed"] == 1
    assert reporting is not None  # started with the channel, not by a call through Serve
