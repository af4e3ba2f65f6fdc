"""Which inference replica Serve's router would send a call to, without sending it (Ray 2.60).

A connection's first model call after a reconnect goes over a direct channel the session
host already holds (:mod:`.direct`) when the replica the router picks for it is one the host
has a channel to.  The pick is the router's own decision — the deployment's request router
(``inference.emulator.deployment.SessionAffinityRouter``) pins the call's session key as it
would for the call itself, by its replica hint or its prefix route — made by
``DeploymentHandle._choose_replica`` with ``_reserve=False``: no replica is reserved and
nothing leaves the process.  Both are private in Ray 2.60 (``ray/serve/_private/router.py``:
the "pick-only callers" opt-out), so this is the one module that uses them:
:func:`supported` is false on another Ray series (the first call then goes through Serve,
as before), and tests/integration/test_websocket_raw.py fails when the pick stops working.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.serve._private.request_router.replica_wrapper import ReplicaSelection
from ray.serve.handle import DeploymentHandle

from inference.types import InferenceRequest

PINNED_RAY = "2.60."  # the series whose router this module was read against


def supported(version: str | None = None) -> bool:
    """Whether the installed Ray is the series this module was written against."""
    return (ray.__version__ if version is None else version).startswith(PINNED_RAY)


async def picked_replica(handle: DeploymentHandle[Any], request: InferenceRequest) -> str:
    """The replica tag (``serve.get_replica_context().replica_tag``) the router of ``handle``
    picks for ``request`` (its ``session_key`` as Serve's ``session_id``, as the call itself
    would carry it)."""
    routed = handle.options(session_id=request.session_key) if request.session_key else handle
    selection: ReplicaSelection
    async with routed._choose_replica((request,), {"_reserve": False}) as selection:
        return str(selection.replica_id)
