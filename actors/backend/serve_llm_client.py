"""The inference seam over a Ray Serve LLM deployment (vLLM engine) of this application
(``kind: serve_llm``, built by ``serve.builder``): its ``completions`` method called through
a ``DeploymentHandle`` with the conversation's token ids as the prompt.

The request and the reading of the streamed chunks are the upstream backend's
(:mod:`.completions`): the deployment streams lists of the same SSE strings that vLLM's
HTTP server sends.  Closing the stream early cancels the handle's response; Serve cancels
the call in the replica and vLLM aborts the request (the engine stops generating).
``ray.serve.llm`` (which imports vLLM) is imported on the first call: only a host with such
a backend pays for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentResponseGenerator

from inference.chat_template import TemplateFormat
from inference.types import InferenceEvent, InferenceRequest

from ..config import ModelBackend
from . import BeforeCall
from .completions import CompletionStream, completion_body, sse_batch

log = logging.getLogger(__name__)

WARM_S = 5.0  # a deployment still starting is logged, not waited for


class ServeLLMInference:
    """:class:`~actors.backend.InferenceClient` of one model served by a Ray Serve LLM deployment."""

    before_call: BeforeCall | None = None

    def __init__(self, backend: ModelBackend, fmt: TemplateFormat, app_name: str) -> None:
        self.backend = backend
        self.fmt = fmt
        self._handle = serve.get_deployment_handle(backend.deployment, app_name=app_name)
        self._completions = self._handle.options(stream=True, method_name="completions")
        self._request_type: Any = None

    async def warm(self) -> list[str]:
        """The handle's first call (its router) before any client's; an engine still
        loading is logged, not fatal (calls wait for its replica)."""
        try:
            await asyncio.wait_for(self._handle.check_health.remote(), WARM_S)
        except TimeoutError:
            log.warning(
                "the engine of model %s (%s) is not serving yet", self.backend.id, self.backend.deployment
            )
        return [self.backend.id]

    def _request(self, request: InferenceRequest) -> Any:
        if self._request_type is None:
            from ray.serve.llm.openai_api_models import CompletionRequest

            self._request_type = CompletionRequest
        return self._request_type(**completion_body(request, self.backend, self.fmt))

    def check_metadata(self, metadata: Mapping[str, str]) -> None:
        """A real model takes no knobs from a create's metadata."""

    async def stream(self, request: InferenceRequest) -> AsyncGenerator[list[InferenceEvent], None]:
        decoder = CompletionStream(request, self.fmt)
        response = self._completions.remote(self._request(request))
        assert isinstance(response, DeploymentResponseGenerator)  # the handle streams
        try:
            async for batch in response:
                events = [e for chunk in sse_batch(batch) for e in decoder.feed(chunk)]
                if events:
                    yield events
            yield decoder.finish()
        finally:
            response.cancel()  # no-op when finished; cut short, the replica's call is cancelled
