"""A direct channel from a session host to one inference replica: one long-lived TCP
connection per (host process, replica), multiplexing that host's model calls.

A connection's later turns go where its first went (its pinned replica), so after the
first call through Serve's handle (a router decision, a gRPC call and two thread hops) a
host streams them over this channel instead.  The deployment serves a :class:`ChannelServer`, and the
session's backend (``actors.backend.ray_serve``) learns its endpoint through Serve and keeps
a :class:`ChannelClient` per replica.

Wire: the client first sends the server's token (``TOKEN_BYTES`` raw bytes, compared before
anything is decoded), then frames of a 4-byte big-endian length and a pickle (the endpoint
and its token come through Ray, which pickles between the same processes anyway):

- client → server: ``("go", rid, InferenceRequest, tools_key, base, keep, marks_base)``, ``("stop", rid)``,
  ``("tools", key, tools)``, ``("forget", key)``, ``("forget_prompt", session_key)``;
- server → client: each frame is a list of messages, all those of one turn of the server's
  event loop (the chunks of every call due on one tick, a call's last chunk with its
  ``end``): one pickle and one read for them all.  Messages: ``("chunk", rid,
  list[InferenceEvent])``, ``("end", rid)``, ``("error", rid, exception)``, ``("gone",
  rid)`` — the replica is shutting down and did not start the call: the caller makes it
  elsewhere.

A connection's tool definitions are the same object from turn to turn while unchanged
(``actors.core.prepare.Preparer``), and pickling them is most of a request's cost: the
client sends a tools tuple once
(``"tools"``), and a ``go`` naming its ``tools_key`` carries the request without them; the
server holds the last ``TOOL_SETS`` the client named, which ``"forget"`` keeps in step.

A session's prompt is its previous prompt and what came after it (the output, the new
input), and writing, reading and pickling the whole of it every turn costs both sides time
linear in the conversation.  So each side keeps the last prompt sent for a session
(``keep``), and a ``go`` whose prompt starts with exactly that prompt (compared on the
client, byte for byte) carries only the token ids after it (``base``: the kept prompt's
length); the server rebuilds the whole prompt before the call starts, so the engine sees
what it would have.  The client keeps at most ``PROMPT_BYTES`` of prompts, least recently
used first out, and tells the server which it dropped (``"forget_prompt"``).  The prompt's
cache breakpoints go the same way: a continuing prompt's ``go`` carries only the breakpoints
after the session's kept ones (``marks_base``: how many of those it starts with), so a long
conversation's hundreds of breakpoints are not pickled and rebuilt every turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
import logging
import pickle
import secrets
import struct
from array import array
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, cast

from .types import Breakpoint, InferenceEvent, InferenceRequest, ToolSpec

log = logging.getLogger(__name__)

TOKEN_BYTES = 32
TOKEN_WAIT_S = 10.0  # a peer that sends no token within this long is cut off
_LEN = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024
TOOL_SETS = 256  # tools tuples a channel keeps sent (one per connection that has tools)
PROMPT_BYTES = 64 * 1024 * 1024  # sessions' last prompts a channel keeps on each side (4 bytes a token)

Generate = Callable[[InferenceRequest], AsyncGenerator[list[InferenceEvent], None]]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a replica's channel listens; ``replica`` is its Serve replica tag."""

    replica: str
    host: str
    port: int
    token: bytes


class ChannelUnavailable(ConnectionError):
    """The call was not started on this channel (the replica is going away, or the
    connection is gone before any output): it can be made elsewhere with nothing lost."""


class ChannelLost(ConnectionError):
    """The connection to the replica ended while a call was streaming."""


def _frame(msg: tuple[Any, ...] | list[tuple[Any, ...]]) -> bytes:
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(body)) + body


