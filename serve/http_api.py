"""HTTP mode (docs/protocol.md §6): the stateless path on the same port as WebSocket mode.

Every ``POST /v1/responses`` gets a fresh session with nothing cached, so a
``previous_response_id`` is loaded from the store and the whole conversation is re-parsed,
re-rendered and re-tokenised — the honest baseline a stateless server pays on every request
(docs/http-and-store.md).  Everything else (validation, the response builder, inference) is
the same code as WebSocket mode.  Errors are OpenAI JSON error bodies; SSE streams carry no
``stream_id`` and no top-level ``error`` key, and end with ``data: [DONE]``.  Every body is
a typed model written by the one encode point (:func:`actors.protocol.encode`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from actors.backend import InferenceClient
from actors.backend.model_router import model_formats
from actors.config import SessionConfig
from actors.core.render import render_items
from actors.core.session import Session
from actors.core.timings import PhaseTimer
from actors.errors import (
    APIError,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    PreviousResponseNotFound,
    StoredResponsesUnavailable,
    StoreUnavailable,
)
from actors.host.connection import Connection
from actors.ids import new_id
from actors.protocol import (
    SSE_DONE,
    TERMINAL_EVENT_TYPES,
    CompactedResponse,
    ErrorEvent,
    EventEncoder,
    HttpBody,
    InputTokensDetails,
    ItemList,
    ResponseCompleted,
    ResponseDeleted,
    ResponseFailed,
    ResponseIncomplete,
    ResponseObject,
    Usage,
    encode,
    http_error_body,
    parse_http_compact,
    parse_http_create,
    parse_items,
    sse_frame,
)
from inference import chat_format
from store import ReadUnavailable, WriteUnavailable
from store.writer import StoreWriter

from .app import build_app
from .auth import KeyRing
from .compaction import compact
from .origins import OriginPolicy

log = logging.getLogger(__name__)


def error_response(exc: BaseException) -> JSONResponse:
    """The error's status and body, with ``Retry-After`` when it says when to retry."""
    status, body = http_error_body(exc)
    retry_after = exc.retry_after_s if isinstance(exc, APIError) else None
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(body, status_code=status, headers=headers)


def host_app(
    *,
    store: StoreWriter,
    inference: InferenceClient,
    model_ids: Callable[[], list[str]],
    observe: Callable[[str, dict[str, float]], None] | None,
    session_config: SessionConfig,
    keys: KeyRing,
    models: list[dict],
    allowed_origins: list[str],
    on_refused: Callable[[int], None] | None = None,
) -> FastAPI:
    """The whole HTTP app as a session host serves it (the gateway hands HTTP connections to
    hosts, actors.host.http): the host brings its store writer, inference client and metrics
    (``on_refused``: its count of requests refused for their ``Origin``)."""

    async def list_models() -> list[dict]:
        return models

    app = build_app(list_models, origins=OriginPolicy(allowed_origins), on_refused=on_refused)
    add_http_routes(
        app,
        session_config=session_config,
        keys=keys,
        store=store,
        inference=inference,
        model_ids=model_ids,
        observe=observe,
    )
    return app


def json_body(body: HttpBody) -> Response:
    """A 200 answer: the typed body through the one encode point."""
    return Response(encode(body), media_type="application/json")


