"""The inference seam over an OpenAI-compatible engine by URL (vLLM, SGLang, llama.cpp's
server): streamed ``POST {url}/completions`` with the conversation's token ids as the prompt
(:mod:`.completions` builds the request and reads the chunks).

Closing the stream early (a cancelled turn, a client gone) closes the HTTP response, and the
engine aborts the request (vLLM stops generating when its client disconnects).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncGenerator, Mapping

import aiohttp

from inference.chat_template import TemplateFormat
from inference.types import InferenceEvent, InferenceRequest

from ..config import ModelBackend
from . import BeforeCall
from .completions import CompletionStream, EngineError, completion_body, sse_data

log = logging.getLogger(__name__)


class UpstreamError(EngineError):
    """The engine answered a model call with an error status (→ ``server_error``)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"the engine answered {status}: {body[:500]}")
        self.status = status


class UpstreamInference:
    """:class:`~actors.backend.InferenceClient` of one model served by an OpenAI-compatible engine."""

    before_call: BeforeCall | None = None

    def __init__(self, backend: ModelBackend, fmt: TemplateFormat) -> None:
        self.backend = backend
        self.fmt = fmt
        assert backend.url is not None  # ModelBackend requires it for kind openai
        self._url = backend.url.rstrip("/")
        key = os.environ.get(backend.api_key_env) if backend.api_key_env else None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                headers=self._headers, timeout=aiohttp.ClientTimeout(total=self.backend.timeout_s)
            )
        return self._http

    async def warm(self) -> list[str]:
        """Open the connection pool; an engine not up yet is logged, not fatal (its calls
        fail with ``server_error`` until it is)."""
        try:
            async with self._session().get(
                f"{self._url}/models", timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                r.raise_for_status()
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.warning("engine of model %s at %s is not reachable: %s", self.backend.id, self._url, exc)
        return [self.backend.id]

    def check_metadata(self, metadata: Mapping[str, str]) -> None:
        """A real model takes no knobs from a create's metadata."""

    async def stream(self, request: InferenceRequest) -> AsyncGenerator[list[InferenceEvent], None]:
        decoder = CompletionStream(request, self.fmt)
        body = completion_body(request, self.backend, self.fmt)
        response = await self._session().post(f"{self._url}/completions", json=body)
        try:
            if response.status != 200:
                raise UpstreamError(response.status, await response.text())
            async for line in response.content:
                data = sse_data(line)
                if data is not None and (events := decoder.feed(data)):
                    yield events
            yield decoder.finish()
        finally:
            response.close()  # cut short: the engine sees the disconnect and aborts the request

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
