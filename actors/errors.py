"""Typed API errors.

Every failure a client can see is one of these types, carrying the HTTP status the same
failure would have over HTTP and the OpenAI error ``type``/``code``/``param``.  Exactly one
function turns them into a wire event (``protocol.error_event``); anything else that escapes
becomes ``server_error`` without leaking its text (docs/protocol.md §5.1, §5.2).
"""

from __future__ import annotations

from store import WriteUnavailable


class APIError(Exception):
    status: int = 400
    type: str = "invalid_request_error"
    code: str | None = None
    retry_after_s: int | None = None  # sent as Retry-After when it refuses an HTTP request or an upgrade

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidRequest(APIError):
    """A bad ``response.create`` body; ``code`` names what is wrong."""

    code = "invalid_value"


class InvalidJSON(InvalidRequest):
    code = "invalid_json"


class UnknownEventType(InvalidRequest):
    code = "unknown_event_type"


class PreviousResponseNotFound(InvalidRequest):
    code = "previous_response_not_found"

    def __init__(self, response_id: str) -> None:
        super().__init__(
            f"Previous response with id '{response_id}' not found.", param="previous_response_id"
        )


class InvalidStreamId(InvalidRequest):
    code = "invalid_stream_id"

    def __init__(self) -> None:
        super().__init__(
            "The 'stream_id' field must be a non-empty string with at most 256 characters and "
            "may only contain letters, numbers, underscores, hyphens, and periods.",
            param="stream_id",
        )


class StreamLimitReached(InvalidRequest):
    code = "websocket_stream_limit_reached"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"This WebSocket connection has reached its maximum number of distinct stream IDs "
            f"({limit}). Reuse an existing stream_id or open a new WebSocket connection.",
            param="stream_id",
        )


class ConnectionLimitReached(InvalidRequest):
    code = "websocket_connection_limit_reached"

    def __init__(self, minutes: float) -> None:
        shown = f"{minutes:g} minutes"
        super().__init__(
            f"Responses websocket connection limit reached ({shown}). "
            "Create a new websocket connection to continue."
        )


class ModelNotFound(APIError):
    status = 404
    code = "model_not_found"

    def __init__(self, model: str | None) -> None:
        super().__init__(
            f"The model '{model}' does not exist or you do not have access to it.", param="model"
        )


class ServerError(APIError):
    status = 500
    type = "server_error"
    code = "server_error"

    def __init__(self, message: str = "The server had an error while processing your request.") -> None:
        super().__init__(message)


class InvalidAPIKey(APIError):
    status = 401
    code = "invalid_api_key"

    def __init__(self) -> None:
        super().__init__(
            "Incorrect API key provided. You can find your API key in your server's configuration."
        )


class NotFound(APIError):
    status = 404
    code = None

    def __init__(self, message: str) -> None:
        super().__init__(message)


class TooManyConnections(APIError):
    """Refusal of a WebSocket upgrade past a limit: 429 for a key's limit, 503 for the server's."""

    def __init__(self, message: str, *, per_key: bool, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.status = 429 if per_key else 503
        self.type = "rate_limit_exceeded" if per_key else "server_error"
        self.code = "rate_limit_exceeded" if per_key else "server_overloaded"


class ServerShuttingDown(APIError):
    """A create (or an upgrade) that arrives while the server drains for a shutdown or a
    redeploy; responses already in flight finish (docs/reliability.md)."""

    status = 503
    type = "server_error"
    code = "server_shutting_down"
    retry_after_s = 1  # another replica (a redeploy's new one) takes the retry

    def __init__(self) -> None:
        super().__init__("The server is shutting down; open a new connection and retry.")


class StoreUnavailable(APIError):
    """The store could not take a response's record or ledger line in time (its shard had no
    primary during a failover, or ``store.wait_replicas_policy: strict`` refused a shard
    short of replicas): the response is not stored and not billed, and the same request
    retried a moment later is (docs/reliability.md, "The cluster store")."""

    status = 503
    type = "server_error"
    code = "store_unavailable"
    retry_after_s = 1

    def __init__(
        self,
        message: str = (
            "The response could not be stored or billed: the store is unavailable for a moment. "
            "It was not billed; retry the request."
        ),
    ) -> None:
        super().__init__(message)


class StoredResponsesUnavailable(StoreUnavailable):
    """A stored response could not be read, listed or deleted because the store cannot
    answer now (a lost connection, a failover under way): retryable, the record is not lost,
    and it is not "not found"."""

    def __init__(self) -> None:
        super().__init__("The response store is unavailable for a moment; retry the request.")


def write_failure(exc: BaseException) -> APIError:
    """The error a client sees for a response whose record or ledger line could not be
    written: :class:`StoreUnavailable` (retryable) when the store could not take the write
    now, else :class:`ServerError`."""
    return StoreUnavailable() if isinstance(exc, WriteUnavailable) else ServerError()


class InvalidResumeToken(APIError):
    """An upgrade presenting a resume token that does not resume anything: unknown, expired,
    for another API key, or held on another node (one message for all: nothing leaks)."""

    code = "invalid_resume_token"

    def __init__(self) -> None:
        super().__init__(
            "The resume token is unknown or expired. Open a new connection without it; "
            "it starts with an empty connection state."
        )


class RequestHeadTooLarge(APIError):
    """A request line plus headers beyond the gateway's limit (e.g. a 64 KiB URL)."""

    status = 431
    code = "request_header_fields_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request line and headers exceed {limit // 1024} KiB.")


class RequestTimeout(APIError):
    """A connection that sent no complete request head within the gateway's limit: answered,
    not dropped, so a slow client learns why."""

    status = 408
    code = "request_timeout"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"No complete request arrived within {timeout_s:g} s.")


class OriginNotAllowed(APIError):
    """A request from a web page (its ``Origin`` header) the server does not allow
    (``server.allowed_origins``); requests without an ``Origin`` are not affected."""

    status = 403
    code = "origin_not_allowed"

    def __init__(self, origin: str) -> None:
        super().__init__(
            f"Requests from the web origin '{origin[:200]}' are not allowed by this server "
            "(server.allowed_origins)."
        )