def _sendable(msg: tuple[Any, ...]) -> tuple[Any, ...]:
    """``msg``, or the ``error`` of its call if it does not pickle."""
    try:
        pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        return msg
    except Exception as exc:  # noqa: BLE001 - sent as a plain error, its type lost
        return ("error", msg[1], RuntimeError(f"{type(exc).__name__}: {exc}"))


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - sent as a plain error, its type lost
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class ChannelServer:
    """The replica's side: runs ``generate`` for each ``go`` and streams its chunks back."""

    def __init__(self, generate: Generate, replica: str) -> None:
        self._generate = generate
        self._replica = replica
        self._token = secrets.token_bytes(TOKEN_BYTES)
        self._server: asyncio.Server | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._draining = False
        self.endpoint: Endpoint | None = None
        self.calls = 0  # started over the channel

    async def start(self, host: str) -> Endpoint:
        if self.endpoint is None:
            self._server = await asyncio.get_running_loop().create_server(self._accept, host, 0)
            port = self._server.sockets[0].getsockname()[1]
            self.endpoint = Endpoint(self._replica, host, port, self._token)
        return self.endpoint

    async def drain(self, timeout_s: float) -> None:
        """Start no more calls (each gets ``gone``); let the running ones finish."""
        self._draining = True
        if self._server is not None:
            self._server.close()
        if self._calls:
            await asyncio.wait(list(self._calls), timeout=timeout_s)

    def _accept(self) -> _Frames:
        """A host's connection: its token first, then its frames, each handled in the read
        that completes it (:meth:`_message`)."""
        state = _Served()
        frames = _Frames(functools.partial(self._message, state), state.lost, token=self._token)
        state.out = _Sender(frames)
        return frames

    def _message(self, state: _Served, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "go":
            rid, tools_key = msg[1], msg[3]
            request = _whole_prompt(
                msg[2],
                state.prompts,
                state.marks,
                base=msg[4],
                keep=msg[5],
                marks_base=msg[6],
                tools=None if tools_key is None else state.tool_sets[tools_key],
            )
            if self._draining:
                state.out.send(("gone", rid))
                return
            self.calls += 1
            task = asyncio.get_running_loop().create_task(self._call(rid, request, state.out))
            state.calls[rid] = task
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
            task.add_done_callback(functools.partial(_forget, state.calls, rid))
        elif kind == "stop":
            stopped = state.calls.pop(msg[1], None)
            if stopped is not None:
                stopped.cancel()
        elif kind == "tools":
            state.tool_sets[msg[1]] = msg[2]
        elif kind == "forget":
            state.tool_sets.pop(msg[1], None)
        elif kind == "forget_prompt":
            state.prompts.pop(msg[1], None)
            state.marks.pop(msg[1], None)

    async def _call(self, rid: int, request: InferenceRequest, out: _Sender) -> None:
        try:
            async with contextlib.aclosing(self._generate(request)) as chunks:
                async for chunk in chunks:
                    out.send(("chunk", rid, chunk))
                    await out.drained()
            out.send(("end", rid))
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            pass
        except Exception as exc:  # noqa: BLE001 - the caller raises it, as Serve would
            out.send(("error", rid, _picklable(exc)))


class _Served:
    """What the server keeps for one host's connection."""

    out: _Sender  # on its connection (ChannelServer._accept)

    def __init__(self) -> None:
        self.calls: dict[int, asyncio.Task[None]] = {}
        self.tool_sets: dict[int, tuple[ToolSpec, ...]] = {}  # as the client named them
        self.prompts: dict[str, array[int]] = {}  # each session's last prompt, as the client keeps it
        self.marks: dict[str, tuple[Breakpoint, ...]] = {}  # and that prompt's breakpoints

    def lost(self) -> None:
        for task in list(self.calls.values()):
            task.cancel()  # frees the batch slots of a vanished host's calls


class _Sender:
    """The server's messages on one connection, sent once per turn of the event loop as one
    frame: the chunks of all the calls due on one tick (under load the streams share one
    grid, ``pacing.ItemWindow``), and a call's last chunk with its ``end``, leave in one
    pickle and one write, and the host reads them in one.  A message's events are frozen
    (``inference.types``), so pickling them at the end of the tick sends what they were."""

    def __init__(self, frames: _Frames) -> None:
        self._frames = frames
        self._messages: list[tuple[Any, ...]] = []

    def send(self, msg: tuple[Any, ...]) -> None:
        if not self._messages:
            asyncio.get_running_loop().call_soon(self._flush)
        self._messages.append(msg)

    def _flush(self) -> None:
        messages, self._messages = self._messages, []
        if self._frames.is_closing():
            return
        try:
            frame = _frame(messages)
        except Exception:  # noqa: BLE001 - one message that does not pickle fails its call alone
            frame = b"".join(_frame([_sendable(msg)]) for msg in messages)
        self._frames.write(frame)

    async def drained(self) -> None:
        """Backpressure: return once the connection's buffer is below its limit."""
        await self._frames.drained()


class _Frames(asyncio.Protocol):
    """One end of a channel's connection.  Each frame is taken apart in the read that
    completes it and its message handed to ``on_message(message)`` there: no reader
    task between the socket and the calls, so a chunk (or a ``go``) waits for no further
    turn of the event loop.  ``token``: the bytes the peer must send first (the server's
    end), compared before anything is decoded; a peer that sends a wrong one, or none within
    ``TOKEN_WAIT_S``, is cut off.  ``on_lost`` runs once the connection is gone."""

    def __init__(
        self,
        on_message: Callable[[Any], None],
        on_lost: Callable[[], None],
        *,
        token: bytes | None = None,
    ) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._token = token
        self._buf = bytearray()
        self._paused = False
        self._waiters: list[asyncio.Future[None]] = []
        self._deadline: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass of it
        if self._token is not None:
            self._deadline = asyncio.get_running_loop().call_later(TOKEN_WAIT_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        start, end = 0, len(buf)
        if self._token is not None:
            if end < TOKEN_BYTES:
                return
            if not hmac.compare_digest(bytes(buf[:TOKEN_BYTES]), self._token):
                log.warning("channel: refused a peer with a wrong token")
                self._close()
                return
            self._token = None
            if self._deadline is not None:
                self._deadline.cancel()
            start = TOKEN_BYTES
        while end - start >= _LEN.size and not self.is_closing():
            (n,) = _LEN.unpack_from(buf, start)
            if n > MAX_FRAME:
                log.warning("channel: a frame of %d bytes; closing", n)
                self._close()
                return
            if end - start - _LEN.size < n:
                break
            start += _LEN.size
            with memoryview(buf) as view:  # an authenticated peer (the token came through Ray)
                msg = pickle.loads(view[start : start + n])
            start += n
            self._on_message(msg)
        del buf[:start]

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def _close(self) -> None:
        self._buf.clear()
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self.resume_writing()
        self._on_lost()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def drained(self) -> None:
        """Return once the connection's write buffer is below its limit (or it is gone)."""
        if self._paused:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


class ChannelClient:
    """The host's side of one replica's channel, shared by the host's connections."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, asyncio.Queue[tuple[Any, ...]]] = {}
        self._next = 0
        # The tools tuples sent, oldest first: id(tuple) → (key, tuple), the tuple held so
        # its id is not reused while it is here.
        self._tool_sets: OrderedDict[int, tuple[int, tuple[ToolSpec, ...]]] = OrderedDict()
        self._next_key = 0
        # Each session's last prompt as sent (its bytes), least recently used first.
        self._prompts: OrderedDict[str, bytes] = OrderedDict()
        self._marks: dict[str, tuple[Breakpoint, ...]] = {}  # the kept prompts' breakpoints
        self._prompt_bytes = 0
        self.open = False
        self._retired = False  # takes no more calls; closes once the running ones end

    async def connect(self) -> None:
        _, frames = await asyncio.get_running_loop().create_connection(
            lambda: _Frames(self._message, self._lost), self.endpoint.host, self.endpoint.port
        )
        assert frames.transport is not None
        frames.transport.write(self.endpoint.token)
        self._transport, self.open = frames.transport, True

    def _message(self, messages: list[tuple[Any, ...]]) -> None:
        calls = self._calls
        for msg in messages:
            queue = calls.get(msg[1])
            if queue is not None:
                queue.put_nowait(msg)

    def _lost(self) -> None:
        if not self.open:
            return
        self.open = False
        for queue in self._calls.values():
            queue.put_nowait(("lost",))
        if self._transport is not None:
            self._transport.close()

    def retire(self) -> None:
        """Take no more calls, and close once the calls still streaming have ended (a
        stopping replica finishes them: closing now would cut them short)."""
        self._retired = True
        if not self._calls:
            self.close()

    def close(self) -> None:
        """Close the connection: calls still streaming end with :class:`ChannelLost`."""
        self._lost()

    def _go(self, rid: int, request: InferenceRequest) -> bytes:
        """The ``go`` of ``request`` (and, before it, its tools if they were not sent yet, and
        what the prompts kept on both sides must drop)."""
        out, changes, base, keep, marks_base = self._prompt_of(request)
        tools = request.tools
        if not tools:
            request = dataclasses.replace(request, **changes) if changes else request
            return out + _frame(("go", rid, request, None, base, keep, marks_base))
        known = self._tool_sets.get(id(tools))
        if known is not None and known[1] is tools:
            key = known[0]
            self._tool_sets.move_to_end(id(tools))
        else:
            key = self._next_key = self._next_key + 1
            self._tool_sets[id(tools)] = (key, tools)
            out += _frame(("tools", key, tools))
            if len(self._tool_sets) > TOOL_SETS:
                out += _frame(("forget", self._tool_sets.popitem(last=False)[1][0]))
        request = dataclasses.replace(request, tools=(), **changes)  # one copy for both
        return out + _frame(("go", rid, request, key, base, keep, marks_base))

    def _prompt_of(self, request: InferenceRequest) -> tuple[bytes, dict[str, Any], int | None, bool, int]:
        """The changes that leave ``request`` with only the prompt's ids after the session's
        kept prompt (``base`` of them) when it starts with it, and then only the breakpoints
        after the kept prompt's (``marks_base`` of them) when they start with those; whether
        both sides keep this prompt, and the ``forget_prompt`` frames of the prompts that
        makes room for."""
        changes: dict[str, Any] = {}
        session, prompt = request.session_key, request.prompt_token_ids
        if session is None or not isinstance(prompt, array) or prompt.typecode != "I":
            return b"", changes, None, False, 0
        data = prompt.tobytes()
        kept = self._prompts.pop(session, None)
        kept_marks = self._marks.pop(session, ())
        marks = request.breakpoints
        base: int | None = None
        marks_base = 0
        if kept is not None:
            self._prompt_bytes -= len(kept)
            if len(kept) <= len(data) and data.startswith(kept):
                base = len(kept) // 4
                # The same breakpoint objects turn after turn (actors.core.context.PromptMarks):
                # the tuples compare by identity, in C.
                n = len(kept_marks)
                if n and n <= len(marks) and marks[:n] == kept_marks:
                    marks_base = n
                changes.update(prompt_token_ids=prompt[base:], breakpoints=marks[marks_base:])
        if len(data) > PROMPT_BYTES:  # not kept (the server drops its copy at every go)
            return b"", changes, base, False, marks_base
        out = b""
        self._prompts[session] = data
        self._marks[session] = marks
        self._prompt_bytes += len(data)
        while self._prompt_bytes > PROMPT_BYTES:
            gone, dropped = self._prompts.popitem(last=False)
            self._marks.pop(gone, None)
            self._prompt_bytes -= len(dropped)
            out += _frame(("forget_prompt", gone))
        return out, changes, base, True, marks_base

    def stream(self, request: InferenceRequest) -> ChannelCall:
        """One model call, as ``InferenceClient.stream``, started now: its ``go`` is written
        before this returns.  Raises :class:`ChannelUnavailable` (now, or from the call before
        any chunk) if the call can be made elsewhere, :class:`ChannelLost` after."""
        if not self.open or self._retired or self._transport is None:
            raise ChannelUnavailable("channel closed")
        rid = self._next = self._next + 1
        queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self._calls[rid] = queue
        self._transport.write(self._go(rid, request))
        return ChannelCall(self, rid, queue)

    def _ended(self, rid: int, *, stop: bool) -> None:
        del self._calls[rid]
        if stop and self.open and self._transport is not None:
            self._transport.write(_frame(("stop", rid)))  # cut short: the replica cancels it
        if self._retired and not self._calls:
            self.close()


class ChannelCall:
    """A call streaming on a :class:`ChannelClient`: an async iterator of its chunks.  It was
    started when made, so closing it (``aclose`` or ``close``) before its end stops it on the
    replica, also if it was never iterated."""

    def __init__(self, channel: ChannelClient, rid: int, queue: asyncio.Queue[tuple[Any, ...]]) -> None:
        self._channel = channel
        self._rid = rid
        self._queue = queue
        self._started = False  # a chunk arrived
        self._done = False

    def __aiter__(self) -> ChannelCall:
        return self

    async def __anext__(self) -> list[InferenceEvent]:
        if self._done:
            raise StopAsyncIteration
        try:
            msg = await self._queue.get()
        except BaseException:
            self.close()
            raise
        kind = msg[0]
        if kind == "chunk":
            self._started = True
            return msg[2]
        self._finish(stop=False)
        replica = self._channel.endpoint.replica
        if kind == "end":
            raise StopAsyncIteration
        if kind == "error":
            raise msg[2]
        if kind == "gone" or not self._started:
            raise ChannelUnavailable(f"replica {replica} did not take the call")
        raise ChannelLost(f"lost the channel to replica {replica}")

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the call if it has not ended (idempotent)."""
        self._finish(stop=True)

    def _finish(self, *, stop: bool) -> None:
        if not self._done:
            self._done = True
            self._channel._ended(self._rid, stop=stop)


def _whole_prompt(
    request: InferenceRequest,
    prompts: dict[str, array[int]],
    marks: dict[str, tuple[Breakpoint, ...]],
    *,
    base: int | None,
    keep: bool,
    marks_base: int = 0,
    tools: tuple[ToolSpec, ...] | None = None,
) -> InferenceRequest:
    """The server's side of the kept prompts: ``request`` with its whole prompt (the session's
    kept one and the ids after it, when ``base``) and its whole breakpoints (the first
    ``marks_base`` of the kept prompt's and those after), kept as the session's when ``keep``;
    and with ``tools`` when given (the tools tuple its ``go`` named), in the same copy."""
    changes: dict[str, Any] = {} if tools is None else {"tools": tools}
    session = request.session_key
    if session is None:
        return dataclasses.replace(request, **changes) if changes else request
    kept = prompts.pop(session, None)  # a go replaces it, or drops it (``keep`` false)
    kept_marks = marks.pop(session, ())
    if base is not None:
        if kept is None or len(kept) != base or len(kept_marks) < marks_base:
            raise ConnectionError("channel: a prompt continues one this side does not keep")
        whole = array("I", kept)
        whole.extend(request.prompt_token_ids)
        breakpoints = kept_marks[:marks_base] + request.breakpoints if marks_base else request.breakpoints
        changes.update(prompt_token_ids=whole, breakpoints=breakpoints)
    if changes:
        request = dataclasses.replace(request, **changes)
    if keep:
        prompts[session] = request.prompt_token_ids  # type: ignore[assignment]  # an array: the client keeps only those
        marks[session] = request.breakpoints
    return request


def _forget(calls: dict[int, asyncio.Task[None]], rid: int, _: asyncio.Task[None]) -> None:
    calls.pop(rid, None)
