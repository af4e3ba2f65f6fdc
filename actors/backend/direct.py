"""A connection's model calls go straight to its pinned replica (``inference.channel``).

A session key's call goes the backend's usual way (through Serve, whose router pins the key
to a replica) until the host holds a channel to the key's replica; its ``Prefilled`` names
the replica.  From then on the key's calls stream over it: one TCP connection per (host,
replica), shared by the host's connections.  Given ``pick`` (where the usual way's router
sends a key's call, pinning the key there as it would: ``inference.routing.Routes``), a
key's first call goes over a channel too when the host already holds one to the replica
picked: in a storm of first turns, the channels the host's other connections opened carry
them; a pick of a replica the host holds no channel to (a replica just added) goes the usual
way, which opens one.  A call the channel could not start
(the replica is stopping, or the channel is gone before any output) is made the usual way,
which also re-pins the key if its replica died; a channel lost mid-call fails that call, as
losing the replica would through Serve.  The usual way and the endpoint lookup
are given (:mod:`.ray_serve` gives Serve's).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable

from inference.channel import ChannelCall, ChannelClient, ChannelUnavailable, Endpoint
from inference.types import InferenceEvent, InferenceRequest, Prefilled

from . import EventStream

log = logging.getLogger(__name__)

Stream = Callable[[InferenceRequest], AsyncGenerator[list[InferenceEvent], None]]
# The endpoint of the replica a session key is pinned to (asked through the key's route).
FindEndpoint = Callable[[str], Awaitable[Endpoint]]
# The replica the usual way's router would send a call to, its key pinned there (or None).
Pick = Callable[[InferenceRequest], "str | None"]

MAX_PINS = 65536  # session keys remembered per host (LRU); a forgotten one is re-learnt
RETRY_S = 30.0  # after a failed attempt to open a replica's channel


class DirectCalls:
    """Routes each call over its session's replica channel when there is one, else ``usual``."""

    def __init__(
        self, usual: Stream, find: FindEndpoint, clock: Callable[[], float], pick: Pick | None = None
    ) -> None:
        self._usual = usual
        self._find = find
        self._clock = clock
        self._pick = pick
        self._pins: OrderedDict[str, str] = OrderedDict()  # session key -> replica tag
        self._channels: dict[str, ChannelClient] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._failed: dict[str, float] = {}  # replica tag -> when its channel failed to open
        self.direct_calls = 0

    def channel_for(self, key: str | None) -> ChannelClient | None:
        if not key:
            return None
        replica = self._pins.get(key)
        channel = self._channels.get(replica) if replica is not None else None
        if channel is None or not channel.open:
            return None
        self._pins.move_to_end(key)
        return channel

    def stream(self, request: InferenceRequest) -> EventStream:
        """``InferenceClient.stream``.  A call over a channel starts now (its request is on
        its way when this returns), so the iterator must be closed even if it is never
        iterated; a call the channel cannot take goes the usual way, nothing lost."""
        channel = self.channel_for(request.session_key)
        if channel is None and self._pick is not None and request.session_key:
            channel = self._picked(request.session_key, request)
        if channel is not None:
            try:
                return _Direct(self, channel, channel.stream(request), request)
            except ChannelUnavailable as exc:
                self._not_taken(channel, exc)
        return self._usual_route(request)

    def _picked(self, key: str, request: InferenceRequest) -> ChannelClient | None:
        """The open channel to the replica picked for ``key``'s call (its key pinned to
        it here too), or ``None``: the call goes the usual way."""
        assert self._pick is not None
        try:
            replica = self._pick(request)
        except Exception as exc:  # noqa: BLE001 - the usual route routes it again
            log.info("no replica picked for a call (%r): through the usual route", exc)
            return None
        if not replica:
            return None
        channel = self._channels.get(replica)
        if channel is None or not channel.open:
            self.open(key, replica)  # for the next calls picked there (this one: the usual way)
            return None
        self._pin(key, replica)
        return channel

    async def _usual_route(self, request: InferenceRequest) -> AsyncGenerator[list[InferenceEvent], None]:
        first = True
        async for chunk in self._usual(request):
            if first and request.session_key:
                first = False
                self._learn(request.session_key, chunk)
            yield chunk

    def _not_taken(self, channel: ChannelClient, exc: ChannelUnavailable) -> None:
        log.info("direct call not taken (%s): through the usual route", exc)
        self._forget(channel)

    def _learn(self, key: str, chunk: list[InferenceEvent]) -> None:
        replica = next((ev.replica for ev in chunk if isinstance(ev, Prefilled)), "")
        if not replica:
            return
        self._pin(key, replica)
        self.open(key, replica)

    def open(self, key: str, replica: str) -> asyncio.Task[None] | None:
        """Start opening the channel to ``replica`` (found through ``key``'s route, which
        must lead there) unless it is open, opening, or failed to open within ``RETRY_S``;
        the task opening it, if it is opening."""
        channel = self._channels.get(replica)
        if channel is not None and not channel.open:
            self._forget(channel)
        if replica in self._channels:
            return None
        if replica in self._opening:
            return self._opening[replica]
        failed = self._failed.get(replica)
        if failed is not None and self._clock() - failed < RETRY_S:
            return None
        task = asyncio.get_running_loop().create_task(self._open(key, replica))
        self._opening[replica] = task  # referenced until done (the loop holds tasks weakly)
        return task

    def _pin(self, key: str, replica: str) -> None:
        self._pins[key] = replica
        self._pins.move_to_end(key)
        while len(self._pins) > MAX_PINS:
            self._pins.popitem(last=False)

    async def _open(self, key: str, replica: str) -> None:
        try:
            endpoint = await self._find(key)
            if endpoint.replica != replica:  # the key moved meanwhile: learn again next call
                return
            channel = ChannelClient(endpoint)
            await channel.connect()
            self._channels[replica] = channel
            self._failed.pop(replica, None)
        except Exception as exc:  # noqa: BLE001 - calls keep the usual route
            log.warning("could not open the channel to replica %s: %r", replica, exc)
            self._failed[replica] = self._clock()
        finally:
            del self._opening[replica]

    def _forget(self, channel: ChannelClient) -> None:
        """No new call takes ``channel``; the calls still streaming on it finish (a stopping
        replica answers new calls ``gone`` and lets the running ones end)."""
        replica = channel.endpoint.replica
        if self._channels.get(replica) is channel:
            del self._channels[replica]
        channel.retire()

    def close(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        for channel in list(self._channels.values()):
            channel.close()
        self._channels.clear()


class _Direct:
    """A call started on a channel; if the channel does not take it (before any output), the
    call goes the usual way instead."""

    def __init__(
        self, calls: DirectCalls, channel: ChannelClient, call: ChannelCall, request: InferenceRequest
    ) -> None:
        self._calls = calls
        self._channel = channel
        self._call = call
        self._request = request
        self._usual: AsyncGenerator[list[InferenceEvent], None] | None = None
        self._counted = False

    def __aiter__(self) -> _Direct:
        return self

    async def __anext__(self) -> list[InferenceEvent]:
        if self._usual is not None:
            return await anext(self._usual)
        try:
            return await anext(self._call)
        except ChannelUnavailable as exc:
            self._calls._not_taken(self._channel, exc)
            self._usual = self._calls._usual_route(self._request)
            return await anext(self._usual)
        except StopAsyncIteration:
            if not self._counted:
                self._counted = True
                self._calls.direct_calls += 1
            raise

    async def aclose(self) -> None:
        self._call.close()
        if self._usual is not None:
            await self._usual.aclose()
