"""Test apps on the suite's embedded Ray (the ``ray_cluster`` fixture starts it)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from inference.emulator.profiles import load_inference_config
from serve.embedded import deploy, local_config
from tests.support.waiting import wait_until

T = TypeVar("T")

# The only API keys the ``keyed_url`` app accepts (tests/conftest.py).
ALICE, BOB = "sk-iso-alice-4b1d7e", "sk-iso-bob-c09a52"


def busy_profiles() -> list[dict]:
    """The model profiles with one sequence per inference replica and no queue: a second
    response at once is refused (overload is reachable)."""
    profiles = load_inference_config().model_dump()["profiles"]
    for profile in profiles:
        profile["batching"].update(max_running=1, max_waiting=0, knee=1)
    return profiles


def start_app(name: str, **overrides: Any) -> str:
    """Deploy the app as ``name`` on a free port, with ``section.key`` overrides of the
    default config; returns its base URL.  The caller deletes it (``serve.delete(name)``),
    or the end of the test session's Ray takes it."""
    return deploy(local_config(**overrides), name=name)


def start_apps(apps: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Deploy the apps ``{name: overrides}`` at once, as :func:`start_app` does each; their
    base URLs, once every one answers.  An app's deploy keeps about one core busy for its
    ~5 s (new processes importing the server: docs/testing.md), so two cores deploy two at
    a time."""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    configs: dict[str, Any] = {}
    for name, overrides in apps.items():  # one port each (free_port may answer one twice)
        while (config := local_config(**overrides)).server.port in {c.server.port for c in configs.values()}:
            pass
        configs[name] = config
    serve.start(proxy_location="Disabled")  # here, once: the deploys below connect to it
    with ThreadPoolExecutor(max(1, len(configs))) as pool:
        urls = {name: pool.submit(deploy, config, name=name) for name, config in configs.items()}
        return {name: url.result() for name, url in urls.items()}


@contextlib.contextmanager
def running_apps(apps: dict[str, dict[str, Any]]) -> Iterator[dict[str, str]]:
    """The apps ``{name: overrides}`` deployed at once (:func:`start_apps`), their base URLs,
    each stopped at the end (:func:`stop_app`): a module fixture's apps."""
    urls = start_apps(apps)
    yield urls
    for name in urls:
        stop_app(name)


def stop_app(name: str) -> None:
    """Delete the app ``name`` without waiting for its replicas to stop (a blocking delete
    waits ~3 s for the gateway's drain); for a fixture's or test's end, when nothing
    after it needs the app gone.  A redeploy that must see the old app's writes flushed
    uses ``serve.delete(name)``."""
    from ray import serve

    serve.delete(name, _blocking=False)


def delete_apps(*names: str, timeout_s: float = 60) -> None:
    """Delete the apps ``names`` at once and wait until every one is gone (its gateway
    drained: what it had pending is written), as a blocking ``serve.delete`` of each would,
    one after another."""
    from ray import serve

    for name in names:
        serve.delete(name, _blocking=False)
    wait_until(
        lambda: not set(names) & set(serve.status().applications),
        timeout_s,
        f"the apps {names} to be deleted",
        every_s=0.1,
    )


def gateway_stats(app: str) -> dict[str, Any]:
    """The gateway's ``stats()`` (open sockets, the session-host pool) of the app ``app``."""
    from ray import serve

    async def stats() -> dict[str, Any]:
        return await serve.get_deployment_handle("Gateway", app_name=app).stats.remote()

    # With Serve's throughput mode (the embedded Ray's) a handle's router runs in the event
    # loop it was first used in, and a blocking ``.result()`` outside a loop raises "No event
    # loop running": the calls share one loop on a thread of their own.
    return on_handle_loop(stats(), timeout_s=60)


def on_handle_loop(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run ``coro`` — Serve handle calls from the test process — on the one loop the
    handles' routers live in (see :func:`gateway_stats`)."""
    return asyncio.run_coroutine_threadsafe(coro, _handle_loop()).result(timeout=timeout_s)


@functools.cache
def _handle_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="serve-handles", daemon=True).start()
    return loop


def wait_for(
    predicate: Callable[[], T], timeout_s: float = 20.0, what: str = "condition", every_s: float = 0.1
) -> T:
    """:func:`tests.support.waiting.wait_until` with the defaults this module's callers had."""
    return wait_until(predicate, timeout_s, what, every_s=every_s)
