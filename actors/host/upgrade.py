"""The answer to a handed-over socket's opening handshake (its HTTP upgrade request): 404 off
``/v1/responses``, 503 with ``Retry-After`` while the host drains, 400 for a resume token
that is not (or no longer) good, else ``101 Switching Protocols`` with the connection's resume
token (``x-responses-ws-resume-token``, :mod:`actors.host.resume`) when resume is on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http import HTTPStatus

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from store.connection_states import Claimed

from ..errors import InvalidResumeToken, ServerShuttingDown
from ..protocol import http_error_body
from .continuity import HostContinuity
from .handoff import RESPONSES_PATH, Handoff
from .resume import RESUME_HEADER, ResumeRegistry, make_any_node_token, make_token
from .websocket import WebSocket


class Upgrade:
    """Answers the upgrades of one host (``actor_name``), whose parked states are in
    ``registry`` and, with resume on any node, in the cluster store (``continuity``);
    ``draining`` says whether the host is shutting down."""

    def __init__(
        self,
        actor_name: str,
        registry: ResumeRegistry,
        continuity: HostContinuity | None,
        draining: Callable[[], bool],
    ) -> None:
        self._name = actor_name
        self._registry = registry
        self._continuity = continuity
        self._draining = draining

    async def answer(
        self, ws: WebSocket, handoff: Handoff, secret: str, request: Request
    ) -> tuple[Response, Claimed | None]:
        """The response to ``request``, and the state a resume took from the cluster store
        (``None`` for any other)."""
        refused, claimed = await self._check(ws, handoff, request)
        response = refused or ws.protocol.accept(request)
        if response.status_code == 101:
            if self._continuity is not None:
                response.headers[RESUME_HEADER] = make_any_node_token(handoff.conn_id, secret)
            elif self._registry.enabled:
                response.headers[RESUME_HEADER] = make_token(self._name, handoff.conn_id, secret)
        return response, claimed

    async def _check(
        self, ws: WebSocket, handoff: Handoff, request: Request
    ) -> tuple[Response | None, Claimed | None]:
        """The upgrade's refusal, if any, and the state a resume took from the cluster store."""
        if request.path.split("?", 1)[0].rstrip("/") != RESPONSES_PATH:
            return ws.protocol.reject(404, "Not Found\n"), None
        if self._draining():  # handed over as the drain began: another replica takes the retry
            shutting = ServerShuttingDown()
            return json_response(*http_error_body(shutting), retry_after_s=shutting.retry_after_s), None
        if handoff.resume is not None and self._continuity is not None:
            claimed = await self._continuity.claim(handoff.conn_id, handoff.resume, handoff.owner)
            if claimed is None:
                return json_response(*http_error_body(InvalidResumeToken())), None
            return None, claimed
        if handoff.resume is not None:
            try:
                self._registry.check(handoff.conn_id, handoff.resume, handoff.owner)
            except InvalidResumeToken as exc:
                return json_response(*http_error_body(exc)), None
        return None, None


def json_response(status: int, body: dict, *, retry_after_s: int | None = None) -> Response:
    payload = json.dumps(body).encode()
    headers = Headers(
        [("Content-Type", "application/json"), ("Content-Length", str(len(payload))), ("Connection", "close")]
    )
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return Response(status, HTTPStatus(status).phrase, headers, payload)
