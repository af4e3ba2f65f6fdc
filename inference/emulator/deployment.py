"""The Ray Serve deployment wrapping ``Engine`` (one per replica, with its own batches and
prefix cache and Ray metrics).

Callers stream ``list[InferenceEvent]`` items with
``handle.options(stream=True, method_name="generate", session_id=session_key).remote(request)``;
``SessionAffinityRouter`` routes them by ``inference.routing`` (a session's pinned replica,
else the prefix route; docs/emulator.md, "Routing").  The app builder binds the deployment
with ``deployment_options(config)``.
"""

from __future__ import annotations

import asyncio
import random
import time
import weakref
from collections.abc import AsyncGenerator
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
from ray.util import metrics

from inference import allocator, collector, priority
from inference.channel import ChannelServer, Endpoint
from inference.emulator import policy
from inference.emulator.engine import Engine
from inference.emulator.pacing import AsyncioSleeper, MonotonicClock
from inference.emulator.profiles import InferenceConfig, RoutingConfig
from inference.routing import Routes, routes_of
from inference.serve_autoscaling import SEQUENCES, ReportsLoad, autoscaling_config
from inference.types import InferenceEvent, InferenceRequest

# A stopping replica (a redeploy replaces it too) lets the calls on its channel finish for up
# to this long, as a draining gateway lets responses finish (server.drain_timeout_s): calls
# of hundreds of streams on one saturated replica outlast Serve's default 20 s.
CHANNEL_DRAIN_S = 30.0
GRACEFUL_SHUTDOWN_S = CHANNEL_DRAIN_S + 10  # Serve kills a stopping replica this long after asking it to stop


class SessionAffinityRouter(RequestRouter):
    """Pins each request's ``session_id`` to one live replica and routes requests without
    one by their prefix (``inference.routing``; ``RoutingConfig`` arrives as the router's
    kwargs).

    Runs inside each caller's ``DeploymentHandle``, so prefix request rates are counted per
    calling process.  A pinned replica that is full (``max_ongoing_requests``) is retried
    with Serve's backoff rather than abandoned, so a session never silently moves while its
    replica lives; a stateless request whose chosen replica is full falls back to the others
    in rank order.  Serve may ask again for the same request (retries): the decision is kept
    per request, so a request counts once towards its prefix's rate.  Serve's base router
    matches a chosen replica to exactly the request being routed (no FIFO re-assignment),
    which keeps one session's pick from being handed to another request.
    """

    def initialize_state(self, **kwargs: Any) -> None:
        self._setup(RoutingConfig.model_validate(kwargs))

    def _setup(self, config: RoutingConfig) -> None:
        self._routes = Routes(
            prefix_tokens=config.prefix_tokens,
            requests_per_min=config.prefix_requests_per_min,
            max_pins=config.max_pinned_sessions,
            max_prefixes=config.max_routed_prefixes,
        )
        self._decided = _Decisions()

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Serve's new set of running replicas; also this process's :class:`Routes`' view
        of them, published by the app's name (``inference.routing.routes_of``), where a
        session host decides a connection's first call with the same pins and counts."""
        super().update_replicas(replicas)
        self._publish(self.app_name, [r.replica_id.unique_id for r in replicas])

    def _publish(self, app: str, live: list[str]) -> None:
        if not hasattr(self, "_routes"):
            self._setup(RoutingConfig())
        self._routes = routes_of(app, lambda: self._routes) or self._routes  # one state a process
        self._routes.update(live)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if not hasattr(self, "_routes"):
            self._setup(RoutingConfig())
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        live = sorted(by_id)
        if pending_request is None:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        session = pending_request.metadata.session_id
        request = _inference_request(pending_request)
        if session:  # pinned for life; a new key is pinned where its conversation was, or its route goes
            route = None if request is None else (lambda: self._route(pending_request, request, live)[0])
            return [[by_id[self._routes.session(session, request, live, route)]]]
        if request is not None:
            order = self._route(pending_request, request, live)
            return [[by_id[order[0]]], [by_id[r] for r in order[1:]]]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    def _route(self, pending: PendingRequest, request: InferenceRequest, live: list[str]) -> list[str]:
        """The request's prefix route among ``live`` replicas, decided once per request (Serve
        reuses the pending request for its retries)."""
        order = [r for r in self._decided.get(pending) if r in live]
        if not order:
            order = self._routes.prefix(request, live)
            self._decided.put(pending, order)
        return order


