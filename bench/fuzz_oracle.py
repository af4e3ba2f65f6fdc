"""Run hostile cases (drawn by :mod:`bench.fuzz_cases`) against a server and judge the answers.

A case is a :class:`WsCase` (one client frame) or an :class:`HttpCase` (one request); the
server runs with :func:`server_overrides`.  Nothing here imports hypothesis.

The oracle, for every case:

- WebSocket: every server frame is a text frame holding a JSON object; an ``error`` has a
  4xx ``status`` and an ``error`` with exactly ``type``, ``code``, ``message``, ``param``,
  none of them ``server_error``; ``response.steer.failed`` carries a steering code; no
  response ends ``response.failed``; a request the server accepted runs to its terminal
  event; the socket stays open, except that a frame over the cap closes it with 1009 and
  invalid UTF-8 in a text frame with 1007 (RFC 6455).
- HTTP: no 5xx; a 4xx carries an OpenAI error body (``{"error": {message, type, param,
  code}}``); a 2xx is what the endpoint returns (a finished Response, an SSE stream ending
  in a terminal event, a list, a compaction).
- Messages never echo internal exception text (exception class names, tracebacks, module
  paths, reprs); text the client sent is removed before looking.

The runners do not raise on a bad answer: they return the problems, so a test can assert
there are none and a benchmark can count them.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from .client import TERMINAL_EVENT_TYPES

MODEL = "emu-fast"
FRAME_CAP = 64 * 1024  # the fuzz server's ``session.max_frame_bytes``: bigger frames close with 1009
STORED = "{stored}"  # stands for a stored response id in HTTP paths (the runner fills it in)


@dataclass(frozen=True)
class WsCase:
    kind: str
    frame: str | bytes  # bytes: a binary frame, unless ``as_text``
    append_mode: bool = False  # send it on the ``?mode=append`` socket
    as_text: bool = False  # bytes sent as a *text* frame (invalid UTF-8 → close 1007)


@dataclass(frozen=True)
class HttpCase:
    kind: str
    method: str
    path: str  # quoted, with any query; may contain STORED
    body: bytes | None = None
    content_type: str | None = "application/json"


def server_overrides() -> dict[str, object]:
    """``section.key`` settings of the server the fuzz runs against: a small frame cap (so
    frames over it are cheap), short scripted answers (one tool round, 8 text tokens) and
    warm session actors for the reconnects after the closes."""
    return {
        "session.max_frame_bytes": FRAME_CAP,
        "session.warm_actors": 2,
        "inference.policy": {"tool_rounds": 1, "text_tokens": 8, "seed": 0},
    }


STEER_CODES = {
    "response_not_found",
    "invalid_input",
    "steering_not_supported",
    "too_many_pending_steers",
    "response_already_completed",
    "response_not_active",
    "successor_creation_failed",
}
INJECT_CODES = {"response_already_completed", "response_not_found"}  # the SDK's beta enum
LEAK = re.compile(
    r"Traceback|File \"|site-packages|\.py\b|line \d+, in |object at 0x|<class |<module|"
    r"\b[A-Z]\w*(Error|Exception)\b|validation errors? for |pydantic|errors\.pydantic\.dev|"
    r"\b(actors|serve|inference|bench)\.[a-z_]+"
)
ERROR_KEYS = {"type", "code", "message", "param"}
REPLY_TIMEOUT_S = 30.0


@dataclass
class Outcome:
    kind: str
    replies: list[str] = field(default_factory=list)  # "error 400 invalid_json", "response.completed", ...
    closed: int | None = None  # close code, when the server closed the socket
    problems: list[str] = field(default_factory=list)


def leaks(message: object, sent: set[str]) -> str | None:
    """The internal-looking text in ``message`` once the strings the client sent
    (:func:`sent_strings`) are taken out, if any."""
    if not isinstance(message, str) or not message:
        return f"message is {message!r}"
    text = message
    for s in sorted(sent, key=len, reverse=True):
        text = text.replace(s, "")
    found = LEAK.search(text)
    return found.group(0) if found else None


def sent_strings(sent: str | bytes) -> set[str]:
    """Every value and key in what the client sent, as text and as repr (error messages
    may quote them either way)."""
    raw = sent.decode("utf-8", "replace") if isinstance(sent, bytes) else sent
    out = {raw}
    try:
        stack = [json.loads(raw)]
    except (ValueError, RecursionError):
        return out
    depth = {id(stack[0]): 0}
    while stack:
        value = stack.pop()
        if isinstance(value, (dict, list)):
            level = depth.pop(id(value), 0)
            children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            depth.update((id(c), level + 1) for c in children if isinstance(c, (dict, list)))
            stack.extend(children)
            if level > 2:  # a repr of a deep container costs O(size) each: only shallow ones
                continue
        out.update(s for s in (str(value), repr(value)) if len(s) >= 3)
    return out


def check_error_body(error: Any, sent: set[str], problems: list[str]) -> None:
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        problems.append(f"error object has keys {sorted(error) if isinstance(error, dict) else error!r}")
        return
    if "server_error" in (error["type"], error["code"]):
        problems.append("server_error")
    leaked = leaks(error["message"], sent)
    if leaked:
        problems.append(f"message leaks {leaked!r}: {error['message'][:200]!r}")


# ------------------------------------------------------------------ WebSocket


class WsFuzzer:
    """Plays hostile frames over one standard and one ``?mode=append`` socket (reopened
    only when the server closes them), and checks after each that the server is done
    with it, using a ``response.steer`` for an unknown response as a barrier."""

    def __init__(self, ws_url: str) -> None:
        self.url = ws_url
        self._sockets: dict[bool, ClientConnection] = {}
        self._barriers = 0
        self.kinds: Counter[str] = Counter()
        self.replies: Counter[str] = Counter()
        self.closes: Counter[int] = Counter()
        self.problems = 0
        self.last_error: dict[str, Any] | None = None  # the ``error`` of the last error event

    def _socket(self, append_mode: bool) -> ClientConnection:
        ws = self._sockets.get(append_mode)
        if ws is None:
            url = self.url + ("?mode=append" if append_mode else "")
            ws = self._sockets[append_mode] = connect(url, max_size=None, compression=None, open_timeout=30)
        return ws

    def run(self, case: WsCase) -> Outcome:
        out = Outcome(case.kind)
        ws = self._socket(case.append_mode)
        size = len(case.frame.encode("utf-8", "surrogatepass") if isinstance(case.frame, str) else case.frame)
        expect_close = 1009 if size > FRAME_CAP else 1007 if case.as_text else None
        try:
            ws.send(case.frame, text=True if case.as_text else None)
            self._drain(ws, case, out, barrier=expect_close is None)
        except ConnectionClosed as closed:
            out.closed = closed.rcvd.code if closed.rcvd is not None else 1006
            del self._sockets[case.append_mode]
        except TimeoutError:
            out.problems.append(f"no answer within {REPLY_TIMEOUT_S:.0f} s")
            self._sockets.pop(case.append_mode).close()
        if out.closed != expect_close:
            out.problems.append(f"socket closed with {out.closed}, expected {expect_close}")
        self._count(out)
        return out

    def _drain(self, ws: ClientConnection, case: WsCase, out: Outcome, *, barrier: bool) -> None:
        """Read until the barrier's answer has come, a create has been answered (it may
        wait for a store lookup, so its answer can come after the barrier's), and every
        accepted response has ended (answering the tool calls of a paused append-mode
        response)."""
        if not barrier:
            ws.recv(timeout=REPLY_TIMEOUT_S)  # the close must come; a reply is a problem
            out.problems.append("a frame over the cap was answered")
            return
        self._barriers += 1
        marker = f"resp_fuzzbarrier{self._barriers}"
        ws.send(json.dumps({"type": "response.steer", "previous_response_id": marker, "input": "x"}))
        open_responses: set[str] = set()
        seen_barrier = False
        unanswered_create = _is_create(case.frame)
        while not seen_barrier or open_responses or unanswered_create:
            raw = ws.recv(timeout=REPLY_TIMEOUT_S)
            event = self._event(raw, out)
            if event is None:
                continue
            kind = event.get("type")
            if (
                kind == "response.steer.failed"
                and event.get("steer", {}).get("previous_response_id") == marker
            ):
                seen_barrier = True
                continue
            self._judge(event, case, out)
            if kind in ("error", "response.created"):
                unanswered_create = False
            if kind == "response.created":
                open_responses.add(event["response"]["id"])
            elif kind in TERMINAL_EVENT_TYPES:
                open_responses.discard(event["response"]["id"])
            elif (
                kind == "response.output_item.done"
                and (case.append_mode or _waits_for_inject(case.frame))
                and event["item"].get("type") in ("function_call", "custom_tool_call")
                and open_responses
            ):
                # A paused response (append mode, or a create with multi_agent) waits for
                # its tool output: response.append on the append socket, else response.inject.
                ws.send(
                    json.dumps(
                        {
                            "type": "response.append" if case.append_mode else "response.inject",
                            "response_id": next(iter(open_responses)),
                            "input": [
                                {
                                    "type": event["item"]["type"] + "_output",
                                    "call_id": event["item"]["call_id"],
                                    "output": "ok",
                                }
                            ],
                        }
                    )
                )

    @staticmethod
    def _event(raw: str | bytes, out: Outcome) -> dict[str, Any] | None:
        if not isinstance(raw, str):
            out.problems.append("binary frame from the server")
            return None
        try:
            event = json.loads(raw)
        except ValueError:
            out.problems.append(f"server frame is not JSON: {raw[:100]!r}")
            return None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            out.problems.append(f"server frame is not an event: {raw[:100]!r}")
            return None
        return event

    def _judge(self, event: dict[str, Any], case: WsCase, out: Outcome) -> None:
        kind = event["type"]
        if kind == "error":
            status, error = event.get("status"), event.get("error")
            self.last_error = error
            code = error.get("code") if isinstance(error, dict) else None
            out.replies.append(f"error {status} {code}")
            if not isinstance(status, int) or not 400 <= status < 500:
                out.problems.append(f"error status {status}")
            check_error_body(error, sent_strings(case.frame), out.problems)
        elif kind == "response.steer.failed":
            error = event.get("error") or {}
            out.replies.append(f"steer.failed {error.get('code')}")
            if error.get("code") not in STEER_CODES:
                out.problems.append(f"steer failure code {error.get('code')!r}")
            leaked = leaks(error.get("message"), sent_strings(case.frame))
            if leaked:
                out.problems.append(f"message leaks {leaked!r}: {str(error.get('message'))[:200]!r}")
        elif kind == "response.inject.failed":
            error = event.get("error") or {}
            out.replies.append(f"inject.failed {error.get('code')}")
            if error.get("code") not in INJECT_CODES:
                out.problems.append(f"inject failure code {error.get('code')!r}")
            leaked = leaks(error.get("message"), sent_strings(case.frame))
            if leaked:
                out.problems.append(f"message leaks {leaked!r}: {str(error.get('message'))[:200]!r}")
        elif kind == "response.inject.created":
            out.replies.append(kind)
        elif kind in TERMINAL_EVENT_TYPES:
            out.replies.append(kind)
            if kind == "response.failed":
                out.problems.append(f"response.failed: {event['response'].get('error')}")

    def _count(self, out: Outcome) -> None:
        self.kinds[out.kind] += 1
        self.replies.update(out.replies or ["(no reply)"])
        if out.closed is not None:
            self.closes[out.closed] += 1
        self.problems += bool(out.problems)

    def check_alive(self) -> list[str]:
        """A valid create completes on both fuzzed sockets and on a new connection."""
        problems = []
        for append_mode in (False, True):
            problems += [
                f"{'append' if append_mode else 'standard'} socket: {p}"
                for p in self._valid_turn(self._socket(append_mode), append_mode)
            ]
        fresh = connect(self.url, max_size=None, compression=None, open_timeout=30)
        with fresh:
            problems += [f"new connection: {p}" for p in self._valid_turn(fresh, False)]
        return problems

    def _valid_turn(self, ws: ClientConnection, append_mode: bool) -> list[str]:
        case = WsCase(
            "valid",
            json.dumps({"type": "response.create", "model": MODEL, "input": "hello", "store": False}),
            append_mode,
        )
        out = Outcome("valid")
        try:
            ws.send(case.frame)
            self._drain(ws, case, out, barrier=True)
        except (ConnectionClosed, TimeoutError) as exc:
            return [f"valid create failed: {exc!r}"]
        if out.replies != ["response.completed"]:
            out.problems.append(f"valid create answered {out.replies}")
        return out.problems

    def close(self) -> None:
        for ws in self._sockets.values():
            ws.close()
        self._sockets.clear()


def _is_create(frame: str | bytes) -> bool:
    try:
        data = json.loads(frame)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("type") == "response.create"


# ------------------------------------------------------------------ HTTP


class HttpFuzzer:
    """Sends hostile HTTP requests over one keep-alive client; ``stored`` is the id of a
    stored response that ``{stored}`` in a case's path stands for."""

    def __init__(self, base_url: str, stored: str | None = None) -> None:
        self.http = httpx.Client(
            base_url=base_url, timeout=REPLY_TIMEOUT_S, headers={"Authorization": "Bearer sk-fuzz"}
        )
        self.stored = stored or self._store_one()
        self.kinds: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.problems = 0

    def _store_one(self) -> str:
        r = self.http.post("/v1/responses", json={"model": MODEL, "input": "keep me", "store": True})
        r.raise_for_status()
        return r.json()["id"]

    def run(self, case: HttpCase) -> Outcome:
        out = Outcome(case.kind)
        headers = {"Content-Type": case.content_type} if case.content_type else {}
        path = case.path.replace(STORED, self.stored)
        try:
            with self.http.stream(case.method, path, content=case.body, headers=headers) as r:
                body = r.read()
                media = r.headers.get("content-type", "")
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            out.problems.append(f"transport error {exc!r}")
            self._count(out)
            return out
        sent = sent_strings(case.body or b"") | set(re.split(r"[/?&=]", unquote(path)))
        if r.status_code >= 400:
            error = self._json(body, out)
            code = (
                error.get("error", {}).get("code")
                if isinstance(error, dict) and isinstance(error.get("error"), dict)
                else None
            )
            out.replies.append(f"{r.status_code} {code}")
            if r.status_code >= 500:
                out.problems.append(f"status {r.status_code}")
            if not isinstance(error, dict) or set(error) != {"error"}:
                out.problems.append(f"error body is {body[:200]!r}")
            else:
                check_error_body(error["error"], sent, out.problems)
        else:
            out.replies.append(str(r.status_code))
            self._judge_success(case, media, body, out)
        self._count(out)
        return out

    @staticmethod
    def _json(body: bytes, out: Outcome) -> Any:
        try:
            return json.loads(body)
        except ValueError:
            out.problems.append(f"body is not JSON: {body[:100]!r}")
            return None

    def _judge_success(self, case: HttpCase, media: str, body: bytes, out: Outcome) -> None:
        if media.startswith("text/event-stream"):
            events = _sse_events(body, out)
            last = events[-1]["type"] if events else None
            out.replies[-1] += f" sse {last}"
            if last not in ("response.completed", "response.incomplete"):
                out.problems.append(f"stream ended with {last}")
            return
        data = self._json(body, out)
        if not isinstance(data, dict):
            return
        if data.get("object") == "response":
            out.replies[-1] += f" {data.get('status')}"
            if data.get("status") not in ("completed", "incomplete"):
                out.problems.append(f"response status {data.get('status')}: {data.get('error')}")
        elif data.get("object") not in ("list", "response.deleted", "response.compaction"):
            out.problems.append(f"unexpected 2xx body {body[:120]!r}")

    def _count(self, out: Outcome) -> None:
        self.kinds[out.kind] += 1
        self.statuses.update(out.replies or ["(no reply)"])
        self.problems += bool(out.problems)

    def close(self) -> None:
        self.http.close()


def _sse_events(body: bytes, out: Outcome) -> list[dict[str, Any]]:
    events = []
    for block in body.decode("utf-8", "replace").split("\n\n"):
        if not block.strip() or block.strip() == "data: [DONE]":  # the end of the stream
            continue
        # SSE lines end at CR/LF only; str.splitlines() would also cut at U+2028, U+0085…
        lines = dict(line.split(": ", 1) for line in block.replace("\r\n", "\n").split("\n") if ": " in line)
        try:
            data = json.loads(lines.get("data", ""))
        except ValueError:
            out.problems.append(f"SSE data is not JSON: {block[:100]!r}")
            continue
        if data.get("type") != lines.get("event"):
            out.problems.append(f"SSE event {lines.get('event')!r} carries {data.get('type')!r}")
        if data.get("type") in ("error", "response.failed"):
            out.problems.append(f"SSE {data.get('type')}: {block[:200]!r}")
        events.append(data)
    return events


def _waits_for_inject(frame: str | bytes) -> bool:
    """Whether a fuzzed create may have asked its response to wait for injected tool output."""
    return b"multi_agent" in (frame if isinstance(frame, bytes) else frame.encode("utf-8", "replace"))
