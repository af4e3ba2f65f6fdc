"""The Ray internals the benchmarks use, for want of a public API in the pinned Ray.

Each function says what Ray 2.60 lacks; :data:`RAY_SERIES` is the Ray these were
written against, checked against the installed Ray and the project's pin by
``tests/bench/test_ray_internals.py``: a Ray upgrade fails there first.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve.schema import ServeDeploySchema

RAY_SERIES = "2.60"  # pyproject.toml: ray[serve]==2.60.*


def live_actors() -> list[dict[str, Any]]:
    """Every live actor of the connected cluster as the GCS lists it (class name, pid, node).
    The public ``ray.util.state.list_actors`` asks the dashboard, which the benchmarks'
    clusters do not start."""
    from ray._private import state

    return [a for a in state.actors().values() if a.get("State") == "ALIVE"]


@contextlib.contextmanager
def no_address_file() -> Iterator[None]:
    """A head node started inside this block does not record itself as the machine's current
    cluster (``/tmp/ray/ray_current_cluster``, never removed), which would make every
    address-less ``ray.init()`` on the machine join it.  Ray has no option for that."""
    import ray._private.utils as ray_utils

    write = ray_utils.write_ray_address
    ray_utils.write_ray_address = lambda *a, **k: None
    try:
        yield
    finally:
        ray_utils.write_ray_address = write


def serve_start_and_deploy(config: ServeDeploySchema) -> None:
    """What ``serve run <config.yaml>`` does with a ``ServeDeploySchema`` (``serve deploy``
    needs the dashboard): start Serve with the file's options and deploy its applications,
    without waiting for them."""
    from ray.serve._private import api as serve_api
    from ray.serve.config import gRPCOptions

    client = serve_api.serve_start(
        http_options=config.http_options.model_dump(),
        proxy_location=config.proxy_location,
        grpc_options=gRPCOptions(**config.grpc_options.model_dump()),
    )
    client.deploy_apps(config, _blocking=False)


def stop_long_poll_clients() -> None:
    """Stop this process's Serve long-poll clients while their loop still runs.  Left
    running, one answers the app's deletion after ``asyncio.run`` closed the loop, and its
    "loop not running" notice to the controller (an actor call from a Ray callback thread)
    re-initialises Ray while ``ray.shutdown`` holds Ray's lock: the benchmark never exited
    (seen twice, py-spy: ``auto_init_ray`` waiting in ``LongPollClient._schedule_to_event_loop``
    beside ``ray.shutdown``).  Ray has no public way to stop them: found by type."""
    from ray.serve._private.long_poll import LongPollClient

    for client in (o for o in gc.get_objects() if isinstance(o, LongPollClient)):
        client.stop()