class _Decisions:
    """Each pending request's prefix route, by the request's identity, dropped when Serve drops
    the request.  (A ``PendingRequest`` is an unhashable dataclass, and Serve's classes are not
    for storing our state on.)"""

    def __init__(self) -> None:
        self._routes: dict[int, list[str]] = {}

    def get(self, pending: PendingRequest) -> list[str]:
        return self._routes.get(id(pending), [])

    def put(self, pending: PendingRequest, order: list[str]) -> None:
        key = id(pending)  # unique while the request lives; the finalizer drops it before reuse
        if key not in self._routes:
            weakref.finalize(pending, self._routes.pop, key, None)
        self._routes[key] = order


def _inference_request(pending: PendingRequest) -> InferenceRequest | None:
    if not pending.args or not isinstance(pending.args[0], InferenceRequest):
        return None
    return pending.args[0]


@serve.deployment(
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=2048,
    # Ray annotates RequestRouterConfig's **kwargs as dicts (ray/serve/config.py); it takes a class.
    request_router_config=RequestRouterConfig(request_router_class=SessionAffinityRouter),  # type: ignore[arg-type]
)
class InferenceDeployment(ReportsLoad):
    """Emulated inference replica: ``generate`` (streaming), ``models`` and ``stats``; its
    load for the autoscaler is its batches' running and waiting sequences (:meth:`load`)."""

    def __init__(self, config: InferenceConfig | dict[str, Any]) -> None:
        allocator.tune()  # a prompt's ids arrive in buffers of hundreds of KB every turn
        self._config = (
            config if isinstance(config, InferenceConfig) else InferenceConfig.model_validate(config)
        )
        priority.prefer(self._config.scaling.nice)  # its event loop ahead of others for a core
        self._replica = _replica_tag() or ""
        self._metrics = RayMetrics(self._replica)
        clock = MonotonicClock()
        self._clock = clock
        self._engine = Engine(self._config, clock, AsyncioSleeper(clock), self._metrics, self._replica)
        self._created = int(time.time())
        self._rate_task: asyncio.Task[None] | None = None
        self._channel = ChannelServer(self._engine.generate, self._replica)  # no hop through generate
        # Load the tokenizer and the policy's corpus now (~0.2 s), not on the first request.
        policy.text_answer(1, random.Random(0))
        collector.freeze_startup()  # a full collection under load walks only the calls' objects

    async def generate(self, request: InferenceRequest) -> AsyncGenerator[list[InferenceEvent], None]:
        """Stream one response; see ``Engine.generate``.  Errors (``UnknownModelProfile``,
        ``UnknownToolChoice``, ``InvalidMetadata``, ``EngineOverloaded``) are raised, never
        yielded.  If the caller goes away, the generator is closed and the batch slot freed."""
        self._report()
        async for chunk in self._engine.generate(request):
            yield chunk

    async def channel(self) -> Endpoint:
        """Where this replica's direct channel listens (started on first ask), on the node's
        address: a session host streams its pinned connections' later calls over it
        (``inference.channel``), straight into the engine."""
        self._report()
        return await self._channel.start(ray.util.get_node_ip_address())

    def _report(self) -> None:
        """Start the once-a-second metrics report (:meth:`_report_rate`) if it is not running."""
        if self._rate_task is None:
            self._rate_task = asyncio.get_running_loop().create_task(self._report_rate())

    async def __del__(self) -> None:
        """Shutdown (Serve awaits it after routing stops): calls already on the channel
        finish; new ones are answered ``gone`` and their hosts go through Serve instead."""
        await self._channel.drain(CHANNEL_DRAIN_S)

    def load(self) -> dict[str, float]:
        """Running + waiting sequences: every call, through Serve or the direct channel
        (``inference.scaling.autoscaling.target_sequences`` scales on it)."""
        return {SEQUENCES: self._engine.sequences()}

    async def models(self) -> list[dict[str, Any]]:
        """The served models as OpenAI ``GET /v1/models`` entries."""
        return [
            {"id": p.id, "object": "model", "created": self._created, "owned_by": p.owned_by}
            for p in self._config.profiles
        ]

    async def stats(self) -> dict[str, Any]:
        """This replica's counters (requests, tokens, batches, prefix cache)."""
        return {
            "replica": self._replica or None,
            "channel_calls": self._channel.calls,
            **self._engine.stats(),
        }

    async def _report_rate(self, period_s: float = 1.0) -> None:
        """Every ``period_s``: delivered tokens/s over the last period, per replica, as a
        gauge, and the metrics counted since (``RayMetrics.flush``)."""
        last_t, last_n = self._clock.now(), self._metrics.tokens_sent
        while True:
            await asyncio.sleep(period_s)
            t, n = self._clock.now(), self._metrics.tokens_sent
            self._metrics.tokens_per_s.set((n - last_n) / (t - last_t))
            self._metrics.flush()
            last_t, last_n = t, n