def add_http_routes(
    app: FastAPI,
    *,
    session_config: SessionConfig,
    keys: KeyRing,
    store: StoreWriter,
    inference: InferenceClient,
    model_ids: Callable[[], list[str]],
    observe: Callable[[str, dict[str, float]], None] | None = None,
) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    async def store_cannot_serve(request: Request, exc: Exception) -> JSONResponse:
        # A GET, DELETE, input_items or compaction the store cannot serve now: retryable 503,
        # not a 500 and not "not found" (the record is not lost).
        log.warning("the store cannot serve %s %s now: %s", request.method, request.url.path, exc)
        return error_response(StoredResponsesUnavailable())

    app.add_exception_handler(ReadUnavailable, store_cannot_serve)
    app.add_exception_handler(WriteUnavailable, store_cannot_serve)

    @app.exception_handler(HTTPException)
    async def routing(request: Request, exc: HTTPException) -> JSONResponse:
        # No route, or not this method: an OpenAI error body too, not Starlette's {"detail"}.
        return error_response(RoutingError(exc.status_code, request.method, request.url.path))

    app.router.redirect_slashes = False  # "/v1/responses/" is an unknown path, not a redirect

    def owner(request: Request) -> str:
        return keys.owner(request.headers)

    formats = model_formats(session_config)  # the real models' own templates (docs/backends.md)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        timer = PhaseTimer(time.perf_counter)
        who = owner(request)
        body = await request.body()
        with timer.phase("parse_validate"):
            create = parse_http_create(body)
        # Stateless: nothing survives from earlier requests (model resolution, tool
        # rendering and the classifier are all redone; history comes from the store).
        session = Session(
            session_config,
            model_ids(),
            session_key=None,
            owner=who,
            transport="http",
            clock=time.time,
            formats=formats,
            check_metadata=inference.check_metadata,
        )
        conn = Connection(session, inference, store, observe)
        conn.create(create, timer)
        events = conn.events()
        first = await anext(events)
        if isinstance(first[0], ErrorEvent):
            await conn.close()
            return JSONResponse({"error": first[0].error.model_dump()}, status_code=first[0].status)
        if create.stream:
            return StreamingResponse(
                _sse(conn, first, events),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        try:
            batch = first
            while True:
                for event in batch:
                    if isinstance(event, ResponseCompleted | ResponseIncomplete | ResponseFailed):
                        conn.outgoing(event)  # its figures are taken now
                        if isinstance(event, ResponseFailed) and _store_unavailable(event):
                            return error_response(StoreUnavailable())  # 503, Retry-After
                        return json_body(event.response)
                batch = await anext(events)
        finally:
            await conn.close()

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> Response:
        record = await store.get(response_id, owner(request))
        if record is None:
            raise _not_found(response_id)
        # Through the typed model: a record stored by an older version gains the keys added since.
        return json_body(ResponseObject.model_validate(record.response))

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> Response:
        if not await store.delete(response_id, owner(request)):
            raise _not_found(response_id)
        return json_body(ResponseDeleted(id=response_id))

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, request: Request) -> Response:
        q = request.query_params
        limit = _int_param(q.get("limit", "20"), "limit", 1, 100)
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("Invalid value for 'order': expected 'asc' or 'desc'.", param="order")
        record = await store.get(response_id, owner(request))
        if record is None:
            raise _not_found(response_id)
        items = record.input_items if order == "asc" else record.input_items[::-1]
        after = q.get("after")
        if after is not None:
            ids = [i["id"] for i in items]
            if after not in ids:
                raise InvalidRequest(f"No item with id '{after}' in this response's input.", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return json_body(
            ItemList(
                data=page,
                first_id=page[0]["id"] if page else None,
                last_id=page[-1]["id"] if page else None,
                has_more=len(items) > limit,
            )
        )

    @app.post("/v1/responses/compact")
    async def compact_conversation(request: Request) -> Response:
        who = owner(request)
        req = parse_http_compact(await request.body())  # 400 for a missing or mistyped field
        if req.model not in model_ids():
            raise ModelNotFound(req.model)
        items = []
        if req.previous_response_id is not None:
            record = await store.get(req.previous_response_id, who)
            if record is None:
                raise PreviousResponseNotFound(req.previous_response_id)
            items = parse_items(record.context)
        items += req.items
        output, summary = compact(items)
        used = len(chat_format.render_instructions(req.instructions)) + len(render_items(items))
        produced = len(chat_format.render_other("compaction", summary))
        usage = Usage(
            input_tokens=used,
            input_tokens_details=InputTokensDetails(),
            output_tokens=produced,
            total_tokens=used + produced,
        )
        return json_body(
            CompactedResponse(id=new_id("resp"), created_at=int(time.time()), output=output, usage=usage)
        )


async def _sse(conn: Connection, first: list, events: AsyncIterator[list]) -> AsyncIterator[bytes]:
    """``event: <type>`` / ``data: <json>`` per event until the terminal one, then
    ``data: [DONE]`` (docs/protocol.md §6.1)."""
    encoder = EventEncoder()
    try:
        batch = first
        while True:
            chunk = []
            done = False
            for event in batch:
                chunk.append(sse_frame(conn.outgoing(event), encoder))
                done = done or event.type in TERMINAL_EVENT_TYPES
            if done:
                chunk.append(SSE_DONE)
            yield "".join(chunk).encode()
            if done:
                return
            batch = await anext(events)
    finally:
        await conn.close()  # also when the client went away: generation is cancelled


class RoutingError(APIError):
    """A request no route takes (worded as OpenAI words it)."""

    def __init__(self, status: int, method: str, path: str) -> None:
        super().__init__(
            f"Invalid URL ({method} {path})" if status == 404 else f"Method {method} is not allowed."
        )
        self.status = status if 400 <= status < 500 else 404


def _store_unavailable(event: ResponseFailed) -> bool:
    """The response failed because the store could not take its record or line now: a
    non-streamed request is answered 503 with ``Retry-After`` (a stream has started: its
    ``response.failed`` carries the code)."""
    error = event.response.error
    return error is not None and error.code == StoreUnavailable.code


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.")


def _int_param(raw: str, name: str, lo: int, hi: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(
            f"Invalid '{name}': expected an integer.", param=name, code="invalid_type"
        ) from None
    if not lo <= value <= hi:
        raise InvalidRequest(f"Invalid '{name}': must be between {lo} and {hi}.", param=name)
    return value
