"""Which backend serves which model: the emulator's deployment by default, a real engine for
each model of ``session.backends`` (docs/backends.md): an OpenAI-compatible one by URL or a
Ray Serve LLM deployment of the application.

:class:`ModelRouter` is itself an :class:`~actors.backend.InferenceClient`: a session host
holds one, and each model call goes to its model's backend.  :func:`model_formats` gives the
chat format each real model renders with (its own tokenizer and template); the emulated
models keep cl100k.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from inference.chat_template import TemplateFormat
from inference.types import InferenceRequest

from ..config import ModelBackend, SessionConfig
from . import EventStream, InferenceClient


def model_formats(config: SessionConfig) -> dict[str, TemplateFormat]:
    """Each real model's chat format, loaded once per process."""
    return {b.id: TemplateFormat.load(b.tokenizer) for b in config.backends}


def backend_client(backend: ModelBackend, fmt: TemplateFormat, app_name: str) -> InferenceClient:
    """The client of one real model: by URL, or through the handle of its deployment in
    the application ``app_name``."""
    if backend.kind == "serve_llm":
        from .serve_llm_client import ServeLLMInference  # Ray Serve: only where such a model is configured

        return ServeLLMInference(backend, fmt, app_name)
    from .openai_upstream import UpstreamInference  # aiohttp: only where a real model is configured

    return UpstreamInference(backend, fmt)


def model_entries(config: SessionConfig, created: int | None = None) -> list[dict]:
    """The real models as ``GET /v1/models`` entries (the emulator lists its own profiles,
    ``kind: emulator`` ones too)."""
    created = int(time.time()) if created is None else created
    return [
        {"id": b.id, "object": "model", "created": created, "owned_by": b.owned_by}
        for b in config.backends
        if b.kind != "emulator"
    ]


class ModelRouter:
    """The emulator for every model but those ``clients`` serve."""

    def __init__(self, default: InferenceClient, clients: Mapping[str, InferenceClient]) -> None:
        self._default = default
        self._clients = dict(clients)
        self.before_call = default.before_call

    @classmethod
    def of(cls, default: InferenceClient, config: SessionConfig) -> InferenceClient:
        """``default`` alone when no real model is configured (a ``kind: emulator`` model is
        the emulator's, in its own format)."""
        engines = [b for b in config.backends if b.kind != "emulator"]
        if not engines:
            return default
        formats = model_formats(config)
        return cls(
            default,
            {b.id: backend_client(b, formats[b.id], config.inference_app) for b in engines},
        )

    async def warm(self) -> list[str]:
        models = await self._default.warm()
        for client in self._clients.values():
            models += [m for m in await client.warm() if m not in models]
        return models

    def check_metadata(self, metadata: Mapping[str, str]) -> None:
        """The emulator's check, whichever model the create names (as before real models)."""
        self._default.check_metadata(metadata)

    def stream(self, request: InferenceRequest) -> EventStream:
        return self._clients.get(request.model, self._default).stream(request)
