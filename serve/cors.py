"""Web pages on the HTTP API: the ``Origin`` of *every* request checked, CORS for the pages
allowed (docs/operations.md, "Web pages").

The gateway checks the first request head of each connection before it hands it over
(serve/front.py); a keep-alive connection's later requests are only seen by the HTTP app,
so the app checks each one again: a request whose ``Origin`` is outside
``server.allowed_origins`` gets 403 ``origin_not_allowed`` (counted, like the gateway's
refusals), whatever came before it on the connection.  A request from an allowed page gets
the CORS headers that let the page read the answer, and a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) is answered here with what the page may send.  Requests
without an ``Origin`` (SDKs, CLIs, curl) are untouched.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actors.errors import OriginNotAllowed
from actors.protocol import http_error_body

from .origins import OriginPolicy

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
# What the openai SDKs and the AI SDK send from a page, when a preflight does not list its own.
DEFAULT_ALLOW_HEADERS = (
    "Authorization, Content-Type, OpenAI-Beta, OpenAI-Organization, OpenAI-Project, api-key"
)
MAX_AGE_S = 600  # how long a browser may reuse a preflight's answer


class OriginGuard:
    """ASGI middleware: :mod:`serve.cors`'s rules on every HTTP request of ``app``;
    ``on_refused`` is called with 403 for each request refused."""

    def __init__(
        self, app: ASGIApp, policy: OriginPolicy, on_refused: Callable[[int], None] | None = None
    ) -> None:
        self.app = app
        self.policy = policy
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        if not self.policy.allows(origin):
            if self.on_refused is not None:
                self.on_refused(OriginNotAllowed.status)
            status, body = http_error_body(OriginNotAllowed(origin))
            await JSONResponse(body, status_code=status)(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await Response(status_code=204, headers=preflight_headers(origin, headers))(scope, receive, send)
            return

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out["Access-Control-Allow-Origin"] = origin
                out.append("Vary", "Origin")
            await send(message)

        await self.app(scope, receive, with_cors)


def preflight_headers(origin: str, request: Headers) -> dict[str, str]:
    """The answer to an allowed page's preflight: its origin, the methods the API has, the
    headers it asked for (or the ones clients send), and how long to keep the answer."""
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": request.get("access-control-request-headers")
        or DEFAULT_ALLOW_HEADERS,
        "Access-Control-Max-Age": str(MAX_AGE_S),
        "Vary": "Origin",
    }
