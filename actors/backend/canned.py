"""A backend that answers every model call with canned chunks, in this process: the one fake
of the inference seam, shipped beside it (as httpx ships ``MockTransport``) for tests of the
session host and of what sits above it.  A real :class:`~actors.backend.InferenceClient`:
construct it, hand it to a ``Connection`` or a ``ModelRouter``, read what it saw.

    client = CannedClient()                      # every call: "Hi there"
    client = CannedClient(answer=my_generator)   # chunks of your own, per request

It records each call's request when the call starts (``stream`` is called, as a direct
channel's call leaves then) and each call's id when its stream is closed, read to the end or
not, even if it was never read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from inference.types import Done, InferenceEvent, InferenceRequest, Prefilled, TextDelta

from . import BeforeCall

Answer = Callable[[InferenceRequest], AsyncIterator[list[InferenceEvent]]]


async def hi_there(request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
    """The default answer: "Hi" with the prompt's prefill, then " there" and ``Done``."""
    yield [Prefilled(len(request.prompt_token_ids), 0, 0.0, 0.0), TextDelta("Hi", 1)]
    yield [TextDelta(" there", 1), Done("stop", 2, 1.0)]


class CannedClient:
    """Answers each call with ``answer(request)``'s chunks; serves ``models``."""

    def __init__(
        self,
        models: Sequence[str] = ("emu-fast",),
        answer: Answer = hi_there,
        *,
        before_call: BeforeCall | None = None,
        check_metadata: Callable[[Mapping[str, str]], None] | None = None,
    ) -> None:
        self.models = list(models)
        self.answer = answer
        self.before_call = before_call
        self._check_metadata = check_metadata
        self.requests: list[InferenceRequest] = []  # every call's request, as it started
        self.closed: list[str] = []  # the request ids of the calls whose stream was closed

    @property
    def started(self) -> list[str]:
        """The request ids of the calls started, in order."""
        return [request.request_id for request in self.requests]

    async def warm(self) -> list[str]:
        return list(self.models)

    def check_metadata(self, metadata: Mapping[str, str]) -> None:
        if self._check_metadata is not None:
            self._check_metadata(metadata)

    def stream(self, request: InferenceRequest) -> CannedCall:
        self.requests.append(request)
        return CannedCall(self, request)


class CannedCall:
    """One call's stream: ``answer``'s chunks, started on the first read; closing it closes
    the answer and records the call closed (once)."""

    def __init__(self, client: CannedClient, request: InferenceRequest) -> None:
        self._client, self._request = client, request
        self._chunks: AsyncIterator[list[InferenceEvent]] | None = None
        self._closed = False

    def __aiter__(self) -> CannedCall:
        return self

    async def __anext__(self) -> list[InferenceEvent]:
        if self._closed:
            raise StopAsyncIteration
        if self._chunks is None:
            self._chunks = self._client.answer(self._request)
        try:
            return await anext(self._chunks)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._chunks is not None and hasattr(self._chunks, "aclose"):
                await self._chunks.aclose()
        finally:
            self._client.closed.append(self._request.request_id)