class RayMetrics:
    """The engine's ``Observer`` backed by ``ray.util.metrics`` (exported by Ray's
    metrics agent, tagged by replica and, where it applies, model).  Names start with
    ``responses_ws_inference_``; durations are in seconds (docs/operations.md, Metrics).

    A Ray metric costs a few microseconds of Python a record, so nothing is recorded per
    item: the two histograms take one value per response (TTFT, and the response's mean
    inter-token latency), and the counters and gauges are counted here and handed to Ray
    by :meth:`flush`, which the deployment calls once a second (a worker's metrics reach
    Ray's agent every 10 s, Ray's ``metrics_report_interval_ms``: at most a second more).
    The gauges are set at every flush, changed or not: Ray's agent drops a gauge series not
    set again within two export intervals (Ray 2.60), an idle replica's too."""

    def __init__(self, replica: str) -> None:
        tags = {"replica": replica}
        self.tokens_sent = 0
        self._ttft = metrics.Histogram(
            "responses_ws_inference_ttft_seconds",
            "Time to first token (queue + prefill + first decode step), per response",
            boundaries=[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10],
            tag_keys=("replica", "model"),
        )
        self._itl = metrics.Histogram(
            "responses_ws_inference_itl_seconds",
            "Inter-token latency, per response: its mean after the first token, as sent",
            boundaries=[0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128],
            tag_keys=("replica", "model"),
        )
        self._tokens = metrics.Counter(
            "responses_ws_inference_output_tokens", "Output tokens sent", tag_keys=("replica", "model")
        )
        self.tokens_per_s = metrics.Gauge(
            "responses_ws_inference_tokens_per_second",
            "Output tokens/s sent by the replica (1 s window)",
            tag_keys=("replica",),
        )
        self._running = metrics.Gauge(
            "responses_ws_inference_running_seqs", "Sequences in the batch", tag_keys=("replica", "model")
        )
        self._waiting = metrics.Gauge(
            "responses_ws_inference_waiting_seqs",
            "Sequences waiting for a slot",
            tag_keys=("replica", "model"),
        )
        self._hits = metrics.Counter(
            "responses_ws_inference_prefix_hit_blocks", "Prefix-cache blocks reused", tag_keys=("replica",)
        )
        self._misses = metrics.Counter(
            "responses_ws_inference_prefix_miss_blocks",
            "Prefix-cache blocks prefilled",
            tag_keys=("replica",),
        )
        self._evictions = metrics.Counter(
            "responses_ws_inference_prefix_evicted_blocks",
            "Prefix-cache blocks evicted",
            tag_keys=("replica",),
        )
        for m in (
            self._ttft,
            self._itl,
            self._tokens,
            self.tokens_per_s,
            self._running,
            self._waiting,
            self._hits,
            self._misses,
            self._evictions,
        ):
            m.set_default_tags(tags)
        self._model_tags: dict[str, dict[str, str]] = {}
        self._unsent_tokens: dict[str, int] = {}  # by model, since the last flush
        self._batches: dict[str, tuple[int, int]] = {}  # by model: (running, waiting), as last seen
        self._blocks = [0, 0, 0]  # prefix-cache hit, miss and evicted blocks since the last flush

    def _tags(self, model: str) -> dict[str, str]:
        tags = self._model_tags.get(model)
        if tags is None:
            tags = self._model_tags[model] = {"model": model}
        return tags

    def first_token(self, model: str, ttft_s: float) -> None:
        self._ttft.observe(ttft_s, self._tags(model))

    def tokens(self, model: str, n: int) -> None:
        self.tokens_sent += n
        self._unsent_tokens[model] = self._unsent_tokens.get(model, 0) + n

    def itl(self, model: str, itl_s: float) -> None:
        self._itl.observe(itl_s, self._tags(model))

    def batch(self, model: str, running: int, waiting: int) -> None:
        self._batches[model] = (running, waiting)

    def prefix(self, hit_blocks: int, miss_blocks: int, evicted_blocks: int) -> None:
        blocks = self._blocks
        blocks[0] += hit_blocks
        blocks[1] += miss_blocks
        blocks[2] += evicted_blocks

    def flush(self) -> None:
        """Hand what was counted since the last flush to Ray: token and block counts, and
        each model's batch as last seen."""
        for model, n in self._unsent_tokens.items():
            if n:
                self._tokens.inc(n, self._tags(model))
        self._unsent_tokens.clear()
        for model, (running, waiting) in self._batches.items():
            self._running.set(running, self._tags(model))
            self._waiting.set(waiting, self._tags(model))
        for counter, n in zip((self._hits, self._misses, self._evictions), self._blocks):
            if n:
                counter.inc(n)
        self._blocks = [0, 0, 0]


def deployment_options(config: InferenceConfig) -> dict[str, Any]:
    """Options for ``InferenceDeployment.options(...)`` from the typed config.

    Fixed ``replicas`` or ``scaling.autoscaling``; ``num_cpus=0`` always; a custom
    accelerator resource per replica when ``scaling.accelerator_resource`` is set;
    ``SessionAffinityRouter`` with the ``routing`` section as its kwargs, or Serve's
    default router when ``scaling.session_affinity`` is off.
    """
    scaling = config.scaling
    actor: dict[str, Any] = {"num_cpus": 0}
    if scaling.accelerator_resource:
        actor["resources"] = {scaling.accelerator_resource: scaling.accelerator_per_replica}
    options: dict[str, Any] = {
        "ray_actor_options": actor,
        "max_ongoing_requests": scaling.max_ongoing_requests,
        "graceful_shutdown_timeout_s": GRACEFUL_SHUTDOWN_S,
    }
    auto = scaling.autoscaling
    if auto is not None and auto.target_sequences is not None:
        options["autoscaling_config"] = autoscaling_config(
            metric=SEQUENCES,
            target_per_replica=auto.target_sequences,
            bounds=auto,
        )
    elif auto is not None:
        options["autoscaling_config"] = auto.model_dump(
            exclude={"target_sequences", "metrics_interval_s", "look_back_period_s"}
        )
    else:
        options["num_replicas"] = config.replicas
    if scaling.session_affinity:
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=SessionAffinityRouter,  # type: ignore[arg-type]  # Ray's **kwargs: dict
            request_router_kwargs=config.routing.model_dump(),
        )
    else:
        options["request_router_config"] = RequestRouterConfig()
    return options


def _replica_tag() -> str | None:
    try:
        return serve.get_replica_context().replica_tag
    except Exception:  # noqa: BLE001 -- RayServeException outside a replica (e.g. a unit test)
        return None
